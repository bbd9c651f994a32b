"""Every benchmark of the project, one command, one table (issue 9).

    python -m benchmarks                       # everything (about half an hour on 2 cores)
    python -m benchmarks --quick               # a smoke version of everything (minutes)
    python -m benchmarks --only retrieval render
    python -m benchmarks --list                # names and what each measures
    python -m benchmarks --only engines --device cuda   # the engines on a GPU (skipped, saying so, without CUDA)
    python -m benchmarks --only engines --variants cache   # some variants of a benchmark (the others' figures kept)

Each benchmark runs in its own subprocess (``python -m benchmarks --child NAME``), so a
failure or a memory peak in one never affects another, and peak memory is that process's
own. The table has one row per figure: value, unit, the ratio against a baseline measured
in the same run (named in the ``vs`` column), and the issue's target where it sets one.
Above it: date, machine (cores, CPU model) and the load average before and after every
benchmark (the machine is shared: prefer the ratios).

A full run writes ``benchmarks/results.json`` (docs/performance.md's figures and the README's run-time projection come
from it; it is not a DVC output); ``--only`` updates just those benchmarks in it;
``--quick`` writes nothing unless ``--out`` is given. Nothing here is a test assertion.

Pipeline benchmarks run in a scratch copy of the project (``conf``, ``hydra_plugins``,
``pipeline``, ``dvc.yaml``, ``params.yaml``, ``.dvc/config``) under
``$TMPDIR/pipeline_bench/``, never in the working tree; ``--keep`` keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/__main__.py`
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    BENCH_DIR_ENV,
    RESULTS,
    _r,
    bench_dir,
    load_average,
    machine_info,
    make_scratch_repo,
    peak_rss_gib,
    row,
    run_timed,
    venv_env,
)

RESULT_TAG = "BENCH_RESULT "
DEFAULTS_ENV = "PIPELINE_BENCH_DEFAULTS"  # --set-default, for the pipeline benchmark's scratch copy
DEVICE_ENV = "PIPELINE_BENCH_DEVICE"  # --device, for the engines benchmark's model-running variants


def device_info(dev: str) -> dict[str, Any]:
    """What ``--device`` names, as recorded in results.json: the device, its name, and why it
    cannot be used here (``problem``), if so. Imports torch only for a non-CPU device."""
    if dev == "cpu":
        return {"device": "cpu"}
    import torch  # deferred: only --device cuda needs it in the parent

    if dev.startswith("cuda") and torch.cuda.is_available():
        return {"device": dev, "name": torch.cuda.get_device_name(torch.device(dev)), "torch": torch.__version__,
                "cuda": torch.version.cuda}
    why = "CUDA is not available on this machine" if dev.startswith("cuda") else "only cpu and cuda are measured"
    return {"device": dev, "problem": f"{why} (torch {torch.__version__})"}


def _ratio(a: float | None, b: float | None, nd: int = 2) -> float | None:
    return round(a / b, nd) if a is not None and b not in (None, 0) else None


# ----------------------------------------------------------------------------- pipeline


def bench_pipeline(variant: str, quick: bool) -> dict[str, Any]:
    """Cold default ``dvc repro`` per stage, then warm no-op ``dvc repro`` and ``dvc status``."""
    defaults = [d for d in os.environ.get(DEFAULTS_ENV, "").split(",") if d]
    repo_info = make_scratch_repo(bench_dir() / "repo", tiny=quick, defaults=defaults)
    repo = Path(repo_info["path"])
    env = venv_env()
    dvc = [sys.executable, "-m", "dvc"]
    marks: list[tuple[float, str]] = []

    def on_line(t: float, line: str) -> None:
        if line.startswith("Running stage '"):
            marks.append((t, line.split("'")[1]))

    load_before = load_average()
    cold = run_timed(dvc + ["repro"], repo, env, timeout=3000, on_line=on_line)
    if cold["returncode"] != 0:
        raise RuntimeError(f"cold dvc repro failed (exit {cold['returncode']}):\n{cold['output'][-3000:]}")
    total = cold["wall_s"]
    stages = []
    for i, (t, name) in enumerate(marks):  # a stage's span: its "Running stage" line to the next one
        end = marks[i + 1][0] if i + 1 < len(marks) else total
        stages.append((name, end - t))
    rows = [row(f"cold repro: {name}", _r(s, 1), "s", ratio=_ratio(s, total, 3), vs="cold total")
            for name, s in stages]
    rows.append(row("cold repro: DVC before the first stage", _r(marks[0][0] if marks else total, 1), "s"))
    rows.append(row("cold default `dvc repro` (total)", _r(total, 1), "s", target="< 600 s", met=total < 600,
                    note=f"CPU {cold['cpu_s']:.0f} s; load {load_before} -> {load_average()}"))

    runs = {"repro": [], "status": [], "version": []}
    for _ in range(3 if not quick else 2):
        for name, args in (("version", ["version"]), ("repro", ["repro"]), ("status", ["status"])):
            res = run_timed(dvc + args, repo, env, timeout=300)
            if res["returncode"] != 0:
                raise RuntimeError(f"dvc {' '.join(args)} failed:\n{res['output'][-2000:]}")
            if name == "repro" and "up to date" not in res["output"]:
                raise RuntimeError(f"the warm dvc repro was not a no-op:\n{res['output'][-2000:]}")
            runs[name].append(res)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    ver = med("version", "wall_s")
    rows += [
        row("warm no-op `dvc repro`", _r(med("repro", "wall_s"), 2), "s", ratio=_ratio(med("repro", "wall_s"), ver),
            vs="`dvc version`", target="< 2 s", met=med("repro", "wall_s") < 2,
            note=f"CPU {med('repro', 'cpu_s'):.2f} s"),
        row("warm `dvc status`", _r(med("status", "wall_s"), 2), "s", ratio=_ratio(med("status", "wall_s"), ver),
            vs="`dvc version`", note=f"CPU {med('status', 'cpu_s'):.2f} s"),
        row("`dvc version` (DVC start-up alone)", _r(ver, 2), "s", note=f"CPU {med('version', 'cpu_s'):.2f} s"),
    ]
    return {"rows": rows, "details": {"repo": repo_info, "stages_s": {n: round(s, 2) for n, s in stages},
                                      "cold_cpu_s": round(cold["cpu_s"], 1),
                                      "cold_output_tail": cold["output"][-1500:]}}


# ----------------------------------------------------------------------------- start-up

STAGE_MODULES = ("games", "demos", "policy", "collect", "ground", "merge", "store", "render", "evaluate", "compare")


def bench_startup(variant: str, quick: bool) -> dict[str, Any]:
    """Fresh-process costs every stage pays: imports, and ``load_params`` with / without its stamp."""
    repo = bench_dir() / "startup"
    make_scratch_repo(repo, tiny=False)
    env = venv_env()
    py = [sys.executable, "-c"]
    reps = 2 if quick else 5

    def med(code: str) -> float:
        times = []
        for _ in range(reps):
            res = run_timed(py + [code], repo, env, timeout=300)
            if res["returncode"] != 0:
                raise RuntimeError(f"{code!r} failed:\n{res['output'][-1500:]}")
            times.append(res["wall_s"])
        return statistics.median(times)

    bare = med("pass")
    check_cold = med("from pipeline.core.config import check; check(use_stamp=False)")
    med("from pipeline.core.config import check; check()")  # leaves the stamp
    check_stamp = med("from pipeline.core.config import check; check()")
    lp_cold = med("from pipeline.core.config import check, load_params; check(use_stamp=False); "
                  "load_params(check_stale=False)")
    lp_stamp = med("from pipeline.core.config import load_params; load_params()")
    rows = [
        row("`python -c pass` (interpreter start-up)", _r(bare, 3), "s"),
        row("stale check, Hydra compose every time (before)", _r(check_cold, 3), "s",
            ratio=_ratio(check_cold, check_stamp), vs="stamped check (after)"),
        row("stale check, stamped (after)", _r(check_stamp, 3), "s"),
        row("stage `load_params()` before (compose + validate twice)", _r(lp_cold, 3), "s",
            ratio=_ratio(lp_cold, lp_stamp), vs="stamped `load_params()`"),
        row("stage `load_params()` after (stamp hit)", _r(lp_stamp, 3), "s"),
    ]
    for lib in ("textworld", "torch", "transformers"):
        t = med(f"import {lib}")
        rows.append(row(f"`import {lib}`", _r(t, 3), "s", ratio=_ratio(t, bare), vs="`python -c pass`"))
    for stage in STAGE_MODULES:
        if not (repo / "pipeline" / "stages" / f"{stage}.py").exists():
            continue
        t = med(f"import pipeline.stages.{stage}")
        rows.append(row(f"`import pipeline.stages.{stage}`", _r(t, 3), "s", ratio=_ratio(t, bare),
                        vs="`python -c pass`"))
    shutil.rmtree(repo, ignore_errors=True)
    return {"rows": rows, "details": {"repetitions": reps}}


# ----------------------------------------------------------------------------- data formats


def _table_before(rows: list[dict], schema) -> Any:
    """``pipeline.core.schemas._table`` as it was before issue 9's fix (per-row loop), for the ratio."""
    import pyarrow as pa

    cols = {}
    for f in schema:
        values = []
        for i, r in enumerate(rows):
            if f.name not in r:
                if f.nullable:
                    values.append(None)
                    continue
                raise ValueError(f"row {i}: missing field {f.name!r}")
            values.append(r[f.name])
        cols[f.name] = pa.array(values, type=f.type)
    extra = set().union(*(r.keys() for r in rows)) - set(schema.names) if rows else set()
    if extra:
        raise ValueError(f"unknown fields {sorted(extra)}")
    return pa.table(cols, schema=schema)


def bench_parquet(variant: str, quick: bool) -> dict[str, Any]:
    """Canonical Parquet write / read of 10^6 turns; dict rows -> Arrow of 10^5 turns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.common import synthetic_turns
    from pipeline.core.io import read_parquet, write_parquet
    from pipeline.core.schemas import TURN_SCHEMA, turns_table

    n = 10_000 if quick else 1_000_000
    t0 = time.perf_counter()
    table = synthetic_turns(n, seed=0)
    build_s = time.perf_counter() - t0
    # Shuffled rows: the canonical writer sorts them (as write_episodes does).
    import numpy as np

    table = table.take(pa.array(np.random.default_rng(1).permutation(n)))
    with tempfile.TemporaryDirectory() as tmp:
        canon, plain = Path(tmp) / "turns.parquet", Path(tmp) / "plain.parquet"
        t0 = time.perf_counter()
        write_parquet(table, canon, sort_by=["episode_id", "turn_index"], schema_version="1")
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        pq.write_table(table, plain)
        plain_write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = read_parquet(canon)
        read_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        pq.read_table(plain)
        plain_read_s = time.perf_counter() - t0
        size, plain_size = canon.stat().st_size, plain.stat().st_size
    assert back.num_rows == n
    mem_mib = table.nbytes / 2**20

    m = 2_000 if quick else 100_000
    rows = table.slice(0, m).to_pylist()
    t0 = time.perf_counter()
    after = turns_table(rows)
    conv_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    before = _table_before(rows, TURN_SCHEMA)
    conv_before_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pa.Table.from_pylist(rows, schema=TURN_SCHEMA)
    pylist_s = time.perf_counter() - t0
    assert after.equals(before)
    label = f"{n:,} turns"
    return {"rows": [
        row(f"write_parquet {label} (sorted, zstd, atomic)", _r(write_s, 2), "s", ratio=_ratio(write_s, plain_write_s),
            vs="pq.write_table defaults, unsorted", note=f"{n / write_s / 1e3:,.0f}k rows/s; "
            f"{size / 2**20:.0f} MiB on disk (plain {plain_size / 2**20:.0f} MiB), {mem_mib:.0f} MiB in Arrow"),
        row(f"read_parquet {label}", _r(read_s, 2), "s", ratio=_ratio(read_s, plain_read_s),
            vs="pq.read_table of the plain file", note=f"{n / read_s / 1e3:,.0f}k rows/s"),
        row(f"turns_table: {m:,} dict rows -> Arrow (after)", _r(conv_s, 2), "s",
            ratio=_ratio(conv_before_s, conv_s), vs="per-row loop (before)",
            note=f"before {conv_before_s:.2f} s; pa.Table.from_pylist {pylist_s:.2f} s"),
    ], "details": {"turns": n, "synthetic_build_s": round(build_s, 2), "file_bytes": size,
                   "plain_file_bytes": plain_size, "arrow_mib": round(mem_mib, 1), "peak_rss_gib": _r(peak_rss_gib())}}


def _store_build(num_episodes: int) -> dict[str, float]:
    from benchmarks.common import synthetic_episodes
    from pipeline.core.io import atomic_dir
    from pipeline.envs.household.reader import HouseholdFactReader
    from pipeline.memory.store import build_entries, EpisodicStore, write_store
    from pipeline.memory.build import store_metrics

    episodes, turns = synthetic_episodes(num_episodes, seed=0)
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    entries = build_entries(episodes, turns, reader=HouseholdFactReader(), splits=["train"], config_hash="bench")
    out["build_entries_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    store = EpisodicStore.from_entries(entries)
    out["to_table_s"] = time.perf_counter() - t0
    del entries
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with atomic_dir(Path(tmp) / "store") as d:
            write_store(store, d)
        out["write_store_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    store_metrics(store)
    out["metrics_s"] = time.perf_counter() - t0
    out["total_s"] = sum(out.values())
    out["entries"] = len(store)
    return out


def bench_store(variant: str, quick: bool) -> dict[str, Any]:
    """The store stage's core on synthetic episodes: 10^5 (and 10^4 for the scaling ratio)."""
    big, small = (1_000, 100) if quick else (100_000, 10_000)
    s = _store_build(small)
    b = _store_build(big)
    parts = ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in b.items() if k.endswith("_s") and k != "total_s")
    return {"rows": [
        row(f"store build, {big:,} episodes (6 turns each)", _r(b["total_s"], 1), "s",
            ratio=_ratio(b["total_s"], s["total_s"]), vs=f"{small:,} episodes (10 = linear)",
            note=f"{big / b['total_s']:,.0f} episodes/s; {parts}"),
    ], "details": {"big": b, "small": s, "peak_rss_gib": _r(peak_rss_gib())}}


# ----------------------------------------------------------------------------- existing benchmarks


def bench_retrieval(variant: str, quick: bool) -> dict[str, Any]:
    """Top-3 retrieval (issue 5): the vectorised index against a per-entry Python loop."""
    from benchmarks.bench_retrieval import bench_size

    sizes = [1_000, 10_000] if quick else [1_000, 100_000, 1_000_000]
    rows, details = [], []
    for n in sizes:
        r = bench_size(n, queries=5 if quick else 31, loop_max=10_000 if quick else 100_000,
                       loop_queries=2 if quick else 3, seed=0)
        details.append(r)
        big = n >= 1_000_000
        rows.append(row(f"top-3 retrieval over {n:,} entries", _r(r["vectorised_ms"], 2), "ms",
                        ratio=_ratio(r["loop_ms"], r["vectorised_ms"], 0),
                        vs="per-entry Python loop" + (" (extrapolated)" if r["extrapolated"] else ""),
                        target="< 50 ms, >= 50x" if big else None,
                        met=(r["vectorised_ms"] < 50 and r["ratio"] >= 50) if big else None,
                        note=f"index build {r['index_build_s']:.2f} s; pre-tokenised loop "
                             f"{r['ratio_pretok']:.0f}x; same results: {r['agree']}"))
    return {"rows": rows, "details": details}


def bench_render(variant: str, quick: bool) -> dict[str, Any]:
    """System prompts per second (issue 6)."""
    from benchmarks.bench_render import run

    r = run(n=2_000 if quick else 20_000, repeats=1 if quick else 3)
    full = r["get_system_prompt_per_s"]
    return {"rows": [
        row("get_system_prompt (per turn, llm agent)", full, "prompts/s", target=">= 10,000/s", met=full >= 10_000,
            note=f"{r['prompt_chars']} characters"),
        row("render_turn (frozen per-episode prompt)", r["render_turn_per_s"], "prompts/s",
            ratio=_ratio(r["render_turn_per_s"], full), vs="get_system_prompt"),
        row("freeze_system_prompt (per task, render stage)", r["freeze_per_s"], "prompts/s",
            ratio=_ratio(r["freeze_per_s"], full), vs="get_system_prompt"),
        row("render_memory_value (nested memory dict)", r["render_memory_value_per_s"], "renders/s"),
    ], "details": r}


def bench_worlds(variant: str, quick: bool) -> dict[str, Any]:
    """A generated house: compiled (Inform 7, Jericho) vs TextWorld's logic engine (issue 30)."""
    from benchmarks.bench_worlds import run

    r = run(houses=2 if quick else 10, steps=50 if quick else 200)
    return {"rows": [
        row("quest ready to play, logic engine (build Game + reset)", _r(r["build_s"] + r["logic_reset_s"], 4), "s",
            ratio=r["speedup_quest_ready"], vs="compile + reset (Inform 7, Jericho)",
            note=f"compile {r['compile_s']:.2f} s, reset {r['compiled_reset_s']:.3f} s"),
        row("random-walk steps, logic engine", _r(r["logic_steps_per_s"], 1), "steps/s",
            ratio=r["speedup_steps"], vs="compiled game"),
    ], "details": r}


def bench_scienceworld(variant: str, quick: bool) -> dict[str, Any]:
    """ScienceWorld (issue 33): the engine alone, the adapter, a rule agent's collection (1 and 2 workers)."""
    from benchmarks.bench_scienceworld import run
    from pipeline.envs.scienceworld.engine import missing

    why = missing()
    if why is not None:
        raise RuntimeError(f"ScienceWorld cannot run here: {why}")
    r = run(["find-plant"] if quick else ["find-plant", "find-animal"], steps=20 if quick else 60)
    return {"rows": [
        row("ScienceWorld engine alone (gold commands, no state read back)", _r(r["engine_steps_per_s"], 1), "steps/s"),
        row("ScienceWorld adapter step (object tree, valid combinations, facts)", _r(r["adapter_steps_per_s"], 2),
            "steps/s", ratio=_ratio(r["adapter_steps_per_s"], r["engine_steps_per_s"]), vs="engine alone",
            note=f"valid combinations {r['valid_combinations_s']:.3f} s a step; reset with a fresh JVM {r['reset_s']:.2f} s"),
        row("ScienceWorld collect, react + simulated user, fresh JVM per episode", _r(r["collect_1_worker_turns_per_s"], 2),
            "turns/s", ratio=_ratio(r["collect_2_workers_turns_per_s"], r["collect_1_worker_turns_per_s"]),
            vs="2 workers (ratio: 2 workers / 1)"),
    ], "details": r}


def bench_collect_llm(variant: str, quick: bool) -> dict[str, Any]:
    """Batched vs sequential generation and early stop (issue 3), tiny GPT-2 fitted on real prompts."""
    from benchmarks.bench_collect_llm import run

    kw = dict(turns_n=8, batch=4, fit_steps=20, fit_examples=4, repeats=1) if quick else dict(turns_n=32, batch=8)
    r = run(**kw)
    runs = r["runs"]
    b, s = runs["batched"], runs["sequential"]
    return {"rows": [
        row(f"batched collection N={r['batch']}, real prompts", _r(b["steps_per_s"], 2), "steps/s",
            ratio=r["speedup_real_prompts_steps"], vs="sequential (one at a time)", target=">= 4x",
            met=r["speedup_real_prompts_steps"] >= 4, note=f"same actions: {r['same_actions_batched_vs_sequential']}"),
        row(f"batched generation N={r['batch']}, decode-bound", _r(runs["short_batched"]["tokens_per_s"], 1),
            "tokens/s", ratio=r["speedup_short_prompts_tokens"], vs="sequential", target=">= 4x",
            met=r["speedup_short_prompts_tokens"] >= 4, note=f"same ids: {r['same_ids_short_batched_vs_sequential']}"),
        row("early stop: generated tokens per turn", _r(b["tokens_per_turn"], 1), "tokens",
            ratio=r["early_stop_tokens_per_turn_ratio"], vs="no early stop"),
        row("early stop: wall time, batched", _r(b["wall_s"], 2), "s", ratio=r["early_stop_wall_ratio_batched"],
            vs="no early stop"),
        row("early stop: wall time, sequential", _r(s["wall_s"], 2), "s",
            ratio=r["early_stop_wall_ratio_sequential"], vs="no early stop"),
    ], "details": r}


# ----------------------------------------------------------------------------- collect memory


def _collect_setup(quick: bool) -> tuple[Any, Path, list, dict, str]:
    """(cfg, root, manifest rows, scenes, model label): the default model when the pipeline
    benchmark left one in its scratch copy, else the tiny test model in the tiny world."""
    from omegaconf import OmegaConf

    from pipeline.core.config import compose_text, validate

    repo = bench_dir() / "repo"
    if (repo / "params.yaml").exists() and Path.cwd().resolve() == repo.resolve():
        cfg = validate(OmegaConf.create((repo / "params.yaml").read_text()))
        model_dir = repo / str(cfg.model.name_or_path or "")
        if cfg.agent.name == "llm" and cfg.model.name_or_path and (model_dir / "config.json").exists():
            from pipeline.session.collection import load_games

            manifest, scenes = load_games(repo, cfg)
            return cfg, repo, manifest, scenes, f"default model ({cfg.model.name_or_path})"
    from benchmarks.bench_load import tiny_model_dir
    from pipeline.envs.household.build import build_games

    cfg = validate(OmegaConf.create(compose_text(ROOT, ["env=tiny", "workers=2", "agent=llm",
                                                        "model=local", "sampling=greedy"])))
    root = bench_dir() / "tiny_world"
    shutil.rmtree(root, ignore_errors=True)
    games = build_games(cfg, root, progress=False)
    cfg.model.name_or_path = str(tiny_model_dir(cfg, games, root))
    return cfg, root, games.rows, games.scenes, "TINY TEST MODEL (pipeline/llm/tiny.py; no default model yet)"


def _warm_up(cfg: Any, root: Path, tasks: list, scenes: dict) -> None:
    """One short episode first: imports, TextWorld's grammar and the model's first load are
    paid once per process, so the timed runs measure steady-state collection."""
    from pipeline.session.collection import run_collection

    steps = cfg.env.max_steps
    cfg.env.max_steps = 1
    with tempfile.TemporaryDirectory() as tmp:
        run_collection(cfg, root, tasks[:1], Path(tmp) / "episodes", scenes=scenes, ckpt_name="bench_warm_up",
                       desc="warm-up")
    cfg.env.max_steps = steps


def _collect_threads(quick: bool) -> dict[str, Any]:
    """Collect at batch 8 with torch's default thread count (before issue 9) and with the fix's."""
    import torch

    from pipeline.session.rollout import tasks_from_manifest
    from pipeline.session import collection as C

    cfg, root, manifest, scenes, label = _collect_setup(quick)
    cfg.agent.batch_size, cfg.agent.batched, cfg.env.max_steps = 8, True, 3 if quick else 5
    train = [r for r in manifest if r["split"] == "train"]
    tasks = tasks_from_manifest(manifest, split="train", master_seed=0, repeats=-(-8 // len(train)))[:8]
    default = torch.get_num_threads()
    fixed = int(cfg.numerics.threads)
    _warm_up(cfg, root, tasks, scenes)
    times: dict[int, list[float]] = {default: [], fixed: []}
    turns = 0
    for threads in [default, fixed] * (1 if quick else 2):
        cfg.numerics.threads = threads
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            _, stats = C.run_collection(cfg, root, tasks, Path(tmp) / "episodes", scenes=scenes,
                                        ckpt_name="bench_threads", desc=f"collect, {threads} threads")
            times[threads].append(time.perf_counter() - t0)
            turns = stats["num_turns"]
    cfg.numerics.threads = fixed
    before, after = min(times[default]), min(times[fixed])
    return {"rows": [
        row(f"collect batch 8, torch threads = cores ({default}) (before)", _r(turns / before, 2), "steps/s",
            note=f"{label}; {turns} steps, best of {len(times[default])}: {before:.1f} s"),
        row(f"collect batch 8, torch threads = {fixed} (after)", _r(turns / after, 2), "steps/s",
            ratio=_ratio(before, after), vs=f"{default} threads (before)",
            note=f"best of {len(times[fixed])}: {after:.1f} s; load {load_average()}"),
    ], "details": {"model": label, "times_s": {str(k): [round(x, 2) for x in v] for k, v in times.items()},
                   "turns": turns}}


def bench_collect_memory(variant: str, quick: bool) -> dict[str, Any]:
    """Peak memory and speed of collect with the llm agent at one batch size (``variant``)."""
    from pipeline.session.rollout import tasks_from_manifest
    from pipeline.session.collection import run_collection

    if variant == "threads":
        return _collect_threads(quick)
    batch = int(variant)
    episodes, steps = (4, 3) if quick else (32, 10)
    cfg, root, manifest, scenes, label = _collect_setup(quick)
    cfg.agent.batch_size = batch
    cfg.agent.batched = batch > 1
    cfg.env.max_steps = steps
    train = [r for r in manifest if r["split"] == "train"]
    tasks = tasks_from_manifest(manifest, split="train", master_seed=0, repeats=-(-episodes // len(train)))[:episodes]
    _warm_up(cfg, root, tasks, scenes)
    rss0 = peak_rss_gib()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        _, stats = run_collection(cfg, root, tasks, Path(tmp) / "episodes", scenes=scenes,
                                  ckpt_name=f"bench_collect_{batch}", desc=f"collect batch {batch}")
        wall = time.perf_counter() - t0
    peak = peak_rss_gib()
    sps = stats["num_turns"] / wall
    return {"rows": [
        row(f"collect batch {batch}: peak memory [{label.split(' (')[0]}]", _r(peak, 3), "GiB",
            target="< 2 GiB" if batch == 32 else None, met=(peak < 2) if batch == 32 else None,
            note=f"{label}; {len(tasks)} episodes x <= {steps} steps; after a 1-step warm-up {rss0:.2f} GiB"),
        row(f"collect batch {batch}: agent steps/s", _r(sps, 2), "steps/s",
            vs=None if batch == 1 else "collect batch 1: agent steps/s",  # ratio filled in by the parent
            note=f"{stats['num_turns']} steps in {wall:.1f} s; {stats.get('generated_tokens_per_turn', 0):.1f} "
                 f"generated tokens/turn; torch threads while generating: {cfg.numerics.threads}"),
    ], "details": {"batch": batch, "model": label, "wall_s": round(wall, 2), "steps_per_s": round(sps, 3),
                   "peak_rss_gib": _r(peak), "stats": stats}}


def bench_load(variant: str, quick: bool) -> dict[str, Any]:
    """Issue 10's load figures: collect with 64 environments batched, a 10^6-entry store."""
    from types import SimpleNamespace

    from benchmarks import bench_load as bl

    args = SimpleNamespace(envs=4 if quick else 64, steps=3 if quick else 15, max_new_tokens=48,
                           entries=10_000 if quick else 1_000_000, seed=0, tracemalloc=False)
    res = bl.child(variant, args)
    if variant == "store-load":
        shutil.rmtree(bl.store_dir(args.entries, args.seed), ignore_errors=True)
    what = {"collect-llm": f"collect, {args.envs} environments batched (tiny model)",
            "store-write": f"store write, {args.entries:,} entries", "store-load": f"store load + index + 20 queries, "
            f"{args.entries:,} entries"}[variant]
    return {"rows": [row(f"{what}: peak memory", res["peak_rss_gib"], "GiB", target="< 4 GiB",
                         met=res["within_target"], note=f"wall {res['wall_s']} s")], "details": res}


def bench_openai_serve(variant: str, quick: bool) -> dict[str, Any]:
    """Issue 21: requests/s and tokens/s at concurrency 1, 4, 16 through the ``openai`` backend
    against a local ``transformers serve`` (as it ships, and with ``--continuous-batching``),
    and the same requests through the in-process ``transformers`` backend (batch = concurrency).

    A random tiny GPT-2 (2 layers, 128 wide) and ~300-token prompts, greedy, 32 new tokens
    (EOS ends a few earlier); one torch thread for the server and for the in-process model."""
    import torch

    from pipeline.core.conf_schema import ModelConfig, SamplingConfig
    from pipeline.core.config import section
    from pipeline.llm.backends.openai import OpenAIBackend
    from pipeline.llm.backends.transformers import TransformersBackend
    from pipeline.llm.backends.serve import TransformersServe
    from pipeline.llm.tiny import CHAT_TEMPLATE, save_model_dir, tiny_gpt2, train_tokenizer

    torch.set_num_threads(1)
    n, new_tokens, levels = (8, 16, (1, 4)) if quick else (48, 32, (1, 4, 16))
    words = ("open close take put examine look go kitchen fridge drawer apple mug key cabinet table bedroom "
             "north south east west the a in on with and then").split()
    convs = [[{"role": "system", "content": "You are a household agent. " + " ".join(
                 words[(i * 7 + j * 3) % len(words)] for j in range(220))},
              {"role": "user", "content": f"Observation {i}: what next?"}] for i in range(n)]
    tok = train_tokenizer([m["content"] for c in convs for m in c], vocab_size=512, chat_template=CHAT_TEMPLATE)
    model_dir = save_model_dir(bench_dir() / "openai_serve_model", tiny_gpt2(tok, n_layer=2, n_embd=128, n_head=4,
                                                                              n_positions=1024), tok)
    sampling = section(SamplingConfig, dict(do_sample=False, temperature=1.0, top_p=1.0, top_k=0,
                                            max_new_tokens=new_tokens, seed=0, early_stop=False))
    seeds = list(range(n))

    def timed(gen_batch, c: int) -> tuple[float, int, list]:
        gen_batch(convs[:1], seeds[:1])  # warm-up (connection, first forward)
        t0 = time.perf_counter()
        gens = gen_batch(convs, seeds)
        wall = time.perf_counter() - t0
        assert all(g.error is None for g in gens), [g.error for g in gens if g.error][:1]
        return wall, sum(g.generated_tokens for g in gens), [g.text for g in gens]

    figures: dict[tuple[str, int], dict] = {}
    local = TransformersBackend(section(ModelConfig, dict(name_or_path=str(model_dir), logprobs=False)), sampling)
    for c in levels:
        def batched(b, s, c=c):
            return [g for k in range(0, len(b), c) for g in local.generate(b[k:k + c], seeds=s[k:k + c])]

        wall, toks, texts = timed(batched, c)
        figures[("in-process", c)] = {"rps": n / wall, "tps": toks / wall, "texts": texts}
    for label, extra in (("serve", []), ("serve --continuous-batching", ["--continuous-batching"])):
        with TransformersServe(model_dir, extra_args=extra) as server:
            for c in levels:
                cfg = section(ModelConfig, dict(backend="openai", base_url=server.url, api_model=server.model,
                                                max_concurrency=c, timeout_s=600.0, max_retries=0, logprobs=False,
                                                api_key_env="BENCH_NO_KEY"))
                with OpenAIBackend(cfg, sampling) as backend:
                    wall, toks, texts = timed(lambda b, s: backend.generate(b, seeds=s), c)
                figures[(label, c)] = {"rps": n / wall, "tps": toks / wall, "texts": texts}
    rows = []
    for label in ("in-process", "serve", "serve --continuous-batching"):
        name = "transformers backend (in process, batch = c)" if label == "in-process" else \
            f"openai backend -> transformers {label}"
        for c in levels:
            f, base = figures[(label, c)], figures[("in-process", c)]
            vs = None if label == "in-process" else f"in process, c={c}"
            same = f["texts"] == base["texts"]
            rows.append(row(f"{name}, c={c}", _r(f["rps"], 2), "requests/s", ratio=_ratio(f["rps"], base["rps"])
                            if vs else None, vs=vs, note=None if not vs else f"same texts as in process: {same}"))
            rows.append(row(f"{name}, c={c}", _r(f["tps"], 1), "tokens/s", ratio=_ratio(f["tps"], base["tps"])
                            if vs else None, vs=vs))
    details = {f"{k[0]} c={k[1]}": {"rps": _r(v["rps"]), "tps": _r(v["tps"], 1)} for k, v in figures.items()}
    return {"rows": rows, "details": {"requests": n, "max_new_tokens": new_tokens, "figures": details}}


# ----------------------------------------------------------------------------- driver

# name -> (function, variants (full), variants (quick), what it measures). Order = run order:
# the pipeline first, so collect_memory finds the default model it trained.
# Each variant of the numerics benchmark: a NumericsConfig (pinned in its own process).
NUMERICS_VARIANTS = {
    "native": {"cpu_capability": "native", "mkl_cbwr": "native", "threads": 1, "deterministic": True},
    "pinned": {"cpu_capability": "avx2", "mkl_cbwr": "COMPATIBLE", "threads": 1, "deterministic": True},
    "any-x86": {"cpu_capability": "default", "mkl_cbwr": "COMPATIBLE", "threads": 1, "deterministic": True},
}


def bench_numerics(variant: str, quick: bool) -> dict[str, Any]:
    """What pinning the numerics costs (issue 19): the default policy's shapes, one process per setting.

    ``native``: the CPU's own kernels and MKL branch (reproducible on this machine only);
    ``pinned``: the default ``numerics`` (ATen AVX2, MKL COMPATIBLE: same bytes on any
    x86-64 CPU with AVX2); ``any-x86``: ATen's portable kernels too. All on 1 thread.
    """
    from pipeline.core.numerics import pin

    running = pin(NUMERICS_VARIANTS[variant])  # before torch loads (this process has not imported it)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.core.conf_schema import PolicyConfig

    pc = PolicyConfig()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=pc.vocab_size, hidden_size=pc.hidden_size, intermediate_size=pc.intermediate_size,
        num_hidden_layers=pc.n_layer, num_attention_heads=pc.n_head, num_key_value_heads=pc.n_head,
        max_position_embeddings=pc.max_positions, tie_word_embeddings=True))
    g = torch.Generator().manual_seed(1)
    steps, seq, reps = (5, 256, 2) if quick else (30, 512, 5)
    x = torch.randint(0, pc.vocab_size, (1, seq), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train() -> None:
        for _ in range(steps):
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad()
            loss.backward()
            opt.step()

    prompt = torch.randint(0, pc.vocab_size, (1, 1024), generator=g)
    batch = torch.randint(0, pc.vocab_size, (8, 256), generator=g)

    def encode() -> None:
        with torch.no_grad():
            model(input_ids=prompt)

    def generate() -> None:
        with torch.no_grad():
            model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=32, do_sample=False,
                           min_new_tokens=32, pad_token_id=0)

    def best(fn: Callable[[], None]) -> float:
        fn()  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    model.train()
    t_train = best(train)
    model.eval()
    t_enc, t_gen = best(encode), best(generate)
    label = f"numerics {variant}"
    base = None if variant == "native" else "numerics native"
    note = (f"ATen {running['cpu_capability']}, MKL_CBWR {running['mkl_cbwr']}, {running['threads']} thread; "
            f"default policy shapes ({pc.hidden_size}x{pc.n_layer}, vocab {pc.vocab_size})")
    return {"rows": [
        row(f"{label}: policy training", _r(steps * seq / t_train, 0), "tokens/s",
            vs=base and f"{base}: policy training", note=f"{note}; {steps} AdamW steps of {seq} tokens"),
        row(f"{label}: prompt encoding", _r(prompt.shape[1] / t_enc, 0), "tokens/s",
            vs=base and f"{base}: prompt encoding", note="one 1,024-token forward pass"),
        row(f"{label}: greedy generation", _r(batch.shape[0] * 32 / t_gen, 0), "tokens/s",
            vs=base and f"{base}: greedy generation", note="batch 8, 256-token prompts, 32 new tokens"),
    ], "details": {"numerics": running, "seconds": {"train": t_train, "encode": t_enc, "generate": t_gen}}}


def bench_constrain(variant: str, quick: bool) -> dict[str, Any]:
    """Issue 17: the admissible-action mask per turn, the project's token table vs llguidance."""
    from benchmarks import bench_constrain as bc

    res = bc.run(quick)
    ours = res["table_ms_per_turn"]
    theirs = res.get("llguidance_ms_per_turn")
    note = f"{res['turns']} turns of 10-60 admissible actions, {res['steps_per_turn']:.1f} tokens each, vocab {res['vocab']}"
    rows = [row("constrained action mask: token table", _r(ours, 3), "ms/turn", note=note)]
    if theirs is not None:
        rows.append(row("constrained action mask: llguidance (Lark literals, compiled per turn)", _r(theirs, 3),
                        "ms/turn", ratio=_r(theirs / ours), vs="constrained action mask: token table",
                        note=f"{res['llguidance_version']}; compile {res['llguidance_compile_ms_per_turn']:.2f} ms/turn"))
    else:
        rows.append(row("constrained action mask: llguidance", None, "ms/turn", note=res["llguidance"]))
    return {"rows": rows, "details": res}


def bench_engines(variant: str, quick: bool) -> dict[str, Any]:
    """Issue 18: the machine's matmul limit, MFU of prompt encoding, and inference engines on a
    collect-like multi-turn workload (naive generate, the backend with its prompt cache off / on,
    transformers' continuous batching), one process per variant."""
    from benchmarks import bench_engines as be

    res = be.run(variant, quick)
    return {"rows": [row(**f) for f in res["figures"]], "details": res["details"]}


def bench_scaling(variant: str, quick: bool) -> dict[str, Any]:
    """Issue 46: the parallel stages at 1, 2, ... workers; the default run projected (benchmarks/bench_scaling.py)."""
    from benchmarks.bench_scaling import bench_scaling as run

    return run(variant, quick)


def bench_rollouts(variant: str, quick: bool) -> dict[str, Any]:
    """Issue 46: the policy's whole episodes (DAgger, the episode probe) in 1 and 2 worker processes."""
    from benchmarks.bench_rollouts import run

    r = run(houses=14, batch=7) if quick else run(houses=56, batch=14)
    one, two = r["turns_per_s"]["1"], r["turns_per_s"]["2"]
    note = (f"{r['episodes']} DAgger episodes of generated houses in {r['jobs']} batches of {r['batch']}, "
            f"{r['turns']} turns, expert labels; default policy shapes, untrained, {r['model']['max_new_tokens']} "
            f"new tokens a turn; the 2-worker time includes the workers' start-up")
    return {"rows": [
        row("policy rollouts, 1 worker (in process)", one, "turns/s", note=note),
        row("policy rollouts, 2 workers", two, "turns/s", ratio=_ratio(two, one), vs="policy rollouts, 1 worker",
            note=f"Amdahl's parallel fraction {r['parallel_fraction']['2']}"),
        row("policy rollouts: 1 and 2 workers give the same rollouts and labels", None, "", target="identical",
            met=bool(r["identical"])),
    ], "details": r}


BENCHMARKS: dict[str, tuple[Callable[[str, bool], dict], list[str], list[str], str]] = {
    "pipeline": (bench_pipeline, [""], [""], "cold default `dvc repro` per stage; warm no-op `dvc repro`, `dvc status`"),
    "startup": (bench_startup, [""], [""], "per-process costs: imports, load_params before/after its stamp"),
    "parquet": (bench_parquet, [""], [""], "write/read 10^6 turns canonically; dict rows -> Arrow"),
    "store": (bench_store, [""], [""], "store stage core on 10^5 synthetic episodes"),
    "retrieval": (bench_retrieval, [""], [""], "top-3 retrieval at 10^3 / 10^5 / 10^6 vs a per-entry loop"),
    "render": (bench_render, [""], [""], "system prompts per second"),
    "worlds": (bench_worlds, [""], [""], "a generated house compiled vs on TextWorld's logic engine"),
    "scienceworld": (bench_scienceworld, [""], [""], "ScienceWorld: engine, adapter and a rule agent's collection "
                     "steps/s (needs `make scienceworld`)"),
    "collect_llm": (bench_collect_llm, [""], [""], "batched vs sequential generation; early stop"),
    "collect_memory": (bench_collect_memory, ["1", "8", "32", "threads"], ["1", "4", "threads"],
                       "collect peak memory and steps/s at batch 1 / 8 / 32 with the default model; "
                       "torch threads before / after"),
    "numerics": (bench_numerics, list(NUMERICS_VARIANTS), list(NUMERICS_VARIANTS),
                 "issue 19: the speed cost of the pinned numerics (training, encoding, generation)"),
    "load": (bench_load, ["collect-llm", "store-write", "store-load"], ["collect-llm", "store-write", "store-load"],
             "issue 10: peak memory of 64 batched environments and a 10^6-entry store"),
    "constrain": (bench_constrain, [""], [""],
                  "issue 17: the admissible-action token mask per turn: the project's table vs llguidance"),
    "openai_serve": (bench_openai_serve, [""], [""],
                     "issue 21: requests/s, tokens/s at concurrency 1/4/16: openai backend -> transformers serve "
                     "vs in process"),
    "scaling": (bench_scaling, [""], [""],
                "issue 46: each parallel stage of experiment=tiny at workers=1, 2, ... (speed-up, Amdahl's parallel "
                "fraction, outputs byte-identical); the default run's cold time projected to 2, 8, 16 cores"),
    "rollouts": (bench_rollouts, [""], [""],
                 "issue 46: the policy's DAgger rollouts at 1 and 2 worker processes (turns/s, speed-up, identical)"),
    "engines": (bench_engines, ["limit", "prefill-1", "prefill-8", "prefill-32", "engines", "cache"],
                ["limit", "prefill-1", "prefill-2", "engines", "cache"],
                "issue 18: matmul limit, MFU of prompt encoding at batch 1/8/32, multi-turn engines (naive, "
                "backend prompt cache off/on, continuous batching); issue 34: prompt cache off vs on by batch size, "
                "prompt shape and decoding; --device cuda runs them on a GPU"),
}


def run_child(name: str, variant: str, quick: bool) -> int:
    fn = BENCHMARKS[name][0]
    t0 = time.perf_counter()
    res = fn(variant, quick)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["peak_rss_gib"] = _r(peak_rss_gib())
    print(RESULT_TAG + json.dumps(res, default=str), flush=True)
    return 0


# Benchmarks that play with the pipeline benchmark's products (its trained default model)
# run inside its scratch copy, with the code and params.yaml of that copy.
IN_SCRATCH = ("collect_memory",)


def run_parent_one(name: str, variant: str, quick: bool, timeout: float, log) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks", "--child", name, "--variant", variant] + (["--quick"] if quick else [])
    repo = bench_dir() / "repo"
    cwd = repo if name in IN_SCRATCH and (repo / "benchmarks" / "__main__.py").exists() else ROOT
    load_before = load_average()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ})
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err, code = f"timed out after {timeout:.0f} s", -1
    wall = time.perf_counter() - t0
    if log is not None:
        log.write(f"===== {name} {variant} (exit {code})\n{out}\n{err}\n")
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(RESULT_TAG)), None)
    base = {"variant": variant, "wall_s": round(wall, 1), "load_before": load_before, "load_after": load_average()}
    if code != 0 or line is None:
        tail = (err or out).strip().splitlines()[-8:]
        return {**base, "status": "failed", "error": f"exit {code}: " + " | ".join(tail)[-800:], "rows": []}
    return {**base, "status": "ok", **json.loads(line[len(RESULT_TAG):])}


def cross_variant_ratios(results: dict[str, list[dict]]) -> None:
    """A row whose ``vs`` names a figure of another process of the same benchmark gets its ratio here."""
    for runs in results.values():
        values = {r["figure"]: r["value"] for run in runs for r in run.get("rows", [])}
        for run in runs:
            for r in run.get("rows", []):
                if r["ratio"] is None and r["vs"] in values:
                    r["ratio"] = _ratio(r["value"], values[r["vs"]])


def fmt_value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,d}"
    return str(v)


def print_table(meta: dict[str, Any], results: dict[str, list[dict]], out=None) -> None:
    out = out or sys.stdout
    print(f"benchmarks {meta['date']} on {meta['host']}: {meta['cores']} cores, {meta['cpu_model']}, "
          f"{meta['memory_gib']} GiB; python {meta['python']}, torch {meta['packages'].get('torch')}; "
          f"git {meta.get('git')}; load average at start {meta['load_average']}"
          + (f"; device {meta['device'].get('name') or meta['device']['device']}"
             + (f" ({meta['device']['problem']})" if meta["device"].get("problem") else "")
             if meta.get("device", {}).get("device", "cpu") != "cpu" else "")
          + (" [QUICK smoke run: not the real figures]" if meta.get("quick") else ""), file=out)
    head = ("figure", "value", "unit", "ratio", "vs", "target", "met")
    table = []
    for name, runs in results.items():
        for run in runs:
            if run["status"] != "ok":
                table.append((f"{name} {run['variant']}".strip() + ": FAILED", "-", "", "", run["error"][:90], "", ""))
                continue
            for r in run["rows"]:
                met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
                table.append((r["figure"], fmt_value(r["value"]), r["unit"],
                              "" if r["ratio"] is None else f"{r['ratio']:,.2f}x", r["vs"] or "", r["target"] or "",
                              met))
    widths = [max(len(str(x[i])) for x in [head, *table]) for i in range(len(head))]
    widths[4] = min(widths[4], 40)
    line = " | ".join(h.ljust(w) for h, w in zip(head, widths))
    print(line, file=out)
    print("-" * len(line), file=out)
    for t in table:
        cells = [str(c)[:w].rjust(w) if i in (1, 3) else str(c)[:w].ljust(w) for i, (c, w) in enumerate(zip(t, widths))]
        print(" | ".join(cells), file=out)
    for name, runs in results.items():
        for run in runs:
            print(f"  {name} {run['variant']}".rstrip() + f": {run['wall_s']} s, load {run['load_before']} -> "
                  f"{run['load_after']}" + (f", peak {run.get('peak_rss_gib')} GiB" if run.get("peak_rss_gib") else ""),
                  file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), metavar="NAME",
                        help="run only these benchmarks: " + ", ".join(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="smoke version: small sizes, seconds to minutes each")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--out", type=Path, help=f"results file (default {RESULTS.relative_to(ROOT)}; "
                        "a --quick run writes one only when given)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per benchmark process")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (pipeline copy, games)")
    parser.add_argument("--scratch", type=Path, help="reuse this kept scratch folder (e.g. the pipeline "
                        "benchmark's copy with its trained model, for --only collect_memory); implies --keep")
    parser.add_argument("--log", type=Path, help="write every child's output to this file")
    parser.add_argument("--set-default", action="append", default=[], metavar="GROUP=OPTION",
                        help="pipeline benchmark: change a defaults-list entry of the scratch copy's "
                             "conf/config.yaml, e.g. agent=llm (repeatable)")
    parser.add_argument("--variants", nargs="+", metavar="VARIANT",
                        help="run only these variants of the selected benchmarks (e.g. --only engines --variants "
                             "cache); results.json keeps the other variants' figures")
    parser.add_argument("--device", default="cpu",
                        help="torch device of the engines benchmark's models (cpu | cuda | cuda:N; the other "
                             "benchmarks run on the CPU); without CUDA its rows say so and nothing is measured")
    parser.add_argument("--counts", help="scaling: worker counts, e.g. 1,2 (default 1, 2, 4, ... up to the cores "
                        "this process may use)")
    parser.add_argument("--stages", nargs="+", metavar="STAGE", help="scaling: only these stages (games demos "
                        "policy collect evaluate evaluate_reader curve)")
    parser.add_argument("--experiment", choices=["tiny", "slice"], default="tiny",
                        help="scaling: measure on experiment=tiny (minutes; its fractions are a floor) or on a "
                        "slice of the default config (about 45 minutes on 2 cores; benchmarks/bench_scaling.py)")
    parser.add_argument("--skip-run", action="store_true", help="scaling: measure nothing; project from metrics/ "
                        "and the parallel fractions of the last scaling run in results.json (or --previous)")
    parser.add_argument("--previous", type=Path, help="scaling --skip-run: the results JSON to read the fractions from")
    parser.add_argument("--install-s", type=float, default=150.0, help="scaling: install time added to the "
                        "projected cold run (default 150 s)")
    parser.add_argument("--other-s", type=float, default=300.0, help="scaling: serial remainder of the default "
                        "run beyond the parallel stages' recorded times (DVC, start-up, small stages; default 300 s)")
    parser.add_argument("--child", choices=list(BENCHMARKS), help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args.child, args.variant, args.quick)
    if args.list:
        for name, (_, full, quick, what) in BENCHMARKS.items():
            print(f"{name:15s} {what}" + (f"  [variants: {', '.join(full)}]" if full != [""] else ""))
        return 0

    names = args.only or list(BENCHMARKS)
    scratch = args.scratch.resolve() if args.scratch else Path(tempfile.mkdtemp(prefix="pipeline_bench_"))
    args.keep = args.keep or bool(args.scratch)
    os.environ[BENCH_DIR_ENV] = str(scratch)
    os.environ[DEFAULTS_ENV] = ",".join(args.set_default)
    os.environ[DEVICE_ENV] = args.device
    os.environ["PIPELINE_BENCH_SCALING"] = json.dumps({
        "counts": [int(c) for c in args.counts.split(",")] if args.counts else None, "stages": args.stages,
        "experiment": args.experiment, "skip_run": args.skip_run, "previous": str(args.previous) if args.previous else None,
        "install_s": args.install_s, "other_s": args.other_s})
    meta = machine_info()
    meta["quick"] = args.quick
    meta["device"] = device_info(args.device)
    if meta["device"].get("problem"):
        print(f"[benchmarks] --device {args.device}: {meta['device']['problem']}; the engines benchmark's rows "
              "will say skipped, the other benchmarks run on the CPU", file=sys.stderr, flush=True)
    meta["set_default"] = args.set_default
    results: dict[str, list[dict]] = {}
    log = open(args.log, "w", encoding="utf-8") if args.log else None
    try:
        for name in names:
            variants = BENCHMARKS[name][2] if args.quick else BENCHMARKS[name][1]
            if args.variants:
                variants = [v for v in variants if v in args.variants]
            for variant in variants:
                print(f"[benchmarks] {name} {variant}".rstrip() + f" (load {load_average()}) ...", file=sys.stderr,
                      flush=True)
                res = run_parent_one(name, variant, args.quick, args.timeout, log)
                print(f"[benchmarks]   {res['status']} in {res['wall_s']} s"
                      + (f": {res['error']}" if res["status"] != "ok" else ""), file=sys.stderr, flush=True)
                results.setdefault(name, []).append(res)
    finally:
        if log:
            log.close()
        if args.keep:
            print(f"[benchmarks] scratch kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    meta["load_average_end"] = load_average()
    cross_variant_ratios(results)
    print_table(meta, results)
    mismatched = []
    for run in results.get("scaling", []):
        if run["status"] == "ok":
            from benchmarks.bench_scaling import print_projection

            print("\nscaling: the default run projected (stage times in s)")
            print_projection(run["details"]["projection"], out=sys.stdout)
            mismatched += run["details"].get("mismatches") or []
    for m in mismatched:
        print(f"[benchmarks] SCALING: OUTPUTS DIFFER ACROSS WORKER COUNTS: {m}", file=sys.stderr)

    out = args.out or (None if args.quick else RESULTS)
    if out is not None:
        doc = {"meta": meta, "benchmarks": {}}
        if args.only and out.exists():  # update just these benchmarks, keep the others' figures
            try:
                doc["benchmarks"] = json.loads(out.read_text(encoding="utf-8")).get("benchmarks", {})
            except (OSError, json.JSONDecodeError):
                pass
        for name, runs in results.items():
            if args.variants and name in doc["benchmarks"]:  # replace only the variants that ran
                ran = {r["variant"] for r in runs}
                old = doc["benchmarks"][name]
                kept = [{"meta": old.get("meta"), **r} for r in old.get("runs", []) if r.get("variant") not in ran]
                runs = kept + runs  # a kept run carries the meta (date, machine, device) of the run that made it
            doc["benchmarks"][name] = {"meta": meta, "runs": runs}
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, out)
        print(f"wrote {out}", file=sys.stderr)
    failed = [f"{n} {r['variant']}".strip() for n, runs in results.items() for r in runs if r["status"] != "ok"]
    return 1 if failed or mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
