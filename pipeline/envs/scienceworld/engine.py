"""ScienceWorld's simulators: JVMs started on first use, reused, and stopped cleanly.

ScienceWorld's simulator is a Scala program (``scienceworld.jar`` inside the
``scienceworld`` wheel) driven through py4j; one JVM holds one running simulation.
Starting one costs ~1.5 s and 150-400 MB (resident, measured), so a process keeps the ones it started in a pool:
an episode takes a simulator at ``reset`` and gives it back at ``close``, and loading its
task and variation into it costs ~0.1 s. The engine names objects of one kind (three wood
cups) by their object ids, which grow with everything a JVM has loaded, so an episode's
admissible commands depend on what its JVM played before: ``env.scienceworld.fresh_jvm``
(the default) gives every episode a JVM of its own, stopped at its end, for bytes that
depend on nothing else (~2 s an episode); without it the pool's JVMs are reused. An episode at a time (the rule agents,
``agent.batched=false``) is one JVM per worker process (``agent.workers`` processes: one
each); a batch of ``agent.batch_size`` episodes played side by side holds as many::

    from pipeline.envs.scienceworld.engine import acquire, release, shutdown, simulator

    sw = acquire()                # a scienceworld.ScienceWorldEnv of this process's pool (a JVM started if none is idle)
    sw.load("boil", 3, "", generateGoldPath=True)
    release(sw)                   # back to the pool for the next episode
    with simulator() as sw: ...   # the same, scoped
    shutdown()                    # also run at exit: every JVM stopped and reaped

How the JVMs end: py4j launches each with ``die_on_exit`` (it exits when its stdin, a pipe
from this process, closes: so also when this process is killed), :func:`shutdown` runs
at interpreter exit (a Ctrl-C's ``KeyboardInterrupt`` included), stops each gateway and
*waits* for its JVM (killing it after ``STOP_TIMEOUT_S``), so no zombie is left behind
while this process lives on (``tests/test_scienceworld.py`` interrupts a process and checks
its JVM is gone). A forked child never uses its parent's JVMs (the pool is per process id).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import threading
from typing import Any, Iterator

STOP_TIMEOUT_S = 10.0
# Steps the engine itself allows before it calls an episode complete; the adapter caps
# episodes at ``env.max_steps`` long before this.
ENGINE_STEP_LIMIT = 100_000

_lock = threading.Lock()
_idle: list[Any] = []  # started simulators no episode holds
_all: list[Any] = []  # every simulator this process started (scienceworld.ScienceWorldEnv)
_pid: int | None = None  # the process the pool belongs to
_registered = False


class EngineUnavailable(RuntimeError):
    """ScienceWorld cannot run here: the package or a Java runtime is missing (the message says how to get it)."""


def java_binary() -> str | None:
    """The ``java`` executable on PATH (None when there is none)."""
    return shutil.which("java")


def missing() -> str | None:
    """Why ScienceWorld cannot run here, or None when it can (package and Java present)."""
    try:
        import scienceworld  # noqa: F401  deferred: optional dependency (the `scienceworld` extra)
    except ImportError:
        return "the `scienceworld` package is not installed (run `make scienceworld`)"
    if java_binary() is None:
        return "no Java runtime (`java` is not on PATH; `make scienceworld` installs openjdk-17-jre-headless with apt)"
    return None


def _own_pool() -> None:
    """Forget a parent's pool in a forked child (its JVMs belong to the parent)."""
    global _pid
    if _pid != os.getpid():
        _idle.clear()
        _all.clear()
        _pid = os.getpid()


def acquire(*, fresh: bool = False) -> Any:
    """An idle simulator of this process (a ``scienceworld.ScienceWorldEnv``), a new JVM when none is
    idle or ``fresh`` (a JVM that has loaded nothing yet).

    Raises:
        EngineUnavailable: the package or Java is missing, or the JVM did not start.
    """
    global _registered
    with _lock:
        _own_pool()
        if _idle and not fresh:
            return _idle.pop()
        why = missing()
        if why is not None:
            raise EngineUnavailable(f"env=scienceworld: {why}")
        from scienceworld import ScienceWorldEnv  # deferred: optional dependency, starts a JVM

        try:
            sw = ScienceWorldEnv("", envStepLimit=ENGINE_STEP_LIMIT)
        except Exception as exc:  # py4j raises several kinds when the JVM does not come up
            raise EngineUnavailable(f"env=scienceworld: the ScienceWorld JVM did not start: {exc}") from exc
        _all.append(sw)
        if not _registered:
            atexit.register(shutdown)
            _registered = True
        return sw


def release(sw: Any, *, stop: bool = False) -> None:
    """Give a simulator back to the pool (the next episode loads its own task into it), or
    with ``stop`` end its JVM (``env.scienceworld.fresh_jvm``: each episode in a JVM of its own)."""
    with _lock:
        if _pid != os.getpid() or not any(x is sw for x in _all):
            return
        if stop:
            _all[:] = [x for x in _all if x is not sw]
            _idle[:] = [x for x in _idle if x is not sw]
        elif not any(x is sw for x in _idle):
            _idle.append(sw)
            return
        else:
            return
    _stop(sw)


@contextlib.contextmanager
def simulator() -> Iterator[Any]:
    """A simulator for the ``with`` block (:func:`acquire`, then :func:`release`)."""
    sw = acquire()
    try:
        yield sw
    finally:
        release(sw)


def jvm_processes() -> list[subprocess.Popen]:
    """The running JVMs this process started."""
    with _lock:
        if _pid != os.getpid():
            return []
        return [sw._gateway.java_process for sw in _all]  # py4j keeps the Popen of the JVM it launched


def shutdown() -> None:
    """Stop every JVM of this process and wait for each (no zombie); a no-op when none runs."""
    with _lock:
        mine = list(_all) if _pid == os.getpid() else []
        _all.clear()
        _idle.clear()
    for sw in mine:
        _stop(sw)


def _stop(sw: Any) -> None:
    """End one simulator's JVM and reap it."""
    proc = sw._gateway.java_process
    try:
        sw.close()  # gateway shutdown + newline on stdin: die_on_exit ends the JVM
    except Exception:  # noqa: BLE001 - the JVM may already be gone (killed with us): still reap it below
        pass
    sw.close = lambda: None  # the wrapper's __del__ would close the stopped gateway again
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)
