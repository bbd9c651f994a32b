"""How many processes a stage may use: the machine's, never the config's bytes.

``workers`` (top-level config key, default ``auto``) is the one setting for every stage with
independent work (``games``, ``demos``, ``collect``, ``evaluate``, ``evaluate_reader``,
``curve``, the policy's data-parallel training and its in-context probe). ``auto`` is the
cores this process may use (its CPU affinity: a container's or ``taskset``'s limit, not the
host's count); a number overrides it (``-S workers=1`` for a quiet laptop).

What a stage computes never depends on it: the work is cut into a partition fixed by the
config (whole batches, shards, micro-batches, per-item seeds), each part computed
single-threaded under the pinned numerics (:mod:`pipeline.core.numerics`), the results
merged in partition order. So ``workers`` is in no stage's DVC params and in no hashed
config section; the count a run used goes to its metrics only.
"""

from __future__ import annotations

import os
from typing import Any

AUTO = "auto"


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux: the machine's count
        return max(1, os.cpu_count() or 1)


def resolve_workers(value: Any, *, limit: int | None = None) -> int:
    """The process count ``workers`` stands for: ``auto`` -> :func:`available_cores`; a number
    -> itself; at most ``limit`` (the number of independent parts), at least 1.

    Raises:
        ValueError: neither ``auto`` nor an int >= 1 (``config.validate`` refuses it first).
    """
    if isinstance(value, str) and value == AUTO:
        n = available_cores()
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        n = value
    else:
        raise ValueError(f"params key workers={value!r}: expected a number of processes >= 1 or {AUTO}")
    if limit is not None:
        n = min(n, max(1, int(limit)))
    return max(1, n)


def stage_workers(cfg: Any, *, limit: int | None = None) -> int:
    """:func:`resolve_workers` of a composed config's ``workers`` key."""
    return resolve_workers(cfg.workers, limit=limit)
