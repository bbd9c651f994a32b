"""Typed facts between the world and its readers: the household's facts, its text, their reader.

The household states what an observation shows as facts; its description is rendered from
them and read back by the memory's reader of recorded turns; the memory reads any world's
facts without knowing its wording.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.facts import Fact, StepFacts, fact
from pipeline.core.schemas import canonical_json
from pipeline.envs import fact_reader
from pipeline.envs.household.env import HouseholdEnv
from pipeline.envs.household.reader import HouseholdFactReader, command_facts
from pipeline.envs.household.text import (describe, is_description, location_sentence, read_description,
                                          read_locations)
from pipeline.memory.scene import scene_facts

pytestmark = pytest.mark.filterwarnings("ignore:Game .* is not fully supported")


def _play(row, tiny_games, tiny_cfg, rng):
    """Every (observation, facts, step info, facts after) of the walkthrough with random detours."""
    env = HouseholdEnv(tiny_games.game_path(row), scene_id=row["scene_id"], quest_id=row["quest_id"],
                       max_steps=40, reward=tiny_cfg.env.reward)
    obs = env.reset()
    plan = list(row["expert_plan"])
    out = []
    done = False
    while not done:
        facts = env.facts()
        if plan and rng.random() < 0.6:
            command = plan.pop(0)
        else:
            command = sorted(env.admissible)[int(rng.integers(len(env.admissible)))]
        action = next((dict(a) for a in obs["admissible_actions"] if a["command"] == command),
                      {"action": "look", "target": None})
        action.pop("command", None)
        new_obs, _, done, info = env.step(action)
        out.append((obs, facts, info, env.facts()))
        obs = new_obs
    env.close()
    return out


def test_the_description_is_the_facts_rendered_and_reads_back(tiny_games, tiny_cfg):
    """On every state of the tiny games: description == describe(facts); reading it (and the
    recorded turn) gives the same facts; a room described after a step gives the new facts."""
    rng = np.random.default_rng(0)
    reader = fact_reader(tiny_cfg)
    steps = [s for row in tiny_games.rows for s in _play(row, tiny_games, tiny_cfg, rng)]
    assert len(steps) > 30
    kinds = set()
    for obs, facts, info, after in steps:
        kinds |= {f.pred for f in facts}
        assert obs["description"] == describe(facts)
        assert read_description(obs["description"]) == facts
        step = reader.read_turn({"observation": canonical_json(obs), "command": info["command"],
                                 "env_feedback": info["env_feedback"]})
        assert step.seen == facts
        assert step.did == command_facts(info["command"])
        if is_description(info["env_feedback"]):
            assert step.after == after
    # the states the games reach: open, closed and locked containers, contents, exits, a held thing
    assert {"here", "at", "open", "closed", "locked", "in", "exit", "carried"} <= kinds


def test_a_recorded_turn_without_its_fields_reads_as_no_facts():
    reader = HouseholdFactReader()
    assert reader.read_turn({}) == StepFacts()
    assert reader.read_turn({"observation": "not json", "command": "eat Apple_1", "env_feedback": None}) == StepFacts()
    # no description: the room of agent_location alone
    assert reader.read_turn({"observation": '{"agent_location": "Kitchen"}'}).seen == (fact("here", "Kitchen"),)
    assert read_description("You are in the Kitchen. You see nothing here. No exits. You are carrying nothing.") == (
        fact("here", "Kitchen"),)


def test_commands_state_what_they_do():
    assert command_facts("take Key_1 from Drawer_0") == (fact("took", "Key_1", "Drawer_0"),)
    assert command_facts("take Apple_2") == (fact("took", "Apple_2"),)
    assert command_facts("unlock Chest_2 with Key_1") == (fact("unlocked", "Chest_2", "Key_1"),)
    assert command_facts("go south") == (fact("went", "south"),)
    for other in ("open Fridge_0", "insert Apple_2 into Fridge_0", "look", "", None, "eat Apple_2", "go up"):
        assert command_facts(other) == ()


def test_what_the_user_says_of_a_place_is_what_the_expert_reads():
    said = [location_sentence("Key_1", ("on", "Table_0"), "Kitchen"), location_sentence("Apple_2", ("at", "Bedroom"), None)]
    assert said == ["Key_1 is on Table_0 in the Kitchen.", "Apple_2 is in the Bedroom."]
    assert [tuple(loc) for loc in read_locations(" ".join(said))] == [
        ("Key_1", "on", "Table_0", "Kitchen"), ("Apple_2", None, None, "Bedroom")]


class LabReader:
    """A world that is no household: its own predicates, no prose at all."""

    def read_turn(self, turn):
        here = fact("here", "Lab")
        seen = (here, fact("at", "Bench_0", "Lab"), fact("on", "Beaker_1", "Bench_0"),
                fact("temperature", "Beaker_1", turn["temperature"]), fact("exit", "Lab", "north", "Store"))
        did = (fact("took", "Flask_2", "Shelf_3"),) if turn["command"] == "pick" else ()
        return StepFacts(seen=seen, did=did)


def test_the_memory_reads_any_world_s_facts_and_keeps_its_own_kinds():
    reader = LabReader()
    turns = [{"turn_index": 0, "temperature": "cold", "command": "pick", "action_valid": True, "changed": True},
             {"turn_index": 1, "temperature": "hot", "command": "wait", "action_valid": True, "changed": False}]
    assert scene_facts([(t, reader.read_turn(t)) for t in turns]) == [
        "Flask_2 was in Shelf_3 in the Lab", "Lab -> north -> Store", "Beaker_1 was on Bench_0 in the Lab",
        "temperature(Beaker_1, cold)", "temperature(Beaker_1, hot)"]
    # a step that was not carried out shows nothing of what its command would do
    turns[0]["action_valid"] = False
    assert "Flask_2 was in Shelf_3 in the Lab" not in scene_facts([(t, reader.read_turn(t)) for t in turns])
    assert str(Fact("temperature", ("Beaker_1", "hot"))) == "temperature(Beaker_1, hot)"
