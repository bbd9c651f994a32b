"""Fixtures of the reliability suite: a scratch project to run (and kill) stages in.

``project`` is a fresh copy, per test, of a tiny project root: ``conf/`` with
``env=tiny`` (the world of the top-level ``tiny_games`` fixture: 2 train and 2 eval
quests), ``dvc.yaml``, ``params.yaml`` composed from that ``conf/`` (so the stages' stale
check passes) and the compiled games. Stages run in it as real subprocesses::

    def test_x(project):
        proc = project.run("collect")                       # python tests/reliability/stage_runner.py collect
        project.configure("agent.batched=false")            # conf/ + params.yaml with an override
        p = project.start("collect", env={"REL_STEP_DELAY": "0.05"})   # a Popen to kill

``collected_project`` is the same with ``collect`` already run, once per session (the uninterrupted
outputs a resume test compares with), and ``rendered_project`` with ``collect + ground + merge +
store + render`` (C1, C2): for the tests of ``evaluate`` and the stages after it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().parent / "stage_runner.py"
COPY = ("conf", "hydra_plugins", "dvc.yaml")
STAGE_TIMEOUT_S = 300  # a guard against a hung stage, far above any normal run

# Cases run by each fuzz test (test_fuzz.py), printed at the end of the session.
FUZZ_CASES: dict[str, int] = {}


def pytest_terminal_summary(terminalreporter):
    if FUZZ_CASES:
        terminalreporter.section("fuzzed inputs (cases run)")
        for name, n in sorted(FUZZ_CASES.items()):
            terminalreporter.write_line(f"{n:7d}  {name}")


def subprocess_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "REL_"))}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONHASHSEED"] = "0"
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


@dataclass
class Project:
    """A scratch project root and helpers to run its stages."""

    root: Path
    base_config: str | None = None

    def configure(self, *overrides: str) -> None:
        """Set Hydra-style overrides in this project's ``conf/config.yaml``; recompose ``params.yaml``.

        ``agent=llm`` changes a group choice in the defaults list; ``agent.batched=false``
        goes into the config's own body (``_self_`` is last, so it wins). Written into
        ``conf/`` rather than passed to compose so that the stages' stale check passes.
        """
        import yaml

        from pipeline.core.config import compose

        path = self.root / "conf" / "config.yaml"
        if self.base_config is None:
            self.base_config = path.read_text()
        text, body = self.base_config, {}
        for ov in overrides:
            key, value = ov.split("=", 1)
            group = re.compile(rf"^(  - {re.escape(key)}: )\S+", re.M)
            if "." not in key and group.search(text):
                text = group.sub(lambda m: m.group(1) + value, text)
                continue
            node = body
            *parents, leaf = key.split(".")
            for k in parents:
                node = node.setdefault(k, {})
            node[leaf] = yaml.safe_load(value)
        if body:
            text += "\n" + yaml.safe_dump(body, sort_keys=True, allow_unicode=True)
        path.write_text(text)
        compose(self.root)

    def cmd(self, stage: str, *args: str) -> list[str]:
        return [sys.executable, str(RUNNER), stage, *args]

    def run(self, stage: str, *args: str, env: dict | None = None, timeout: float = STAGE_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.cmd(stage, *args), cwd=self.root, env=subprocess_env(env), capture_output=True,
                              text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, \
                f"{stage} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def start(self, stage: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        # SIGINT back to its default in the stage: a test run started in the background
        # (`cmd &`, nohup) inherits SIGINT *ignored*, and Python keeps an ignored SIGINT, so
        # the Ctrl-C tests would send a signal the stage never sees.
        return subprocess.Popen(self.cmd(stage, *args), cwd=self.root, env=subprocess_env(env),
                                preexec_fn=_default_sigint,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def checkpoint_files(self, name: str = "collect") -> list[Path]:
        return sorted((self.root / ".checkpoints" / name).glob("*/*.json"))

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()


def _default_sigint() -> None:
    """In the child before exec: SIGINT handled as a terminal's Ctrl-C would be."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(cond: Callable[[], bool], proc: subprocess.Popen, timeout: float = STAGE_TIMEOUT_S,
             poll: float = 0.005) -> bool:
    """Poll ``cond`` until true (True) or the process ends first (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        if proc.poll() is not None:
            return cond()
        time.sleep(poll)
    proc.kill()
    raise AssertionError("timed out waiting for the stage")


def kill_when(proc: subprocess.Popen, cond: Callable[[], bool], sig: int = signal.SIGKILL) -> tuple[int, str, str]:
    """Send ``sig`` once ``cond`` holds; return (returncode, stdout, stderr)."""
    fired = wait_for(cond, proc)
    if proc.poll() is None and fired:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=STAGE_TIMEOUT_S)
    return proc.returncode, out, err


@pytest.fixture(scope="session")
def project_template(tiny_games, tmp_path_factory) -> Path:
    """The tiny project (conf with env=tiny, params.yaml, compiled games), built once."""
    root = tmp_path_factory.mktemp("reliability_template")
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, root / name)
    cfg = root / "conf" / "config.yaml"
    text = cfg.read_text()
    # The rule agent and no model: stages run without the trained default policy.
    for old, new in (("- env: household", "- env: tiny"), ("- agent: llm", "- agent: react"),
                     ("- model: policy", "- model: none")):
        assert old in text, f"conf/config.yaml no longer has {old!r}"
        text = text.replace(old, new)
    cfg.write_text(text)
    shutil.copytree(tiny_games.games_dir, root / "data" / "games")
    from pipeline.core.config import compose

    compose(root)
    return root


def copy_project(template: Path, parent: Path) -> Project:
    """A fresh copy of a template project under ``parent``."""
    root = parent / "proj"
    shutil.copytree(template, root)
    return Project(root)


@pytest.fixture
def project(project_template, tmp_path) -> Project:
    return copy_project(project_template, tmp_path)


@pytest.fixture(scope="session")
def collected_template(project_template, tmp_path_factory) -> Path:
    """The tiny project with ``collect`` run once, uninterrupted: the reference outputs of the resume
    tests, and where :func:`rendered_template` starts (each test gets a copy: :func:`collected_project`)."""
    project = copy_project(project_template, tmp_path_factory.mktemp("reliability_collected"))
    project.run("collect")
    return project.root


@pytest.fixture
def collected_project(collected_template, tmp_path) -> Project:
    """A fresh copy, per test, of :func:`collected_template`."""
    return copy_project(collected_template, tmp_path)


@pytest.fixture(scope="session")
def rendered_template(collected_template, tmp_path_factory) -> Path:
    """The tiny project with ``collect + ground + merge + store + render`` (C1 and C2) run once: what
    the tests of later stages start from (each gets a copy: :func:`rendered_project`)."""
    project = copy_project(collected_template, tmp_path_factory.mktemp("reliability_rendered"))
    project.run("ground", "+", "merge", "+", "store", "+", "render", "--condition", "C1",
                "+", "render", "--condition", "C2")
    return project.root


@pytest.fixture
def rendered_project(rendered_template, tmp_path) -> Project:
    """A fresh copy, per test, of :func:`rendered_template` (the same files a test's own chain would write)."""
    return copy_project(rendered_template, tmp_path)
