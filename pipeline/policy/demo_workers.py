"""The demonstrations' independent parts in ``workers`` processes, merged in partition order.

:mod:`pipeline.policy.demos` cuts its work into jobs fixed by the config (a train quest's
demonstrations, a chunk of generated houses by index, a chunk of the rule agent's tasks);
every item draws its randomness from its own seed (``crc_rng``/``task_seed`` of its
identity), so a job computes the same thing in any process. :func:`demo_pool` is the pool
(:class:`pipeline.core.parallel.OrderedPool`) that runs them: in this process (``workers=1``)
or in ``n`` fresh ``spawn`` processes, each single-threaded, the results in job order: any
worker count gives the same demonstrations, byte for byte (``tests/test_demos_workers.py``)::

    with demo_pool(cfg, root, manifest, scenes, workers=4) as pool:
        shared = pool.share(memory)                       # sent to each worker once (its start)
        parts = pool.map(job_fn, [(shared, row) for row in rows], progress=ticks(bar.update))

``job_fn(ctx, job)`` is a module-level function; ``ctx`` (:class:`WorkerContext`) holds
the config, root, manifest and scenes, and ``ctx.get(shared)`` what :meth:`~pipeline.core.parallel.OrderedPool.share` sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pipeline.core.conf_schema import Config
from pipeline.core.parallel import OrderedPool, Shared, shared

THREADS = 1  # every demo worker's threads (the rule agents and the expert run no float kernel)


@dataclass
class WorkerContext:
    """What every job of a :func:`demo_pool` sees: the stage's inputs, what was shared, and a
    per-process cache (:meth:`cached`) for what jobs derive from them."""

    cfg: Config
    root: Path
    manifest: list
    scenes: dict
    cache: dict[str, Any] = field(default_factory=dict)

    def get(self, handle: Shared) -> Any:
        """The object behind a :class:`~pipeline.core.parallel.Shared` handle."""
        return shared(handle)

    def cached(self, name: str, make: Callable[[], Any]) -> Any:
        """``make()`` once per process under ``name``."""
        if name not in self.cache:
            self.cache[name] = make()
        return self.cache[name]


def demo_pool(cfg: Config, root: Path, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
              workers: int = 1) -> OrderedPool:
    """The pool of the demos' jobs: ``workers`` processes (1: this one), each pinned as the
    stage's numerics at one thread (torch left unloaded), the stage's inputs its context."""
    context = WorkerContext(cfg, Path(root), [dict(r) for r in manifest], dict(scenes))
    return OrderedPool(workers, context=context, numerics=cfg.numerics, threads=THREADS, load_torch=False)


def ticks(progress: Callable[[int], None] | None, count: Callable[[Any], int] = len) -> Callable[[Any], None] | None:
    """A pool's ``progress(result)`` that reports ``progress(count(result))`` (items, not jobs)."""
    return None if progress is None else (lambda result: progress(count(result)))
