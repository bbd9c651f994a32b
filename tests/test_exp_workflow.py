"""The DVC workflow researchers use: ``dvc exp run -S``, ``dvc exp apply``, then ``dvc repro``.

Real ``git`` and ``dvc`` commands in a temporary repository with the project's own
``conf/`` and stale check (``pipeline.core.config``, ``pipeline.core.overrides``), and a
one-line stage that reads ``params.yaml`` the way every stage does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core import overrides as recorded

pytestmark = pytest.mark.e2e  # a whole pipeline in fresh processes: `make test-e2e`, CI's second step (tests/test_suite_order.py)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

DVC_YAML = """\
stages:
  check_params:
    cmd: python -m pipeline.core.config check --record
    deps: [conf, params.yaml]
    outs:
      - ${paths.checkpoints}/params_checked:
          cache: false
          persist: true
      - params.overrides.yaml:
          cache: false
          persist: true
  seeded:
    cmd: python -c "from pipeline.core.config import load_params; open('out.txt', 'w').write(str(load_params().seed))"
    deps: ["${paths.checkpoints}/params_checked"]
    params: [seed]
    outs: [out.txt]
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "GIT_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return env


def _run(repo: Path, *cmd: str, ok: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=repo, env=_env(), capture_output=True, text=True, timeout=300)
    if ok and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def baseline_repo(tmp_path_factory) -> Path:
    """The scratch git + DVC repo with its baseline committed, built once per module (~8 s)."""
    repo = tmp_path_factory.mktemp("exp_workflow") / "repo"
    repo.mkdir()
    shutil.copytree(ROOT / "conf", repo / "conf")
    shutil.copytree(ROOT / "hydra_plugins", repo / "hydra_plugins", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "dvc.yaml").write_text(DVC_YAML)
    (repo / ".gitignore").write_text("/.checkpoints/\n__pycache__/\n")
    _run(repo, "git", "init", "-q")
    _run(repo, "dvc", "init", "-q")
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")  # hydra.enabled, plugins_path
    _run(repo, sys.executable, "-m", "pipeline.core.config", "compose")
    _run(repo, "dvc", "repro", "-q")
    _run(repo, "git", "add", "-A")
    _run(repo, "git", "commit", "-qm", "baseline")
    return repo


@pytest.fixture()
def repo(baseline_repo: Path, tmp_path: Path) -> Path:
    """A test's own copy of the baseline repo (git history, DVC cache and lock included)."""
    return Path(shutil.copytree(baseline_repo, tmp_path / "repo", symlinks=True))


def test_exp_apply_then_repro_reproduces_the_experiment(repo: Path):
    assert (repo / "out.txt").read_text() == "0"
    _run(repo, "dvc", "exp", "run", "-q", "-S", "seed=11", "-n", "e1")
    _run(repo, "git", "checkout", "-q", "--", ".")  # back to the baseline workspace
    _run(repo, "dvc", "checkout", "-q")
    assert (repo / "out.txt").read_text() == "0"
    _run(repo, "dvc", "exp", "apply", "e1")
    assert recorded.read(repo) == [{"key": "sampling.seed", "value": 11}, {"key": "seed", "value": 11}]
    p = _run(repo, "dvc", "repro")
    assert "up to date" in p.stdout and (repo / "out.txt").read_text() == "11"
    # A stage that must rerun after the apply reads params.yaml through the stale check too.
    (repo / "out.txt").unlink()
    _run(repo, "dvc", "repro", "-q")
    assert (repo / "out.txt").read_text() == "11"


def test_a_stale_params_yaml_stops_before_any_stage_output_is_touched(repo: Path):
    _run(repo, "dvc", "exp", "run", "-q", "-S", "seed=11", "-n", "e1")
    _run(repo, "dvc", "exp", "apply", "e1")
    household = repo / "conf" / "env" / "household.yaml"
    text = household.read_text()
    assert "\nmax_steps: 20 " in text  # the option's own step cap, changed below
    household.write_text(text.replace("\nmax_steps: 20 ", "\nmax_steps: 40 "))
    (repo / "dvc.yaml").write_text(DVC_YAML.replace("str(load_params().seed)", "str(load_params().seed) + '!'"))
    p = _run(repo, "dvc", "repro", ok=False)
    assert p.returncode != 0
    err = p.stdout + p.stderr
    assert "stale" in err and "env.max_steps: params.yaml=20 conf=40" in err and "seed=11" in err
    assert "python -m pipeline.core.config compose --keep-overrides" in err
    assert "Running stage 'seeded'" not in err
    assert (repo / "out.txt").read_text() == "11"  # the changed stage never ran: its output is intact
    _run(repo, sys.executable, "-m", "pipeline.core.config", "compose", "--keep-overrides")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    assert params["seed"] == 11 and params["env"]["max_steps"] == 40
    _run(repo, "dvc", "repro", "-q")
    assert (repo / "out.txt").read_text() == "11!"


def test_compose_with_overrides_records_them_and_the_check_accepts_the_result(tmp_path: Path):
    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    from pipeline.core.config import ConfigError, check, compose

    compose(tmp_path, ["agent=rag", "seed=3"])
    kept = {o["key"]: o.get("value") for o in recorded.read(tmp_path)}
    assert kept["agent.name"] == "rag" and kept["seed"] == 3
    check(tmp_path, use_stamp=False)
    compose(tmp_path)  # conf/ alone: the record is emptied
    assert recorded.read(tmp_path) == []
    check(tmp_path, use_stamp=False)
    (tmp_path / recorded.OVERRIDES_FILE).write_text("overrides: [{value: 3}]\n")
    with pytest.raises(ConfigError, match="params.overrides.yaml: expected `overrides:`"):
        check(tmp_path, use_stamp=False)


def test_overrides_diff_and_apply_round_trip():
    composed = {"seed": 0, "agent": {"name": "react", "steps": 3, "kb": None}, "lst": [1, 2], "gone": {"a": 1}}
    params = {"seed": 11, "agent": {"name": "rag", "kb": "x.json"}, "lst": [1], "new": {"b": {"c": True}}}
    d = recorded.diff(composed, params)
    assert {"key": "agent.steps", "removed": True} in d and {"key": "new.b.c", "value": True} in d
    assert recorded.apply(composed, d) == params
    assert recorded.diff(params, params) == []
    assert recorded.hydra_overrides(d)[:2] == ["++agent.kb=\"x.json\"", "++agent.name=\"rag\""]


def test_reprocheck_lists_the_outputs_a_repro_did_not_reproduce(repo: Path):
    """`python -m pipeline.tools.reprocheck` after a repro: dvc.lock's cached outputs vs the committed lock."""
    check = [sys.executable, "-m", "pipeline.tools.reprocheck"]
    p = _run(repo, *check)
    assert "every cached output reproduced" in p.stdout
    (repo / "dvc.yaml").write_text(DVC_YAML.replace("str(load_params().seed)", "'changed'"))
    _run(repo, "dvc", "repro", "-q")
    p = _run(repo, *check, ok=False)
    assert p.returncode == 1 and "1 output(s) differ" in p.stdout and "out.txt: md5 " in p.stdout
    assert "params_checked" not in p.stdout  # cache: false outputs (stamps, metrics) are not artifacts


@pytest.mark.parametrize("overrides, message", [
    (["agent=llm", "model=local", "model.name_or_path=models/mine/missing"], "expected an existing model directory"),
    (["agent=llm", "model=openai", "model.api_model=null"], "model.api_model=None"),
    (["model.api_key_env=sk-proj-4f9Q2xY7Lm3Nq8Rt"], "model.api_key_env: expected the name of an environment"),
])
def test_a_bad_model_setting_stops_the_run_before_any_output_is_touched(repo: Path, overrides: list, message: str):
    """The model source and the key variable are checked by check_params: DVC runs it first, so a
    failing check leaves every other stage's outputs (and the check's own stamp) as they were."""
    (repo / "dvc.yaml").write_text(DVC_YAML.replace("str(load_params().seed)", "'changed'"))
    args = [a for o in overrides for a in ("-S", o)]
    p = _run(repo, "dvc", "exp", "run", *args, ok=False)
    err = p.stdout + p.stderr
    assert p.returncode != 0 and message in err, err[-3000:]
    assert "Running stage 'seeded'" not in err
    assert (repo / "out.txt").read_text() == "0"  # never deleted
    assert "sk-proj-4f9Q2xY7Lm3Nq8Rt" not in err + (repo / "params.yaml").read_text()
    assert (repo / ".checkpoints" / "params_checked").is_file()  # persist: the stamp survives a failed check


def test_reprocheck_compares_the_workspace_with_the_lock_and_says_so(repo: Path):
    """An output changed after `dvc repro` wrote the lock (a resumed or hand-run stage) is caught,
    though dvc.lock still matches the committed one."""
    check = [sys.executable, "-m", "pipeline.tools.reprocheck"]
    p = _run(repo, *check)
    assert "workspace outputs vs dvc.lock: every cached output reproduced" in p.stdout
    assert "dvc.lock vs HEAD's: every cached output reproduced" in p.stdout
    (repo / "out.txt").write_text("0 (rewritten by a resumed stage)")
    p = _run(repo, *check, ok=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "workspace outputs vs dvc.lock: 1 output(s) differ" in p.stdout and "out.txt: md5 " in p.stdout
    assert "dvc.lock vs HEAD's: every cached output reproduced" in p.stdout
    (repo / "out.txt").unlink()
    p = _run(repo, *check, ok=False)
    assert p.returncode == 1 and "out.txt: not produced" in p.stdout


def test_a_workers_override_never_asks_for_another_golden_file():
    """`make reprocheck` checks the one golden file at workers=1 and workers=3: the process
    count is the override that by contract changes no byte; every other override still counts."""
    from pipeline.tools.reprocheck import byte_overrides

    assert byte_overrides(["experiment=tiny", "workers=3"]) == ["experiment=tiny"]
    assert byte_overrides(["+workers=1", "experiment=tiny"]) == ["experiment=tiny"]
    assert byte_overrides(["experiment=tiny", "agent.batch_size=3"]) == ["experiment=tiny", "agent.batch_size=3"]
    assert byte_overrides(["policy.micro_batches=4"]) == ["policy.micro_batches=4"]


def test_cpu_level_reads_the_flags_that_separate_the_x86_64_levels():
    from pipeline.core.cpu import cpu_level

    v3 = "fpu sse4_2 popcnt ssse3 avx avx2 fma bmi1 bmi2 f16c movbe"
    assert cpu_level(v3) == "x86-64-v3"
    assert cpu_level(v3 + " avx512f avx512bw avx512cd avx512dq avx512vl") == "x86-64-v4"
    assert cpu_level(v3 + " avx512f") == "x86-64-v3"  # AVX-512 Foundation alone is not level 4
    assert cpu_level("fpu sse4_2 popcnt ssse3") == "x86-64-v2"
    assert cpu_level("fpu sse2") == "x86-64"


def test_a_golden_file_keeps_one_record_per_cpu_level(tmp_path):
    """Each x86-64 level is compared with its own record, the outputs every level agrees on are
    stored once, a level with no record is compared with those (and told what it was not compared
    on), and a code change that moves a shared output drops the other levels' stale records."""
    from pipeline.tools.reprocheck import ReproCheckError, expected_outputs, record_outputs, unrecorded_level

    golden = tmp_path / "golden.json"
    v4 = {"data/games": "g", "data/policy": "p4", "data/eval/C0": "e4"}
    doc, moved = record_outputs(None, "x86-64-v4", v4, ["experiment=tiny"], {"cpu": "A", "revision": "r1"})
    assert moved == [] and doc["outputs"] == v4 and doc["by_cpu_level"] == {"x86-64-v4": {}}
    v3 = {"data/games": "g", "data/policy": "p3", "data/eval/C0": "e4"}
    doc, moved = record_outputs(doc, "x86-64-v3", v3, ["experiment=tiny"], {"cpu": "B", "revision": "r2"})
    assert moved == []
    assert doc["outputs"] == {"data/games": "g", "data/eval/C0": "e4"}
    assert doc["by_cpu_level"] == {"x86-64-v3": {"data/policy": "p3"}, "x86-64-v4": {"data/policy": "p4"}}
    assert doc["recorded_on"] == {"x86-64-v3": {"cpu": "B", "revision": "r2"}, "x86-64-v4": {"cpu": "A", "revision": "r1"}}
    assert expected_outputs(doc, "x86-64-v4", golden) == v4
    assert expected_outputs(doc, "x86-64-v3", golden) == v3
    assert expected_outputs(doc, "x86-64-v2", golden) == {"data/games": "g", "data/eval/C0": "e4"}
    assert unrecorded_level(doc, "x86-64-v4") is None
    note = unrecorded_level(doc, "x86-64-v2")
    assert "no record of this CPU's level x86-64-v2 (recorded: x86-64-v3, x86-64-v4)" in note
    assert "2 output(s) every recorded level shares; not compared: data/policy" in note
    with pytest.raises(ReproCheckError, match=r"no record for this CPU's level x86-64-v2 .* no output every"):
        expected_outputs({**doc, "outputs": {}}, "x86-64-v2", golden)

    # A code change that moves a shared output, rerecorded on one level: the other level's record
    # is stale and dropped, and that level is compared with the new record's shared outputs.
    changed = {**v3, "data/games": "g2"}
    doc2, moved = record_outputs(doc, "x86-64-v3", changed, ["experiment=tiny"], {"cpu": "B", "revision": "r3"})
    assert moved == ["data/games"]
    assert doc2["by_cpu_level"] == {"x86-64-v3": {}} and list(doc2["recorded_on"]) == ["x86-64-v3"]
    assert expected_outputs(doc2, "x86-64-v3", golden) == changed
    assert expected_outputs(doc2, "x86-64-v4", golden) == changed
    # A change of a level's own output only moves nothing shared: the other level's record is kept.
    own = {**v3, "data/policy": "p3b"}
    doc5, moved = record_outputs(doc, "x86-64-v3", own, ["experiment=tiny"], {"cpu": "B", "revision": "r6"})
    assert moved == [] and expected_outputs(doc5, "x86-64-v4", golden) == v4
    assert expected_outputs(doc5, "x86-64-v3", golden) == own

    # A first record of a second level: what it differs in is its own, the other level's record kept;
    # unless the person who knows the code changed says so (--drop-other-levels): then it is
    # dropped and that level is compared with this record (what the ScienceWorld golden needed when
    # a report's text moved with the code, 2026-12-07).
    one = record_outputs(None, "x86-64-v3", v3, ["experiment=tiny"], {"cpu": "B", "revision": "r1"})[0]
    fixed = {**v3, "data/eval/C0": "e5"}
    kept, moved = record_outputs(one, "x86-64-v4", fixed, ["experiment=tiny"], {"cpu": "A", "revision": "r7"})
    assert moved == [] and expected_outputs(kept, "x86-64-v3", golden) == v3
    dropped, moved = record_outputs(one, "x86-64-v4", fixed, ["experiment=tiny"], {"cpu": "A", "revision": "r7"},
                                    drop_other_levels=True)
    assert moved == ["data/eval/C0"] and dropped["by_cpu_level"] == {"x86-64-v4": {}}
    assert list(dropped["recorded_on"]) == ["x86-64-v4"] and expected_outputs(dropped, "x86-64-v3", golden) == fixed

    # Other overrides, or the older single-record form: this level's record replaces the file.
    doc3, moved = record_outputs(doc, "x86-64-v3", v3, ["experiment=tiny", "seed=2"], {"cpu": "B", "revision": "r4"})
    assert moved == [] and doc3["by_cpu_level"] == {"x86-64-v3": {}} and doc3["outputs"] == v3
    old = {"overrides": ["experiment=tiny"], "outputs": v4}
    assert expected_outputs(old, "x86-64-v3", golden) == v4  # the older form: one record for every level
    doc4, _ = record_outputs(old, "x86-64-v3", v3, ["experiment=tiny"], {"cpu": "B", "revision": "r5"})
    assert list(doc4["by_cpu_level"]) == ["x86-64-v3"]


def test_reprocheck_stops_before_the_run_when_this_cpu_level_has_no_record_and_nothing_is_shared(tmp_path, capsys):
    from pipeline.core.cpu import cpu_level
    from pipeline.tools.reprocheck import main

    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps({"overrides": ["experiment=tiny"], "outputs": {},
                                  "by_cpu_level": {"some-other-level": {"data/games": "g"}}}))
    assert main(["--scratch", "experiment=tiny", "--golden", str(golden)]) == 2
    err = capsys.readouterr().err
    assert f"no record for this CPU's level {cpu_level()} (recorded: some-other-level)" in err
    assert "--update" in err
