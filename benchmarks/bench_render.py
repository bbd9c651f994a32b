"""Rendering throughput: system prompts per second (issue 6's benchmark; target >= 10,000/s).

    python -m benchmarks.bench_render            # or: python benchmarks/bench_render.py
    python -m benchmarks.bench_render --n 50000 --json

A realistic prompt: the fuller ``conf/templates/system_default.txt``, a merged grounding
(two JSON files + one TXT file, seed 000's merge), an exposed advisory slot with three
advisories (seed 001), seed 002 4.2's nested memory dict plus a plan list, and an
observation that changes every turn. Measured paths:

- ``get_system_prompt``: the whole per-turn render the llm agent does (grounding merged
  once and cached by file stat, as in an episode);
- ``render_turn``: filling a frozen per-episode prompt (what the render stage stores);
- ``freeze``: one per-episode render (what the render stage does per task);
- ``render_memory_value``: the nested memory dict alone.

Figures are rates from one run on this machine (best of ``--repeats``); nothing asserts them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/bench_render.py`
    sys.path.insert(0, str(ROOT))

from pipeline.prompts import PromptOrganizer, render_memory_value  # noqa: E402

MEMORY = {
    "previous_action": "open Fridge_0",
    "task_process": {
        "status": "in_progress",
        "current_subgoal_id": 1,
        "subgoals": [
            {"subgoal_id": 1, "subgoal_type": "navigation", "target": "Kitchen",
             "explicit_completion_condition": "agent_location is Kitchen", "subgoal_status": "done"},
            {"subgoal_id": 2, "subgoal_type": "manipulation", "target": "Apple_2",
             "explicit_completion_condition": "Apple_2 in Fridge_0", "subgoal_status": "in_progress"},
            {"subgoal_id": 3, "subgoal_type": "manipulation", "target": "Fridge_0",
             "explicit_completion_condition": "Fridge_0 is closed", "subgoal_status": "pending"},
        ],
    },
    "plan": ["take Apple_2", "put Apple_2 in Fridge_0", "close Fridge_0"],
    "spatial_description": "Kitchen is east of the Bedroom. Fridge_0 and Cabinet_0 are in the Kitchen.",
    "notes": "Key_1 opens Cabinet_0. Do not examine Drawer_1 again.",
}


def _bundle() -> dict:
    msg = ("When a container is locked, look for its key in the other rooms before trying to open it; "
           "episodes that unlocked first finished in fewer steps. Close containers you opened if the user "
           "prefers them closed. ")
    return {
        "schema_version": "1.1",
        "memory_on": True,
        "retrieved": [
            {"schema_version": "1.1", "advisory_id": f"adv_{i:06d}", "advisory_type": "successful_override",
             "message": msg * 2, "strength": "moderate", "relevance_score": 0.8 - 0.1 * i,
             "evidence": {"source_episode_ids": [f"ep_train_scene_0_q{i}_0"], "risk_tags": ["locked_container"],
                          "principle_id": f"p_{i}"},
             "constraints": {"no_label_hint": True, "no_forcing": True, "no_confidence_boost": True}}
            for i in range(1, 4)
        ],
        "warnings": [],
        "meta": {"memory_mode": "on", "topk": 3, "masked_injection": False, "retrieval_executed": True},
    }


def _grounding_files(folder: Path) -> list[str]:
    paths = []
    for i in range(2):
        doc = {
            "expr_info": {"episode_id": i},
            "grounding_per_step": [],
            "stacked_grounding": {"user_preference": [f"[ Step{i} - Success ] : keep the fridge closed"],
                                  "spatial": [f"[ Step{i} - Failure ] : the kitchen is east of the bedroom"],
                                  "procedural": [], "general": []},
            "final_grounding": {
                "generation_timestamp": "1970-01-01T00:00:00+00:00",
                "user_preference_grounding": {"content": "The user wants the fridge closed after use."},
                "spatial_grounding": {"content": f"The kitchen is east of the bedroom (episode {i})."},
                "procedural_grounding": {"content": "Unlock Cabinet_0 with Key_1 before opening it."},
                "general_grounding_rules": {"content": "Do not examine the same object twice."},
            },
        }
        p = folder / f"grounding_episode_{i}.json"
        p.write_text(json.dumps(doc), encoding="utf-8")
        paths.append(str(p))
    t = folder / "custom.txt"
    t.write_text("Drawer_1 is always empty.\nThe bathroom has no containers.\n", encoding="utf-8")
    paths.append(str(t))
    return paths


def _observations(n: int) -> list[dict]:
    rooms = ["Kitchen", "Bedroom", "Bathroom", "LivingRoom"]
    return [
        {"agent_location": rooms[i % 4], "agent_inventory": ["Key_1"] if i % 2 else [],
         "visible_entities": ["Cabinet_0", "Drawer_1", "Apple_2", "Fridge_0"][: 1 + i % 4],
         "available_actions": ["go_to", "pick_up", "open", "close", "examine", "look", "wait"],
         "admissible_commands": ["go east", "open fridge_0", "take apple_2", "look", "inventory"],
         "description": f"-= {rooms[i % 4]} =- You see a few things here.", "step": i % 30, "max_steps": 30}
        for i in range(n)
    ]


def _rate(fn, n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return n / best


def run(n: int = 20000, repeats: int = 3) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        files = _grounding_files(Path(tmp))
        org = PromptOrganizer({"system_template": "conf/templates/system_default.txt"}, root=ROOT,
                              grounding_file_path=files)
        org.set_variables(objective="Put Apple_2 in Fridge_0 and close it")
        org.set_memory_slot(_bundle(), exposed=True)
        org.set_memory_dict(MEMORY)
        obs = _observations(64)
        prompt = org.get_system_prompt(observation=obs[0])
        frozen = org.freeze_system_prompt()
        assert org.render_turn(frozen, obs[0]) == prompt

        def full(k):
            for i in range(k):
                org.get_system_prompt(observation=obs[i & 63])

        def turn(k):
            for i in range(k):
                org.render_turn(frozen, obs[i & 63])

        def freeze(k):
            for _ in range(k):
                org.freeze_system_prompt()

        def memory(k):
            for _ in range(k):
                render_memory_value(MEMORY)

        return {
            "prompt_chars": len(prompt),
            "get_system_prompt_per_s": round(_rate(full, n, repeats)),
            "render_turn_per_s": round(_rate(turn, n, repeats)),
            "freeze_per_s": round(_rate(freeze, n, repeats)),
            "render_memory_value_per_s": round(_rate(memory, n, repeats)),
            "target_per_s": 10000,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000, help="prompts per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the best is reported")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    res = run(args.n, args.repeats)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"bench_render: realistic system prompt of {res['prompt_chars']} characters "
              "(system_default.txt, merged grounding, 3-advisory slot, nested memory)")
        for key in ("get_system_prompt_per_s", "render_turn_per_s", "freeze_per_s", "render_memory_value_per_s"):
            print(f"  {key:28s} {res[key]:>10,d}")
        verdict = "meets" if res["get_system_prompt_per_s"] >= res["target_per_s"] else "MISSES"
        print(f"  get_system_prompt {verdict} the target of {res['target_per_s']:,d} prompts/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
