"""``evaluate`` stage: the agent plays the eval quests with one condition's system prompts.

    python -m pipeline.stages.evaluate --condition C2   # what `dvc repro evaluate@C2` runs

Paired design: every condition plays the same eval tasks with the same per-task seeds
(:func:`pipeline.core.seeding.task_seed` ignores the condition), so differences between
conditions come from the prompt, not from luck. The system prompt of each task is the
one the ``render`` stage wrote to ``data/prompts/<condition>.parquet``, verbatim.
Memory is frozen during evaluation: the store's content hash is checked against the one
the prompts were rendered with, before and after playing.

Writes ``data/eval/<condition>/{episodes,turns}.parquet`` (+ ``tensors/``) and
``metrics/eval/<condition>.json``. The library doing the work is
:mod:`pipeline.session.evaluation`. The ``evaluate_reader`` stage runs this module's
:func:`evaluate` with ``reader=True``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.agents import plays_with_model
from pipeline.core.conf_schema import Config
from pipeline.core.io import atomic_dir, atomic_write_json
from pipeline.llm.backends import BackendError
from pipeline.session.evaluation import evaluate_condition
from pipeline.stages.common import pin_numerics, run_stage

SKIPPED_FILE = "SKIPPED.json"  # all the reader's folder holds with experiment.reader=false


def condition_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--condition", required=True, help="condition name (a key of `condition` in params.yaml)")


def evaluate(cfg: Config, root: Path, args: argparse.Namespace, *, reader: bool = False) -> None:
    """Play ``--condition``'s prompts with the experiment's agent, or with the reader (``reader``: the
    ``evaluate_reader`` stage, skipped with ``experiment.reader=false``)."""
    stage, folder = ("evaluate_reader", "eval_reader") if reader else ("evaluate", "eval")
    # before anything loads torch (a rule agent runs no model, the reader never: the environment only; a remote
    # model still loads torch here, in the main thread, before the backend starts its event-loop thread)
    pin_numerics(cfg, runs_model=not reader and plays_with_model(cfg.agent))
    cond = args.condition
    metrics_path = root / cfg.paths.metrics / folder / f"{cond}.json"
    if reader and not cfg.experiment.reader:
        reason = "experiment.reader=false"
        with atomic_dir(root / cfg.paths.eval_reader / cond) as tmp:
            atomic_write_json(tmp / SKIPPED_FILE, {"played": False, "reason": reason})
        atomic_write_json(metrics_path, {"condition": cond, "skipped": True, "reason": reason})
        print(f"{stage}@{cond}: skipped ({reason})")
        return
    metrics, stats, out_dir = evaluate_condition(cfg, root, cond, reader=reader)
    atomic_write_json(metrics_path, metrics)
    print(f"{stage}@{cond}: {stats['num_episodes']} episodes, success {stats['success_rate']:.2f} -> {out_dir}")


def main(argv: list[str] | None = None) -> int:
    return run_stage("evaluate", evaluate, argv, doc=__doc__, arguments=condition_argument, expected=(BackendError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
