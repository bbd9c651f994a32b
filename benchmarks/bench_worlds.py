"""Playing a household quest compiled (Inform 7 + Jericho) vs on TextWorld's logic engine.

    python -m benchmarks.bench_worlds [--houses 20] [--json]

The demonstrations of the default policy are played in thousands of generated houses
(:mod:`pipeline.envs.household.generate`); compiling each quest costs about a second and a
half here, which is what :class:`pipeline.envs.household.env.LogicHouseholdEnv` avoids. Per
house: the time to get a playable quest (compile vs build the ``textworld.Game`` in memory),
the first reset, then random-walk steps per second on each engine (the same walk, seeded).
The differential test (``tests/test_generate.py``) proves the two give the same steps.
Figures are from one run on this machine; nothing asserts them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/bench_worlds.py`
    sys.path.insert(0, str(ROOT))

from pipeline.core.conf_schema import EnvConfig  # noqa: E402
from pipeline.envs.household.env import HouseholdEnv, LogicHouseholdEnv, command_to_action  # noqa: E402
from pipeline.envs.household.games import compile_quest_game  # noqa: E402
from pipeline.envs.household.generate import GeneratedHouses, HouseSizes  # noqa: E402


def _walk(env, steps: int, seed: int) -> tuple[int, float]:
    rng = random.Random(seed)
    env.reset()
    t, n = time.perf_counter(), 0
    while n < steps:
        _, _, done, _ = env.step(command_to_action(rng.choice(env.admissible), env.world.room_exits()))
        n += 1
        if done:
            env.reset()
    return n, time.perf_counter() - t


def run(houses: int = 10, steps: int = 200) -> dict:
    warnings.filterwarnings("ignore", message="Game .* is not fully supported")
    gen = GeneratedHouses(HouseSizes(), seed=0, base=EnvConfig()).houses(houses)
    out = {"houses": houses, "steps_per_house": steps, "compile_s": [], "build_s": [], "compiled_reset_s": [],
           "logic_reset_s": [], "compiled_steps_per_s": [], "logic_steps_per_s": []}
    with tempfile.TemporaryDirectory() as tmp:
        for h in gen:
            row = h.row(0)
            kw = dict(scene_id=h.scene_id, quest_id="q00", objective=row["objective"], max_steps=30,
                      preferences=h.spec["preferences"], compute_expert_plan=False)
            t = time.perf_counter()
            res = compile_quest_game({"spec": h.spec, "row": row, "out": str(Path(tmp) / h.scene_id / "q00.z8")})
            out["compile_s"].append(time.perf_counter() - t - 0.0)
            assert res["error"] is None, res
            t = time.perf_counter()
            game = h.game(0)
            out["build_s"].append(time.perf_counter() - t)
            for name, env in (("compiled", HouseholdEnv(Path(tmp) / h.scene_id / "q00.z8", **kw)),
                              ("logic", LogicHouseholdEnv(game, **kw))):
                with env:
                    t = time.perf_counter()
                    env.reset()
                    out[f"{name}_reset_s"].append(time.perf_counter() - t)
                    n, dt = _walk(env, steps, seed=0)
                    out[f"{name}_steps_per_s"].append(n / dt)
    mean = {k: sum(v) / len(v) for k, v in out.items() if isinstance(v, list)}
    return {"houses": houses, **{k: round(v, 4) for k, v in mean.items()},
            "speedup_quest_ready": round((mean["compile_s"] + mean["compiled_reset_s"])
                                         / (mean["build_s"] + mean["logic_reset_s"]), 1),
            "speedup_steps": round(mean["logic_steps_per_s"] / mean["compiled_steps_per_s"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--houses", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = run(a.houses, a.steps)
    print(json.dumps(r, indent=2) if a.json else "\n".join(f"{k}: {v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
