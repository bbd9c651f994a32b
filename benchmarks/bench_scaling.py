"""How the parallel stages scale with ``workers`` (issue 46, part 3), and what that makes of
the default run's cold time on 2, 8 and 16 cores.

    python -m benchmarks --only scaling                        # measure (tiny DAG) + project
    python -m benchmarks --only scaling --experiment slice     # measure on a slice of the default (~45 min on 2 cores)
    python -m benchmarks --only scaling --counts 1,2 --stages games collect
    python -m benchmarks --only scaling --skip-run             # project only: metrics/ + results.json
    python -m benchmarks --only scaling --install-s 150

Measurement: a scratch copy of the project (``benchmarks.common.make_scratch_repo``) composed
with ``experiment=tiny`` runs the whole experiment DAG once (the inputs; the model is the
committed checkpoint, which the experiment never trains); then each parallel stage
(``games``, ``collect``, ``evaluate@C2``, ``evaluate_reader@C2``, ``curve``) is rerun with ``dvc repro -s -f --no-run-cache <stage>`` after composing
``experiment=tiny workers=N``, for every N in the counts (default 1, 2 and each doubling up to
``available_cores()``). A stage's time is the span from DVC's ``Running stage`` line to the
end of ``dvc repro`` (the stage's process, imports included, and DVC's hashing and caching of
its outputs; DVC's own start-up left out). After each run the md5s ``dvc.lock`` records for
the stage's cached outputs are compared across counts: any difference is a determinism bug,
listed in the table and the JSON, and the benchmarks exit 1.

Per stage: wall at each count, speed-up S(n) = t(1)/t(n) and the parallel fraction by Amdahl's
law, p = (1 - 1/S) / (1 - 1/n) (from the largest count; clamped to [0, 1] for the projection).
``experiment=tiny`` is too small to show most stages' scaling (its eval split is one batch, so
``evaluate`` starts no worker; a spawned worker's imports outweigh its work), so its fractions
are a floor. ``--experiment slice`` measures instead on :data:`SLICE_OVERRIDES`: the default
config with two thirds of its scenes (``evaluate`` in two batches of the default's size),
sized so that every parallel stage has at least two parts of real work.
On a shared machine wall times measure the neighbours too (a warning row says so when the
one-worker runs got under 0.8 of a core), so a second fraction comes from where the CPU went:
an ``atexit`` probe (a ``sitecustomize`` on the stage's ``PYTHONPATH``) records the stage
process's own CPU and its waited-for worker processes'; p_cpu = workers / (stage + workers) at
the largest count (0 when the stage started no worker process; threads are not seen).

Projection: the committed default run's per-stage wall times (``metrics/*.json``,
``metrics/eval*/*.json``), each at the worker count it ran with (:data:`DEFAULT_RUN_WORKERS`:
recorded in the metrics where they say, else the counts of that run's ``params.yaml``), are
rescaled by Amdahl to 2, 8 and 16 cores with each stage's measured p (or the documented
assumption of :data:`ASSUMED_FRACTION` where a stage was not measured), plus the serial
remainder (``--other-s``: DVC, process start-up, the small serial stages) and the install
(``--install-s``). A stage never uses more processes than its work has parts
(:func:`default_run_parts`: ``evaluate``'s 56-task batches, ``curve``'s points, one for the
online ``collect`` loop), so a
stage's projected speed-up stops at its part count. The overall parallel fraction is that of
the cold run's one-core CPU time.
The arithmetic is the small pure functions below (tested in ``tests/test_bench_scaling.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OPTIONS_ENV = "PIPELINE_BENCH_SCALING"  # the parent's --counts/--stages/--skip-run/... as JSON, for the child

# The measured stages: short name -> the DVC target in the scratch project.
STAGES: dict[str, str] = {
    "games": "games",
    "collect": "collect",
    "evaluate": "evaluate@C2",
    "evaluate_reader": "evaluate_reader@C2",
    "curve": "curve",
}
QUICK_STAGES = ("games", "collect")

# A slice of the default config for measuring (``--experiment slice``): the default's world and
# model (the committed checkpoint), 8 of its 12 scenes with 14 eval quests each (112 eval tasks: two
# batches of the default's 56, so each worker's share of ``evaluate`` is a whole default batch, as
# in the default run; with smaller batches a worker's start-up, ~10 s of imports and model load,
# hides the scaling).
SLICE_OVERRIDES: tuple[str, ...] = (
    "env.num_scenes=8", "env.heldout_scenes=2", "env.eval_quests_per_scene=14",
)
# What each --experiment composes (before ``workers=N``).
EXPERIMENTS: dict[str, tuple[str, ...]] = {"tiny": ("experiment=tiny",), "slice": SLICE_OVERRIDES}

# The worker count each stage of a default run ran with where its metrics do not say: games'
# compile_workers is in metrics/games.json; evaluate / evaluate_reader play in the run's 2 workers;
# collect (the online loop) and curve in one process (the record of the run before `workers`).
DEFAULT_RUN_WORKERS: dict[str, int] = {"games": 2, "collect": 1, "evaluate": 2, "evaluate_reader": 2, "curve": 1}

# Where a stage could not be measured: a documented guess of its parallel fraction (work cut
# into a partition fixed by config, each part independent; the remainder is start-up,
# reading inputs and merging in order). Stated in the output whenever used.
ASSUMED_FRACTION: dict[str, float] = {"games": 0.95, "collect": 0.8, "evaluate": 0.9, "evaluate_reader": 0.7,
                                      "curve": 0.9}

# DVC start-up and hashing, each stage's process start-up and imports, and the small serial
# stages (check_params, convert, ground, merge, store, render, compare): the default run's
# 82 min cold (531c330's message) less the stages' recorded wall times (~77 min), rounded.
DEFAULT_OTHER_S = 300.0
DEFAULT_INSTALL_S = 150.0
PROJECT_CORES = (2, 8, 16)


# ----------------------------------------------------------------------------- arithmetic (pure)


def parallel_fraction(speedup: float, n: int) -> float:
    """Amdahl's parallel fraction from the speed-up ``speedup`` = t(1)/t(n) on ``n`` workers:
    p = (1 - 1/S) / (1 - 1/n). Not clamped (noise can put it outside [0, 1])."""
    if n <= 1:
        raise ValueError(f"a parallel fraction needs n > 1 workers, not {n}")
    if speedup <= 0:
        raise ValueError(f"speed-up must be > 0, not {speedup}")
    return (1.0 - 1.0 / speedup) / (1.0 - 1.0 / n)


def clamp_fraction(p: float) -> float:
    return min(1.0, max(0.0, p))


def amdahl_factor(p: float, n: float) -> float:
    """t(n) / t(1) = (1 - p) + p / n."""
    return (1.0 - p) + p / n


def rescale_time(t: float, p: float, n_from: float, n_to: float, parts: int | None = None) -> float:
    """A time measured on ``n_from`` workers, moved to ``n_to`` by Amdahl with fraction ``p``; a
    stage whose work has ``parts`` independent parts uses at most that many workers."""
    if parts is not None:
        if parts < 1:
            raise ValueError(f"parts must be >= 1, not {parts}")
        n_from, n_to = min(n_from, parts), min(n_to, parts)
    return t * amdahl_factor(p, n_to) / amdahl_factor(p, n_from)


def _unpack(stage: tuple) -> tuple[float, int, float, int | None]:
    """``(wall_s, workers, p)`` or ``(wall_s, workers, p, parts)``."""
    return (*stage, None) if len(stage) == 3 else tuple(stage)  # type: ignore[return-value]


def project_run(stages: Mapping[str, tuple], cores: int, *, serial_s: float = 0.0) -> dict[str, Any]:
    """The run's time on ``cores``: ``stages`` is ``{name: (wall_s, workers it ran with, p[, parts])}``
    (stages run one after another, as ``dvc repro`` runs them; ``parts`` caps the workers a
    stage can use); ``serial_s`` (install, DVC, serial stages) is added unchanged. Returns
    ``{"total_s", "stages": {name: s}}``."""
    per = {}
    for name, stage in stages.items():
        t, n0, p, parts = _unpack(stage)
        per[name] = rescale_time(t, p, n0, cores, parts)
    return {"total_s": serial_s + sum(per.values()), "stages": per}


def overall_parallel_fraction(stages: Mapping[str, tuple], *, serial_s: float = 0.0) -> float:
    """The parallel share of the run's one-core time (its CPU time): sum(p_i t1_i) / (sum t1_i + serial),
    t1_i being stage i's time moved to one worker; a stage of one part has nothing parallel."""
    t1, par = {}, 0.0
    for name, stage in stages.items():
        t, n0, p, parts = _unpack(stage)
        t1[name] = rescale_time(t, p, n0, 1, parts)
        par += (0.0 if parts == 1 else p) * t1[name]
    total = serial_s + sum(t1.values())
    return par / total if total > 0 else 0.0


def stage_scaling(times: Mapping[int, float]) -> dict[str, Any]:
    """``{count: wall_s}`` -> speed-ups against the one-worker time and the parallel fraction
    (from the largest count; None without a one-worker and a larger count)."""
    base = times.get(1)
    speedup = {n: base / t for n, t in times.items() if base and t > 0}
    counts = sorted(n for n in speedup if n > 1)
    p = parallel_fraction(speedup[counts[-1]], counts[-1]) if counts else None
    return {"speedup": speedup, "p": p, "p_from": counts[-1] if counts else None}


def default_counts(cores: int) -> list[int]:
    """1, 2, then each doubling up to ``cores`` (and ``cores`` itself)."""
    out, n = [1], 2
    while n <= max(2, cores):
        out.append(n)
        n *= 2
    if cores > 2 and cores not in out:
        out.append(cores)
    return out


# ----------------------------------------------------------------------------- the default run's times


def default_run_times(root: Path) -> dict[str, dict[str, Any]]:
    """``{stage: {"wall_s", "workers", "source"}}`` from the committed default run's metrics."""
    m = root / "metrics"

    def load(p: Path) -> dict:
        return json.loads(p.read_text(encoding="utf-8"))

    out: dict[str, dict[str, Any]] = {}
    if (m / "games.json").exists():
        g = load(m / "games.json")
        out["games"] = {"wall_s": float(g["compile_wall_s"]) + float(g.get("plan_wall_s", 0.0)),
                        "workers": int(g.get("compile_workers") or DEFAULT_RUN_WORKERS["games"]),
                        "source": "metrics/games.json compile_wall_s + plan_wall_s, compile_workers"}
    for name in ("collect", "curve"):
        if (m / f"{name}.json").exists():
            d = load(m / f"{name}.json")
            out[name] = {"wall_s": float(d["wall_time_s"]),
                         "workers": int(d.get("workers") or DEFAULT_RUN_WORKERS[name]),
                         "source": f"metrics/{name}.json wall_time_s"}
    for name, folder in (("evaluate", "eval"), ("evaluate_reader", "eval_reader")):
        files = sorted((m / folder).glob("*.json"))
        if files:
            docs = [load(f) for f in files]
            out[name] = {"wall_s": sum(float(d["wall_time_s"]) for d in docs),
                         "workers": int(docs[0].get("workers") or DEFAULT_RUN_WORKERS[name]),
                         "source": f"metrics/{folder}/*.json wall_time_s, {len(files)} conditions (agent.workers=2)"}
    return out


def default_run_parts(root: Path) -> dict[str, dict[str, Any]]:
    """``{stage: {"parts", "why"}}``: how many workers each stage of the default run could use
    at most, from its metrics and ``params.yaml``, by the stages' own rules asked with an
    unbounded ``workers`` (the batches of :func:`pipeline.core.parallel.partition` that
    ``worker_count`` counts, one process per curve point). A stage missing here is taken as
    having parts to spare."""
    import yaml

    from pipeline.core.parallel import partition

    m = root / "metrics"

    def load(path: Path) -> dict:
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}

    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) if (root / "params.yaml").exists() else {}
    agent = params.get("agent") or {}
    size = int(agent.get("batch_size", 56)) if agent.get("batched", True) else 1
    out: dict[str, dict[str, Any]] = {}
    games = load(m / "games.json")
    if games.get("num_games"):
        out["games"] = {"parts": int(games["num_games"]), "why": "one game per part"}
    if (params.get("grounding") or {}).get("online", False):
        out["collect"] = {"parts": 1, "why": "the online loop: each episode's feedback grounds the next"}
    for name, folder in (("evaluate", "eval"), ("evaluate_reader", "eval_reader")):
        tasks = [load(f).get("num_tasks") for f in sorted((m / folder).glob("*.json"))]
        if tasks and all(tasks):
            out[name] = {"parts": len(partition(list(range(max(tasks))), size)), "why": f"batches of agent.batch_size={size}"}
    points = load(m / "curve.json").get("points")
    if points:
        out["curve"] = {"parts": len(points), "why": "one curve point per part"}
    return out


def projection(root: Path, fractions: Mapping[str, float], *, install_s: float, other_s: float,
               cores: Iterable[int] = PROJECT_CORES) -> dict[str, Any]:
    """The default run's cold time on each of ``cores``, from its metrics and the fractions
    (measured, else :data:`ASSUMED_FRACTION`), each stage capped at its part count."""
    runs = default_run_times(root)
    parts = default_run_parts(root)
    stages, used = {}, {}
    for name, r in runs.items():
        measured = fractions.get(name)
        p = clamp_fraction(measured) if measured is not None else ASSUMED_FRACTION[name]
        cap = (parts.get(name) or {}).get("parts")
        used[name] = {"p": round(p, 3), "from": "measured" if measured is not None else "assumed", "parts": cap,
                      **{k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()}}
        stages[name] = (r["wall_s"], r["workers"], p, cap)
    serial = install_s + other_s
    proj = {c: project_run(stages, c, serial_s=serial) for c in cores}
    as_recorded = serial + sum(st[0] for st in stages.values())
    return {"stages": used, "install_s": install_s, "other_s": other_s, "as_recorded_s": round(as_recorded, 1),
            "cores": {str(c): {"total_s": round(v["total_s"], 1),
                               "stages_s": {k: round(s, 1) for k, s in v["stages"].items()}} for c, v in proj.items()},
            "parallel_fraction": round(overall_parallel_fraction(stages, serial_s=serial), 4),
            "parallel_fraction_dag": round(overall_parallel_fraction(stages, serial_s=other_s), 4)}


# ----------------------------------------------------------------------------- measuring


# Written into a folder put on the stage processes' PYTHONPATH: at exit, a ``pipeline.stages.*``
# main process (not a spawned worker) appends its own CPU time and its waited-for children's.
PROBE = """import atexit, json, os, resource, sys


def _probe():
    import multiprocessing

    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None) or ""
    if not name.startswith("pipeline.stages.") or multiprocessing.parent_process() is not None:
        return
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.environ["PIPELINE_SCALING_RUSAGE"], "a") as f:
        f.write(json.dumps({"module": name, "self_cpu_s": s.ru_utime + s.ru_stime,
                            "children_cpu_s": c.ru_utime + c.ru_stime}) + "\\n")


if os.environ.get("PIPELINE_SCALING_RUSAGE"):
    atexit.register(_probe)
"""


def cpu_split_fraction(self_cpu_s: float, children_cpu_s: float) -> float | None:
    """The parallel fraction from where the CPU time went (robust to a busy machine, unlike
    wall time): the worker processes' share, children / (self + children). An upper bound:
    the workers' own start-up (imports) counts as parallel work."""
    total = self_cpu_s + children_cpu_s
    return children_cpu_s / total if total > 0 else None


def _hashes(repo: Path, target: str, keep: set[str]) -> dict[str, str]:
    """The md5s ``dvc.lock`` records for ``target``'s cached outputs (``keep``: not the
    ``cache: false`` metrics, which carry wall times)."""
    import yaml

    lock = yaml.safe_load((repo / "dvc.lock").read_text()) or {}
    name, _, item = target.partition("@")
    entry = (lock.get("stages") or {}).get(name) or {}
    if item:
        entry = entry.get(item) or {}  # older DVC layouts nest foreach items; newer use the full name
    entry = entry or (lock.get("stages") or {}).get(target) or {}
    return {o["path"]: str(o.get("md5")) for o in entry.get("outs") or [] if o["path"] in keep}


def _run(cmd: list[str], repo: Path, env: dict[str, str], timeout: float = 3000, on_line=None) -> dict[str, Any]:
    from benchmarks.common import run_timed

    res = run_timed(cmd, repo, env, timeout=timeout, on_line=on_line)
    if res["returncode"] != 0:
        raise RuntimeError(f"`{' '.join(cmd[1:])}` failed (exit {res['returncode']}) in {repo}:\n"
                           f"{res['output'][-3000:]}")
    return res


def prepare(repo: Path, overrides: Iterable[str] = EXPERIMENTS["tiny"], *, targets: Iterable[str] = ()) -> dict[str, Any]:
    """The scratch copy composed with ``overrides`` and the DAG run once (``targets`` only, when
    given, and what they need); reused when ``repo`` already holds an up-to-date run."""
    from benchmarks.common import make_scratch_repo, venv_env

    env = venv_env()
    if (repo / "dvc.lock").exists() and (repo / "data").is_dir():
        st = subprocess.run([sys.executable, "-m", "dvc", "status", "-q", *targets], cwd=repo, env=env,
                            capture_output=True)
        if st.returncode == 0:
            return {"path": str(repo), "reused": True}
    info = make_scratch_repo(repo)
    _run([sys.executable, "-m", "pipeline.core.config", "compose", *overrides], repo, env)
    res = _run([sys.executable, "-m", "dvc", "repro", *targets], repo, env)
    return {**info, "reused": False, "dag_s": round(res["wall_s"], 1), "dag_cpu_s": round(res["cpu_s"], 1)}


def measure(repo: Path, stages: list[str], counts: list[int], log=print,
            overrides: Iterable[str] = EXPERIMENTS["tiny"]) -> dict[str, Any]:
    """Each stage at each count: ``{stage: {"times": {n: s}, "total": {n: s}, "cpu": {n: s},
    "hashes": {n: {...}}}}`` and the mismatches."""
    from benchmarks.common import load_average, venv_env
    from pipeline.tools.reprocheck import cached_outputs

    overrides = list(overrides)
    env = venv_env()
    py = sys.executable
    keep = cached_outputs(repo)
    probe = repo.parent / "scaling_probe"
    probe.mkdir(exist_ok=True)
    (probe / "sitecustomize.py").write_text(PROBE)
    usage = probe / "rusage.jsonl"
    env = {**env, "PYTHONPATH": str(probe), "PIPELINE_SCALING_RUSAGE": str(usage)}
    out: dict[str, Any] = {}
    mismatches: list[str] = []
    for stage in stages:
        target = STAGES[stage]
        rec: dict[str, Any] = {"target": target, "times": {}, "total": {}, "cpu": {}, "load": {}, "hashes": {},
                               "self_cpu": {}, "children_cpu": {}}
        for n in counts:
            _run([py, "-m", "pipeline.core.config", "compose", *overrides, f"workers={n}"], repo, env)
            start: list[float] = []

            def on_line(t: float, line: str) -> None:
                if line.startswith("Running stage '") and not start:
                    start.append(t)

            usage.unlink(missing_ok=True)
            load = load_average()
            res = _run([py, "-m", "dvc", "repro", "-s", "-f", "--no-run-cache", target], repo, env, on_line=on_line)
            rec["load"][n] = [load[0] if load else None, load_average()[0] if load else None]
            span = res["wall_s"] - (start[0] if start else 0.0)
            rec["times"][n], rec["total"][n] = round(span, 2), round(res["wall_s"], 2)
            rec["cpu"][n] = round(res["cpu_s"], 1)
            rec["hashes"][n] = _hashes(repo, target, keep)
            probes = [json.loads(ln) for ln in usage.read_text().splitlines() if ln.strip()] if usage.exists() else []
            if probes:
                rec["self_cpu"][n] = round(sum(x["self_cpu_s"] for x in probes), 2)
                rec["children_cpu"][n] = round(sum(x["children_cpu_s"] for x in probes), 2)
            log(f"[scaling] {target} workers={n}: {span:.1f} s (dvc repro {res['wall_s']:.1f} s, "
                f"CPU {res['cpu_s']:.0f} s)")
        ref_n = counts[0]
        for n in counts[1:]:
            a, b = rec["hashes"][ref_n], rec["hashes"][n]
            for path in sorted(set(a) | set(b)):
                if a.get(path) != b.get(path):
                    mismatches.append(f"{target}: {path} md5 {b.get(path)} at workers={n}, {a.get(path)} at "
                                      f"workers={ref_n}")
        if not rec["hashes"][ref_n]:
            mismatches.append(f"{target}: no cached output found in dvc.lock to compare")
        rec.update(stage_scaling(rec["times"]))
        top = max(counts)
        rec["p_cpu"] = (cpu_split_fraction(rec["self_cpu"][top], rec["children_cpu"][top])
                        if top in rec["self_cpu"] else None)
        out[stage] = rec
    # leave the copy composed as it was run (auto)
    _run([py, "-m", "pipeline.core.config", "compose", *overrides], repo, env)
    return {"stages": out, "mismatches": mismatches}


# ----------------------------------------------------------------------------- the benchmark


def load_average_now() -> list[float]:
    from benchmarks.common import load_average

    return load_average()


def options() -> dict[str, Any]:
    return json.loads(os.environ.get(OPTIONS_ENV) or "{}")


def _last_scaling_run(path: Path, key: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The details and meta of the last scaling run in ``path`` (results.json) that recorded
    ``key`` (a kept run carries its own meta; the latest run's is the benchmark's)."""
    try:
        bench = json.loads(path.read_text(encoding="utf-8"))["benchmarks"]["scaling"]
        runs = bench["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return next(((det, run.get("meta") or bench.get("meta") or {}) for run in reversed(runs)
                 if (det := run.get("details") or {}).get(key)), None)


def _last_scaling_details(path: Path, key: str) -> dict[str, Any] | None:
    """The details of the last scaling run in ``path`` (results.json) that recorded ``key``."""
    found = _last_scaling_run(path, key)
    return found[0] if found else None


def previous_fractions(path: Path, key: str = "fractions") -> dict[str, float]:
    """The measured parallel fractions (``key``: Amdahl's from wall times, or ``cpu_fractions``)
    of the last scaling run in ``path`` (results.json)."""
    det = _last_scaling_details(path, key)
    return {k: float(v) for k, v in det[key].items() if v is not None} if det else {}


def previous_measurement(path: Path) -> dict[str, Any] | None:
    """Where the fractions in ``path`` (results.json) were measured: the commit, date, cores
    and load of the last scaling run that measured them (carried on by a ``--skip-run``
    re-projection, which measures nothing), or None without one."""
    found = _last_scaling_run(path, "fractions")
    if found is None:
        return None
    det, meta = found
    if det.get("measured_at"):
        return dict(det["measured_at"])
    return {k: meta.get(k) for k in ("git", "date", "cores", "load_average")}


def previous_experiment(path: Path) -> str | None:
    """The experiment the last scaling run with fractions in ``path`` measured on (``tiny``
    for runs that did not say)."""
    det = _last_scaling_details(path, "fractions")
    return (det.get("experiment") or "tiny") if det else None


def bench_scaling(variant: str, quick: bool, *, scratch: Path | None = None) -> dict[str, Any]:
    from benchmarks.common import RESULTS, _r, bench_dir, row
    from pipeline.core.parallel import available_cores

    opts = options()
    cores = available_cores()
    counts = [int(c) for c in opts.get("counts") or default_counts(cores)]
    stages = list(opts.get("stages") or (QUICK_STAGES if quick else STAGES))
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"--stages: unknown {unknown}; expected some of {list(STAGES)}")
    experiment = opts.get("experiment") or "tiny"
    if experiment not in EXPERIMENTS:
        raise ValueError(f"--experiment {experiment!r}: expected one of {list(EXPERIMENTS)}")
    install_s = float(opts.get("install_s", DEFAULT_INSTALL_S))
    other_s = float(opts.get("other_s", DEFAULT_OTHER_S))
    rows: list[dict[str, Any]] = []
    details: dict[str, Any] = {"available_cores": cores, "counts": counts, "experiment": experiment}
    fractions: dict[str, float | None] = {}
    cpu_fractions: dict[str, float | None] = {}
    mismatches: list[str] = []
    if opts.get("skip_run"):
        previous = Path(opts.get("previous") or RESULTS)
        details["experiment"] = previous_experiment(previous)
        fractions = dict(previous_fractions(previous))
        cpu_fractions = dict(previous_fractions(previous, key="cpu_fractions"))
        details["fractions_from"] = str(previous)
        # the README line quotes this run's commit and date: it must say the fractions are older
        details["measured_at"] = previous_measurement(previous)
    else:
        if 1 not in counts or len(counts) < 2:
            raise ValueError(f"--counts {counts}: needs 1 and at least one larger count")
        repo = (scratch or bench_dir()) / ("scaling" if experiment == "tiny" else f"scaling_{experiment}")
        overrides = EXPERIMENTS[experiment]
        # the slice runs only what the measured stages need (not every condition's evaluation)
        details["repo"] = prepare(repo, overrides, targets=() if experiment == "tiny" else [STAGES[s] for s in stages])
        meas = measure(repo, stages, counts, log=lambda s: print(s, file=sys.stderr, flush=True), overrides=overrides)
        mismatches = meas["mismatches"]
        for stage, rec in meas["stages"].items():
            t1 = rec["times"][1]
            for n in counts:
                t = rec["times"][n]
                rows.append(row(f"{rec['target']} ({experiment}) workers={n}", _r(t, 1), "s",
                                ratio=None if n == 1 else _r(t1 / t, 2), vs=None if n == 1 else "speed-up vs workers=1",
                                note=f"dvc repro {rec['total'][n]} s, CPU {rec['cpu'][n]} s, load "
                                f"{rec['load'][n][0]} -> {rec['load'][n][1]}"))
            p = rec["p"]
            fractions[stage] = p
            cpu_fractions[stage] = rec.get("p_cpu")
            same = not any(m.startswith(rec["target"] + ":") for m in mismatches)
            rows.append(row(f"{rec['target']} ({experiment}) parallel fraction p", _r(p, 3), "", target="outputs identical",
                            met=same, note=f"Amdahl from workers={rec['p_from']}; CPU split at workers={max(counts)}: "
                            + (f"{rec['p_cpu']:.3f} (stage {rec['self_cpu'][max(counts)]} s, its workers "
                               f"{rec['children_cpu'][max(counts)]} s"
                               + (", NO worker process started: serial here" if not rec['children_cpu'][max(counts)]
                                  else "") + "); " if rec.get("p_cpu") is not None else "n/a; ")
                            + ("outputs byte-identical" if same else "OUTPUTS DIFFER across worker counts")))
        # On a shared machine a stage's process may get a fraction of a core: CPU / wall of the
        # one-worker runs says how much; below 0.8 the speed-ups measure the neighbours, not the stage.
        share = [rec["cpu"][1] / rec["total"][1] for rec in meas["stages"].values() if rec["total"][1] > 0]
        details["cpu_share_at_1_worker"] = round(sum(share) / len(share), 2) if share else None
        if share and sum(share) / len(share) < 0.8:
            rows.append(row("WARNING machine busy: one-worker runs got this share of a core",
                            _r(sum(share) / len(share), 2),
                            "cores", target=">= 0.8", met=False,
                            note=f"CPU/wall of the workers=1 runs; load {load_average_now()}: speed-ups and p "
                                 "are unreliable, rerun on a quiet machine"))
        details["measured"] = {s: {k: v for k, v in rec.items()} for s, rec in meas["stages"].items()}
        details["mismatches"] = mismatches
        for m in mismatches:
            rows.append(row(f"MISMATCH {m}"[:160], None, "", met=False))
    details["fractions"] = {k: (None if v is None else round(v, 4)) for k, v in fractions.items()}
    details["cpu_fractions"] = {k: (None if v is None else round(v, 4)) for k, v in cpu_fractions.items()}
    proj = projection(ROOT, {k: v for k, v in fractions.items() if v is not None}, install_s=install_s,
                      other_s=other_s)
    details["projection"] = proj
    assumed = sorted(k for k, v in proj["stages"].items() if v["from"] == "assumed")
    note = (f"install {install_s:.0f} s + serial other {other_s:.0f} s; "
            + (f"assumed p for {', '.join(assumed)}" if assumed else "every p measured"))
    rows.append(row("default cold run as recorded (metrics/, 2-core machine, loaded)",
                    _r(proj["as_recorded_s"] / 60, 1),
                    "min", note=note))
    base = proj["cores"]["2"]["total_s"]
    for c, v in proj["cores"].items():
        target = {"2": "<= 25 min", "16": "<= 8 min"}.get(c)
        met = None if target is None else v["total_s"] / 60 <= (25 if c == "2" else 8)
        rows.append(row(f"default cold run projected at {c} cores", _r(v["total_s"] / 60, 1), "min",
                        ratio=None if c == "2" else _r(base / v["total_s"], 2),
                        vs=None if c == "2" else "speed-up vs 2 cores", target=target, met=met, note=note))
    by_cpu = {k: v for k, v in cpu_fractions.items() if v is not None}
    if by_cpu:
        cpu_proj = projection(ROOT, by_cpu, install_s=install_s, other_s=other_s)
        details["projection_cpu_split"] = cpu_proj
        for c in ("2", "16"):
            rows.append(row(f"default cold run projected at {c} cores, p from the CPU split",
                            _r(cpu_proj["cores"][c]["total_s"] / 60, 1), "min",
                            note=f"overall p {cpu_proj['parallel_fraction']:.3f}; p per stage: "
                            + ", ".join(f"{k} {v['p']:g}{'' if v['from'] == 'measured' else ' (assumed)'}"
                                        for k, v in cpu_proj["stages"].items())))
    design = projection(ROOT, {}, install_s=install_s, other_s=other_s)
    details["projection_assumed"] = design
    rows.append(row("default cold run projected at 16 cores, every stage at its assumed p",
                    _r(design["cores"]["16"]["total_s"] / 60, 1), "min",
                    note="what-if: " + ", ".join(f"{k} {v:g}" for k, v in ASSUMED_FRACTION.items())
                    + f"; overall p {design['parallel_fraction']:.3f}"))
    rows.append(row("parallel fraction of the cold run's CPU time (install included)", _r(proj["parallel_fraction"], 3),
                    "", target=">= 0.90", met=proj["parallel_fraction"] >= 0.9,
                    note=f"DAG alone {proj['parallel_fraction_dag']:.3f}"))
    return {"rows": rows, "details": details}


def print_projection(proj: dict[str, Any], out=None) -> None:
    """The per-stage projection as a small table (the main table has the totals)."""
    out = out or sys.stderr
    cores = list(proj["cores"])
    print(f"{'stage':16s} {'recorded s':>10s} {'ran on':>6s} {'p':>6s} {'':8s} "
          + " ".join(f"{c + ' cores':>10s}" for c in cores), file=out)
    for name, s in proj["stages"].items():
        print(f"{name:16s} {s['wall_s']:10.0f} {s['workers']:6d} {s['p']:6.3f} {s['from']:8s} "
              + " ".join(f"{proj['cores'][c]['stages_s'][name]:10.0f}" for c in cores), file=out)
    serial = proj["install_s"] + proj["other_s"]
    print(f"{'install+other':16s} {serial:10.0f} {'':6s} {0.0:6.3f} {'serial':8s} "
          + " ".join(f"{serial:10.0f}" for _ in cores), file=out)
    print(f"{'total':16s} {proj['as_recorded_s']:10.0f} {'':6s} {proj['parallel_fraction']:6.3f} {'':8s} "
          + " ".join(f"{proj['cores'][c]['total_s']:10.0f}" for c in cores), file=out)
