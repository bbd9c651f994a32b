"""Drills of later turns (``pipeline.policy.later_turns``, ``policy.later_drills``): one turn of a
generated house's teacher episode from its first pick-up on, rendered with the history before it,
learned alone, eight to a training unit. The same drills on any number of the demos' workers, and
appended to the demonstrations after the statement drills: tests/test_statement_drills.py, which
checks both kinds of drill in one pool and one demonstration set.

Real code on the session's tiny games (the fixtures of tests/test_dagger.py)."""

from __future__ import annotations

import pytest

from tests.test_dagger import cfg, memory  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def eight(cfg, tiny_games, memory):  # noqa: F811
    """Eight drills played in this process: one training unit."""
    from pipeline.policy.later_turns import later_drills

    return later_drills(cfg, tiny_games.rows, tiny_games.scenes, memory, 8)


def _action(response: str) -> str | None:
    from pipeline.prompts.observation import extract_json_object

    return (extract_json_object(response) or {}).get("action")


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
    from pipeline.policy.later_turns import later_drills

    drills = eight
    assert len(drills) == 8 and all(d.train and d.turn_index >= 1 for d in drills)
    assert all(demo_kind(d.demo_id) == DemoKind.house_drill for d in drills)  # trained as drills are
    assert {training_unit(d.demo_id) for d in drills} == {training_unit(drills[0].demo_id)}
    assert len({d.demo_id for d in drills}) == 8 and drills[0].demo_id.startswith("drill_gen_late")
    assert all(_action(d.response) for d in drills)  # an answer with a command
    # the history is rendered: a later turn's prompt holds the memory the teacher's answers wrote
    assert all("- Notes: visited: " in d.messages[0]["content"] for d in drills)
    assert len({d.variant for d in drills}) > 1  # a prompt variant drawn per house
    assert later_drills(cfg, tiny_games.rows, tiny_games.scenes, memory, 0) == []
