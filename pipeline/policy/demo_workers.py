"""The demonstrations' independent parts in ``workers`` processes, merged in partition order.

:mod:`pipeline.policy.demos` cuts its work into jobs fixed by the config (a train quest's
demonstrations, a chunk of generated houses by index, a chunk of the rule agent's tasks);
every item draws its randomness from its own seed (``crc_rng``/``task_seed`` of its
identity), so a job computes the same thing in any process. :class:`DemoWorkers` runs the
jobs in one process (``workers=1``: in this one, as before) or in ``n`` fresh ``spawn``
processes (:class:`pipeline.core.parallel.OrderedPool`), each single-threaded, and returns
their results in job order: any worker count gives the same demonstrations, byte for byte
(``tests/test_demos_workers.py``)::

    with DemoWorkers(cfg, root, manifest, scenes, workers=4) as pool:
        shared = pool.share(memory)                       # sent to each worker once (its start)
        parts = pool.map(job_fn, [(shared, row) for row in rows], progress=bar.update)

``job_fn(ctx, job)`` is a module-level function; ``ctx`` (:class:`WorkerContext`) holds
the config, root, manifest and scenes, and ``ctx.get(shared)`` what :meth:`share` sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from omegaconf import OmegaConf

from pipeline.core.conf_schema import Config
from pipeline.core.parallel import OrderedPool


@dataclass(frozen=True)
class Shared:
    """A handle to an object :meth:`DemoWorkers.share` made available to every worker."""

    key: str


@dataclass
class WorkerContext:
    """What every job of a :class:`DemoWorkers` sees: the stage's inputs, what was shared,
    and a per-process cache (:meth:`cached`) for what jobs derive from them."""

    cfg: Config
    root: Path
    manifest: list
    scenes: dict
    objects: dict[str, Any] = field(default_factory=dict)  # Shared.key -> object (this process)
    cache: dict[str, Any] = field(default_factory=dict)

    def get(self, handle: Shared) -> Any:
        """The object behind a :class:`Shared` handle."""
        return self.objects[handle.key]

    def cached(self, name: str, make: Callable[[], Any]) -> Any:
        """``make()`` once per process under ``name``."""
        if name not in self.cache:
            self.cache[name] = make()
        return self.cache[name]


def _init_worker(cfg: Config, root: Path, manifest: list, scenes: dict, objects: dict[str, Any]) -> WorkerContext:
    """A worker's start: one thread (the numerics pinned as the stage's, at ``threads=1``); its
    context holds the stage's inputs and every object shared so far."""
    from pipeline.core.numerics import pin

    pin(OmegaConf.merge(cfg.numerics, {"threads": 1}), load_torch=False)
    return WorkerContext(cfg, Path(root), manifest, scenes, objects)


class DemoWorkers:
    """Run jobs in ``workers`` processes (1: this process), results in job order.

    Args:
        cfg, root, manifest, scenes: the stage's inputs, sent to each worker once.
        workers: processes (:func:`pipeline.core.parallel.stage_workers`); 1 runs every job here.
    """

    def __init__(self, cfg: Config, root: Path, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
                 workers: int = 1):
        self.workers = max(1, int(workers))
        self.context = WorkerContext(cfg, Path(root), [dict(r) for r in manifest], dict(scenes))
        self._pool: OrderedPool | None = None
        self._pool_objects = -1  # how many shared objects the running pool's workers were started with
        self._shared: dict[int, tuple[Any, Shared]] = {}

    def __enter__(self) -> DemoWorkers:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self._stop(cancel=exc_type is not None)
        self._shared.clear()

    def _stop(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.close(cancel=cancel)
            self._pool = None

    def _workers_pool(self) -> OrderedPool:
        """The pool, (re)started when an object was shared since its workers started: shared
        objects travel as the workers' start-up arguments (multiprocessing's own pickling
        between this run's processes), never through a file. With one worker, this process's
        context (nothing to send)."""
        if self._pool is None or self._pool_objects != len(self.context.objects):
            self._stop()
            c = self.context
            self._pool = OrderedPool(self.workers, initializer=_init_worker, context=c,
                                     initargs=(c.cfg, c.root, c.manifest, c.scenes, dict(c.objects)))
            self._pool_objects = len(c.objects)
        return self._pool

    def share(self, obj: Any) -> Shared:
        """A handle through which every job reads ``obj`` (sent to each worker once, at its start)."""
        hit = self._shared.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        handle = Shared(f"shared-{len(self._shared)}")
        self.context.objects[handle.key] = obj
        self._shared[id(obj)] = (obj, handle)  # the object is kept: its id is not reused meanwhile
        return handle

    def map(self, fn: Callable[[WorkerContext, Any], Any], jobs: Sequence[Any], *,
            progress: Callable[[int], None] | None = None, count: Callable[[Any], int] = len) -> list:
        """``[fn(ctx, job) for job in jobs]``, the jobs spread over the workers; ``progress(count(result))``
        as each job finishes (in the order they finish)."""
        tick = None if progress is None else (lambda res: progress(count(res)))
        return self._workers_pool().map(fn, jobs, progress=tick)
