"""Architecture rules: library code never imports the stages; dvc.yaml lists each stage's code."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from pipeline.tools import deps

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
STAGES = PACKAGE / "stages"
STAGE_MODULES = sorted(f"pipeline.stages.{p.stem}" for p in STAGES.glob("*.py") if p.name != "__init__.py")


def _library_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if STAGES not in p.parents and "__pycache__" not in p.parts)


def test_library_code_never_imports_the_stages():
    """No module outside pipeline/stages/ imports pipeline.stages (any form, functions included)."""
    offenders = {}
    for path in _library_files():
        stages = sorted(m for m in deps.imported_modules(ROOT, path)
                        if m == "pipeline.stages" or m.startswith("pipeline.stages."))
        if stages:
            offenders[path.relative_to(ROOT).as_posix()] = stages
    assert not offenders, f"library modules import pipeline.stages: {offenders}"


def test_dvc_yaml_deps_cover_every_stage_closure():
    """`python -m pipeline.tools.deps --check` passes for the real dvc.yaml."""
    modules = deps.stage_modules(ROOT)
    assert "collect" in modules and modules["render"] == "pipeline.stages.render"
    missing = deps.missing(ROOT)
    assert not missing, f"dvc.yaml deps miss {missing}: see `python -m pipeline.tools.deps` for the deps to list"


@pytest.mark.parametrize("module", STAGE_MODULES)
def test_stage_module_imports(module):
    importlib.import_module(module)


def test_closure_follows_every_import_form(tmp_path):
    """Absolute, from-submodule, relative and function-level imports; trivial __init__ left out."""
    pkg = tmp_path / "pipeline"
    files = {
        "__init__.py": '"""docstring only"""\n',
        "stages/__init__.py": "",
        "stages/s.py": "import pipeline.a.x\nfrom pipeline.b import y\n\ndef main():\n    from .helper import f\n",
        "stages/helper.py": "def f():\n    return 1\n",
        "a/__init__.py": "VALUE = 1\n",
        "a/x.py": "from ..c import z as _z\n",
        "b/__init__.py": "",
        "b/y.py": "from . import w\nimport os\n",
        "b/w.py": "",
        "b/unused.py": "",
        "c/__init__.py": "",
        "c/z.py": "",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert deps.closure(tmp_path, "pipeline.stages.s") == [
        "pipeline/a/__init__.py", "pipeline/a/x.py", "pipeline/b/w.py", "pipeline/b/y.py",
        "pipeline/c/z.py", "pipeline/stages/helper.py", "pipeline/stages/s.py",
    ]


def test_covered_by_file_or_directory():
    assert deps.covered("pipeline/agents/llm.py", ["pipeline/agents"])
    assert deps.covered("pipeline/agents/llm.py", ["pipeline/agents/", "x"])
    assert deps.covered("pipeline/core/io.py", ["pipeline/core/io.py"])
    assert not deps.covered("pipeline/agents_extra/x.py", ["pipeline/agents"])
    assert not deps.covered("pipeline/core/io.py", ["${paths.games}", "pipeline/core/config.py"])


def test_the_seam_factories_name_an_unknown_world(tiny_cfg, tiny_games, tmp_path):
    """`env.name` is read only by the factories, which reject a world they do not know by name
    (the typed config refuses it first: `EnvName` is a closed set; an untyped one reaches them)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    from pipeline.envs import build_games, make_env
    from pipeline.session.rollout import tasks_from_manifest
    from pipeline.users import make_user

    task = tasks_from_manifest(tiny_games.rows, split="train", master_seed=0)[0]
    with pytest.raises(ValidationError, match="full_key: env.name"):
        OmegaConf.merge(tiny_cfg, {"env": {"name": "kitchen_sim"}})
    other = OmegaConf.create(OmegaConf.to_container(tiny_cfg))
    other.env.name = "kitchen_sim"
    for call in (lambda: make_env(other, task, tiny_games.root, tiny_games.scenes),
                 lambda: make_user(other, tiny_games.scenes, task),
                 lambda: build_games(other, tmp_path, progress=False)):
        with pytest.raises(ValueError, match="env.name='kitchen_sim'"):
            call()
    env = make_env(tiny_cfg, task, tiny_games.root, tiny_games.scenes)
    try:
        obs = env.reset()
        assert obs["admissible_commands"] == env.admissible and env.admissible
    finally:
        env.close()
    user = make_user(tiny_cfg, tiny_games.scenes, task)
    assert callable(user.step_feedback) and callable(user.end_feedback)
