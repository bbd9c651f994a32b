"""``collect`` stage: agents play the train quests; the user gives typed feedback.

    python -m pipeline.stages.collect          # what `dvc repro collect` runs
    dvc exp run -S agent=rag                   # collect with another agent
    python -m pipeline.stages.collect --shard 1/4    # one of 4 machines: every 4th task, from the 2nd
    python -m pipeline.stages.collect --merge data/episodes_shards/*-of-4 && dvc commit collect

Reads ``data/games`` (manifest + scenes), writes ``data/episodes/{episodes,turns}.parquet``,
``data/episodes/tensors/<episode_id>.pt`` (llm agent) and ``metrics/collect.json``.
Finished episodes are checkpointed under ``.checkpoints/collect/<config hash>-<inputs hash>/``
(outside the DVC outs, keyed so that a changed config or input never reuses them) so an
interrupted run (SIGKILL, Ctrl-C, a failed model call) resumes where it stopped and
writes the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.agents import plays_with_model
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError
from pipeline.core.io import atomic_write_json
from pipeline.llm.backends import BackendError
from pipeline.session.collection import (collect_shard, load_games, merge_shards, online_loop, parse_shard,
                                         run_collection)
from pipeline.session.rollout import tasks_from_manifest
from pipeline.stages.common import pin_numerics, run_stage
from pipeline.users.file import FileFeedback


def _arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--shard", metavar="K/N", help="play only shard K of N of the train tasks (another machine)")
    g.add_argument("--merge", metavar="DIR", nargs="+", type=Path,
                   help="merge shard folders into <paths.episodes> (then `dvc commit collect`)")
    ap.add_argument("--out", type=Path, default=None,
                    help="shard folder (default: <paths.data>/episodes_shards/K-of-N)")


def collect(cfg: Config, root: Path, args: argparse.Namespace) -> None:
    """Play the train quests, or one shard of them, or merge the shards (module docstring)."""
    # before anything loads torch (a rule agent runs no model: the environment only; a remote
    # model still loads torch here, in the main thread, before the backend starts its event-loop thread)
    pin_numerics(cfg, runs_model=plays_with_model(cfg.agent))
    manifest, scenes = load_games(root, cfg)
    feedback_source = None
    if cfg.user.source == "file":
        feedback_source = FileFeedback(root / cfg.user.feedback_file, cfg.user)
    tasks = tasks_from_manifest(manifest, split="train", master_seed=cfg.seed)
    if not tasks:
        raise ConfigError("the games manifest has no train quests (env.train_quests_per_scene=0?)")
    stray = feedback_source.unmatched(t.episode_id for t in tasks) if feedback_source is not None else []
    if stray:
        print(f"warning: {feedback_source.path}: records of {len(stray)} episode id(s) that are no train task of "
              f"this config are ignored: {', '.join(stray[:3])}{', ...' if len(stray) > 3 else ''} "
              f"(ids look like {tasks[0].episode_id})", file=sys.stderr)
    out_dir = root / cfg.paths.episodes
    if args.merge:
        stats = merge_shards(cfg, tasks, [Path(d) for d in args.merge], out_dir)
        atomic_write_json(root / cfg.paths.metrics / "collect.json", stats)
        print(f"merged {stats['shards']} shards: {stats['num_episodes']} episodes ({stats['num_turns']} turns) "
              f"-> {out_dir}; record them as the stage's output with `dvc commit collect`")
        return
    if args.shard:
        k, n = parse_shard(args.shard)
        out_dir = args.out or root / cfg.paths.data / "episodes_shards" / f"{k}-of-{n}"
        stats = collect_shard(cfg, root, tasks, k, n, out_dir, scenes=scenes, feedback_source=feedback_source)
        print(f"shard {k}/{n}: {stats['num_episodes']} episodes ({stats['num_turns']} turns) -> {out_dir}")
        return
    _, stats = run_collection(cfg, root, tasks, out_dir, scenes=scenes, ckpt_name="collect",
                              desc=f"collect [{cfg.agent.name}]", feedback_source=feedback_source,
                              online=online_loop(cfg))
    atomic_write_json(root / cfg.paths.metrics / "collect.json", stats)
    print(f"collected {stats['num_episodes']} episodes ({stats['num_turns']} turns) -> {out_dir}; "
          f"success {stats['success_rate']:.2f}, repeated-action rate {stats['repeated_action_rate']:.2f}")


def main(argv: list[str] | None = None) -> int:
    return run_stage("collect", collect, argv, doc=__doc__, arguments=_arguments, expected=(BackendError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
