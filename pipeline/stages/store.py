"""Stage ``store``: the episodic memory store, one entry per collected episode (seed 001).

Run it through DVC (``dvc repro store``) or directly::

    python -m pipeline.stages.store

Reads ``<paths.episodes>/episodes.parquet`` and ``turns.parquet``; writes
``<paths.store>/episodic_store.parquet`` (canonical, rows sorted by entry_id),
``episodic_store.jsonl`` (the seed's export), ``store_hash.txt`` (sha256 of the JSONL:
the content hash every retrieval records) and ``<paths.metrics>/store.json``.
The library doing the work is :mod:`pipeline.memory.build`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pipeline.core.conf_schema import Config
from pipeline.core.io import atomic_dir, atomic_write_json, read_parquet
from pipeline.envs import fact_reader
from pipeline.memory.build import build_store, store_metrics
from pipeline.memory.store import STORE_HASH, STORE_JSONL, STORE_PARQUET, write_store
from pipeline.stages.common import run_stage


def store_stage(cfg: Config, root: Path, _args: object) -> None:
    """Build the store from the collected episodes and write it whole (module docstring)."""
    t0 = time.perf_counter()
    ep_dir = root / cfg.paths.episodes
    episodes_path, turns_path = ep_dir / "episodes.parquet", ep_dir / "turns.parquet"
    splits = list(cfg.memory.store_splits) or None
    # No config hash of this run's own: every collected episode carries the hash of the config
    # that played it (collect records it in its metadata), and the store keeps that one.
    store = build_store(
        read_parquet(episodes_path), read_parquet(turns_path), reader=fact_reader(cfg),
        splits=splits, config_hash=None,
        episodes_name=str(episodes_path), turns_name=str(turns_path),
    )
    out = root / cfg.paths.store
    with atomic_dir(out) as tmp:  # parquet, jsonl and hash appear together or not at all
        write_store(store, tmp)
    metrics = {**store_metrics(store), "wall_time_s": round(time.perf_counter() - t0, 3)}  # metrics only
    atomic_write_json(Path(root / cfg.paths.metrics) / "store.json", metrics)
    print(f"store: {metrics['num_entries']} entries from {metrics['num_scenes']} scene(s) -> "
          f"{out / STORE_PARQUET}, {STORE_JSONL}, {STORE_HASH} (hash {store.store_hash[:12]})")


def main(argv: list[str] | None = None) -> int:
    return run_stage("store", store_stage, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
