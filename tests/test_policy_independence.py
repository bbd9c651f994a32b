"""The default policy does not depend on the experiment's list of conditions.

The model is built by a pipeline of its own (``models/dvc.yaml``, ``models/params.yaml`` composed
from ``conf/train.yaml``): its inputs are its games, the demonstrations and its own config
(``demos.advisory_variants``, the recipe), so selecting other conditions (``condition:`` of the
experiment's params.yaml) changes nothing it reads:

- the model pipeline's params compose to the same values under any condition selection of the
  experiment, with no condition at all, and its stage lists no condition or experiment output;
- the demonstrations built on the tiny world are byte-identical under three selections.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from tests.conftest import train_config

ROOT = Path(__file__).resolve().parents[1]
SELECTIONS = ((), ("condition=[C1,C2]",), ("condition=[C2_placebo,C2_silent]",))
# Outputs of the experiment's stages that run per condition or after the evaluation: never a model input.
FOREIGN_PATHS = ("episodes", "grounding", "grounding_merged", "store", "prompts", "eval", "reports", "plots")


def test_the_model_pipeline_reads_no_condition():
    from pipeline.core.config import MODEL, compose_text, validate
    from pipeline.tools.deps import stage_deps, stage_params

    experiment = [validate(OmegaConf.create(compose_text(ROOT, list(sel)))) for sel in SELECTIONS]
    assert len({tuple(c.condition) for c in experiment}) == len(SELECTIONS)
    model = yaml.safe_load(compose_text(ROOT, pipeline=MODEL))
    assert model == yaml.safe_load((ROOT / MODEL.params_file).read_text()) and model["condition"] == {}
    keys = stage_params(ROOT, "models/dvc.yaml")["checkpoint"]
    assert keys and all(k != "condition" and not k.startswith("condition.") and k != "experiment" for k in keys)
    paths = model["paths"]
    foreign = [str(experiment[0].paths[k]).rstrip("/") for k in FOREIGN_PATHS]
    for dep in stage_deps(ROOT, "models/dvc.yaml")["checkpoint"]:
        path = dep
        for key, value in paths.items():
            path = path.replace("${paths.%s}" % key, str(value))
        assert not any(path == f or path.startswith(f + "/") for f in foreign), dep
        assert not (path.startswith("pipeline/stages/") and path.removeprefix("pipeline/stages/").removesuffix(".py")
                    not in ("games", "demos", "policy", "checkpoint", "common")), dep


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_demo_set_bytes_do_not_depend_on_the_conditions(tiny_cfg, tiny_games, tmp_path):
    """The demonstrations (turns, grounding, store, summary) under three condition mappings."""
    from pipeline.policy.demoset import build_demo_set, write_demo_set

    base = train_config(tiny_cfg, {"agent": {"name": "llm"},
                                   "policy": {"rule_epsilon": 0.6, "demos_per_quest": 3,
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
