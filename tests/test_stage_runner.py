"""The stage runner (:func:`pipeline.stages.common.run_stage`): every stage's ``main`` goes
through it; an expected failure exits 1 with one line, a bug keeps its traceback."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeline.core.config import ConfigError
from pipeline.llm.backends import BackendError
from pipeline.stages import common

STAGES = Path(common.__file__).parent
STAGE_FILES = sorted(p for p in STAGES.glob("*.py") if p.name not in ("__init__.py", "common.py"))


@pytest.fixture()
def loaded(monkeypatch, tmp_path):
    """The runner loads a stand-in config; returns what the body was called with."""
    monkeypatch.setattr(common, "load_params", lambda **_: {"seed": 0})
    monkeypatch.setattr(common, "project_root", lambda: tmp_path)
    return tmp_path


def test_a_body_that_returns_exits_0_with_the_params_the_root_and_its_arguments(loaded):
    seen = []

    def body(cfg, root, args):
        seen.append((cfg, root, args.condition))

    def arguments(parser):
        parser.add_argument("--condition", required=True)

    assert common.run_stage("render", body, ["--condition", "C1"], arguments=arguments) == 0
    assert seen == [({"seed": 0}, loaded, "C1")]
    assert common.run_stage("merge", lambda *a: None) == 0  # None: no arguments (never this process's argv)
    with pytest.raises(SystemExit) as exit_:
        common.run_stage("merge", lambda *a: None, ["--unknown"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("exc, expected", [(ConfigError("params key x=1: expected >= 2"), ()),
                                           (FileNotFoundError("no such file"), ()),
                                           (BackendError("HTTP 503"), (BackendError,)),
                                           (RuntimeError("game did not compile"), (RuntimeError,))])
def test_an_expected_failure_exits_1_with_one_line(loaded, capsys, exc, expected):
    def body(cfg, root, args):
        raise exc

    assert common.run_stage("games", body, [], expected=expected) == 1
    assert capsys.readouterr().err == f"error: {exc}\n"


@pytest.mark.parametrize("exc", [KeyError("bug"), RuntimeError("a bug of a stage that expects none")])
def test_a_bug_keeps_its_traceback(loaded, exc):
    def body(cfg, root, args):
        raise exc

    with pytest.raises(type(exc)):
        common.run_stage("collect", body, [], expected=(BackendError,))


@pytest.mark.parametrize("path", STAGE_FILES, ids=lambda p: p.stem)
def test_every_stage_main_goes_through_the_runner(path: Path):
    """``main(argv)`` returns ``run_stage(...)``; the module's ``__main__`` passes ``sys.argv[1:]``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    body = [s for s in main.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    assert len(body) == 1 and isinstance(body[0], ast.Return), f"{path.name}: main does more than run the stage"
    call = body[0].value
    assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "run_stage"
    assert call.args[0].value == path.stem, f"{path.name}: run_stage names another stage"
    assert "sys.exit(main(sys.argv[1:]))" in path.read_text(encoding="utf-8")


@pytest.mark.parametrize("reader, folder", [(False, "eval"), (True, "eval_reader")])
def test_evaluate_and_evaluate_reader_share_one_body_writing_their_own_metrics(loaded, monkeypatch, reader, folder):
    from omegaconf import OmegaConf

    from pipeline.stages import evaluate, evaluate_reader

    cfg = OmegaConf.create({"agent": {"name": "react"}, "paths": {"metrics": "metrics"}, "experiment": {"reader": True}})
    played = []
    monkeypatch.setattr(common, "load_params", lambda **_: cfg)
    monkeypatch.setattr(evaluate, "pin_numerics", lambda cfg, runs_model: {})
    monkeypatch.setattr(evaluate, "evaluate_condition", lambda cfg, root, cond, reader: (
        played.append(reader) or ({"condition": cond}, {"num_episodes": 1, "success_rate": 1.0}, root)))
    stage = evaluate_reader if reader else evaluate
    assert stage.main(["--condition", "C1"]) == 0
    assert played == [reader]
    assert (loaded / "metrics" / folder / "C1.json").is_file()


def test_a_stage_runs_under_the_configs_stall_bound(loaded, monkeypatch):
    """Every pool and training helper of a stage is supervised with its ``agent.worker_stall_s`` (issue 66)."""
    from omegaconf import OmegaConf

    from pipeline.core import parallel

    seen = []
    monkeypatch.setattr(common, "load_params", lambda **_: OmegaConf.create({"agent": {"worker_stall_s": 90.0}}))
    assert common.run_stage("curve", lambda *a: seen.append(parallel.supervision())) == 0
    monkeypatch.setattr(common, "load_params", lambda **_: {"seed": 0})  # no such key: the default
    assert common.run_stage("games", lambda *a: seen.append(parallel.supervision())) == 0
    assert seen == [parallel.Supervision(90.0, "curve"), parallel.Supervision(parallel.DEFAULT_STALL_S, "games")]
    assert parallel.supervision() == parallel.Supervision()  # restored after the stage


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_takes_the_ctrl_c_path_of_a_stage(loaded, sigint):
    """SIGTERM (``timeout``, ``dvc queue kill``) used to kill a stage where it stood: no cleanup,
    its worker processes left running. Now it is a Ctrl-C, even where SIGINT is ignored (never lost)."""
    import os
    import signal
    import time

    cleaned = []

    def body(cfg, root, args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        finally:
            cleaned.append(True)

    before = signal.signal(signal.SIGINT, signal.default_int_handler if sigint == "default" else signal.SIG_IGN)
    term = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            common.run_stage("collect", body, [])
        assert signal.getsignal(signal.SIGTERM) == term  # restored
    finally:
        signal.signal(signal.SIGINT, before)
    assert cleaned == [True]
