"""``python -m pipeline.tools.diff`` on two tiny experiments in a temporary git + DVC repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.tools.diff.__main__ import main as diff_main
from pipeline.tools.diff.revisions import DiffError
from pipeline.tools.diff.tables import diff_tables
from pipeline.tools.diff.values import window

# The tiny stage (outputs laid out as in the real dvc.yaml: directory outputs and a per-condition
# Parquet file output): episodes, turns, prompts, store, grounding JSON/TXT and a metric, all
# derived from params.yaml's `seed` (seed 1 changes one generated text, one prompt, one
# grounding line and adds an episode).
MAKE_PY = r'''
import json, os, yaml, pyarrow as pa, pyarrow.parquet as pq
p = yaml.safe_load(open("params.yaml"))
seed = p["seed"]
n_eps = 2 + (seed > 0)
eps = [{"episode_id": f"ep_train_s0_q{i}_0", "condition": "", "won": i == 0 or seed == 2, "num_turns": 2}
       for i in range(n_eps)]
turns = [{"episode_id": e["episode_id"], "turn_index": t,
          "prompt": f"Objective: quest {i}. Step {t}.",
          "generated_text": '{"action": "open", "target": "Fridge_0"}' if (t, i, seed) != (1, 1, 1)
                            else '{"action": "examine", "target": "Drawer_1"}',
          "action": json.dumps({"action": "open", "target": "Fridge_0"}), "feedback_lines": ["feedback : general: ok"]}
         for i, e in enumerate(eps) for t in range(2)]
prompts = [{"task_id": "s0/e0", "scene_id": "s0", "quest_id": "e0", "condition": "C2",
            "system_prompt": "You are a household agent.\n" + ("## Memory\nClose the fridge." if seed else "")}]
store = [{"entry_id": f"mem_{i}", "outcome": "success" if e["won"] else "failure", "tags": ["a", "b"]}
         for i, e in enumerate(eps)]
for name, rows in (("data/episodes/episodes.parquet", eps), ("data/episodes/turns.parquet", turns),
                   ("data/prompts/C2.parquet", prompts), ("data/store/episodic_store.parquet", store)):
    os.makedirs(os.path.dirname(name), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), name)
os.makedirs("data/grounding/episode_0", exist_ok=True)
g = {"final_grounding": {"spatial": ["The fridge is in the kitchen."] + (["Key_1 is in the bedroom."] if seed else [])},
     "expr_info": {"episode_id": "ep_train_s0_q0_0"}}
json.dump(g, open("data/grounding/episode_0/grounding_episode_0.json", "w"), indent=2, sort_keys=True)
open("data/grounding/episode_0/grounding_episode_0.txt", "w").write("\n".join(g["final_grounding"]["spatial"]) + "\n")
os.makedirs("metrics", exist_ok=True)
json.dump({"success_rate": sum(e["won"] for e in eps) / len(eps), "num_episodes": len(eps),
           "by_scene": [{"s0": 1}]}, open("metrics/collect.json", "w"))
'''

DVC_YAML = """
stages:
  make:
    cmd: python make.py
    deps: [make.py]
    params: [seed]
    outs: [data/episodes, data/prompts/C2.parquet, data/store, data/grounding]
    metrics:
      - metrics/collect.json:
          cache: false
"""


def _run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("DVC_ROOT", None)
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, f"{cmd} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """v1 committed (seed 0); experiments `exp-a` (seed 1) and `exp-b` (seed 2)."""
    root = tmp_path_factory.mktemp("diffrepo")
    dvc = [sys.executable, "-m", "dvc"]
    _run(["git", "init", "-q", "-b", "main"], root)
    _run(["git", "config", "user.email", "test@example.com"], root)
    _run(["git", "config", "user.name", "test"], root)
    _run(dvc + ["init", "-q"], root)
    (root / "make.py").write_text(MAKE_PY)
    (root / "params.yaml").write_text("seed: 0\nagent:\n  name: react\n")
    (root / "dvc.yaml").write_text(DVC_YAML)
    _run(dvc + ["repro", "-q"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "commit", "-q", "-m", "v1"], root)
    _run(dvc + ["exp", "run", "-q", "-n", "exp-a", "-S", "seed=1"], root)
    _run(dvc + ["exp", "run", "-q", "-n", "exp-b", "-S", "seed=2"], root)
    _run(["git", "checkout", "-q", "--", "."], root)  # workspace back to v1 files
    _run(dvc + ["checkout", "-q"], root)
    return root


def _diff(repo: Path, *args: str, capsys) -> tuple[int, str, str]:
    code = diff_main([*args, "--repo", str(repo)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_diff_commit_vs_experiment_json(repo, capsys):
    code, out, _ = _diff(repo, "HEAD", "exp-a", "--json", capsys=capsys)
    assert code == 0
    d = json.loads(out)
    assert d["a"]["kind"] == "git" and d["b"]["kind"] == "experiment"
    assert d["params"] == [{"key": "seed", "a": 0, "b": 1}]
    metrics = {m["key"]: m for m in d["metrics"]}
    assert metrics["num_episodes"] == {"file": "collect.json", "key": "num_episodes", "a": 2, "b": 3, "delta": 1}
    assert "by_scene" not in metrics  # lists are not metrics

    (turns,) = d["artifacts"]["turns"]["entries"]
    assert turns["path"] == "data/episodes/turns.parquet" and turns["key"] == ["episode_id", "turn_index"]
    assert (turns["rows_a"], turns["rows_b"], turns["added"], turns["removed"], turns["changed"]) == (4, 6, 2, 0, 1)
    assert turns["column_changes"] == {"generated_text": 1}
    ex = turns["examples"][0]
    assert ex["key"] == {"episode_id": "ep_train_s0_q1_0", "turn_index": 1}
    assert ex["changes"] == [{"column": "generated_text", "a": '{"action": "open", "target": "Fridge_0"}',
                              "b": '{"action": "examine", "target": "Drawer_1"}'}]
    assert turns["added_keys"] == ["episode_id=ep_train_s0_q2_0, turn_index=0", "episode_id=ep_train_s0_q2_0, turn_index=1"]

    (eps,) = d["artifacts"]["episodes"]["entries"]
    assert eps["key"] == ["episode_id", "condition"] and eps["added"] == 1 and eps["changed"] == 0
    (prompts,) = d["artifacts"]["prompts"]["entries"]
    assert prompts["key"] == ["task_id", "condition"] and prompts["column_changes"] == {"system_prompt": 1}
    (store,) = d["artifacts"]["store"]["entries"]
    assert store["key"] == ["entry_id"] and store["added"] == 1

    grounding = {e["path"]: e for e in d["artifacts"]["grounding"]["entries"]}
    gj = grounding["data/grounding/episode_0/grounding_episode_0.json"]
    assert gj["kind"] == "json" and gj["keys_changed"] == 1
    assert gj["examples"][0]["key"] == "final_grounding.spatial"
    gt = grounding["data/grounding/episode_0/grounding_episode_0.txt"]
    assert gt["kind"] == "text" and gt["lines_added"] == 1 and "+Key_1 is in the bedroom." in gt["diff"]


def test_diff_between_two_experiments_text(repo, capsys):
    code, out, _ = _diff(repo, "exp-a", "exp-b", "--artifact", "turns", "--artifact", "episodes", "--limit", "1",
                         capsys=capsys)
    assert code == 0
    assert "  seed: 1 -> 2" in out
    assert "success_rate: 0.3333333333333333 -> 1.0" in out
    assert "== turns:" in out and "== episodes:" in out and "== grounding" not in out
    assert "changed cells per column: generated_text=1" in out
    # The changed turn side by side.
    assert "~ episode_id=ep_train_s0_q1_0, turn_index=1" in out
    assert 'A: {"action": "examine", "target": "Drawer_1"}' in out
    assert 'B: {"action": "open", "target": "Fridge_0"}' in out
    assert "changed cells per column: won=2" in out  # episodes: seed 2 wins everything


def test_diff_workspace_and_identical_revisions(repo, capsys):
    txt = repo / "data/grounding/episode_0/grounding_episode_0.txt"
    before = txt.read_text()
    try:
        txt.write_text(before + "Close the fridge after use.\n")
        code, out, _ = _diff(repo, "HEAD", "workspace", "--artifact", "grounding", capsys=capsys)
        assert code == 0
        assert "params: 0 differ" in out and "metrics: 0 differ" in out
        assert "grounding_episode_0.txt: +1 -0 lines" in out and "+Close the fridge after use." in out
    finally:
        txt.write_text(before)
    code, out, _ = _diff(repo, "HEAD", "workspace", "--json", capsys=capsys)
    d = json.loads(out)
    assert all(not a["entries"] for a in d["artifacts"].values())
    assert d["artifacts"]["turns"]["files"]["same"] == 1


def test_diff_errors_name_the_revision(repo, capsys):
    code, _, err = _diff(repo, "HEAD", "no-such-exp", capsys=capsys)
    assert code == 1 and "unknown revision 'no-such-exp'" in err


def test_python_m_runs_the_package_command():
    """`python -m pipeline.tools.diff` (the package's __main__) prints the usage and the docstring."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run([sys.executable, "-m", "pipeline.tools.diff", "--help"], env=env, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: python -m pipeline.tools.diff [-h]")
    assert "Artifact diff between two experiments" in res.stdout and "--artifact" in res.stdout


def test_diff_tables_without_key_and_duplicates():
    d = diff_tables([{"x": 1}, {"x": 2}], [{"x": 1}, {"x": 3}, {"x": 4}], limit=5)
    assert d["note"].startswith("no key column") and d["changed"] == 1 and d["added"] == 1
    with pytest.raises(DiffError, match="occurs twice"):
        diff_tables([{"entry_id": "a"}, {"entry_id": "a"}], [], limit=1, where="store")
    # Long texts are shown around their first difference.
    a, b = window("x" * 500 + "A" + "y" * 50, "x" * 500 + "B" + "y" * 50, 60)
    assert a.startswith("…[@") and "A" in a and "B" in b


# --------------------------------------------------------------------------- data not in the cache


@pytest.fixture
def repo_copy(repo, tmp_path):
    """A private copy of ``repo`` (git, experiments and DVC cache) that a test may break."""
    dst = tmp_path / "repo"
    shutil.copytree(repo, dst, symlinks=True)
    return dst


OUTPUTS = ["data/episodes", "data/grounding", "data/prompts/C2.parquet", "data/store"]


def test_diff_experiment_whose_data_was_garbage_collected(repo_copy, capsys):
    # Keeps the workspace's (= HEAD's) objects only: exp-a's outputs leave the cache.
    _run([sys.executable, "-m", "dvc", "gc", "-q", "--workspace", "--force"], repo_copy)
    code, out, err = _diff(repo_copy, "HEAD", "exp-a", capsys=capsys)
    assert code == 0, err
    # The message: which revision, which outputs, what to run.
    assert "missing data: B=exp-a (" in out and "DVC experiment" in out and "not in the local DVC cache" in out
    block = out[out.index("missing data:"):out.index("params:")]
    assert [ln.strip() for ln in block.splitlines()[1:5]] == OUTPUTS
    assert "dvc exp apply exp-a && dvc pull" in block and "dvc exp apply exp-a && dvc exp run" in block
    assert "no DVC remote is configured" in block
    assert "A=HEAD" not in block  # HEAD's data is still there
    # Params and metrics come from git: still diffed.
    assert "  seed: 0 -> 1" in out and "num_episodes: 2 -> 3  (Δ +1)" in out
    # Each artifact file says why it is not compared (never "removed").
    assert "removed: " not in out
    assert ("not compared: data/episodes/turns.parquet (B=exp-a: data/episodes is not in the local DVC cache)"
            in out)
    assert "== grounding: 0 file(s) changed, 0 added, 0 removed, 0 identical, 2 not compared" in out

    code, out, err = _diff(repo_copy, "HEAD", "exp-a", "--json", capsys=capsys)
    assert code == 0
    d = json.loads(out)
    (m,) = d["missing_data"]
    assert (m["side"], m["rev"], m["kind"], m["outputs"]) == ("b", "exp-a", "experiment", OUTPUTS)
    assert m["commands"][0]["run"] == "dvc exp apply exp-a && dvc pull"
    assert d["params"] == [{"key": "seed", "a": 0, "b": 1}] and len(d["metrics"]) == 2
    assert d["artifacts"]["turns"]["files"]["unavailable"] == 1
    assert d["artifacts"]["turns"]["entries"] == [{"path": "data/episodes/turns.parquet", "status": "unavailable",
                                                   "missing": {"b": "data/episodes"}}]
    assert "missing data: B=exp-a" in err  # stdout is the JSON: the message goes to stderr


def test_diff_committed_lock_without_cache(repo_copy, capsys):
    # A dvc.lock built elsewhere: nothing in the cache, for HEAD nor for the experiments.
    shutil.rmtree(repo_copy / ".dvc" / "cache")
    code, out, err = _diff(repo_copy, "HEAD", "workspace", capsys=capsys)
    assert code == 0, err
    assert "missing data: A=HEAD (" in out and "git revision" in out and "missing data: B=" not in out
    assert "dvc pull " in out and "dvc repro " in out and "git checkout" not in out  # HEAD is checked out
    assert "params: 0 differ" in out and "metrics: 0 differ" in out
    assert ("not compared: data/prompts/C2.parquet (A=HEAD: data/prompts/C2.parquet is not in the local DVC cache)"
            in out)

    code, out, _ = _diff(repo_copy, "exp-a", "exp-b", "--artifact", "turns", capsys=capsys)
    assert code == 0
    assert "missing data: A=exp-a (" in out
    assert "  seed: 1 -> 2" in out and "success_rate: 0.3333333333333333 -> 1.0" in out
    assert "== turns: not compared: A=exp-a and B=exp-b: data/episodes is not in the local DVC cache" in out
    assert "missing data: B=exp-b (" in out and "    (the same as A)" in out


def test_diff_one_missing_file_leaves_the_rest_compared(repo_copy, capsys):
    # exp-a's turns.parquet object is gone, its data/episodes listing (.dir object) is not.
    lock = _run(["git", "show", _exp_ref(repo_copy, "exp-a") + ":dvc.lock"], repo_copy)
    (stage,) = yaml.safe_load(lock)["stages"].values()
    dir_md5 = next(o["md5"] for o in stage["outs"] if o["path"] == "data/episodes")
    cache = repo_copy / ".dvc" / "cache" / "files" / "md5"
    listing = json.loads((cache / dir_md5[:2] / dir_md5[2:]).read_text())
    turns_md5 = next(f["md5"] for f in listing if f["relpath"] == "turns.parquet")
    (cache / turns_md5[:2] / turns_md5[2:]).unlink()

    code, out, _ = _diff(repo_copy, "HEAD", "exp-a", "--artifact", "episodes", "--artifact", "turns", capsys=capsys)
    assert code == 0
    assert "    data/episodes (some of its files)" in out
    assert "not compared: data/episodes/turns.parquet (B=exp-a: data/episodes/turns.parquet is not in the local" in out
    assert "data/episodes/episodes.parquet  (key: episode_id, condition; rows 2 -> 3): 1 added" in out


def test_diff_workspace_without_its_outputs(repo_copy, capsys):
    shutil.rmtree(repo_copy / "data" / "episodes")
    code, out, _ = _diff(repo_copy, "HEAD", "workspace", "--artifact", "turns", "--artifact", "store", capsys=capsys)
    assert code == 0
    assert "missing data: B=workspace (working tree): 1 output(s) not in the working tree" in out
    assert "    data/episodes\n" in out and "dvc checkout " in out
    assert "not compared: data/episodes/turns.parquet (B=workspace: data/episodes is not in the working tree)" in out
    assert "== store: 0 file(s) changed, 0 added, 0 removed, 1 identical" in out


def test_diff_nothing_to_compare_exits_nonzero(repo_copy, capsys):
    # A commit with no params.yaml nor metrics, whose outputs are not in the cache.
    _run(["git", "rm", "-q", "params.yaml", "metrics/collect.json"], repo_copy)
    _run(["git", "commit", "-q", "-m", "bare"], repo_copy)
    shutil.rmtree(repo_copy / ".dvc" / "cache")
    code, out, err = _diff(repo_copy, "HEAD", "HEAD", capsys=capsys)
    assert code == 1
    assert "missing data: A=HEAD (" in out and "    data/store" in out
    assert "error: nothing could be compared" in err


def _exp_ref(root: Path, name: str) -> str:
    refs = _run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], root).split()
    (ref,) = [r for r in refs if r.endswith("/" + name)]
    return ref
