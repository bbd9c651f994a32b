"""ScienceWorld's throughput: the engine alone, the adapter, and a collection with a rule agent.

    python -m benchmarks.bench_scienceworld [--tasks find-plant,find-animal] [--steps 60] [--json]

Figures (one run on this machine; nothing asserts them):

- the JVM's start, and a variation's load + first observation (``reset``);
- the engine alone: steps/s of the gold commands sent to the simulator's parser
  (``server.step``: no state read back);
- the adapter (:class:`pipeline.envs.scienceworld.env.ScienceWorldTaskEnv`): steps/s with
  what each observation needs (object tree, valid action-object combinations, facts);
  the valid combinations are most of its cost (timed apart);
- a collection: the ``react`` rule agent plays the variations one at a time
  (``agent.batched=false``, as the experiments do) with the simulated user through
  :func:`pipeline.session.collection.run_collection`, a fresh JVM per episode (the
  default), in one process and in ``workers=2`` processes: turns/s of the whole loop.

Needs the `scienceworld` extra and Java (``make scienceworld``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/bench_scienceworld.py`
    sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from pipeline.core.config import compose_text, validate  # noqa: E402
from pipeline.envs import build_games  # noqa: E402
from pipeline.envs.scienceworld.commands import command_to_action  # noqa: E402
from pipeline.envs.scienceworld.engine import acquire, release, shutdown  # noqa: E402
from pipeline.envs.scienceworld.env import ScienceWorldTaskEnv  # noqa: E402
from pipeline.session.collection import run_collection  # noqa: E402
from pipeline.session.rollout import tasks_from_manifest  # noqa: E402


def _engine_steps(games, steps: int) -> dict:
    """The engine alone, then the adapter, on the same gold commands (replayed from the start when done)."""
    sw = acquire()
    rows = [r for r in games.rows if r["split"] == "eval"]
    raw_n, raw_t, env_n, env_t, valid_t, resets = 0, 0.0, 0, 0.0, 0.0, []
    for r in rows:
        spec = json.loads((games.root / r["game_file"]).read_text())
        sw.load(spec["task"], spec["variation"], spec["simplifications"])
        t = time.perf_counter()
        for k in range(steps):
            sw.server.step(r["expert_plan"][k % len(r["expert_plan"])])
        raw_t += time.perf_counter() - t
        raw_n += steps
        env = ScienceWorldTaskEnv(games.root / r["game_file"], max_steps=10 ** 6)
        t = time.perf_counter()
        env.reset()
        resets.append(time.perf_counter() - t)
        t = time.perf_counter()
        for k in range(steps):
            env.step(command_to_action(r["expert_plan"][k % len(r["expert_plan"])]))
            if env.won:
                env.reset()
        env_t += time.perf_counter() - t
        env_n += steps
        t = time.perf_counter()
        for _ in range(10):
            sw.server.getValidActionObjectCombinationsJSON()
        valid_t += (time.perf_counter() - t) / 10
        env.close()
    release(sw)
    return {"engine_steps_per_s": raw_n / raw_t, "adapter_steps_per_s": env_n / env_t,
            "valid_combinations_s": valid_t / len(rows), "reset_s": sum(resets) / len(resets)}


def _collect(cfg, games, workers: int, tmp: Path) -> dict:
    cfg = OmegaConf.merge(cfg, {"agent": {"workers": workers}})
    tasks = tasks_from_manifest(games.rows, split="eval", master_seed=cfg.seed)
    t = time.perf_counter()
    _, stats = run_collection(cfg, games.root, tasks, tmp / f"episodes_w{workers}", scenes=games.scenes,
                              ckpt_name=f"bench_w{workers}", desc=f"bench workers={workers}")
    wall = time.perf_counter() - t
    return {"episodes": stats["num_episodes"], "turns": stats["num_turns"], "wall_s": wall,
            "turns_per_s": stats["num_turns"] / wall}


def run(tasks: list[str], steps: int = 60, max_steps: int = 20) -> dict:
    t = time.perf_counter()
    release(acquire())
    jvm_start = time.perf_counter() - t
    overrides = ["env=scienceworld", "agent=react", "agent.batched=false", "model=none", f"env.max_steps={max_steps}",
                 f"env.scienceworld.tasks=[{','.join(tasks)}]", "env.scienceworld.eval_variations=2",
                 "env.scienceworld.train_variations=0"]
    cfg = validate(OmegaConf.create(compose_text(ROOT, overrides)))
    with tempfile.TemporaryDirectory() as tmp:
        games = build_games(cfg, Path(tmp), progress=False)
        out = {"tasks": tasks, "variations": sum(r["split"] == "eval" for r in games.rows), "steps": steps,
               "jvm_start_s": jvm_start, **_engine_steps(games, steps)}
        shutdown()  # the collections start their own JVM(s), as a stage does
        one = _collect(cfg, games, 1, Path(tmp))
        two = _collect(cfg, games, 2, Path(tmp))
    out.update({"collect_1_worker_turns_per_s": one["turns_per_s"], "collect_2_workers_turns_per_s": two["turns_per_s"],
                "collect_turns": one["turns"], "collect_1_worker_wall_s": one["wall_s"],
                "collect_2_workers_wall_s": two["wall_s"]})
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="find-plant,find-animal")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = run(a.tasks.split(","), a.steps)
    print(json.dumps(r, indent=2) if a.json else "\n".join(f"{k}: {v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
