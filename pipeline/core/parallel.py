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
config section; the count a run used goes to its metrics only. :class:`OrderedPool` runs
such jobs for ``games``, ``demos`` and ``curve``: spawned workers, each started by an
initializer, the results in job order.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

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


# --------------------------------------------------------------------------- the ordered pool

_WORKER_CONTEXT: Any = None  # a spawned worker's context: what its initializer returned (set by _start)


def _start(initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    global _WORKER_CONTEXT
    _WORKER_CONTEXT = initializer(*initargs) if initializer is not None else None


def _run(fn: Callable[[Any, Any], Any], job: Any) -> Any:
    return fn(_WORKER_CONTEXT, job)


class OrderedPool:
    """Jobs in ``workers`` fresh ``spawn`` processes, their results in job order::

        with OrderedPool(n, initializer=init, initargs=(cfg,), context=ctx) as pool:
            results = pool.map(job_fn, jobs, progress=lambda result: bar.update())

    ``job_fn(context, job)`` is a module-level function. In a worker, ``context`` is what
    ``initializer(*initargs)`` returned when that process started (where it pins the numerics:
    it runs before any job); ``workers=1`` runs every job in this process, in order, with
    ``context`` (this process's own, already pinned): nothing is spawned, no initializer runs.
    The processes start at the first :meth:`map` and serve every later one; leaving the
    ``with`` block (an error or Ctrl-C included) cancels what has not started and joins them.
    """

    def __init__(self, workers: int, *, initializer: Callable[..., Any] | None = None, initargs: tuple = (),
                 context: Any = None):
        self.workers = max(1, int(workers))
        self.initializer, self.initargs, self.context = initializer, tuple(initargs), context
        self._executor: Any = None

    def __enter__(self) -> OrderedPool:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close(cancel=exc_type is not None)

    def close(self, cancel: bool = False) -> None:
        """Stop the processes (after their running jobs; ``cancel``: drop the queued ones)."""
        if self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=True, cancel_futures=cancel)

    def map(self, fn: Callable[[Any, Any], Any], jobs: Iterable[Any], *,
            progress: Callable[[Any], None] | None = None) -> list:
        """``[fn(context, job) for job in jobs]``; ``progress(result)`` as each job finishes (in
        the order they finish). A job's exception is raised here (a dead worker's:
        ``BrokenProcessPool``) once the jobs not yet started are cancelled."""
        if self.workers <= 1:
            out = []
            for job in jobs:
                out.append(fn(self.context, job))
                if progress is not None:
                    progress(out[-1])
            return out
        if self._executor is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: a clean interpreter per worker (no inherited threads, engine or model state)
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start, initargs=(self.initializer, self.initargs))
        from concurrent.futures import FIRST_COMPLETED, wait

        futures = [self._executor.submit(_run, fn, job) for job in jobs]
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    res = fut.result()
                    if progress is not None:
                        progress(res)
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
        return [f.result() for f in futures]
