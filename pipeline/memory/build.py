"""Build the episodic memory store from collected episodes, and its counts (seed 001).

The library behind :mod:`pipeline.stages.store`::

    store = build_store(read_parquet(episodes_path), read_parquet(turns_path),
                        reader=fact_reader(cfg), splits=["train"], config_hash=h)
    write_store(store, out_dir)            # pipeline.memory.store
    metrics = store_metrics(store)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from pipeline.memory.advisory import advisory_type_for
from pipeline.memory.schemas import table_to_entries
from pipeline.core.facts import FactReader
from pipeline.memory.scene import split_scene_facts
from pipeline.memory.store import EpisodicStore, build_entries


def build_store(episodes: pa.Table, turns: pa.Table, *, reader: FactReader, splits: list[str] | None,
                config_hash: str | None, episodes_name: str = "episodes", turns_name: str = "turns",
                tie_seed: int | None = None) -> EpisodicStore:
    """The pure core: collected episodes -> store (no files touched), for the ``store`` stage and for
    every store built in memory from played episodes (the model pipeline's, the studies').

    Each entry carries the scene facts its episode's turns show (where objects and keys
    were, locked containers and their keys, routes, containers found empty), from the
    typed facts the world's ``reader`` gives of each turn
    (:func:`pipeline.memory.scene.scene_facts`), in a fixed order: the same tables always
    give the same store hash.
    """
    entries = build_entries(episodes, turns, reader=reader, splits=splits, config_hash=config_hash,
                            episodes_name=episodes_name, turns_name=turns_name)
    return EpisodicStore.from_entries(entries, tie_seed=tie_seed)


def store_metrics(store: EpisodicStore) -> dict[str, Any]:
    """Counts for ``dvc metrics``: entries, languages, advisory types, corrected/won shares,
    and the scene facts the entries carry (share of entries with any, mean per entry)."""
    n = len(store)
    types: Counter = Counter()
    langs: Counter = Counter()
    scenes: set = set()
    corrected = won = with_facts = num_facts = 0
    for start in range(0, n, 8192):  # in slices: a 10^6-entry store never becomes 10^6 dicts at once
        for e in table_to_entries(store.table.slice(start, 8192)):
            types[advisory_type_for(e)] += 1
            langs[e["input_signature"]["language"]] += 1
            scenes.add(e["provenance"]["scene_id"])
            corrected += bool(e["correction"]["corrected"])
            won += bool(e["evaluation"]["won"])
            facts = len(split_scene_facts(e["case_summary"]["rationale_summary"])[1])
            with_facts += facts > 0
            num_facts += facts
    return {
        "num_entries": n,
        "num_scenes": len(scenes),
        "advisory_types": {k: types.get(k, 0) for k in sorted(types)},
        "languages": {k: langs.get(k, 0) for k in sorted(langs)},
        "corrected_rate": round(corrected / n, 6) if n else 0.0,
        "won_rate": round(won / n, 6) if n else 0.0,
        "scene_facts_rate": round(with_facts / n, 6) if n else 0.0,
        "mean_scene_facts": round(num_facts / n, 6) if n else 0.0,
        "store_hash": store.store_hash,
    }
