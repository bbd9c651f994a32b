"""The default policy's demonstrations as a library product (stage ``demos``, folder ``data/demos``).

Built from the games only (:mod:`pipeline.policy.demos`: a rule agent's train episodes ->
grounding and episodic store -> expert demonstrations -> the ``llm`` agent's chat
messages), written to ``paths.demos`` and read back by the ``policy`` stage, which trains
on them and measures the model with the same grounding and store. The demonstrations
depend on the policy's own config (``policy``, ``demos.advisory_variants``), never
on the experiment's list of conditions. Files::

    turns.parquet          every demonstration turn: variant, chat messages, expert answer, train flag
    grounding.json         scene_id -> merged grounding Markdown of the rule agent's episodes
    store/                 the episodic store of those episodes (pipeline.memory.write_store)
    summary.json           demonstration counts and the rule agent's success (training.json's
                           ``demos`` and ``rule_agent_episodes``)

::

    demo_set = build_demo_set(cfg, root, manifest, scenes)
    write_demo_set(demo_set, out_dir)
    demo_set = load_demo_set(out_dir, tie_seed=cfg.seed)   # turns, memory (grounding + store), summary
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa

from pipeline.core.conf_schema import Config, PolicyConfig
from pipeline.core.config import ConfigError
from pipeline.core.io import atomic_write_json, read_json, read_parquet, write_parquet
from pipeline.core.parallel import stage_workers
from pipeline.memory import load_store, write_store
from pipeline.policy.demo_workers import demo_pool
from pipeline.policy import later_turns
from pipeline.policy.statements import INDICES_PER_JOB, houses_for, statement_drills
from pipeline.policy.demos import (
    HOUSES_PER_JOB,
    RULE_TASKS_PER_JOB,
    RenderedTurn,
    SceneMemory,
    build_scene_memory,
    demo_stats,
    play_demos,
    render_demos,
)

TURNS_FILE = "turns.parquet"
GROUNDING_FILE = "grounding.json"
STORE_DIR = "store"
SUMMARY_FILE = "summary.json"

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
TURNS_SCHEMA = pa.schema([
    ("demo_id", pa.string()),
    ("turn_index", pa.int32()),
    ("variant", pa.string()),  # prompt variant: plain | grounded, +<advisory variant> when a block is in
    ("messages", pa.list_(MESSAGE_TYPE)),  # the llm agent's chat messages of the turn (system, user)
    ("response", pa.string()),  # the expert's answer (reasoning line + JSON action)
    ("train", pa.bool_()),  # False: a slip the expert recovers from (not learned)
])


@dataclass
class DemoSet:
    """The demonstrations and what the policy step needs beside them.

    Attributes:
        turns: every demonstration turn, in demonstration order (the order the tokenizer
            is trained on).
        memory: the scene grounding and episodic store the demonstrations' prompts were
            built from (the quality evaluation's ``memory`` prompts use them too).
        summary: ``{"demos": ..., "rule_agent_episodes": ...}`` for ``training.json``.
        run: how this build ran (``workers``, wall seconds per step): for the stage's
            metrics only, never written to ``data/demos`` (empty when read back).
    """

    turns: list[RenderedTurn]
    memory: SceneMemory
    summary: dict
    run: dict = field(default_factory=dict)


def rule_agent_summary(policy_cfg: PolicyConfig, episodes: Sequence[Mapping[str, Any]]) -> dict:
    """The rule agent's episode count and success rate (``training.json``)."""
    return {"agent": str(policy_cfg.rule_agent), "episodes": len(episodes),
            "success_rate": round(sum(e["is_correct"] for e in episodes) / max(1, len(episodes)), 6)}


def demo_workers(cfg: Config, manifest: Sequence[Mapping[str, Any]]) -> int:
    """The processes :func:`build_demo_set` uses: ``workers`` (:mod:`pipeline.core.parallel`), at
    most one per job of its largest step (the train quests, the chunks of generated houses)."""
    pol = cfg.policy
    n_train = sum(r["split"] == "train" for r in manifest)
    n_houses = max(0, pol.generated_houses) + max(0, pol.generated_drills)
    return stage_workers(cfg, limit=max(n_train, math.ceil(n_train / RULE_TASKS_PER_JOB),
                                        math.ceil(n_houses / HOUSES_PER_JOB),
                                        math.ceil(houses_for(pol.statement_drills) / INDICES_PER_JOB),
                                        math.ceil(later_turns.houses_for(pol.later_drills) / INDICES_PER_JOB)))


def build_demo_set(cfg: Config, root: Path, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any], *,
                   memory_progress: Callable[[int], None] | None = None,
                   demo_progress: Callable[[int], None] | None = None,
                   drill_progress: Callable[[int], None] | None = None,
                   later_progress: Callable[[int], None] | None = None) -> DemoSet:
    """Rule agent episodes -> grounding and store -> expert demonstrations -> rendered turns, then
    ``policy.statement_drills`` statement drills (:mod:`pipeline.policy.statements`) and
    ``policy.later_drills`` drills of later turns (:mod:`pipeline.policy.later_turns`).

    The episodes and demonstrations are played in :func:`demo_workers` processes
    (:func:`pipeline.policy.demo_workers.demo_pool`): the same bytes for any number.

    Raises:
        ConfigError: the manifest has no train quests.
    """
    if not any(r["split"] == "train" for r in manifest):
        raise ConfigError("the games manifest has no train quests to demonstrate (env.train_quests_per_scene=0?)")
    n = demo_workers(cfg, manifest)
    wall: dict[str, float] = {}
    t = time.perf_counter()
    with demo_pool(cfg, root, manifest, scenes, workers=n) as pool:
        wall["start_s"] = time.perf_counter() - t
        t = time.perf_counter()
        memory = build_scene_memory(cfg, root, manifest, scenes, progress=memory_progress, workers=pool)
        wall["memory_s"] = time.perf_counter() - t
        t = time.perf_counter()
        demos = play_demos(cfg, root, manifest, scenes, memory, progress=demo_progress, workers=pool)
        wall["demos_s"] = time.perf_counter() - t
        t = time.perf_counter()
        drills = statement_drills(cfg, manifest, scenes, memory, int(cfg.policy.statement_drills), workers=pool,
                                  progress=drill_progress)
        wall["statement_drills_s"] = time.perf_counter() - t
        t = time.perf_counter()
        later = later_turns.later_drills(cfg, manifest, scenes, memory, int(cfg.policy.later_drills), workers=pool,
                                         progress=later_progress)
        wall["later_drills_s"] = time.perf_counter() - t
        t = time.perf_counter()
    wall["stop_s"] = time.perf_counter() - t
    t = time.perf_counter()
    turns = render_demos(cfg, demos) + drills + later  # the drills are rendered where they are drawn
    wall["render_s"] = time.perf_counter() - t
    summary = {"demos": {**demo_stats(demos, turns), **({"statement_drills": len(drills)} if drills else {}),
                         **({"later_drills": len(later)} if later else {})},
               "rule_agent_episodes": rule_agent_summary(cfg.policy, memory.episodes)}
    return DemoSet(turns=turns, memory=memory, summary=summary,
                   run={"workers": n, "wall_s": {k: round(v, 3) for k, v in wall.items()}})


def turns_table(turns: Sequence[RenderedTurn]) -> pa.Table:
    """``turns.parquet``'s table, rows in demonstration order."""
    cols = {
        "demo_id": [t.demo_id for t in turns],
        "turn_index": [t.turn_index for t in turns],
        "variant": [t.variant for t in turns],
        "messages": [[{"role": m["role"], "content": m["content"]} for m in t.messages] for t in turns],
        "response": [t.response for t in turns],
        "train": [t.train for t in turns],
    }
    return pa.table({f.name: pa.array(cols[f.name], type=f.type) for f in TURNS_SCHEMA}, schema=TURNS_SCHEMA)


def write_demo_set(demo_set: DemoSet, out_dir: Path) -> None:
    """Write the demonstration files into ``out_dir`` (the stage swaps the folder in whole)."""
    out = Path(out_dir)
    write_parquet(turns_table(demo_set.turns), out / TURNS_FILE, schema_version="1")  # kept in order
    atomic_write_json(out / GROUNDING_FILE, demo_set.memory.grounding)
    write_store(demo_set.memory.store, out / STORE_DIR)
    atomic_write_json(out / SUMMARY_FILE, demo_set.summary)


def load_demo_set(demo_dir: Path, *, tie_seed: int) -> DemoSet:
    """Read what :func:`write_demo_set` wrote (the store with retrieval ties seeded by ``tie_seed``)."""
    d = Path(demo_dir)
    turns = [RenderedTurn(r["demo_id"], int(r["turn_index"]), r["variant"], list(r["messages"]), r["response"],
                          bool(r["train"]))
             for r in read_parquet(d / TURNS_FILE).to_pylist()]
    memory = SceneMemory(grounding=dict(read_json(d / GROUNDING_FILE)),
                         store=load_store(d / STORE_DIR, tie_seed=int(tie_seed)))
    return DemoSet(turns=turns, memory=memory, summary=read_json(d / SUMMARY_FILE))
