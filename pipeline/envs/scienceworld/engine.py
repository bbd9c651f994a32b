"""One ScienceWorld JVM per process, started on first use and stopped cleanly.

ScienceWorld's simulator is a Scala program (``scienceworld.jar`` inside the
``scienceworld`` wheel) driven through py4j. Starting a JVM costs ~1.5 s and ~300 MB,
so a process keeps one, and every episode it plays loads its task and variation into
it (``load`` is ~0.1 s); ``agent.workers`` processes have one JVM each::

    from pipeline.envs.scienceworld.engine import engine, shutdown

    sw = engine()                 # the process's scienceworld.ScienceWorldEnv (started now if needed)
    sw.load("boil", 3, "", generateGoldPath=True)
    shutdown()                    # also run at exit: the JVM is stopped and reaped

How the JVM ends: py4j launches it with ``die_on_exit`` (it exits when its stdin, a pipe
from this process, closes: so also when this process is killed), :func:`shutdown` runs at
interpreter exit (a Ctrl-C's ``KeyboardInterrupt`` included), asks the gateway to stop,
and *waits* for the JVM (killing it after ``STOP_TIMEOUT_S``), so no zombie is left
behind while this process lives on (``tests/test_scienceworld.py`` interrupts a process
and checks its JVM is gone).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import threading
from typing import Any

STOP_TIMEOUT_S = 10.0
# Steps the engine itself allows before it calls an episode complete; the adapter caps
# episodes at ``env.max_steps`` long before this.
ENGINE_STEP_LIMIT = 100_000

_lock = threading.Lock()
_env: Any = None  # the process's scienceworld.ScienceWorldEnv
_pid: int | None = None  # the process id the JVM was started in (a forked child must start its own)


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


def engine() -> Any:
    """The process's ScienceWorld simulator (a ``scienceworld.ScienceWorldEnv``), started on first call.

    Raises:
        EngineUnavailable: the package or Java is missing, or the JVM did not start.
    """
    global _env, _pid
    with _lock:
        if _env is not None and _pid == os.getpid():
            return _env
        why = missing()
        if why is not None:
            raise EngineUnavailable(f"env=scienceworld: {why}")
        from scienceworld import ScienceWorldEnv  # deferred: optional dependency, starts a JVM

        try:
            _env = ScienceWorldEnv("", envStepLimit=ENGINE_STEP_LIMIT)
        except Exception as exc:  # py4j raises several kinds when the JVM does not come up
            raise EngineUnavailable(f"env=scienceworld: the ScienceWorld JVM did not start: {exc}") from exc
        _pid = os.getpid()
        atexit.register(shutdown)  # once per started JVM (shutdown unregisters nothing: a second call is a no-op)
        return _env


def jvm_process() -> subprocess.Popen | None:
    """The running JVM's process (None when none was started in this process)."""
    if _env is None or _pid != os.getpid():
        return None
    return _env._gateway.java_process  # py4j keeps the Popen of the JVM it launched


def shutdown() -> None:
    """Stop this process's JVM and wait for it (no zombie); a no-op when none runs."""
    global _env, _pid
    with _lock:
        env, mine = _env, _pid == os.getpid()
        _env, _pid = None, None
    if env is None or not mine:
        return
    proc = env._gateway.java_process
    try:
        env.close()  # gateway shutdown + newline on stdin: die_on_exit ends the JVM
    except Exception:  # noqa: BLE001 - the JVM may already be gone (killed with us): still reap it below
        pass
    env.close = lambda: None  # the wrapper's __del__ would close the stopped gateway again
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)

