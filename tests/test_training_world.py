"""The model pipeline's world is its own (issue 64, item 2): no experiment's scene, quest or held-out
house reaches the training data, and no house the utilisation probe holds out is trained on.

The model pipeline's games draw their scenes from ``(seed, "model-scene", i)``
(``policy.world: own``), a label the experiment's games never draw from (``(seed, "scene", i)``),
and every generated house from a stream of its own. So this holds by construction; these tests
check it on the committed recipe (``models/params.yaml``) against the default experiment's world,
the design world (``seed=1000``) and the first 200 experiment seeds, by layout: a quest is an
objective *in a house*, so a house no experiment has carries none of its quests. (An objective's
text, "put the Apple_2 in the Fridge_0", may recur in another house: that is another quest.)
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from pipeline.core.config import MODEL, load_params
from pipeline.core.seeding import derive_seed
from pipeline.envs.household.games import EXPERIMENT_STREAM, MODEL_STREAM, make_scene, plan_games, scene_id, scene_stream
from pipeline.envs.household.generate import layout_key
from pipeline.policy import later_turns, statements
from pipeline.policy.dagger import dagger_houses
from pipeline.policy.demos import house_stream, training_houses

# The experiment seeds checked: the default run's, the design world's and the first 200.
EXPERIMENT_SEEDS = sorted({0, 1000, *range(200)})


@pytest.fixture(scope="module")
def model_cfg():
    return load_params(pipeline=MODEL)


@pytest.fixture(scope="module")
def model_world(model_cfg):
    cfg = model_cfg
    return plan_games(cfg.env, seed=int(cfg.seed), preferences_per_scene=int(cfg.user.preferences_per_scene),
                      games_dir=cfg.paths.games, stream=scene_stream(cfg))


@pytest.fixture(scope="module")
def experiment_layouts(model_cfg):
    """Every scene of every checked experiment seed, by layout (the experiment's env is the model's:
    conf/train.yaml composes the same group): layout -> (seed, scene_id)."""
    env, prefs = model_cfg.env, int(model_cfg.user.preferences_per_scene)
    return {layout_key(make_scene(env, i, seed, prefs)): (seed, scene_id(i))
            for seed in EXPERIMENT_SEEDS for i in range(int(env.num_scenes))}


def test_the_recipe_draws_the_model_pipelines_own_scenes(model_cfg):
    assert model_cfg.policy.world == "own"
    assert scene_stream(model_cfg) == MODEL_STREAM
    # The experiment's config has no recipe: its games draw from the experiment's stream.
    assert scene_stream(OmegaConf.create({"seed": 0, "env": dict(model_cfg.env)})) == EXPERIMENT_STREAM
    assert scene_stream(OmegaConf.merge(model_cfg, {"policy": {"world": "shared"}})) == EXPERIMENT_STREAM


def test_no_experiment_scene_is_a_scene_of_the_model_world(model_world, experiment_layouts):
    scenes, rows = model_world
    assert len(scenes) == 12 and {r["split"] for r in rows} == {"train", "eval"}
    shared = {sid: experiment_layouts[layout_key(s)] for sid, s in scenes.items() if layout_key(s) in experiment_layouts}
    assert not shared, f"the model pipeline's scenes that are an experiment's (seed, scene): {shared}"


def test_the_shared_world_is_the_default_experiments(model_cfg, experiment_layouts):
    """``policy.world: shared`` (how the checkpoints before item 2 were built) plays the default
    experiment's houses: the check above can fail."""
    cfg = OmegaConf.merge(model_cfg, {"policy": {"world": "shared"}})
    scenes, _ = plan_games(cfg.env, seed=0, preferences_per_scene=int(cfg.user.preferences_per_scene),
                           games_dir=cfg.paths.games, stream=scene_stream(cfg))
    assert [experiment_layouts.get(layout_key(s)) for s in scenes.values()] == [(0, sid) for sid in scenes]


def _layouts(houses) -> dict[str, str]:
    return {layout_key(h.spec): h.scene_id for h in houses}


def test_no_training_house_is_an_experiment_scene_or_a_held_out_house(model_cfg, model_world, experiment_layouts):
    """Every stream of generated houses the recipe trains on (its first houses: the main stream of
    demonstrations and drills, DAgger's rounds, the later-turn and statement drills) against every
    checked experiment scene and the held-out houses the utilisation probe and the in-context score
    play (their first 200)."""
    cfg = model_cfg
    scenes, rows = model_world
    assert int(cfg.policy.dagger_rounds) >= 1
    held_out = _layouts(training_houses(cfg, rows, scenes, heldout=True, quests_per_house=2).houses(200))
    streams = {"main": training_houses(cfg, rows, scenes, quests_per_house=2).houses(400)}
    streams |= {f"dagger round {r}": dagger_houses(cfg, rows, scenes, r, 60) for r in range(int(cfg.policy.dagger_rounds))}
    # The drills' streams as pipeline.policy.statements.draw_drills draws them, under each module's own label.
    streams |= {m.STREAM: house_stream(cfg, rows, scenes, derive_seed(cfg.seed, m.STREAM), 2).houses(60)
                for m in (later_turns, statements)}
    model_eval = {layout_key(scenes[r["scene_id"]]) for r in rows if r["split"] == "eval"}
    for name, houses in streams.items():
        layouts = _layouts(houses)
        assert not layouts.keys() & experiment_layouts.keys(), f"{name}: a house that is an experiment's scene"
        assert not layouts.keys() & held_out.keys(), f"{name}: a house the probe holds out"
        assert not layouts.keys() & model_eval, f"{name}: a house with the model world's eval quests"
    assert not held_out.keys() & experiment_layouts.keys()
