"""Generated training houses and the uncompiled engine they are played on.

- the differential test: TextWorld's logic engine (:class:`LogicHouseholdEnv`, no Inform 7)
  gives the compiled game's observation, admissible commands, reward, done and step
  record at every step, along the expert plan and seeded random walks, on every built
  game of ``env=tiny`` and on a generated house compiled for the purpose;
- the generator: houses are a pure function of (seed, index), thousands of them are
  distinct, and none is the layout of a scene with eval quests or carries an eval
  objective (by construction: their own seed stream; and checked here).
"""

from __future__ import annotations

import json
import random

import pytest

from pipeline.core.conf_schema import EnvConfig
from pipeline.envs.household.env import HouseholdEnv, LogicHouseholdEnv, command_to_action
from pipeline.envs.household.games import compile_quest_game, make_scene, plan_games
from pipeline.envs.household.generate import GeneratedHouses, HouseSizes, layout_key

pytestmark = pytest.mark.filterwarnings("ignore:Game .* is not fully supported")

# The step record's fields that come from the game (env_feedback is the game's own text:
# the logic engine has none, and nothing reads it back).
INFO_KEYS = ("command", "valid", "won", "lost", "changed", "repeated", "facts", "expert_plan", "solvable",
             "preferences_ok", "preferences", "reward_parts", "step", "truncated")


def _walks(a, b, plan, seeds=(0, 1)) -> int:
    """Play the plan, then seeded random walks, in both envs; assert equal at every step."""
    steps = 0
    for walk in (None, *seeds):
        oa, ob = a.reset(), b.reset()
        rng = random.Random(walk)
        for i in range(a.max_steps):
            assert oa == ob, (walk, i)
            assert a.admissible == b.admissible
            cmd = plan[i] if walk is None and i < len(plan) else rng.choice(a.admissible)
            act = command_to_action(cmd, a.world.room_exits())
            oa, ra, da, ia = a.step(act)
            ob, rb, db, ib = b.step(act)
            steps += 1
            assert (ra, da) == (rb, db), (walk, i, cmd)
            assert {k: ia[k] for k in INFO_KEYS} == {k: ib[k] for k in INFO_KEYS}, (walk, i, cmd)
            if da:
                break
    return steps


def test_logic_engine_equals_the_compiled_games_of_the_tiny_world(tiny_games):
    steps = 0
    for row in tiny_games.rows:
        spec = tiny_games.scenes[row["scene_id"]]
        path = tiny_games.game_path(row)
        kw = dict(scene_id=row["scene_id"], quest_id=row["quest_id"], objective=row["objective"], max_steps=15,
                  preferences=spec["preferences"])
        with HouseholdEnv(path, **kw) as a, LogicHouseholdEnv(path.with_suffix(".json"), **kw) as b:
            steps += _walks(a, b, list(row["expert_plan"]))
    assert steps > 4 * 3  # every game, three walks each


def test_a_generated_house_in_memory_plays_as_its_compiled_game(tmp_path):
    house = GeneratedHouses(HouseSizes(), seed=3, base=EnvConfig()).house(0)
    row = house.row(0)
    out = tmp_path / house.scene_id / "q00.z8"
    assert compile_quest_game({"spec": house.spec, "row": row, "out": str(out)})["error"] is None
    kw = dict(scene_id=house.scene_id, quest_id="q00", objective=row["objective"], max_steps=20,
              preferences=house.spec["preferences"])
    with HouseholdEnv(out, **kw) as a, LogicHouseholdEnv(house.game(0), **kw) as b:
        _walks(a, b, row["expert_plan"], seeds=(0,))


def test_houses_are_seeded_distinct_and_their_plans_win():
    houses = GeneratedHouses(HouseSizes(), seed=0, base=EnvConfig())
    first = houses.houses(300)
    assert [h.spec for h in houses.houses(5)] == [h.spec for h in first[:5]]  # a function of (seed, index)
    assert len({layout_key(h.spec) for h in first}) == 300
    assert len({h.quests[0]["objective"] for h in first}) > 250
    sizes = {len(h.spec["rooms"]) for h in first}, {len(h.spec["containers"]) for h in first}
    assert sizes == ({2, 3, 4, 5}, {2, 3, 4, 5, 6})
    for h in first[:20]:  # the verified shortest plan wins on the logic engine
        row = h.row(0)
        with LogicHouseholdEnv(h.game(0), scene_id=h.scene_id, quest_id="q00", objective=row["objective"],
                               preferences=h.spec["preferences"]) as env:
            env.reset()
            for cmd in row["expert_plan"]:
                _, _, _, info = env.step(command_to_action(cmd, env.world.room_exits()))
            assert info["won"] and info["preferences_ok"], row


def test_no_house_is_an_eval_layout_or_objective_of_the_default_games():
    env_cfg = EnvConfig()  # the default run's world
    scenes, rows = plan_games(env_cfg, seed=0, preferences_per_scene=1, games_dir="data/games")
    eval_layouts = {layout_key(scenes[r["scene_id"]]) for r in rows if r["split"] == "eval"}
    eval_objectives = {r["objective"] for r in rows if r["split"] == "eval"}
    houses = GeneratedHouses(HouseSizes(), seed=0, base=env_cfg, exclude=eval_layouts,
                             exclude_objectives=eval_objectives).houses(2000)
    assert not {layout_key(h.spec) for h in houses} & eval_layouts
    assert not {q["objective"] for h in houses for q in h.quests} & eval_objectives
    assert all(h.scene_id.startswith("gen_") for h in houses)


def test_an_excluded_layout_or_objective_is_skipped():
    houses = GeneratedHouses(HouseSizes(), seed=0, base=EnvConfig())
    h = houses.house(7)
    assert GeneratedHouses(HouseSizes(), seed=0, base=EnvConfig(), exclude=[layout_key(h.spec)]).house(7) is None
    other = GeneratedHouses(HouseSizes(), seed=0, base=EnvConfig(),
                            exclude_objectives=[h.quests[0]["objective"]]).house(7)
    assert other is None or other.quests[0]["objective"] != h.quests[0]["objective"]
    # A scene spec of the games stage, put through the same key, is found.
    scene = make_scene(EnvConfig(), 0, 0, 1)
    assert layout_key(json.loads(json.dumps(scene))) == layout_key(scene)
