"""LLM collection speed: batched vs sequential generation, early stop vs full-length generation.

    python -m benchmarks.bench_collect_llm              # or: python benchmarks/bench_collect_llm.py
    python -m benchmarks.bench_collect_llm --turns 32 --batch 8 --threads 1 --json

Real observations: tiny household games are built with the ``games`` stage in a temporary
folder and their expert plans are played to collect observations; the ``llm`` agent renders
its real prompts (``conf/templates/system_compact.txt``). A byte-level BPE tokenizer and a
small GPT-2 are fitted for a few seconds to answer prompts with a reasoning line, the JSON
action (with a ``memory`` object) and a trailing sentence, as chatty models do. Then, on
the same prompts with greedy decoding:

1. sequential (``agent.act`` per turn, seed 003's one-at-a-time simulator) vs batched
   (``LLMAgent.act_many`` over ``--batch`` agents): agent steps/s and generated tokens/s;
2. early stop on vs off (generation continues to EOS or ``max_new_tokens``): generated
   tokens per turn and wall time;
3. the same sequential vs batched comparison on short prompts generating
   ``max_new_tokens`` each (decode-bound), which isolates the batched decoding loop from
   the prompt prefill (the same compute in both modes).

Torch runs with ``--threads`` intra-op threads (1 by default: on a shared 2-core machine two
threads make timings swing by several x). Figures are from one run (best of
``--repeats``); nothing asserts them (tests never time anything).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/bench_collect_llm.py`
    sys.path.insert(0, str(ROOT))

GAME_OVERRIDES = [
    "env.num_scenes=2", "env.heldout_scenes=1", "env.rooms_per_scene=3", "env.containers_per_scene=3",
    "env.locked_containers=1", "env.objects_per_scene=3", "env.train_quests_per_scene=6",
    "env.eval_quests_per_scene=1", "workers=2",
]
TAIL = " Then I will check the result and continue with the plan until the objective is done."


def compose(overrides: list[str]):
    from omegaconf import OmegaConf

    from pipeline.core.config import compose_text, validate

    return validate(OmegaConf.create(compose_text(ROOT, overrides)))


def expert_turns(cfg, root: Path, limit: int) -> list[tuple[str, dict, dict]]:
    """``(episode_id, observation, expert action)`` along the expert plans of real games."""
    from pipeline.agents.base import clean_action
    from pipeline.envs.household.env import HouseholdEnv
    from pipeline.envs.household.build import build_games

    games = build_games(cfg, root, progress=False)
    turns = []
    for row in games.rows:
        if row["split"] != "train":
            continue
        env = HouseholdEnv(str(root / row["game_file"]), scene_id=row["scene_id"], quest_id=row["quest_id"],
                           objective=row["objective"], max_steps=30, reward=cfg.env.reward)
        obs = env.reset()
        for cmd in row["expert_plan"]:
            match = [a for a in obs["admissible_actions"] if a["command"] == cmd]
            if not match:
                break
            turns.append((f"ep_{row['scene_id']}_{row['quest_id']}_{obs['step']}", obs, clean_action(match[0])))
            obs, _, done, _ = env.step(match[0])
            if done or len(turns) >= limit:
                break
        env.close()
        if len(turns) >= limit:
            break
    return turns


def build_backend(cfg, turns, workdir: Path, steps: int, fit_examples: int):
    """Fit a tiny model on (prompt, expert answer) pairs; load it like a user's model directory."""
    from types import SimpleNamespace as NS

    from pipeline.agents.llm import LLMAgent, render_response
    from pipeline.llm.backends import make_backend, plain_prompt
    from pipeline.llm.tiny import fit, save_model_dir, tiny_gpt2, train_tokenizer

    prompts, answers = [], []
    for eid, obs, action in turns:
        agent = LLMAgent(cfg, seed=0, backend=NS())
        agent.reset({"episode_id": eid, "objective": obs["objective"]})
        prompts.append(plain_prompt(agent.messages(obs)))
        target = " ".join(str(v) for v in action.values() if v)
        answers.append(render_response(f"I should {target} next.", action, {"previous_action": target}) + TAIL)
    tok = train_tokenizer(prompts + answers, vocab_size=1024)
    model = tiny_gpt2(tok, n_layer=2, n_embd=96, n_head=2, n_positions=1024)
    t0 = time.perf_counter()
    # A few examples teach the answer format; the measured turns include unseen prompts.
    losses = fit(model, tok, list(zip(prompts, answers))[:fit_examples], steps=steps, lr=5e-3)
    fit_s = time.perf_counter() - t0
    path = save_model_dir(workdir / "model", model, tok)
    cfg.model.name_or_path = str(path)
    backend = make_backend(cfg.model, cfg.sampling)
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    return backend, {"fit_examples": fit_examples, "fit_steps": steps, "fit_s": round(fit_s, 1),
                     "final_loss": round(losses[-1], 4), "prompt_tokens_mean": round(statistics.mean(lengths), 1),
                     "answer_tokens_mean": round(statistics.mean(len(tok(a)["input_ids"]) + 1 for a in answers), 1)}


def play(cfg, backend, turns, *, batched: bool, batch: int, early_stop: bool) -> dict:
    """One agent step per turn (all agents at their first step); wall time and token counts."""
    from pipeline.agents.llm import LLMAgent

    cfg = copy.deepcopy(cfg)
    cfg.sampling.early_stop = early_stop
    cfg.agent.batch_size = batch
    agents = []
    for eid, obs, _ in turns:
        a = LLMAgent(cfg, seed=0, backend=backend)
        a.reset({"episode_id": eid, "objective": obs["objective"]})
        agents.append(a)
    observations = [obs for _, obs, _ in turns]
    backend.sampling = cfg.sampling
    t0 = time.perf_counter()
    if batched:
        steps = []
        for k in range(0, len(agents), batch):
            steps += LLMAgent.act_many(agents[k:k + batch], observations[k:k + batch])
    else:
        steps = [a.act(o) for a, o in zip(agents, observations)]
    wall = time.perf_counter() - t0
    extras = [{"generated_tokens": s.model.generation.generated_tokens, "stop_reason": s.model.generation.stop_reason,
               "action_valid": s.model.action_valid, "prompt_tokens": s.model.generation.prompt_tokens} for s in steps]
    return _summary(wall, extras, [s.action for s in steps], expert=[t[2] for t in turns])


def generate_short(backend, turns, *, batched: bool, batch: int, max_new_tokens: int) -> dict:
    """Decode-bound: a short prompt per turn, up to ``max_new_tokens`` generated without early stop."""
    msgs = [[{"role": "user", "content": f"{obs['objective']} At {obs['agent_location']}."}] for _, obs, _ in turns]
    t0 = time.perf_counter()
    if batched:
        gens = []
        for k in range(0, len(msgs), batch):
            gens += backend.generate(msgs[k:k + batch], max_new_tokens=max_new_tokens, early_stop=False)
    else:
        gens = [backend.generate([m], max_new_tokens=max_new_tokens, early_stop=False)[0] for m in msgs]
    wall = time.perf_counter() - t0
    extras = [{"generated_tokens": g.generated_tokens, "stop_reason": g.stop_reason, "action_valid": None,
               "prompt_tokens": g.prompt_tokens} for g in gens]
    return _summary(wall, extras, [g.generated_ids for g in gens])


def _summary(wall: float, extras: list[dict], outputs: list, expert: list | None = None) -> dict:
    n = len(extras)
    gen = sum(x["generated_tokens"] for x in extras)
    out = {
        "wall_s": wall, "steps": n, "generated_tokens": gen, "steps_per_s": n / wall, "tokens_per_s": gen / wall,
        "tokens_per_turn": gen / n, "prompt_tokens_per_turn": sum(x["prompt_tokens"] for x in extras) / n,
        "json_closed": sum(x["stop_reason"] == "json_closed" for x in extras) / n,
        "valid": sum(bool(x["action_valid"]) for x in extras) / n, "outputs": outputs,
    }
    if expert is not None:
        out["expert_match"] = sum(a == e for a, e in zip(outputs, expert)) / n
    return out


def _best(fn, repeats: int) -> dict:
    best = None
    for _ in range(repeats):  # best of `repeats`: the machine is shared
        r = fn()
        best = r if best is None or r["wall_s"] < best["wall_s"] else best
    return best


def run(turns_n: int = 32, batch: int = 8, fit_steps: int = 200, fit_examples: int = 8, repeats: int = 3,
        threads: int = 1) -> dict:
    import torch

    torch.set_num_threads(threads)
    cfg = compose(["agent=llm", "model=local", "sampling=greedy", *GAME_OVERRIDES])
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        turns = expert_turns(cfg, Path(tmp), turns_n)
        games_s = time.perf_counter() - t0
        backend, info = build_backend(cfg, turns, Path(tmp), fit_steps, fit_examples)
        play(cfg, backend, turns[:batch], batched=True, batch=batch, early_stop=True)  # warm-up
        max_new = int(cfg.sampling.max_new_tokens)
        res: dict = {"turns": len(turns), "batch": batch, "torch_threads": torch.get_num_threads(),
                     "max_new_tokens": max_new, "games_s": round(games_s, 1), **info}
        runs = {
            "sequential": _best(lambda: play(cfg, backend, turns, batched=False, batch=batch, early_stop=True), repeats),
            "batched": _best(lambda: play(cfg, backend, turns, batched=True, batch=batch, early_stop=True), repeats),
            "sequential_no_early_stop": _best(
                lambda: play(cfg, backend, turns, batched=False, batch=batch, early_stop=False), repeats),
            "batched_no_early_stop": _best(
                lambda: play(cfg, backend, turns, batched=True, batch=batch, early_stop=False), repeats),
        }
        # Decode-bound: the same architecture untrained (it rarely emits EOS, so every row
        # generates max_new_tokens) on short prompts.
        from pipeline.llm.backends.transformers import TransformersBackend
        from pipeline.llm.tiny import tiny_gpt2

        raw = TransformersBackend(cfg.model, cfg.sampling, tokenizer=backend.tokenizer,
                                  model=tiny_gpt2(backend.tokenizer, n_layer=2, n_embd=96, n_head=2, n_positions=1024))
        runs["short_sequential"] = _best(
            lambda: generate_short(raw, turns, batched=False, batch=batch, max_new_tokens=max_new), repeats)
        runs["short_batched"] = _best(
            lambda: generate_short(raw, turns, batched=True, batch=batch, max_new_tokens=max_new), repeats)
    res["same_actions_batched_vs_sequential"] = runs["batched"]["outputs"] == runs["sequential"]["outputs"]
    res["same_ids_short_batched_vs_sequential"] = runs["short_batched"]["outputs"] == runs["short_sequential"]["outputs"]
    for r in runs.values():
        r.pop("outputs")
        for k, v in r.items():
            if isinstance(v, float):
                r[k] = round(v, 3)
    res["runs"] = runs

    def ratio(a: str, b: str, key: str) -> float:
        return round(runs[a][key] / runs[b][key], 2)

    res["speedup_real_prompts_steps"] = ratio("batched", "sequential", "steps_per_s")
    res["speedup_real_prompts_tokens"] = ratio("batched", "sequential", "tokens_per_s")
    res["speedup_real_prompts_no_early_stop_tokens"] = ratio("batched_no_early_stop", "sequential_no_early_stop",
                                                             "tokens_per_s")
    res["speedup_short_prompts_tokens"] = ratio("short_batched", "short_sequential", "tokens_per_s")
    res["early_stop_tokens_per_turn_ratio"] = ratio("batched", "batched_no_early_stop", "tokens_per_turn")
    res["early_stop_wall_ratio_batched"] = ratio("batched", "batched_no_early_stop", "wall_s")
    res["early_stop_wall_ratio_sequential"] = ratio("sequential", "sequential_no_early_stop", "wall_s")
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_collect_llm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=32, help="agent turns per measured run")
    parser.add_argument("--batch", type=int, default=8, help="environments per batched call (N)")
    parser.add_argument("--fit-steps", type=int, default=200, help="training steps of the tiny model")
    parser.add_argument("--fit-examples", type=int, default=8, help="(prompt, answer) pairs it is fitted on")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (best kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    res = run(args.turns, args.batch, args.fit_steps, args.fit_examples, args.repeats, args.threads)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"bench_collect_llm: {res['turns']} turns of real games; tiny GPT-2 (2 layers, 96 dims) fitted "
          f"{res['fit_steps']} steps on {res['fit_examples']} answers ({res['fit_s']}s, loss {res['final_loss']}); "
          f"greedy; max_new_tokens={res['max_new_tokens']}; torch threads={res['torch_threads']}")
    print(f"  {'run':26s} {'wall s':>7s} {'steps/s':>8s} {'gen tok/s':>10s} {'prompt tok':>10s} {'gen tok/turn':>12s} "
          f"{'json_closed':>11s} {'valid':>6s}")
    for name, r in res["runs"].items():
        print(f"  {name:26s} {r['wall_s']:7.2f} {r['steps_per_s']:8.2f} {r['tokens_per_s']:10.1f} "
              f"{r['prompt_tokens_per_turn']:10.1f} {r['tokens_per_turn']:12.1f} {r['json_closed']:11.2f} "
              f"{r['valid']:6.2f}")
    print(f"  batched (N={res['batch']}) / sequential, real prompts: {res['speedup_real_prompts_steps']}x steps/s "
          f"({res['speedup_real_prompts_no_early_stop_tokens']}x tokens/s without early stop); "
          f"same actions: {res['same_actions_batched_vs_sequential']}")
    print(f"  batched (N={res['batch']}) / sequential, short prompts (decode-bound): "
          f"{res['speedup_short_prompts_tokens']}x tokens/s; same ids: {res['same_ids_short_batched_vs_sequential']}"
          "  (target >= 4x)")
    print(f"  early stop / no early stop: {res['early_stop_tokens_per_turn_ratio']}x generated tokens per turn, "
          f"{res['early_stop_wall_ratio_batched']}x wall time batched, "
          f"{res['early_stop_wall_ratio_sequential']}x sequential")
    return 0


if __name__ == "__main__":
    sys.exit(main())
