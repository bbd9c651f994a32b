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
:mod:`pipeline.session.evaluation`.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.agents import plays_with_model
from pipeline.core.config import load_params, project_root
from pipeline.core.io import atomic_write_json
from pipeline.session.evaluation import evaluate_condition
from pipeline.stages.common import pin_numerics, stage_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--condition", required=True, help="condition name (a key of `condition` in params.yaml)")
    args = parser.parse_args(argv)
    try:
        cfg = load_params()
        # before anything loads torch (a rule agent runs no model: the environment only; a remote
        # model still loads torch here, in the main thread, before the backend starts its event-loop thread)
        pin_numerics(cfg, runs_model=plays_with_model(cfg.agent))
        root = project_root()
        cond = args.condition
        metrics, stats, out_dir = evaluate_condition(cfg, root, cond)
        atomic_write_json(root / cfg.paths.metrics / "eval" / f"{cond}.json", metrics)
        print(f"evaluate@{cond}: {stats['num_episodes']} episodes, success {stats['success_rate']:.2f} -> {out_dir}")
    except Exception as exc:  # noqa: BLE001 - stage_error re-raises what is not expected
        return stage_error(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
