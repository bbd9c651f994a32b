"""Helpers shared by the benchmark suite (``python -m benchmarks``).

The machine description printed with every table, a peak-memory reading, timed
subprocesses (wall and CPU time), scratch copies of the project for ``dvc repro``
benchmarks, and seeded synthetic turns / episodes shaped like the collect stage's output.
Nothing here is imported by the pipeline; nothing here asserts a time.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# What a scratch copy of the project needs for `dvc repro` (the lead's workspace is never used).
# (benchmarks/ too: benchmarks that use the copy's data run from it, with its code.)
SCRATCH_COPY = ("conf", "hydra_plugins", "pipeline", "benchmarks", "dvc.yaml", "params.yaml")

RESULTS = ROOT / "benchmarks" / "results.json"
BENCH_DIR_ENV = "PIPELINE_BENCH_DIR"  # the parent's scratch folder, shared by its children


def row(figure: str, value: float | None, unit: str, *, ratio: float | None = None, vs: str | None = None,
        target: str | None = None, met: bool | None = None, note: str | None = None) -> dict[str, Any]:
    """One line of the table. ``ratio`` is ``value`` against ``vs`` (measured in the same run)."""
    return {"figure": figure, "value": value, "unit": unit, "ratio": ratio, "vs": vs, "target": target,
            "met": met, "note": note}


def bench_dir() -> Path:
    return Path(os.environ.get(BENCH_DIR_ENV) or Path(tempfile.gettempdir()) / "pipeline_bench")


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def git_revision() -> str | None:
    """``HEAD`` and whether the tree has local changes (read-only git calls)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}{'+local changes' if dirty else ''}" if head else None


def machine_info() -> dict[str, Any]:
    """Date, machine and load: printed above the table and stored in results.json."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in ("torch", "transformers", "pyarrow", "dvc", "textworld", "numpy")},
        "git": git_revision(),
        "load_average": load_average(),
    }


def peak_rss_gib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run_timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, *, timeout: float = 3600,
              on_line=None) -> dict[str, Any]:
    """Run ``cmd``; wall seconds, CPU seconds (user + sys of it and its children), output.

    ``on_line(t, line)`` is called for every line of merged stdout/stderr as it arrives
    (``t`` seconds since the start): how per-stage times are read from ``dvc repro``.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    lines = []
    deadline = t0 + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if on_line is not None:
            on_line(time.perf_counter() - t0, line)
        if time.perf_counter() > deadline:
            proc.kill()
            break
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "returncode": proc.returncode,
            "output": "".join(lines)}


def venv_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment DVC needs: this interpreter's bin first on PATH (stage commands say `python`)."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    for key in ("DVC_EXP_BASELINE_REV", "DVC_ROOT", "PYTHONPATH"):
        env.pop(key, None)
    env.update(extra or {})
    return env


def make_scratch_repo(dest: Path, *, tiny: bool = False, defaults: list[str] | None = None) -> dict[str, Any]:
    """A git + DVC repository at ``dest`` holding a copy of the project's pipeline.

    ``tiny`` swaps the default world for ``env: tiny`` (the ``--quick`` smoke run);
    ``defaults`` (``["agent=llm", "model=policy"]``) change other entries of the defaults
    list of the copy's ``conf/config.yaml`` (a default about to change). When the
    copied ``params.yaml`` is stale against ``conf/`` (another engineer mid-edit, or
    ``tiny``), it is recomposed in the copy, as ``python -m pipeline.core.config compose`` does,
    and the returned notes say so.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SCRATCH_COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)
    notes = []
    if tiny:
        cfg = dest / "conf" / "config.yaml"
        cfg.write_text(cfg.read_text().replace("- env: household", "- env: tiny"))
        notes.append("env=tiny (quick)")
    for item in defaults or []:
        group, _, option = item.partition("=")
        cfg = dest / "conf" / "config.yaml"
        lines = cfg.read_text().splitlines(keepends=True)
        hit = [i for i, ln in enumerate(lines) if ln.strip().startswith(f"- {group}:")]
        if not hit or not option:
            raise ValueError(f"--set-default {item!r}: expected GROUP=OPTION with GROUP in conf/config.yaml's defaults")
        indent = lines[hit[0]][: len(lines[hit[0]]) - len(lines[hit[0]].lstrip())]
        lines[hit[0]] = f"{indent}- {group}: {option}  # set by the benchmark (--set-default)\n"
        cfg.write_text("".join(lines))
        notes.append(f"default {group}={option}")
    env = venv_env()
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        res = subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed in {dest}: {res.stderr.strip()[-500:]}")
    shutil.copy2(ROOT / ".dvc" / "config", dest / ".dvc" / "config")
    if (ROOT / ".dvc" / "plots").is_dir():
        shutil.copytree(ROOT / ".dvc" / "plots", dest / ".dvc" / "plots", dirs_exist_ok=True)
    check = subprocess.run([sys.executable, "-m", "pipeline.core.config", "check"], cwd=dest, env=env,
                           capture_output=True, text=True)
    if check.returncode != 0:
        res = subprocess.run([sys.executable, "-m", "pipeline.core.config", "compose"], cwd=dest, env=env,
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"compose failed in {dest}: {res.stderr.strip()[-500:]}")
        if not tiny and not defaults:
            notes.append("params.yaml recomposed in the scratch copy (the working tree's was stale)")
    # The check above may have left a stamp; a cold run must start without one.
    shutil.rmtree(dest / ".checkpoints", ignore_errors=True)
    return {"path": str(dest), "notes": notes}


# ----------------------------------------------------------------------------- synthetic data

_OBJECTS = ["Apple_2", "Mug_0", "Key_1", "Book_3", "Plate_1", "Knife_0", "Cup_2", "Towel_1"]
_PLACES = ["Fridge_0", "Cabinet_0", "Drawer_1", "Counter_0", "Shelf_1", "Table_0"]
_ROOMS = ["Kitchen", "Bedroom", "Bathroom", "LivingRoom"]
_VERBS = ["go_to", "pick_up", "put", "open", "close", "examine", "look", "unlock"]


def _pool(rng, k: int, make) -> list[str]:
    return [make(rng, i) for i in range(k)]


def synthetic_turns(num_turns: int, *, turns_per_episode: int = 10, seed: int = 0, pool: int = 2048):
    """A seeded ``TURN_SCHEMA`` table of ``num_turns`` rows, built column-wise.

    Text columns are drawn from pools of realistic strings (an observation JSON of a few
    hundred characters, a reasoning line, an action JSON, feedback on about one turn in
    five), so the Parquet encoder sees collect-like data without a 10^6-row Python loop.
    """
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.core.schemas import TURN_SCHEMA

    rng = np.random.default_rng(seed)
    n = num_turns
    n_ep = -(-n // turns_per_episode)
    ep_ids = pa.array([f"ep_train_scene_{i % 97}_q{i % 13}_{i:07d}" for i in range(n_ep)], pa.string())
    ep_index = np.arange(n) // turns_per_episode
    turn_index = (np.arange(n) % turns_per_episode).astype(np.int32)

    def obs(r, i):
        room = _ROOMS[i % 4]
        return json.dumps({"scene": f"scene_{i % 97}", "agent_location": room, "agent_inventory": _OBJECTS[: i % 3],
                           "visible_entities": _PLACES[: 1 + i % 6] + _OBJECTS[i % 8: i % 8 + 2],
                           "available_actions": _VERBS, "description": f"-= {room} =- You are in the {room}. "
                           f"You see {', '.join(_PLACES[: 1 + i % 6])}.", "step": i % 30, "max_steps": 30},
                          sort_keys=True, separators=(",", ":"))

    def action(r, i):
        return json.dumps({"action": _VERBS[i % 8], "target": (_OBJECTS + _PLACES)[i % 14]}, sort_keys=True,
                          separators=(",", ":"))

    def text(prefix):
        return lambda r, i: f"{prefix} {(_OBJECTS + _PLACES)[i % 14]} in the {_ROOMS[i % 4]} (variant {i})."

    def col(make, null_share: float = 0.0) -> pa.Array:
        values = pa.array(_pool(rng, pool, make), pa.string())
        idx = rng.integers(0, pool, n)
        arr = values.take(pa.array(idx))
        if null_share:
            mask = pa.array(rng.random(n) < null_share)
            arr = pc.if_else(mask, pa.nulls(n, pa.string()), arr)
        return arr

    fb_lines = pa.array([[], ["feedback : spatial: the fridge is in the kitchen"],
                         ["feedback : procedural: open it first", "feedback : general: do not repeat"]],
                        pa.list_(pa.string()))
    fb_idx = rng.choice(3, n, p=[0.8, 0.15, 0.05])
    cols = {
        "episode_id": ep_ids.take(pa.array(ep_index)),
        "turn_index": pa.array(turn_index),
        "observation": col(obs),
        "prompt_hash": col(lambda r, i: f"{r.integers(0, 2**62):016x}" * 4),
        "prompt": pa.nulls(n, pa.string()),
        "generated_text": col(lambda r, i: "I should act next.\n" + action(r, i)),
        "reasoning": col(text("I look for")),
        "action": col(action),
        "command": col(lambda r, i: f"{_VERBS[i % 8].replace('_', ' ')} {(_OBJECTS + _PLACES)[i % 14].lower()}"),
        "action_valid": pa.array(rng.random(n) < 0.9),
        "env_feedback": col(text("You see")),
        "reward": pa.array(np.round(rng.random(n) * 0.1, 3)),
        "changed": pa.array(rng.random(n) < 0.7),
        "repeated": pa.array(rng.random(n) < 0.05),
        "done": pa.array(turn_index == turns_per_episode - 1),
        "won": pa.array((turn_index == turns_per_episode - 1) & (rng.random(n) < 0.6)),
        "status": pa.array(np.array(["Success", "Failure", "WiP"], dtype=object)[rng.choice(3, n, p=[.5, .2, .3])]
                           .tolist(), pa.string()),
        "feedback_lines": fb_lines.take(pa.array(fb_idx)),
        "feedback_user_preference": col(text("Keep closed:"), 0.95),
        "feedback_spatial": col(text("It is in"), 0.85),
        "feedback_procedural": col(text("Open first:"), 0.9),
        "feedback_general": col(text("Do not repeat"), 0.95),
        "memory": col(lambda r, i: json.dumps({"plan": ["open Fridge_0", "take Apple_2"], "previous_action":
                                               action(r, i)}, sort_keys=True), 0.5),
        "prompt_tokens": pa.array(rng.integers(200, 600, n).astype(np.int32)),
        "generated_tokens": pa.array(rng.integers(10, 60, n).astype(np.int32)),
        "generated_ids_length": pa.array(rng.integers(10, 60, n).astype(np.int32)),
        "action_token_start_index": pa.array(rng.integers(0, 10, n).astype(np.int32)),
        "action_token_end_index": pa.array(rng.integers(10, 60, n).astype(np.int32)),
        "tracking_method": pa.array(np.array(["stream", "fallback"], dtype=object)[rng.choice(2, n, p=[.95, .05])]
                                    .tolist(), pa.string()),
        "stop_reason": pa.array(np.array(["json_closed", "max_new_tokens"], dtype=object)[rng.choice(2, n)]
                                .tolist(), pa.string()),
        "decoding": pa.array(["constrained"] * n, pa.string()),
        "action_scores": pa.nulls(n, pa.string()),  # choice decoding only
    }
    return pa.table([cols[f.name].cast(f.type) for f in TURN_SCHEMA], schema=TURN_SCHEMA)


def synthetic_episodes(num_episodes: int, *, turns_per_episode: int = 6, seed: int = 0):
    """Seeded ``(episodes, turns)`` tables shaped like the collect stage's, for the store stage.

    Objectives name one to three entities (English), about half the episodes get
    corrective feedback, 60% are won; the turns carry the columns the store reads.
    """
    import numpy as np
    import pyarrow as pa

    from pipeline.core.schemas import EPISODE_SCHEMA

    rng = np.random.default_rng(seed)
    turns = synthetic_turns(num_episodes * turns_per_episode, turns_per_episode=turns_per_episode, seed=seed)
    n = num_episodes
    ep_ids = turns.column("episode_id").take(pa.array(np.arange(n) * turns_per_episode))
    scene = [f"scene_{i % 97}" for i in range(n)]
    quest = [f"q{i % 13}" for i in range(n)]
    objectives = [f"Put {_OBJECTS[i % 8]} in {_PLACES[i % 6]}" + (" and close it." if i % 3 else ".") for i in range(n)]
    won = rng.random(n) < 0.6
    nulls = pa.nulls(n, pa.string())
    cols = {
        "episode_id": ep_ids, "scene_id": pa.array(scene), "quest_id": pa.array(quest),
        "split": pa.array(["train"] * n), "condition": pa.array([""] * n), "objective": pa.array(objectives),
        "question": pa.array(objectives), "choices": pa.array([["look", "inventory"]] * n, pa.list_(pa.string())),
        "ground_truth": pa.array(["open fridge_0 ; take apple_2"] * n), "final_answer": nulls,
        "final_reward": pa.array(won.astype(np.float64)), "won": pa.array(won), "preferences_ok": pa.array(won),
        "is_correct": pa.array(won), "num_turns": pa.array(np.full(n, turns_per_episode, np.int32)),
        "num_invalid": pa.array(rng.integers(0, 3, n).astype(np.int32)),
        "num_repeated": pa.array(np.zeros(n, np.int32)), "prompt_tokens": pa.array(np.zeros(n, np.int64)),
        "generated_tokens": pa.array(np.zeros(n, np.int64)), "agent": pa.array(["react"] * n),
        "model": pa.array([""] * n), "seed": pa.array(np.arange(n, dtype=np.int64)), "metadata": nulls,
    }
    episodes = pa.table([cols[f.name].cast(f.type) for f in EPISODE_SCHEMA], schema=EPISODE_SCHEMA)
    return episodes, turns
