"""Hydra sweeps outside DVC: every job runs the whole pipeline in its own folder.

    python -m pipeline.tools.sweep -m seed=0,1,2                       # 3 jobs, one after another
    python -m pipeline.tools.sweep -m condition=C1,C2,C2_silent seed=0,1
    python -m pipeline.tools.sweep -m seed=0,1,2,3 hydra/launcher=joblib hydra.launcher.n_jobs=2
    python -m pipeline.tools.sweep -m seed=0,1 agent=react,rag env.max_steps=20,40   # any key is an axis
    python -m pipeline.tools.sweep seed=3                              # one job (no -m)

Each job gets the folder Hydra gives it (``multirun/<date>/<time>/<job number>/``, or
``hydra.sweep.dir=...``), turns it into a standalone copy of the project and runs
``dvc repro`` there:

1. the job's composed config is frozen into the copy's ``conf/config.yaml`` (only the
   schema in its defaults list) and composed to ``params.yaml`` by DVC's own compose, so
   ``params.yaml`` is what ``dvc exp run -S ...`` would have written and the pipeline's
   staleness check holds;
2. ``dvc.yaml``, ``pipeline/``, ``hydra_plugins/``, ``conf/`` and every other ``deps``
   path of ``dvc.yaml`` that no stage writes are copied: the job runs the code as it was
   when the sweep started, and its folder records exactly what ran;
3. ``dvc init --no-scm`` and ``dvc repro --no-commit`` (no cache copy of the outputs)
   run the chain, stage commands resolving ``python`` to this interpreter; the log goes
   to ``repro.log``;
4. ``sweep_result.json`` keeps the job's overrides, status and per-condition success.

At the end a table has one row per job (overrides, success rate per condition with its
interval, paired success difference per comparison) and is saved as
``summary.md`` / ``summary.json`` in the sweep folder. The exit status is 1 if a job failed.

Why a copy + ``dvc repro`` and not the stage functions called in-process: ``dvc.yaml``
stays the only map of the chain (new stages are swept without touching this file), each
stage runs exactly as under DVC (separate process, same command, same checks), and jobs
share nothing, so they can run in parallel (joblib) or on other machines (SLURM).

``condition`` is a sweep axis like any other: when a job selects some conditions only
(``condition=C1``), comparisons and prompt checks naming other conditions are dropped
from that job's config (noted in its log), since they cannot be evaluated there.

Beyond one machine, Hydra's submitit launcher (installed: ``hydra-submitit-launcher``)
sends each job to SLURM; the sweep folder must be on a filesystem the nodes share::

    python -m pipeline.tools.sweep -m seed=0,1,2,3 hydra/launcher=submitit_slurm \\
        hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=1 \\
        hydra.launcher.timeout_min=240 hydra.launcher.cpus_per_task=8 \\
        hydra.sweep.dir=/shared/sweeps/memory-seeds

This is the one entry point that uses ``@hydra.main``; it is never a DVC stage (inside
DVC, ``dvc exp run --queue -S ...`` + ``dvc queue start -j N`` sweep instead).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import hydra
import yaml
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pipeline.core.conf_schema import Config, register_configs
from pipeline.core.config import compose, project_root
from pipeline.core.io import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)

RESULT_FILE = "sweep_result.json"
REPRO_LOG = "repro.log"
#: Always copied into a job (the code, its Hydra schema plugin, the config tree, the map).
CODE_PATHS = ("dvc.yaml", "pipeline", "hydra_plugins", "conf")
#: Written in the job itself, never copied.
JOB_WRITTEN = ("params.yaml", "dvc.lock")
#: Name of the primary config this app composes: the project's ``config`` plus the
#: end-of-sweep summary callback (Hydra runs it in the launching process).
APP_CONFIG = "pipeline_sweep"
#: Environment variable naming the project the jobs copy (set in each job by Hydra).
SOURCE_ENV = "PIPELINE_SWEEP_SOURCE"
_INTERP = re.compile(r"\$\{([^}]+)\}")


class SweepError(RuntimeError):
    """A job could not be set up or its pipeline failed (message names the job folder)."""


# --------------------------------------------------------------------------- job config


def restrict_to_conditions(params: dict) -> tuple[dict, list[str]]:
    """Drop comparisons / prompt checks naming conditions this job does not evaluate.

    Returns:
        ``(params, notes)``: a new dict and one note per dropped pair.
    """
    params = json.loads(json.dumps(params))
    selected = set(params.get("condition") or {})
    notes = []
    exp = params.get("experiment") or {}
    for key in ("comparisons", "identical_prompts"):
        pairs = exp.get(key) or []
        kept = [p for p in pairs if all(c in selected for c in p)]
        dropped = [p for p in pairs if p not in kept]
        if dropped:
            notes.append(f"experiment.{key}: dropped {dropped} (this job evaluates {sorted(selected)})")
        if key in exp:
            exp[key] = kept
    return params, notes


def frozen_conf_text(params: Mapping[str, Any]) -> str:
    """A ``conf/config.yaml`` that composes to exactly ``params`` (schema + the values)."""
    head = ("# Frozen by pipeline.tools.sweep: this job's composed config. Compose with\n"
            "# `python -m pipeline.core.config compose` (params.yaml is already composed from it).\n")
    body = yaml.safe_dump({"defaults": ["schema", "_self_"], **params}, sort_keys=False, allow_unicode=True)
    return head + body


# --------------------------------------------------------------------------- job folder


def _lookup(params: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = params
    for k in dotted.split("."):
        if not isinstance(cur, Mapping) or k not in cur:
            return None
        cur = cur[k]
    return cur


def _resolve(path: str, params: Mapping[str, Any]) -> tuple[str, bool]:
    """``${paths.games}/x`` -> ``("data/games/x", True)`` from the job's params.

    A part that cannot be resolved here (``${item.condition}`` of a matrix stage) cuts
    the path: ``("data/eval/", False)``, the folder every expansion lies in.
    """
    out, pos = [], 0
    for m in _INTERP.finditer(path):
        v = _lookup(params, m.group(1).strip())
        if not isinstance(v, (str, int, float)):
            return "".join(out) + path[pos:m.start()], False
        out += [path[pos:m.start()], str(v)]
        pos = m.end()
    return "".join(out) + path[pos:], True


def _paths(entries: Any) -> Iterable[str]:
    for e in entries or []:
        if isinstance(e, str):
            yield e
        elif isinstance(e, Mapping):
            yield from (str(k) for k in e)


def extra_inputs(dvc_yaml: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """``deps`` of ``dvc.yaml`` that no stage writes (inputs a job needs besides the code)."""
    deps, outs, out_prefixes = set(), set(), set()
    for stage in (dvc_yaml.get("stages") or {}).values():
        if not isinstance(stage, Mapping):
            continue
        for p in _paths(stage.get("deps")):
            r, complete = _resolve(p, params)
            if complete:
                deps.add(r.rstrip("/"))
        for key in ("outs", "metrics", "plots"):
            for p in _paths(stage.get(key)):
                r, complete = _resolve(p, params)
                if complete:
                    outs.add(r.rstrip("/"))
                elif "/" in r:
                    out_prefixes.add(r.rsplit("/", 1)[0])  # "data/eval/" -> data/eval holds outputs

    def produced(p: str) -> bool:
        # Written by a stage: an output, inside one, or a folder holding outputs.
        return (any(p == o or p.startswith(o + "/") or o.startswith(p + "/") for o in outs)
                or any(p == o or p.startswith(o + "/") or o.startswith(p + "/") for o in out_prefixes))

    def copied(p: str) -> bool:
        return p in JOB_WRITTEN or any(p == c or p.startswith(c + "/") for c in CODE_PATHS)

    return sorted(p for p in deps if not produced(p) and not copied(p))


def prepare_job(source: Path, job_dir: Path, params: Mapping[str, Any]) -> Path:
    """Turn ``job_dir`` into a standalone project running ``params``; returns ``job_dir``."""
    dvc_yaml_path = source / "dvc.yaml"
    if not dvc_yaml_path.is_file():
        raise SweepError(f"{dvc_yaml_path} is missing: run the sweep from the project root")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for rel in CODE_PATHS:
        src, dst = source / rel, job_dir / rel
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy2(src, dst)
    dvc_yaml = yaml.safe_load(dvc_yaml_path.read_text(encoding="utf-8")) or {}
    for rel in extra_inputs(dvc_yaml, params):
        src, dst = source / rel, job_dir / rel
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True)
        elif src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        else:
            log.warning("dvc.yaml dependency %s does not exist in %s; the job's stage will report it", rel, source)
    (job_dir / "conf" / "config.yaml").write_text(frozen_conf_text(params), encoding="utf-8")
    compose(job_dir)
    return job_dir


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Stage commands say `python`: make it this interpreter (the one with the project's deps).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("DVC_ROOT", None)  # we may be launched from inside another DVC project
    env["DVC_NO_ANALYTICS"] = "1"
    return env


def run_dvc(job_dir: Path, args: list[str], log_file: Path) -> int:
    with open(log_file, "a", encoding="utf-8") as fh:
        fh.write(f"$ dvc {' '.join(args)}\n")
        fh.flush()
        proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=job_dir, env=_env(), stdout=fh,
                              stderr=subprocess.STDOUT)
    return proc.returncode


def collect_results(job_dir: Path, params: Mapping[str, Any]) -> dict[str, Any]:
    """Per-condition success (``metrics/eval/<C>.json``) and comparisons (``compare.json``)."""
    metrics_dir = job_dir / str(_lookup(params, "paths.metrics") or "metrics")
    conditions = {}
    for name in params.get("condition") or {}:
        path = metrics_dir / "eval" / f"{name}.json"
        if path.is_file():
            m = json.loads(path.read_text(encoding="utf-8"))
            conditions[name] = {k: m.get("success_rate", {}).get(k) for k in ("value", "ci_low", "ci_high", "n")}
    comparisons = {}
    cmp_path = metrics_dir / "compare.json"
    if cmp_path.is_file():
        comparisons = json.loads(cmp_path.read_text(encoding="utf-8")).get("comparisons", {})
    # JSON files sort their keys: keep the config order for the table's columns.
    order = [c for c in params.get("condition") or {} if c in conditions]
    comp_order = [f"{t}_vs_{c}" for t, c in (params.get("experiment") or {}).get("comparisons") or []
                  if f"{t}_vs_{c}" in comparisons]
    return {"conditions": conditions, "comparisons": comparisons, "condition_order": order,
            "comparison_order": comp_order}


def run_job(cfg: Config, job_dir: Path, source: Path, overrides: list[str], job_num: int = 0) -> dict[str, Any]:
    """Set up ``job_dir`` for ``cfg``, run ``dvc repro`` there, write and return its result."""
    t0 = time.perf_counter()
    params = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    params, notes = restrict_to_conditions(params)  # type: ignore[arg-type]
    for n in notes:
        log.info(n)
    result: dict[str, Any] = {"job": job_num, "overrides": list(overrides), "dir": str(job_dir), "notes": notes}
    log_file = job_dir / REPRO_LOG
    try:
        prepare_job(source, job_dir, params)
        code = run_dvc(job_dir, ["init", "--no-scm", "-q", "-f"], log_file)
        if code == 0:
            code = run_dvc(job_dir, ["repro", "--no-commit"], log_file)
        if code != 0:
            tail = log_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-6:]
            raise SweepError(f"dvc repro failed (exit {code}) in {job_dir}; see {log_file}:\n  " + "\n  ".join(tail))
        result.update(status="ok", **collect_results(job_dir, params))
    except Exception as exc:  # the job fails, the sweep goes on; the summary shows it
        log.error("job %s (%s) failed: %s", job_num, " ".join(overrides), exc)
        result.update(status="failed", error=str(exc), conditions={}, comparisons={})
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    atomic_write_json(job_dir / RESULT_FILE, result)
    return result


# --------------------------------------------------------------------------- summary


def _ci(d: Mapping[str, Any] | None) -> str:
    if not d or d.get("value") is None:
        return "–"
    return f"{d['value']:.2f} [{d['ci_low']:.2f}, {d['ci_high']:.2f}]"


def summary_rows(results: list[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the summary table (one row per job)."""
    conds: list[str] = []
    comps: list[str] = []
    for r in results:
        conds += [c for c in r.get("condition_order") or r.get("conditions", {}) if c not in conds]
        comps += [c for c in r.get("comparison_order") or r.get("comparisons", {}) if c not in comps]
    common = shared_overrides(results)
    header = ["job", "overrides", "status"] + [f"success {c}" for c in conds] + [f"Δ {c} (p)" for c in comps]
    rows = []
    for r in sorted(results, key=lambda r: r.get("job", 0)):
        own = [o for o in r.get("overrides", []) if o not in common]
        row = [str(r.get("job", "")), " ".join(own) or "(none)", r.get("status", "?")]
        row += [_ci(r.get("conditions", {}).get(c)) for c in conds]
        for c in comps:
            d = r.get("comparisons", {}).get(c)
            row.append("–" if not d else f"{_ci(d.get('success_diff'))} (p={d.get('p_value'):.3g})")
        rows.append(row)
    return header, rows


def shared_overrides(results: list[Mapping[str, Any]]) -> list[str]:
    """Overrides every job has (shown once above the table, not in every row)."""
    if len(results) < 2:
        return []
    sets = [set(r.get("overrides", [])) for r in results]
    return [o for o in results[0].get("overrides", []) if all(o in s for s in sets)]


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def summarize(sweep_dir: Path) -> list[dict]:
    """Read every job's result under ``sweep_dir``; print and save the summary table."""
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(sweep_dir.glob(f"*/{RESULT_FILE}"))]
    if (sweep_dir / RESULT_FILE).is_file():  # a single run: the run dir is the job dir
        results.append(json.loads((sweep_dir / RESULT_FILE).read_text(encoding="utf-8")))
    header, rows = summary_rows(results)
    table = format_table(header, rows)
    failed = [r for r in results if r.get("status") != "ok"]
    common = shared_overrides(results)
    text = f"# Sweep summary ({len(results)} jobs, {len(failed)} failed)\n\n"
    if common:
        text += f"Every job: {' '.join(common)}\n\n"
    text += f"{table}\n"
    for r in failed:
        text += f"\njob {r.get('job')} ({' '.join(r.get('overrides', []))}): {r.get('error')}\n"
    atomic_write_text(sweep_dir / "summary.md", text)
    atomic_write_json(sweep_dir / "summary.json", results)
    print(f"\n{text}\nsummary saved to {sweep_dir / 'summary.md'}", flush=True)
    return results


class SweepSummary(Callback):
    """Hydra callback: prints the summary table when the sweep (or single run) ends."""

    failed: int = 0

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._finish(Path(config.hydra.sweep.dir))

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._finish(Path(config.hydra.run.dir))

    def _finish(self, folder: Path) -> None:
        results = summarize(folder)
        SweepSummary.failed = sum(r.get("status") != "ok" for r in results)


# --------------------------------------------------------------------------- entry point


def _task(cfg: Config) -> dict:
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir)
    source = Path(os.environ[SOURCE_ENV])
    num = int(hc.job.num) if hc.job.get("num") is not None else 0
    return run_job(cfg, job_dir, source, list(hc.overrides.task), num)


def main() -> int:
    source = project_root()
    if not (source / "conf" / "config.yaml").is_file():
        print(f"error: no conf/config.yaml under {source}: run the sweep from the project root", file=sys.stderr)
        return 1
    register_configs()
    ConfigStore.instance().store(name=APP_CONFIG, node={
        "defaults": ["config", "_self_"],
        "hydra": {
            "callbacks": {"sweep_summary": {"_target_": "pipeline.tools.sweep.SweepSummary"}},
            # Jobs may run in other processes (joblib) or on other machines (SLURM): Hydra
            # sets this variable inside every job, whatever the launcher.
            "job": {"env_set": {SOURCE_ENV: str(source)}},
        },
    })
    SweepSummary.failed = 0
    app = hydra.main(config_path=str(source / "conf"), config_name=APP_CONFIG, version_base="1.3")(_task)
    app()
    return 1 if SweepSummary.failed else 0


if __name__ == "__main__":
    # Run from the imported module, not from __main__: Hydra instantiates the callback
    # from `pipeline.tools.sweep` and launchers pickle `_task` by reference, so every process
    # must see the same module (and the same SweepSummary.failed).
    from pipeline.tools.sweep import main as _main

    sys.exit(_main())
