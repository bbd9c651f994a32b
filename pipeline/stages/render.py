"""``render`` stage: the system prompt of every eval task under every condition (seeds 000-002).

    python -m pipeline.stages.render                     # what `dvc repro render` runs: every condition
    python -m pipeline.stages.render --condition C2      # only C2's files (every condition is still rendered
                                                         # for C2's evidence checks)

For every task of ``experiment.eval_split`` in ``data/games/manifest.parquet``, renders the
prompt under every configured condition once and runs each written condition's evidence
checks (:mod:`pipeline.conditions`: what each condition injects and the evidence that it did),
then writes, for each condition:

- ``data/prompts/<condition>.parquet`` (``PROMPTS_SCHEMA``, one row per task, sorted
  by scene and quest): the system prompt, the injected memory block, the bundle JSON, the
  gate's reason, the store hash and the grounding files used;
- its report in ``metrics/render.json`` (``conditions.<condition>``): counts, gate reasons,
  the evidence checks; and the stage's wall time.

One stage, not one per condition: each condition's checks compare it with every other, so a
stage per condition rendered every condition once per condition (six times the work, and six
process starts, issue 63). ``evaluate@C`` depends on its own file only, so it reruns only when
its condition's prompts change.

A failed evidence check fails the stage before anything is written.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from pipeline.conditions import (
    PROMPTS_SCHEMA_VERSION,
    EvidenceError,
    block_length_for,
    load_eval_tasks,
    prompts_table,
    render_conditions,
)
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError
from pipeline.core.io import ArtifactError, atomic_write_json, write_parquet
from pipeline.envs import fact_reader, world_words
from pipeline.memory import load_store
from pipeline.stages.common import run_stage


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--condition", action="append", default=None, metavar="CONDITION",
                        help="a condition to write (a key of `condition` in params; repeatable); "
                             "default: every configured condition")


def render(cfg: Config, root: Path, args: argparse.Namespace) -> None:
    """Render every condition, or ``--condition`` (module docstring)."""
    t0 = time.perf_counter()
    conditions = list(dict.fromkeys(args.condition or cfg.condition))
    unknown = [c for c in conditions if c not in cfg.condition]
    if unknown:
        raise ConfigError(f"--condition {', '.join(map(repr, unknown))}: not a configured condition "
                          f"(condition: {', '.join(cfg.condition)})")
    if cfg.grounding.use_in_prompt and not (root / cfg.paths.grounding_merged).is_dir():
        raise ArtifactError(f"missing {root / cfg.paths.grounding_merged} (run the merge stage: `dvc repro merge`)")
    tasks = load_eval_tasks(root, cfg)
    store = load_store(root / cfg.paths.store, tie_seed=cfg.seed)
    rendered = render_conditions(tasks, conditions, cfg, store, root, block_length_for(cfg, root),
                                 world_words(cfg), fact_reader(cfg))  # raises before anything is written
    reports = {}
    for condition in conditions:
        rows, report = rendered[condition]
        out = root / cfg.paths.prompts / f"{condition}.parquet"
        write_parquet(prompts_table(rows), out, sort_by=["scene_id", "quest_id"],
                      schema_version=PROMPTS_SCHEMA_VERSION)
        reports[condition] = report
        if report.get("placebo_unavailable"):
            print(f"warning: {condition}: the store has too few entries of other scenes for a matched placebo "
                  f"on {len(report['placebo_unavailable'])} of {report['tasks']} tasks (nothing injected there); "
                  "a world with more seen scenes gives it one", file=sys.stderr)
        print(f"rendered {report['tasks']} prompts for {condition} ({report['injected']} with memory) "
              f"-> {out}; evidence checks passed")
    atomic_write_json(root / cfg.paths.metrics / "render.json",  # the time: metrics only
                      {"conditions": reports, "wall_time_s": round(time.perf_counter() - t0, 3)})


def main(argv: list[str] | None = None) -> int:
    return run_stage("render", render, argv, doc=__doc__, arguments=_arguments, log_level=logging.INFO,
                     expected=(EvidenceError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
