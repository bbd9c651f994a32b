"""What every stage's ``main`` shares: the runner (arguments, logging, params, the error
policy and the exit code) and the numerics pin of the stages that train or run a model.

A stage module declares its own part and hands it to :func:`run_stage`::

    def main(argv: list[str] | None = None) -> int:
        return run_stage("render", render, argv, doc=__doc__, arguments=_arguments, log_level=logging.INFO)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from pipeline.core.config import EXPERIMENT, PIPELINES, load_params, project_root
from pipeline.core.io import ArtifactError
from pipeline.core.numerics import NumericsError, cpu_model, pin
from pipeline.core.parallel import DEFAULT_STALL_S, STALL_KEY, WorkerStalled, supervised

# An expected failure of any stage: a bad config (ConfigError is a ValueError) or value, a
# missing or bad artifact, numerics that cannot be pinned, a worker process that stalled. Exit 1
# with its one-line message.
EXPECTED = (ValueError, ArtifactError, NumericsError, FileNotFoundError, WorkerStalled)

Body = Callable[[DictConfig, Path, argparse.Namespace], None]


def run_stage(name: str, body: Body, argv: list[str] | None = None, *, doc: str | None = None,
              arguments: Callable[[argparse.ArgumentParser], None] | None = None,
              log_level: int = logging.WARNING, expected: tuple[type[BaseException], ...] = (),
              pipelines: tuple[str, ...] = (EXPERIMENT.name,)) -> int:
    """Run one stage: parse its arguments, set up logging, load and check ``params.yaml``, call
    ``body(cfg, root, args)``; 0 when it returns.

    Args:
        name: the stage's module under ``pipeline.stages`` (``render``), for ``--help``.
        body: the stage's work; it reads inputs, calls the library, writes outputs, prints its line.
        argv: the stage's command-line arguments (the module's ``__main__`` passes ``sys.argv[1:]``);
            None: none (a stage called from code or a test).
        doc: the ``--help`` text (the module's docstring).
        arguments: adds the stage's own options to the parser (``--condition``).
        log_level: ``logging.INFO`` for a stage that narrates its steps, else warnings only.
        expected: what else this stage's library raises as an expected failure
            (``BackendError`` for a stage that runs a model), beside :data:`EXPECTED`.
        pipelines: the pipelines whose ``dvc.yaml`` runs this stage (:data:`pipeline.core.config.PIPELINES`);
            with more than one, ``--pipeline NAME`` picks the params file it reads (the first by default).

    Returns:
        0, or 1 with ``error: <message>`` on stderr for an expected failure; anything else
        is re-raised (a bug keeps its traceback). Bad arguments exit 2 (argparse).

    Supervision: SIGTERM (``timeout``, ``dvc queue kill``, a container's stop) takes the Ctrl-C
    path (:func:`sigterm_as_ctrl_c`: checkpoints kept, temp files removed, worker processes
    stopped); every worker process the stage starts is stopped, and the stage fails, when it
    does not run for the config's ``agent.worker_stall_s`` (:func:`pipeline.core.parallel.supervised`).
    """
    parser = argparse.ArgumentParser(prog=f"python -m pipeline.stages.{name}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if arguments is not None:
        arguments(parser)
    if len(pipelines) > 1:
        parser.add_argument("--pipeline", choices=pipelines, default=pipelines[0],
                            help="whose params file this run reads: " + ", ".join(
                                f"{n} ({PIPELINES[n].params_file})" for n in pipelines))
    args = parser.parse_args([] if argv is None else argv)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        with sigterm_as_ctrl_c():
            cfg = load_params(pipeline=PIPELINES[getattr(args, "pipeline", pipelines[0])])
            stall = OmegaConf.select(cfg, STALL_KEY) if isinstance(cfg, DictConfig) else None
            with supervised(DEFAULT_STALL_S if stall is None else stall, stage=name):
                body(cfg, project_root(), args)
    except (*EXPECTED, *expected) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block (in the main thread), SIGTERM does what Ctrl-C does: this process's
    SIGINT handler runs (``KeyboardInterrupt``, or a collection's flag), so the stage stops
    through its Ctrl-C path (checkpoints kept, atomic writes' temp files removed, worker
    processes stopped) instead of dying where it stands; Python's default SIGTERM leaves that
    undone and the workers playing. If SIGINT is ignored (a background job of a shell script),
    SIGTERM still raises ``KeyboardInterrupt``: never a SIGTERM lost and the stage exiting 0."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def pin_numerics(cfg: Any, *, runs_model: bool = True) -> dict[str, Any]:
    """Pin ``cfg.numerics`` (:func:`pipeline.core.numerics.pin`): first thing in the ``main``
    of a stage that may train or run a model, before anything loads torch. With
    ``runs_model=False`` (a rule agent, an extractive generator) only the environment is
    set and torch is not loaded. Returns what runs, with the CPU's name, for the metrics."""
    return {**pin(cfg.numerics, load_torch=runs_model), "cpu": cpu_model()}
