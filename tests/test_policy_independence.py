"""The default policy does not depend on the experiment's list of conditions.

The ``demos`` and ``policy`` stages are built from the DAG: their inputs are the games,
the demonstrations and the policy's own config (``demos.advisory_variants``), so
selecting other conditions (``condition:`` in params.yaml) leaves ``data/demos``,
``data/policy`` and their dvc.lock entries unchanged:

- every parameter and dependency dvc.yaml declares for the two stages has the same value
  under any condition selection, and none is another stage's per-condition output;
- the demonstrations built on the tiny world are byte-identical under three selections.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from tests.conftest import train_config

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("demos", "policy")
SELECTIONS = ((), ("condition=[C1,C2]",), ("condition=[C2_placebo,C2_silent]",))
# Outputs of the stages that run per condition or after the evaluation: never a policy input.
FOREIGN_PATHS = ("episodes", "grounding", "grounding_merged", "store", "prompts", "eval", "reports", "plots")


@pytest.fixture(scope="module")
def composed():
    """The project's conf/ composed as DVC does, under each condition selection."""
    from pipeline.core.config import compose_text, validate

    return [validate(OmegaConf.create(compose_text(ROOT, list(sel)))) for sel in SELECTIONS]


def _stage(name: str) -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"][name]


def _param_keys(stage: dict) -> list[str]:
    keys: list[str] = []
    for p in stage.get("params", []):
        keys += [p] if isinstance(p, str) else [k for ks in p.values() for k in ks]
    return keys


def _resolve(text: str, cfg) -> str:
    for key, value in OmegaConf.to_container(cfg.paths).items():
        text = text.replace("${paths.%s}" % key, str(value))
    return text


def test_selections_differ(composed):
    assert len({tuple(c.condition) for c in composed}) == len(SELECTIONS)


@pytest.mark.parametrize("name", STAGES)
def test_stage_params_and_deps_ignore_the_conditions(name, composed):
    stage = _stage(name)
    assert "matrix" not in stage and "condition" not in stage["cmd"]
    keys = _param_keys(stage)
    assert keys
    for key in keys:
        assert key != "condition" and not key.startswith("condition.") and key != "experiment", key
        values = [OmegaConf.to_container(OmegaConf.create({"v": OmegaConf.select(c, key)}), resolve=True)
                  for c in composed]
        assert all(v == values[0] for v in values), key
    cfg = composed[0]
    foreign = [str(cfg.paths[k]).rstrip("/") for k in FOREIGN_PATHS]
    for dep in stage["deps"]:
        path = _resolve(dep, cfg).rstrip("/")
        assert not any(path == f or path.startswith(f + "/") for f in foreign), dep
        # no other stage's code (stages/common.py is the stages' shared error reporting, not a stage)
        assert not (path.startswith("pipeline/stages/")
                    and path not in (f"pipeline/stages/{name}.py", "pipeline/stages/common.py")), dep
    if name == "policy":
        assert any(_resolve(d, cfg).rstrip("/") == str(cfg.paths.demos) for d in stage["deps"])


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_demo_set_bytes_do_not_depend_on_the_conditions(tiny_cfg, tiny_games, tmp_path):
    """The demonstrations (turns, grounding, store, summary) under three condition mappings."""
    from pipeline.policy.demoset import build_demo_set, write_demo_set

    base = train_config(tiny_cfg, {"agent": {"name": "llm"},
                                   "policy": {"rule_epsilon": 0.6, "demos_per_quest": 6,
                                              "generated_houses": 4, "generated_drills": 4}})
    mappings = [dict(base.condition), {}, {"C2_placebo": base.condition.C2_placebo, "C1": base.condition.C1}]
    digests, variants = [], set()
    for i, mapping in enumerate(mappings):
        cfg = base.copy()
        cfg.condition = mapping
        demo_set = build_demo_set(cfg, tiny_games.root, tiny_games.rows, tiny_games.scenes)
        write_demo_set(demo_set, tmp_path / str(i))
        digests.append(_digests(tmp_path / str(i)))
        variants |= {t.variant for t in demo_set.turns}
    assert digests[0] and digests[1] == digests[0] and digests[2] == digests[0]
    assert any("+" in v for v in variants), "some demonstrations carry an advisory block"
