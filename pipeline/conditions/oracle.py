"""What C2_oracle injects (``kind: oracle``, the positive control): the task's own expert plan,
true and task-specific (the answer, on purpose), in the form C2's advisories have.

Per task: retrieval runs as C2's (:func:`pipeline.memory.injection.retrieve_for`), and the
oracle injects as many advisories as C2 would (at least one, at most one per step), each a
consecutive part of the plan: ``Verified steps 1-4 of 10 that solve this exact task: ...``.
The message's form is :mod:`pipeline.prompts.verified`'s, whose
:func:`~pipeline.prompts.verified.read_verified_steps` reads such a plan back out of a prompt
(the ``reader`` agent and the policy's expert follow it). The render stage's check is
:func:`pipeline.conditions.evidence.check_oracle_content`; the object that ties them
together is :class:`pipeline.conditions.sources.Oracle`.
"""

from __future__ import annotations

from typing import Sequence

from pipeline.memory.injection import MemorySlot, Retrieval, finish_slot
from pipeline.memory.schemas import AdvisoryV1_1, EvidenceV1_1
from pipeline.prompts.verified import VERIFIED_STEPS, read_verified_steps

__all__ = ["oracle_advisories", "oracle_slot", "read_verified_steps"]


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


def oracle_slot(task: dict, got: Retrieval) -> MemorySlot:
    """The oracle's slot: as many advisories as C2's bundle holds for the task (``got``: its
    retrieval, shown), from the task's plan. The positive control gives the answer on purpose:
    the label-hint gate is not applied."""
    key = f"{task.get('scene_id')}/{task.get('quest_id')}"
    oracle = oracle_advisories(got.plan, len(got.bundle().retrieved), got.builder.max_message_chars, key)
    bundle = got.bundle(oracle, warnings=[])  # the oracle's bundle carries none of retrieval's warnings
    note = f"oracle: {len(oracle)} advisories from the task's expert plan ({len(got.plan)} steps)"
    return finish_slot(got.controller, bundle, got.retrieved_ids, [], [note], [], None)
