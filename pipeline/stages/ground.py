"""``ground`` stage: per-episode grounding files from the collected turns (seed 000).

    python -m pipeline.stages.ground           # what `dvc repro ground` runs
    dvc exp run -S grounding.generator=llm     # ask the model (a failed call or unusable answer falls back, counted)

Reads ``data/episodes/{episodes,turns}.parquet``; for every episode replays its steps
into a :class:`pipeline.grounding.GroundingFileManager` (``step_id = turn_index + 1``,
``instruction`` = the executed command, the turn's ``status`` and typed feedback), makes
its ``final_grounding`` from that episode's feedback only, and writes under
``data/grounding``::

    episode_<id>/grounding_episode_<id>.json|.txt    per episode (grounding.save_format)
    scenes/<scene_id>/grounding_latest.json|.txt     newest episode of each scene
    grounding_latest.json|.txt                       newest episode overall
    index.json                                       episodes and scenes -> file names

"Newest" is collection order, which is episode-id order. Counts go to ``metrics/ground.json``,
with the generator configured and the one each episode's grounding came from. With
``grounding.generator=llm`` (answers of at most ``grounding.max_new_tokens`` tokens), model
calls that failed or gave an unusable answer (empty, a refusal, no grounding JSON, cut off at
that budget) on more than ``grounding.max_error_fraction`` of the episodes stop the stage
(exit 1, nothing written); a configuration error (a refused key, an unknown model) stops it
at the first episode.
The library doing the work is :mod:`pipeline.grounding.episodes`.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from pipeline.core.conf_schema import Config, GroundingGenerator
from pipeline.core.io import atomic_write_json, read_parquet
from pipeline.grounding.episodes import (check_backend_fallbacks, ground, ground_metrics, make_generate,
                                         write_ground_outputs)
from pipeline.llm.backends import is_local
from pipeline.stages.common import pin_numerics, run_stage


def ground_stage(cfg: Config, root: Path, _args: object) -> None:
    """Ground every collected episode and write the files and the index (module docstring)."""
    # before anything loads torch; only the llm generator with a local model runs one
    pin_numerics(cfg, runs_model=cfg.grounding.generator == GroundingGenerator.llm and is_local(cfg.model))
    g = cfg.grounding
    episodes_dir = root / cfg.paths.episodes
    episodes = read_parquet(episodes_dir / "episodes.parquet").to_pylist()
    turns = read_parquet(episodes_dir / "turns.parquet").to_pylist()
    t0 = time.perf_counter()
    docs = ground(episodes, turns, generator=g.generator, generate=make_generate(cfg),
                  timestamp=g.timestamp, unknown_type=g.unknown_type)
    check_backend_fallbacks(docs, g.max_error_fraction)
    out = root / cfg.paths.grounding
    index = write_ground_outputs(docs, out, g.save_format)
    metrics = ground_metrics(docs)
    metrics["wall_time_s"] = round(time.perf_counter() - t0, 3)
    atomic_write_json(root / cfg.paths.metrics / "ground.json", metrics)
    used = ", ".join(f"{n} by {name}" for name, n in metrics["generator_used"].items())
    print(f"grounded {len(docs)} episodes of {len(index['scenes'])} scenes -> {out} "
          f"({metrics['steps_with_feedback']} of {metrics['num_steps']} steps with feedback; "
          f"grounding.generator={g.generator}: {used or 'none'})")


def main(argv: list[str] | None = None) -> int:
    return run_stage("ground", ground_stage, argv, doc=__doc__, log_level=logging.INFO)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
