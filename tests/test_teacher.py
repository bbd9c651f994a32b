"""Who answers the policy's turns (issue 64, item 1): ``policy.teacher`` = expert | reader.

The reader as the teacher answers in the model's format, follows a verified plan as written,
goes on from a step it did not choose exactly as a reader that had chosen it would, and plays
the demonstrations and DAgger labels through the same seam as the expert; the reader's three
mended behaviours (a key before a locked destination, "... and lock it", a key that does not
fit) are each checked on the generated house where they were found.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import train_config
from tests.test_policy import TINY_POLICY

pytestmark = pytest.mark.filterwarnings("ignore:Game .* is not fully supported")


@pytest.fixture(scope="module")
def cfg(tiny_cfg):
    return train_config(tiny_cfg, {"agent": {"name": "llm", "batch_size": 4}, "policy": {**TINY_POLICY, "teacher": "reader"}})


def _houses(cfg, seed, n):
    from pipeline.envs.household.generate import GeneratedHouses, HouseSizes

    return GeneratedHouses(HouseSizes(), seed=seed, base=cfg.env).houses(n)


def _reader_episode(cfg, house, prompt="", **kw):
    from pipeline.envs import fact_reader
    from pipeline.policy.demos import house_env
    from pipeline.policy.teacher import ReaderTeacher, teacher_episode

    with house_env(cfg, house) as env:
        env.reset()
        return teacher_episode(env, ReaderTeacher(fact_reader(cfg), prompt, house.row(0)["objective"]), **kw)


def _lines(episode):
    return [t.response.partition("\n")[0] for t in episode.turns]


def test_the_reader_teaches_a_verified_plan_step_by_step_in_the_models_format(cfg):
    from pipeline.conditions.oracle import oracle_advisories
    from pipeline.prompts import extract_json_object

    house = _houses(cfg, 5, 1)[0]
    plan = house.row(0)["expert_plan"]
    block = "\n".join(a.message for a in oracle_advisories(plan, 2, 800, "g/q00"))
    episode = _reader_episode(cfg, house, block)
    assert episode.won and episode.preferences_ok
    assert _lines(episode) == [f"Verified step {i + 1} of {len(plan)}: {c}." for i, c in enumerate(plan)]
    for k, turn in enumerate(episode.turns):
        obj = extract_json_object(turn.response)
        assert obj is not None and set(obj["memory"]) == {"plan", "notes"}
        assert obj["memory"]["plan"] == "; ".join(plan[k + 1:])  # what is left, as the expert writes it
    assert episode.searched_steps == 0


def test_after_another_step_the_teacher_answers_as_a_reader_that_had_chosen_it(cfg):
    """DAgger's and the slips' case: the played step is not the teacher's. Each later answer
    equals that of a fresh reader replayed from the start over the same observations, choosing
    where the teacher's step was played and made to play the others (no state kept from an
    answer that was not played, and none lost from one that was)."""
    from pipeline.core.conf_schema import AgentConfig
    from pipeline.core.config import section
    from pipeline.core.schemas import clean_action
    from pipeline.envs import fact_reader
    from pipeline.policy.demos import house_env
    from pipeline.policy.teacher import ReaderTeacher, _Told, command_of

    facts = fact_reader(cfg)

    def replayed(objective, history, obs):
        agent = _Told(section(AgentConfig, {"name": "reader"}), facts=facts)
        agent.reset({"episode_id": "teacher", "objective": objective, "system_prompt": ""})
        for past, told in history:
            agent.told = told
            agent.act(past)
            agent.told = None
        return command_of(agent.act(obs).action, obs)

    diverged = 0
    for i, house in enumerate(_houses(cfg, 11, 5)):
        objective = house.row(0)["objective"]
        rng = np.random.default_rng(i)
        teacher = ReaderTeacher(facts, "", objective)
        history: list = []
        with house_env(cfg, house) as env:
            obs, done = env.reset(), False
            while not done:
                mine = teacher.answer(obs)
                assert replayed(objective, history, obs) == mine.command
                others = [a for a in obs["admissible_actions"] if a.get("command") != mine.command]
                action = clean_action(others[int(rng.integers(len(others)))]) \
                    if others and rng.random() < 0.4 else mine.action
                nxt, _, done, info = env.step(action)
                teacher.played(info.get("command"), action)
                own = info.get("command") is not None and info.get("command") == mine.command
                diverged += not own
                told = clean_action(action) if info.get("command") else {"action": "wait", "target": None}
                history.append((obs, None if own else told))
                obs = nxt
    assert diverged > 10


def test_a_refused_step_is_a_wait_to_the_teacher(cfg):
    from pipeline.envs import fact_reader
    from pipeline.policy.demos import house_env
    from pipeline.policy.teacher import ReaderTeacher

    house = _houses(cfg, 5, 1)[0]
    teacher = ReaderTeacher(fact_reader(cfg), "", house.row(0)["objective"])
    with house_env(cfg, house) as env:
        obs = env.reset()
        first = teacher.answer(obs)
        bad = {"action": "open", "target": "Nothing_9"}
        obs2, _, _, info = env.step(bad)
        assert info.get("command") is None
        teacher.played(None, bad)
        assert teacher.agent.trace[-1]["action"]["action"] == "wait" and "Nothing_9" not in teacher.agent.mem.opened
        assert teacher.answer(obs2).command == first.command  # nothing happened: the same answer


def test_the_reader_takes_a_key_before_walking_to_a_locked_destination_and_locks_it_when_told(cfg):
    """Seed 5's house 0, "Put Towel_6 in Drawer_0 and lock it.": the reader walked between
    the locked drawer and the room with its key to the step cap, and never locked it."""
    house = _houses(cfg, 5, 1)[0]
    assert house.row(0)["objective"].endswith("and lock it.")
    episode = _reader_episode(cfg, house)
    lines = _lines(episode)
    assert episode.won, lines
    assert any(line.startswith("Drawer_0 is locked: take Key_0") for line in lines)
    assert lines[-1].startswith("Towel_6 is in Drawer_0; now I lock Drawer_0")


def test_a_key_that_did_not_fit_sends_the_reader_nowhere(cfg):
    """Seed 7's house 21: holding Key_5, the reader walked back to Cabinet_2 (which Key_5 does
    not open) from the next room and out again, to the step cap."""
    house = _houses(cfg, 7, 22)[21]
    episode = _reader_episode(cfg, house)
    lines = _lines(episode)
    assert sum("Cabinet_2 in the Kitchen may hold what I need" in line for line in lines) <= 1, lines
    assert any("Wardrobe_7" in line for line in lines), lines  # it searched on, toward where the spoon is


def test_demos_and_dagger_labels_come_from_the_teacher_the_config_names(cfg, tiny_games):
    """With ``policy.teacher=reader`` every demonstration turn and DAgger label is the reader's
    answer (its reasoning lines), in the format the agent parses; the expert's never appears."""
    from pipeline.policy import demos as demos_mod
    from pipeline.policy.dagger import dagger_tasks, play_houses
    from pipeline.prompts import extract_json_object

    memory = demos_mod.build_scene_memory(cfg, tiny_games.root, tiny_games.rows, tiny_games.scenes)
    rows = sorted((r for r in tiny_games.rows if r["split"] == "train"), key=lambda r: r["quest_id"])[:2]
    organizer = demos_mod.PromptOrganizer.from_config(cfg)
    played = [d for r in rows for d in demos_mod.quest_demos(cfg, tiny_games.root, tiny_games.scenes, r, memory,
                                                               organizer, set())]
    turns = demos_mod.render_demos(cfg, played)
    assert turns and all(extract_json_object(t.response) for t in turns)
    firsts = [t.response.partition("\n")[0] for t in turns if t.train]
    assert not any(f.startswith(("Plan: ", "Find ", "Search: ")) for f in firsts)  # the expert's lines
    assert any(d.episode.won for d in played)

    class Scripted:  # a stand-in model: always the first admissible action
        name = "scripted"

    tasks = dagger_tasks(cfg, tiny_games.rows, tiny_games.scenes, memory, 1, 3)
    from pipeline.agents.llm import LLMAgent

    def act_many(agents, observations):
        from pipeline.agents.base import AgentStep
        from pipeline.core.schemas import clean_action
        return [AgentStep(action=clean_action(o["admissible_actions"][0]), reasoning="") for o in observations]

    original = LLMAgent.act_many
    try:
        LLMAgent.act_many = staticmethod(act_many)
        rollouts = play_houses(cfg, Scripted(), tasks, label=True)
    finally:
        LLMAgent.act_many = original
    labels = [t for r in rollouts for t in r.labels]
    assert labels and len(labels) == sum(r.turns for r in rollouts)
    assert all(json.loads(t.response.partition("\n")[2])["action"] for t in labels)
    assert not any(t.response.startswith(("Plan: ", "Find ", "Search: ")) for t in labels)
