"""End to end: `dvc repro` of the real dvc.yaml on the tiny world, in a scratch repo."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import SHORT_TURN_TOKENS, scratch_repo

pytestmark = pytest.mark.e2e  # a whole pipeline in fresh processes: `make test-e2e`, CI's second step (tests/test_suite_order.py)

ROOT = Path(__file__).resolve().parents[1]
COPY = ("conf", "hydra_plugins", "pipeline", "dvc.yaml", ".dvc/config", "models/policy")
# Every stage kind of the chain, at the smallest size that still runs each: two conditions (the
# report's one comparison) instead of six, played by the committed checkpoint (models/policy) with
# short turns, and three points of the learning curve instead of five (k=4 still past the tiny
# scene's two visits: clipped). The whole `experiment=tiny` chain, all six conditions, is what CI's
# `make reprocheck` runs (twice, against .ci/repro_tiny.json), so here it would be a third copy.
SMALL = ["condition=[C1,C2]", "experiment.comparisons=[[C2,C1]]", "experiment.curve.ks=[0,1,4]",
         "experiment.stream.conditions=[C1,C2]", "experiment.stream.start=collect",
         f"sampling.max_new_tokens={SHORT_TURN_TOKENS}", "workers=1"]
# Every stage runs under `python -m pipeline.tools.deps record`, which appends the config keys it read
# here (in one process: workers=1), so the chain also checks each stage's params against its reads.
READS = "reads.jsonl"


def _run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> tuple[Path, dict]:
    repo = tmp_path_factory.mktemp("e2e")
    env = scratch_repo(repo, COPY)
    cfg = repo / "conf" / "config.yaml"
    # the tiny world (conf/experiment/tiny.yaml)
    cfg.write_text(cfg.read_text().replace("- experiment: default", "- experiment: tiny"))
    composed = _run([sys.executable, "-m", "pipeline.core.config", "compose", *SMALL], repo, env)
    assert composed.returncode == 0, composed.stdout + composed.stderr
    dvc_yaml = repo / "dvc.yaml"
    dvc_yaml.write_text(re.sub(r"python -m (pipeline\.stages\.\w+)",
                               rf"python -m pipeline.tools.deps record --out {READS} \1", dvc_yaml.read_text()))
    return repo, env


@pytest.mark.slow
def test_dvc_repro_runs_the_whole_chain_then_is_a_noop(tiny_repo):
    repo, env = tiny_repo
    first = _run([sys.executable, "-m", "dvc", "repro"], repo, env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for rel in ("data/games/manifest.parquet", "data/episodes/episodes.parquet", "data/episodes/turns.parquet",
                "data/grounding/grounding_latest.json", "data/store/episodic_store.parquet",
                "data/prompts/C2.parquet", "data/eval/C1/episodes.parquet", "metrics/collect.json",
                "data/curve/outcomes.parquet", "metrics/curve_success.csv", "reports/learning_curves.png",
                "data/stream/steps.parquet", "metrics/stream_success.csv"):
        assert (repo / rel).exists(), rel
    stats = json.loads((repo / "metrics" / "collect.json").read_text())
    assert stats["num_episodes"] == 2 and stats["num_turns"] > 0
    # the learning curves: every k of experiment.curve.ks (the tiny scene has 2 visits: k clipped to 2), in the report
    curve = json.loads((repo / "metrics" / "curve.json").read_text())
    assert {(p["k"], p["held"]) for p in curve["points"]} == {(0, 0), (1, 1), (4, 2)}
    assert "## Learning curves" in (repo / "reports" / "report.md").read_text()
    # the streams (experiment.stream: C1 and C2, each starting from the collected episodes): one step per eval task
    stream = json.loads((repo / "metrics" / "stream.json").read_text())
    assert stream["conditions"] == ["C1", "C2"] and stream["start"] == "collect"
    assert {(p["window"], p["condition"], p["n"]) for p in stream["points"] if p["window"] == "all"} == \
        {("all", "C1", 2), ("all", "C2", 2)}
    second = _run([sys.executable, "-m", "dvc", "repro"], repo, env)
    assert second.returncode == 0
    assert "Data and pipelines are up to date." in second.stdout

    # A stale params.yaml stops `dvc repro` before anything runs, naming the key.
    cfg = repo / "conf" / "sampling" / "default.yaml"
    cfg.write_text(cfg.read_text() + "top_p: 0.5  # an option changing the schema default (0.9)\n")
    stale = _run([sys.executable, "-m", "dvc", "repro"], repo, env)
    assert stale.returncode != 0
    assert "sampling.top_p" in stale.stdout + stale.stderr

    # Every config field a stage read is among its DVC params (the chain's runs, recorded): a stage that
    # read one it does not list would not rerun when it changes.
    from pipeline.tools import deps

    records = deps.read_records(repo / READS)
    assert {r["module"] for r in records} >= {f"pipeline.stages.{s}" for s in
                                              ("games", "collect", "ground", "merge", "store", "render", "evaluate",
                                               "evaluate_reader", "curve", "stream", "compare")}
    unlisted = deps.params_violations(ROOT, records)
    assert not unlisted, "stages read config keys their params do not list:\n" + json.dumps(unlisted, indent=1)
    # ... and every pipeline file a stage loaded is among its deps, templates resolved from the run's params:
    # the world's package, imported by name (pipeline/envs/registry.py), is what static imports cannot see.
    games = next(r for r in records if r["module"] == "pipeline.stages.games")
    assert "pipeline/envs/household/descriptor.py" in games["loaded"]
    assert not any(f.startswith("pipeline/envs/scienceworld/") for r in records for f in r["loaded"])
    params = yaml.safe_load((repo / "params.yaml").read_text())
    unlisted = deps.load_violations(ROOT, records, params)
    assert not unlisted, "stages loaded pipeline files their deps do not cover:\n" + json.dumps(unlisted, indent=1)
