"""Injection under a condition (seed 001 section 2.4) and the C2_placebo control.

=========  ==================  ==============  ============================  =====================================
condition  retrieval_executed  injection_mask  retrieved                     in the agent's context
=========  ==================  ==============  ============================  =====================================
C1         False               True            []                            nothing (memory_on false, mode off)
C2         True                False           advisories (at most topk)     the slot, only when the gate passes
C2_silent  True                True            [] (masked)                   nothing (memory_on false, mode silent)
C2_placebo True                False           other scenes' advisories,     the slot, only when C2's gate passes
                                               C2's count and lengths
=========  ==================  ==============  ============================  =====================================

The slot is merged into the context under ``memory.io.slot_memory_name`` only when it is
exposed (mode ``on``, unmasked), non-empty and the gate passes. Behaviour follows the
condition's fields (``memory_mode``, ``retrieval_executed``, ``injection_mask``,
``placebo``), never its name, so a new condition is a new YAML file in ``conf/condition/``.

The render stage calls one function per eval task::

    store = load_store(cfg.paths.store, tie_seed=cfg.seed)
    slot = build_memory_slot(store, task_row, cfg.condition.C2, cfg.memory, rng=cfg.seed,
                             words=world_words(cfg))  # pipeline.envs: the world's words
    slot.bundle, slot.gate_ok, slot.reason, slot.injected_block_text
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import numpy as np
from omegaconf import DictConfig

from pipeline.core.conf_schema import ConditionConfig, MemoryConfig, MemoryFacts, MemoryMode
from pipeline.core.facts import FactReader, WorldWords
from pipeline.core.config import ConfigError, section
from pipeline.core.seeding import task_rng
from pipeline.memory.advisory import (
    AdvisoryBuilder,
    Recall,
    advisory_type_for,
    bundle_label_hints,
    compose_message,
    find_label_hints,
    named_plan_commands,
    task_answer,
)
from pipeline.memory.knowledge import StoreKnowledge
from pipeline.memory.retrieval import Retriever
from pipeline.memory.schemas import (
    MAX_RETRIEVED,
    tokenize,
    MAX_WARNINGS,
    AdvisoryBundleMetaV1_1,
    AdvisoryBundleV1_1,
    AdvisoryV1_1,
    EvidenceV1_1,
)
from pipeline.memory.signature import SignatureBuilder
from pipeline.prompts.templates import render_memory_value

DEFAULT_SLOT_NAME = "DEBATE_CONTEXT__MEMORY"


def condition_section(cond: ConditionConfig | Mapping[str, Any]) -> ConditionConfig:
    """A condition's typed section; a plain dict (a condition built by hand) is read as a
    :class:`~pipeline.core.conf_schema.ConditionConfig` (missing fields take its defaults)."""
    return cond if isinstance(cond, (DictConfig, ConditionConfig)) else section(ConditionConfig, cond)


def check_condition(cond: ConditionConfig | Mapping[str, Any], name: str = "?") -> None:
    """Reject a condition whose fields contradict seed 001 section 2.4 (error names the key)."""
    cond = condition_section(cond)
    mode = str(cond.memory_mode)
    retrieval = bool(cond.retrieval_executed)
    masked = bool(cond.injection_mask)
    placebo = bool(cond.placebo)
    key = f"condition.{name}"
    if mode not in {m.value for m in MemoryMode}:  # a ConditionConfig built in code is not type-checked
        raise ConfigError(f"{key}.memory_mode={mode!r}: expected one of {', '.join(MemoryMode)}")
    if mode == "off" and retrieval:
        raise ConfigError(f"{key}.retrieval_executed=true with memory_mode=off: use memory_mode=silent for retrieval without exposure")
    if mode == "on" and not retrieval:
        raise ConfigError(f"{key}.retrieval_executed=false with memory_mode=on: memory on needs retrieval")
    if mode == "on" and masked:
        raise ConfigError(f"{key}.injection_mask=true with memory_mode=on: a masked memory is memory_mode=silent")
    if mode == "silent" and not (retrieval and masked):
        raise ConfigError(f"{key}: memory_mode=silent needs retrieval_executed=true and injection_mask=true")
    if placebo and mode != "on":
        raise ConfigError(f"{key}.placebo=true needs memory_mode=on and injection_mask=false")
    if bool(getattr(cond, "oracle", False)) and (mode != "on" or placebo):
        raise ConfigError(f"{key}.oracle=true needs memory_mode=on, injection_mask=false and placebo=false")


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
    """Builds the slot for one condition and decides whether it enters the context.

    Args:
        condition_cfg: A ``condition.<name>`` config section (a plain dict is read as one).
        topk: Advisories retrieved (1..3).
        slot_memory_name: Context key of the slot (config ``memory.io.slot_memory_name``).
        relevance_threshold: Gate threshold on the best advisory's relevance.
        label_hint_min_commands: See :func:`find_label_hints`.
        name: Condition name (error messages).
    """

    def __init__(
        self,
        condition_cfg: ConditionConfig | Mapping[str, Any],
        *,
        topk: int = MAX_RETRIEVED,
        slot_memory_name: str = DEFAULT_SLOT_NAME,
        relevance_threshold: float = 0.0,
        label_hint_min_commands: int = 2,
        name: str = "?",
    ):
        check_condition(condition_cfg, name)
        if not 1 <= int(topk) <= MAX_RETRIEVED:
            raise ConfigError(f"memory.topk={topk!r}: expected 1..{MAX_RETRIEVED}")
        if not slot_memory_name:
            raise ConfigError("memory.io.slot_memory_name is empty: expected a context key")
        condition_cfg = condition_section(condition_cfg)
        self.name = name
        self.memory_mode = str(condition_cfg.memory_mode)
        self.retrieval_executed = condition_cfg.retrieval_executed
        self.injection_mask = condition_cfg.injection_mask
        self.placebo = condition_cfg.placebo
        self.oracle = bool(getattr(condition_cfg, "oracle", False))  # absent from a demos advisory variant
        self.topk = int(topk)
        self.slot_memory_name = slot_memory_name
        self.relevance_threshold = float(relevance_threshold)
        self.label_hint_min_commands = int(label_hint_min_commands)

    @classmethod
    def from_config(cls, condition_cfg: ConditionConfig | Mapping[str, Any], memory_cfg: MemoryConfig,
                    name: str = "?") -> "InjectionController":
        return cls(
            condition_cfg,
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


# --------------------------------------------------------------------------- placebo


def fit_length(text: str, target: int, filler: Sequence[str]) -> str:
    """``text`` made exactly ``target`` characters long: cut, or extended with ``filler`` texts."""
    out = text
    for extra in filler:
        if len(out) >= target:
            break
        out = f"{out} {extra}"
    while len(out) < target:  # filler ran out: repeat what we have (rare, tiny stores only)
        out = f"{out} {text}"
    return out[:target]


def draw_placebo(
    store: Any,
    targets: Sequence[AdvisoryV1_1],
    *,
    query_scene_id: Optional[str],
    rng: np.random.Generator,
    builder: AdvisoryBuilder,
    query_expert_plan: Sequence[str] = (),
    query_ground_truth: Optional[str] = None,
    exclude_entry_ids: Sequence[str] = (),
    recall: Recall | None = None,
) -> tuple[list[AdvisoryV1_1], list[str], list[str], list[str]]:
    """Advisories from entries of other scenes, one per target, each as long as its target.

    Each placebo advisory keeps its target's id, strength and relevance score, so the
    injected slot differs from C2's only in content (message, evidence; the type too when
    no drawn entry has the target's type: entries of the target's type are used first). Entries are
    drawn without replacement from the store rows whose scene differs from the query's,
    never one of ``exclude_entry_ids`` (the entries C2 injects for the task: a held-out
    scene's C2 advisories come from other scenes too). ``recall``: the placebo's
    :class:`~pipeline.memory.advisory.Recall` (``unrelated``), when C2's advisories state a
    house's facts and lessons: the drawn entry's own (other) house and lessons about kinds
    this task does not name, in the same form.

    Returns:
        ``(advisories, source_entry_ids, notes, filler)``: notes are for the record, never
        injected; filler is other-scene text for further length fitting.
    """
    if not targets:
        return [], [], [], []
    index = store.index
    qs = index.scene_ids.get(query_scene_id) if query_scene_id is not None else None
    pool = np.flatnonzero(index.scene_code != qs) if qs is not None else np.arange(index.n)
    notes: list[str] = []
    if len(pool) == 0:
        return [], [], ["placebo: no entries of other scenes in the store; nothing injected"], []
    # Enough candidates for the targets, label-hint redraws and length filler.
    size = min(len(pool), 4 * len(targets) + 8 + len(exclude_entry_ids))
    cand = pool[rng.choice(len(pool), size=size, replace=False)]
    excluded = set(exclude_entry_ids)
    entries = [e for e in index.rows(cand.tolist()) if e["entry_id"] not in excluded]
    filler = [compose_message(e, advisory_type_for(e), words=builder.words) for e in entries]
    out, sources, used = [], [], set()
    types = [advisory_type_for(e) for e in entries]
    for target in targets:
        # The same form: an entry whose advisory has the target's type first (the types'
        # wording tokenizes differently), any other entry after those; an entry already
        # drawn only when every other is (a small store: a later advisory of the same
        # entry goes on where its recall stopped).
        order = sorted(range(len(entries)), key=lambda k: (k in used, types[k] != target.advisory_type))
        for j in order:
            entry = entries[j]
            if j in used and recall is None:
                continue
            used.add(j)
            adv = builder.build(entry, target.relevance_score, recall)
            others = [f for k, f in enumerate(filler) if k != j]
            message = fit_length(adv.message, len(target.message), others)
            if bundle_label_hints([o.message for o in out] + [message], ground_truth=query_ground_truth,
                                  expert_plan=query_expert_plan, min_commands=builder.label_hint_min_commands):
                # alone, or read with the placebo advisories drawn before it
                notes.append(f"placebo: {entry['entry_id']} skipped (label hint)")
                continue
            out.append(adv.model_copy(update={
                "advisory_id": target.advisory_id,
                "strength": target.strength,
                "message": message,
            }))
            sources.append(entry["entry_id"])
            break
    if len(out) < len(targets):
        notes.append(f"placebo: drew {len(out)} of {len(targets)} advisories (too few entries of other scenes)")
    return out, sources, notes, filler


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


def _injected_text(controller: "InjectionController", bundle: AdvisoryBundleV1_1) -> str:
    gated = bundle.model_copy(update={"meta": bundle.meta.model_copy(update={"gate_reason": "ok"})})
    return block_text(controller.merge_into_context({}, gated, True))


MIN_FITTED_CHARS = 40  # the shortest a refitted placebo message gets (a few letters would read as no advice)


def match_block_length(controller: "InjectionController", reference: AdvisoryBundleV1_1,
                       placebo: AdvisoryBundleV1_1, filler: Sequence[str], max_chars: int,
                       measure: Callable[[str], int] = len,
                       names_answer: Optional[Callable[[str], bool]] = None,
                       hinted: Optional[Callable[[Sequence[str]], bool]] = None) -> AdvisoryBundleV1_1:
    """Refit the placebo's messages so its injected text is as long as the reference's.

    Length is ``measure(text)``: characters by default, the model's tokens when the render
    stage has the model's tokenizer (issue 16: "within 2% in the model's tokens"). Type
    names, evidence ids and tokenization differ between the two bundles, and the messages
    absorb the difference, the last one first: each message is a prefix (at most
    ``max_chars``) of its own text extended with ``filler``, its length found by bisection
    (block length grows with the prefix). In tokens, characters are not all worth the same
    (a phrase the tokenizer learned whole is one token, an object id several): the filler is
    split into clauses, densest first, and a message that is still too short at
    ``max_chars`` gives up part of its own tail to that denser filler. The closest fit is
    kept; in characters it is exact. No message is cut below ``MIN_FITTED_CHARS`` (when the
    reference is that much shorter, the earlier messages shrink instead).

    ``names_answer(text)``: whether a filler text names any part of the query task's answer
    (a command of its expert plan, its ground truth); such filler is never used, so a refit
    message cannot become a label hint the gate would refuse (filler comes from other
    scenes, whose entity names can coincide with this task's: "take Key_2 from Cabinet_3").
    ``hinted(messages)``: whether a refit bundle's messages, read together, give the answer
    away (:func:`~pipeline.memory.advisory.bundle_label_hints`); such a fit is never kept
    (a cut can end a message on a shorter entity name: "Cabinet_31" cut to "Cabinet_3").
    """
    target = measure(_injected_text(controller, reference))
    tokens = measure is not len
    if names_answer is not None:
        filler = [f for f in filler if not names_answer(f)]
    if tokens:
        clauses = dict.fromkeys(c for f in filler for c in re.split(r"(?<=[.;:])\s+", f) if c.strip())
        pool = sorted(clauses, key=lambda c: -measure(c) / len(c))
    else:
        pool = list(filler)
    msgs = list(placebo.retrieved)

    def fitted(i: int, text: str) -> tuple[AdvisoryBundleV1_1, int]:
        trial = msgs[:i] + [msgs[i].model_copy(update={"message": text})] + msgs[i + 1:]
        bundle = placebo.model_copy(update={"retrieved": trial})
        return bundle, measure(_injected_text(controller, bundle))

    def keepable(bundle: AdvisoryBundleV1_1) -> bool:
        return hinted is None or not hinted([a.message for a in bundle.retrieved])

    best, best_diff = placebo, abs(target - measure(_injected_text(controller, placebo)))
    for i in reversed(range(len(msgs))):
        if best_diff == 0:
            break
        own = msgs[i].message
        keeps = [len(own)] + ([int(len(own) * f) for f in (0.8, 0.6, 0.4, 0.2)] if tokens else [])
        for keep in keeps:
            full = fit_length(own[:max(1, keep)], max_chars, pool)
            floor = min(len(full), MIN_FITTED_CHARS)  # never a stub like "P": an earlier message absorbs the rest
            lo, hi = floor, len(full)  # the shortest prefix whose block reaches the target
            top, top_units = fitted(i, full)
            if top_units < target:  # too short even at max_chars
                if abs(target - top_units) < best_diff and keepable(top):
                    best, best_diff = top, abs(target - top_units)
                continue
            while lo < hi:
                mid = (lo + hi) // 2
                if fitted(i, full[:mid])[1] >= target:
                    hi = mid
                else:
                    lo = mid + 1
            for n in (lo - 1, lo):
                if n >= floor:
                    bundle, units = fitted(i, full[:n])
                    if abs(target - units) < best_diff and keepable(bundle):
                        best, best_diff = bundle, abs(target - units)
            break
        msgs = list(best.retrieved)  # the next (earlier) message absorbs what is left
        placebo = best
    return best


# A positive-control message: "Verified steps 1-4 of 10 that solve this exact task: go west; ...; take Key_2."
VERIFIED_STEPS = "Verified steps {a}-{b} of {n} that solve this exact task: {steps}."
_VERIFIED_RE = re.compile(r"Verified steps (\d+)-(\d+) of (\d+) that solve this exact task: ([^.\n]*)\.")


def read_verified_steps(text: str | None) -> list[str]:
    """The plan that :func:`oracle_advisories`' messages in ``text`` state, in order: the
    steps of every whole message (one cut by the length bound, or whose step count does
    not match its range, says nothing), as long as they run on from step 1 without a gap.

    >>> read_verified_steps("Verified steps 3-3 of 3 that solve this exact task: drop Cup_3. "
    ...                     "Verified steps 1-2 of 3 that solve this exact task: go west; take Cup_3.")
    ['go west', 'take Cup_3', 'drop Cup_3']
    """
    parts: dict[int, list[str]] = {}
    for m in _VERIFIED_RE.finditer(text or ""):
        a, b = int(m[1]), int(m[2])
        steps = [s.strip() for s in m[4].split(";") if s.strip()]
        if b - a + 1 == len(steps):
            parts.setdefault(a, steps)
    plan: list[str] = []
    while len(plan) + 1 in parts:
        plan += parts[len(plan) + 1]
    return plan


def oracle_advisories(plan: Sequence[str], count: int, max_chars: int, task_key: str) -> list[AdvisoryV1_1]:
    """The positive control's advisories: the task's own expert plan, true and task-specific.

    ``count`` advisories (C2's count for the task, at least one, at most one per step),
    each a consecutive part of the plan, in the form C2's advisories have.
    """
    steps = [str(c) for c in plan if str(c).strip()]
    if not steps:
        return []
    count = max(1, min(int(count), len(steps)))
    sizes = [len(steps) // count + (1 if k < len(steps) % count else 0) for k in range(count)]
    out, start = [], 0
    for k, size in enumerate(sizes):
        part = steps[start:start + size]
        a, b = start + 1, start + size
        start += size
        message = VERIFIED_STEPS.format(a=a, b=b, n=len(steps), steps="; ".join(part))
        out.append(AdvisoryV1_1(
            advisory_id=f"adv_{k + 1:06d}", advisory_type="successful_override", message=message[:max_chars],
            strength="strong", relevance_score=1.0,
            evidence=EvidenceV1_1(source_episode_ids=[f"oracle:{task_key}"], principle_id="oracle_expert_plan")))
    return out


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
        injected_entry_ids: Entries the injected advisories come from (placebo: the drawn ones).
        notes: Record-only remarks (placebo draws); never shown to the model.
    """

    bundle: AdvisoryBundleV1_1
    gate_ok: bool
    reason: str
    injected_block_text: str
    context: dict
    retrieved_entry_ids: list
    injected_entry_ids: list
    notes: list


def build_memory_slot(
    store: Any,
    task: dict[str, Any],
    condition_cfg: ConditionConfig | Mapping[str, Any],
    memory_cfg: MemoryConfig,
    rng: int | np.random.Generator = 0,
    *,
    condition_name: str = "?",
    measure: Callable[[str], int] = len,
    words: WorldWords | None = None,
    facts: FactReader | None = None,
) -> MemorySlot:
    """Signature -> retrieval -> advisories -> bundle -> gate -> context, for one eval task.

    Args:
        store: The loaded :class:`~pipeline.memory.store.EpisodicStore` (its ``tie_seed``
            orders retrieval ties; load it with the config's ``seed``).
        task: A manifest row: ``scene_id``, ``quest_id``, ``objective``, ``expert_plan``
            (and optionally ``ground_truth``), used for the query and the label-hint check.
        condition_cfg: ``cfg.condition.<name>`` (a plain dict is read as a condition section).
        memory_cfg: ``cfg.memory``.
        rng: The config's seed (a per-task generator is derived from it for placebo
            draws), or a ``numpy.random.Generator`` used as is.
        condition_name: For error messages.
        measure: The length of an injected block (a placebo's is matched to C2's in it):
            ``len`` (characters), or a count of the model's tokens.
        words: The world's words in the advisories' text (:func:`pipeline.envs.world_words`);
            None: world-neutral.
        facts: The world's fact reader (:func:`pipeline.envs.fact_reader`): the kinds and
            preferences of the lessons across houses (``memory.lessons``); None: no lessons.

    Returns:
        A :class:`MemorySlot`.
    """
    controller = InjectionController.from_config(condition_cfg, memory_cfg, condition_name)
    plan, gt = task_answer(task)
    recall = _recall(store, task, memory_cfg, facts)
    if not controller.retrieval_executed:
        bundle = controller.build_slot_payload()
        return _finish(controller, bundle, [], [], [], plan, gt)

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
    store_hash = getattr(store, "store_hash", None)
    if controller.oracle:
        c2 = controller.build_slot_payload(advisories, warnings=warnings, store_hash=store_hash)
        key = f"{task.get('scene_id')}/{task.get('quest_id')}"
        oracle = oracle_advisories(plan, len(c2.retrieved), builder.max_message_chars, key)
        bundle = controller.build_slot_payload(oracle, store_hash=store_hash)
        # The positive control gives the answer on purpose: the label-hint gate is not applied.
        return _finish(controller, bundle, retrieved_ids, [], [f"oracle: {len(oracle)} advisories from the task's "
                                                                f"expert plan ({len(plan)} steps)"], [], None)
    if not controller.placebo:
        bundle = controller.build_slot_payload(advisories, warnings=warnings, store_hash=store_hash)
        return _finish(controller, bundle, retrieved_ids, kept_ids, [], plan, gt)
    return _placebo_slot(controller, store, task, rng, builder, advisories, warnings, store_hash, retrieved_ids,
                         kept_ids, plan, gt, measure, recall(unrelated=True) if recall else None)


def store_knowledge(store: Any, facts: FactReader | None) -> StoreKnowledge:
    """The store's :class:`~pipeline.memory.knowledge.StoreKnowledge`, gathered once per store
    and fact reader (kept on the store object)."""
    cache = store.__dict__.setdefault("_knowledge", {}) if hasattr(store, "__dict__") else {}
    key = type(facts).__name__ if facts is not None else None
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
    know = store_knowledge(store, facts)
    scene = str(task.get("scene_id")) if task.get("scene_id") is not None else None
    words = objective_words(str(task.get("objective") or ""), facts)

    def make(unrelated: bool = False) -> Recall:
        return Recall(know, scene, words, house=house, lessons=lessons, unrelated=unrelated)

    return make


def _placebo_slot(controller: InjectionController, store: Any, task: dict[str, Any], rng: int | np.random.Generator,
                  builder: AdvisoryBuilder, advisories: list, warnings: list, store_hash: Optional[str],
                  retrieved_ids: list, kept_ids: list, plan: list, gt: Optional[str],
                  measure: Callable[[str], int] = len, recall: Recall | None = None) -> MemorySlot:
    """The placebo's slot: what would C2 inject? Then the same count and lengths drawn from
    other scenes (nothing when C2's gate would refuse)."""
    c2_bundle = controller.build_slot_payload(advisories, warnings=warnings, store_hash=store_hash)
    c2_ok, c2_reason = controller.gate(c2_bundle, query_expert_plan=plan, query_ground_truth=gt)
    if not c2_ok:
        bundle = controller.build_slot_payload([], warnings=warnings, store_hash=store_hash)
        return _finish(controller, bundle, retrieved_ids, [], [f"placebo: C2 would inject nothing ({c2_reason})"],
                       plan, gt, reason=c2_reason)
    generator = rng if isinstance(rng, np.random.Generator) else task_rng(int(rng), task)
    c2_entries = [e for e in retrieved_ids if e in set(kept_ids)]
    placebo, sources, notes, filler = draw_placebo(
        store, c2_bundle.retrieved, query_scene_id=task.get("scene_id"), rng=generator,
        builder=builder, query_expert_plan=plan, query_ground_truth=gt, exclude_entry_ids=c2_entries, recall=recall,
    )
    bundle = controller.build_slot_payload(placebo, warnings=warnings, store_hash=store_hash)
    if len(placebo) == len(c2_bundle.retrieved):
        def names_answer(text: str) -> bool:  # any one command of the plan, or the ground truth verbatim
            return bool(named_plan_commands(text, plan) or find_label_hints(text, ground_truth=gt))

        def hinted(messages: Sequence[str]) -> bool:
            return bool(bundle_label_hints(messages, ground_truth=gt, expert_plan=plan,
                                           min_commands=builder.label_hint_min_commands))

        bundle = match_block_length(controller, c2_bundle, bundle, filler, builder.max_message_chars, measure,
                                    names_answer, hinted)
    return _finish(controller, bundle, retrieved_ids, sources, notes, plan, gt)


def _finish(controller: InjectionController, bundle: AdvisoryBundleV1_1, retrieved_ids: list, injected_ids: list,
            notes: list, plan: list, gt: Optional[str], reason: Optional[str] = None) -> MemorySlot:
    ok, gate_reason = controller.gate(bundle, query_expert_plan=plan, query_ground_truth=gt)
    if reason is not None and not ok:
        gate_reason = reason
    bundle = bundle.model_copy(update={"meta": bundle.meta.model_copy(update={"gate_reason": gate_reason})})
    AdvisoryBundleV1_1.model_validate(bundle.model_dump())  # re-check the bounds after the update
    context = controller.merge_into_context({}, bundle, ok)
    text = block_text(context)
    return MemorySlot(bundle, ok, gate_reason, text, context, retrieved_ids, injected_ids if context else [], notes)
