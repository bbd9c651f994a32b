"""The demonstrations' independent parts in ``workers`` processes, merged in partition order.

:mod:`pipeline.policy.demos` cuts its work into jobs fixed by the config (a train quest's
demonstrations, a chunk of generated houses by index, a chunk of the rule agent's tasks);
every item draws its randomness from its own seed (``crc_rng``/``task_seed`` of its
identity), so a job computes the same thing in any process. :class:`DemoWorkers` runs the
jobs in one process (``workers=1``: in this one, as before) or in ``n`` fresh ``spawn``
processes, each single-threaded, and returns their results in job order: any worker
count gives the same demonstrations, byte for byte (``tests/test_demos_workers.py``)::

    with DemoWorkers(cfg, root, manifest, scenes, workers=4) as pool:
        shared = pool.share(memory)                       # sent to each worker once
        parts = pool.map(job_fn, [(shared, row) for row in rows], progress=bar.update)

``job_fn(ctx, job)`` is a module-level function; ``ctx`` (:class:`WorkerContext`) holds
the config, root, manifest and scenes, and ``ctx.get(shared)`` what :meth:`share` sent.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from omegaconf import OmegaConf

from pipeline.core.conf_schema import Config


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
        """The object behind a :class:`Shared` handle (read from its file once per process)."""
        if handle.key not in self.objects:
            with open(handle.key, "rb") as f:
                self.objects[handle.key] = pickle.load(f)
        return self.objects[handle.key]

    def cached(self, name: str, make: Callable[[], Any]) -> Any:
        """``make()`` once per process under ``name``."""
        if name not in self.cache:
            self.cache[name] = make()
        return self.cache[name]


_CONTEXT: WorkerContext | None = None  # a worker process's context (set by _init_worker)


def _init_worker(cfg: Config, root: Path, manifest: list, scenes: dict) -> None:
    """A worker's start: one thread (the numerics pinned as the stage's, at ``threads=1``)."""
    global _CONTEXT
    from pipeline.core.numerics import pin

    pin(OmegaConf.merge(cfg.numerics, {"threads": 1}), load_torch=False)
    _CONTEXT = WorkerContext(cfg, Path(root), manifest, scenes)


def _run_job(fn: Callable[[WorkerContext, Any], Any], job: Any) -> Any:
    assert _CONTEXT is not None, "a DemoWorkers job ran outside a worker"
    return fn(_CONTEXT, job)


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
        self._pool: ProcessPoolExecutor | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._shared: dict[int, tuple[Any, Shared]] = {}

    def __enter__(self) -> DemoWorkers:
        if self.workers > 1:
            import multiprocessing

            self._tmp = tempfile.TemporaryDirectory(prefix="demo_workers_")
            c = self.context
            # spawn: a clean interpreter per worker (no inherited TextWorld / thread state)
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(c.cfg, c.root, c.manifest, c.scenes))
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=exc_type is not None)
            self._pool = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self._shared.clear()

    def share(self, obj: Any) -> Shared:
        """A handle through which every job reads ``obj`` (pickled once, loaded once per worker)."""
        hit = self._shared.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        key = f"inline-{len(self._shared)}"
        if self._tmp is not None:
            key = os.path.join(self._tmp.name, f"shared_{len(self._shared)}.pkl")
            with open(key, "wb") as f:
                pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            self.context.objects[key] = obj
        handle = Shared(key)
        self._shared[id(obj)] = (obj, handle)  # the object is kept: its id is not reused meanwhile
        return handle

    def map(self, fn: Callable[[WorkerContext, Any], Any], jobs: Sequence[Any], *,
            progress: Callable[[int], None] | None = None, count: Callable[[Any], int] = len) -> list:
        """``[fn(ctx, job) for job in jobs]``, the jobs spread over the workers; ``progress(count(result))``
        as each job finishes (in the order they finish)."""
        if self._pool is None:
            out = []
            for job in jobs:
                res = fn(self.context, job)
                out.append(res)
                if progress is not None:
                    progress(count(res))
            return out
        futures = [self._pool.submit(_run_job, fn, job) for job in jobs]
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    res = fut.result()  # a job's exception is raised here (a dead worker: BrokenProcessPool)
                    if progress is not None:
                        progress(count(res))
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
        return [f.result() for f in futures]
