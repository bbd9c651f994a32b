"""Local OpenAI-compatible servers on 127.0.0.1: ``transformers serve`` for a model directory,
llama-cpp-python's server for a GGUF file.

For the tests and benchmarks of the ``openai`` backend (and for trying the pipeline's
``model=openai`` path on a laptop)::

    with TransformersServe("path/to/model") as server:       # a free port, waits until healthy
        cfg.model.base_url, cfg.model.api_model = server.url, server.model
        ...

    python, why = llama_cpp_python()                        # the interpreter that has it, or why none
    with LlamaCppServe(gguf_path, python=python) as server:  # the same, on llama.cpp
        ...

Needs ``transformers[serving]`` (fastapi, uvicorn, openai). The server is pinned to the
one model (requests for another get HTTP 400); it runs offline (``HF_HUB_OFFLINE``), never
checks for updates, and keeps its hub cache in a temporary folder. What it supports (as
of transformers 5.23): chat completions with ``max_tokens``, ``temperature``, ``top_p``,
``seed`` (a global torch seed: deterministic only for greedy or one request at a time);
``logprobs`` and ``response_format`` are accepted and ignored; fields outside the OpenAI
schema (vLLM's ``guided_choice``, ``structured_outputs``, ``top_k``) are refused (HTTP 422).

A start succeeds only when the process started here is the one answering: the port must be
free before it starts, the process must still run, and (where ``/proc`` tells) the listening
socket must be its own, so another listener on the port never passes for the server. A
start that fails keeps the server's log and names its path in the error.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[3]

# llama-cpp-python compiles llama.cpp from its sdist (no prebuilt Linux wheel on PyPI), so it
# is not in the project's lock: it lives in a venv of its own (`make llama-cpp`), found
# through this variable or at LLAMA_CPP_VENV.
LLAMA_CPP_PYTHON_ENV = "LLAMA_CPP_PYTHON"
LLAMA_CPP_VENV = ROOT / ".venv-llama"


def serving_available() -> str | None:
    """None when ``transformers serve`` can run here, else why not (for a skip reason)."""
    try:
        import importlib

        for name in ("fastapi", "uvicorn", "openai"):  # the optional serving extras
            importlib.import_module(name)
        from transformers.utils.import_utils import is_serve_available  # deferred: heavy optional dependency
    except ImportError as exc:
        return f"transformers[serving] extras not importable ({exc}); pip install 'transformers[serving]'"
    if not is_serve_available():
        return "transformers reports its serving extras unavailable; pip install 'transformers[serving]'"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (a bind the way uvicorn binds fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", int(port)))
        except OSError:
            return True
    return False


def listener_is_process(port: int, pid: int) -> bool | None:
    """Whether the socket listening on TCP ``port`` belongs to process ``pid`` or a descendant
    (Linux ``/proc``: the socket's inode among the process's file descriptors); None where
    ``/proc`` cannot tell (another OS, no listener found)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()  # sl local_address rem_address st ... inode
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == int(port):
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    todo, seen = [int(pid)], set()
    while todo:
        p = todo.pop()
        seen.add(p)
        try:
            if any(os.readlink(fd) in inodes for fd in Path(f"/proc/{p}/fd").iterdir()):
                return True
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split() if int(c) not in seen]
        except OSError:
            continue
    return False


class _LocalServer:
    """A server subprocess on 127.0.0.1: its port and URL, its log in a temporary directory,
    ``with`` support and a clean stop (the subclasses say how it starts: :meth:`_prepare` its
    folder on a free port, :meth:`_launch` the command, :meth:`_wait_until` it answers)."""

    def __init__(self, port: int | None):
        self.port = int(port or free_port())
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None
        self._dir: Path | None = None  # the temporary folder (the log, a hub cache); kept when a start fails
        self.log_path: Path | None = None

    def start(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""
        except OSError:
            return ""

    def _prepare(self, what: str, prefix: str) -> Path:
        """The server's temporary folder (its log: ``log_path``), once its port is known to be free.

        Raises:
            RuntimeError: the port is in use (whatever answers there is not this server).
        """
        if port_in_use(self.port):
            raise RuntimeError(f"{what}: port {self.port} on 127.0.0.1 is in use by another process, which would "
                               "answer in the server's place: pick a free port (or leave it unset for one)")
        self._dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.log_path = self._dir / "serve.log"
        return self._dir

    def _launch(self, cmd: list[str], env: dict[str, str]) -> None:
        """Start ``cmd``, its stdout and stderr into ``log_path``."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def _wait_until(self, what: str, answers: Callable[[], bool], startup_s: float) -> None:
        """Wait until ``answers()`` and the answer comes from the process started here.

        Raises:
            RuntimeError: it exited, something else answers on its port, or ``startup_s`` ran
                out; the process is stopped, the log kept (its path and tail in the message).
        """
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._failed(f"{what} exited with {self.proc.returncode}")
            if answers():
                mine = listener_is_process(self.port, self.proc.pid)
                if mine is False or self.proc.poll() is not None:
                    raise self._failed(f"{what}: another process answers on port {self.port}, not the one started "
                                       f"here (pid {self.proc.pid})")
                return
            time.sleep(0.2)
        raise self._failed(f"{what} not answering after {startup_s:g}s")

    def _failed(self, why: str) -> RuntimeError:
        """Stop the process, keep its log (the folder is no longer removed), and say both."""
        tail = self.log_tail()
        self._stop_process()
        kept, self._dir = self.log_path, None
        return RuntimeError(f"{why} (its log is kept: {kept}):\n{tail}")

    def _stop_process(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server and remove its temporary folder (log included)."""
        self._stop_process()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class TransformersServe(_LocalServer):
    """``transformers serve <model_dir>`` in a subprocess on 127.0.0.1.

    Args:
        model_dir: a directory ``AutoModelForCausalLM`` loads (with a chat template).
        port: the port (default: a free one).
        threads: torch threads of the server (``OMP_NUM_THREADS``).
        startup_s: how long to wait for ``GET /health``.
        extra_args: more ``transformers serve`` options (``["--continuous-batching"]``).

    Attributes:
        url: ``http://127.0.0.1:<port>/v1`` (``model.base_url``).
        model: the model name to request (``model.api_model``): the directory's path.
        log_path: the server's stdout and stderr.
    """

    def __init__(self, model_dir: str | os.PathLike, *, port: int | None = None, threads: int = 1,
                 startup_s: float = 120.0, extra_args: list[str] | None = None):
        super().__init__(port)
        self.model = str(Path(model_dir).resolve())
        self.threads = int(threads)
        self.startup_s = float(startup_s)
        self.extra_args = list(extra_args or [])

    def start(self) -> None:
        why = serving_available()
        if why:
            raise RuntimeError(why)
        home = self._prepare("transformers serve", "transformers_serve_") / "hf"
        (home / "hub").mkdir(parents=True)  # GET /v1/models scans it (and fails when it is missing)
        env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
               "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", self.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--device", "cpu", "--dtype", "float32", "--log-level", "error",
               *self.extra_args]
        self._launch(cmd, env)
        self._wait_until("transformers serve", self._healthy, self.startup_s)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False



def llama_cpp_python() -> tuple[str | None, str]:
    """``(interpreter, what)``: a Python that imports llama-cpp-python's server, and its version;
    or ``(None, why not)`` (a skip reason). The interpreter is ``$LLAMA_CPP_PYTHON``, else
    ``.venv-llama/bin/python`` at the project root (``make llama-cpp`` builds it)."""
    given = os.environ.get(LLAMA_CPP_PYTHON_ENV)
    python = Path(given) if given else LLAMA_CPP_VENV / "bin" / "python"
    where = f"${LLAMA_CPP_PYTHON_ENV}={given}" if given else f"{python} (${LLAMA_CPP_PYTHON_ENV} unset)"
    if not python.exists():
        return None, (f"no llama-cpp-python interpreter at {where}: build one with `make llama-cpp` "
                      f"(compiles llama.cpp, ~15 min on 2 cores) or set ${LLAMA_CPP_PYTHON_ENV}")
    try:
        code = "import llama_cpp, llama_cpp.server.app; print(llama_cpp.__version__)"
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{where} cannot run: {exc}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{where} cannot import llama_cpp.server ({last}): pip install 'llama-cpp-python[server]' there"
    return str(python), f"llama-cpp-python {out.stdout.strip()}"


class LlamaCppServe(_LocalServer):
    """llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``) on 127.0.0.1.

    Args:
        gguf: the model's GGUF file (its chat template is used).
        python: an interpreter with ``llama-cpp-python[server]`` (:func:`llama_cpp_python`).
        alias: the model name it serves (``model.api_model``; any name is answered by the one model).
        port: the port (default: a free one).
        n_ctx: the context size (the server's default, 2048, is short for the agent's prompts).
        threads: llama.cpp threads.
        startup_s: how long to wait for ``GET /v1/models``.

    Attributes:
        url: ``http://127.0.0.1:<port>/v1`` (``model.base_url``); ``model``: the alias;
        log_path: the server's stdout and stderr.
    """

    def __init__(self, gguf: str | os.PathLike, *, python: str, alias: str = "SmolLM2", port: int | None = None,
                 n_ctx: int = 4096, threads: int = 1, startup_s: float = 120.0):
        super().__init__(port)
        self.gguf = str(Path(gguf).resolve())
        self.python = python
        self.model = alias
        self.n_ctx, self.threads, self.startup_s = int(n_ctx), int(threads), float(startup_s)

    def start(self) -> None:
        self._prepare("llama_cpp.server", "llama_cpp_serve_")
        cmd = [self.python, "-m", "llama_cpp.server", "--model", self.gguf, "--model_alias", self.model,
               "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
               "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads)]
        # PASSIVE: llama.cpp's OpenMP threads sleep while they wait; spinning, two threads on a
        # busy 2-core machine ran ~10x slower than one (3 vs 35 tokens/s).
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "OMP_WAIT_POLICY": "PASSIVE"}
        self._launch(cmd, env)
        self._wait_until("llama_cpp.server", lambda: _answers(f"{self.url}/models"), self.startup_s)



def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False
