"""Synthetic eval runs for the viewer: tests, the size benchmark and the screenshot.

    python -m pipeline.view.synthetic --tasks 250 --out /tmp/episodes.html   # 1,000 episodes: size, time

The rows have the real artifacts' columns and shapes (``EPISODE_SCHEMA`` / ``TURN_SCHEMA``
rows, ``data/prompts`` rows): household scenes with rooms, containers and objects, a
walking agent whose observations follow its moves (the environment's observation dict,
admissible commands and actions included), a reasoning line and a JSON action per turn,
the simulated user's feedback lines, token counts, and system prompts with a grounding
section and, for memory conditions, an advisory block. Each condition plays each task
with its own slips, so runs part ways at some turn; most lost episodes run to
``max_steps`` as the default run's do. Everything is drawn from ``seed``: the same
arguments give the same rows.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Sequence

from pipeline.core.schemas import canonical_json
from pipeline.view.model import Run

ROOMS = ("Kitchen", "Bedroom", "Bathroom", "LivingRoom", "Office", "DiningRoom", "Hallway", "Pantry")
CONTAINERS = ("Cabinet", "Drawer", "Fridge", "Wardrobe", "Chest", "Box")
SUPPORTERS = ("Table", "Desk", "Shelf", "Counter")
OBJECTS = ("Apple", "Mug", "Cup", "Soap", "Spoon", "Book", "Candle", "Glass", "Bowl", "Towel", "Pen", "Plate")
DIRECTIONS = ("north", "south", "east", "west")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
MEMORY_CONDITIONS = ("C2", "C2_placebo")

TEMPLATE = """You are a household agent in a text game. Reach the objective in few steps.

## Objective
{objective}

## Grounding (what the user taught you before)
{grounding}

{memory}## Memory (State Continuity)
- Previous Action: $memory[previous_action]
- Plan: $memory[plan]
- Notes: $memory[notes]

## Current Observation
- Step: $step of $max_steps
- Location: $agent_location
- Inventory: $agent_inventory
- Visible: $visible_entities
- Actions: $available_actions
- Valid commands: $admissible_commands
- Description: $description

## Output
Write one short reasoning line, then one JSON action on one line:
{{"action": "<verb>", "target": "<entity or null>"}}
"""


class _Scene:
    """A random household: rooms in a line or loop, containers, supporters and objects."""

    def __init__(self, rng: random.Random, scene_id: str):
        self.scene_id = scene_id
        self.rooms = rng.sample(ROOMS, rng.randint(3, 5))
        self.exits: dict[str, dict[str, str]] = {r: {} for r in self.rooms}
        for a, b in zip(self.rooms, self.rooms[1:]):
            free = [d for d in DIRECTIONS if d not in self.exits[a] and OPPOSITE[d] not in self.exits[b]]
            d = rng.choice(free)
            self.exits[a][d], self.exits[b][OPPOSITE[d]] = b, a
        self.containers = {f"{rng.choice(CONTAINERS)}_{i}": rng.choice(self.rooms) for i in range(rng.randint(2, 4))}
        self.supporters = {f"{rng.choice(SUPPORTERS)}_{i}": rng.choice(self.rooms) for i in range(rng.randint(1, 2))}
        self.objects = {f"{o}_{rng.randint(0, 3)}": rng.choice(self.rooms) for o in rng.sample(OBJECTS, 4)}

    def copy(self) -> "_Scene":
        """A copy whose objects can move (an episode drops things) without touching this one."""
        new = _Scene.__new__(_Scene)
        new.__dict__.update(self.__dict__)
        new.objects = dict(self.objects)
        return new


def _observation(scene: _Scene, room: str, inventory: list[str], objective: str, step: int, max_steps: int,
                 opened: set[str]) -> dict:
    here_c = [c for c, r in scene.containers.items() if r == room]
    here_s = [s for s, r in scene.supporters.items() if r == room]
    here_o = [o for o, r in scene.objects.items() if r == room and o not in inventory]
    exits = scene.exits[room]
    commands = sorted([f"examine {x}" for x in here_c + here_s + here_o]
                      + [f"go {d}" for d in exits] + ["inventory", "look"]
                      + [f"{'close' if c in opened else 'open'} {c}" for c in here_c]
                      + [f"take {o}" for o in here_o] + [f"drop {o}" for o in inventory])
    verbs = {"examine": "examine", "go": "go_to", "inventory": "inventory", "look": "look", "open": "open",
             "close": "close", "take": "pick_up", "drop": "drop"}
    actions = []
    for cmd in commands:
        verb, _, target = cmd.partition(" ")
        if verb == "go":
            target = exits[target]
        actions.append({"action": verbs[verb], "command": cmd, "target": target or None})
    seen = ", ".join([f"{c} ({'open' if c in opened else 'closed'})" for c in here_c] + here_s + here_o) or "nothing"
    ways = ", ".join(f"{d} to {r}" for d, r in exits.items())
    carrying = ", ".join(inventory) or "nothing"
    return {
        "admissible_actions": actions, "admissible_commands": commands, "agent_inventory": list(inventory),
        "agent_location": room, "available_actions": sorted({a["action"] for a in actions} | {"wait"}),
        "description": f"You are in the {room}. You see {seen}. Exits: {ways}. You are carrying "
                       f"{'nothing' if not inventory else ': ' + carrying}.",
        "max_steps": max_steps, "objective": objective, "scene": scene.scene_id, "step": step,
        "visible_entities": here_c + here_s + here_o + list(exits.values()),
    }


def _grounding(rng: random.Random, scene: _Scene) -> str:
    lines = ["#### Spatial Grounding", ""]
    for o, r in list(scene.objects.items())[:2]:
        a = rng.choice(scene.rooms)
        lines += [f"- {o} is in the {r}.", f"From the {a}, follow the exits toward the {r}.", ""]
    lines += ["#### Procedural Grounding", "", f"- Open {next(iter(scene.containers))} before taking from it.", "",
              "#### General Grounding Rules", "", "- Do not repeat 'look' without effect; try something new."]
    return "\n".join(lines)


def _memory_block(rng: random.Random, condition: str, scene: _Scene) -> str:
    other = "another house" if condition == "C2_placebo" else f"the {rng.choice(scene.rooms)}"
    advisories = [{"advisory_id": f"adv_{i:06d}", "advisory_type": rng.choice(["failed_override_warning",
                                                                              "successful_override"]),
                   "message": f"Principle: use what is known about where things are in {other} before searching "
                              f"elsewhere. A similar past case went wrong ({rng.randint(2, 20)} steps without "
                              f"progress) and was fixed by feedback; the goal was reached in {rng.randint(4, 12)} turns.",
                   "relevance_score": round(rng.uniform(0.3, 0.9), 2), "strength": "moderate"} for i in range(3)]
    body = {"DEBATE_CONTEXT__MEMORY": {"memory_on": True, "meta": {"gate_reason": "ok", "topk": 3},
                                       "retrieved": advisories}}
    return "## Episodic Memory (advisories from similar past episodes)\n" + json.dumps(body, indent=2) + "\n\n"


def _play(shared: random.Random, own: random.Random, part_at: int, scene: _Scene, objective: str,
          target: tuple[str, str], wins: bool, max_steps: int, slip: float,
          episode_id: str) -> tuple[list[dict], dict]:
    """One episode's turn rows and its totals: a random walk drawn from ``shared`` (the same
    for every condition) up to turn ``part_at``, from ``own`` after; a winner drops ``target``."""
    obj, goal_room = target
    room, inventory, opened, turns = scene.rooms[0], [], set(), []
    seen_cmds: set[str] = set()
    length = own.randint(3, min(12, max_steps)) if wins else max_steps
    reward_total, pt_total, gt_total = 0.0, 0, 0
    for k in range(length):
        rng = shared if k < part_at else own
        obs = _observation(scene, room, inventory, objective, k, max_steps, opened)
        last = wins and k == length - 1
        if last:
            inventory = [obj]
            cmd = f"drop {obj}"
            valid = True
        elif rng.random() < slip:
            cmd = rng.choice(["look", f"take {rng.choice(OBJECTS)}_{rng.randint(0, 3)}", f"open {obj}"])
            valid = cmd in obs["admissible_commands"] and cmd != "look"
        else:
            cmd = rng.choice(obs["admissible_commands"])
            valid = True
        verb, _, arg = cmd.partition(" ")
        repeated = cmd in seen_cmds and verb in ("look", "examine", "inventory")
        seen_cmds.add(cmd)
        response = f"You can't do that: {cmd} is not possible here." if not valid else obs["description"]
        if valid and verb == "go":
            room = scene.exits[room][arg]
            response = _observation(scene, room, inventory, objective, k + 1, max_steps, opened)["description"]
        elif valid and verb == "take":
            inventory.append(arg)
            response = f"You pick up the {arg}."
        elif valid and verb == "drop" and arg in inventory:
            inventory.remove(arg)
            scene.objects[arg] = room
            response = f"You drop the {arg}."
        elif valid and verb in ("open", "close"):
            (opened.add if verb == "open" else opened.discard)(arg)
            response = f"You {verb} the {arg}."
        reward = 1.0 if last else (0.05 if valid and verb == "go" else (-0.1 if repeated or not valid else 0.0))
        reward_total += reward
        lines = []
        if not valid and rng.random() < 0.6:
            lines.append(f"feedback : procedural: {cmd} is not possible now; check the valid commands first.")
        if repeated:
            lines.append(f"feedback : general: You repeated '{cmd}' without effect; try something new.")
        if rng.random() < 0.15:
            lines.append(f"feedback : spatial: {obj} is in the {scene.objects.get(obj, goal_room)}.")
        if last:
            lines.append("feedback : user_preference: Thank you for closing what you opened.")
        plan = "; ".join(rng.sample(obs["admissible_commands"], min(3, len(obs["admissible_commands"]))))
        action = {"action": {"go": "go_to", "take": "pick_up"}.get(verb, verb), "target": arg or None}
        memory = {"notes": f"visited: {room}", "plan": plan, "previous_action": cmd}
        reasoning = f"Plan: {cmd}." if rng.random() < 0.8 else f"Find {obj}: {plan}."
        gen = reasoning + "\n" + json.dumps({**action, "memory": memory})
        pt, gt = rng.randint(600, 1100), rng.randint(10, 40)
        pt_total, gt_total = pt_total + pt, gt_total + gt
        turns.append({
            "episode_id": episode_id, "turn_index": k, "observation": canonical_json(obs), "prompt_hash": None,
            "prompt": None, "generated_text": gen, "reasoning": reasoning, "action": canonical_json(action),
            "command": cmd if valid else "look", "action_valid": valid, "env_feedback": response,
            "reward": round(reward, 4), "changed": valid and verb in ("go", "take", "drop", "open", "close"),
            "repeated": repeated, "done": k == length - 1, "won": last,
            "status": "Success" if last or (valid and verb == "go") else ("Failure" if not valid else "WiP"),
            "feedback_lines": lines, "memory": canonical_json(memory), "prompt_tokens": pt, "generated_tokens": gt,
            "generated_ids_length": gt, "action_token_start_index": 3, "action_token_end_index": gt,
            "tracking_method": "stream", "stop_reason": "json_closed" if rng.random() < 0.8 else "eos",
        })
    return turns, {"final_reward": round(reward_total, 4), "prompt_tokens": pt_total, "generated_tokens": gt_total,
                   "num_invalid": sum(not t["action_valid"] for t in turns),
                   "num_repeated": sum(t["repeated"] for t in turns)}


def synthetic_runs(n_tasks: int = 9, conditions: Sequence[str] = ("C1", "C2"), *, seed: int = 0,
                   max_steps: int = 30, win_rate: float = 0.3, tasks_per_scene: int = 3,
                   heldout_every: int = 3) -> tuple[list[Run], list[dict]]:
    """``(runs, manifest rows)``: ``n_tasks`` eval tasks played under each condition.

    Every ``heldout_every``-th scene is held out. Condition ``i`` plays with its own slips
    and outcome draws (memory conditions win a little more often), so runs differ.
    """
    rng = random.Random(seed)
    scenes, manifest, tasks = {}, [], []
    for t in range(n_tasks):
        s = t // tasks_per_scene
        sid = f"scene_{s:02d}"
        if sid not in scenes:
            scenes[sid] = _Scene(rng, sid)
        sc = scenes[sid]
        obj = rng.choice(list(sc.objects))
        room = rng.choice(sc.rooms)
        objective = f"Bring {obj} to the {room} and drop it there."
        plan = [f"go {d}" for d in list(sc.exits[sc.rooms[0]])[:1]] + [f"take {obj}", f"drop {obj}"]
        row = {"scene_id": sid, "quest_id": f"q{t % tasks_per_scene:02d}", "split": "eval",
               "scene_split": "heldout" if heldout_every and s % heldout_every == heldout_every - 1 else "seen",
               "objective": objective, "quest_length": len(plan), "expert_plan": plan}
        manifest.append(row)
        tasks.append((row, sc, (obj, room)))
    runs = []
    for ci, cond in enumerate(conditions):
        eps, turns, prompts = [], [], []
        for ti, (row, sc, target) in enumerate(tasks):
            trng = random.Random(f"{seed}/{row['scene_id']}/{row['quest_id']}")  # shared by conditions
            grounding = _grounding(trng, sc)
            crng = random.Random(f"{seed}/{row['scene_id']}/{row['quest_id']}/{cond}")
            wins = crng.random() < win_rate + (0.15 if cond in MEMORY_CONDITIONS else 0.0)
            eid = f"ep_eval_{row['scene_id']}_{row['quest_id']}_0"
            play_rng = random.Random(f"{seed}/{eid}")  # same walk for every condition until a slip
            slip = 0.25 + 0.1 * ci
            ts, totals = _play(play_rng, crng, crng.randint(0, 6), sc.copy(), row["objective"], target, wins,
                               max_steps, slip, eid)
            turns += ts
            won = bool(ts and ts[-1]["won"])
            prefs = crng.random() > 0.1
            eps.append({"episode_id": eid, "scene_id": row["scene_id"], "quest_id": row["quest_id"],
                        "split": "eval", "condition": cond, "objective": row["objective"],
                        "question": row["objective"], "choices": [], "ground_truth": " ; ".join(row["expert_plan"]),
                        "final_answer": ts[-1]["command"] if ts else "", "won": won, "preferences_ok": prefs,
                        "is_correct": won and prefs, "num_turns": len(ts), "agent": "llm",
                        "model": "synthetic", "seed": 1000 + ti, "metadata": "{}", **totals})
            memory = _memory_block(crng, cond, sc) if cond in MEMORY_CONDITIONS else ""
            text = TEMPLATE.format(objective=row["objective"], grounding=grounding, memory=memory)
            prompts.append({"task_id": f"{row['scene_id']}/{row['quest_id']}", "scene_id": row["scene_id"],
                            "quest_id": row["quest_id"], "scene_split": row["scene_split"],
                            "objective": row["objective"], "condition": cond, "system_prompt": text,
                            "memory_block": memory, "injected": bool(memory), "gate_ok": cond != "C1",
                            "gate_reason": "ok" if cond in MEMORY_CONDITIONS else "memory_off",
                            "grounding_files": [f"data/grounding_merged/{row['scene_id']}.md"]})
        runs.append(Run(key=cond, condition=cond, episodes=eps, turns=turns, prompts=prompts,
                        source=f"synthetic (seed {seed})"))
    return runs, manifest


def main(argv: list[str] | None = None) -> int:
    from pipeline.view.load import describe, write_view
    from pipeline.view.model import build_view

    parser = argparse.ArgumentParser(prog="python -m pipeline.view.synthetic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=9, help="eval tasks (default 9: the default run's)")
    parser.add_argument("--conditions", default="C1,C2,C2_silent,C2_placebo", help="comma-separated")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/episodes_synthetic.html"))
    args = parser.parse_args(argv)
    conds = [c for c in args.conditions.split(",") if c]
    runs, manifest = synthetic_runs(args.tasks, conds, seed=args.seed, max_steps=args.max_steps)
    t0 = time.perf_counter()
    pairs = [(c, conds[0]) for c in conds[1:]]
    view = build_view(runs, pairs=pairs, manifest=manifest, max_new_tokens=96,
                      title="Episodes (synthetic): " + " vs ".join(conds), source=f"synthetic, seed {args.seed}")
    path = write_view(view, args.out)
    print(describe(path, view, time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
