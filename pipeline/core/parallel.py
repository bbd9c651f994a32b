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
such jobs for every stage (``games``, ``demos``, ``collect``, ``evaluate``, ``curve``, the
policy's rollouts): spawned workers, each started by the one start-up here (:func:`_start`: the
numerics pinned, the jobs' context and shared objects received), the results in job order;
:func:`partition` cuts the work into the jobs. The policy's data-parallel training
(:mod:`pipeline.policy.model`) is the one other place that starts processes: its helpers hold
a model replica each and exchange gradients every step, which no job queue expresses.

Supervision, for every process a stage starts (the pool's workers, a collection's workers, the
policy's training helpers): a worker whose process does not run for ``agent.worker_stall_s``
seconds (default 1800; stopped, or frozen in code that holds the interpreter) is stopped and the
stage fails naming it (:class:`WorkerStalled`) instead of waiting for ever; the stage runner
sets that bound once per stage (:func:`supervised`). And a worker dies with its parent
(:func:`die_with_parent`): killed parent, no orphans left playing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence, TypeVar

AUTO = "auto"
T = TypeVar("T")


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


def partition(items: Sequence[T], size: int) -> list[list[T]]:
    """The work's fixed partition into jobs: consecutive runs of ``size`` items, in order (the
    last one shorter). A collection's batches (``agent.batch_size``: resume and shards work in
    these units), the policy's rollout batches and the demos' chunks are all cut here, so what a
    job holds follows the config, never the number of workers."""
    size = max(1, int(size))
    items = list(items)
    return [items[i:i + size] for i in range(0, len(items), size)]


# --------------------------------------------------------------------------- supervision

DEFAULT_STALL_S = 1800.0  # agent.worker_stall_s's default (pipeline/core/conf_schema.py: AgentConfig)
STALL_KEY = "agent.worker_stall_s"  # the one config key of the bound, named in every stall error
BEAT_S = 0.5  # how often a worker's watch thread beats and looks for its parent
PARENT_GRACE_S = 5.0  # after its parent died, how long a worker has to stop as Ctrl-C stops it


class WorkerStalled(RuntimeError):
    """A worker process made no progress for the stall bound; it and its siblings were stopped."""


@dataclass(frozen=True)
class Supervision:
    """The bound this process's pools and helpers run under (:func:`supervised`)."""

    stall_s: float = DEFAULT_STALL_S  # 0: wait for ever
    stage: str | None = None  # named in a stall's error


_SUPERVISION = Supervision()


@contextlib.contextmanager
def supervised(stall_s: float, stage: str | None = None) -> Iterator[Supervision]:
    """Within the block, every :class:`OrderedPool` without a ``stall_s`` of its own and every
    training helper (:mod:`pipeline.policy.model`) stops a worker whose process does not run
    for ``stall_s`` seconds (0: never) and fails naming ``stage`` (read at each check: the
    bound in force while they wait). The stage runner
    (:func:`pipeline.stages.common.run_stage`) wraps every stage in it with the config's
    ``agent.worker_stall_s``; outside any (a test, a library call) the bound is
    :data:`DEFAULT_STALL_S`."""
    global _SUPERVISION
    before, _SUPERVISION = _SUPERVISION, Supervision(float(stall_s), stage)
    try:
        yield _SUPERVISION
    finally:
        _SUPERVISION = before


def supervision() -> Supervision:
    """The bound in force (:func:`supervised`)."""
    return _SUPERVISION


PROCESS_STALL = "its process did not run, stopped or frozen"


def stall_message(what: str, age: float, stall_s: float, why: str = PROCESS_STALL) -> str:
    """One spelling of a stall, for every kind of worker."""
    where = f"{_SUPERVISION.stage}: " if _SUPERVISION.stage else ""
    return (f"{where}{what} made no progress for {age:.0f} s ({STALL_KEY}={stall_s:g} s: {why}) "
            "and was stopped with its siblings")


def die_with_parent(parent_pid: int, beat: Callable[[], None] | None = None, every: float = BEAT_S) -> threading.Thread:
    """In a worker process, first thing: a daemon thread that calls ``beat()`` every ``every``
    seconds (the parent's proof that this process runs) and, once the process that started this
    one is gone (killed by SIGKILL, SIGTERM or the OOM killer: nothing of it ran), stops this
    one as Ctrl-C would (SIGINT: a collection keeps its finished episodes, a simulator is
    reaped), then for certain after :data:`PARENT_GRACE_S`.

    Why a thread that polls ``os.getppid()`` rather than ``prctl(PR_SET_PDEATHSIG)``: the
    kernel sends that signal when the *thread* that started the child exits, not the process
    (a pool first used from a short-lived thread would lose its workers early), it is
    Linux-only, and it is one signal, with no SIGKILL after a grace for a worker that ignores
    SIGINT (the training helpers) or is stuck; a poll sees the real parent die (the child is
    re-parented: its ``getppid()`` changes) on any POSIX system within ``every`` seconds, and
    the same thread is the worker's heartbeat. ``parent_pid`` is the parent's pid as the parent
    saw it, so a parent that died before this thread started is seen too.
    """
    def watch() -> None:
        while os.getppid() == parent_pid:
            if beat is not None:
                beat()
            time.sleep(every)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), signal.SIGINT)  # the Ctrl-C path (ignored by a process that ignores Ctrl-C)
        time.sleep(PARENT_GRACE_S)
        os._exit(1)  # noqa: SLF001 - still here: the parent is gone, nothing waits for this process

    thread = threading.Thread(target=watch, name="die-with-parent", daemon=True)
    thread.start()
    return thread


def stop_processes(procs: Iterable[Any], grace_s: float = PARENT_GRACE_S, *, wait_s: float = 1.0) -> None:
    """Stop started processes, bounded: SIGCONT (a stopped one can take what it was sent: a pool's
    or a helper's end), ``wait_s`` for those already on their way out (Ctrl-C reached them too),
    then SIGINT (the Ctrl-C path), ``grace_s`` for them to finish it, then SIGKILL."""
    procs = [p for p in procs if p.pid is not None]
    for p in procs:
        if p.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
    deadline = time.monotonic() + wait_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join()


class _Watch:
    """The heartbeats of a pool's workers, in shared memory: slot ``i`` holds a worker's pid,
    its last beat (``time.monotonic()``: one clock for every process) and the job it runs."""

    def __init__(self, ctx: Any, n: int):
        self.beats = ctx.Array("d", n, lock=False)
        self.pids = ctx.Array("q", n, lock=False)
        self.jobs = ctx.Array("q", [-1] * n, lock=False)
        self.next = ctx.Value("i", 0)

    def claim(self) -> int:
        """A worker's slot (-1: none left, which a pool of ``n`` processes never sees)."""
        with self.next.get_lock():
            slot, self.next.value = self.next.value, self.next.value + 1
        if slot >= len(self.pids):
            return -1
        self.beats[slot] = time.monotonic()
        self.pids[slot] = os.getpid()
        return slot

    def beat(self, slot: int) -> None:
        if slot >= 0:
            self.beats[slot] = time.monotonic()


# --------------------------------------------------------------------------- the ordered pool

Beats = Literal["process", "job"]


@dataclass(frozen=True)
class Shared:
    """A handle to an object :meth:`OrderedPool.share` sent to every worker; a job reads the
    object with :func:`shared`."""

    key: str


_WORKER_CONTEXT: Any = None  # a spawned worker's context: the pool's, received at its start (_start)
_WORKER_SLOT: tuple[Any, int] | None = None  # (its pool's _Watch, its slot)
_SHARED: dict[str, Any] = {}  # this process's shared objects: a worker's from its start, a caller's while its pool lives
_POOLS = iter(range(1 << 62))  # each pool's prefix for its shared keys (unique in this process)


def _pin(numerics: Any, threads: int | None, load_torch: bool) -> None:
    """Pin a worker's numerics (:func:`pipeline.core.numerics.pin`) before its first job, at
    ``threads`` when given (else the config's ``numerics.threads``)."""
    from pipeline.core.numerics import pin

    if threads is not None:
        from omegaconf import OmegaConf

        numerics = OmegaConf.merge(numerics, {"threads": int(threads)})
    pin(numerics, load_torch=load_torch)


def _start(parent_pid: int, watch: _Watch, beats: Beats, numerics: Any, threads: int | None, load_torch: bool,
           context: Any, objects: dict[str, Any]) -> None:
    """Every pool worker's start-up, the only one: watched from its first line, its numerics
    pinned (before anything loads torch), its jobs' context and the pool's shared objects kept."""
    global _WORKER_CONTEXT, _WORKER_SLOT
    slot = watch.claim()
    _WORKER_SLOT = (watch, slot)
    # the watch thread beats for the process; with job beats only while no job runs (start-up, idle)
    alive = (lambda: watch.beat(slot)) if beats == "process" else (lambda: watch.jobs[slot] < 0 and watch.beat(slot))
    die_with_parent(parent_pid, beat=alive)  # before the pin: a worker's start-up is watched too
    if numerics is not None:
        _pin(numerics, threads, load_torch)
    _SHARED.update(objects)
    _WORKER_CONTEXT = context


def beat() -> None:
    """In a job: a sign of progress (a pool with ``beats="job"`` stops a running job that has not
    called it for the stall bound). Anywhere else (a job run in its caller's process): nothing."""
    if _WORKER_SLOT is not None:
        watch, slot = _WORKER_SLOT
        watch.beat(slot)


def shared(handle: Shared) -> Any:
    """The object behind a :class:`Shared` handle, in a worker or in the process that shared it."""
    return _SHARED[handle.key]


def _run(fn: Callable[[Any, Any], Any], job: Any, index: int = -1) -> Any:
    watch, slot = _WORKER_SLOT if _WORKER_SLOT is not None else (None, -1)
    if slot >= 0:
        watch.beat(slot)
        watch.jobs[slot] = index
    try:
        return fn(_WORKER_CONTEXT, job)
    finally:
        if slot >= 0:
            watch.jobs[slot] = -1
            watch.beat(slot)


class OrderedPool:
    """Jobs in ``workers`` fresh ``spawn`` processes, their results in job order::

        with OrderedPool(n, context=ctx, numerics=cfg.numerics) as pool:
            results = pool.map(job_fn, partition(items, size), progress=lambda result: bar.update())

    ``job_fn(context, job)`` is a module-level function. ``context`` is sent to each worker
    once, at its start (multiprocessing's own pickling between this run's processes, never a
    file), after the worker pinned ``numerics`` (:func:`pipeline.core.numerics.pin`, at
    ``threads`` threads when given; ``load_torch=False``: only the environment, torch left
    unloaded; ``numerics=None``: nothing pinned, for work that runs no float kernel). A context
    may cache what its jobs derive from it per process. ``workers=1`` runs every job in this
    process, in order, with ``context`` itself (this process's numerics, already pinned):
    nothing is spawned. :meth:`share` sends a further object to every worker (restarting idle
    workers that lack it); jobs read it with :func:`shared`. The processes start at the first
    :meth:`map` and serve every later one; leaving the ``with`` block normally joins them; with
    an error or Ctrl-C (a stage's SIGTERM included) it cancels what has not started and stops
    the running jobs (:func:`stop_processes`, ``grace_s`` to finish as Ctrl-C finishes them).

    Supervised: a worker that makes no progress for ``stall_s`` seconds (default: the bound of
    :func:`supervised`, the config's ``agent.worker_stall_s``; 0: never; a worker's start-up
    counts against it too) makes :meth:`map` stop every worker and raise :class:`WorkerStalled`
    naming it, its job and the bound. Progress is the process running (``beats="process"``) or,
    with ``beats="job"``, a running job calling :func:`beat` (a collection beats before every
    step: a worker blocked on a lock or a hung call is seen too). A job's exception is raised
    by :meth:`map` as it was raised; a worker that died (killed, out of memory) raises
    ``BrokenProcessPool``. A worker whose parent (this process) is killed stops within seconds
    (:func:`die_with_parent`). None of this changes what a job computes.
    """

    def __init__(self, workers: int, *, context: Any = None, numerics: Any = None, threads: int | None = None,
                 load_torch: bool = True, stall_s: float | None = None, beats: Beats = "process",
                 grace_s: float = PARENT_GRACE_S):
        if beats not in ("process", "job"):
            raise ValueError(f"OrderedPool beats={beats!r}: expected 'process' or 'job'")
        self.workers = max(1, int(workers))
        self.context, self.numerics, self.threads, self.load_torch = context, numerics, threads, load_torch
        self.beats, self.grace_s = beats, float(grace_s)
        self._stall_s = None if stall_s is None else float(stall_s)
        self._executor: Any = None
        self._watch: _Watch | None = None
        self._seen: dict[int, float] = {}  # pid -> when this process first saw it (before it claims a slot)
        self._jobs = 0
        self._prefix = f"pool{next(_POOLS)}-"
        self._objects: dict[str, Any] = {}  # what share() sent, by key
        self._handles: dict[int, tuple[Any, Shared]] = {}  # id(obj) -> (obj, handle): an object is sent once
        self._started_with = 0  # how many shared objects the running workers received

    @property
    def stall_s(self) -> float:
        """The bound: this pool's own, else the one in force (:func:`supervised`)."""
        return supervision().stall_s if self._stall_s is None else self._stall_s

    def __enter__(self) -> OrderedPool:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close(cancel=exc_type is not None)

    def share(self, obj: Any) -> Shared:
        """A handle through which every job reads ``obj`` (:func:`shared`): sent to each worker
        once, at its start (workers already running are restarted at the next :meth:`map`);
        the same object shared twice gives the same handle."""
        hit = self._handles.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        handle = Shared(f"{self._prefix}{len(self._objects)}")
        self._objects[handle.key] = _SHARED[handle.key] = obj
        self._handles[id(obj)] = (obj, handle)  # the object is kept: its id is not reused meanwhile
        return handle

    def _processes(self) -> list[Any]:
        # ProcessPoolExecutor's own table of its processes ({pid: Process}; CPython 3.8-3.13)
        return list((getattr(self._executor, "_processes", None) or {}).values())

    def _stalled(self, procs: list[Any]) -> tuple[int, float, int] | None:
        """(pid, seconds since its last beat, its job or -1) of the stalest worker past the bound."""
        if self.stall_s <= 0 or self._watch is None:
            return None
        now, w = time.monotonic(), self._watch
        slots = {w.pids[i]: i for i in range(len(w.pids)) if w.pids[i]}
        worst = None
        for p in procs:
            if p.pid is None or not p.is_alive():
                continue
            i = slots.get(p.pid)
            age = now - (w.beats[i] if i is not None else self._seen.setdefault(p.pid, now))
            if age > self.stall_s and (worst is None or age > worst[1]):
                worst = (p.pid, age, w.jobs[i] if i is not None else -1)
        return worst

    def _stall_error(self, stalled: tuple[int, float, int]) -> WorkerStalled:
        pid, age, job = stalled
        doing = f"running job {job + 1} of {self._jobs}" if job >= 0 else "between jobs or starting"
        why = PROCESS_STALL if self.beats == "process" or job < 0 else "its job took no step"
        return WorkerStalled(stall_message(f"worker process {pid} of workers={self.workers} ({doing})", age,
                                           self.stall_s, why))

    def close(self, cancel: bool = False) -> None:
        """Stop the processes: after their running jobs, a stalled one stopped after the bound;
        ``cancel``: drop the queued jobs and stop the running ones (:func:`stop_processes`).
        The shared objects are released."""
        self._stop(cancel)
        for key in self._objects:
            _SHARED.pop(key, None)
        self._objects, self._handles = {}, {}

    def _stop(self, cancel: bool = False) -> None:
        if self._executor is None:
            return
        procs, manager = self._processes(), getattr(self._executor, "_executor_manager_thread", None)
        executor, self._executor = self._executor, None
        executor.shutdown(wait=False, cancel_futures=cancel)
        if cancel:
            stop_processes(procs, self.grace_s)
        else:
            while any(p.is_alive() for p in procs):
                for p in procs:
                    p.join(BEAT_S / len(procs))
                if self._stalled(procs) is not None:
                    stop_processes(procs, self.grace_s, wait_s=0.0)
        if manager is not None:
            manager.join(PARENT_GRACE_S)

    def _executor_for_map(self) -> Any:
        """The running workers; started (again, when an object was shared since) as needed."""
        if self._executor is not None and self._started_with != len(self._objects):
            self._stop()  # between maps: every worker idle
        if self._executor is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: a clean interpreter per worker (no inherited threads, engine or model state)
            ctx = multiprocessing.get_context("spawn")
            self._watch, self._seen = _Watch(ctx, self.workers), {}
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=ctx, initializer=_start,
                initargs=(os.getpid(), self._watch, self.beats, self.numerics, self.threads, self.load_torch,
                          self.context, dict(self._objects)))
            self._started_with = len(self._objects)
        return self._executor

    def map(self, fn: Callable[[Any, Any], Any], jobs: Iterable[Any], *,
            progress: Callable[[Any], None] | None = None, waiting: Callable[[], None] | None = None) -> list:
        """``[fn(context, job) for job in jobs]``; ``progress(result)`` as each job finishes (in
        the order they finish); ``waiting()`` about once a second while spawned workers run them
        (a caller's finer progress: a collection counts its checkpointed episodes). A job's
        exception is raised here (a dead worker's: ``BrokenProcessPool``; a stalled one's:
        :class:`WorkerStalled`, every worker stopped) once the jobs not yet started are cancelled."""
        if self.workers <= 1:
            out = []
            for job in jobs:
                out.append(fn(self.context, job))
                if progress is not None:
                    progress(out[-1])
            return out
        executor = self._executor_for_map()
        from concurrent.futures import FIRST_COMPLETED, wait

        jobs = list(jobs)
        self._jobs = len(jobs)
        futures = [executor.submit(_run, fn, job, i) for i, job in enumerate(jobs)]
        pending = set(futures)
        poll = None if self.stall_s <= 0 else min(1.0, self.stall_s / 4)
        if waiting is not None:
            poll = 1.0 if poll is None else poll
        try:
            while pending:
                done, pending = wait(pending, timeout=poll, return_when=FIRST_COMPLETED)
                if waiting is not None:
                    waiting()
                for fut in done:
                    res = fut.result()
                    if progress is not None:
                        progress(res)
                if pending:
                    stalled = self._stalled(self._processes())
                    if stalled is not None:
                        error = self._stall_error(stalled)
                        self.close(cancel=True)
                        raise error
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
        return [f.result() for f in futures]
