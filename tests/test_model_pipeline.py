"""The model pipeline end to end: `dvc repro models/dvc.yaml` (what `make model` runs) on a tiny recipe.

In a scratch repo: its own games, the demonstrations, the training and the published checkpoint
with its card, each step a process over ``models/params.yaml``; then the checkpoint loads, its
files match the card, a rebuild from the same data changes nothing, and every config field a
step read is among the stage's params (the steps run under ``python -m pipeline.tools.deps
record``). That the same recipe trains the same bytes anywhere is tests/test_numerics.py's.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import SMALL_POLICY_OVERRIDES, TINY_OVERRIDES, scratch_repo

pytestmark = pytest.mark.e2e  # a whole pipeline in fresh processes: `make test-e2e`, CI's second step (tests/test_suite_order.py)

ROOT = Path(__file__).resolve().parents[1]
COPY = ("conf", "hydra_plugins", "pipeline", "models/dvc.yaml", ".dvc/config")  # the model pipeline alone
WORLD = [o for o in TINY_OVERRIDES if o.startswith("env.")]
RECIPE = [*WORLD, "workers=1", "policy.demos_per_quest=2", "policy.vocab_size=400", "policy.max_positions=1024",
          "policy.dagger_rounds=1", "policy.evaluate=false", *SMALL_POLICY_OVERRIDES]
READS = "reads.jsonl"


def _run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict, subprocess.CompletedProcess]:
    repo = tmp_path_factory.mktemp("model_pipeline")
    env = scratch_repo(repo, COPY)
    composed = _run([sys.executable, "-m", "pipeline.core.config", "compose", "--pipeline", "model", *RECIPE],
                    repo, env)
    assert composed.returncode == 0, composed.stdout + composed.stderr
    dvc_yaml = repo / "models" / "dvc.yaml"
    dvc_yaml.write_text(re.sub(r"python -m (pipeline\.(?:stages\.\w+|policy\.utilisation))",
                               rf"python -m pipeline.tools.deps record --out {READS} \1", dvc_yaml.read_text()))
    run = _run([sys.executable, "-m", "dvc", "repro", "models/dvc.yaml"], repo, env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return repo, env, run


@pytest.mark.slow
def test_make_model_builds_a_checkpoint_with_its_card(built):
    from transformers import AutoModelForCausalLM

    from pipeline.policy.checkpoint import publish, read_card, verify

    repo, env, run = built
    ckpt = repo / "models" / "policy"
    card = read_card(ckpt)
    assert verify(ckpt) == [] and {"model.safetensors", "config.json", "tokenizer.json"} <= set(card["files"])
    params = yaml.safe_load((repo / "models" / "params.yaml").read_text())
    assert card["recipe"] == params["policy"] and card["world"]["scenes"] == params["env"]["num_scenes"] == 2
    assert set(card["training_data"]) == {"games/manifest.parquet", "demos/turns.parquet", "policy/demos.parquet"}
    assert card["probes"]["episode_probe"]["houses"] == 1 and card["dagger_rounds"] == 1
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert sum(p.numel() for p in model.parameters()) == card["parameters"]
    assert "checkpoint: models/policy replaced" in run.stdout
    metrics = json.loads((repo / "models" / "metrics" / "checkpoint.json").read_text())
    assert metrics["identical"] is False and metrics["files"] == card["files"]
    # its last step measured it beside the reader on the recipe's held-out houses: the metrics and their plot
    probe = json.loads((repo / "models" / "metrics" / "utilisation.json").read_text())
    assert (probe["houses"], probe["quests"], probe["model"]) == (1, 3, "models/policy") and "decisions" in probe
    assert probe["sizes"] == "env"  # policy.utilisation_sizes: the eval's scenes' counts, whatever it trained on
    assert set(probe["outcomes"]) == {"model", "reader"} and probe["outcomes"]["model"].keys() == probe["outcomes"]["reader"].keys()
    assert (repo / "models" / "metrics" / "utilisation.csv").read_text().startswith("agent,condition,success,n,who\n")
    # models/dvc.yaml's plots load (a top-level plot's path is relative to that file's folder: the in-context
    # probe's once pointed at models/models/metrics and drew nothing)
    shown = _run([sys.executable, "-m", "dvc", "plots", "show", "--json"], repo, env)
    assert shown.returncode == 0, shown.stderr[-2000:]
    plots = json.loads(shown.stdout)["data"]
    assert all(plots.get(name) and plots[name][0]["content"]["data"]["values"] for name in ("policy_incontext",
                                                                                             "utilisation")), plots.keys()
    # the experiment's own outputs are untouched: the model pipeline writes under data/model/ and models/
    assert not (repo / "data" / "games").exists() and (repo / "data" / "model" / "games" / "manifest.parquet").exists()

    # Published again from the same training: nothing is written, the card keeps its first provenance.
    text = (ckpt / "README.md").read_text()
    again = publish(repo / "data" / "model" / "policy" / "model", ckpt, {**card, "built": {"commit": "other"}})
    assert again.identical and (ckpt / "README.md").read_text() == text

    # DVC knows the checkpoint now: a second repro runs nothing.
    second = _run([sys.executable, "-m", "dvc", "repro", "models/dvc.yaml"], repo, env)
    assert second.returncode == 0 and "Running stage" not in second.stdout, second.stdout


@pytest.mark.slow
def test_every_config_field_a_model_step_reads_is_among_its_params(built):
    from pipeline.tools import deps

    repo, _, _ = built
    records = deps.read_records(repo / READS)
    assert [r["module"] for r in records] == ["pipeline.stages.games", "pipeline.stages.demos",
                                              "pipeline.stages.policy", "pipeline.stages.checkpoint",
                                              "pipeline.policy.utilisation"]
    unlisted = deps.params_violations(ROOT, records, "models/dvc.yaml")
    assert not unlisted, "steps read config keys the stage's params do not list:\n" + json.dumps(unlisted, indent=1)
    # Every pipeline file a step loaded is among the stage's deps (templates resolved from its params), and
    # no other world's package is: an edit of ScienceWorld leaves the checkpoint's lock as it was.
    assert "pipeline/envs/household/descriptor.py" in records[0]["loaded"]
    assert not any(f.startswith("pipeline/envs/scienceworld/") for r in records for f in r["loaded"])
    params = yaml.safe_load((repo / "models" / "params.yaml").read_text())
    unlisted = deps.load_violations(ROOT, records, params, "models/dvc.yaml")
    assert not unlisted, "steps loaded pipeline files the stage's deps do not cover:\n" + json.dumps(unlisted, indent=1)
    assert not [d for d in deps.stage_deps(ROOT, "models/dvc.yaml")["checkpoint"]
                if d.startswith("pipeline/envs/scienceworld")]


@pytest.mark.slow
def test_a_killed_policy_step_resumes_after_its_last_phase_and_writes_the_same_bytes(built):
    """kill -9 of the policy step once its demonstrations' training is saved (:mod:`pipeline.policy.resume`),
    then the step again: it resumes after that phase, does not train it again, writes the bytes the
    uninterrupted build wrote and removes its phases."""
    repo, env, _ = built
    out = repo / "data" / "model" / "policy"
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    phases = repo / ".checkpoints" / "model" / "policy"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.stages.policy"], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not list(phases.glob("*/trained/state.json")):
            assert proc.poll() is None, f"the policy step ended ({proc.returncode}) before its first phase was saved"
            assert time.monotonic() < deadline, "no phase saved in 600 s"
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the step finished before it could be killed in its DAgger round"
    again = _run([sys.executable, "-m", "pipeline.stages.policy"], repo, env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming after phase 'trained'" in again.stderr
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert sorted(after) == sorted(before) and "model/model.safetensors" in after
    assert [name for name in before if after[name] != before[name]] == []
    assert not any(phases.iterdir())
    metrics = json.loads((repo / "models" / "metrics" / "policy.json").read_text())
    assert metrics["resumed_after"] == "trained"
    assert "train_s" not in metrics["wall_time_s"]  # the demonstrations' training was not done again
