"""Load: peak memory of collect with 64 environments batched, and of a 10^6-entry episodic store.

    python -m benchmarks.bench_load                          # everything, default sizes
    python -m benchmarks.bench_load --parts collect-llm --envs 64
    python -m benchmarks.bench_load --parts store-write store-load --entries 1000000 --json

Each part runs in a fresh child process and reports that process's peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``: everything, torch and TextWorld included)
against the target of 4 GiB; ``--tracemalloc`` also reports the Python-heap peak (slower).

Parts:

- ``collect-llm``: :func:`pipeline.session.collection.run_collection` with ``--envs`` episodes
  played at once (``agent.batch_size = --envs``, one batched generation per step) by the
  ``llm`` agent on a tiny GPT-2 and a byte-level BPE tokenizer built here (no download),
  in the tiny household world (games compiled in a temp folder), greedy decoding;
- ``collect-react``: the same with the rule-based ``react`` agent;
- ``store-write``: a synthetic store of ``--entries`` entries (column-wise, the schema of
  :data:`pipeline.memory.schemas.STORE_SCHEMA`) through :class:`pipeline.memory.EpisodicStore`
  (content hash), :func:`pipeline.memory.write_store` (Parquet + JSONL + hash) and
  :func:`pipeline.memory.build.store_metrics`, as the store stage does;
- ``store-load``: :func:`pipeline.memory.load_store` of that store (hash verified), its
  retrieval index and 20 top-3 queries, as the render stage does.

Figures are from one run on this machine; nothing asserts them.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/bench_load.py`
    sys.path.insert(0, str(ROOT))

TARGET_GIB = 4.0
PARTS = ("collect-llm", "collect-react", "store-write", "store-load")
TINY_WORLD = ["env=tiny", "workers=2"]


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def compose(overrides: list[str]):
    from omegaconf import OmegaConf

    from pipeline.core.config import compose_text, validate

    return validate(OmegaConf.create(compose_text(ROOT, overrides)))


def tiny_model_dir(cfg, games, workdir: Path) -> Path:
    """A byte-level BPE tokenizer trained on real prompts of these games and a random tiny GPT-2."""
    from types import SimpleNamespace as NS

    from pipeline.agents.llm import LLMAgent
    from pipeline.envs.household.env import HouseholdEnv
    from pipeline.llm.backends import plain_prompt
    from pipeline.llm.tiny import save_model_dir, tiny_gpt2, train_tokenizer

    texts = []
    for row in games.rows:
        with HouseholdEnv(str(games.root / row["game_file"]), scene_id=row["scene_id"], quest_id=row["quest_id"],
                          objective=row["objective"], max_steps=5) as env:
            obs = env.reset()
        agent = LLMAgent(cfg, seed=0, backend=NS())
        agent.reset({"episode_id": "x", "objective": row["objective"]})
        texts.append(plain_prompt(agent.messages(obs)))
    texts.append('I look around.\n{"action": "look", "target": null}')
    tok = train_tokenizer(texts, vocab_size=1024)
    model = tiny_gpt2(tok, n_layer=2, n_embd=96, n_head=2, n_positions=2048)
    return save_model_dir(workdir / "model", model, tok)


def run_collect(agent: str, envs: int, steps: int, max_new_tokens: int) -> dict:
    from pipeline.session.rollout import tasks_from_manifest
    from pipeline.session.collection import run_collection
    from pipeline.envs.household.build import build_games

    overrides = TINY_WORLD + [f"env.max_steps={steps}", f"agent={agent}", f"agent.batch_size={envs}",
                              "agent.batched=true"]
    if agent == "llm":
        overrides += ["model=local", "sampling=greedy", f"sampling.max_new_tokens={max_new_tokens}"]
    cfg = compose(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        games = build_games(cfg, root, progress=False)
        games_s = time.perf_counter() - t0
        if agent == "llm":
            cfg.model.name_or_path = str(tiny_model_dir(cfg, games, root))
        train = [r for r in games.rows if r["split"] == "train"]
        repeats = -(-envs // len(train))
        tasks = tasks_from_manifest(games.rows, split="train", master_seed=0, repeats=repeats)[:envs]
        rss_before = peak_rss_gib()
        t1 = time.perf_counter()
        records, stats = run_collection(cfg, root, tasks, root / "data" / "episodes", scenes=games.scenes,
                                        ckpt_name="bench", desc=f"collect {envs} envs [{agent}]")
        wall = time.perf_counter() - t1
        tensors = sum(p.stat().st_size for p in (root / "data" / "episodes").rglob("*.pt"))
    prompt_tokens = sum(r["episode"]["prompt_tokens"] for r in records)
    return {"agent": agent, "envs": envs, "episodes": stats["num_episodes"], "turns": stats["num_turns"],
            "prompt_tokens_per_turn": round(prompt_tokens / max(1, stats["num_turns"]), 1),
            "generated_tokens_per_turn": round(stats["generated_tokens_per_turn"], 1),
            "max_steps": steps, "games_s": round(games_s, 1), "collect_wall_s": round(wall, 1),
            "peak_rss_before_collect_gib": round(rss_before, 3), "tensor_bytes": tensors}


def store_dir(entries: int, seed: int) -> Path:
    return Path(tempfile.gettempdir()) / f"bench_load_store_{entries}_{seed}"


def run_store_write(entries: int, seed: int) -> dict:
    from benchmarks.bench_retrieval import synthetic_store
    from pipeline.core.io import atomic_dir
    from pipeline.memory import EpisodicStore, write_store
    from pipeline.memory.build import store_metrics

    t0 = time.perf_counter()
    table = synthetic_store(entries, seed)
    build_s = time.perf_counter() - t0
    rss_table = peak_rss_gib()
    t1 = time.perf_counter()
    store = EpisodicStore(table)  # computes the content hash (canonical JSONL)
    out = store_dir(entries, seed)
    with atomic_dir(out) as tmp:  # exactly as the store stage writes
        write_store(store, tmp)
    write_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    metrics = store_metrics(store)  # the stage's metrics/store.json
    metrics_s = time.perf_counter() - t2
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    return {"entries": entries, "build_table_s": round(build_s, 1), "peak_rss_after_table_gib": round(rss_table, 3),
            "hash_and_write_s": round(write_s, 1), "metrics_s": round(metrics_s, 1),
            "files_mib": {k: round(v / 2**20, 1) for k, v in sizes.items()}, "num_scenes": metrics["num_scenes"],
            "store_hash": store.store_hash[:12]}


def run_store_load(entries: int, seed: int) -> dict:
    from benchmarks.bench_retrieval import synthetic_queries
    from pipeline.memory import Retriever, load_store

    out = store_dir(entries, seed)
    if not out.exists():
        raise SystemExit(f"{out} is missing: run the store-write part first")
    t0 = time.perf_counter()
    store = load_store(out, tie_seed=seed)  # verifies the hash over the JSONL file
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    _ = store.index
    index_s = time.perf_counter() - t1
    retriever = Retriever(tie_seed=seed)
    t2 = time.perf_counter()
    hits = 0
    for q in synthetic_queries(20, seed):
        hits += len(retriever.retrieve(store, q["signature"], q["lexical"], 3, query_scene_id=q["scene_id"],
                                       query_quest_id=q["quest_id"]))
    query_ms = (time.perf_counter() - t2) * 1000 / 20
    return {"entries": len(store), "load_s": round(load_s, 1), "index_s": round(index_s, 1),
            "query_ms_mean": round(query_ms, 1), "hits": hits}


def child(part: str, args: argparse.Namespace) -> dict:
    if args.tracemalloc:
        tracemalloc.start()
    t0 = time.perf_counter()
    if part.startswith("collect-"):
        res = run_collect(part.split("-", 1)[1], args.envs, args.steps, args.max_new_tokens)
    elif part == "store-write":
        res = run_store_write(args.entries, args.seed)
    else:
        res = run_store_load(args.entries, args.seed)
    res.update(part=part, wall_s=round(time.perf_counter() - t0, 1), peak_rss_gib=round(peak_rss_gib(), 3))
    if args.tracemalloc:
        res["python_heap_peak_gib"] = round(tracemalloc.get_traced_memory()[1] / 2**30, 3)
    res["within_target"] = res["peak_rss_gib"] <= TARGET_GIB
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--envs", type=int, default=64, help="environments played at once (batch size)")
    parser.add_argument("--steps", type=int, default=15, help="env.max_steps of the collect parts")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="generation cap per turn (collect-llm)")
    parser.add_argument("--entries", type=int, default=1_000_000, help="store size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracemalloc", action="store_true", help="also measure the Python-heap peak (slower)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per part")
    parser.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # in the child process: run one part, print its figures as one JSON line
        print("BENCH " + json.dumps(child(args.child, args)), flush=True)
        return 0
    results = []
    for part in args.parts:
        cmd = [sys.executable, "-m", "benchmarks.bench_load", "--child", part, "--envs", str(args.envs),
               "--steps", str(args.steps), "--max-new-tokens", str(args.max_new_tokens),
               "--entries", str(args.entries), "--seed", str(args.seed)]
        cmd += ["--tracemalloc"] if args.tracemalloc else []
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")), None)
        if proc.returncode != 0 or line is None:
            print(f"{part}: failed (exit {proc.returncode})\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        res = json.loads(line[6:])
        results.append(res)
        if args.json:
            print(json.dumps(res))
        else:
            extra = {k: v for k, v in res.items() if k not in ("part", "peak_rss_gib", "within_target")}
            print(f"{part:14s} peak RSS {res['peak_rss_gib']:6.2f} GiB "
                  f"({'within' if res['within_target'] else 'OVER'} the {TARGET_GIB:g} GiB target)  {extra}")
    import shutil

    shutil.rmtree(store_dir(args.entries, args.seed), ignore_errors=True)  # the store parts' scratch copy
    return 0 if all(r["within_target"] for r in results) else 2


if __name__ == "__main__":
    sys.exit(main())
