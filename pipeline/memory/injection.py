"""Injection under an exposure (seed 001 section 2.4): retrieval, the block, the gate, the context.

=============  ==================  ==============  ============================  ================================
memory_mode    retrieval_executed  injection_mask  retrieved                     in the agent's context
=============  ==================  ==============  ============================  ================================
off            False               True            []                            nothing (memory_on false)
on             True                False           advisories (at most topk)     the slot, only when the gate passes
silent         True                True            [] (masked)                   nothing (memory_on false)
=============  ==================  ==============  ============================  ================================

The slot is merged into the context under ``memory.io.slot_memory_name`` only when it is
exposed (mode ``on``, unmasked), non-empty and the gate passes. An :class:`Exposure` is
those three fields; which one a condition has, and whether its block holds the store's own
advisories or others built for the experiment's controls, is the condition's
(``pipeline.conditions.sources``: one object per kind). This module is the primitives they
share: :func:`retrieve_for` (signature, retrieval, advisories for one task),
:func:`finish_slot` (gate, context, injected text) and :func:`build_memory_slot` (the two
together, the store's advisories as they are)::

    store = load_store(cfg.paths.store, tie_seed=cfg.seed)
    slot = build_memory_slot(store, task_row, Exposure.of("on"), cfg.memory,
                             words=world_words(cfg))  # pipeline.envs: the world's words
    slot.bundle, slot.gate_ok, slot.reason, slot.injected_block_text
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

from pipeline.core.conf_schema import MemoryConfig, MemoryFacts, MemoryMode
from pipeline.core.facts import FactReader, WorldWords
from pipeline.core.config import ConfigError
from pipeline.memory.advisory import (
    AdvisoryBuilder,
    Recall,
    bundle_label_hints,
    task_answer,
)
from pipeline.memory.knowledge import StoreKnowledge, of_quest, store_entries
from pipeline.memory.retrieval import Retriever
from pipeline.memory.schemas import (
    MAX_RETRIEVED,
    tokenize,
    MAX_WARNINGS,
    AdvisoryBundleMetaV1_1,
    AdvisoryBundleV1_1,
    AdvisoryV1_1,
)
from pipeline.memory.signature import SignatureBuilder
from pipeline.prompts.templates import render_memory_value

DEFAULT_SLOT_NAME = "DEBATE_CONTEXT__MEMORY"


class Exposure(NamedTuple):
    """Seed 001 section 2.4's three fields: whether retrieval runs and whether what it gives is shown."""

    memory_mode: str
    retrieval_executed: bool
    injection_mask: bool

    @classmethod
    def of(cls, mode: str) -> "Exposure":
        """The exposure of a memory mode: ``off`` (no retrieval, nothing shown), ``on`` (retrieved,
        shown when the gate passes) or ``silent`` (retrieved, never shown)."""
        return {"off": cls("off", False, True), "on": cls("on", True, False), "silent": cls("silent", True, True)}[mode]

    @property
    def shown(self) -> bool:
        """Whether a block may be shown at all (mode ``on``, unmasked)."""
        return self.memory_mode == "on" and not self.injection_mask


def check_exposure(exposure: Exposure, name: str = "?") -> None:
    """Reject an exposure whose fields contradict seed 001 section 2.4 (the error names the field)."""
    mode, retrieval, masked = str(exposure.memory_mode), bool(exposure.retrieval_executed), bool(exposure.injection_mask)
    key = f"{name}: exposure"
    if mode not in {m.value for m in MemoryMode}:
        raise ConfigError(f"{key} memory_mode={mode!r}: expected one of {', '.join(MemoryMode)}")
    if mode == "off" and retrieval:
        raise ConfigError(f"{key} retrieval_executed=true with memory_mode=off: memory_mode=silent retrieves without "
                          "exposure")
    if mode == "on" and not retrieval:
        raise ConfigError(f"{key} retrieval_executed=false with memory_mode=on: memory on needs retrieval")
    if mode == "on" and masked:
        raise ConfigError(f"{key} injection_mask=true with memory_mode=on: a masked memory is memory_mode=silent")
    if mode == "silent" and not (retrieval and masked):
        raise ConfigError(f"{key} memory_mode=silent needs retrieval_executed=true and injection_mask=true")


def should_inject_advisory_with_reason(
    bundle: AdvisoryBundleV1_1,
    *,
    relevance_threshold: float = 0.0,
    query_expert_plan: Sequence[str] = (),
    query_ground_truth: Optional[str] = None,
    label_hint_min_commands: int = 2,
) -> tuple[bool, str]:
    """The advisory injection gate: ``(ok, reason)``.

    Reasons, checked in this order: ``memory_off`` (mode off or no retrieval), ``masked``
    (masked or not mode ``on``), ``label_hint`` (every advisory dropped for a label hint,
    or the advisories left in the bundle give the answer away, one alone or several read
    together: :func:`~pipeline.memory.advisory.bundle_label_hints`), ``nothing_retrieved``,
    ``below_relevance_threshold`` (the best advisory is below the threshold), ``ok``.
    """
    m = bundle.meta
    if m.memory_mode == "off" or not m.retrieval_executed:
        return False, "memory_off"
    if m.masked_injection or not bundle.memory_on:
        return False, "masked"
    if not bundle.retrieved:
        if any(w.startswith("label_hint") for w in bundle.warnings):
            return False, "label_hint"
        return False, "nothing_retrieved"
    if bundle_label_hints([a.message for a in bundle.retrieved], ground_truth=query_ground_truth,
                          expert_plan=query_expert_plan, min_commands=label_hint_min_commands):
        return False, "label_hint"
    if max(a.relevance_score for a in bundle.retrieved) < relevance_threshold:
        return False, "below_relevance_threshold"
    return True, "ok"


def merge_slot(context: dict[str, Any], slot_name: str, slot_dict: Optional[dict], exposed: bool, gate_ok: bool) -> dict[str, Any]:
    """A copy of ``context`` with the slot merged when ``exposed and slot_dict and gate_ok`` (seed 001 2.4)."""
    out = dict(context)
    if exposed and slot_dict and gate_ok:
        out[slot_name] = slot_dict
    return out


class InjectionController:
    """Builds the slot under one exposure and decides whether it enters the context.

    Args:
        exposure: Seed 001's three fields (:class:`Exposure`).
        topk: Advisories retrieved (1..3).
        slot_memory_name: Context key of the slot (config ``memory.io.slot_memory_name``).
        relevance_threshold: Gate threshold on the best advisory's relevance.
        label_hint_min_commands: See :func:`find_label_hints`.
        name: Condition name (error messages).
    """

    def __init__(
        self,
        exposure: Exposure,
        *,
        topk: int = MAX_RETRIEVED,
        slot_memory_name: str = DEFAULT_SLOT_NAME,
        relevance_threshold: float = 0.0,
        label_hint_min_commands: int = 2,
        name: str = "?",
    ):
        check_exposure(exposure, name)
        if not 1 <= int(topk) <= MAX_RETRIEVED:
            raise ConfigError(f"memory.topk={topk!r}: expected 1..{MAX_RETRIEVED}")
        if not slot_memory_name:
            raise ConfigError("memory.io.slot_memory_name is empty: expected a context key")
        self.name = name
        self.memory_mode = str(exposure.memory_mode)
        self.retrieval_executed = bool(exposure.retrieval_executed)
        self.injection_mask = bool(exposure.injection_mask)
        self.topk = int(topk)
        self.slot_memory_name = slot_memory_name
        self.relevance_threshold = float(relevance_threshold)
        self.label_hint_min_commands = int(label_hint_min_commands)

    @classmethod
    def from_config(cls, exposure: Exposure, memory_cfg: MemoryConfig, name: str = "?") -> "InjectionController":
        return cls(
            exposure,
            topk=memory_cfg.topk,
            slot_memory_name=str(memory_cfg.io.slot_memory_name),
            relevance_threshold=memory_cfg.relevance_threshold,
            label_hint_min_commands=memory_cfg.label_hint_min_commands,
            name=name,
        )

    @property
    def exposed_to_debate(self) -> bool:
        """Whether the slot's content may be shown at all (mode ``on``, unmasked)."""
        return self.memory_mode == "on" and not self.injection_mask

    def build_slot_payload(
        self,
        advisories: Sequence[AdvisoryV1_1] = (),
        *,
        warnings: Sequence[str] = (),
        store_hash: Optional[str] = None,
        gate_reason: Optional[str] = None,
    ) -> AdvisoryBundleV1_1:
        """The bundle for this condition (seed 001 sections 2.2 and 2.4).

        Args:
            advisories: What the advisory builder produced (ignored unless exposed).
            warnings: Warnings to carry (at most 5 kept).
            store_hash: Hash of the store retrieval used (dropped when retrieval did not run).
            gate_reason: The gate's reason, when already known.
        """
        memory_on = self.exposed_to_debate
        return AdvisoryBundleV1_1(
            memory_on=memory_on,
            retrieved=list(advisories)[: self.topk] if memory_on else [],
            warnings=list(warnings)[:MAX_WARNINGS],
            meta=AdvisoryBundleMetaV1_1(
                memory_mode=self.memory_mode,
                topk=self.topk if self.retrieval_executed else 0,
                masked_injection=self.injection_mask,
                retrieval_executed=self.retrieval_executed,
                gate_reason=gate_reason,
                store_hash=store_hash if self.retrieval_executed else None,
            ),
        )

    def gate(self, bundle: AdvisoryBundleV1_1, *, query_expert_plan: Sequence[str] = (),
             query_ground_truth: Optional[str] = None) -> tuple[bool, str]:
        """:func:`should_inject_advisory_with_reason` with this controller's settings."""
        return should_inject_advisory_with_reason(
            bundle,
            relevance_threshold=self.relevance_threshold,
            query_expert_plan=query_expert_plan,
            query_ground_truth=query_ground_truth,
            label_hint_min_commands=self.label_hint_min_commands,
        )

    def merge_into_context(self, context: dict[str, Any], bundle: AdvisoryBundleV1_1, gate_ok: bool) -> dict[str, Any]:
        """``context`` with the slot merged when exposed, non-empty and the gate passed."""
        slot = bundle.model_dump(mode="json") if bundle.retrieved else None
        return merge_slot(context, self.slot_memory_name, slot, self.exposed_to_debate, gate_ok)


#: The advisory fields the model reads; the whole bundle (ids, evidence, scores, meta,
#: store hash) stays in the prompts Parquet's ``bundle_json``.
SHOWN_FIELDS = ("advisory_type", "strength", "message")


def block_text(context: dict[str, Any]) -> str:
    """The injected text of a context, compact: per slot its name, then one ``- `` item per
    advisory with the fields the model reads, rendered by seed 002's memory renderer
    (``advisory_type: ...``, ``strength: ...``, ``message: ...``); ``""`` when empty.

    A JSON dump of the bundle was ~4.7k characters, mostly ids, scores and a 64-hex store
    hash the model cannot use."""
    if not context:
        return ""
    parts = []
    for slot in sorted(context):
        retrieved = (context[slot] or {}).get("retrieved") or []
        shown = [{k: a[k] for k in SHOWN_FIELDS if k in a} for a in retrieved]
        parts.append(f"{slot}:\n{render_memory_value(shown)}")
    return "\n".join(parts)


def injected_text(controller: InjectionController, bundle: AdvisoryBundleV1_1) -> str:
    """The text ``bundle`` would inject under ``controller`` were its gate to pass (what a length is measured on)."""
    gated = bundle.model_copy(update={"meta": bundle.meta.model_copy(update={"gate_reason": "ok"})})
    return block_text(controller.merge_into_context({}, gated, True))


# --------------------------------------------------------------------------- one call per task


class MemorySlot(NamedTuple):
    """What the render stage stores for one task under one condition.

    Attributes:
        bundle: The ``AdvisoryBundleV1_1`` (meta records retrieval_executed, gate reason, store hash).
        gate_ok: Whether the slot was merged into the context.
        reason: The gate's reason (``ok``, ``memory_off``, ``masked``, ...).
        injected_block_text: Exactly what enters the prompt: the JSON of ``context``
            (``""`` when nothing is injected).
        context: ``{slot_name: bundle dict}`` when injected, else ``{}``.
        retrieved_entry_ids: Entries retrieval returned (also under masked conditions).
        injected_entry_ids: Entries the injected advisories come from (for a block drawn from other entries: those).
        notes: Record-only remarks (how the block was drawn); never shown to the model.
    """

    bundle: AdvisoryBundleV1_1
    gate_ok: bool
    reason: str
    injected_block_text: str
    context: dict
    retrieved_entry_ids: list
    injected_entry_ids: list
    notes: list


@dataclass
class Retrieval:
    """What retrieval gave one task under one exposure (:func:`retrieve_for`): the advisories
    the store's entries make for it, before any gate.

    Attributes:
        controller: The task's :class:`InjectionController`.
        plan, ground_truth: The task's answer (:func:`~pipeline.memory.advisory.task_answer`),
            what the label-hint gate compares a block with.
        builder: The advisory builder used (its settings and world words).
        recall: A maker of the task's :class:`~pipeline.memory.advisory.Recall`, or None
            (``memory.facts=episode`` without lessons).
        advisories, warnings: The builder's advisories and warnings (empty without retrieval).
        retrieved_ids: The entries retrieval returned.
        kept_ids: Those whose advisories survived the builder's label-hint check.
        store_hash: The store's content hash.
    """

    controller: InjectionController
    plan: list
    ground_truth: Optional[str]
    builder: Optional[AdvisoryBuilder]
    recall: Optional[Callable[..., Recall]]
    advisories: list
    warnings: list
    retrieved_ids: list
    kept_ids: list
    store_hash: Optional[str]

    def bundle(self, advisories: Optional[Sequence[AdvisoryV1_1]] = None,
               warnings: Optional[Sequence[str]] = None) -> AdvisoryBundleV1_1:
        """The bundle of ``advisories`` (default: the retrieved ones) under this exposure."""
        return self.controller.build_slot_payload(self.advisories if advisories is None else advisories,
                                                  warnings=self.warnings if warnings is None else warnings,
                                                  store_hash=self.store_hash)


def retrieve_for(store: Any, task: Mapping[str, Any], exposure: Exposure, memory_cfg: MemoryConfig, *,
                 name: str = "?", words: WorldWords | None = None, facts: FactReader | None = None) -> Retrieval:
    """Signature -> retrieval -> advisories, for one task (nothing when the exposure retrieves nothing).

    Args:
        store: The loaded :class:`~pipeline.memory.store.EpisodicStore` (its ``tie_seed``
            orders retrieval ties; load it with the config's ``seed``).
        task: A manifest row: ``scene_id``, ``quest_id``, ``objective``, ``expert_plan``
            (and optionally ``ground_truth``), used for the query and the label-hint check.
        exposure: Seed 001's three fields.
        memory_cfg: ``cfg.memory``.
        name: For error messages (the condition's).
        words: The world's words in the advisories' text (:func:`pipeline.envs.world_words`);
            None: world-neutral.
        facts: The world's fact reader (:func:`pipeline.envs.fact_reader`): the kinds and
            preferences of the lessons across houses (``memory.lessons``); None: no lessons.
    """
    controller = InjectionController.from_config(exposure, memory_cfg, name)
    plan, gt = task_answer(task)
    recall = _recall(store, task, memory_cfg, facts)
    if not controller.retrieval_executed:
        return Retrieval(controller, plan, gt, None, recall, [], [], [], [], None)
    objective = str(task.get("objective") or "")
    signature = SignatureBuilder(getattr(facts, "entity_pattern", None)).build(objective)
    retriever = Retriever.from_config(memory_cfg)
    hits = retriever.retrieve_scored(
        store,
        signature,
        query_lexical=objective if memory_cfg.use_lexical else None,
        topk=controller.topk,
        query_scene_id=task.get("scene_id"),
        query_quest_id=task.get("quest_id"),
    )
    builder = AdvisoryBuilder(
        max_message_chars=memory_cfg.max_message_chars,
        label_hint_min_commands=controller.label_hint_min_commands,
        words=words,
    )
    advisories, warnings = builder.build_many(hits, query_expert_plan=plan, query_ground_truth=gt,
                                              recall=recall() if recall else None)
    retrieved_ids = [h.entry["entry_id"] for h in hits]
    kept_ids = [h.entry["entry_id"] for h in hits if h.entry["provenance"]["episode_id"] in
                {a.evidence.source_episode_ids[0] for a in advisories}]
    return Retrieval(controller, plan, gt, builder, recall, advisories, warnings, retrieved_ids, kept_ids,
                     getattr(store, "store_hash", None))


def build_memory_slot(
    store: Any,
    task: dict[str, Any],
    exposure: Exposure,
    memory_cfg: MemoryConfig,
    *,
    name: str = "?",
    words: WorldWords | None = None,
    facts: FactReader | None = None,
) -> MemorySlot:
    """Signature -> retrieval -> advisories -> bundle -> gate -> context, for one task: the
    store's own advisories under ``exposure`` (arguments as :func:`retrieve_for`).

    Returns:
        A :class:`MemorySlot`.
    """
    got = retrieve_for(store, task, exposure, memory_cfg, name=name, words=words, facts=facts)
    return finish_slot(got.controller, got.bundle(), got.retrieved_ids, got.kept_ids, [], got.plan,
                       got.ground_truth)


def store_knowledge(store: Any, facts: FactReader | None,
                    exclude_quest: tuple[str | None, str] | None = None) -> StoreKnowledge:
    """The store's :class:`~pipeline.memory.knowledge.StoreKnowledge`, gathered once per store,
    fact reader and excluded quest (kept on the store object).

    ``exclude_quest``: ``(scene, quest)`` whose own episodes are left out (``memory.exclude_same_quest``).
    Retrieval never returns them, and neither may the house's facts, visits, lessons and habits:
    a train quest's demonstration prompt would otherwise state where its own past episode found
    the target, which an eval prompt never can (its quest is never in the store). A store with no
    entry of that quest shares the whole store's knowledge."""
    cache = store.__dict__.setdefault("_knowledge", {}) if hasattr(store, "__dict__") else {}
    key = type(facts).__name__ if facts is not None else None
    if exclude_quest is not None:
        if "quests" not in cache:
            entries = store_entries(store)
            cache["quests"] = (entries, {(str(e["provenance"]["scene_id"]), str(e["provenance"]["quest_id"]))
                                         for e in entries if e.get("provenance")})
        entries, quests = cache["quests"]
        scene, quest = exclude_quest
        held = any(q == str(quest) and (scene is None or s == str(scene)) for s, q in quests)
        if held:
            xkey = (key, scene, str(quest))
            if xkey not in cache:
                cache[xkey] = StoreKnowledge.from_entries([e for e in entries if not of_quest(e, scene, quest)], facts)
            return cache[xkey]
    if key not in cache:
        cache[key] = StoreKnowledge.from_store(store, facts)
    return cache[key]


def objective_words(objective: str, facts: FactReader | None) -> list[str]:
    """The objective's words and the kinds of the things it names: what makes a fact or a
    lesson relevant to the task (:class:`~pipeline.memory.advisory.Recall`)."""
    words = tokenize(objective)
    kinds = [k for k in (facts.kind(w) for w in words) if k] if facts is not None else []
    return list(dict.fromkeys(words + kinds))


def _recall(store: Any, task: Mapping[str, Any], memory_cfg: MemoryConfig,
            facts: FactReader | None) -> Optional[Callable[..., Recall]]:
    """A maker of the task's :class:`Recall` (a fresh one per bundle), or None when
    ``memory.facts=episode`` and no lessons: advisories as the seed builds them."""
    house = memory_cfg.facts == MemoryFacts.house
    lessons = bool(memory_cfg.lessons) and facts is not None
    if not (house or lessons):
        return None
    scene = str(task.get("scene_id")) if task.get("scene_id") is not None else None
    quest = task.get("quest_id")
    know = store_knowledge(store, facts, (scene, str(quest)) if memory_cfg.exclude_same_quest and quest is not None
                           else None)
    words = objective_words(str(task.get("objective") or ""), facts)

    def make(unrelated: bool = False) -> Recall:
        return Recall(know, scene, words, house=house, lessons=lessons, unrelated=unrelated)

    return make


def finish_slot(controller: InjectionController, bundle: AdvisoryBundleV1_1, retrieved_ids: list, injected_ids: list,
                notes: list, plan: list, gt: Optional[str], reason: Optional[str] = None) -> MemorySlot:
    """Gate ``bundle`` (against the task's ``plan`` / ground truth ``gt``; ``reason``: the
    reason recorded when the gate refuses, when a caller already knows a better one), merge it
    into the context when it passes, and record what the prompt receives."""
    ok, gate_reason = controller.gate(bundle, query_expert_plan=plan, query_ground_truth=gt)
    if reason is not None and not ok:
        gate_reason = reason
    bundle = bundle.model_copy(update={"meta": bundle.meta.model_copy(update={"gate_reason": gate_reason})})
    AdvisoryBundleV1_1.model_validate(bundle.model_dump())  # re-check the bounds after the update
    context = controller.merge_into_context({}, bundle, ok)
    text = block_text(context)
    return MemorySlot(bundle, ok, gate_reason, text, context, retrieved_ids, injected_ids if context else [], notes)
