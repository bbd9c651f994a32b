"""Seed 001 models, retrieval, advisories, injection (section 2.4), the gate and the placebo."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from pydantic import ValidationError

from pipeline.core.conf_schema import ConditionConfig, MemoryConfig
from pipeline.core.config import ConfigError
from pipeline.conditions import memory_slot, source_for
from pipeline.conditions.placebo import draw_from_other_scenes, match_block_length
from pipeline.memory.advisory import named_plan_commands
from pipeline.memory import (
    AdvisoryBuilder,
    AdvisoryBundleMetaV1_1,
    AdvisoryBundleV1_1,
    AdvisoryConstraintsV1_1,
    AdvisoryV1_1,
    EpisodicMemoryEntryV1_1,
    EpisodicStore,
    EvidenceV1_1,
    InjectionController,
    InputSignatureV1_1,
    Retriever,
    SignatureBuilder,
    Exposure,
    check_exposure,
    entries_to_table,
    bundle_label_hints,
    find_label_hints,
    merge_slot,
    retrieve_loop,
    should_inject_advisory_with_reason,
)

ROOT = Path(__file__).resolve().parents[1]


def make_entry(
    eid: str,
    *,
    scene: str = "s0",
    quest: str = "q0",
    language: str = "en",
    structure: tuple[str, ...] = ("none",),
    negation: bool | None = False,
    aspects: int = 2,
    bucket: str = "short",
    symptom: str = "1 inadmissible action (first: pick_up Apple_2)",
    rationale: str = "feedback applied (procedural: open Fridge_0 first); then the goal was reached in 4 turns",
    won: bool = True,
    corrected: bool = True,
    tags: tuple[str, ...] = ("invalid_action", "feedback_procedural"),
) -> EpisodicMemoryEntryV1_1:
    return EpisodicMemoryEntryV1_1.model_validate({
        "entry_id": f"mem_{eid}",
        "input_signature": {"language": language, "detected_structure": list(structure), "contrast_marker": None,
                            "has_negation": negation, "num_aspects": aspects, "length_bucket": bucket},
        "case_summary": {"symptom": symptom, "rationale_summary": rationale, "risk_tags": list(tags)},
        "stage_snapshot": {"first_actions": ["pick_up Apple_2"], "first_reasoning": None},
        "correction": {"corrected": corrected, "first_correction_turn": 0 if corrected else None,
                       "num_feedback_lines": 1, "by_type": {"procedural": ["open Fridge_0 first"]}},
        "evaluation": {"won": won, "is_correct": won, "final_reward": float(won), "num_turns": 4, "num_invalid": 1},
        "provenance": {"episode_id": eid, "scene_id": scene, "quest_id": quest, "split": "train", "agent": "react",
                       "model": "none", "seed": 0, "config_hash": "h"},
    })


def sig(**kw) -> InputSignatureV1_1:
    base = dict(language="en", detected_structure=["none"], contrast_marker=None, has_negation=False,
                num_aspects=2, length_bucket="short")
    return InputSignatureV1_1(**{**base, **kw})


def ids(entries) -> list[str]:
    return [e["entry_id"] for e in entries]


def advisory(i: int = 1, message: str = "Principle: open containers before taking from them.", relevance: float = 0.8):
    return AdvisoryV1_1(advisory_id=f"adv_{i:06d}", advisory_type="successful_override", message=message,
                        strength="strong", relevance_score=relevance,
                        evidence=EvidenceV1_1(source_episode_ids=["ep_a"], principle_id="pr_invalid_action"))


# --------------------------------------------------------------------------- schemas


@pytest.mark.parametrize(
    "model, kwargs, field",
    [
        (AdvisoryV1_1, {"message": "x" * 801}, "message"),
        (AdvisoryV1_1, {"advisory_type": "override"}, "advisory_type"),
        (AdvisoryV1_1, {"strength": "huge"}, "strength"),
        (AdvisoryV1_1, {"relevance_score": 1.5}, "relevance_score"),
        (AdvisoryV1_1, {"advisory_id": "adv_1"}, "advisory_id"),
        (AdvisoryBundleMetaV1_1, {"topk": 4}, "topk"),
        (AdvisoryBundleMetaV1_1, {"topk": -1}, "topk"),
        (AdvisoryBundleMetaV1_1, {"memory_mode": "loud"}, "memory_mode"),
        (AdvisoryBundleV1_1, {"retrieved": "four"}, "retrieved"),
        (AdvisoryBundleV1_1, {"warnings": ["w"] * 6}, "warnings"),
    ],
)
def test_out_of_bound_values_name_the_field(model, kwargs, field):
    adv = advisory().model_dump()
    meta = {"memory_mode": "on", "topk": 3, "masked_injection": False, "retrieval_executed": True}
    base = {AdvisoryV1_1: adv, AdvisoryBundleMetaV1_1: meta,
            AdvisoryBundleV1_1: {"memory_on": True, "retrieved": [adv], "warnings": [], "meta": meta}}[model]
    if kwargs.get("retrieved") == "four":
        kwargs = {"retrieved": [adv] * 4}
    with pytest.raises(ValidationError) as err:
        model(**{**base, **kwargs})
    assert field in str(err.value)


def test_message_of_800_characters_is_allowed():
    assert len(advisory(message="x" * 800).message) == 800


def test_constraints_are_always_true():
    assert AdvisoryConstraintsV1_1().model_dump() == {"no_label_hint": True, "no_forcing": True,
                                                      "no_confidence_boost": True}
    with pytest.raises(ValidationError, match="no_forcing"):
        AdvisoryConstraintsV1_1(no_forcing=False)


def test_bundle_memory_on_must_match_mode_and_mask():
    meta = AdvisoryBundleMetaV1_1(memory_mode="silent", topk=3, masked_injection=True, retrieval_executed=True)
    with pytest.raises(ValidationError, match="memory_on"):
        AdvisoryBundleV1_1(memory_on=True, meta=meta)
    with pytest.raises(ValidationError, match="retrieved must be empty"):
        AdvisoryBundleV1_1(memory_on=False, retrieved=[advisory()], meta=meta)


def test_entry_forbids_raw_text_and_round_trips_through_arrow():
    e = make_entry("ep_a")
    with pytest.raises(ValidationError, match="objective"):
        EpisodicMemoryEntryV1_1(**e.model_dump(), objective="Put Apple_2 in Fridge_0")
    store = EpisodicStore.from_entries([e])
    assert store.entries() == [e.model_dump()]


# --------------------------------------------------------------------------- retrieval


def test_same_language_filter():
    entries = [make_entry("en"), make_entry("ko", language="ko")]
    assert ids(Retriever().retrieve(entries, sig(), topk=3)) == ["mem_en"]
    both = Retriever(require_same_language=False).retrieve(entries, sig(), topk=3)
    assert ids(both) == ["mem_en", "mem_ko"]  # the language match still scores first


def test_structure_overlap_filter():
    entries = [
        make_entry("shared", structure=("negation", "contrast")),
        make_entry("none", structure=("none",)),
        make_entry("disjoint", structure=("irony",)),
    ]
    q = sig(detected_structure=["negation"], has_negation=True)
    assert set(ids(Retriever().retrieve(entries, q, topk=3))) == {"mem_shared", "mem_none"}
    assert set(ids(Retriever(require_structure_overlap=False).retrieve(entries, q, topk=3))) == {
        "mem_shared", "mem_none", "mem_disjoint"}
    # A query whose structure is `none` keeps entries with `none` only (seed: overlap or entry none).
    assert ids(Retriever().retrieve(entries, sig(), topk=3)) == ["mem_none"]


def test_score_order_signature_first_then_lexical():
    q = sig(num_aspects=2, length_bucket="short")
    entries = [
        make_entry("sig5_lex0", symptom="nothing relevant", rationale="nothing relevant"),
        make_entry("sig4_lex_all", aspects=3, symptom="Apple_2 Fridge_0", rationale="put"),
        make_entry("sig5_lex_half", symptom="Apple_2 here", rationale="other words"),
        make_entry("sig3", aspects=5, bucket="long"),
    ]
    hits = Retriever().retrieve_scored(entries, q, query_lexical="Put Apple_2 in Fridge_0", topk=3)
    assert [h.entry["entry_id"] for h in hits] == ["mem_sig5_lex_half", "mem_sig5_lex0", "mem_sig4_lex_all"]
    assert [h.signature_matches for h in hits] == [5, 5, 4]
    assert hits[0].lexical_overlap == pytest.approx(1 / 3)
    assert hits[2].lexical_overlap == pytest.approx(1.0)
    assert all(0 <= h.relevance <= 1 for h in hits)
    assert hits[0].relevance > hits[1].relevance


def test_lexical_score_is_zero_without_query_lexical():
    entries = [make_entry("a", symptom="Apple_2"), make_entry("b")]
    hits = Retriever().retrieve_scored(entries, sig(), topk=2)
    assert [h.lexical_overlap for h in hits] == [0.0, 0.0]
    assert ids(h.entry for h in hits) == ["mem_a", "mem_b"]  # tie: entry_id order


@pytest.mark.parametrize("topk", [0, 4, -1, 1.5, True])
def test_topk_out_of_range_is_an_error(topk):
    with pytest.raises(ValueError, match="topk"):
        Retriever().retrieve([make_entry("a")], sig(), topk=topk)


def test_topk_bounds_the_result():
    entries = [make_entry(f"e{i}", quest=f"q{i}") for i in range(5)]
    for k in (1, 2, 3):
        assert len(Retriever().retrieve(entries, sig(), topk=k)) == k


def test_ties_are_deterministic_and_independent_of_row_order():
    entries = [make_entry(f"e{i:02d}", quest=f"q{i}") for i in range(20)]  # all tie
    by_id = ids(Retriever().retrieve(entries, sig(), topk=3))
    assert by_id == ["mem_e00", "mem_e01", "mem_e02"]
    seeded = [ids(Retriever(tie_seed=7).retrieve(random.Random(k).sample(entries, 20), sig(), topk=3))
              for k in range(5)]
    assert all(s == seeded[0] for s in seeded)
    others = {tuple(ids(Retriever(tie_seed=s).retrieve(entries, sig(), topk=3))) for s in range(6)}
    assert len(others) > 1  # the seed really drives the tie order


def test_same_quest_is_excluded_and_same_scene_optionally():
    entries = [make_entry("own", scene="s0", quest="q1"), make_entry("sibling", scene="s0", quest="q2"),
               make_entry("other_scene_same_quest_id", scene="s1", quest="q1")]
    got = ids(Retriever().retrieve(entries, sig(), topk=3, query_scene_id="s0", query_quest_id="q1"))
    assert got == ["mem_other_scene_same_quest_id", "mem_sibling"]
    got = ids(Retriever(exclude_same_scene=True).retrieve(entries, sig(), topk=3, query_scene_id="s0",
                                                          query_quest_id="q1"))
    assert got == ["mem_other_scene_same_quest_id"]
    got = ids(Retriever(exclude_same_quest=False).retrieve(entries, sig(), topk=3, query_scene_id="s0",
                                                           query_quest_id="q1"))
    assert "mem_own" in got


def test_every_store_form_gives_the_same_result():
    entries = [make_entry(f"e{i}", quest=f"q{i}", aspects=i % 3) for i in range(8)]
    r = Retriever(tie_seed=3)
    store = EpisodicStore.from_entries(entries, tie_seed=3)
    forms = [entries, [e.model_dump() for e in entries], entries_to_table(entries), store, store.index]
    results = [ids(r.retrieve(f, sig(), "Apple_2", topk=3)) for f in forms]
    assert all(x == results[0] for x in results)


def test_an_index_pickles_for_a_spawned_worker_and_searches_the_same():
    import pickle

    entries = [make_entry(f"e{i}", quest=f"q{i}", aspects=i % 3, symptom=f"open Fridge_{i % 2}") for i in range(8)]
    store = EpisodicStore.from_entries(entries, tie_seed=3)
    copy = pickle.loads(pickle.dumps(store.index))  # a threading.Lock alone cannot be pickled
    assert copy._lock is not store.index._lock and not copy._lock.locked()
    r = Retriever(tie_seed=3)
    for text in ("Apple_2", "open Fridge_1", None):
        assert ids(r.retrieve(copy, sig(), text, topk=3)) == ids(r.retrieve(store.index, sig(), text, topk=3))


def _random_entries(rng: random.Random, n: int) -> list[EpisodicMemoryEntryV1_1]:
    words = ["apple_2", "fridge_0", "open", "key_1", "drawer_1", "locked", "repeat", "goal", "사과", "냉장고"]
    out = []
    for i in range(n):
        structure = tuple(s for s in ("negation", "contrast", "irony") if rng.random() < 0.3) or ("none",)
        out.append(make_entry(
            f"r{i:03d}", scene=f"s{rng.randrange(3)}", quest=f"q{rng.randrange(4)}",
            language=rng.choice(["en", "ko", "other"]), structure=structure,
            negation=rng.choice([True, False, None]), aspects=rng.randrange(3),
            bucket=rng.choice(["short", "medium", "long"]),
            symptom=" ".join(rng.sample(words, 3)), rationale=" ".join(rng.sample(words, 2))))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_vectorised_index_agrees_with_the_per_entry_loop(seed):
    rng = random.Random(seed)
    entries = _random_entries(rng, rng.randrange(1, 60))
    dicts = [e.model_dump() for e in entries]
    q = sig(language=rng.choice(["en", "ko"]), detected_structure=rng.choice([["none"], ["negation"], ["contrast", "irony"]]),
            has_negation=rng.choice([True, False]), num_aspects=rng.randrange(3), length_bucket=rng.choice(["short", "long"]))
    lexical = rng.choice([None, "open Fridge_0 with Key_1", "사과 냉장고"])
    same_lang, overlap, scene_excl = rng.random() < 0.7, rng.random() < 0.7, rng.random() < 0.3
    r = Retriever(require_same_language=same_lang, require_structure_overlap=overlap,
                  exclude_same_scene=scene_excl, tie_seed=seed)
    k = rng.randrange(1, 4)
    hits = r.retrieve_scored(entries, q, lexical, k, query_scene_id="s1", query_quest_id="q2")
    ref = retrieve_loop(dicts, q, lexical, k, require_same_language=same_lang, require_structure_overlap=overlap,
                        query_scene_id="s1", query_quest_id="q2", exclude_same_scene=scene_excl, tie_seed=seed)
    assert [(h.entry["entry_id"], h.signature_matches) for h in hits] == [(e, m) for e, m, _ in ref]
    assert [h.lexical_overlap for h in hits] == pytest.approx([lex for *_, lex in ref])


# --------------------------------------------------------------------------- advisories


@pytest.mark.parametrize(
    "won, corrected, adv_type, lead",
    [(True, True, "successful_override", "Principle:"), (False, True, "failed_override_warning", "Warning:"),
     (True, False, "consistency_anchor", "Principle:"), (False, False, "failed_override_warning", "Warning:")],
)
def test_each_advisory_type(won, corrected, adv_type, lead):
    adv = AdvisoryBuilder().build(make_entry("ep_x", won=won, corrected=corrected), 0.9)
    assert adv.advisory_type == adv_type
    assert adv.message.startswith(lead)
    assert adv.evidence.source_episode_ids == ["ep_x"]
    assert adv.evidence.principle_id == "pr_invalid_action"
    assert adv.constraints == AdvisoryConstraintsV1_1()
    assert adv.strength == ("moderate" if adv_type == "failed_override_warning" else "strong")


def test_ids_count_up_and_strength_follows_relevance():
    b = AdvisoryBuilder()
    advs = [b.build(make_entry("a"), r) for r in (0.9, 0.5, 0.1)]
    assert [a.advisory_id for a in advs] == ["adv_000001", "adv_000002", "adv_000003"]
    assert [a.strength for a in advs] == ["strong", "moderate", "weak"]
    assert AdvisoryBuilder().build(make_entry("a"), 7.0).relevance_score == 1.0


def test_message_is_bounded_by_800_characters_and_by_config():
    long = make_entry("a", symptom="s " * 299, rationale="r " * 299)
    assert len(AdvisoryBuilder().build(long, 0.5).message) <= 800
    short = AdvisoryBuilder(max_message_chars=120).build(long, 0.5).message
    assert len(short) <= 120 and short.endswith("…")
    with pytest.raises(ValueError, match="max_message_chars"):
        AdvisoryBuilder(max_message_chars=801)


PLAN = ["open fridge_0", "take apple_2 from counter_0", "put apple_2 in fridge_0", "close fridge_0"]


@pytest.mark.parametrize(
    "message, plan, gt, hinted",
    [
        ("Open Fridge_0, then take apple_2 from Counter_0.", PLAN, None, True),  # two expert commands
        ("Remember to open fridge_0.", PLAN, None, False),  # one of four: a principle, not the walkthrough
        ("Remember to open fridge_0.", ["open fridge_0"], None, True),  # the whole (one-command) plan
        ("Answer: open fridge_0 ; close fridge_0", [], "open fridge_0 ; close fridge_0", True),  # ground truth
        ("Look around first, take stock of your inventory.", ["look", "inventory"], None, False),
        ("Open containers before taking from them.", PLAN, "put apple_2 in fridge_0", False),
        ("reopen fridge_01 now", ["open fridge_0"], None, False),  # whole phrases only
        # Navigation is the scene's map, which memory may carry; object commands are the answer.
        ("From the Office, go west; from the Kitchen, go north.", ["go west", "go north", "take cup_3"], None, False),
        ("go west, then take cup_3 and drop cup_3", ["go west", "take cup_3", "drop cup_3"], None, True),
    ],
)
def test_label_hint_detection(message, plan, gt, hinted):
    assert bool(find_label_hints(message, ground_truth=gt, expert_plan=plan)) is hinted


def test_label_hinted_advisory_is_dropped_with_a_warning_that_does_not_repeat_it():
    leaky = make_entry("leak", rationale="feedback applied (procedural: open fridge_0 then put apple_2 in fridge_0)")
    clean = make_entry("clean", rationale="feedback applied (procedural: containers open first)")
    advs, warnings = AdvisoryBuilder().build_many([(leaky.model_dump(), 0.9), (clean.model_dump(), 0.5)],
                                                  query_expert_plan=PLAN)
    assert [a.evidence.source_episode_ids for a in advs] == [["clean"]]
    assert advs[0].advisory_id == "adv_000002"
    assert len(warnings) == 1 and warnings[0].startswith("label_hint: adv_000001 from leak dropped")
    assert "fridge_0" not in warnings[0]


def test_advisories_that_name_the_answer_only_together_are_not_kept_together():
    """Each message names one of the plan's four object commands (no hint alone); read
    together they name two, a hint at min_commands=2. The more relevant one is kept."""
    first = make_entry("first", rationale="feedback applied (procedural: open fridge_0 first)")
    second = make_entry("second", rationale="feedback applied (procedural: put apple_2 in fridge_0 last)")
    clean = make_entry("clean", rationale="feedback applied (procedural: containers open first)")
    hits = [(first.model_dump(), 0.9), (second.model_dump(), 0.7), (clean.model_dump(), 0.5)]
    alone = [a.message for a in AdvisoryBuilder().build_many(hits)[0]]
    assert len(alone) == 3 and not any(find_label_hints(m, expert_plan=PLAN) for m in alone)
    assert bundle_label_hints(alone, expert_plan=PLAN)  # the case: two advisories add up to a hint
    advs, warnings = AdvisoryBuilder().build_many(hits, query_expert_plan=PLAN)
    assert [a.evidence.source_episode_ids[0] for a in advs] == ["first", "clean"]
    assert warnings == ["label_hint: adv_000002 from second dropped (with the advisories before it)"]
    assert not bundle_label_hints([a.message for a in advs], expert_plan=PLAN)


def test_no_phrase_runs_across_two_advisories_read_together():
    assert not bundle_label_hints(["Then take", "apple_2 from counter_0 and put it away."], expert_plan=PLAN)
    assert bundle_label_hints(["Then open fridge_0.", "Later take apple_2 from counter_0."], expert_plan=PLAN)


# --------------------------------------------------------------------------- injection (seed 001 section 2.4)


def load_condition(name: str) -> ConditionConfig:
    node = OmegaConf.load(ROOT / "conf" / "condition" / f"{name}.yaml")[name]
    return OmegaConf.merge(OmegaConf.structured(ConditionConfig), node)


MEMORY = OmegaConf.structured(MemoryConfig)
TASK = {"scene_id": "s0", "quest_id": "q9", "objective": "Put Apple_2 in Drawer_1",
        "expert_plan": ["take apple_2", "open drawer_1", "put apple_2 in drawer_1"]}


@pytest.fixture(scope="module")
def store() -> EpisodicStore:
    entries = [
        make_entry("s0_a", scene="s0", quest="q1"),
        make_entry("s0_b", scene="s0", quest="q2", won=False, tags=("repeated_action",),
                   symptom="2 repeated actions that changed nothing (first: examine Cabinet_0)",
                   rationale="feedback applied (general: try something new); the goal was still not reached"),
        make_entry("s0_c", scene="s0", quest="q3", corrected=False, tags=(),
                   symptom="no mistakes recorded", rationale="a direct plan reached the goal in 3 turns"),
        make_entry("s0_own", scene="s0", quest="q9"),
    ] + [make_entry(f"s{k}_{i}", scene=f"s{k}", quest=f"q{i}", aspects=1, won=bool(i % 2),
                    symptom=f"{i} repeated actions", rationale="ok " * (5 + 7 * i), tags=("repeated_action",))
         for k in (1, 2) for i in range(4)]
    return EpisodicStore.from_entries(entries, tie_seed=0)


@pytest.mark.parametrize(
    "name, retrieval_executed, injection_mask, memory_on, mode, has_advisories, merged",
    [
        ("C1", False, True, False, "off", False, False),  # slot exists but empty, memory_on false
        ("C2", True, False, True, "on", True, True),  # exposed, merged when the gate passes
        ("C2_silent", True, True, False, "silent", False, False),  # retrieval ran, masked: empty
    ],
)
def test_seed_table_2_4_row_by_row(store, name, retrieval_executed, injection_mask, memory_on, mode,
                                   has_advisories, merged):
    slot = memory_slot(store, TASK, load_condition(name), MEMORY, rng=0, name=name)
    b = slot.bundle
    assert b.meta.retrieval_executed is retrieval_executed
    assert b.meta.masked_injection is injection_mask
    assert b.meta.memory_mode == mode
    assert b.memory_on is memory_on
    assert bool(b.retrieved) is has_advisories
    assert len(b.retrieved) <= b.meta.topk == (3 if retrieval_executed else 0)
    assert b.meta.store_hash == (store.store_hash if retrieval_executed else None)
    assert b.meta.gate_reason == slot.reason
    assert slot.gate_ok is merged
    assert (MEMORY.io.slot_memory_name in slot.context) is merged
    assert bool(slot.injected_block_text) is merged
    assert bool(slot.retrieved_entry_ids) is retrieval_executed  # C2_silent records what it retrieved
    assert "mem_s0_own" not in slot.retrieved_entry_ids


def test_c2_injects_its_advisories_under_the_configured_slot_name(store):
    memory = OmegaConf.merge(MEMORY, {"io": {"slot_memory_name": "MY_SLOT"}})
    slot = memory_slot(store, TASK, load_condition("C2"), memory, rng=0)
    assert list(slot.context) == ["MY_SLOT"]
    assert slot.context["MY_SLOT"] == slot.bundle.model_dump(mode="json")  # the whole bundle, for the record
    # What the model reads: the slot name, then each advisory's type, strength and message.
    text = slot.injected_block_text
    assert text.startswith("MY_SLOT:\n- advisory_type: ") and "store_hash" not in text and "adv_0000" not in text
    assert all(a.message in text and f"strength: {a.strength}" in text for a in slot.bundle.retrieved)
    assert len(text) < len(json.dumps(slot.context)) / 2
    assert [a.advisory_id for a in slot.bundle.retrieved] == ["adv_000001", "adv_000002", "adv_000003"]


def test_c1_and_c2_silent_show_the_model_the_same_thing(store):
    c1 = memory_slot(store, TASK, load_condition("C1"), MEMORY, rng=0)
    silent = memory_slot(store, TASK, load_condition("C2_silent"), MEMORY, rng=0)
    assert c1.injected_block_text == silent.injected_block_text == ""
    assert c1.context == silent.context == {}
    assert (c1.reason, silent.reason) == ("memory_off", "masked")


def test_build_slot_payload_per_condition():
    advs = [advisory(1), advisory(2)]
    for name, expect in (("C1", []), ("C2", advs), ("C2_silent", [])):
        bundle = InjectionController(source_for(load_condition(name)).exposure).build_slot_payload(advs, store_hash="h")
        assert bundle.retrieved == expect


def _bundle(mode="on", masked=False, retrieval=True, retrieved=(), warnings=()):
    return AdvisoryBundleV1_1(
        memory_on=mode == "on" and not masked, retrieved=list(retrieved), warnings=list(warnings),
        meta=AdvisoryBundleMetaV1_1(memory_mode=mode, topk=3 if retrieval else 0, masked_injection=masked,
                                    retrieval_executed=retrieval))


@pytest.mark.parametrize(
    "bundle, kwargs, expected",
    [
        (_bundle("off", True, False), {}, (False, "memory_off")),
        (_bundle("silent", True), {}, (False, "masked")),
        (_bundle(), {}, (False, "nothing_retrieved")),
        (_bundle(warnings=["label_hint: adv_000001 from ep dropped"]), {}, (False, "label_hint")),
        (_bundle(retrieved=[advisory(message="Do this: open drawer_1 and put apple_2 in drawer_1")]),
         {"query_expert_plan": TASK["expert_plan"]}, (False, "label_hint")),
        (_bundle(retrieved=[advisory(1, "Open drawer_1 first."), advisory(2, "Put apple_2 in drawer_1 last.")]),
         {"query_expert_plan": TASK["expert_plan"]}, (False, "label_hint")),  # two advisories, one command each
        (_bundle(retrieved=[advisory(1, "Open drawer_1 first."), advisory(2)]),
         {"query_expert_plan": TASK["expert_plan"]}, (True, "ok")),  # one command of three: a principle
        (_bundle(retrieved=[advisory(relevance=0.3)]), {"relevance_threshold": 0.5},
         (False, "below_relevance_threshold")),
        (_bundle(retrieved=[advisory(relevance=0.5)]), {"relevance_threshold": 0.5}, (True, "ok")),
    ],
)
def test_gate_reasons(bundle, kwargs, expected):
    assert should_inject_advisory_with_reason(bundle, **kwargs) == expected


def test_gate_threshold_from_config_refuses_c2(store):
    memory = OmegaConf.merge(MEMORY, {"relevance_threshold": 1.0})
    slot = memory_slot(store, TASK, load_condition("C2"), memory, rng=0)
    assert (slot.gate_ok, slot.reason, slot.injected_block_text) == (False, "below_relevance_threshold", "")
    assert slot.bundle.retrieved  # recorded, just not injected


def test_merge_slot_needs_exposure_content_and_gate():
    assert merge_slot({"a": 1}, "S", {"x": 1}, True, True) == {"a": 1, "S": {"x": 1}}
    for exposed, slot, gate in ((False, {"x": 1}, True), (True, {}, True), (True, None, True), (True, {"x": 1}, False)):
        assert merge_slot({"a": 1}, "S", slot, exposed, gate) == {"a": 1}


@pytest.mark.parametrize(
    "exposure, key",
    [
        (Exposure("off", True, True), "retrieval_executed"),
        (Exposure("on", False, False), "retrieval_executed"),
        (Exposure("on", True, True), "injection_mask"),
        (Exposure("silent", True, False), "silent"),
        (Exposure("loud", True, False), "memory_mode='loud'"),
    ],
)
def test_contradictory_exposures_are_config_errors(exposure, key):
    with pytest.raises(ConfigError, match=key):
        check_exposure(exposure, "Cx")


def test_an_unknown_kind_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"condition\.Cx\.kind='loud': expected one of none, memory, silent, "
                                          r"placebo, oracle"):
        source_for({"kind": "loud"}, "Cx")


def test_every_condition_yaml_names_a_kind_with_a_consistent_exposure():
    names = sorted(p.stem for p in (ROOT / "conf" / "condition").glob("*.yaml"))
    assert {"C1", "C2", "C2_silent", "C2_placebo"} <= set(names)
    kinds = {}
    for name in names:
        source = source_for(load_condition(name), name)
        check_exposure(source.exposure, name)
        kinds[name] = str(source.kind)
    assert kinds["C1"] == "none" and kinds["C2"] == "memory" and kinds["C2_placebo"] == "placebo"


# --------------------------------------------------------------------------- placebo


def test_placebo_matches_c2_in_count_and_length_with_other_scenes_content(store):
    c2 = memory_slot(store, TASK, load_condition("C2"), MEMORY, rng=0)
    pl = memory_slot(store, TASK, load_condition("C2_placebo"), MEMORY, rng=0)
    assert c2.gate_ok and pl.gate_ok and pl.reason == "ok"
    a, b = c2.bundle.retrieved, pl.bundle.retrieved
    assert len(b) == len(a) == 3
    assert [len(x.message) for x in b[:-1]] == [len(x.message) for x in a[:-1]]
    assert len(pl.injected_block_text) == len(c2.injected_block_text)
    assert [x.relevance_score for x in b] == [x.relevance_score for x in a]
    assert [x.advisory_id for x in b] == [x.advisory_id for x in a]
    src_scenes = {e.split("_")[1] for e in pl.injected_entry_ids}
    assert src_scenes and "s0" not in src_scenes
    assert {m.message for m in b}.isdisjoint({m.message for m in a})
    # Nothing in the injected text says it is a placebo; retrieval was executed and recorded.
    assert "placebo" not in pl.injected_block_text
    assert pl.bundle.meta.retrieval_executed and pl.retrieved_entry_ids == c2.retrieved_entry_ids


def test_a_refitted_placebo_message_is_never_cut_to_a_stub(store):
    """A reference block much shorter than the placebo's (another tokenizer, say): the
    messages shrink, last first, but none below MIN_FITTED_CHARS; once all are there, the
    closest fit is kept. Before the floor, a message could be cut to "P", which the render
    checks then found in every prompt."""
    from pipeline.conditions.placebo import MIN_FITTED_CHARS
    from pipeline.memory.injection import InjectionController, block_text

    c2 = memory_slot(store, TASK, load_condition("C2"), MEMORY, rng=0)
    pl = memory_slot(store, TASK, load_condition("C2_placebo"), MEMORY, rng=0)
    controller = InjectionController.from_config(Exposure.of("on"), MEMORY, "C2_placebo")
    filler = ["Cabinet_4 was empty in the Garage; go south to reach the Hall."]
    for short in ("Open it.", "Open Fridge_0 before you take the Apple_2 inside it, then close it again."):
        ref = c2.bundle.model_copy(update={"retrieved": [a.model_copy(update={"message": short})
                                                         for a in c2.bundle.retrieved]})
        fitted = match_block_length(controller, ref, pl.bundle, filler, 800)
        lengths = [len(a.message) for a in fitted.retrieved]
        assert len(lengths) == len(ref.retrieved) and min(lengths) >= MIN_FITTED_CHARS
        target = len(block_text(controller.merge_into_context({}, ref, True)))
        got = len(block_text(controller.merge_into_context({}, fitted, True)))
        if len(short) >= MIN_FITTED_CHARS:
            assert got == target  # reachable: exact in characters
        else:
            assert got > target and all(n == MIN_FITTED_CHARS for n in lengths)  # every message at the floor


def test_a_refitted_placebo_never_takes_filler_that_names_the_tasks_answer(store):
    """Filler comes from other scenes, whose names can coincide with the task's ("take Key_2
    from Cabinet_3"): filler naming the task's answer is never used, so the refit cannot
    become a label hint that the gate refuses (the default run's render once failed on one:
    the placebo injected nothing where C2 injected three advisories)."""
    from pipeline.memory import find_label_hints
    from pipeline.memory.injection import InjectionController

    c2 = memory_slot(store, TASK, load_condition("C2"), MEMORY, rng=0)
    pl = memory_slot(store, TASK, load_condition("C2_placebo"), MEMORY, rng=0)
    controller = InjectionController.from_config(Exposure.of("on"), MEMORY, "C2_placebo")
    plan = ["take Key_2 from Cabinet_3", "unlock Drawer_2 with Key_2", "open Drawer_2"]
    answer = "Cabinet_3 held Key_2: take Key_2 from Cabinet_3, then unlock Drawer_2 with Key_2 and open Drawer_2."
    plain = "Cabinet_4 was empty in the Garage; go south to reach the Hall."
    longer = c2.bundle.model_copy(update={"retrieved": [a.model_copy(update={"message": a.message + " " + plain * 3})
                                                        for a in c2.bundle.retrieved]})

    def hints(bundle) -> list:
        return [h for a in bundle.retrieved for h in find_label_hints(a.message, expert_plan=plan)]

    unguarded = match_block_length(controller, longer, pl.bundle, [answer, plain], 800)
    assert hints(unguarded)  # the case: the densest filler first, and it names the answer
    guarded = match_block_length(controller, longer, pl.bundle, [answer, plain], 800,
                                 names_answer=lambda text: "take key_2 from cabinet_3" in text.lower())
    assert not hints(guarded) and "Cabinet_4 was empty" in " ".join(a.message for a in guarded.retrieved)


def _store_whose_advisories_name_the_answer_together() -> EpisodicStore:
    """For TASK: every entry names one of its plan's three object commands (none names two),
    its own scene's and other scenes' alike."""
    own = [make_entry("s0_a", scene="s0", quest="q1", rationale="feedback applied (procedural: open Drawer_1 first)"),
           make_entry("s0_b", scene="s0", quest="q2", rationale="feedback applied (procedural: put Apple_2 in Drawer_1)"),
           make_entry("s0_c", scene="s0", quest="q3", corrected=False, tags=(), symptom="no mistakes recorded",
                      rationale="a direct plan reached the goal in 3 turns")]
    steps = ["open Drawer_1 first", "take Apple_2 early"]
    other = [make_entry(f"s{k}_{i}", scene=f"s{k}", quest=f"q{i}",
                        rationale=f"feedback applied (procedural: {steps[(i + k) % 2]}); reached in {4 + i} turns")
             for k in (1, 2, 3) for i in range(4)]
    return EpisodicStore.from_entries(own + other, tie_seed=0)


@pytest.mark.parametrize("name", ["C2", "C2_placebo"])
def test_no_injected_block_names_the_answer_though_each_advisory_alone_would_pass(name):
    """The render's own measure (:func:`pipeline.conditions.hints.label_hint_of`, the
    ``label_hints.memory`` of its metrics) finds no hint in any seed's block; before the
    bundle-level check both conditions injected blocks naming two of the three commands."""
    from pipeline.conditions.hints import label_hint_of

    store = _store_whose_advisories_name_the_answer_together()
    for seed in range(6):
        slot = memory_slot(store, TASK, load_condition(name), MEMORY, rng=seed, name=name)
        assert slot.gate_ok and slot.injected_block_text, (seed, slot.reason)
        assert label_hint_of(slot.injected_block_text, TASK, MEMORY.label_hint_min_commands) == (False, 1), seed
        assert any("(with the advisories before it)" in w for w in slot.bundle.warnings)


def test_placebo_draws_skip_an_entry_that_names_the_answer_with_those_drawn_before_it():
    store = _store_whose_advisories_name_the_answer_together()
    targets = [advisory(i, "Principle: open containers before taking from them. " * 8) for i in (1, 2, 3)]
    plan = TASK["expert_plan"]
    for seed in range(6):
        out, sources, notes, _ = draw_from_other_scenes(store, targets, query_scene_id="s0",
                                                        rng=np.random.default_rng(seed), builder=AdvisoryBuilder(),
                                                        query_expert_plan=plan)
        assert len(out) == 3 and not bundle_label_hints([a.message for a in out], expert_plan=plan), seed
        assert len({m for a in out for m in named_plan_commands(a.message, plan)}) == 1
    assert any("skipped (label hint)" in n for n in notes)


def test_placebo_is_seeded(store):
    cond = load_condition("C2_placebo")
    runs = [memory_slot(store, TASK, cond, MEMORY, rng=s).injected_entry_ids for s in (0, 0, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs}) > 1
    gen = memory_slot(store, TASK, cond, MEMORY, rng=np.random.default_rng(5))
    assert gen.gate_ok


def test_placebo_injects_nothing_when_c2_would_not(store):
    memory = OmegaConf.merge(MEMORY, {"relevance_threshold": 1.0})
    pl = memory_slot(store, TASK, load_condition("C2_placebo"), memory, rng=0)
    assert (pl.gate_ok, pl.reason, pl.injected_block_text, pl.bundle.retrieved) == (
        False, "below_relevance_threshold", "", [])


def test_signature_query_uses_the_objective(store):
    s = SignatureBuilder().build(TASK["objective"])
    direct = Retriever(tie_seed=0).retrieve(store, s, TASK["objective"], 3, query_scene_id="s0", query_quest_id="q9")
    slot = memory_slot(store, TASK, load_condition("C2"), MEMORY, rng=0)
    assert ids(direct) == slot.retrieved_entry_ids


def test_queries_with_many_tokens_do_not_overflow_the_counter():
    words = [f"w{i}" for i in range(300)]
    entries = [make_entry("many", symptom=" ".join(words[:100]), rationale=" ".join(words[100:200])), make_entry("few", symptom="w1 w2")]
    hits = Retriever().retrieve_scored(entries, sig(), " ".join(words[:250]), topk=2)
    assert [h.entry["entry_id"] for h in hits] == ["mem_many", "mem_few"]
    assert hits[0].lexical_overlap == pytest.approx(200 / 250)
