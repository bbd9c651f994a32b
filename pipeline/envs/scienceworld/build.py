"""ScienceWorld's ``games``: the variations played, their gold sequences, the splits.

The library behind the ``games`` stage for ``env.name=scienceworld*``::

    result = build_games(cfg, project_root())   # data/games/<task>/<quest>.json, scenes.json, manifest.parquet

The splits come from the engine's own variation lists (``get_variations_train/dev/test``):

- ``generalisation``: a scene is a task (``boil``), a quest one of its variations:
  ``train_variations`` per task from the engine's ``train`` list (quest ``v0007``),
  ``eval_variations`` from ``eval_split`` (``dev`` or ``test``): memory from other
  variations of the same task, evaluated on held-out ones;
- ``adaptation``: a scene is one eval variation (``boil-v0007``: its rooms and things, the
  same in every trial), its quests the eval trial (``v0007``) and its ``trials`` earlier
  trials, the train split (``v0007_t1``, ...): the memory of an eval episode comes from its
  own variation's earlier trials (CLIN, Reflexion), which are the entries of its own scene
  (``memory.same_scene_first``, ``memory.facts=house``), and the grounding merged for it is
  theirs alone. Its eval quest is never in the store (only the train split is), so
  ``memory.exclude_same_quest`` keeps its meaning.

Which variations: a draw from the split's list, seeded from ``(seed, task, split)``
(``numpy.random.default_rng``); a variation whose gold sequence is longer than
``max_gold_length``, or whose gold does not solve the task once its answers to ambiguous
commands are the env's own (:func:`playable_gold`), is replaced by the next one drawn. Every gold sequence is replayed on
the engine before it is written (completes the task with a score of 100, else the
stage fails naming the variation). Each quest's ``game_file`` is a small JSON spec
(task, variation, simplifications, objective, gold) that the env loads.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pipeline.core.conf_schema import Config, SwSetup
from pipeline.core.io import atomic_write_json, write_parquet
from pipeline.core.schemas import SCHEMA_VERSION, canonical_json, json_object, manifest_table
from pipeline.core.seeding import derive_seed, labelled_rng
from pipeline.envs.common import GamesResult
from pipeline.envs.scienceworld.engine import acquire, answering, limits, release, simulator
from pipeline.envs.scienceworld.env import send
from pipeline.envs.scienceworld.world import rooms_of

log = logging.getLogger(__name__)


def quest_id(variation: int, trial: int | None = None) -> str:
    """``v0007`` (a variation), ``v0007_t1`` (its first earlier trial, adaptation)."""
    return f"v{variation:04d}" + (f"_t{trial}" if trial is not None else "")


def scene_id(task: str, setup: SwSetup, variation: int) -> str:
    """``boil`` (generalisation: a scene is a task), ``boil-v0007`` (adaptation: a scene is one
    variation, played in its earlier trials and its eval trial)."""
    return f"{task}-{quest_id(variation)}" if setup == SwSetup.adaptation else task


def _split_variations(sw: Any, task: str, split: str) -> list[int]:
    sw.load(task, 0, "", generateGoldPath=False)
    return {"train": sw.get_variations_train, "dev": sw.get_variations_dev, "test": sw.get_variations_test}[split]()


def playable_gold(gold: list[str]) -> list[str]:
    """The gold sequence as the env plays it: the engine's gold answers an ambiguous command
    with a bare number (its choice in the engine's listing), which an action dict cannot say
    and the env answers by itself (:func:`~pipeline.envs.scienceworld.env.send`), so number
    steps are dropped; whether the result still solves the task is checked by replaying it."""
    return [c for c in gold if not c.strip().isdigit()]


def _gold(task: str, variation: int, sc: Any) -> tuple[list[str] | None, str, list[str]]:
    """``(gold sequence, task description, rooms)``, the gold None when the env cannot play it
    (:func:`playable_gold`); raises when a gold without such answers does not complete the task. In a JVM
    of its own (``sc``: ``env.scienceworld``'s limits): the gold names objects as the engine does in a fresh
    JVM, where the env plays it."""
    sw = acquire(fresh=True, **limits(sc))
    try:
        with answering(sw, f"games: task {task!r} variation {variation}"):
            return _gold_in(sw, task, variation, sc.simplifications)
    finally:
        release(sw, stop=True)


def _gold_in(sw: Any, task: str, variation: int, simplifications: str) -> tuple[list[str] | None, str, list[str]]:
    sw.load(task, variation, simplifications, generateGoldPath=True)
    raw = [str(c) for c in sw.get_gold_action_sequence()]
    if raw and raw[0].startswith("ERROR"):
        raise RuntimeError(f"ScienceWorld task {task!r} variation {variation}: no gold sequence ({raw[0]})")
    gold = playable_gold(raw)
    objective = str(sw.get_task_description())
    rooms = rooms_of(sw.getObjectTree())
    sw.load(task, variation, simplifications, generateGoldPath=False)
    sw.server.step("look around")
    for command in gold:
        send(sw, command)  # as the env plays it (an ambiguous command's answer included)
    score = int(round(100 * sw.server.getScore()))
    if not (sw.server.getCompleted() and score == 100):
        if any(c.strip().isdigit() for c in raw):  # it answered the engine's question in the engine's order
            return None, "", []
        raise RuntimeError(f"ScienceWorld task {task!r} variation {variation}: its gold sequence ({len(gold)} steps) "
                           f"ends with score {score}, completed={bool(sw.server.getCompleted())}: not a solved task")
    return gold, objective, rooms


def _draw(sw: Any, cfg: Config, task: str, split: str, n: int) -> list[tuple[int, list[str], str, list[str]]]:
    """``n`` variations of ``split`` (seeded draw; those with too long a gold skipped) with their gold."""
    sc = cfg.env.scienceworld
    pool = list(_split_variations(sw, task, split))
    order = labelled_rng(cfg.seed, "scienceworld", task, split).permutation(len(pool))
    out = []
    for i in order:
        if len(out) == n:
            break
        v = int(pool[int(i)])
        gold, objective, rooms = _gold(task, v, sc)
        if gold is None or (sc.max_gold_length and len(gold) > sc.max_gold_length):
            continue
        out.append((v, gold, objective, rooms))
    if len(out) < n:
        raise ValueError(f"env.scienceworld: task {task!r} has only {len(out)} {split} variations with a playable gold "
                         f"sequence of at most env.scienceworld.max_gold_length={sc.max_gold_length} steps, "
                         f"{n} wanted (raise max_gold_length or lower the count)")
    return sorted(out)


def plan_games(cfg: Config) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """``(scenes, manifest rows, specs by game file)`` of the configured tasks."""
    sc = cfg.env.scienceworld
    for key, value in (("eval_variations", sc.eval_variations), ("train_variations", sc.train_variations),
                       ("trials", sc.trials), ("max_gold_length", sc.max_gold_length)):
        if value < 0:
            raise ValueError(f"params key env.scienceworld.{key}={value}: expected >= 0")
    if not sc.tasks:
        raise ValueError("params key env.scienceworld.tasks is empty: name at least one ScienceWorld task")
    with simulator(**limits(sc)) as sw, answering(sw, "games: the tasks' variation lists"):
        return _plan(cfg, sw)


def _plan(cfg: Config, sw: Any) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    sc = cfg.env.scienceworld
    known = set(sw.get_task_names())
    unknown = [t for t in sc.tasks if t not in known]
    if unknown:
        raise ValueError(f"params key env.scienceworld.tasks: unknown task(s) {unknown}; the engine has "
                         f"{', '.join(sorted(known))}")
    scenes: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    specs: dict[str, dict[str, Any]] = {}

    def add(task: str, qid: str, split: str, engine_split: str, v: int, gold: list[str], objective: str) -> None:
        game_file = f"{cfg.paths.games}/{task}/{qid}.json"
        specs[game_file] = {"task": task, "variation": v, "simplifications": sc.simplifications,
                            "objective": objective, "gold": gold}
        rows.append({
            "scene_id": scene_id(task, sc.setup, v), "quest_id": qid, "split": split, "scene_split": "seen", "objective": objective,
            "quest_length": len(gold), "expert_plan": gold, "game_file": game_file, "scene_seed": v,
            "quest_seed": derive_seed(cfg.seed, task, qid), "preferences": [],
            "metadata": canonical_json({"task": task, "variation": v, "engine_split": engine_split,
                                        "setup": str(sc.setup), "simplifications": sc.simplifications}),
        })

    for task in sc.tasks:
        evals = _draw(sw, cfg, task, str(sc.eval_split), sc.eval_variations)
        rooms: list[str] = []
        for v, gold, objective, task_rooms in evals:
            add(task, quest_id(v), "eval", str(sc.eval_split), v, gold, objective)
            rooms = rooms or task_rooms
            if sc.setup == SwSetup.adaptation:
                for k in range(1, sc.trials + 1):
                    add(task, quest_id(v, k), "train", str(sc.eval_split), v, gold, objective)
                sid = scene_id(task, sc.setup, v)
                scenes[sid] = {"scene_id": sid, "task": task, "rooms": task_rooms, "preferences": []}
        if sc.setup == SwSetup.generalisation:
            for v, gold, objective, task_rooms in _draw(sw, cfg, task, "train", sc.train_variations):
                add(task, quest_id(v), "train", "train", v, gold, objective)
                rooms = rooms or task_rooms
            scenes[task] = {"scene_id": task, "task": task, "rooms": rooms, "preferences": []}
    rows.sort(key=lambda r: (r["scene_id"], r["quest_id"], r["split"]))
    return scenes, rows, specs


def _task_of(row: dict[str, Any]) -> str:
    """The engine task a manifest row plays (its metadata's ``task``)."""
    return str(json_object(row.get("metadata"))["task"])


def games_metrics(rows: list[dict[str, Any]], scenes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Counts and gold lengths (the deterministic part of metrics/games.json)."""
    def mean(xs):
        return round(sum(xs) / len(xs), 4) if xs else None

    return {
        "num_scenes": len(scenes),
        "num_heldout_scenes": 0,
        "num_games": len(rows),
        "num_train": sum(r["split"] == "train" for r in rows),
        "num_eval": sum(r["split"] == "eval" for r in rows),
        "num_eval_heldout": 0,
        "mean_quest_length": mean([r["quest_length"] for r in rows]),
        "mean_quest_length_train": mean([r["quest_length"] for r in rows if r["split"] == "train"]),
        "mean_quest_length_eval": mean([r["quest_length"] for r in rows if r["split"] == "eval"]),
        "max_quest_length": max((r["quest_length"] for r in rows), default=None),
        "quest_types": {t: sum(_task_of(r) == t for r in rows) for t in sorted({_task_of(r) for r in rows})},
    }


def build_games(cfg: Config, root, *, progress: bool = True) -> GamesResult:
    """Draw, verify and write the variations (module docstring); returns what was written."""
    games_dir = root / cfg.paths.games
    t0 = time.perf_counter()
    scenes, rows, specs = plan_games(cfg)
    for game_file, spec in specs.items():
        atomic_write_json(root / game_file, spec)
    write_parquet(manifest_table(rows), games_dir / "manifest.parquet", sort_by=["scene_id", "quest_id"],
                  schema_version=SCHEMA_VERSION)
    atomic_write_json(games_dir / "scenes.json", scenes)
    metrics = games_metrics(rows, scenes)
    metrics["plan_wall_s"] = round(time.perf_counter() - t0, 2)  # wall-clock only in metrics
    atomic_write_json(root / cfg.paths.metrics / "games.json", metrics)
    log.info("wrote %d ScienceWorld variations of %d tasks, %s", len(rows), len(scenes), games_dir / "manifest.parquet")
    return GamesResult(root=root, games_dir=games_dir, scenes=scenes, rows=rows, metrics=metrics)
