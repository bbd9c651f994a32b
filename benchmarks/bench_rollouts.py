"""The policy's whole episodes (DAgger's rollouts, the whole-episode probe) at 1 and 2 workers.

    python -m benchmarks.bench_rollouts [--houses 56] [--batch 14] [--json]

:func:`pipeline.policy.dagger.play_rollouts` plays a list of generated-house tasks
one ``agent.batch_size`` batch per job, in this process or in spawned workers. Here: the
first DAgger round's tasks of a small world (the tests' tiny games for the scene memory and
the eval exclusions; the houses are generated, ``env.max_steps`` the default's 20), a model of
the default policy's shapes, untrained (so most turns decode to ``sampling.max_new_tokens``,
96: more work per episode than a trained model's ~35 tokens), greedy. The same tasks at 1
worker and at 2; the rollouts must be identical (else the result says so). The 2-worker time
includes the workers' start-up (imports, the model sent to each job): what a stage would pay.
Figures are from one run on this machine; nothing asserts them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/bench_rollouts.py`
    sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

# conf/env/tiny.yaml's world (the tests' games): only the scene memory and the eval exclusions
# come from it; the episodes are played in generated houses, capped at the default's 20 steps.
WORLD = ["env=tiny", "env.max_steps=20"]


def _record(rolls) -> list:
    return [(r.task.task_id, r.won, r.success, r.turns, r.agreed,
             [(json.dumps(t.messages), t.response) for t in r.labels]) for r in rolls]


def run(houses: int = 56, batch: int = 14, counts: tuple[int, ...] = (1, 2)) -> dict:
    from pipeline.core.config import compose_text, validate
    from pipeline.core.numerics import pin
    from pipeline.envs.household.build import build_games
    from pipeline.core.parallel import partition
    from pipeline.policy.dagger import dagger_tasks, play_rollouts, rollout_config, rollout_pool
    from pipeline.policy.demos import build_scene_memory
    from pipeline.policy.model import build_model, train_tokenizer

    cfg = validate(OmegaConf.create(compose_text(ROOT, WORLD)))
    cfg = OmegaConf.merge(cfg, {"agent": {"name": "llm", "batch_size": batch}, "workers": 1})
    pin(cfg.numerics)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_rollouts_") as tmp:
        games = build_games(cfg, Path(tmp), progress=False)
        memory = build_scene_memory(cfg, games.root, games.rows, games.scenes)
        tasks = dagger_tasks(cfg, games.rows, games.scenes, memory, 0, houses)
    setup_s = time.perf_counter() - t
    tok = train_tokenizer([x.prompt for x in tasks] + ['{"action": "go_to", "target": "north"}'],
                          vocab_size=int(cfg.policy.vocab_size))
    model = build_model(tok, cfg.policy, seed=0)
    rcfg = rollout_config(cfg)
    seconds: dict[int, float] = {}
    records: dict[int, list] = {}
    turns = 0
    for n in counts:
        t = time.perf_counter()
        with rollout_pool(rcfg, workers=n) as pool:
            rolls = play_rollouts(pool, model, tok, tasks, label=True)
        seconds[n] = time.perf_counter() - t
        records[n] = _record(rolls)
        turns = sum(r.turns for r in rolls)
    base = counts[0]
    speedups = {n: seconds[base] / seconds[n] for n in counts}
    fractions = {n: (1 - 1 / s) / (1 - 1 / n) if n > 1 else None for n, s in speedups.items()}
    return {"houses": houses, "batch": batch, "jobs": len(partition(tasks, batch)), "episodes": len(tasks),
            "turns": turns,
            "setup_s": round(setup_s, 1), "seconds": {str(n): round(s, 2) for n, s in seconds.items()},
            "turns_per_s": {str(n): round(turns / s, 2) for n, s in seconds.items()},
            "speedup": {str(n): round(s, 3) for n, s in speedups.items()},
            "parallel_fraction": {str(n): (None if f is None else round(f, 3)) for n, f in fractions.items()},
            "identical": all(records[n] == records[base] for n in counts),
            "model": {"hidden_size": int(cfg.policy.hidden_size), "n_layer": int(cfg.policy.n_layer),
                      "vocab": len(tok), "max_new_tokens": int(cfg.sampling.max_new_tokens)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--houses", type=int, default=56)
    ap.add_argument("--batch", type=int, default=14)
    ap.add_argument("--counts", default="1,2", help="worker counts, the first the baseline")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run(args.houses, args.batch, tuple(int(c) for c in args.counts.split(",")))
    print(json.dumps(res, indent=1) if args.json else
          "\n".join(f"{n} workers: {s} s, {res['turns_per_s'][n]} turns/s, speed-up {res['speedup'][n]}"
                    for n, s in res["seconds"].items()) + f"\nidentical: {res['identical']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
