"""The experiment's design (issue 42): what the user says, what the memory keeps and recalls, what transfers.

- the simulated user says where things are only as ``user.spatial`` allows;
- placements follow the kinds' regularities with probability ``env.regularity`` (0: as before);
- the store's knowledge: a house's facts over all its visits, lessons across houses stated
  in kinds, the users' habits in the world's general sentences; each writer beside its reader;
- the recall: the agent's own house's facts only, no repeats across a bundle, relevant first;
  the placebo's recall names none of the task's kinds, no key, no habit;
- retrieval ranks the agent's own house first (the vectorised index agrees with the loop);
- the reader uses lessons as search priors and habits as preferences;
- the default run's C2 advisories name no task's answer (its committed render metrics).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.agents.reader import read_prompt
from pipeline.core.conf_schema import EnvConfig, UserConfig
from pipeline.core.config import section
from pipeline.core.facts import fact
from pipeline.core.stats import wilcoxon_paired
from pipeline.envs import fact_reader
from pipeline.envs.household.games import TYPICAL_HOLDERS, make_scene
from pipeline.envs.household.text import habit_text, kind_of, preference_text, read_statements
from pipeline.envs.household.user import SimulatedUser
from pipeline.memory import find_label_hints
from pipeline.memory.advisory import AdvisoryBuilder, Recall
from pipeline.memory.knowledge import Lesson, StoreKnowledge, read_lessons, relevant_first
from pipeline.memory.retrieval import Retriever, retrieve_loop
from pipeline.memory.schemas import EpisodicMemoryEntryV1_1
from pipeline.memory.signature import SignatureBuilder
from pipeline.session.experience import first_episodes

ROOT = Path(__file__).resolve().parents[1]
HOUSEHOLD = fact_reader(SimpleNamespace(env=SimpleNamespace(name="household")))


# --------------------------------------------------------------------------- the user


SCENE = {
    "scene_id": "s0", "rooms": ["Kitchen", "Bedroom"], "connections": [["Kitchen", "east", "Bedroom"]],
    "containers": [{"name": "Fridge_0", "room": "Kitchen", "locked": False, "key": None},
                   {"name": "Cabinet_0", "room": "Bedroom", "locked": True, "key": "Key_1"}],
    "supporters": [{"name": "Table_0", "room": "Kitchen"}],
    "objects": [{"name": "Apple_2", "location": "Cabinet_0"}],
    "keys": [{"name": "Key_1", "location": "Table_0", "opens": "Cabinet_0"}],
    "preferences": [],
}
QUEST = {"quest_id": "q0", "objective": "Put Apple_2 in Fridge_0 and close it.", "preferences": [],
         "expert_plan": ["take Key_1 from Table_0", "go east", "unlock Cabinet_0 with Key_1", "open Cabinet_0",
                         "take Apple_2 from Cabinet_0", "go west", "open Fridge_0", "insert Apple_2 into Fridge_0",
                         "close Fridge_0"]}
FACTS = ["at(P, Bedroom: r)", "at(Fridge_0: c, Kitchen: r)", "at(Cabinet_0: c, Bedroom: r)", "at(Table_0: s, Kitchen: r)",
         "closed(Fridge_0: c)", "locked(Cabinet_0: c)", "match(Key_1: k, Cabinet_0: c)", "on(Key_1: k, Table_0: s)",
         "in(Apple_2: o, Cabinet_0: c)", "east_of(Bedroom: r, Kitchen: r)", "west_of(Kitchen: r, Bedroom: r)"]


@pytest.mark.parametrize("spatial, expected", [
    ("full", ["feedback : procedural: Cabinet_0 is locked: unlock it with Key_1 first.",
              "feedback : spatial: Key_1 is on Table_0 in the Kitchen.",
              "feedback : spatial: From the Bedroom, go west to reach the Kitchen."]),
    ("room", ["feedback : procedural: Cabinet_0 is locked: unlock it with Key_1 first.",
              "feedback : spatial: From the Bedroom, go west to reach the Kitchen."]),
    ("none", ["feedback : procedural: Cabinet_0 is locked: unlock it with Key_1 first."]),
])
def test_the_user_says_where_things_are_only_as_user_spatial_allows(spatial, expected):
    u = SimulatedUser(section(UserConfig, {"feedback_prob": 1.0, "spatial": spatial}), SCENE, QUEST, 0)
    info = {"valid": False, "won": False, "lost": False, "facts": FACTS, "expert_plan": QUEST["expert_plan"]}
    fb = u.step_feedback(1, {"agent_location": "Bedroom"}, {"action": "open", "target": "Cabinet_0"}, info)
    assert fb.lines == expected


def test_user_spatial_is_checked_at_compose():
    with pytest.raises(Exception, match="spatial"):
        section(UserConfig, {"spatial": "everything"})


# --------------------------------------------------------------------------- regularities


def test_regularity_places_things_where_their_kind_usually_is_and_zero_changes_nothing():
    base = section(EnvConfig, {"rooms_per_scene": 5, "containers_per_scene": 8, "objects_per_scene": 6,
                               "locked_containers": 2})
    typical = section(EnvConfig, {**base, "regularity": 1.0})
    placed = checked = 0
    for i in range(12):
        plain, regular = make_scene(base, i, 7, 1), make_scene(typical, i, 7, 1)
        # The layout is drawn first: the same rooms, doors and containers either way.
        assert (plain["rooms"], plain["connections"], plain["containers"]) == \
            (regular["rooms"], regular["connections"], regular["containers"])
        for item in regular["objects"] + regular["keys"]:
            # a key lies where it can be reached: never in a locked container
            kinds = {c["name"]: kind_of(c["name"]) for c in regular["containers"]
                     if not (c["locked"] and item in regular["keys"])}
            wanted = TYPICAL_HOLDERS.get(kind_of(item["name"]), ())
            if any(k in wanted for k in kinds.values()):
                checked += 1
                placed += kinds.get(item["location"]) in wanted
    assert checked >= 20 and placed == checked
    # regularity 0 draws no extra random number: the scene of a seed is what it always was
    rng = random.Random(0)
    assert make_scene(base, 3, 7, 1) == make_scene(section(EnvConfig, {**base, "regularity": 0.0}), 3, 7, 1)
    assert rng.random() == random.Random(0).random()


# --------------------------------------------------------------------------- what the store knows


def _entry(eid, scene, facts, *, prefs=(), quest="q9", objective="Put Mug_0 on Table_0."):
    """A store entry (validated) of scene ``scene`` that saw ``facts``."""
    by_type = {"user_preference": list(prefs), "spatial": [], "procedural": [], "general": []}
    return EpisodicMemoryEntryV1_1.model_validate({
        "entry_id": eid, "input_signature": SignatureBuilder().build(objective).model_dump(),
        "case_summary": {"symptom": "goal not reached in 9 turns", "risk_tags": ["goal_not_reached"],
                         "rationale_summary": "no corrective feedback was given"},
        "stage_snapshot": {}, "correction": {"corrected": False, "by_type": by_type},
        "evaluation": {"won": False, "final_reward": 0.0, "num_turns": 9, "num_invalid": 0},
        "provenance": {"episode_id": eid, "scene_id": scene, "quest_id": quest},
        "scene_facts": list(facts)}).model_dump(mode="json")


ENTRIES = [
    _entry("a1", "s0", ["Apple_2 was in Fridge_0 in the Kitchen", "Drawer_1 in the Kitchen was empty"],
           prefs=[preference_text("close_containers") + " (Drawer_1 left open in the Kitchen.)"]),
    _entry("a2", "s0", ["Key_1 was in Drawer_3 in the Bedroom", "Apple_2 was in Fridge_0 in the Kitchen",
                        "Chest_2 in the Bedroom is locked (Key_1 unlocks it)"]),
    _entry("b1", "s1", ["Apple_0 was in Fridge_0 in the Kitchen", "Key_4 was in Drawer_1 in the Office",
                        "Mug_2 was on Table_0 in the Office"],
           prefs=[preference_text("lock_after_use", "Cabinet_3")]),
    _entry("c1", "s2", ["Apple_5 was in Fridge_0 in the Kitchen", "Key_0 was in Drawer_2 in the Kitchen",
                        "Mug_1 was in Cabinet_1 in the Kitchen"], prefs=[preference_text("close_containers")]),
]


def test_the_store_knows_a_house_over_all_its_visits_and_lessons_in_kinds():
    know = StoreKnowledge.from_entries(ENTRIES, HOUSEHOLD)
    assert know.visits == {"s0": 2, "s1": 1, "s2": 1}
    # every fact of both visits, once; places and locks before empty containers
    assert know.house_facts("s0") == ["Apple_2 was in Fridge_0 in the Kitchen", "Key_1 was in Drawer_3 in the Bedroom",
                                      "Chest_2 in the Bedroom is locked (Key_1 unlocks it)",
                                      "Drawer_1 in the Kitchen was empty"]
    assert know.house_facts("s9") == []
    lessons = know.lessons()
    assert Lesson("Apple", "Fridge", 3, 3) in lessons and Lesson("Key", "Drawer", 3, 3) in lessons
    assert not any(lesson.thing == "Mug" for lesson in lessons)  # on a Table once, in a Cabinet once: no majority
    assert know.unlocking_kinds() == {"Key"}
    # the houses' own wording of a habit, generalised by the world (any container)
    assert know.habits() == [(preference_text("close_containers"), 2, 3), (habit_text("lock_after_use"), 1, 3)]
    assert know.lessons(exclude="s0") == [Lesson("Apple", "Fridge", 2, 2), Lesson("Key", "Drawer", 2, 2)]


def test_lessons_and_habits_read_back_as_what_they_state():
    lessons = [Lesson("Apple", "Fridge", 5, 6), Lesson("Mug", "Table", 2, 3, "on"), Lesson("metal pot", "cupboard", 2, 2)]
    text = "Lessons from 6 past houses: " + "; ".join(lesson.text() for lesson in lessons) + "."
    assert read_lessons(text) == lessons
    for kind in ("close_containers", "keep_closed", "lock_after_use"):  # a general preference: no target
        assert read_statements(habit_text(kind)) == (fact("prefer", kind),)
    assert HOUSEHOLD.sentence(fact("prefer", "keep_closed")) == habit_text("keep_closed")
    assert HOUSEHOLD.kind("Cabinet_12") == "Cabinet" and HOUSEHOLD.kind("Kitchen") is None


# The one regex read_lessons used before issue 66: cubic on a long run of "Apple in a ".
FORMER_LESSON_RE = r"\b([A-Za-z][A-Za-z ]*?) (in|on) an? ([A-Za-z][A-Za-z ]*?) \((\d+) of (\d+) seen\)"


@pytest.mark.timeout(20)  # the former regex took ~8 min on these lines (1.24 s on 200 repeats, cubic)
@pytest.mark.parametrize("line", [
    "Apple in a " * 2000,
    "Apple in a " * 2000 + "Fridge (1 of 2 seen)",
    "a in an " * 2000 + "b (1 of 2 seen)",
    "Mug on a Table (2 of 3 seen); " * 2000,
], ids=["no-support", "one-lesson", "an", "many-lessons"])
def test_reading_lessons_takes_linear_time_on_a_hostile_line(line):
    """The reader reads the lessons of its whole prompt, feedback a person typed included (issue 66, finding 7)."""
    import time

    t0 = time.perf_counter()
    lessons = read_lessons(line)
    # A bound on the complexity, not a speed claim: linear is milliseconds here, the cubic regex minutes.
    assert time.perf_counter() - t0 < 1.0
    assert len(lessons) == line.count(" seen)")


def test_a_lesson_with_a_count_int_refuses_is_skipped_not_raised():
    """Typed feedback "Apple in a Fridge (<5,000 digits> of 9 seen)": int() refuses past 4,300 digits."""
    huge = "9" * 5000
    line = f"Apple in a Fridge ({huge} of {huge} seen). Mug on a Table (2 of 3 seen)."
    assert [(l.thing, l.holder, l.count, l.total) for l in read_lessons(line)] == [("Mug", "Table", 2, 3)]


def test_reading_lessons_finds_what_the_former_regex_found():
    """Every group of every match, on lines built to hit the edges: links that overlap or follow one another
    ("in a in a"), "an", doubled spaces, word characters the class leaves out (Key_1, é, 3) before a thing,
    a support without its space or bracket, zero and inverted counts, digits of other scripts."""
    import re

    from pipeline.memory.knowledge import _lesson_matches

    former = re.compile(FORMER_LESSON_RE)
    words = ["Apple", "metal pot", "a", "an", "in", "on", "Fridge", "x", "Key_1", "é", "3", "_", "ın", "Ａ"]
    seps = [" ", "  ", " in a ", " in an ", " on a ", " on an ", "; ", ": ", ". ", "(", ")", "", "\n"]
    supports = [" (5 of 6 seen)", " (2 of 2 seen)", "(3 of 4 seen)", " (12 of 3 seen)", " (0 of 1 seen)",
                " (1 of 2 seen", "  (1 of 2 seen)", " (٣ of ٤ seen)"]
    rng = random.Random(66)
    matched = 0
    for _ in range(20_000):
        parts = []
        for _ in range(rng.randint(1, 8)):
            parts += [rng.choice(words), rng.choice(seps)] + ([rng.choice(supports)] if rng.random() < 0.3 else [])
        line = "".join(parts)
        expected = [m.groups() for m in former.finditer(line)]
        assert list(_lesson_matches(line)) == expected, line
        matched += len(expected)
    assert matched > 500  # the lines do hold lessons
    text = "Lessons from 6 past houses: Apple in a Fridge (5 of 6 seen); Mug on a Table (2 of 3 seen)."
    assert [(m[1], m[3], int(m[4]), int(m[5]), m[2]) for m in former.finditer(text)] == \
        [(x.thing, x.holder, x.count, x.total, x.prep) for x in read_lessons(text)]


def test_relevant_first_keeps_order_otherwise():
    items = ["Key_1 was in Drawer_3", "Apple_2 was in Fridge_0", "Mug_2 was on Table_0", "apple in a Fridge (2 of 2 seen)"]
    assert relevant_first(items, ["apple_2", "apple"]) == [items[1], items[3], items[0], items[2]]


# --------------------------------------------------------------------------- what an advisory recalls


def _bundle(entries, recall):
    advisories, _ = AdvisoryBuilder(max_message_chars=800).build_many([(e, 0.9) for e in entries], recall=recall)
    return [a.message for a in advisories]


def test_an_advisory_states_its_own_house_not_another_and_nothing_twice():
    know = StoreKnowledge.from_entries(ENTRIES, HOUSEHOLD)
    words = ["apple_2", "Apple"]
    msgs = _bundle([ENTRIES[1], ENTRIES[0], ENTRIES[2]], Recall(know, "s0", words, house=True, lessons=True))
    assert msgs[0].index("This house, from 2 past visits: Apple_2 was in Fridge_0 in the Kitchen") > 0
    stated = [f for f in know.house_facts("s0") if any(f in m for m in msgs)]
    assert stated == know.house_facts("s0") and all(sum(f in m for m in msgs) == 1 for f in stated)
    assert not any("Apple_0 was in" in m or "Key_4 was in" in m for m in msgs)  # s1's facts do not hold in s0
    assert any("Apple in a Fridge (3 of 3 seen)" in m for m in msgs)
    # a house visited before: its own user's word is in the grounding, other houses' habits are not said
    assert not any("What users asked in past houses" in m for m in msgs)


def test_a_house_never_visited_gets_lessons_and_habits_only():
    know = StoreKnowledge.from_entries(ENTRIES, HOUSEHOLD)
    msgs = _bundle(ENTRIES[:3], Recall(know, "s7", ["mug_4", "Mug"], house=True, lessons=True))
    joined = " ".join(msgs)
    assert "This house" not in joined and "Lessons from 3 past houses" in joined
    assert read_lessons(joined) and {fact("prefer", "close_containers"), fact("prefer", "lock_after_use")} <= \
        {f for f in HOUSEHOLD.read_text(joined)}


def test_the_placebos_recall_says_nothing_about_this_tasks_kinds():
    know = StoreKnowledge.from_entries(ENTRIES + [_entry("d1", "s3", ["Mug_3 was in Cabinet_0 in the Office"]),
                                                  _entry("d2", "s4", ["Mug_0 was in Cabinet_2 in the Bedroom"])],
                                       HOUSEHOLD)
    msgs = _bundle([ENTRIES[2]], Recall(know, "s0", ["apple_2", "Apple"], house=True, lessons=True, unrelated=True))
    joined = " ".join(msgs)
    lessons = read_lessons(joined)
    assert lessons and all(lesson.thing not in ("Apple", "Key") for lesson in lessons)  # Mug in a Cabinet only
    assert not [f for f in HOUSEHOLD.read_text(joined) if f.pred == "prefer"]  # no habit
    assert "This house, from 1 past visit: Apple_0 was in Fridge_0" in joined  # another house, said as this one


def test_recalled_facts_never_name_the_tasks_answer():
    know = StoreKnowledge.from_entries(ENTRIES, HOUSEHOLD)
    plan = ["go west", "open Fridge_0", "take Apple_2 from Fridge_0", "go east", "put Apple_2 on Table_0"]
    for msg in _bundle(ENTRIES, Recall(know, "s0", ["apple_2", "Apple"], house=True, lessons=True)):
        assert find_label_hints(msg, expert_plan=plan, ground_truth=" ; ".join(plan)) == []


# --------------------------------------------------------------------------- retrieval


def test_the_agents_own_house_ranks_first_and_the_index_agrees_with_the_loop():
    entries = []
    for i, scene in enumerate(["s1", "s1", "s0", "s2", "s0"]):
        e = _entry(f"e{i}", scene, [], objective="Put Apple_2 in Fridge_0.")
        if scene != "s0":  # lexically the s0 entries are the weakest
            e["case_summary"]["rationale_summary"] = "Apple_2 was in Fridge_0 in the Kitchen"
        entries.append(e)
    sig = SignatureBuilder().build("Put Apple_2 in Fridge_0 and close it.")
    for first in (False, True):
        hits = Retriever(same_scene_first=first, tie_seed=3).retrieve_scored(
            entries, sig, "Put Apple_2 in Fridge_0 and close it.", 3, query_scene_id="s0", query_quest_id="q0")
        loop = retrieve_loop(entries, sig, "Put Apple_2 in Fridge_0 and close it.", 3, query_scene_id="s0",
                             query_quest_id="q0", tie_seed=3, same_scene_first=first)
        assert [h.entry["entry_id"] for h in hits] == [eid for eid, _, _ in loop]
        scenes = [h.entry["provenance"]["scene_id"] for h in hits]
        assert (scenes[:2] == ["s0", "s0"]) == first


# --------------------------------------------------------------------------- the reader


def test_the_reader_takes_lessons_as_priors_and_habits_as_preferences():
    prompt = ("- message: ... Lessons from 4 past houses: Apple in a Fridge (3 of 4 seen); Key in a Drawer (2 of 2 seen).\n"
              f"  What users asked in past houses: {habit_text('lock_after_use')} (2 of 4 houses)")
    beliefs = read_prompt(prompt, HOUSEHOLD)
    assert beliefs.usual_holders("apple") == ["Fridge"] and beliefs.usual_holders("key") == ["Drawer"]
    assert beliefs.usual_holders("Mug") == []
    assert beliefs.prefers("lock_after_use", "Chest_7") and not beliefs.prefers("close_containers")


# --------------------------------------------------------------------------- experience and statistics


def test_the_first_k_episodes_of_each_scene():
    eps = [{"episode_id": f"ep_{s}_{q}", "scene_id": s, "quest_id": q} for s in ("s0", "s1") for q in ("q16", "q14", "q15")]
    assert first_episodes(eps, 0) == []
    assert first_episodes(eps, 2) == ["ep_s0_q14", "ep_s0_q15", "ep_s1_q14", "ep_s1_q15"]
    assert len(first_episodes(eps, 9)) == 6
    with pytest.raises(ValueError, match="k=-1"):
        first_episodes(eps, -1)


def test_wilcoxon_on_paired_turns():
    same = wilcoxon_paired([5, 6, 7], [5, 6, 7])
    assert same["nonzero"] == 0 and same["p_value"] == 1.0
    fewer = wilcoxon_paired([5, 6, 7, 4, 6, 5, 3, 6, 5, 4], [9, 9, 10, 8, 9, 12, 8, 9, 10, 9])
    assert fewer["diff"] < 0 and fewer["p_value"] < 0.01
    from scipy.stats import wilcoxon  # the reference

    assert fewer["p_value"] == pytest.approx(wilcoxon([a - b for a, b in zip([5, 6, 7, 4, 6, 5, 3, 6, 5, 4],
                                                                             [9, 9, 10, 8, 9, 12, 8, 9, 10, 9])]).pvalue)


# --------------------------------------------------------------------------- the default run


def _render_hints(condition: str) -> dict:
    report = json.loads((ROOT / "metrics" / "render.json").read_text(encoding="utf-8"))["conditions"][condition]
    assert report["tasks"] > 0
    return report["label_hints"]


def test_the_default_runs_controls_reveal_no_answer_and_the_oracle_every_one():
    """The default run's render metrics (committed): no C1, C2_silent or C2_placebo memory block
    names its task's answer; C2_oracle's names it in every prompt (on purpose)."""
    for c in ("C1", "C2_silent", "C2_placebo"):
        assert _render_hints(c)["memory"] == 0, (c, _render_hints(c))
    oracle = _render_hints("C2_oracle")
    assert oracle["memory"] == oracle["prompts"] > 0


def test_no_c2_memory_block_of_the_default_run_names_its_tasks_answer():
    """The default run's render metrics (committed): C2's memory blocks reveal no task's answer.

    The gate reads a block's advisories together (``memory.advisory.bundle_label_hints``):
    before it did, two advisories that each named one of a plan's commands could add up to a
    block that named two (5 blocks of 204 in the run of issue 42, 9 in an AVX2 rerun)."""
    assert _render_hints("C2")["memory"] == 0, _render_hints("C2")


def test_curves_are_summarised_paired_per_k():
    from pipeline.analysis.curves import curve_csv, summarise_curves

    rows = []
    for k in (0, 2):
        for i in range(12):
            for cond, won in (("C0", i < 3), ("C1", i < 4), ("C2", i < (4 if k == 0 else 10))):
                rows.append({"agent": "reader", "k": k, "held": k, "condition": cond, "scene_id": f"s{i % 3}",
                             "quest_id": f"q{i}", "scene_split": "seen" if i % 3 else "heldout", "success": won,
                             "turns": 9 if won and cond == "C2" and k else 12})
    summary = summarise_curves(rows, n_resamples=200, level=0.95, seed=0)
    at2 = {(p["treatment"], p["control"]): p for p in summary["paired"] if p["k"] == 2}
    assert at2[("C2", "C1")]["success"]["table"] == {"both": 4, "b": 6, "c": 0, "neither": 2}
    assert at2[("C2", "C1")]["success"]["p_value"] == pytest.approx(2 * 0.5 ** 6)
    assert at2[("C2", "C1")]["turns"]["diff"] < 0 and at2[("C2", "C1")]["turns"]["nonzero"] == 10
    at0 = {(p["treatment"], p["control"]): p for p in summary["paired"] if p["k"] == 0}
    assert at0[("C2", "C1")]["success"]["diff"]["value"] == 0
    assert ("C2", "C2_placebo") not in at0  # a comparison whose condition was not played is left out
    point = next(p for p in summary["points"] if (p["k"], p["condition"]) == (2, "C2"))
    assert point["success"] == pytest.approx(10 / 12) and set(point["by_split"]) == {"seen", "heldout"}
    assert curve_csv(rows, agent="reader", value="success", conditions=["C0", "C1", "C2"]).splitlines() == [
        "k,C0,C1,C2", "0,0.2500,0.3333,0.3333", "2,0.2500,0.3333,0.8333"]


def test_the_design_study_summarises_each_point_at_its_largest_k():
    from pipeline.session.experience import CurvePoint, Outcome
    from pipeline.tools.design import summarise, summary_csv

    def point(k, cond, wins):
        return CurvePoint(k, k, cond, tuple(Outcome("s0", f"q{i}", "seen", i < wins, 10) for i in range(10)), 0)

    rows = summarise([point(0, "C1", 2), point(4, "C0", 1), point(4, "C1", 5), point(4, "C2", 8)], "quiet", 1000)
    assert {(r["k"], r["condition"], r["split"]) for r in rows} >= {(4, "C2", "all"), (4, "C2", "seen")}
    assert summary_csv(rows).splitlines() == ["point,k,C0,C1,C2,C2_placebo,c1_minus_c0,c2_minus_c1",
                                              "quiet,4,0.1,0.5,0.8,,+0.4000,+0.3000"]


def test_a_token_measured_block_length_reaches_the_curve_workers(tmp_path, monkeypatch):
    """A memory block measured in a model's tokens once held a closure over its tokenizer, which
    a spawn pool cannot pickle (the curve stage failed on workers > 1 with the default model):
    a BlockLength pickles as its model directory, and the process that receives it loads that
    tokenizer at its first measure (once) and counts the same tokens."""
    import pickle

    from pipeline.conditions import length as L
    from pipeline.llm.tiny import train_tokenizer

    texts = ["open the fridge", "take the apple from the fridge", "go north"] * 20
    train_tokenizer(texts, vocab_size=300).save_pretrained(tmp_path / "model")
    cfg = SimpleNamespace(agent=SimpleNamespace(name="llm"),
                          model=SimpleNamespace(backend="transformers", name_or_path="model"))
    tokens = L.block_length_for(cfg, tmp_path)
    assert tokens.unit.startswith("tokens") and tokens.model_dir == str(tmp_path / "model")
    text = "take the apple, then close the fridge"
    assert tokens.measure(text) != len(text)

    loads: list[str] = []
    monkeypatch.setattr(L, "_tokenizer", L.functools.lru_cache(maxsize=None)(
        lambda d: loads.append(d) or L._load_tokenizer(d)))
    shipped = pickle.loads(pickle.dumps(tokens))
    assert shipped == tokens and shipped.tokenizer is None  # sent as its directory
    assert shipped.measure(text) == tokens.measure(text) and shipped.measure("") == 0
    shipped.measure("go north")
    assert loads == [str(tmp_path / "model")]  # loaded once, at the first measure
    chars = pickle.loads(pickle.dumps(L.BlockLength()))
    assert chars == L.BlockLength() and chars.measure(text) == len(text)


def test_the_plain_tokenizer_counts_the_ids_transformers_gives_and_is_used_only_where_it_may(tmp_path):
    """Blocks are measured with the `tokenizers` file itself where transformers would load it as a
    generic fast tokenizer (no torch import): the same ids as transformers' for the committed
    checkpoint, on the prompt templates, memory-like lines and random text; another tokenizer class,
    or a config token the file lacks, is left to transformers."""
    import shutil

    from transformers import AutoTokenizer

    from pipeline.conditions import length as L

    model = ROOT / "models" / "policy"
    plain, full = L._plain_tokenizer(str(model)), AutoTokenizer.from_pretrained(str(model))
    assert isinstance(plain, L.PlainTokenizer) and len(plain) == len(full)
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _.,;:!?'\"-\n\té€→<>|"
    texts = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "conf" / "templates").rglob("*")) if p.is_file()]
    texts += ["This house, from 2 past visits: Apple_2 was in Chest_3.\n- take Key_2 from Cabinet_31; open Fridge_0",
              "<|im_start|>user\nopen the fridge<|im_end|>", "", "  \n\n  "]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))) for _ in range(300)]
    for text in texts:
        for special in (False, True):
            assert plain(text, add_special_tokens=special)["input_ids"] == \
                full(text, add_special_tokens=special)["input_ids"], (text[:80], special)
    assert L._token_unit(plain) == L._token_unit(full)

    other = tmp_path / "other"
    shutil.copytree(model, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizerFast"}))
    assert L._plain_tokenizer(str(other)) is None  # a model-specific class: transformers loads it
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": "<|not_in_the_file|>"}))
    assert L._plain_tokenizer(str(other)) is None  # transformers would add a token the file lacks
    (other / "tokenizer.json").unlink()
    assert L._plain_tokenizer(str(other)) is None


def test_a_quests_own_past_episode_is_not_memory_of_the_house():
    """``memory.exclude_same_quest`` holds for the house's facts, visits and lessons as for retrieval (issue 64):
    a train quest's demonstration prompt stated where its own past episode found the target (a fault-injection
    probe: "This house, from 2 past visits: Apple_2 was in Chest_3" where only the excluded episode saw it),
    which an eval prompt, whose quest is never in the store, never can."""
    from omegaconf import OmegaConf

    from pipeline.conditions import memory_slot
    from pipeline.core.conf_schema import ConditionConfig, MemoryConfig
    from pipeline.memory.store import EpisodicStore

    own = ["Apple_2 was in Chest_3 in the Bedroom"]
    entries = [_entry("a1", "s0", ["Key_1 was in Drawer_3 in the Bedroom"], quest="q1", objective="Put Apple_2 on Table_0."),
               _entry("a2", "s0", ["Mug_0 was on Table_0 in the Kitchen"], quest="q2", objective="Put Apple_2 on Table_0."),
               _entry("a3", "s0", own, quest="q3", objective="Put Apple_2 on Table_0.")]
    store = EpisodicStore.from_entries(entries, tie_seed=0)
    task = {"scene_id": "s0", "quest_id": "q3", "objective": "Put Apple_2 on Table_0.", "expert_plan": ["go east"]}
    root = Path(__file__).resolve().parents[1]
    section = OmegaConf.merge(OmegaConf.structured(ConditionConfig), OmegaConf.load(root / "conf/condition/C2.yaml")["C2"])

    def block(exclude: bool) -> str:
        memory = OmegaConf.merge(OmegaConf.structured(MemoryConfig), {"facts": "house", "lessons": True,
                                                                      "exclude_same_quest": exclude})
        return memory_slot(store, task, section, memory, rng=0, facts=HOUSEHOLD).injected_block_text

    kept, leaked = block(True), block(False)
    assert "from 2 past visits" in kept and "Key_1 was in Drawer_3" in kept and "Chest_3" not in kept
    assert "from 3 past visits" in leaked and "Apple_2 was in Chest_3" in leaked  # the check can fail
    # another quest of the house is told what q3's episode saw: it is a past visit for that quest
    other = memory_slot(store, {**task, "quest_id": "q4"}, section,
                        OmegaConf.merge(OmegaConf.structured(MemoryConfig), {"facts": "house"}), rng=0,
                        facts=HOUSEHOLD).injected_block_text
    assert "from 3 past visits" in other and "Apple_2 was in Chest_3" in other
