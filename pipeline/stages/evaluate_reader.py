"""``evaluate_reader`` stage: the reader plays the eval quests with one condition's system prompts.

    python -m pipeline.stages.evaluate_reader --condition C2_oracle   # what `dvc repro evaluate_reader@C2_oracle` runs

The ``evaluate`` stage with ``agent=reader`` (:mod:`pipeline.agents.reader`): the same
tasks, seeds and rendered prompts as ``evaluate@C``, played by a rule agent that acts on
exactly what its prompt states. Its success is the condition's information ceiling; the
``compare`` stage sets the model's differences beside the reader's (utilisation). A rule
agent: seconds per condition, no model loaded.

Writes ``data/eval_reader/<condition>/{episodes,turns}.parquet`` and
``metrics/eval_reader/<condition>.json``; with ``experiment.reader=false`` only a
``SKIPPED.json`` marker in that folder (and metrics saying so), which ``compare`` reads as
"no reader".
"""

from __future__ import annotations

import argparse
import sys

from pipeline.core.config import load_params, project_root
from pipeline.core.io import atomic_dir, atomic_write_json
from pipeline.session.evaluation import evaluate_condition
from pipeline.stages.common import pin_numerics, stage_error

SKIPPED_FILE = "SKIPPED.json"  # all the folder holds with experiment.reader=false


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.evaluate_reader", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--condition", required=True, help="condition name (a key of `condition` in params.yaml)")
    args = parser.parse_args(argv)
    try:
        cfg = load_params()
        pin_numerics(cfg, runs_model=False)  # a rule agent: the environment only, torch never loads
        root = project_root()
        cond = args.condition
        metrics_path = root / cfg.paths.metrics / "eval_reader" / f"{cond}.json"
        if not cfg.experiment.reader:
            reason = "experiment.reader=false"
            with atomic_dir(root / cfg.paths.eval_reader / cond) as tmp:
                atomic_write_json(tmp / SKIPPED_FILE, {"played": False, "reason": reason})
            atomic_write_json(metrics_path, {"condition": cond, "skipped": True, "reason": reason})
            print(f"evaluate_reader@{cond}: skipped ({reason})")
            return 0
        metrics, stats, out_dir = evaluate_condition(cfg, root, cond, reader=True)
        atomic_write_json(metrics_path, metrics)
        print(f"evaluate_reader@{cond}: {stats['num_episodes']} episodes, success {stats['success_rate']:.2f} -> {out_dir}")
    except Exception as exc:  # noqa: BLE001 - stage_error re-raises what is not expected
        return stage_error(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
