"""Build the episodic memory store from collected episodes, and its counts (seed 001).

The library behind :mod:`pipeline.stages.store`::

    store = build_store(read_parquet(episodes_path), read_parquet(turns_path),
                        splits=["train"], config_hash=h)
    write_store(store, out_dir)            # pipeline.memory.store
    metrics = store_metrics(store)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from pipeline.memory.advisory import advisory_type_for
from pipeline.memory.schemas import table_to_entries
from pipeline.memory.store import EpisodicStore, build_entries


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
