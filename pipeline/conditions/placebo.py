"""What C2_placebo injects (``kind: placebo``): the store's advisories for other scenes, as many
and as long as the ones C2 injects for the task.

Per task: retrieval runs as C2's (:func:`pipeline.memory.injection.retrieve_for`); where C2's
gate passes, as many entries of other scenes are drawn (seeded per task), each made into an
advisory of C2's form (:func:`draw_from_other_scenes`), and the messages are refit until the
block is as long as C2's in the unit the model reads (:func:`match_block_length`: the model's
tokens when a local model plays). Where C2 injects nothing, so does the placebo. The render
stage's check of it is :func:`pipeline.conditions.evidence.check_placebo_matched`; the object
that ties the two together is :class:`pipeline.conditions.sources.Placebo`.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Sequence

import numpy as np

from pipeline.core.seeding import task_rng
from pipeline.memory.advisory import (
    AdvisoryBuilder,
    Recall,
    advisory_type_for,
    bundle_label_hints,
    compose_message,
    find_label_hints,
    named_plan_commands,
)
from pipeline.memory.injection import InjectionController, MemorySlot, Retrieval, finish_slot, injected_text
from pipeline.memory.schemas import AdvisoryBundleV1_1, AdvisoryV1_1

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


def draw_from_other_scenes(
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


MIN_FITTED_CHARS = 40  # the shortest a refitted placebo message gets (a few letters would read as no advice)


def match_block_length(controller: InjectionController, reference: AdvisoryBundleV1_1,
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
    target = measure(injected_text(controller, reference))
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
        return bundle, measure(injected_text(controller, bundle))

    def keepable(bundle: AdvisoryBundleV1_1) -> bool:
        return hinted is None or not hinted([a.message for a in bundle.retrieved])

    best, best_diff = placebo, abs(target - measure(injected_text(controller, placebo)))
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


def placebo_slot(store: Any, task: dict[str, Any], got: Retrieval, rng: int | np.random.Generator,
                 measure: Callable[[str], int] = len) -> MemorySlot:
    """The placebo's slot: what would C2 inject (``got``: the task's retrieval, shown)? Then
    the same count and lengths drawn from other scenes (nothing when C2's gate would refuse)."""
    controller, builder = got.controller, got.builder
    retrieved_ids, kept_ids, plan, gt = got.retrieved_ids, got.kept_ids, got.plan, got.ground_truth
    recall = got.recall(unrelated=True) if got.recall else None
    c2_bundle = got.bundle()
    c2_ok, c2_reason = controller.gate(c2_bundle, query_expert_plan=plan, query_ground_truth=gt)
    if not c2_ok:
        return finish_slot(controller, got.bundle([]), retrieved_ids, [],
                           [f"placebo: C2 would inject nothing ({c2_reason})"], plan, gt, reason=c2_reason)
    generator = rng if isinstance(rng, np.random.Generator) else task_rng(int(rng), task)
    c2_entries = [e for e in retrieved_ids if e in set(kept_ids)]
    placebo, sources, notes, filler = draw_from_other_scenes(
        store, c2_bundle.retrieved, query_scene_id=task.get("scene_id"), rng=generator,
        builder=builder, query_expert_plan=plan, query_ground_truth=gt, exclude_entry_ids=c2_entries, recall=recall,
    )
    bundle = got.bundle(placebo)
    if len(placebo) == len(c2_bundle.retrieved):
        def names_answer(text: str) -> bool:  # any one command of the plan, or the ground truth verbatim
            return bool(named_plan_commands(text, plan) or find_label_hints(text, ground_truth=gt))

        def hinted(messages: Sequence[str]) -> bool:
            return bool(bundle_label_hints(messages, ground_truth=gt, expert_plan=plan,
                                           min_commands=builder.label_hint_min_commands))

        bundle = match_block_length(controller, c2_bundle, bundle, filler, builder.max_message_chars, measure,
                                    names_answer, hinted)
    return finish_slot(controller, bundle, retrieved_ids, sources, notes, plan, gt)
