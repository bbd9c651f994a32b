"""Build every household game: plan the scenes and quests, compile and verify each game.

The library behind the ``games`` stage (:mod:`pipeline.stages.games`)::

    result = build_games(cfg, project_root())   # games, scenes.json, manifest.parquet, metrics
    result.game_path(result.rows[0])            # absolute path of the first game

Games compile in ``workers`` processes (:mod:`pipeline.core.parallel`); the outputs do not depend on it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pipeline.core.conf_schema import Config
from pipeline.core.io import atomic_write_json, write_parquet
from pipeline.core.parallel import OrderedPool, stage_workers
from pipeline.core.schemas import SCHEMA_VERSION, manifest_table
from pipeline.envs.common import GamesResult
from pipeline.envs.household.games import compile_quest_game, plan_games, scene_stream

log = logging.getLogger(__name__)


def _compile_job(_: None, job: dict[str, Any]) -> dict[str, Any]:
    return compile_quest_game(job)


def compile_games(scenes: dict[str, dict[str, Any]], rows: list[dict[str, Any]], root: Path,
                  workers: int = 1, progress: bool = True) -> list[dict[str, Any]]:
    """Compile and verify every quest's game (in ``workers`` processes, tqdm bar).

    Returns:
        Per-game results sorted by (scene_id, quest_id).

    Raises:
        RuntimeError: a game's expert plan did not replay to ``won`` (names the game).
    """
    jobs = [{"spec": scenes[r["scene_id"]], "row": r, "out": str(root / r["game_file"])} for r in rows]
    bar = tqdm(total=len(jobs), desc="compiling games", unit="game", disable=not progress, file=sys.stderr)
    with OrderedPool(1 if len(jobs) <= 1 else min(workers, len(jobs))) as pool:
        results = pool.map(_compile_job, jobs, progress=lambda _: bar.update())
    bar.close()
    results.sort(key=lambda r: (r["scene_id"], r["quest_id"]))
    bad = [r for r in results if r["error"]]
    if bad:
        r = bad[0]
        raise RuntimeError(f"game {r['scene_id']}/{r['quest_id']}: expert plan failed verification: {r['error']}"
                           + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
    return results


def games_metrics(rows: list[dict[str, Any]], scenes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Counts and quest lengths (deterministic part of metrics/games.json)."""
    def mean(xs):
        return round(sum(xs) / len(xs), 4) if xs else None

    lengths = [r["quest_length"] for r in rows]
    types: dict[str, int] = {}
    for r in rows:
        t = json.loads(r["metadata"])["quest_type"]
        types[t] = types.get(t, 0) + 1
    return {
        "num_scenes": len(scenes),
        "num_heldout_scenes": sum(s["scene_split"] == "heldout" for s in scenes.values()),
        "num_games": len(rows),
        "num_train": sum(r["split"] == "train" for r in rows),
        "num_eval": sum(r["split"] == "eval" for r in rows),
        "num_eval_heldout": sum(r["split"] == "eval" and r["scene_split"] == "heldout" for r in rows),
        "mean_quest_length": mean(lengths),
        "mean_quest_length_train": mean([r["quest_length"] for r in rows if r["split"] == "train"]),
        "mean_quest_length_eval": mean([r["quest_length"] for r in rows if r["split"] == "eval"]),
        "max_quest_length": max(lengths) if lengths else None,
        "quest_types": dict(sorted(types.items())),
    }


def build_games(cfg: Config, root: Path, *, progress: bool = True) -> GamesResult:
    """Plan, compile, verify and write everything the stage outputs under ``root``.

    Writes the game files, then ``scenes.json`` and ``manifest.parquet`` (atomically,
    after every game verified) and ``<paths.metrics>/games.json``.
    """
    env = cfg.env
    if env.min_quest_length < 1:
        raise ValueError(f"params key env.min_quest_length={env.min_quest_length}: expected >= 1")
    games_dir = root / cfg.paths.games
    t0 = time.perf_counter()
    scenes, rows = plan_games(env, seed=cfg.seed, preferences_per_scene=cfg.user.preferences_per_scene,
                              games_dir=cfg.paths.games, stream=scene_stream(cfg))
    plan_s = time.perf_counter() - t0
    log.info("planned %d quests in %d scenes (%.1fs)", len(rows), len(scenes), plan_s)
    t1 = time.perf_counter()
    workers = stage_workers(cfg, limit=len(rows))
    results = compile_games(scenes, rows, root, workers=workers, progress=progress)
    compile_s = time.perf_counter() - t1
    write_parquet(manifest_table(rows), games_dir / "manifest.parquet", sort_by=["scene_id", "quest_id"],
                  schema_version=SCHEMA_VERSION)
    atomic_write_json(games_dir / "scenes.json", scenes)
    metrics = games_metrics(rows, scenes)
    # Wall-clock times only here (metrics are not cached artifacts).
    metrics.update({"compile_workers": workers, "plan_wall_s": round(plan_s, 2),
                    "compile_wall_s": round(compile_s, 2),
                    "mean_game_compile_s": round(sum(r["compile_s"] for r in results) / max(len(results), 1), 3)})
    atomic_write_json(root / cfg.paths.metrics / "games.json", metrics)
    log.info("wrote %d games, %s and %s", len(rows), games_dir / "manifest.parquet", games_dir / "scenes.json")
    return GamesResult(root=root, games_dir=games_dir, scenes=scenes, rows=rows, metrics=metrics)
