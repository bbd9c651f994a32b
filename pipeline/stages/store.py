"""Stage ``store``: the episodic memory store, one entry per collected episode (seed 001).

Run it through DVC (``dvc repro store``) or directly::

    python -m pipeline.stages.store

Reads ``<paths.episodes>/episodes.parquet`` and ``turns.parquet``; writes
``<paths.store>/episodic_store.parquet`` (canonical, rows sorted by entry_id),
``episodic_store.jsonl`` (the seed's export), ``store_hash.txt`` (sha256 of the JSONL:
the content hash every retrieval records) and ``<paths.metrics>/store.json``.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.core.io import ArtifactError, atomic_dir, atomic_write_json, read_parquet
from pipeline.memory.advisory import advisory_type_for
from pipeline.memory.schemas import table_to_entries
from pipeline.memory.store import STORE_HASH, STORE_JSONL, STORE_PARQUET, EpisodicStore, build_entries, write_store

# Config subtrees that produced the episodes: the same keys as collect's checkpoint hash
# (pipeline.session.collection.CHECKPOINT_KEYS), used when an episode's metadata has no config_hash.
COLLECT_KEYS = ("seed", "env", "user", "agent", "model", "sampling", "prompts", "grounding.unknown_type")


def build_store(episodes: pa.Table, turns: pa.Table, *, splits: list[str] | None, config_hash: str | None,
                episodes_name: str = "episodes", turns_name: str = "turns") -> EpisodicStore:
    """The pure core: collected episodes -> store (no files touched)."""
    entries = build_entries(episodes, turns, splits=splits, config_hash=config_hash,
                            episodes_name=episodes_name, turns_name=turns_name)
    return EpisodicStore.from_entries(entries)


def store_metrics(store: EpisodicStore) -> dict[str, Any]:
    """Counts for ``dvc metrics``: entries, languages, advisory types, corrected/won shares."""
    n = len(store)
    types: Counter = Counter()
    langs: Counter = Counter()
    scenes: set = set()
    corrected = won = 0
    for start in range(0, n, 8192):  # in slices: a 10^6-entry store never becomes 10^6 dicts at once
        for e in table_to_entries(store.table.slice(start, 8192)):
            types[advisory_type_for(e)] += 1
            langs[e["input_signature"]["language"]] += 1
            scenes.add(e["provenance"]["scene_id"])
            corrected += bool(e["correction"]["corrected"])
            won += bool(e["evaluation"]["won"])
    return {
        "num_entries": n,
        "num_scenes": len(scenes),
        "advisory_types": {k: types.get(k, 0) for k in sorted(types)},
        "languages": {k: langs.get(k, 0) for k in sorted(langs)},
        "corrected_rate": round(corrected / n, 6) if n else 0.0,
        "won_rate": round(won / n, 6) if n else 0.0,
        "store_hash": store.store_hash,
    }


def main() -> int:
    from pipeline.core.config import ConfigError, config_hash, load_params, project_root

    try:
        cfg = load_params()
        root = project_root()
        ep_dir = root / cfg.paths.episodes
        episodes_path, turns_path = ep_dir / "episodes.parquet", ep_dir / "turns.parquet"
        splits = list(cfg.memory.store_splits) or None
        store = build_store(
            read_parquet(episodes_path), read_parquet(turns_path),
            splits=splits, config_hash=config_hash(cfg, *COLLECT_KEYS),
            episodes_name=str(episodes_path), turns_name=str(turns_path),
        )
        out = root / cfg.paths.store
        with atomic_dir(out) as tmp:  # parquet, jsonl and hash appear together or not at all
            write_store(store, tmp)
        metrics = store_metrics(store)
        atomic_write_json(Path(root / cfg.paths.metrics) / "store.json", metrics)
    except (ArtifactError, ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"store: {metrics['num_entries']} entries from {metrics['num_scenes']} scene(s) -> "
          f"{out / STORE_PARQUET}, {STORE_JSONL}, {STORE_HASH} (hash {store.store_hash[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
