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
``agent.batched=false``) is one JVM per worker process (``workers`` processes: one
each); a batch of ``agent.batch_size`` episodes played side by side holds as many::

    from pipeline.envs.scienceworld.engine import acquire, release, shutdown, simulator

    sw = acquire()                # a scienceworld.ScienceWorldEnv of this process's pool (a JVM started if none is idle)
    sw.load("boil", 3, "", generateGoldPath=True)
    release(sw)                   # back to the pool for the next episode
    with simulator() as sw: ...   # the same, scoped
    shutdown()                    # also run at exit: every JVM stopped and reaped

Trust and limits. Each JVM's py4j gateway, and the callback server this process opens for
it, require the random token py4j's ``--enable-auth`` gives at launch: another local process
that connects to either port without it is refused (``tests/test_scienceworld.py``). Every
call has a read timeout (``env.scienceworld.call_timeout_s``) and each JVM a heap limit
(``env.scienceworld.jvm_heap_mb``, ``-Xmx``). The first unanswered command ends the gateway
client (every later command fails at once): a call waits one timeout, never one per command py4j
sends for it (a field lookup's timeout, which py4j swallows, then the call's own: ~2x, measured).
A new JVM has ``env.scienceworld.start_timeout_s`` to print its port and load the simulator's
classes, or it is killed and :func:`acquire` raises :class:`EngineUnavailable`. A call that times
out or finds its JVM dead raises :class:`EngineFailed` from :func:`answering` after the simulator is discarded (its
JVM killed and reaped): it never goes back into the pool, and neither does one whose JVM
exited while it was held or idle (:func:`release`, :func:`acquire` check), so the next
episode gets a new JVM::

    sw = acquire(fresh=True, call_timeout_s=60.0, heap_mb=1024, start_timeout_s=120.0)  # or **limits(sc)
    with answering(sw, "boil v3 step 4"):
        sw.server.step("look around")          # EngineFailed when it hangs past the timeout

How the JVMs end: each is launched as py4j's ``launch_gateway`` does, with ``die_on_exit`` (it
exits when its stdin, a pipe from this process, closes: so also when this process is killed), :func:`shutdown` runs
at interpreter exit (a Ctrl-C's ``KeyboardInterrupt`` included), stops each gateway and
*waits* for its JVM (killing it after ``STOP_TIMEOUT_S``), so no zombie is left behind
while this process lives on (``tests/test_scienceworld.py`` interrupts a process and checks
its JVM is gone). A forked child never uses its parent's JVMs (the pool is per process id).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from typing import Any, Iterator

STOP_TIMEOUT_S = 10.0
# Defaults of env.scienceworld.call_timeout_s, .jvm_heap_mb and .start_timeout_s (pipeline/core/conf_schema.py),
# for callers without a config. A new JVM has START_TIMEOUT_S to print its port and answer its first calls
# (they load the simulator's classes: seconds on a busy machine); calls after that have call_timeout_s.
CALL_TIMEOUT_S = 60.0
HEAP_MB = 1024
START_TIMEOUT_S = 120.0
# Every object's identity hash is the same constant: the engine iterates hash sets of its objects, whose
# order otherwise changes from one JVM to the next (the gold sequence of a find-* task focused on another
# thing in each JVM: 3 different golds in 4 JVMs, measured; 4 equal ones with this). About 10% slower a step.
JAVA_DETERMINISM = ("-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2")
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


class EngineFailed(RuntimeError):
    """A simulator gave no answer within its call timeout, or its JVM died: it was discarded (JVM killed)."""


def limits(sc: Any) -> dict[str, Any]:
    """:func:`acquire`'s limits from the ``env.scienceworld`` config group."""
    return {"call_timeout_s": float(sc.call_timeout_s), "heap_mb": int(sc.jvm_heap_mb),
            "start_timeout_s": float(sc.start_timeout_s)}


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


def acquire(*, fresh: bool = False, call_timeout_s: float = CALL_TIMEOUT_S, heap_mb: int = HEAP_MB,
            start_timeout_s: float = START_TIMEOUT_S) -> Any:
    """An idle simulator of this process (a ``scienceworld.ScienceWorldEnv``) started with the same
    limits, a new JVM when none is idle or ``fresh`` (a JVM that has loaded nothing yet). An idle
    one whose JVM has exited is reaped and skipped.

    Args:
        fresh: a new JVM even when one is idle.
        call_timeout_s: a new JVM's read timeout on every call (``env.scienceworld.call_timeout_s``).
        heap_mb: a new JVM's heap limit, ``-Xmx`` (``env.scienceworld.jvm_heap_mb``).
        start_timeout_s: how long a new JVM may take to print its port and answer its first calls
            (``env.scienceworld.start_timeout_s``); past it the JVM is killed.

    Raises:
        EngineUnavailable: the package or Java is missing, or the JVM did not start (within start_timeout_s).
    """
    global _registered
    with _lock:
        _own_pool()
        wanted = (float(call_timeout_s), int(heap_mb))
        for sw in reversed(list(_idle) if not fresh else []):
            if not _alive(sw):  # exited (or missed a call's timeout) while idle: reaped, never handed out
                _forget(sw)
                _reap(sw, kill=True)
            elif sw.limits == wanted:
                _idle[:] = [x for x in _idle if x is not sw]
                return sw
        why = missing()
        if why is not None:
            raise EngineUnavailable(f"env=scienceworld: {why}")
        try:
            sw = _launch(call_timeout_s, heap_mb, start_timeout_s)
        except Exception as exc:  # py4j raises several kinds when the JVM does not come up
            raise EngineUnavailable(f"env=scienceworld: the ScienceWorld JVM did not start: {exc}") from exc
        _all.append(sw)
        if not _registered:
            atexit.register(shutdown)
            _registered = True
        return sw


def _launch(call_timeout_s: float, heap_mb: int, start_timeout_s: float = START_TIMEOUT_S) -> Any:
    """A ``ScienceWorldEnv`` on a JVM started here: the gateway and its callback server with py4j's
    auth token, every call with a read timeout, the heap limited, the start within ``start_timeout_s``.

    ``ScienceWorldEnv.__init__`` launches an unauthenticated gateway with no timeout and no
    heap limit and takes no option to change that, so the object is built here and given what
    its ``__init__`` sets after the launch (scienceworld 1.2.3, pinned in pyproject.toml;
    every test that plays checks the result).
    """
    # deferred: optional dependency (the `scienceworld` extra and its py4j)
    from py4j.java_gateway import CallbackServerParameters, GatewayParameters
    from scienceworld import ScienceWorldEnv

    deadline = time.monotonic() + float(start_timeout_s)
    port, token, proc = _start_jvm(heap_mb, float(start_timeout_s))
    gateway = None
    try:
        # The first calls load the simulator's classes: each may wait what is left of start_timeout_s.
        params = GatewayParameters(auto_field=True, port=port, auth_token=token,
                                   read_timeout=max(deadline - time.monotonic(), 0.01))
        gateway = _gateway_class()(
            gateway_parameters=params,
            callback_server_parameters=CallbackServerParameters(port=0, daemonize=True, auth_token=token),
            java_process=proc)
        server = gateway.java_gateway_server  # the JVM's callback client: to our callback server's port
        server.resetCallbackClient(server.getCallbackClient().getAddress(),
                                   gateway.get_callback_server().get_listening_port())
        sw = ScienceWorldEnv.__new__(ScienceWorldEnv)
        sw._gateway = gateway
        sw.server = gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        sw.lastStepScore = 0
        sw.taskName = None
        sw.envStepLimit = ENGINE_STEP_LIMIT
        sw.clear_run_histories()
        sw.goldPathGenerated = False
        sw._obj_tree_tempdir = tempfile.TemporaryDirectory()
        sw.limits = (float(call_timeout_s), int(heap_mb))  # what acquire() matches an idle one on
        params.read_timeout = float(call_timeout_s)  # every call from now on (the client shares `params`)
        gateway._gateway_client.close()  # its pooled connections reopen with it
        return sw
    except BaseException as exc:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)
        if gateway is not None:  # its callback server's thread too
            with contextlib.suppress(Exception):
                gateway.close(keep_callback_server=False)
        if isinstance(exc, Exception) and time.monotonic() >= deadline:
            raise RuntimeError(f"no answer within env.scienceworld.start_timeout_s={start_timeout_s:g} s "
                               f"(java, pid {proc.pid}, was killed)") from exc
        raise


def _start_jvm(heap_mb: int, start_timeout_s: float) -> tuple[int, bytes, subprocess.Popen]:
    """py4j's ``launch_gateway`` (the same command, pipes and output threads), but with a bound: a
    ``java`` that prints no gateway port and auth token within ``start_timeout_s``, or exits first, is
    killed and reaped and this raises (``launch_gateway`` reads the port with no timeout)."""
    from py4j.java_gateway import OutputConsumer, ProcessConsumer, find_jar_path  # deferred: optional dependency
    from scienceworld.constants import BASEPATH, JAR_PATH

    command = [java_binary() or "java", "-classpath", os.pathsep.join((find_jar_path(), JAR_PATH)),
               f"-Xmx{int(heap_mb)}m", *JAVA_DETERMINISM, "py4j.GatewayServer", "--die-on-broken-pipe",
               "--enable-auth", "0"]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            cwd=BASEPATH)
    lines: list[bytes] = []

    def read() -> None:  # its port, then its token; b"" once it exits
        for _ in range(2):
            lines.append(proc.stdout.readline())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        reader.join(start_timeout_s)
        if reader.is_alive():
            raise RuntimeError(f"java printed no gateway port within env.scienceworld.start_timeout_s="
                               f"{start_timeout_s:g} s (pid {proc.pid}, killed)")
        port = int(lines[0])
        token = lines[1][:-len(os.linesep)]
        if not token:
            raise ValueError("no auth token")
    except BaseException as exc:  # a Ctrl-C while waiting too: the java is never left running
        proc.kill()
        code = proc.wait(timeout=STOP_TIMEOUT_S)
        if isinstance(exc, (ValueError, IndexError)):
            raise RuntimeError(f"java exited (code {code}) or printed no gateway port and token: "
                               f"{lines!r}") from exc
        raise
    devnull = open(os.devnull, "w")  # what py4j does with the JVM's stdout from here on
    OutputConsumer(devnull, proc.stdout, daemon=True).start()
    ProcessConsumer(proc, [devnull], daemon=True).start()
    return port, token, proc


@functools.cache
def _gateway_class() -> type:
    """py4j's ``JavaGateway`` whose client gives up on its JVM at the first command that got no answer
    within the read timeout: every later command fails at once (``Py4JNetworkError``). py4j's own client
    swallows a timed-out field lookup (``auto_field``: every first use of a method name, on every Java
    object a call returns) and a timed-out garbage-collection message, then sends the next command,
    which waits its own timeout: a call on a wedged JVM took ~2x ``call_timeout_s`` (measured)."""
    from py4j.java_gateway import GatewayClient, GatewayConnection, JavaGateway  # deferred: optional dependency
    from py4j.protocol import Py4JNetworkError

    class Connection(GatewayConnection):
        client: Any = None  # a weak reference to its GatewayClient

        def send_command(self, command: str) -> str:  # also the auth command, at connect
            try:
                return super().send_command(command)
            except Py4JNetworkError as exc:
                if isinstance(exc.cause, socket.timeout):
                    _give_up(self.client)
                raise

    def _give_up(ref: Any) -> None:
        client = ref() if ref is not None else None
        if client is not None:
            client.is_connected = False  # _get_connection raises from now on

    class Client(GatewayClient):
        def _create_connection(self) -> Any:
            connection = Connection(self.gateway_parameters, self.gateway_property)
            connection.client = weakref.ref(self)
            try:
                connection.start()
            except Py4JNetworkError as exc:  # a connect that timed out
                if isinstance(exc.cause, socket.timeout):
                    self.is_connected = False
                raise
            return connection

    class Gateway(JavaGateway):
        def _create_gateway_client(self) -> Any:
            return Client(gateway_parameters=self.gateway_parameters)

    return Gateway


def release(sw: Any, *, stop: bool = False) -> None:
    """Give a simulator back to the pool (the next episode loads its own task into it), or
    with ``stop`` end its JVM (``env.scienceworld.fresh_jvm``: each episode in a JVM of its own).
    One whose JVM has exited (crashed, killed), or left a command unanswered past its timeout, never
    goes back: it is killed, reaped and forgotten."""
    with _lock:
        if _pid != os.getpid() or not any(x is sw for x in _all):
            return
        if not _alive(sw):
            _forget(sw)
            dead = True
        elif stop:
            _forget(sw)
            dead = False
        else:
            if not any(x is sw for x in _idle):
                _idle.append(sw)
            return
    if dead:
        _reap(sw, kill=True)
    else:
        _stop(sw)


def discard(sw: Any) -> None:
    """Kill a simulator's JVM (it may be wedged: no polite shutdown), reap it, and forget it."""
    with _lock:
        mine = _pid == os.getpid() and any(x is sw for x in _all)
        if mine:
            _forget(sw)
    if mine:
        _reap(sw, kill=True)


@contextlib.contextmanager
def answering(sw: Any, what: str) -> Iterator[Any]:
    """Engine calls on ``sw``: one that got no answer (timed out) or found its JVM gone discards the
    simulator (:func:`discard`) and raises :class:`EngineFailed` naming ``what`` and why. An error
    the JVM answered with (an exception the engine threw, an unknown method) passes through unchanged.
    """
    try:
        yield sw
    except Exception as exc:
        proc = sw._gateway.java_process
        code = proc.poll()
        if code is None and not _unanswered(exc):
            raise
        why = (f"its JVM (pid {proc.pid}) exited with code {code}" if code is not None else
               f"no answer within env.scienceworld.call_timeout_s={sw.limits[0]:g} s "
               f"(its JVM, pid {proc.pid}, was killed)")
        discard(sw)
        raise EngineFailed(f"ScienceWorld {what}: {why}; the simulator was discarded, never reused") from exc


@contextlib.contextmanager
def simulator(**kwargs: Any) -> Iterator[Any]:
    """A simulator for the ``with`` block (:func:`acquire` with ``kwargs``, then :func:`release`)."""
    sw = acquire(**kwargs)
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


def _unanswered(exc: BaseException) -> bool:
    """Whether a py4j call failed for want of an answer (a read timeout, a refused or dropped
    connection), not with one: py4j raises a bare ``Py4JError`` (no Java trace) when its client
    got no answer, ``Py4JNetworkError`` when it could not connect, and ``Py4JJavaError`` or a
    ``Py4JError`` quoting a trace when the JVM answered with an error."""
    from py4j.protocol import Py4JError, Py4JJavaError, Py4JNetworkError  # deferred: optional dependency

    if isinstance(exc, Py4JNetworkError):
        return True
    return isinstance(exc, Py4JError) and not isinstance(exc, Py4JJavaError) and "Trace:" not in str(exc)


def _alive(sw: Any) -> bool:
    """Whether the simulator's JVM is still running and its client still talks to it (no command of
    it went unanswered past the timeout: :func:`_gateway_class`)."""
    return sw._gateway.java_process.poll() is None and sw._gateway._gateway_client.is_connected


def _forget(sw: Any) -> None:
    """Take a simulator out of the pool (the caller holds ``_lock``)."""
    _all[:] = [x for x in _all if x is not sw]
    _idle[:] = [x for x in _idle if x is not sw]


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


def _reap(sw: Any, *, kill: bool = False) -> None:
    """A JVM that exited, or with ``kill`` one that may be wedged: killed (SIGKILL also ends a
    stopped process), reaped, and this side's gateway and callback server closed without asking it."""
    proc = sw._gateway.java_process
    if kill and proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)
    # Disconnected: the finalizers of its Java object proxies no longer try to reach the dead JVM
    # (each would open a refused connection and log it, from inside whatever code the GC interrupts).
    sw._gateway._gateway_client.is_connected = False
    try:  # this side's sockets and callback server only: no command to a JVM that is gone
        sw._gateway.close(keep_callback_server=False, close_callback_server_connections=True)
    except Exception:  # noqa: BLE001 - best effort: nothing listens any more
        pass
    sw.close = lambda: None  # the wrapper's __del__ would close it again
