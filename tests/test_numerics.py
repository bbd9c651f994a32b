"""Numerics pinned from config (``numerics.*``, :mod:`pipeline.core.numerics`).

The real test trains the policy (the model pipeline's ``policy`` step) and collects with it
(the experiment's ``collect`` stage, playing the trained directory as ``model.name_or_path``),
each stage's ``main`` in a fresh process, as DVC runs them, under environments that stand in
for other machines: another ATen kernel set (``ATEN_CPU_CAPABILITY``), another thread count
(``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``), another MKL branch. With the pin the bytes are
identical; with ``numerics=native`` the same variation changes the trained weights (so the
variations are real and the comparison can fail).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.core.config import MODEL, ConfigError, validate
from pipeline.core.numerics import environment
from tests.conftest import SMALL_POLICY_OVERRIDES

pytestmark = pytest.mark.e2e  # a whole pipeline in fresh processes: `make test-e2e`, CI's second step (tests/test_suite_order.py)

ROOT = Path(__file__).resolve().parents[1]

# The tiny world of tests/conftest.py (same games), a tiny policy trained for one epoch; the
# experiment plays what the model pipeline trained (its data/model/policy/model).
WORLD = [
    "env.num_scenes=2", "env.heldout_scenes=1", "env.rooms_per_scene=2", "env.containers_per_scene=2",
    "env.locked_containers=1", "env.supporters_per_scene=1", "env.objects_per_scene=2",
    "env.train_quests_per_scene=2", "env.eval_quests_per_scene=1", "env.max_steps=6", "workers=2",
    "agent.batch_size=4",
]
TRAIN = [*WORLD, "policy.rule_epsilon=0.6", "policy.demos_per_quest=3",
         "policy.vocab_size=400", "policy.max_positions=1024", "policy.episodes_per_batch=2",
         "policy.lr=0.005", "policy.warmup_steps=3", "policy.evaluate=false",
         "policy.dagger_rounds=1", *SMALL_POLICY_OVERRIDES]
TRAINED = "data/model/policy"
EXPERIMENT = [*WORLD, f"model.name_or_path={TRAINED}/model",
              *[o for o in SMALL_POLICY_OVERRIDES if o.startswith("sampling.")]]
RUN = ("from pipeline.stages import collect, policy\n"
       "assert policy.main() == 0 and collect.main() == 0\n")
AMBIENT = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS",
           "ONEDNN_MAX_CPU_ISA", "MKL_DYNAMIC", "OMP_DYNAMIC", "DVC_ROOT")


def _has_avx512() -> bool:
    try:
        return " avx512f " in f" {Path('/proc/cpuinfo').read_text()} "
    except OSError:
        return False


@pytest.fixture(scope="module")
def project(tiny_cfg, tiny_games, tmp_path_factory) -> Path:
    """A project with the session's tiny games and the demos stage's output."""
    from pipeline.core.config import compose

    root = tmp_path_factory.mktemp("numerics_project")
    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "dvc.yaml").write_text("stages: {}\n")
    compose(root, TRAIN, pipeline=MODEL)
    compose(root, EXPERIMENT)
    for games in ("data/games", "data/model/games"):  # the experiment's and the model pipeline's
        shutil.copytree(tiny_games.root / tiny_cfg.paths.games, root / games)
    _stage(root, "from pipeline.stages import demos\nassert demos.main() == 0\n", {})
    return root


def _stage(root: Path, code: str, ambient: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in AMBIENT}
    env.update(ambient)
    p = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr


def _train_and_collect(root: Path, ambient: dict[str, str]) -> dict[str, str]:
    for d in (TRAINED, "data/episodes", ".checkpoints"):
        shutil.rmtree(root / d, ignore_errors=True)
    _stage(root, RUN, ambient)
    out = {}
    for d in (TRAINED, "data/episodes"):
        for p in sorted((root / d).rglob("*")):
            if p.is_file():
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_pinned_outputs_do_not_depend_on_the_machines_kernels_or_threads(project: Path):
    baseline = _train_and_collect(project, {})
    key = f"{TRAINED}/model/model.safetensors"
    assert key in baseline and "data/episodes/turns.parquet" in baseline
    assert any(k.endswith(".pt") for k in baseline)  # the per-turn logprob tensors are compared too
    machines = [{"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2", "MKL_CBWR": "AUTO"}]
    if _has_avx512():
        machines.append({"ATEN_CPU_CAPABILITY": "avx512", "MKL_NUM_THREADS": "4", "MKL_ENABLE_INSTRUCTIONS": "AVX2"})
    for ambient in machines:
        assert _train_and_collect(project, ambient) == baseline, ambient

    # The same variation without the pin changes the trained weights.
    from pipeline.core.config import compose

    files = ("params.yaml", "params.overrides.yaml", MODEL.params_file, MODEL.overrides_file)
    kept = {f: (project / f).read_bytes() for f in files}
    try:
        compose(project, ["numerics=native"], keep_overrides=True)
        compose(project, ["numerics=native"], keep_overrides=True, pipeline=MODEL)
        native = _train_and_collect(project, {"ATEN_CPU_CAPABILITY": "default"})
    finally:
        for f, data in kept.items():
            (project / f).write_bytes(data)
    assert native[key] != baseline[key]


def test_environment_of_the_default_and_native_configs():
    env = environment({"cpu_capability": "avx2", "mkl_cbwr": "COMPATIBLE", "threads": 3, "deterministic": True})
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["MKL_CBWR"] == "COMPATIBLE" and env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env["MKL_DYNAMIC"] == "FALSE"
    native = environment({"cpu_capability": "native", "mkl_cbwr": "native", "threads": 1, "deterministic": True})
    assert "ATEN_CPU_CAPABILITY" not in native and "MKL_CBWR" not in native and native["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("key,value,match", [
    ("cpu_capability", "sse9", "Invalid value 'sse9', expected one of [default, avx2, avx512, native]"),
    ("mkl_cbwr", "AVX2", "expected one of [COMPATIBLE, AUTO, native]"),
    ("mkl_cbwr", "AVX2", "MKL's other branches exist on Intel CPUs only"),
    ("threads", 0, "numerics.threads=0: expected >= 1"),
])
def test_bad_numerics_values_name_the_key(tiny_cfg, key, value, match):
    bad = OmegaConf.merge(OmegaConf.to_container(tiny_cfg), {"numerics": {key: value}})
    with pytest.raises(ConfigError, match=re.escape(match)) as err:
        validate(bad)
    assert f"numerics.{key}" in str(err.value)
