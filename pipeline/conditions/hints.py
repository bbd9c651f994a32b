"""Label hints in a prompt: does its grounding or its memory block reveal the task's answer?

Every row of :data:`~pipeline.conditions.schema.PROMPTS_SCHEMA` records whether its
grounding text and its memory block reveal the task's answer by the advisories' label-hint
rule (:func:`pipeline.memory.advisory.find_label_hints` against the task's expert plan /
ground truth, :func:`~pipeline.memory.advisory.task_answer`, with
``memory.label_hint_min_commands``): ``grounding_label_hint`` / ``memory_label_hint``, and
how many of the plan's object commands each names (``grounding_hint_commands`` /
``memory_hint_commands``). These are counted, not enforced: the render report gives the
totals (``label_hints``), the comparison report shows them per condition. Advisories that
reveal it are already dropped before injection; the grounding is the users' feedback,
which may name the steps of a task::

    hinted, named = label_hint_of(grounding_text, task, cfg.memory.label_hint_min_commands)
    label_hint_totals(rows)   # {"prompts": 3, "grounding": 2, "memory": 1, "either": 2}
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from pipeline.memory.advisory import find_label_hints, named_plan_commands, task_answer


def label_hint_of(text: str, task: Mapping[str, Any], min_commands: int) -> tuple[bool, int]:
    """Whether ``text`` reveals ``task``'s answer by the advisories' label-hint rule
    (:func:`pipeline.memory.advisory.find_label_hints`), and how many of the expert plan's
    object commands it names.

    Args:
        text: The text the prompt shows (grounding content, memory block).
        task: A manifest row (``expert_plan``, optionally ``ground_truth``).
        min_commands: ``memory.label_hint_min_commands``.
    """
    if not text:
        return False, 0
    plan, gt = task_answer(task)
    hints = find_label_hints(text, ground_truth=gt, expert_plan=plan, min_commands=min_commands)
    return bool(hints), len(named_plan_commands(text, plan))


def label_hint_totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Prompts whose grounding / memory block reveals the task's answer, and those with either."""
    rows = list(rows)
    return {
        "prompts": len(rows),
        "grounding": sum(bool(r.get("grounding_label_hint")) for r in rows),
        "memory": sum(bool(r.get("memory_label_hint")) for r in rows),
        "either": sum(bool(r.get("grounding_label_hint")) or bool(r.get("memory_label_hint")) for r in rows),
    }
