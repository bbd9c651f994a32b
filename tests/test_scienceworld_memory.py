"""ScienceWorld's memory of earlier trials (issue 42): which commands raised the score, its scene
facts read back with the engine's multi-word names, the adaptation's scenes (one variation each),
and the reader acting on what the memory states.

The tests that play need the ``scienceworld`` package and Java and are skipped, with the reason,
where either is missing (``make scienceworld``); the others run anywhere.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.agents.reader import ReaderAgent, read_prompt
from pipeline.core.conf_schema import AgentConfig, SwSetup
from pipeline.core.config import section
from pipeline.core.facts import Fact, fact
from pipeline.envs.scienceworld.build import scene_id
from pipeline.envs.scienceworld.engine import missing
from pipeline.envs.scienceworld.reader import ScienceWorldFactReader, command_facts
from pipeline.envs.scienceworld.text import describe
from pipeline.memory.scene import read_scene_facts, scene_facts

needs_jvm = pytest.mark.skipif(missing() is not None, reason=f"ScienceWorld cannot run here: {missing()}")

ROOT = Path(__file__).resolve().parents[1]
READER = ScienceWorldFactReader()


def observation(room: str, *facts: Fact, commands: tuple[str, ...] = ()) -> dict:
    """An observation as the env shows it: the description written from the facts, the admissible commands."""
    from pipeline.envs.scienceworld.commands import command_to_action

    return {"agent_location": room, "description": describe((fact("here", room),) + facts),
            "admissible_commands": list(commands),
            "admissible_actions": [dict(command_to_action(c), command=c) for c in commands]}


def turn(i: int, obs: dict, command: str | None, reward: float = 0.0) -> dict:
    return {"turn_index": i, "observation": json.dumps(obs), "command": command, "action_valid": command is not None,
            "changed": True, "reward": reward, "env_feedback": ""}


KITCHEN = observation("kitchen", fact("at", "cupboard", "kitchen"), fact("open", "cupboard"),
                      fact("in", "metal pot", "cupboard"), fact("at", "red box", "kitchen"),
                      fact("exit", "kitchen", "art studio", "art studio"), fact("open", "door to art studio"))
STUDIO = observation("art studio", fact("at", "banana tree", "art studio"), fact("at", "large cupboard", "art studio"),
                     fact("closed", "large cupboard"), fact("exit", "art studio", "kitchen", "kitchen"))
# A trial: it took the pot (no score), walked to the art studio (the score rose: the right room), focused
# on the banana tree (the score rose) and looked around (it did not).
TRIAL = [turn(0, KITCHEN, "pick up metal pot"), turn(1, KITCHEN, "go to art studio", 0.09),
         turn(2, STUDIO, "focus on banana tree", 0.5), turn(3, STUDIO, "look around")]


def test_what_a_turn_s_score_change_says_never_names_a_right_focus():
    # a door or room that raised the score: advanced; a focus that raised it: the room it was in, not the thing
    assert READER.read_turn(TRIAL[2]).did == (fact("found", "art studio"),)
    assert READER.read_turn(TRIAL[1]).did == (fact("went", "art studio"), fact("advanced", "go to art studio"))
    assert READER.read_turn(TRIAL[0]).did == (fact("took", "metal pot"),)  # no score: nothing advanced
    assert READER.read_turn(TRIAL[3]).did == ()
    assert command_facts("focus on chair", -1.0) == (fact("ended", "focus on chair"),)  # a wrong focus ends the task
    assert command_facts("focus on chair", 0.5) == ()  # raised, but no room to say it of
    assert command_facts("focus on chair", 0.0, (), "kitchen") == (fact("missed", "focus on chair"),)  # not counted
    # the steps after a right focus handle the thing it found: their score is never stated with their command
    assert command_facts("pick up banana tree", 0.08) == (fact("took", "banana tree"),)
    assert command_facts("move banana tree to red box", 0.17) == ()
    assert command_facts("activate stove", 0.2) == (fact("advanced", "activate stove"),)
    assert command_facts("focus on chair", None) == () and command_facts(None, 0.5) == ()
    # a door of the room goes to its room, whatever the engine calls the door; a door it cannot tell says nothing
    assert command_facts("go to door to kitchen", 0.0, ["kitchen", "hallway"]) == (fact("went", "kitchen"),)
    assert command_facts("go to art studio door", 0.0, ["art studio"]) == (fact("went", "art studio"),)
    assert command_facts("go to door", 0.0, ["art studio"]) == (fact("went", "art studio"),)
    assert command_facts("go to door", 0.0, ["art studio", "kitchen"]) == ()


def test_the_user_s_line_for_a_lost_task_reads_as_what_ended_it():
    line = "feedback : procedural: 'focus on baby brown bear' ended the task: focus only on what the task names."
    assert READER.read_text(line) == (fact("ended", "focus on baby brown bear"),)
    assert READER.read_text("feedback : procedural: 'open door' is not something you can do here") == ()
    # where the user says a door is, or a past visit saw one, is a way from that room: the reader reads it
    # from any line (a door's name says where it leads), the world's reader states only the place
    hint = "feedback : spatial: The door to hallway is in the kitchen."
    assert READER.read_text(hint) == (fact("in", "door to hallway", "kitchen"),)
    for line in (hint, "This house, from 2 past visits: door to hallway in the kitchen was never opened."):
        assert fact("exit", "kitchen", "hallway", "hallway") in {b.fact for b in read_prompt(line, READER).stated}
    assert not [b for b in read_prompt("Facts: picture in the kitchen was never opened.", READER).stated
                if b.fact.pred == "exit"]


def test_the_find_tasks_objectives_are_focus_tasks_and_no_other_is():
    from pipeline.core.facts import FocusTask

    assert READER.focus_task("Your task is to find a(n) living thing. First, focus on the thing. Then, move it to "
                             "the purple box in the living room.") == FocusTask("living thing", None, "purple box",
                                                                                 "living room")
    assert READER.focus_task("Your task is to find the animal with the longest life span.  The animals are in the "
                             "'outside' location.  Focus on the animal with the longest life span.") == \
        FocusTask("animal with the longest life span", "outside", None, None)
    assert READER.focus_task("Your task is to boil water. For compounds without a boiling point, combusting the "
                             "substance is also acceptable.") is None
    assert READER.focus_task("Put Apple_2 in Fridge_0.") is None and READER.focus_task(None) is None


def test_scienceworld_scene_facts_are_read_back_with_their_multi_word_names():
    facts = scene_facts([(t, READER.read_turn(t)) for t in TRIAL])
    assert facts == [  # what the steps' outcomes said first: the few facts a bounded summary must keep
        "advanced(go to art studio)", "found(art studio)",
        "metal pot was in cupboard in the kitchen",
        "art studio -> kitchen -> kitchen", "kitchen -> art studio -> art studio",
        "large cupboard in the art studio was never opened",
    ]
    assert read_scene_facts("Facts of that case's scene: " + "; ".join(facts) + ".") == (
        fact("advanced", "go to art studio"), fact("found", "art studio"),
        fact("in", "metal pot", "cupboard"), fact("at", "cupboard", "kitchen"),
        fact("exit", "art studio", "kitchen", "kitchen"), fact("exit", "kitchen", "art studio", "art studio"),
        fact("closed", "large cupboard"), fact("at", "large cupboard", "art studio"))
    for f in facts:  # every sentence written is read back
        assert read_scene_facts(f), f
    # names of several words, rooms of two
    assert read_scene_facts("; baby baby brown bear was on the floor of the living room; "
                            "cup containing nothing in table was in cupboard in the art studio.") == (
        fact("at", "baby baby brown bear", "living room"), fact("in", "cup containing nothing in table", "cupboard"),
        fact("at", "cupboard", "art studio"))


# The single-word patterns scene.py read with before names of several words: household text
# must read exactly as they read it (the household's memory and reader are unchanged).
_N = r"([A-Za-z][A-Za-z0-9_]*)"
SINGLE_WORD = [re.compile(rf"\b{_N} was on the floor of the {_N}\b"),
               re.compile(rf"\b{_N} was (in|on) (?!the\b){_N}(?: in the {_N})?(?=[;.]|$)"),
               re.compile(rf"\b{_N}(?: in the {_N})? is locked(?: \({_N} unlocks it\))?"),
               re.compile(rf"\b{_N} -> {_N} -> {_N}\b"),
               re.compile(rf"\b{_N}(?: in the {_N})? was empty\b"),
               re.compile(rf"\b{_N}(?: in the {_N})? was never opened\b")]


def test_household_text_reads_as_the_single_word_patterns_read_it():
    from pipeline.memory import scene

    rng = random.Random(42)
    things, rooms = ["Key_1", "Drawer_0", "Apple_2", "Fridge_0", "Mug_1", "Table_0", "Chest_2"], ["Kitchen", "Bedroom"]
    leads = ["", "Facts of that case's scene (scene_01): ", "This house, from 2 past visits: ",
             "Warning: Do not repeat that pattern. Observed in that case's scene: ",
             "A similar past case failed (goal not reached in 9 turns); the fridge was empty and the way was long. "]
    forms = ["{a} was in {b} in the {r}", "{a} was on {b}", "{a} was on the floor of the {r}",
             "{b} in the {r} is locked ({a} unlocks it)", "{r} -> south -> {s}", "{b} in the {r} was empty",
             "{b} in the {r} was never opened", "temperature({a}, hot)", "the way {a} was in the list of {b} in the {r}"]
    for _ in range(300):
        sentences = [rng.choice(forms).format(a=rng.choice(things), b=rng.choice(things), r=rng.choice(rooms),
                                              s=rng.choice(rooms)) for _ in range(rng.randint(1, 5))]
        text = rng.choice(leads) + "; ".join(sentences) + rng.choice([".", "", "…"])
        spans = sorted(m.span() for rx in SINGLE_WORD + [scene._OTHER_RE] for m in rx.finditer(text))
        new = sorted(m.span() for rx in (scene._FLOOR_RE, scene._PLACE_RE, scene._LOCKED_RE, scene._ROUTE_RE,
                                         scene._EMPTY_RE, scene._UNOPENED_RE, scene._OTHER_RE) for m in rx.finditer(text))
        assert new == spans, text


def test_an_adaptation_scene_is_one_variation_a_generalisation_scene_a_task():
    assert scene_id("find-plant", SwSetup.adaptation, 7) == "find-plant-v0007"
    assert scene_id("find-plant", SwSetup.generalisation, 7) == "find-plant"


def test_the_reader_tries_a_command_that_raised_the_score_once_when_it_is_admissible():
    agent = ReaderAgent(section(AgentConfig, {"name": "reader"}), facts=READER)
    agent.reset({"episode_id": "ep", "objective": "Your task is to grow a plant.",  # no focus task: see below
                 "system_prompt": "Facts of that case's scene: advanced(go to art studio); advanced(focus on banana tree)."})
    kitchen = observation("kitchen", fact("exit", "kitchen", "art studio", "art studio"),
                          commands=("go to art studio", "look around"))
    studio = observation("art studio", fact("at", "banana tree", "art studio"),
                         commands=("focus on banana tree", "go to kitchen", "look around"))
    assert agent.act(kitchen).action == {"action": "go_to", "target": "art studio"}
    assert agent.act(studio).action == {"action": "focus_on", "target": "banana tree"}
    assert agent.act(studio).action != {"action": "focus_on", "target": "banana tree"}  # once
    # where it is not admissible yet (another room), the stated command waits
    agent.reset({"episode_id": "ep", "objective": "Find a plant.",
                 "system_prompt": "Facts: advanced(focus on banana tree)."})
    assert agent.act(kitchen).action != {"action": "focus_on", "target": "banana tree"}
    assert agent.act(studio).action == {"action": "focus_on", "target": "banana tree"}
    # a spelling the engine takes but does not list (its gold's): tried once a thing it names is in sight
    agent.reset({"episode_id": "ep", "objective": "Find a plant.",
                 "system_prompt": "Facts: advanced(move banana tree in inventory to red box)."})
    move = {"action": "move", "target": "banana tree in inventory", "receptacle": "red box"}
    assert agent.act(studio).action != move
    assert agent.act({**kitchen, "visible_entities": ["red box"], "agent_inventory": ["banana tree"]}).action == move


# A find task's world in two rooms: the hallway (a picture, a door to the outside) and the outside.
FIND = "Your task is to find a(n) living thing. First, focus on the thing. Then, move it to the red box in the hallway."
LIFESPAN = ("Your task is to find the animal with the longest life span.  The animals are in the 'outside' location.  "
            "Focus on the animal with the longest life span.")


def hallway(door: str = "closed", carried: tuple[str, ...] = (), name: str = "door to outside") -> dict:
    """``name``: the door's name (ScienceWorld also says "outside door")."""
    commands = (f"open {name}", "focus on picture", "pick up picture", "look around") if door == "closed" else \
        ("go to outside", "focus on picture", "look around") + tuple(f"move {c} to red box" for c in carried)
    obs = observation("hallway", fact("at", "picture", "hallway"), fact("at", "red box", "hallway"),
                      fact("at", name, "hallway"), fact("exit", "hallway", "outside", "outside"),
                      fact(door, name), *[fact("carried", c) for c in carried], commands=commands)
    return {**obs, "visible_entities": ["picture", "red box", name], "agent_inventory": list(carried)}


def outside() -> dict:
    things = ("axe", "blue jay", "fountain", "mouse", "water")
    obs = observation("outside", *[fact("at", t, "outside") for t in things], fact("matter", "water", "liquid"),
                      fact("at", "door to hallway", "outside"), fact("exit", "outside", "hallway", "hallway"),
                      fact("open", "door to hallway"),
                      commands=tuple(f"focus on {t}" for t in things) + tuple(f"pick up {t}" for t in things)
                      + ("go to hallway", "look around"))
    return {**obs, "visible_entities": list(things) + ["door to hallway"]}


def focus_target(agent, obs: dict, prompt: str, objective: str = FIND, episode: str = "ep") -> str | None:
    agent.reset({"episode_id": episode, "objective": objective, "system_prompt": prompt})
    step = agent.act(obs)
    return step.action["target"] if step.action["action"] == "focus_on" else None


def test_the_reader_tests_the_first_candidate_where_it_is_told_and_skips_what_ended_a_trial():
    agent = ReaderAgent(section(AgentConfig, {"name": "reader"}), facts=READER)
    # told nothing: it tests here, the first thing in sight that is no door, box or fixture
    assert focus_target(agent, hallway(), "") == "picture"
    # the objective names the room: there first (its door opened, then through it), and no liquid is a candidate
    agent.reset({"episode_id": "ep", "objective": LIFESPAN, "system_prompt": ""})
    assert agent.act(hallway()).action == {"action": "open", "target": "door to outside"}
    assert agent.act(hallway("open")).action == {"action": "go_to", "target": "outside"}
    assert agent.act(outside()).action == {"action": "focus_on", "target": "axe"}
    # what past trials ended (the memory's fact, the user's line) or missed is no candidate
    told = ("Facts: ended(focus on axe); missed(focus on blue jay).\n"
            "feedback : procedural: 'focus on fountain' ended the task: focus only on what the task names.")
    assert focus_target(agent, outside(), told, LIFESPAN) == "mouse"
    # a line found wrong keeps its outcomes: what ended a trial did
    agent.reset({"episode_id": "ep", "objective": LIFESPAN,
                 "system_prompt": "Facts: banana tree was on the floor of the outside; ended(focus on axe)."})
    assert agent.act(outside()).action == {"action": "focus_on", "target": "blue jay"}
    assert agent.beliefs.dropped == {0: "banana tree is not in the outside"}
    # a name of many things (ScienceWorld's "table") seen in one room says nothing of one in another; seen
    # in the room the line places it, it does
    with_table = {**outside(), "description": outside()["description"] + " " + describe((fact("at", "table", "outside"),))}
    for room, dropped in (("workshop", {}), ("outside", {0: "table does not hold lamp"})):
        agent.reset({"episode_id": "ep", "objective": LIFESPAN, "system_prompt": f"Facts: lamp was in table in the {room}."})
        agent.act(with_table)
        assert agent.beliefs.dropped == dropped
    # a door is named by where it leads, so one seen here may be in another room too: the line placing it there
    # (and the way it gives) stays; seeing the room it names without it drops it
    agent.reset({"episode_id": "ep", "objective": FIND, "system_prompt": "The door to outside is in the kitchen."})
    agent.act(hallway())
    assert agent.beliefs.dropped == {} and agent.room_path("hallway", "kitchen") == "outside"
    agent.reset({"episode_id": "ep", "objective": FIND, "system_prompt": "The door to outside is in the hallway. "
                                                                          "The door to hallway is in the art studio."})
    agent.act(outside())
    assert agent.beliefs.dropped == {}
    agent.reset({"episode_id": "ep", "objective": FIND, "system_prompt": "The door to outside is in the kitchen."})
    agent.act({**KITCHEN, "visible_entities": ["cupboard", "red box", "door to art studio"]})
    assert agent.beliefs.dropped == {0: "going outside from the kitchen does not lead to the outside"}
    # a room where a past focus raised the score: it goes there instead of testing here
    agent.reset({"episode_id": "ep", "objective": FIND, "system_prompt": "Facts: found(outside); ended(focus on axe)."})
    assert agent.act(hallway()).action == {"action": "open", "target": "door to outside"}
    assert agent.act(outside()).action == {"action": "focus_on", "target": "blue jay"}
    # the focus did not end the task: take the thing to the box the objective names
    assert agent.act(outside()).action == {"action": "pick_up", "target": "blue jay"}
    assert agent.act({**outside(), "agent_inventory": ["blue jay"]}).action == {"action": "go_to", "target": "hallway"}
    assert agent.act(hallway("open", ("blue jay",))).action == {"action": "move", "target": "blue jay",
                                                                 "receptacle": "red box"}
    # a door of the other spelling: opened on the way (the world's door_to)
    agent.reset({"episode_id": "ep", "objective": LIFESPAN, "system_prompt": ""})
    assert agent.act(hallway(name="outside door")).action == {"action": "open", "target": "outside door"}
    assert READER.door_to("outside door") == READER.door_to("door to outside") == "outside"
    assert READER.door_to("picture") is None and READER.door_to("door") is None
    # a task that is no focus task is played as before
    agent.reset({"episode_id": "ep", "objective": "Your task is to boil water.", "system_prompt": "Facts: found(outside)."})
    assert agent.act(hallway()).action["action"] != "focus_on"


def test_a_trial_tests_the_reader_s_next_candidate_and_draws_where_when_nothing_says():
    from pipeline.agents.trial import MAX_HOPS, TrialAgent

    agent = TrialAgent(section(AgentConfig, {"name": "trial"}), seed=3, facts=READER)
    reader = ReaderAgent(section(AgentConfig, {"name": "reader"}), facts=READER)
    # where the objective says: the reader's candidate, past what earlier trials were told had failed
    for told, first in (("", "axe"), ("Facts: ended(focus on axe).", "blue jay"),
                        ("Facts: ended(focus on axe); missed(focus on blue jay).", "fountain")):
        picks = {focus_target(agent, outside(), told, LIFESPAN, episode=f"t{i}") for i in range(20)}
        assert picks == {first} == {focus_target(reader, outside(), told, LIFESPAN)}
    # told nothing of where: some trials test here, others walk through up to MAX_HOPS rooms first, by episode
    walks = [focus_target(agent, hallway(), "", FIND, episode=f"t{i}") for i in range(40)]
    assert set(walks) == {"picture", None} and MAX_HOPS >= 1
    assert walks == [focus_target(agent, hallway(), "", FIND, episode=f"t{i}") for i in range(40)]
    again = TrialAgent(section(AgentConfig, {"name": "trial"}), seed=4, facts=READER)
    assert walks != [focus_target(again, hallway(), "", FIND, episode=f"t{i}") for i in range(40)]


@pytest.fixture(scope="module")
def adaptation(tmp_path_factory):
    """The tiny ScienceWorld as the adaptation plays it: one eval variation and its two earlier trials."""
    from pipeline.core.config import compose_text, validate
    from pipeline.envs import build_games

    cfg = validate(OmegaConf.create(compose_text(ROOT, [
        "env=scienceworld_tiny", "agent=react", "model=none", "env.scienceworld.setup=adaptation",
        "env.scienceworld.trials=2", "env.scienceworld.train_variations=0"])))
    return cfg, build_games(cfg, tmp_path_factory.mktemp("sw_adaptation"), progress=False)


@needs_jvm
def test_an_eval_variation_and_its_earlier_trials_are_one_scene_and_its_eval_quest_is_never_stored(adaptation):
    _, games = adaptation
    (sid,) = games.scenes
    (ev,) = [r for r in games.rows if r["split"] == "eval"]
    trials = [r for r in games.rows if r["split"] == "train"]
    assert sid == f"find-non-living-thing-{ev['quest_id']}" and games.scenes[sid]["task"] == "find-non-living-thing"
    assert [r["quest_id"] for r in trials] == [f"{ev['quest_id']}_t1", f"{ev['quest_id']}_t2"]
    assert {r["scene_id"] for r in games.rows} == {sid}  # the trials' memory is the eval task's own scene
    assert ev["quest_id"] not in {r["quest_id"] for r in trials}  # memory.exclude_same_quest: nothing of it stored
    assert games.metrics["quest_types"] == {"find-non-living-thing": 3}


class _Replay:
    """An agent that plays a fixed list of commands (a past trial that found the task's solution)."""

    def __init__(self, commands: list[str]):
        self.commands = commands

    def reset(self, meta=None) -> None:
        self.i = 0

    def act(self, obs):
        from pipeline.agents.base import AgentStep
        from pipeline.envs.scienceworld.commands import command_to_action

        command = self.commands[min(self.i, len(self.commands) - 1)]
        self.i += 1
        return AgentStep(action=command_to_action(command), reasoning="replay")


@needs_jvm
def test_a_trial_that_won_is_remembered_by_what_it_learned_on_the_way(adaptation):
    """A trial that played the gold plan (it found the task's answer): its entry states the doors and
    rooms that raised the score and the room its focus raised it in, never the focus or the steps that
    handled the thing it found (seed 001: no memory names the task's answer). So the advisory of its
    variation passes the label-hint gate, and the reader goes where it points and wins there."""
    from pipeline.agents import make_agent
    from pipeline.core.conf_schema import ConditionConfig, MemoryConfig
    from pipeline.conditions import memory_slot
    from pipeline.memory import AdvisoryBuilder, EpisodicStore, build_entry, find_label_hints
    from pipeline.memory.advisory import Recall
    from pipeline.memory.injection import objective_words
    from pipeline.memory.knowledge import StoreKnowledge
    from pipeline.session.collection import make_factories
    from pipeline.session.rollout import play, tasks_from_manifest

    cfg, games = adaptation
    env_for, _, user_for = make_factories(cfg, games.root, games.scenes)
    (trial,) = [t for t in tasks_from_manifest(games.rows, split="train", master_seed=cfg.seed)
                if t.quest_id.endswith("_t1")]
    (ev,) = [r for r in games.rows if r["split"] == "eval"]
    gold = list(ev["expert_plan"])
    (record,) = play([trial], make_env=env_for, make_agent=lambda t: _Replay(gold), make_user=user_for)
    assert record["episode"]["won"]
    turns = record["turns"]
    (focus,) = [t for t in turns if t["command"].startswith("focus on")]
    found = f"found({json.loads(focus['observation'])['agent_location']})"
    raised = [f"advanced({t['command']})" for t in turns if t["reward"] > 0
              and t["command"].split()[0] not in ("focus", "pick", "move")]
    entry = build_entry(record["episode"], turns, reader=READER)
    outcomes = [f for f in entry.scene_facts if f.startswith(("advanced(", "found(", "ended("))]
    assert raised and outcomes == raised + [found], entry.scene_facts
    assert not any(focus["command"] in f for f in entry.scene_facts)

    recall = Recall(StoreKnowledge.from_entries([entry.model_dump()], READER), ev["scene_id"],
                    objective_words(ev["objective"], READER), house=True, lessons=False)
    message = AdvisoryBuilder().build(entry, 1.0, recall=recall).message
    # the variation's facts open with what the steps' outcomes said
    assert found in message and message.split("past visit: ")[1].startswith(("advanced(", "found(")), message
    assert "focus on" not in message and not find_label_hints(message, expert_plan=gold)
    slot = memory_slot(EpisodicStore.from_entries([entry]), ev, section(ConditionConfig, {"kind": "memory"}),
                       section(MemoryConfig, {"facts": "house", "same_scene_first": True}), 0, facts=READER)
    assert slot.gate_ok, slot.reason

    (task,) = tasks_from_manifest(games.rows, split="eval", master_seed=cfg.seed)
    reader_cfg = OmegaConf.merge(cfg, {"agent": {"name": "reader"}})
    won, where = {}, {}
    for name, prompt in (("memory", message), ("none", "")):
        agent = make_agent(reader_cfg, seed=0)
        agent.reset({"episode_id": "ep", "objective": ev["objective"], "system_prompt": prompt, "seed": 0})
        env = env_for(task)
        try:
            obs, done, info = env.reset(), False, {}
            while not done:
                step = agent.act(obs)
                if step.action["action"] == "focus_on":
                    where[name] = obs["agent_location"]
                obs, _, done, info = env.step(step.action)
        finally:
            env.close()
        won[name] = info["won"]
    assert won["memory"] and where["memory"] == found[len("found("):-1]


def test_the_reader_explores_where_the_ways_are_unknown_and_the_memory_s_map_shortens_the_walk():
    agent = ReaderAgent(section(AgentConfig, {"name": "reader"}), facts=READER)
    rooms = ("art studio", "bedroom", "kitchen")
    hub = observation("hallway", *[fact("at", f"door to {r}", "hallway") for r in rooms],
                      *[fact("exit", "hallway", r, r) for r in rooms], *[fact("open", f"door to {r}") for r in rooms],
                      commands=tuple(f"go to {r}" for r in rooms) + ("look around",))
    there = LIFESPAN.replace("'outside'", "'bathroom'")  # a room no door in sight leads to

    def first_step(prompt: str) -> dict:
        agent.reset({"episode_id": "ep", "objective": there, "system_prompt": prompt})
        return agent.act(hub).action

    # told nothing: the first room by name
    assert first_step("") == {"action": "go_to", "target": "art studio"}
    # a past visit saw the art studio's and the bedroom's only ways (back here): the kitchen is where a new way may be
    assert first_step("Facts: art studio -> hallway -> hallway; bedroom -> hallway -> hallway.") == \
        {"action": "go_to", "target": "kitchen"}
    # ... and a door it saw there, never opened, is the way
    agent.reset({"episode_id": "ep", "objective": there,
                 "system_prompt": "This house, from 3 past visits: door to bathroom in the kitchen was never opened."})
    assert agent.act(hub).action == {"action": "go_to", "target": "kitchen"}
    assert agent.room_path("hallway", "bathroom") == "kitchen"
    # a room whose stated ways lead nowhere new is still walked into when no room of unknown ways is left
    assert first_step("Facts: art studio -> hallway -> hallway; bedroom -> hallway -> hallway; "
                      "kitchen -> hallway -> hallway.") == {"action": "go_to", "target": "art studio"}


def test_a_right_find_is_picked_up_under_the_name_it_was_shown_when_the_engine_lists_another():
    agent = ReaderAgent(section(AgentConfig, {"name": "reader"}), facts=READER)
    agent.reset({"episode_id": "ep", "objective": FIND.replace("hallway.", "kitchen."), "system_prompt": ""})
    # ScienceWorld lists the glass cup's moves as "cup" ("move cup to inventory"); its parser takes the name shown
    shown = {**outside(), "visible_entities": ["glass cup", "door to hallway"], "admissible_commands": ["focus on glass cup"],
             "admissible_actions": [{"action": "focus_on", "target": "glass cup", "command": "focus on glass cup"}]}
    assert agent.act(shown).action == {"action": "focus_on", "target": "glass cup"}
    assert agent.act(shown).action == {"action": "pick_up", "target": "glass cup"}


@needs_jvm
def test_a_trial_reads_the_memory_of_the_trials_before_it(adaptation, tmp_path):
    """``grounding.online_memory=C2`` (the adaptation's): the second trial of a variation is prompted
    with C2's memory of the first, built from what the first trial did in the engine, even where the
    user said nothing (``user.feedback_prob=0``); null: its prompt has the grounding alone."""
    from pipeline.memory import build_entry
    from pipeline.session.collection import make_factories
    from pipeline.session.online import play_online
    from pipeline.session.rollout import play, tasks_from_manifest

    cfg, games = adaptation
    prompts: dict[str, dict[str, str | None]] = {}
    played = {}
    for name, memory in (("memory", "C2"), ("none", None)):
        run = OmegaConf.merge(cfg, {"agent": {"name": "trial"}, "user": {"feedback_prob": 0.0},
                                    "grounding": {"online_memory": memory}})
        env_for, agent_for, user_for = make_factories(run, games.root, games.scenes)
        tasks = tasks_from_manifest(games.rows, split="train", master_seed=run.seed)
        seen = prompts.setdefault(name, {})

        def play_round(batch):
            for t in batch:
                seen[t.quest_id] = t.system_prompt
            return play(batch, make_env=env_for, make_agent=agent_for, make_user=user_for)

        played[name] = play_online(run, ROOT, tasks, play_round, tmp_path / name)
    first, second = sorted(prompts["memory"])
    assert prompts["memory"][first] is None and prompts["none"][first] is None  # nothing played before it
    told, plain = prompts["memory"][second], prompts["none"][second] or ""
    entry = build_entry(played["memory"][0]["episode"], played["memory"][0]["turns"], reader=READER)
    assert told is not None and entry.scene_facts
    # what the first trial saw and did, in the memory's words; the grounding alone never says it
    shown = [f for f in entry.scene_facts if f in told]
    assert shown and not any(f in plain for f in shown), (entry.scene_facts, told)
