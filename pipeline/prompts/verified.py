"""Verified steps: how a prompt states a plan known to solve the task, and how it is read back.

The positive control (C2_oracle, :mod:`pipeline.conditions.oracle`) writes the task's expert
plan in this form, split over its advisories; the ``reader`` agent and the policy's expert read
it back with :func:`read_verified_steps`. Written and parsed in one module, below the agents and
the conditions that both use it.
"""

from __future__ import annotations

import re

# A positive-control message: "Verified steps 1-4 of 10 that solve this exact task: go west; ...; take Key_2."
VERIFIED_STEPS = "Verified steps {a}-{b} of {n} that solve this exact task: {steps}."
_VERIFIED_RE = re.compile(r"Verified steps (\d+)-(\d+) of (\d+) that solve this exact task: ([^.\n]*)\.")


def read_verified_steps(text: str | None) -> list[str]:
    """The plan that verified-steps messages in ``text`` state, in order: the
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
