"""``render`` stage: the system prompt of every eval task under one condition (seeds 000-002).

    python -m pipeline.stages.render --condition C2     # what `dvc repro render@C2` runs
    python -m pipeline.stages.render --condition C1

For every task of ``experiment.eval_split`` in ``data/games/manifest.parquet``, renders the
prompt under every configured condition and runs the evidence checks
(:mod:`pipeline.conditions`: what each condition injects and the evidence that it did),
then writes, for ``--condition`` only (so each DVC matrix instance stands alone):

- ``data/prompts/<condition>.parquet`` (``PROMPTS_SCHEMA``, one row per task, sorted
  by scene and quest): the system prompt, the injected memory block, the bundle JSON, the
  gate's reason, the store hash and the grounding files used;
- ``metrics/render/<condition>.json``: counts, gate reasons, the evidence checks.

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
    render_condition,
)
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError
from pipeline.core.io import ArtifactError, atomic_write_json, write_parquet
from pipeline.envs import fact_reader, world_words
from pipeline.memory import load_store
from pipeline.stages.common import run_stage


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--condition", required=True, help="condition to write (a key of `condition` in params)")


def render(cfg: Config, root: Path, args: argparse.Namespace) -> None:
    """Render ``--condition`` (module docstring)."""
    t0 = time.perf_counter()
    if args.condition not in cfg.condition:
        raise ConfigError(f"--condition {args.condition!r}: not a configured condition "
                          f"(condition: {', '.join(cfg.condition)})")
    if cfg.grounding.use_in_prompt and not (root / cfg.paths.grounding_merged).is_dir():
        raise ArtifactError(f"missing {root / cfg.paths.grounding_merged} (run the merge stage: `dvc repro merge`)")
    tasks = load_eval_tasks(root, cfg)
    store = load_store(root / cfg.paths.store, tie_seed=cfg.seed)
    rows, report = render_condition(tasks, args.condition, cfg, store, root, block_length_for(cfg, root),
                                    world_words(cfg), fact_reader(cfg))
    out = root / cfg.paths.prompts / f"{args.condition}.parquet"
    write_parquet(prompts_table(rows), out, sort_by=["scene_id", "quest_id"],
                  schema_version=PROMPTS_SCHEMA_VERSION)
    atomic_write_json(root / cfg.paths.metrics / "render" / f"{args.condition}.json",
                      {**report, "wall_time_s": round(time.perf_counter() - t0, 3)})  # the time: metrics only
    if report.get("placebo_unavailable"):
        print(f"warning: {args.condition}: the store has too few entries of other scenes for a matched placebo "
              f"on {len(report['placebo_unavailable'])} of {report['tasks']} tasks (nothing injected there); "
              "a world with more seen scenes gives it one", file=sys.stderr)
    print(f"rendered {report['tasks']} prompts for {args.condition} ({report['injected']} with memory) "
          f"-> {out}; evidence checks passed")


def main(argv: list[str] | None = None) -> int:
    return run_stage("render", render, argv, doc=__doc__, arguments=_arguments, log_level=logging.INFO,
                     expected=(EvidenceError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
