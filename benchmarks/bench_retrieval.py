"""Benchmark: top-3 retrieval over synthetic stores of 10^3, 10^5 and 10^6 entries.

Run::

    python -m benchmarks.bench_retrieval                 # the default sizes
    python -m benchmarks.bench_retrieval --sizes 1000 100000 --queries 21

Measures the median latency of one top-3 query with the vectorised index
(:class:`pipeline.memory.retrieval.RetrievalIndex`) against two straightforward
per-entry Python loops over the same entries (:func:`pipeline.memory.retrieval.retrieve_loop`):
"seed-style" (tokenises every entry's summary per query, as a naive retriever does) and
"pre-tokenised" (entry token sets computed once, outside the timing). Loops run on at
most ``--loop-max`` entries; above that their time is extrapolated linearly from that
subset, and the table says so. The synthetic stores are seeded (``--seed``); the
vectorised and the loop results are checked to agree on the entries the loop covers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.memory.retrieval import RetrievalIndex, Retriever, query_tokens, retrieve_loop, tie_ranks
from pipeline.memory.schemas import LANGUAGES, LENGTH_BUCKETS, STORE_SCHEMA, InputSignatureV1_1, table_to_entries

STRUCT_NAMES = np.array(["negation", "contrast", "irony", "none"], dtype=object)
WORDS = ("open close take put examine unlock locked key container drawer cabinet fridge counter shelf "
         "inadmissible repeated failed goal reached feedback procedural spatial general preference "
         "kitchen bedroom bathroom livingroom first plan direct correction changed nothing").split()
OBJECTS = ("apple mug key book plate knife cup towel soap lamp fridge cabinet drawer shelf counter "
           "table box chest basket bin").split()


def vocabulary() -> np.ndarray:
    entities = [f"{o}_{i}" for o in OBJECTS for i in range(10)]
    return np.array(sorted(set(WORDS) | set(entities)), dtype=object)


def _list_array(flags: np.ndarray, names: np.ndarray) -> pa.ListArray:
    """Row-wise list of ``names[j]`` where ``flags[i, j]`` (row-major order kept)."""
    counts = flags.sum(axis=1)
    offsets = np.zeros(len(flags) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    cols = np.nonzero(flags)[1]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(names[cols].tolist(), pa.string()))


def synthetic_store(n: int, seed: int = 0, num_scenes: int = 50, quests_per_scene: int = 40) -> pa.Table:
    """A seeded store table with :data:`STORE_SCHEMA`, built column-wise (seconds for 10^6)."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary()
    lang = np.array(LANGUAGES, dtype=object)[rng.choice(3, n, p=[0.6, 0.35, 0.05])]
    bits = rng.random((n, 3)) < np.array([0.3, 0.2, 0.05])
    struct = np.concatenate([bits, ~bits.any(axis=1, keepdims=True)], axis=1)
    has_neg = bits[:, 0]
    marker = pa.array(np.where(bits[:, 1], "but", None).tolist(), pa.string())
    sig = pa.StructArray.from_arrays(
        [pa.array(lang.tolist(), pa.string()), _list_array(struct, STRUCT_NAMES), marker, pa.array(has_neg),
         pa.array(rng.integers(0, 5, n).astype(np.int32)),
         pa.array(np.array(LENGTH_BUCKETS, dtype=object)[rng.choice(3, n, p=[0.5, 0.4, 0.1])].tolist(), pa.string())],
        fields=list(STORE_SCHEMA.field("input_signature").type),
    )
    # 12 token draws per entry, deduplicated; ids sorted, so the token lists are sorted strings.
    ids = np.sort(rng.integers(0, len(vocab), (n, 12)), axis=1)
    keep = np.ones_like(ids, dtype=bool)
    keep[:, 1:] = ids[:, 1:] != ids[:, :-1]
    counts = keep.sum(axis=1)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    flat = vocab[ids[keep]]
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.tolist(), pa.string()))
    half = counts // 2
    symptom = [" ".join(flat[offsets[i]:offsets[i] + half[i]]) for i in range(n)]
    rationale = [" ".join(flat[offsets[i] + half[i]:offsets[i + 1]]) for i in range(n)]
    str_list = pa.list_(pa.string())
    empty_lists = pa.array([[]] * n, str_list)
    case = pa.StructArray.from_arrays([pa.array(symptom, pa.string()), pa.array(rationale, pa.string()), empty_lists],
                                      fields=list(STORE_SCHEMA.field("case_summary").type))
    snap = pa.StructArray.from_arrays([empty_lists, pa.nulls(n, pa.string())],
                                      fields=list(STORE_SCHEMA.field("stage_snapshot").type))
    won = rng.random(n) < 0.6
    corrected = rng.random(n) < 0.5
    by_type = pa.StructArray.from_arrays([empty_lists] * 4, fields=list(STORE_SCHEMA.field("correction").type[3].type))
    corr = pa.StructArray.from_arrays(
        [pa.array(corrected), pa.nulls(n, pa.int32()), pa.array(np.zeros(n, np.int32)), by_type],
        fields=list(STORE_SCHEMA.field("correction").type))
    ev = pa.StructArray.from_arrays(
        [pa.array(won), pa.array(won), pa.array(won.astype(np.float64)), pa.array(np.full(n, 5, np.int32)),
         pa.array(np.zeros(n, np.int32)), pa.array(np.zeros(n, np.int32))],
        fields=list(STORE_SCHEMA.field("evaluation").type))
    scene = rng.integers(0, num_scenes, n)
    quest = rng.integers(0, quests_per_scene, n)
    ep_ids = [f"ep_train_s{s}_q{q}_{i}" for i, (s, q) in enumerate(zip(scene.tolist(), quest.tolist()))]
    nulls = pa.nulls(n, pa.string())
    prov = pa.StructArray.from_arrays(
        [pa.array(ep_ids, pa.string()), pa.array([f"s{s}" for s in scene.tolist()], pa.string()),
         pa.array([f"q{q}" for q in quest.tolist()], pa.string()), nulls, nulls, nulls, pa.nulls(n, pa.int64()), nulls],
        fields=list(STORE_SCHEMA.field("provenance").type))
    return pa.Table.from_arrays(
        [pa.array([f"mem_{e}" for e in ep_ids], pa.string()), pa.array(["1.1"] * n, pa.string()),
         sig, case, snap, corr, ev, prov, tokens],
        schema=STORE_SCHEMA,
    )


def synthetic_queries(k: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed + 1)
    vocab = vocabulary()
    out = []
    for _ in range(k):
        neg, con = bool(rng.random() < 0.3), bool(rng.random() < 0.2)
        structure = [s for s, on in (("negation", neg), ("contrast", con)) if on] or ["none"]
        sig = InputSignatureV1_1(language=str(rng.choice(["en", "ko"])), detected_structure=structure,
                                 contrast_marker="but" if con else None, has_negation=neg,
                                 num_aspects=int(rng.integers(0, 5)), length_bucket=str(rng.choice(LENGTH_BUCKETS)))
        words = [str(w) for w in rng.choice(vocab, 6, replace=False)]
        out.append({"signature": sig, "lexical": " ".join(words), "scene_id": f"s{int(rng.integers(0, 50))}",
                    "quest_id": f"q{int(rng.integers(0, 40))}"})
    return out


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def bench_size(n: int, *, queries: int, loop_max: int, loop_queries: int, seed: int) -> dict[str, Any]:
    table = synthetic_store(n, seed)
    t0 = time.perf_counter()
    index = RetrievalIndex.from_table(table, tie_seed=seed)
    build_s = time.perf_counter() - t0
    retriever = Retriever(tie_seed=seed)
    qs = synthetic_queries(queries, seed)

    def vec(q):
        return retriever.retrieve_scored(index, q["signature"], q["lexical"], 3,
                                         query_scene_id=q["scene_id"], query_quest_id=q["quest_id"])

    vec(qs[0])  # warm-up
    lat = []
    for q in qs:
        t = time.perf_counter()
        vec(q)
        lat.append((time.perf_counter() - t) * 1000)
    vec_ms = statistics.median(lat)

    m = min(n, loop_max)
    sub = table.slice(0, m)
    entries = table_to_entries(sub)
    ties = tie_ranks(sub.column("entry_id"), seed)
    sub_index = RetrievalIndex.from_table(sub, tie_seed=seed)
    pre = [dict(e, _tok=set(t)) for e, t in zip(entries, sub.column("lexical_tokens").to_pylist())]

    def loop(q):
        return retrieve_loop(entries, q["signature"], q["lexical"], 3, query_scene_id=q["scene_id"],
                             query_quest_id=q["quest_id"], ties=ties)

    def loop_pretok(q):
        # The same per-entry loop with each entry's token set computed beforehand.
        sig, qtok = q["signature"], set(query_tokens(q["lexical"]))
        qset = set(sig.detected_structure)
        best = []
        for i, e in enumerate(pre):
            s, p = e["input_signature"], e["provenance"]
            if p["quest_id"] == q["quest_id"] and p["scene_id"] == q["scene_id"]:
                continue
            if s["language"] != sig.language:
                continue
            est = set(s["detected_structure"])
            if not (est & qset or "none" in est):
                continue
            m_ = (1 + (est == qset) + (s["has_negation"] == sig.has_negation)
                  + (s["num_aspects"] == sig.num_aspects) + (s["length_bucket"] == sig.length_bucket))
            best.append((-m_, -len(qtok & e["_tok"]), int(ties[i]), e["entry_id"]))
        best.sort()
        return [b[3] for b in best[:3]]

    lq = qs[:loop_queries]
    agree = all([h.entry["entry_id"] for h in retriever.retrieve_scored(
        sub_index, q["signature"], q["lexical"], 3, query_scene_id=q["scene_id"], query_quest_id=q["quest_id"])]
        == [eid for eid, *_ in loop(q)] for q in lq)
    loop_ms = statistics.median([_median_ms(lambda q=q: loop(q), 1) for q in lq])
    pretok_ms = statistics.median([_median_ms(lambda q=q: loop_pretok(q), 1) for q in lq])
    scale = n / m
    return {
        "entries": n,
        "index_build_s": build_s,
        "vectorised_ms": vec_ms,
        "loop_ms": loop_ms * scale,
        "loop_pretok_ms": pretok_ms * scale,
        "loop_entries": m,
        "extrapolated": m < n,
        "ratio": loop_ms * scale / vec_ms,
        "ratio_pretok": pretok_ms * scale / vec_ms,
        "agree": agree,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'entries':>9} | {'index build':>11} | {'top-3 vectorised':>16} | {'loop seed-style':>15} | "
            f"{'ratio':>7} | {'loop pre-tok':>12} | {'ratio':>7} | {'loop on':>9} | agree")
    print(head)
    print("-" * len(head))
    for r in rows:
        mark = "*" if r["extrapolated"] else " "
        print(f"{r['entries']:>9,} | {r['index_build_s']:>9.2f} s | {r['vectorised_ms']:>13.2f} ms | "
              f"{r['loop_ms']:>11.1f} ms{mark} | {r['ratio']:>6.0f}x | {r['loop_pretok_ms']:>9.1f} ms{mark} | "
              f"{r['ratio_pretok']:>6.0f}x | {r['loop_entries']:>9,} | {'yes' if r['agree'] else 'NO'}")
    if any(r["extrapolated"] for r in rows):
        print("* extrapolated linearly from a loop over the first `loop on` entries of the same store")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_retrieval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    p.add_argument("--queries", type=int, default=31, help="queries timed per size (median reported)")
    p.add_argument("--loop-queries", type=int, default=3, help="queries timed with the loops")
    p.add_argument("--loop-max", type=int, default=100_000, help="largest store the loops run on in full")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows = [bench_size(n, queries=args.queries, loop_max=args.loop_max, loop_queries=args.loop_queries, seed=args.seed)
            for n in args.sizes]
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
