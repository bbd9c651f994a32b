"""Architecture rules: the layer order of docs/architecture.md holds for every import; library
code never imports the stages; environment-agnostic packages never name a world; dvc.yaml
lists each stage's code."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from pipeline.tools import deps

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
STAGES = PACKAGE / "stages"
STAGE_MODULES = sorted(f"pipeline.stages.{p.stem}" for p in STAGES.glob("*.py") if p.name != "__init__.py")


def _library_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if STAGES not in p.parents and "__pycache__" not in p.parts)


# The layers of docs/architecture.md, lowest first: a package imports only itself and the
# packages of lower ranks (never one of its own rank, never a higher one).
LAYERS = [
    ("core",),
    ("analysis", "llm"),
    ("grounding",),
    ("prompts",),
    ("memory", "envs"),
    ("users", "agents", "conditions"),
    ("session",),
    ("policy", "tools"),
    ("view",),
    ("stages",),
]
RANK = {pkg: rank for rank, layer in enumerate(LAYERS) for pkg in layer}
# Packages that hold no world's knowledge: they read typed facts (pipeline.core.facts), never
# a world's prose, and import no environment.
WORLD_AGNOSTIC = ("memory", "grounding", "conditions", "analysis", "prompts", "llm", "core")
HOUSEHOLD_PROSE = ("You are in the", "You see", "Exits:", "You are carrying", "take (", "unlock (", "go (")


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pipeline" else None


def test_every_import_follows_the_layer_order():
    """Each ``pipeline.<package>`` import (top level or inside a function) goes down the
    order of :data:`LAYERS`, or stays in its package."""
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(RANK), f"packages without a layer, or layers without a package: {packages ^ set(RANK)}"
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = _package(deps.module_name(ROOT, path))
        if src is None or "__pycache__" in path.parts:
            continue  # pipeline/__init__.py
        for module in deps.imported_modules(ROOT, path):
            dst = _package(module)
            if dst is not None and dst != src and RANK[dst] >= RANK[src]:
                offenders.append(f"{path.relative_to(ROOT).as_posix()} ({src}) imports {module} ({dst})")
    assert not offenders, "imports against the layer order of docs/architecture.md:\n" + "\n".join(offenders)


def test_world_agnostic_packages_name_no_world():
    """memory, grounding, conditions, analysis, prompts, llm and core import no environment
    and hold none of the household's sentences (they read typed facts instead)."""
    offenders = []
    for pkg in WORLD_AGNOSTIC:
        for path in sorted((PACKAGE / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            offenders += [f"{rel} imports {m}" for m in deps.imported_modules(ROOT, path)
                          if _package(m) == "envs"]
            text = path.read_text(encoding="utf-8")
            offenders += [f"{rel} holds {phrase!r}" for phrase in HOUSEHOLD_PROSE if phrase in text]
    assert not offenders, "\n".join(offenders)


# The packages that must not name a world at all (issue 33): the environment reaches them only
# through the seams' factories (pipeline.envs.make_env / fact_reader, pipeline.users.make_user).
UNNAMED_WORLD_PACKAGES = ("memory", "grounding", "conditions", "analysis")
WORLD_NAMES = ("household", "scienceworld", "textworld")
# Where runtime text needs a world's words, the world supplies them (pipeline.envs.world_words):
# no literal of these packages names one.


def _code_names(path: Path) -> list[tuple[str, str]]:
    """``(kind, text)`` of every identifier, import and non-docstring string literal of a module."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.append(("name", n.id))
        elif isinstance(n, ast.Attribute):
            out.append(("name", n.attr))
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(("name", n.name))
        elif isinstance(n, ast.alias):
            out.append(("import", n.name))
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.append(("import", n.module))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
            out.append(("literal", n.value))
    return out


def test_memory_grounding_conditions_analysis_name_no_world():
    """No identifier, import or string of pipeline/memory, grounding, conditions(*), analysis names
    ScienceWorld, TextWorld or the household (comments and docstrings may): the world is chosen only
    through the seams' factories, and its words (an advisory's preference principle, the report's
    definition of success) come from :func:`pipeline.envs.world_words`."""
    offenders = []
    for pkg in UNNAMED_WORLD_PACKAGES:
        paths = sorted((PACKAGE / pkg).rglob("*.py")) + sorted(PACKAGE.glob(f"{pkg}_*.py"))
        assert paths, f"pipeline/{pkg} has no module"
        for path in paths:
            rel = path.relative_to(ROOT).as_posix()
            for kind, text in _code_names(path):
                if any(w in text.lower() for w in WORLD_NAMES):
                    offenders.append(f"{rel}: {kind} {text[:80]!r}")
    assert not offenders, "world names in world-agnostic packages:\n" + "\n".join(offenders)


def test_the_memory_package_names_no_control():
    """The memory is primitives (store, retrieval, advisories, knowledge, the gate under an
    exposure); what the experiment's controls inject is pipeline/conditions/ (one object per
    kind), so no line of pipeline/memory, code or prose, names the placebo or the oracle."""
    import re

    hits = [f"{p.relative_to(ROOT).as_posix()}:{i}: {line.strip()[:80]}"
            for p in sorted((PACKAGE / "memory").rglob("*.py")) if "__pycache__" not in p.parts
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if re.search(r"placebo|oracle", line, re.IGNORECASE)]
    assert not hits, "pipeline/memory names a control:\n" + "\n".join(hits)


def test_each_world_supplies_its_own_words_to_the_world_agnostic_text():
    """The household's advisory principle and report definition are its own words (the bytes of
    its artifacts), ScienceWorld's are not the household's, and both reach the text through the
    seam: an advisory built with a world's words states its principle, the report its success."""
    from omegaconf import OmegaConf

    from pipeline.analysis.report import report_markdown
    from pipeline.envs import world_words
    from pipeline.memory.advisory import compose_message

    house = world_words(OmegaConf.create({"env": {"name": "household"}}))
    science = world_words(OmegaConf.create({"env": {"name": "scienceworld"}}))
    assert house.preference_principle == "Respect the user's household preferences while completing the goal."
    assert house.success.startswith("TextWorld `won`")
    assert "household" not in science.preference_principle and "TextWorld" not in science.success
    entry = {"case_summary": {"risk_tags": ["feedback_user_preference"], "symptom": "left Fridge_0 open",
                              "rationale_summary": "the user asked to close it"},
             "evaluation": {"won": True}, "correction": {"corrected": True}}
    for words in (house, science):
        assert words.preference_principle in compose_message(entry, "successful_override", words=words)
        report = report_markdown({"settings": {}, "conditions": []}, {}, words.success)
        assert f"Success = `is_correct` ({words.success})" in report


def test_the_documented_layers_are_the_enforced_ones():
    """docs/architecture.md states the same order as :data:`LAYERS`."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for rank, layer in enumerate(LAYERS):
        line = f"| {rank} | " + ", ".join(f"`{pkg}`" for pkg in layer) + " |"
        assert line in doc, f"docs/architecture.md lacks the layer row {line!r}"


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
    """`python -m pipeline.tools.deps --check` passes for the real dvc.yaml and models/dvc.yaml."""
    modules = deps.stage_modules(ROOT)
    assert "collect" in modules and modules["render"] == ["pipeline.stages.render"]
    assert deps.stage_modules(ROOT, "models/dvc.yaml")["checkpoint"] == [
        "pipeline.stages.games", "pipeline.stages.demos", "pipeline.stages.policy", "pipeline.stages.checkpoint",
        "pipeline.policy.utilisation"]  # the last step: the probe's module itself, a measurement of the checkpoint
    missing = deps.missing(ROOT)
    assert not missing, f"dvc.yaml deps miss {missing}: see `python -m pipeline.tools.deps` for the deps to list"
    assert deps.params_drift(ROOT) == {}, "collect's params are written from CHECKPOINT_KEYS: run --write"


def test_the_policy_steps_resume_key_hashes_the_model_stages_params():
    """An interrupted `make model` resumes only from phases of the same params (pipeline.policy.resume):
    its key's config keys are the model stage's DVC params, no fewer (a stale phase) and no more."""
    from pipeline.policy.resume import PHASE_KEYS

    stage = yaml.safe_load((ROOT / "models" / "dvc.yaml").read_text())["stages"]["checkpoint"]
    listed = [k for entry in stage["params"] for keys in entry.values() for k in keys]
    assert list(PHASE_KEYS) == listed


def test_code_deps_are_what_can_change_a_stage_outputs():
    """The schema reaches the stages as params.yaml's values (no stage but check_params depends on
    its source: a docstring edit reruns nothing else), and a backend not selected is no dependency:
    an edit of the openai backend reruns none of games, ground, merge, store."""
    listed = deps.stage_deps(ROOT)
    schema = "pipeline/core/conf_schema.py"
    assert deps.covered(schema, listed["check_params"])
    assert [s for s, d in listed.items() if s != "check_params" and deps.covered(schema, d)] == []
    assert not deps.covered(schema, deps.stage_deps(ROOT, "models/dvc.yaml")["checkpoint"])
    for stage in ("games", "ground", "merge", "store"):
        assert not deps.covered("pipeline/llm/backends/openai.py", listed[stage]), stage
    assert "pipeline/llm/backends/${model.backend}.py" in listed["ground"]  # grounding.generator=llm: the selected one
    assert "pipeline/llm/backends/${model.backend}.py" in listed["collect"]
    # a world's package is the run's only: no stage lists ScienceWorld's code but through env.world's template
    model = deps.stage_deps(ROOT, "models/dvc.yaml")["checkpoint"]
    for stage, listed_deps in [*listed.items(), ("models/dvc.yaml:checkpoint", model)]:
        assert not deps.covered("pipeline/envs/scienceworld/reader.py", listed_deps), stage
    assert "pipeline/envs/${env.world}" in listed["collect"] and "pipeline/envs/${env.world}" in model
    assert deps.resolve("pipeline/envs/${env.world}", {"env": {"world": "scienceworld"}}) == "pipeline/envs/scienceworld"


def test_bytecode_caches_are_no_part_of_a_directory_dep():
    """A first import writes ``__pycache__/`` beside the sources, inside directory deps such as
    ``pipeline/agents`` (the Makefile lets Python write them): .dvcignore must keep them out of the
    deps' hashes, or every stage would look changed after any run or test (issue 63)."""
    import subprocess
    import sys

    listed = {**deps.stage_deps(ROOT), **deps.stage_deps(ROOT, "models/dvc.yaml")}
    folders = sorted({d.rstrip("/") for ds in listed.values() for d in ds
                      if "${" not in d and (ROOT / d).is_dir() and any((ROOT / d).rglob("*.py"))})
    assert "pipeline/agents" in folders
    caches = [f"{d}/__pycache__/mod.cpython-311.pyc" for d in folders] + ["pipeline/envs/household/__pycache__/x.pyc"]
    source = "pipeline/agents/reader.py"  # the sources themselves are hashed: never listed as ignored
    proc = subprocess.run([sys.executable, "-m", "dvc", "check-ignore", *caches, source], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == caches, proc.stdout + proc.stderr


def _stage_closure_of(root, files: dict[str, str]) -> tuple[list[str], list[str]]:
    """``deps.stage_closure`` of the stage module ``pipeline.stages.s`` in a package made of ``files``
    (``{path under pipeline/: source}``) at ``root``."""
    for rel, text in files.items():
        (root / "pipeline" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "pipeline" / rel).write_text(text)
    return deps.stage_closure(root, ["pipeline.stages.s"])


def test_a_factory_reached_statically_makes_its_selected_implementation_a_templated_dep(tmp_path):
    files = {
        "__init__.py": "", "stages/__init__.py": "",
        "stages/s.py": "from pipeline.llm.backends import make_backend\n",
        "llm/__init__.py": "", "llm/backends/__init__.py": "import importlib\n",
        "llm/backends/openai.py": "from pipeline.llm.backends import cache\n",
        "llm/backends/transformers.py": "from pipeline.llm import kvcache\n",
        "llm/backends/cache.py": "", "llm/kvcache.py": "",
    }
    found, templated = _stage_closure_of(tmp_path, files)
    assert templated == ["pipeline/llm/backends/${model.backend}.py"]
    # each implementation's own helpers stay literal deps; the implementations themselves do not
    assert found == ["pipeline/llm/backends/__init__.py", "pipeline/llm/backends/cache.py", "pipeline/llm/kvcache.py",
                     "pipeline/stages/s.py"]


def test_a_world_package_is_one_templated_directory_dep(tmp_path):
    """The registry's worlds are packages: the dep is the selected one's directory, and what the
    packages import outside themselves stays a literal dep."""
    files = {
        "__init__.py": "", "stages/__init__.py": "", "core/__init__.py": "", "core/facts.py": "",
        "stages/s.py": "from pipeline.envs.registry import world_of\n",
        "envs/__init__.py": "", "envs/registry.py": "import importlib\n",
        "envs/household/__init__.py": "", "envs/household/descriptor.py": "from pipeline.envs.household import env\n",
        "envs/household/env.py": "from pipeline.core import facts\n",
        "envs/scienceworld/__init__.py": "", "envs/scienceworld/descriptor.py": "",
    }
    found, templated = _stage_closure_of(tmp_path, files)
    assert templated == ["pipeline/envs/${env.world}"]
    assert found == ["pipeline/core/facts.py", "pipeline/envs/registry.py", "pipeline/stages/s.py"]


def test_a_loaded_file_no_resolved_dep_covers_is_named(tmp_path):
    """The run-time check of what static imports cannot see: a stage's recorded loads against its
    deps, each template resolved from the run's params."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: python -m pipeline.stages.s\n"
        "    deps:\n      - pipeline/stages/s.py\n      - pipeline/envs/${env.world}\n")
    record = {"module": "pipeline.stages.s", "loaded": ["pipeline/stages/s.py", "pipeline/envs/household/env.py",
                                                        "pipeline/core/conf_schema.py"]}
    assert deps.load_violations(tmp_path, [record], {"env": {"world": "household"}}) == {}
    assert deps.load_violations(tmp_path, [record], {"env": {"world": "scienceworld"}}) == {
        "s": ["pipeline/envs/household/env.py"]}
    with pytest.raises(ValueError, match="pipeline.stages.t: no stage of dvc.yaml runs it"):
        deps.load_violations(tmp_path, [{**record, "module": "pipeline.stages.t"}], {"env": {"world": "household"}})


def test_a_read_is_covered_by_its_key_or_a_section_containing_it():
    assert deps.unlisted_reads(["env.reward.win", "env.max_steps", "seed", "workers", "paths.games"],
                               ["env.reward", "seed"]) == ["env.max_steps"]
    assert deps.unlisted_reads([""], ["env"]) == ["<the whole config>"]
    assert deps.unlisted_reads(["agent.worker_stall_s"], []) == []  # supervision: never a param
    assert deps.unlisted_reads(["envx.a"], ["env"]) == ["envx.a"]


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
    """`env.name` is read only through the world registry (pipeline/envs/registry.py), whose
    lookup rejects a world it does not know by name and lists the known ones: the typed config
    takes any string (the registry, not the schema, is the list of worlds)."""
    from omegaconf import OmegaConf

    from pipeline.envs import build_games, fact_reader, make_env, unread_env_keys, world_words
    from pipeline.session.rollout import tasks_from_manifest
    from pipeline.users import make_user

    task = tasks_from_manifest(tiny_games.rows, split="train", master_seed=0)[0]
    other = OmegaConf.merge(tiny_cfg, {"env": {"name": "kitchen_sim"}})
    known = "expected one of household, tiny, scienceworld, scienceworld_tiny"
    for call in (lambda: make_env(other, task, tiny_games.root, tiny_games.scenes),
                 lambda: make_user(other, tiny_games.scenes, task),
                 lambda: build_games(other, tmp_path, progress=False),
                 lambda: fact_reader(other), lambda: world_words(other), lambda: unread_env_keys(other)):
        with pytest.raises(ValueError, match=f"env.name='kitchen_sim': unknown environment, {known}"):
            call()
    env = make_env(tiny_cfg, task, tiny_games.root, tiny_games.scenes)
    try:
        obs = env.reset()
        assert obs["admissible_commands"] == env.admissible and env.admissible
    finally:
        env.close()
    user = make_user(tiny_cfg, tiny_games.scenes, task)
    assert callable(user.step_feedback) and callable(user.end_feedback)


def test_the_experiment_never_runs_the_model_pipeline():
    """`dvc repro` reproduces a stage's upstream across dvc.yaml files: an output of the model
    pipeline that an experiment stage depends on (the checkpoint) would make every `make repro`
    train the model. The checkpoint is a dependency of the experiment, no output of the model's."""
    import yaml

    def resolve(path: str, params: dict) -> str:
        for key, value in params["paths"].items():
            path = path.replace("${paths.%s}" % key, str(value))
        return path.rstrip("/")

    exp_params = yaml.safe_load((ROOT / "params.yaml").read_text())
    model_params = yaml.safe_load((ROOT / "models" / "params.yaml").read_text())
    model_outs = []
    for stage in yaml.safe_load((ROOT / "models" / "dvc.yaml").read_text())["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            model_outs += [resolve(next(iter(o)) if isinstance(o, dict) else o, model_params) for o in stage.get(kind, [])]
    exp_deps = {resolve(d, exp_params) for s in deps.stage_deps(ROOT).values() for d in s}
    assert resolve("${paths.model}", exp_params) in exp_deps  # the experiment plays the checkpoint
    clash = [o for o in model_outs if any(d == o or d.startswith(o + "/") or o.startswith(d + "/") for d in exp_deps)]
    assert model_outs and clash == []
