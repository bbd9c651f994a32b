"""The drills of generated houses beside the demonstrations, eight to a training unit, the same on any
number of the demos' workers, appended to the demonstrations by the ``demos`` step:

- statement drills (``pipeline.policy.statements``, ``policy.statement_drills``): first turns under a
  prompt that says where things are and gives no plan, the knowledge-limited expert's answer only
  where the statement changes it;
- drills of later turns (``pipeline.policy.later_turns``, ``policy.later_drills``): one turn of a
  generated house's teacher episode from its first pick-up on, rendered with the history before it,
  learned alone.

One module, so the fixtures (the tiny games' memory, the drills) are built once.

Real code on the session's tiny games (the fixtures of tests/test_dagger.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.test_dagger import cfg, memory  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def ten(cfg, tiny_games, memory):  # noqa: F811
    """Ten drills played in this process (its store has then answered queries here). Each drill plays
    its house's past visit, and most houses are tried and dropped (the filter below): ~1 s a drill."""
    from pipeline.policy.statements import statement_drills

    return statement_drills(cfg, tiny_games.rows, tiny_games.scenes, memory, 10)


def test_statement_drills_state_where_things_are_and_give_no_plan(cfg, tiny_games, memory, ten):  # noqa: F811
    from pipeline.policy.demos import DemoKind, demo_kind, training_unit
    from pipeline.policy.expert import VERIFIED_PLAN
    from pipeline.policy.statements import statement_drills

    drills = ten  # seeded: the same drills again in other processes and in the demonstrations (the next test)
    assert len(drills) == 10 and all(d.turn_index == 0 and d.train for d in drills)
    assert all(demo_kind(d.demo_id) == DemoKind.house_drill for d in drills)  # trained as drills are
    assert [training_unit(d.demo_id) for d in drills].count(training_unit(drills[0].demo_id)) == 8
    for d in drills:
        system = d.messages[0]["content"]
        assert VERIFIED_PLAN not in system  # a statement of where things are, never the plan
        assert '"action"' in d.response
    assert {d.variant for d in drills} & {"grounded", "plain+C2"}  # the visit's grounding, or its block alone
    assert statement_drills(cfg, tiny_games.rows, tiny_games.scenes, memory, 0) == []


def test_a_drill_is_kept_only_where_the_statement_changes_the_experts_first_step(cfg, tiny_games, memory):  # noqa: F811
    """Each kept drill's answer differs from the answer of the same expert told nothing in the same
    house: a drill that repeated what a blank prompt gives would teach nothing of the statement."""
    from pipeline.agents.llm import render_response
    from pipeline.envs import scene_preferences
    from pipeline.policy.demos import house_env, house_stream
    from pipeline.policy.expert import BeliefExpert, read_knowledge
    from pipeline.policy.statements import STREAM, statement_drill
    from pipeline.core.seeding import derive_seed
    from pipeline.prompts import PromptOrganizer

    houses = house_stream(cfg, tiny_games.rows, tiny_games.scenes, derive_seed(cfg.seed, STREAM), 2)
    organizer = PromptOrganizer.from_config(cfg)
    kept = skipped = 0
    for k in range(40):
        house = houses.house(k)
        turn = statement_drill(cfg, tiny_games.scenes, memory, organizer, house)
        if house is None or turn is None:
            skipped += 1
            continue
        kept += 1
        env = house_env(cfg, house)
        try:
            obs = env.reset()
            prefs = scene_preferences(house.spec, list(house.row(0).get("preferences") or []))
            blank = BeliefExpert(env, read_knowledge("", env.world, prefs), explore_cap=int(cfg.policy.explore_cap))
            assert turn.response != render_response(*blank.response(blank.decide(), obs))
        finally:
            env.close()
    assert kept and skipped  # the filter keeps some houses and drops others


def test_the_same_drills_on_one_and_three_workers_and_in_the_demonstrations(cfg, tiny_games, memory,  # noqa: F811
                                                                           ten, eight):
    """Both kinds of drill (statement drills, later-turn drills: ``eight``, below) are the same in a 3-worker
    pool as in this process, and the demonstrations append them in that order."""
    from pipeline.policy.demo_workers import demo_pool
    from pipeline.policy.demoset import build_demo_set
    from pipeline.policy.later_turns import later_drills
    from pipeline.policy.statements import statement_drills

    rows, scenes = tiny_games.rows, tiny_games.scenes
    # the store has answered queries in this process (``ten``): its index is sent to the workers all the same
    with demo_pool(cfg, tiny_games.root, rows, scenes, workers=3) as pool:
        assert statement_drills(cfg, rows, scenes, memory, 10, workers=pool) == ten
        assert later_drills(cfg, rows, scenes, memory, 8, workers=pool) == eight
    ticks: list[int] = []
    late: list[int] = []
    with_drills = OmegaConf.merge(cfg, {"workers": 1, "policy": {"statement_drills": 10, "later_drills": 8,
                                                                "generated_houses": 2, "generated_drills": 8}})
    demo_set = build_demo_set(with_drills, tiny_games.root, rows, scenes, drill_progress=ticks.append,
                              later_progress=late.append)
    assert demo_set.turns[-18:] == ten + eight  # the demonstrations' drills: the same streams, whatever else they hold
    demos = demo_set.summary["demos"]
    assert demos["statement_drills"] == 10 and sum(ticks) == 10
    assert demos["later_drills"] == 8 and sum(late) == 8


@pytest.mark.parametrize("module", ["statements", "later_turns"])
def test_no_drill_is_played_in_an_eval_layout_or_on_an_eval_objective(cfg, tiny_games, module):  # noqa: F811
    """The drills' houses (statement drills, later-turn drills) are a stream of their own that skips
    an eval scene's layout and an eval quest's objective: made an eval scene and an eval objective,
    what the stream drew before is never drawn (the model under test never sees what the eval is
    made of)."""
    import importlib

    from pipeline.core.seeding import derive_seed
    from pipeline.envs.household.generate import layout_key
    from pipeline.policy.demos import house_stream

    rows, scenes = tiny_games.rows, tiny_games.scenes
    seed = derive_seed(cfg.seed, importlib.import_module(f"pipeline.policy.{module}").STREAM)
    before = house_stream(cfg, rows, scenes, seed, 2)
    drawn = {k: h for k, h in ((k, before.house(k)) for k in range(40)) if h is not None}
    (k0, first), second = next(iter(drawn.items())), list(drawn.values())[1]
    objective = second.quests[0]["objective"]
    evals = [*rows, {**rows[0], "split": "eval", "scene_id": "eval_twin", "objective": objective}]
    after = house_stream(cfg, evals, {**scenes, "eval_twin": first.spec}, seed, 2)
    assert after.house(k0) is None  # the layout of an eval scene: skipped
    again = [h for h in (after.house(k) for k in range(40)) if h is not None]
    assert again and all(layout_key(h.spec) != layout_key(first.spec) for h in again)
    assert all(q["objective"] != objective for h in again for q in h.quests)


@pytest.fixture(scope="module")
def eight(cfg, tiny_games, memory):  # noqa: F811
    """Eight drills played in this process: one training unit."""
    from pipeline.policy.later_turns import later_drills

    return later_drills(cfg, tiny_games.rows, tiny_games.scenes, memory, 8)


def test_endgame_turns_start_at_the_first_pick_up_and_skip_turn_zero_and_slips():
    from pipeline.policy.expert import DemoEpisode, DemoTurn
    from pipeline.policy.later_turns import endgame_turns

    def ep(*actions: str, slips: tuple[int, ...] = ()) -> DemoEpisode:
        turns = [DemoTurn({}, f'x.\n{{"action": "{a}", "target": "T"}}', i not in slips) for i, a in enumerate(actions)]
        return DemoEpisode(turns, True, True, 0)

    assert endgame_turns(ep("open", "go_to", "pick_up", "go_to", "put")) == [2, 3, 4]
    assert endgame_turns(ep("open", "pick_up", "go_to", "look", "put", slips=(3,))) == [1, 2, 4]
    assert endgame_turns(ep("pick_up", "go_to", "put")) == [1, 2]  # turn 0: the plan drills' turn
    assert endgame_turns(ep("open", "go_to", "open")) == []  # nothing picked up: no drill


def test_later_drills_are_later_turns_with_their_history_learned_alone(cfg, tiny_games, memory, eight):  # noqa: F811
    from pipeline.policy.demos import DemoKind, demo_kind, training_unit
    from pipeline.policy.later_turns import action_of, later_drills

    drills = eight
    assert len(drills) == 8 and all(d.train and d.turn_index >= 1 for d in drills)
    assert all(demo_kind(d.demo_id) == DemoKind.house_drill for d in drills)  # trained as drills are
    assert {training_unit(d.demo_id) for d in drills} == {training_unit(drills[0].demo_id)}
    assert len({d.demo_id for d in drills}) == 8 and drills[0].demo_id.startswith("drill_gen_late")
    assert all(action_of(d.response) for d in drills)  # an answer with a command
    # the history is rendered: a later turn's prompt holds the memory the teacher's answers wrote
    assert all("- Notes: visited: " in d.messages[0]["content"] for d in drills)
    assert len({d.variant for d in drills}) > 1  # a prompt variant drawn per house
    assert later_drills(cfg, tiny_games.rows, tiny_games.scenes, memory, 0) == []
