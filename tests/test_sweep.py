"""``python -m pipeline.tools.sweep``: a Hydra multirun of two jobs, each running ``dvc repro``.

The project copy used here has a three-stage ``dvc.yaml``: the real ``check_params``, a
stand-in for ``evaluate`` (``fake_evaluate.py``: eval episodes, turns and prompts whose
outcomes depend on the seed and the condition, plus ``metrics/eval/<C>.json`` written
with the real :func:`pipeline.analysis.metrics.condition_metrics`) and the real ``compare``
(with ``experiment.reader=false``: no ``evaluate_reader`` here).
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

from pipeline.tools import sweep as W

ROOT = Path(__file__).resolve().parents[1]

FAKE_EVALUATE = r'''
"""Stand-in for the evaluate stage: 4 eval tasks per condition, outcomes from (seed, condition)."""
import hashlib
import pyarrow as pa
from pipeline.core.config import load_params, project_root
from pipeline.session.episodes import write_episodes
from pipeline.core.io import atomic_write_json, write_parquet
from pipeline.analysis.metrics import condition_metrics
from pipeline.core.schemas import manifest_table

cfg = load_params()
root = project_root()
tasks = [("s0", f"q{i}") for i in range(4)]
write_parquet(manifest_table([{"scene_id": s, "quest_id": q, "split": "eval", "scene_split": "seen",
                               "quest_length": 2 + i % 2} for i, (s, q) in enumerate(tasks)]),
              root / cfg.paths.games / "manifest.parquet")
for cond in cfg.condition:
    eps, turns, prompts = [], [], []
    for i, (s, q) in enumerate(tasks):
        h = hashlib.sha256(f"{cfg.seed}/{cond}/{q}".encode()).digest()[0]
        won = h < (200 if cond == "C2" else 100)
        eid = f"ep_eval_{s}_{q}_0"
        eps.append({"episode_id": eid, "scene_id": s, "quest_id": q, "split": "eval", "condition": cond,
                    "won": won, "is_correct": won, "final_reward": float(won), "num_turns": 3, "num_invalid": 0,
                    "num_repeated": 0, "prompt_tokens": 0, "generated_tokens": 0, "seed": 100 * cfg.seed + i})
        turns += [{"episode_id": eid, "turn_index": k} for k in range(3)]
        prompts.append({"scene_id": s, "quest_id": q, "condition": cond, "gate_ok": True,
                        "injected": cond == "C2", "system_prompt": f"task {q}" + (" + memory" if cond == "C2" else "")})
    write_episodes(root / cfg.paths.eval / cond, eps, turns)
    write_parquet(pa.Table.from_pylist(prompts), root / cfg.paths.prompts / f"{cond}.parquet")
    atomic_write_json(root / cfg.paths.metrics / "eval" / f"{cond}.json", condition_metrics(eps, turns, prompts, cfg))
'''

DVC_YAML = """
stages:
  check_params:
    cmd: python -m pipeline.core.config check
    deps: [conf, params.yaml, pipeline/core/config.py, pipeline/core/conf_schema.py]
  evaluate:
    cmd: python fake_evaluate.py
    deps: [fake_evaluate.py, pipeline/analysis/metrics.py]
    params: [seed, condition]
    outs: [data/games, data/eval, data/prompts]
    metrics:
      - metrics/eval:
          cache: false
  compare:
    cmd: python -m pipeline.stages.compare
    deps: [data/eval, data/prompts, data/games, pipeline/stages/compare.py, pipeline/core/stats.py]
    params: [seed, experiment]
    outs: [plots, reports]
    metrics:
      - metrics/compare.json:
          cache: false
"""


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__")
    for rel in ("pipeline", "hydra_plugins", "conf"):
        shutil.copytree(ROOT / rel, root / rel, ignore=ignore)
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / "fake_evaluate.py").write_text(FAKE_EVALUATE)
    return root


def _env():
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("DVC_ROOT", None)
    return env


@pytest.mark.slow
def test_multirun_two_jobs_with_joblib(project, tmp_path):
    sweep_dir = tmp_path / "sweeps"
    # experiment.reader=false: this three-stage DAG has no evaluate_reader for compare to read
    cmd = [sys.executable, "-m", "pipeline.tools.sweep", "-m", "seed=0,1", "experiment.bootstrap_samples=200",
           "experiment.reader=false", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep_dir}"]
    res = subprocess.run(cmd, cwd=project, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    # The summary table: one row per job, success per condition, paired differences.
    assert "# Sweep summary (2 jobs, 0 failed)" in res.stdout
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("| 0 ") or ln.startswith("| 1 ")]
    assert len(rows) == 2 and "seed=0" in rows[0] and "seed=1" in rows[1]
    assert "success C2" in res.stdout and "Δ C2_vs_C1 (p)" in res.stdout
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert [r["status"] for r in summary] == ["ok", "ok"]
    for job, seed in ((0, 0), (1, 1)):
        jd = sweep_dir / str(job)
        params = yaml.safe_load((jd / "params.yaml").read_text())
        assert params["seed"] == seed and params["experiment"]["bootstrap_samples"] == 200
        assert (jd / "reports" / "report.md").read_text().startswith("# Condition comparison")
        assert set(summary[job]["conditions"]) == {"C0", "C1", "C2", "C2_silent", "C2_placebo", "C2_oracle"}
        cmp = json.loads((jd / "metrics" / "compare.json").read_text())
        assert cmp["prompt_identity"]["C1_vs_C2_silent"] == {"tasks_compared": 4, "mismatches": 0}
        # The job folder is a project whose params.yaml is in sync with its frozen conf/
        # (the real check_params stage ran there) and that records what it ran.
        assert "params.yaml is in sync with conf/" in (jd / W.REPRO_LOG).read_text()
        assert (jd / "pipeline" / "stages" / "compare.py").is_file() and (jd / "dvc.lock").is_file()
    # Jobs with different seeds really ran different configs.
    assert summary[0]["conditions"] != summary[1]["conditions"]


def test_single_condition_job_drops_comparisons_it_cannot_make():
    params = {"condition": {"C1": {}}, "experiment": {
        "comparisons": [["C2", "C1"], ["C2_silent", "C1"]], "identical_prompts": [["C1", "C2_silent"]]}}
    out, notes = W.restrict_to_conditions(params)
    assert out["experiment"] == {"comparisons": [], "identical_prompts": []}
    assert len(notes) == 2 and "dropped [['C2', 'C1'], ['C2_silent', 'C1']]" in notes[0]
    assert params["experiment"]["comparisons"]  # the input is not modified
    both = {"condition": {"C1": {}, "C2": {}}, "experiment": {"comparisons": [["C2", "C1"]]}}
    assert W.restrict_to_conditions(both) == (both, [])


def test_frozen_conf_composes_to_the_job_params(tmp_path):
    from pipeline.core.config import compose_text

    root = tmp_path / "job"
    shutil.copytree(ROOT / "conf", root / "conf")
    shutil.copytree(ROOT / "hydra_plugins", root / "hydra_plugins", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "dvc.yaml").write_text("stages: {}\n")
    params = yaml.safe_load(compose_text(ROOT, ["seed=7", "condition=[C1,C2]", "experiment.comparisons=[[C2,C1]]"]))
    (root / "conf" / "config.yaml").write_text(W.frozen_conf_text(params))
    assert yaml.safe_load(compose_text(root)) == params


def test_extra_inputs_are_deps_no_stage_writes():
    dvc_yaml = {"stages": {
        "games": {"deps": ["pipeline/envs/household/games.py", "conf/templates", "params.yaml"], "outs": ["${paths.games}"]},
        "collect": {"deps": ["${paths.games}", "notes/feedback.jsonl", {"${user.feedback_file}": {}}],
                    "outs": ["data/episodes"], "metrics": [{"metrics/collect.json": {"cache": False}}]},
        "evaluate": {"matrix": {"condition": ["C1", "C2"]}, "deps": ["data/prompts/${item.condition}.parquet"],
                     "outs": ["${paths.eval}/${item.condition}"]},
        "compare": {"deps": ["${paths.eval}", "data/eval/C1/episodes.parquet"], "outs": ["reports"]},
    }}
    params = {"paths": {"games": "data/games", "eval": "data/eval"}, "user": {"feedback_file": "people/fb.jsonl"}}
    assert W.extra_inputs(dvc_yaml, params) == ["notes/feedback.jsonl", "people/fb.jsonl"]


def test_summary_table_marks_failed_jobs(tmp_path):
    ok = {"job": 0, "overrides": ["env.max_steps=9", "seed=0"], "status": "ok",
          "conditions": {"C1": {"value": 0.5, "ci_low": 0.25, "ci_high": 0.75, "n": 4}},
          "comparisons": {"C2_vs_C1": {"success_diff": {"value": 0.25, "ci_low": 0.0, "ci_high": 0.5}, "p_value": 0.5}}}
    bad = {"job": 1, "overrides": ["env.max_steps=9", "seed=1"], "status": "failed", "error": "dvc repro failed (exit 1)",
           "conditions": {}, "comparisons": {}}
    for r in (ok, bad):
        (tmp_path / str(r["job"])).mkdir()
        (tmp_path / str(r["job"]) / W.RESULT_FILE).write_text(json.dumps(r))
    results = W.summarize(tmp_path)
    assert [r["status"] for r in results] == ["ok", "failed"]
    text = (tmp_path / "summary.md").read_text()
    assert "2 jobs, 1 failed" in text and "0.50 [0.25, 0.75]" in text and "0.25 [0.00, 0.50] (p=0.5)" in text
    assert "job 1 (env.max_steps=9 seed=1): dvc repro failed (exit 1)" in text
    assert "Every job: env.max_steps=9" in text and "| 1   | seed=1    | failed |" in text


def test_single_run_with_a_bad_value_fails_clearly(project, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pipeline.tools.sweep", "env.max_steps=0", f"hydra.run.dir={run_dir}"]
    res = subprocess.run(cmd, cwd=project, env=_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "# Sweep summary (1 jobs, 1 failed)" in res.stdout
    assert "env.max_steps=0: expected >= 1" in res.stdout
    result = json.loads((run_dir / W.RESULT_FILE).read_text())
    assert result["status"] == "failed" and result["overrides"] == ["env.max_steps=0"]
