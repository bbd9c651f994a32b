"""The evidence checks: what the model would see under a condition agrees with what it says.

Checks run on the text the model sees (the frozen prompt filled with a probe observation
and the memory defaults: :meth:`~pipeline.conditions.render.Renderer.seen_text`); a failure
raises :class:`EvidenceError`:

1. an exposed condition's prompt whose gate passed contains its injected block;
2. every prompt equals the no-memory prompt of its task (with the condition's grounding
   setting) with its injected block removed (so the memory block is the only difference,
   and a prompt without one is identical);
3. a masked condition (C0, C1, C2_silent: ``kind`` none or silent, whose exposure shows
   nothing: :func:`pipeline.conditions.sources.is_exposed`) injects nothing and shows no advisory text (slot name, heading, advisory JSON, messages);
4. for the same task, the prompts of all masked conditions with the same grounding
   setting are byte-identical (C1 and C2_silent);
5. a condition without grounding shows none of its scene's grounding text;
6. a placebo (C2_placebo), wherever its reference (the exposed, real-memory condition
   with the same grounding: C2, :func:`pipeline.conditions.sources.placebo_reference`) injects, injects as many
   advisories, from entries C2 did not inject and of other scenes than the task's, in a
   block within 2% of C2's length in the model's tokens (characters when no local model
   plays: :func:`~pipeline.conditions.length.block_length_for`); where C2 injects nothing,
   neither does it. Where the store has too few such entries (a world with one seen
   scene), the placebo injects nothing and the task is listed as ``placebo_unavailable``
   in the render report, not as a violation;
7. an oracle (C2_oracle) injects, for every task with an expert plan, a block that holds
   every step of that plan.

:func:`pipeline.conditions.render.run_evidence_checks` runs checks 1-5 that apply to one
condition with a renderer, given the rows of every configured condition, and the condition's
own (6, 7) through its object's ``checks`` (:mod:`pipeline.conditions.sources`); the ``check_*``
functions here are pure, over plain rows::

    check_masked_identical({"C1": {"s0/q0": text}, "C2_silent": {"s0/q0": text}})   # []
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

#: Notes of a placebo the store could not supply (pipeline.conditions.placebo.draw_from_other_scenes).
PLACEBO_UNAVAILABLE = ("too few entries of other scenes", "no entries of other scenes")


class EvidenceError(RuntimeError):
    """An evidence check failed: what the model would see contradicts the condition.

    Attributes:
        violations: Every violation, ``"[<check>] <condition> <task_id>: <what>"``.
    """

    def __init__(self, message: str, violations: Sequence[str] = ()):
        super().__init__(message)
        self.violations = list(violations)


# --------------------------------------------------------------------------- the checks
# Pure functions over plain rows: each returns the list of violations (empty = passed).
# A row carries task_id, condition, gate_ok, memory_block, and seen_prompt / seen_block:
# the text the model sees and the block as it appears there.


def check_injected_blocks(rows: Iterable[Mapping[str, Any]], *, exposed: bool) -> list[str]:
    """An exposed condition's prompt whose gate passed contains its (non-empty) block;
    a prompt whose gate refused carries no block."""
    out = []
    for row in rows:
        tid, block, prompt = row["task_id"], row["seen_block"], row["seen_prompt"]
        if row["gate_ok"] and exposed:
            if not block:
                out.append(f"{row['condition']} {tid}: gate passed but no memory block was injected")
            elif block not in prompt:
                out.append(f"{row['condition']} {tid}: gate passed but the prompt lacks its memory block")
        elif block:
            out.append(f"{row['condition']} {tid}: memory block injected although "
                       f"{'the gate refused (' + str(row.get('gate_reason')) + ')' if exposed else 'the condition is masked'}")
    return out


def check_only_block_differs(rows: Iterable[Mapping[str, Any]], baseline: Mapping[str, str]) -> list[str]:
    """Each prompt, with its block removed once, equals its task's no-memory prompt."""
    out = []
    for row in rows:
        tid, block, prompt = row["task_id"], row["seen_block"], row["seen_prompt"]
        if tid not in baseline:
            out.append(f"{row['condition']} {tid}: no reference prompt for this task")
            continue
        stripped = prompt.replace(block, "", 1) if block else prompt
        if stripped != baseline[tid]:
            out.append(f"{row['condition']} {tid}: differs from the no-memory prompt beyond its memory block "
                       f"(first difference at character {_first_diff(stripped, baseline[tid])})")
    return out


def check_no_advisory_text(rows: Iterable[Mapping[str, Any]], advisory_texts: Mapping[str, Iterable[str]],
                           markers: Sequence[str], allowed: Mapping[str, str] | None = None) -> list[str]:
    """A masked condition's prompt injects nothing and shows no advisory text.

    Args:
        rows: Rows of a masked condition.
        advisory_texts: Per task, the advisory messages retrieval produced (any condition).
        markers: Strings only an injected slot contains (slot name, heading, ``"advisory_id"``).
        allowed: Per task, text the prompt legitimately shows without memory (its
            grounding and objective, which may quote the feedback an advisory was built
            from); a message found there is not counted.
    """
    out = []
    for row in rows:
        tid, prompt = row["task_id"], row["seen_prompt"]
        if row["seen_block"]:
            out.append(f"{row['condition']} {tid}: masked condition has a memory block")
        for m in markers:
            if m and m in prompt:
                out.append(f"{row['condition']} {tid}: prompt contains {m!r}")
        ok_text = (allowed or {}).get(tid, "")
        for msg in sorted(set(advisory_texts.get(tid, ()))):
            if msg and msg in prompt and msg not in ok_text:
                out.append(f"{row['condition']} {tid}: prompt contains advisory text {msg[:60]!r}")
    return out


def check_masked_identical(seen_by_condition: Mapping[str, Mapping[str, str]]) -> list[str]:
    """For each task, the prompts of every masked condition (C1, C2_silent) are byte-identical."""
    out = []
    conds = sorted(seen_by_condition)
    if len(conds) < 2:
        return out
    first = conds[0]
    tasks = set().union(*(set(v) for v in seen_by_condition.values()))
    for tid in sorted(tasks):
        ref = seen_by_condition[first].get(tid)
        for c in conds[1:]:
            other = seen_by_condition[c].get(tid)
            if ref is None or other is None:
                out.append(f"{tid}: missing under {first if ref is None else c}")
            elif other.encode("utf-8") != ref.encode("utf-8"):
                out.append(f"{tid}: {c} differs from {first} (first difference at character "
                           f"{_first_diff(other, ref)})")
    return out


def check_no_grounding_text(rows: Iterable[Mapping[str, Any]], scene_grounding: Mapping[str, str]) -> list[str]:
    """A condition without grounding shows no line of its scene's grounding text."""
    out = []
    for row in rows:
        tid, prompt = row["task_id"], row["seen_prompt"]
        lines = [ln.strip() for ln in scene_grounding.get(tid, "").splitlines() if len(ln.strip()) >= 20]
        leaked = next((ln for ln in lines if ln in prompt), None)
        if leaked is not None:
            out.append(f"{row['condition']} {tid}: prompt contains grounding text {leaked[:60]!r}")
    return out


def placebo_unavailable(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Tasks whose placebo injects nothing because the store ran out of eligible entries."""
    return [row["task_id"] for row in rows if not row["injected"]
            and any(u in str(n) for n in row.get("notes") or [] for u in PLACEBO_UNAVAILABLE)]


def check_placebo_matched(placebo: Iterable[Mapping[str, Any]], reference: Iterable[Mapping[str, Any]],
                          entry_scene: Mapping[str, str], tolerance: float = 0.02,
                          measure: Callable[[str], int] = len, unit: str = "characters") -> list[str]:
    """A placebo matches its reference (C2) task by task: as many advisories, none from an
    entry the reference injected or of the task's scene, a block within ``tolerance`` of
    the reference's length (``measure``: characters, or the model's tokens); nothing where
    the reference injects nothing. A task the store could not supply
    (:func:`placebo_unavailable`) is not a violation."""
    placebo = list(placebo)
    unavailable = set(placebo_unavailable(placebo))
    placebo = [row for row in placebo if row["task_id"] not in unavailable]
    out = []
    ref = {row["task_id"]: row for row in reference}
    for row in placebo:
        tid, c = row["task_id"], row["condition"]
        r2 = ref.get(tid)
        if r2 is None:
            out.append(f"{c} {tid}: no reference row")
            continue
        if not r2["injected"]:
            if row["injected"]:
                out.append(f"{c} {tid}: injects although the reference {r2['condition']} injects nothing")
            continue
        if not row["injected"]:
            out.append(f"{c} {tid}: injects nothing although {r2['condition']} does")
            continue
        if len(row["advisory_ids"]) != len(r2["advisory_ids"]):
            out.append(f"{c} {tid}: {len(row['advisory_ids'])} advisories, {r2['condition']} {len(r2['advisory_ids'])}")
        shared = sorted(set(row["injected_entry_ids"]) & set(r2["injected_entry_ids"]))
        if shared:
            out.append(f"{c} {tid}: injects entries {r2['condition']} injected too: {', '.join(shared[:3])}")
        same_scene = [e for e in row["injected_entry_ids"] if entry_scene.get(e) == str(row["scene_id"])]
        if same_scene:
            out.append(f"{c} {tid}: injects entries of the task's own scene: {', '.join(same_scene[:3])}")
        a, b = measure(row["memory_block"]), measure(r2["memory_block"])
        if abs(a - b) > tolerance * b:
            out.append(f"{c} {tid}: block of {a} {unit}, {r2['condition']}'s {b} (more than {tolerance:.0%} apart)")
    return out


def check_oracle_content(rows: Iterable[Mapping[str, Any]], plans: Mapping[str, Sequence[str]]) -> list[str]:
    """An oracle's block holds every step of its task's expert plan."""
    out = []
    for row in rows:
        tid, plan = row["task_id"], [str(p) for p in plans.get(row["task_id"], []) if str(p).strip()]
        if not plan:
            continue
        if not row["injected"]:
            out.append(f"{row['condition']} {tid}: the positive control injects nothing")
            continue
        missing = [p for p in plan if p not in row["memory_block"]]
        if missing:
            out.append(f"{row['condition']} {tid}: block lacks plan steps {missing[:3]}")
    return out


def _first_diff(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
