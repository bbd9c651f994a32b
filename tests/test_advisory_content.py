"""Memory worth retrieving: the scene facts an entry carries, its advisory's text, and the
label-hint counts of the rendered prompts (grounding and memory) and of the report."""

from __future__ import annotations

import json
import random

import pytest

from pipeline import conditions as R
from pipeline.analysis.report import label_hint_counts, markdown_tables
from pipeline.core.schemas import FEEDBACK_TYPES, episodes_table, turns_table
from pipeline.envs.household.reader import HouseholdFactReader
from pipeline.memory import AdvisoryBuilder, EpisodicStore, build_entries, build_entry, find_label_hints
from pipeline.memory.schemas import MAX_MESSAGE_CHARS
from pipeline.memory.scene import (
    FACT_SEPARATOR,
    MAX_SUMMARY_CHARS,
    SCENE_FACTS_MARKER,
    join_facts,
    split_scene_facts,
    with_scene_facts,
)
from pipeline.memory.scene import scene_facts as scene_facts_of

READER = HouseholdFactReader()


def scene_facts(turns: list[dict]) -> list[str]:
    """The scene facts of household turn rows, read the way the store stage reads them."""
    return scene_facts_of([(t, READER.read_turn(t)) for t in turns])

OBJECTIVE = "Put Book_3 in Chest_2"
# The expert plan of an eval task of the same scene: what the past episode did, as commands.
EVAL_PLAN = ["go south", "open Drawer_0", "take Key_2 from Drawer_0", "unlock Chest_2 with Key_2", "open Chest_2",
             "insert Book_3 into Chest_2"]
KITCHEN = ("You are in the Kitchen. You see Fridge_0 (closed), Table_0, Apple_2. On Table_0: Mug_1. "
           "Exits: south to Bedroom. You are carrying nothing.")
BEDROOM = "You are in the Bedroom. You see Drawer_0 (closed), Drawer_4 (closed), Chest_2 (locked). {extra}" \
          "Exits: north to Kitchen. You are carrying {inv}."


def bedroom(drawer0: str = "closed", drawer4: str = "closed", inside: str = "", inv: str = "nothing") -> str:
    return BEDROOM.format(extra=inside, inv=inv).replace("Drawer_0 (closed)", f"Drawer_0 ({drawer0})") \
        .replace("Drawer_4 (closed)", f"Drawer_4 ({drawer4})")


def turn(i: int, location: str, description: str, command: str, *, valid: bool = True, status: str = "Success",
         feedback: str = "", fb: dict | None = None) -> dict:
    obs = {"scene": "scene_01", "agent_location": location, "description": description,
           "admissible_commands": ["look", "inventory"], "objective": OBJECTIVE}
    verb, _, target = command.partition(" ")
    fb = fb or {}
    return {"episode_id": "ep_train_scene_01_q03_0", "turn_index": i, "observation": json.dumps(obs),
            "generated_text": "", "reasoning": None, "action": json.dumps({"action": verb, "target": target or None}),
            "command": command, "action_valid": valid, "env_feedback": feedback, "reward": 0.0, "changed": valid,
            "repeated": False, "done": False, "won": False, "status": status,
            "feedback_lines": [f"feedback : {k}: {v}" for k, v in fb.items()],
            **{f"feedback_{k}": fb.get(k) for k in FEEDBACK_TYPES}}


def successful_turns() -> list[dict]:
    """Corrected, then won: the key was in Drawer_0 in the Bedroom, Chest_2 is locked."""
    return [
        turn(0, "Kitchen", KITCHEN, "open Fridge_0", status="Failure",
             fb={"spatial": "The chest is in the bedroom, south of the kitchen."}),
        turn(1, "Kitchen", KITCHEN.replace("Fridge_0 (closed)", "Fridge_0 (open, empty)"), "go south",
             feedback=bedroom()),
        turn(2, "Bedroom", bedroom(), "open Drawer_0"),
        turn(3, "Bedroom", bedroom("open", inside="In Drawer_0: Key_2. "), "take Key_2 from Drawer_0"),
        turn(4, "Bedroom", bedroom("open, empty", inv="Key_2"), "unlock Chest_2 with Key_2"),
        turn(5, "Bedroom", bedroom("open, empty", inv="Key_2").replace("Chest_2 (locked)", "Chest_2 (closed)"),
             "open Chest_2"),
    ]


def episode(won: bool = True, turns: list[dict] | None = None) -> dict:
    turns = successful_turns() if turns is None else turns
    return {"episode_id": "ep_train_scene_01_q03_0", "scene_id": "scene_01", "quest_id": "q03", "split": "train",
            "condition": "", "objective": OBJECTIVE, "question": OBJECTIVE, "choices": [], "ground_truth": "",
            "final_answer": "", "won": won, "preferences_ok": True, "is_correct": won,
            "final_reward": 1.0 if won else -0.2, "num_turns": len(turns), "num_invalid": 0, "num_repeated": 0,
            "prompt_tokens": 0, "generated_tokens": 0, "agent": "react", "model": "none", "seed": 0,
            "metadata": "{}"}


# --------------------------------------------------------------------------- scene facts


def test_scene_facts_of_a_successful_episode():
    facts = scene_facts(successful_turns())
    assert facts == [
        # what the agent took, where it was found
        "Key_2 was in Drawer_0 in the Bedroom",
        # locked containers and their keys
        "Chest_2 in the Bedroom is locked (Key_2 unlocks it)",
        # routes
        "Bedroom -> north -> Kitchen", "Kitchen -> south -> Bedroom",
        # other things seen
        "Mug_1 was on Table_0 in the Kitchen",
        # searched and found empty
        "Fridge_0 in the Kitchen was empty",
        # seen closed, never looked into
        "Drawer_4 in the Bedroom was never opened",
    ]
    assert all(";" not in f for f in facts)


def test_scene_facts_read_lowercase_commands_and_routes_walked_without_descriptions():
    turns = [turn(0, "Kitchen", "", "go south"), turn(1, "Bedroom", "", "take key_2 from drawer_0"),
             turn(2, "Bedroom", bedroom(inv="Key_2"), "unlock chest_2 with key_2")]
    facts = scene_facts(turns)
    assert "Kitchen -> south -> Bedroom" in facts
    assert "key_2 was in drawer_0 in the Bedroom" in facts  # never seen spelled otherwise
    assert "Chest_2 in the Bedroom is locked (key_2 unlocks it)" in facts
    # Invalid commands give nothing; without an observation a command still says what it showed.
    assert scene_facts([turn(0, "Kitchen", KITCHEN, "take Key_9 from Drawer_9", valid=False)]) == [
        "Kitchen -> south -> Bedroom", "Mug_1 was on Table_0 in the Kitchen", "Fridge_0 in the Kitchen was never opened"]
    assert scene_facts([{"turn_index": 0, "command": "take Key_1 from Drawer_0", "action_valid": True},
                        {"turn_index": 1, "command": "go south", "action_valid": True},
                        {"turn_index": 2, "command": "take Soap_1", "action_valid": True}]) == [
        "Key_1 was in Drawer_0"]


def test_entry_carries_the_facts_deterministically():
    turns = successful_turns()
    entry = build_entry(episode(), turns, reader=READER)
    shuffled = build_entry(episode(), random.Random(3).sample(turns, len(turns)), reader=READER)
    assert entry == shuffled
    rationale, facts = split_scene_facts(entry.case_summary.rationale_summary)
    assert facts == scene_facts(turns) and rationale.startswith("feedback applied (spatial: ")
    assert OBJECTIVE not in entry.model_dump_json()
    # The same episodes give the same store bytes, in any order.
    a = EpisodicStore.from_entries([entry]).store_hash
    assert a == EpisodicStore.from_entries([shuffled]).store_hash


def test_entries_built_from_the_tables_carry_the_facts():
    turns = successful_turns()
    entries = build_entries(episodes_table([episode()]), turns_table(turns), splits=["train"], reader=READER)
    assert split_scene_facts(entries[0].case_summary.rationale_summary)[1] == scene_facts(turns)


def test_an_episode_without_scene_facts_keeps_its_old_rationale():
    turns = [{**t, "observation": "{}", "env_feedback": "", "command": "look"} for t in successful_turns()]
    entry = build_entry(episode(), turns, reader=READER)
    assert SCENE_FACTS_MARKER not in entry.case_summary.rationale_summary
    assert split_scene_facts(entry.case_summary.rationale_summary) == (entry.case_summary.rationale_summary, [])
    # Without observations, the commands alone still say where the key was and what it opened.
    blind = build_entry(episode(), [{**t, "observation": None, "env_feedback": ""} for t in successful_turns()],
                        reader=READER)
    assert split_scene_facts(blind.case_summary.rationale_summary)[1] == [
        "Key_2 was in Drawer_0", "Chest_2 is locked (Key_2 unlocks it)"]


def test_facts_are_cut_whole_and_the_summary_stays_in_bounds():
    facts = [f"Item_{i} was in Drawer_{i} in the LivingRoom" for i in range(40)]
    assert join_facts(facts, 90) == FACT_SEPARATOR.join(facts[:2])
    assert join_facts(facts, 10) == ""
    text = with_scene_facts("r " * 400, facts)
    head, kept = split_scene_facts(text)
    assert len(text) <= MAX_SUMMARY_CHARS and kept == facts[:len(kept)] and len(kept) >= 6
    assert head.endswith("…") and len(head) <= 240
    short = with_scene_facts("a direct plan reached the goal", facts[:2])
    assert short == f"a direct plan reached the goal{SCENE_FACTS_MARKER}{FACT_SEPARATOR.join(facts[:2])}."


# --------------------------------------------------------------------------- advisories


def test_successful_override_advisory_says_where_the_key_was_and_what_is_locked():
    entry = build_entry(episode(won=True), successful_turns(), reader=READER)
    adv = AdvisoryBuilder().build(entry, 0.9)
    assert adv.advisory_type == "successful_override"
    msg = adv.message
    assert msg.startswith("Principle: ") and "A similar past case went wrong" in msg
    assert "Facts of that case's scene (scene_01): Key_2 was in Drawer_0 in the Bedroom; " in msg
    assert "Chest_2 in the Bedroom is locked (Key_2 unlocks it)" in msg and "Kitchen -> south -> Bedroom" in msg
    assert len(msg) <= MAX_MESSAGE_CHARS and msg.endswith("Fridge_0 in the Kitchen was empty; "
                                                          "Drawer_4 in the Bedroom was never opened.")
    # Facts of the scene, not the commands: an eval task whose plan repeats them keeps the advisory.
    assert find_label_hints(msg, expert_plan=EVAL_PLAN) == []
    advs, warnings = AdvisoryBuilder().build_many([(entry, 0.9)], query_expert_plan=EVAL_PLAN)
    assert len(advs) == 1 and warnings == []


def test_plain_success_and_failure_carry_the_scene_too():
    turns = successful_turns()
    anchor = build_entry(episode(won=True), [{**t, "feedback_spatial": None, "feedback_lines": []} for t in turns],
                         reader=READER)
    adv = AdvisoryBuilder().build(anchor, 0.9)
    assert adv.advisory_type == "consistency_anchor" and "Key_2 was in Drawer_0 in the Bedroom" in adv.message
    failed_turns = [turn(0, "Bedroom", bedroom(), "open Drawer_4"),
                    turn(1, "Bedroom", bedroom(drawer4="open, empty"), "open Chest_2", valid=False, status="Failure")]
    failed = build_entry(episode(won=False, turns=failed_turns), failed_turns, reader=READER)
    adv = AdvisoryBuilder().build(failed, 0.9)
    assert adv.advisory_type == "failed_override_warning" and adv.message.startswith("Warning: ")
    assert ("Observed in that case's scene (scene_01): Chest_2 in the Bedroom is locked; "
            "Bedroom -> north -> Kitchen; Drawer_4 in the Bedroom was empty; Drawer_0 in the Bedroom was never opened."
            ) in adv.message


def test_many_facts_stay_within_800_characters_cut_at_whole_facts():
    rooms = ["Kitchen", "Bedroom", "Bathroom", "LivingRoom", "DiningRoom", "Office"]
    turns = []
    for i, room in enumerate(rooms):
        items = ", ".join(f"Vase_{i}{j}" for j in range(4))
        desc = (f"You are in the {room}. You see Cabinet_{i} (open), Drawer_{i} (open, empty), Chest_{i} (locked), "
                f"Shelf_{i}. In Cabinet_{i}: {items}. On Shelf_{i}: Key_{i}, Soap_{i}. "
                f"Exits: north to {rooms[(i + 1) % 6]}, south to {rooms[i - 1]}. You are carrying nothing.")
        turns.append(turn(2 * i, room, desc, f"take Key_{i} from Shelf_{i}"))
        turns.append(turn(2 * i + 1, room, desc, f"unlock Chest_{i} with Key_{i}"))
    facts = scene_facts(turns)
    assert len(facts) > 40
    entry = build_entry(episode(turns=turns), turns, reader=READER)
    stored = split_scene_facts(entry.case_summary.rationale_summary)[1]
    assert stored == facts[:len(stored)] and len(entry.case_summary.rationale_summary) <= MAX_SUMMARY_CHARS
    for limit in (800, 500, 300):
        msg = AdvisoryBuilder(max_message_chars=limit).build(entry, 0.9).message
        assert len(msg) <= limit
        listed = msg.split("Facts of that case's scene (scene_01): ", 1)[1].removesuffix(".").split(FACT_SEPARATOR)
        assert listed == stored[:len(listed)]  # whole facts, in the stored order
    assert "Key_0 was on Shelf_0 in the Kitchen" in AdvisoryBuilder().build(entry, 0.9).message


def test_a_fact_that_spells_the_eval_plan_is_still_a_label_hint():
    leaky = build_entry(episode(), successful_turns(), reader=READER)
    data = leaky.model_dump()
    data["case_summary"]["rationale_summary"] = with_scene_facts(
        "a direct plan reached the goal in 6 turns", ["take Key_2 from Drawer_0", "unlock Chest_2 with Key_2"])
    clean = build_entry(episode(), successful_turns(), reader=READER)
    advs, warnings = AdvisoryBuilder().build_many([(data, 0.9), (clean, 0.8)], query_expert_plan=EVAL_PLAN)
    assert [a.advisory_id for a in advs] == ["adv_000002"]
    assert len(warnings) == 1 and warnings[0].startswith("label_hint: adv_000001")
    assert "Key_2" not in warnings[0]


# --------------------------------------------------------------------------- prompts: grounding and memory


TASK = {"scene_id": "scene_01", "quest_id": "e0", "objective": OBJECTIVE, "expert_plan": EVAL_PLAN}


@pytest.mark.parametrize(
    "text, hinted, named",
    [
        ("- The chest is in the bedroom, south of the kitchen.", False, 0),
        ("- Open Drawer_0 first.", False, 1),  # one command of five: a principle, not the answer
        ("- Open Drawer_0, then take Key_2 from Drawer_0.", True, 2),
        ("- Kitchen -> south -> Bedroom; Key_2 was in Drawer_0 in the Bedroom.", False, 0),
        ("", False, 0),
    ],
)
def test_label_hint_of_grounding_text(text, hinted, named):
    assert R.label_hint_of(text, TASK, 2) == (hinted, named)


def test_label_hint_of_uses_the_ground_truth_without_a_plan():
    task = {"ground_truth": "open Drawer_0 ; take Key_2 from Drawer_0"}
    assert R.task_answer(task) == (["open Drawer_0", "take Key_2 from Drawer_0"],
                                   "open Drawer_0 ; take Key_2 from Drawer_0")
    assert R.label_hint_of("Answer: open Drawer_0 ; take Key_2 from Drawer_0", task, 5) == (True, 2)


def test_label_hint_totals_and_prompts_table_nulls():
    rows = [{"grounding_label_hint": True, "memory_label_hint": False},
            {"grounding_label_hint": True, "memory_label_hint": True},
            {"grounding_label_hint": False, "memory_label_hint": False}]
    assert R.label_hint_totals(rows) == {"prompts": 3, "grounding": 2, "memory": 1, "either": 2}
    assert R.LABEL_HINT_COLUMNS == tuple(n for n in R.PROMPTS_SCHEMA.names if n in R.LABEL_HINT_COLUMNS)


# --------------------------------------------------------------------------- report


def _condition(name: str, counts: dict | None) -> dict:
    est = {"value": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 4}
    m = {"condition": name, "num_episodes": 4, **{k: est for k in (
        "success_rate", "won_rate", "mean_reward", "mean_turns", "invalid_action_rate", "repeated_action_rate",
        "gate_pass_rate", "prompt_tokens_per_episode", "generated_tokens_per_episode")}}
    if counts is not None:
        m["label_hint_prompts"] = counts
    return m


def test_report_counts_and_shows_prompts_that_reveal_the_answer():
    rows = [{"grounding_label_hint": True, "memory_label_hint": None},
            {"grounding_label_hint": False, "memory_label_hint": True},
            {"grounding_label_hint": True, "memory_label_hint": True}]
    counts = label_hint_counts(rows)
    assert counts == {"prompts": 3, "grounding": 2, "memory": 2, "either": 3}
    assert label_hint_counts([{"task_id": "a"}]) is None and label_hint_counts(None) is None
    text = markdown_tables({"conditions": [_condition("C1", counts), _condition("C2", None)]})
    assert "### Prompts that reveal the task's answer" in text
    assert "| C1 | 3 | 2 | 2 | 3 |" in text and "| C2 | – | – | – | – |" in text
    assert "reveal the task's answer" not in markdown_tables({"conditions": [_condition("C1", None)]})


def test_store_metrics_count_the_scene_facts():
    from pipeline.memory.build import build_store, store_metrics

    turns = successful_turns()
    blind = [{**t, "episode_id": "ep_train_scene_01_q04_0", "observation": "{}", "env_feedback": "",
              "command": "look"} for t in turns]
    eps = [episode(), {**episode(), "episode_id": "ep_train_scene_01_q04_0", "quest_id": "q04"}]
    m = store_metrics(build_store(episodes_table(eps), turns_table(turns + blind), splits=["train"], config_hash=None,
                                  reader=READER))
    assert m["scene_facts_rate"] == 0.5 and m["mean_scene_facts"] == len(scene_facts(turns)) / 2
