"""Experience: the eval tasks replayed with what the first k past episodes of each scene left.

A learning curve (Reflexion, CLIN, ExpeL report one) asks how an agent does as experience
accumulates. Here the experience is the collected train episodes: for ``k`` past episodes
per scene, the grounding is merged from the first ``k`` episodes of each seen scene (the
``ground`` stage's per-episode files, merged as the ``merge`` stage merges them) and the
episodic store keeps the entries of those episodes only (the ``store`` stage's entries,
filtered). Every condition's prompts are rendered from them exactly as the ``render`` stage
renders them (with its evidence checks) and an agent plays them (the reader by default: a
condition's information ceiling, in seconds)::

    points = experience_curve(cfg, root, ks=[0, 1, 2, 4], conditions=["C1", "C2"])
    # [CurvePoint(k=0, condition="C1", outcomes=[Outcome(task, success, turns), ...]), ...]

"First" is collection order (quest id within a scene), the order the ``collect`` stage's
online loop plays them in: the ``k``-th episode of a scene was itself prompted with the
grounding of the ``k - 1`` before it. Held-out scenes have no episodes of their own: their
memory is the other houses' (``k`` each).

The work is a partition fixed by the config: every ``k``'s merge and render (a job a
``k``), then every point's play (a job a (``k``, condition) pair, fresh factories each; a
point whose prompts are all an earlier point's is that point's episodes, played once). It
runs in ``workers`` spawn processes (:class:`pipeline.core.parallel.OrderedPool`), each job
whole in one of them, the results taken back in job order: the same bytes for any worker
count.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from omegaconf import OmegaConf
from tqdm import tqdm

from pipeline.agents import plays_with_model
from pipeline.agents.llm import SharedBackend
from pipeline.conditions.length import BlockLength
from pipeline.conditions.render import render_conditions
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError
from pipeline.core.facts import FactReader, WorldWords
from pipeline.core.io import read_json, read_parquet
from pipeline.core.parallel import OrderedPool, stage_workers
from pipeline.grounding.scenes import merge_groundings, write_merge_outputs
from pipeline.llm.backends import is_local
from pipeline.memory import EpisodicStore
from pipeline.session.collection import load_games, make_factories
from pipeline.session.evaluation import reader_config
from pipeline.session.rollout import Task, play, tasks_from_manifest


@dataclass(frozen=True)
class Outcome:
    """One eval task's episode at one curve point."""

    scene_id: str
    quest_id: str
    scene_split: str
    success: bool
    turns: int


@dataclass(frozen=True)
class CurvePoint:
    """Every eval task of one condition, played with the memory of ``k`` past episodes per scene.

    Attributes:
        k: past episodes per seen scene asked for; ``held``: how many the scenes held at
            most (fewer when a scene has fewer episodes than ``k``).
        injected: tasks whose prompt carried a memory block.
    """

    k: int
    held: int
    condition: str
    outcomes: tuple[Outcome, ...]
    injected: int

    @property
    def success(self) -> float:
        return float(np.mean([o.success for o in self.outcomes])) if self.outcomes else 0.0

    @property
    def turns(self) -> float:
        return float(np.mean([o.turns for o in self.outcomes])) if self.outcomes else 0.0


def first_episodes(episodes: Iterable[Mapping[str, Any]], k: int) -> list[str]:
    """The ids of the first ``k`` episodes of every scene (quest id order, then episode id)."""
    if k < 0:
        raise ValueError(f"k={k}: expected >= 0 past episodes per scene")
    by_scene: dict[str, list[tuple[str, str]]] = {}
    for ep in episodes:
        by_scene.setdefault(str(ep["scene_id"]), []).append((str(ep["quest_id"]), str(ep["episode_id"])))
    return sorted(eid for rows in by_scene.values() for _, eid in sorted(rows)[:k])


def store_subset(store: EpisodicStore, episode_ids: Iterable[str]) -> EpisodicStore:
    """The store's entries of the given episodes only (same order, same tie seed)."""
    keep = pa.array(sorted(set(episode_ids)), pa.string())
    ids = pc.struct_field(store.table.column("provenance"), "episode_id")
    return EpisodicStore(store.table.filter(pc.is_in(ids, value_set=keep)), tie_seed=store.tie_seed)


def grounding_subset(index: Mapping[str, Any], episode_ids: Iterable[str]) -> dict:
    """The ``ground`` stage's ``index.json`` with only the given episodes."""
    keep = set(episode_ids)
    return {**index, "episodes": [e for e in index.get("episodes", []) if e.get("episode_id") in keep]}


def merge_at(cfg: Config, root: Path, index: Mapping[str, Any], episode_ids: Sequence[str], out_dir: Path) -> Path:
    """Merge the grounding of ``episode_ids`` per scene into ``out_dir`` (the ``merge``
    stage's layout); returns ``out_dir``."""
    g = cfg.grounding
    scenes, configured = merge_groundings(grounding_subset(index, episode_ids), str(cfg.paths.grounding),
                                          g.files if isinstance(g.files, str) else list(g.files or []), root=root,
                                          dedupe_contents=g.dedupe_contents)
    write_merge_outputs(scenes, configured, out_dir, g.merge_format)
    return out_dir


def play_prompts(cfg: Config, root: Path, tasks: Sequence[Task], rows: Sequence[Mapping[str, Any]],
                 scenes: Mapping[str, Any], shared: SharedBackend | None = None) -> list[dict]:
    """Play ``tasks`` with the prompts of ``rows`` (one per task), greedy as ``evaluate`` plays;
    returns the episode records (nothing written). ``shared``: the loaded model to play with
    (a caller that plays many batches loads it once; None: loaded for this call)."""
    by_task = {(r["scene_id"], r["quest_id"]): r for r in rows}
    played = []
    for t in tasks:
        row = by_task[(t.scene_id, t.quest_id)]
        played.append(Task(**{**t.__dict__, "system_prompt": row["system_prompt"], "metadata": {}}))
    if cfg.experiment.eval_greedy:
        cfg = OmegaConf.merge(cfg, {"sampling": {"do_sample": False}})
    make_env, make_agent, make_user = make_factories(cfg, root, dict(scenes), shared=shared)
    return play(list(played), make_env=make_env, make_agent=make_agent, make_user=make_user,
                batch_size=cfg.agent.batch_size if cfg.agent.batched else 1, agent_name=str(cfg.agent.name),
                preference_in_success=cfg.user.preference_in_success,
                unknown_feedback=str(cfg.grounding.unknown_type))


def experience_curve(cfg: Config, root: Path, *, ks: Sequence[int], conditions: Sequence[str],
                     episodes: Sequence[Mapping[str, Any]], grounding_index: Mapping[str, Any],
                     store: EpisodicStore, work_dir: Path, length: BlockLength | None = None,
                     words: WorldWords | None = None, facts: FactReader | None = None, reader: bool = True,
                     progress: bool = True, workers: int | None = None) -> list[CurvePoint]:
    """Every condition's eval tasks played with the first ``k`` past episodes of each scene, for each ``k``.

    Args:
        cfg: the composed config (its ``condition`` section names the conditions).
        root: the project root (games, templates, grounding files).
        ks: past episodes per scene (each >= 0).
        conditions: which of ``cfg.condition`` to play (the rest are rendered for the checks).
        episodes: the collected episodes (rows of ``episodes.parquet``).
        grounding_index: the ``ground`` stage's ``index.json``.
        store: the full episodic store (the ``store`` stage's).
        work_dir: where each ``k``'s merged grounding is written (``<work_dir>/k<k>``),
            relative to ``root`` or absolute inside it.
        length: a memory block's length (the placebo matches C2's in it; the ``render``
            stage's :func:`~pipeline.conditions.length.block_length_for`).
        words: the world's words (:func:`pipeline.envs.world_words`).
        facts: the world's fact reader (:func:`pipeline.envs.fact_reader`: the memory's lessons).
        reader: play with the ``reader`` agent (else ``cfg.agent``).
        workers: processes the points are played in (None: :func:`curve_workers`, from the
            config's ``workers``); the points are the same bytes for any count.

    Raises:
        ConfigError: an unknown condition or a negative ``k``.
    """
    unknown = [c for c in conditions if c not in cfg.condition]
    if unknown:
        raise ConfigError(f"experience curve: {', '.join(unknown)} not configured (condition: {', '.join(cfg.condition)})")
    if any(int(k) < 0 for k in ks):
        raise ConfigError(f"experience curve: ks={list(ks)}: expected counts >= 0")
    manifest, scenes = load_games(root, cfg)
    tasks = tasks_from_manifest(manifest, split=cfg.experiment.eval_split, master_seed=cfg.seed)
    if not tasks:
        raise ConfigError(f"no tasks in split experiment.eval_split={cfg.experiment.eval_split!r}")
    info = {(r["scene_id"], r["quest_id"]): r for r in manifest}
    rows = [info[(t.scene_id, t.quest_id)] for t in tasks]
    play_cfg = reader_config(cfg) if reader else cfg
    work = work_dir if work_dir.is_absolute() else root / work_dir
    per_scene: dict[str, int] = {}
    for ep in episodes:
        per_scene[str(ep["scene_id"])] = per_scene.get(str(ep["scene_id"]), 0) + 1
    ks = [int(k) for k in ks]
    num_points = len(ks) * len(conditions)
    n = curve_workers(play_cfg, num_points) if workers is None else max(1, min(int(workers), num_points or 1))
    ctx = {"cfg": cfg, "play_cfg": play_cfg, "root": root, "tasks": list(tasks), "scenes": dict(scenes),
           "rows": rows, "conditions": list(conditions), "episodes": list(episodes),
           "grounding_index": grounding_index, "store": store, "work": work, "length": length or BlockLength(),
           "words": words, "facts": facts}
    bar = tqdm(total=num_points, desc=f"experience curve ({n} worker{'s' if n != 1 else ''})", unit="point",
               file=sys.stderr, disable=not progress)
    points: list[CurvePoint] = []
    for k, cond, prompt_rows, records in _curve_jobs(ctx, ks, n, progress=lambda _: bar.update(1)):
        held = min(k, max(per_scene.values(), default=0))
        outcomes = tuple(Outcome(t.scene_id, t.quest_id, str(info[(t.scene_id, t.quest_id)].get("scene_split") or ""),
                                 bool(r["episode"]["is_correct"]), int(r["episode"]["num_turns"]))
                         for t, r in zip(tasks, records))
        points.append(CurvePoint(k, held, cond, outcomes, sum(bool(p["injected"]) for p in prompt_rows)))
    bar.close()
    return points


def curve_workers(play_cfg: Config, num_points: int) -> int:
    """Processes the points are played in: ``workers`` (:mod:`pipeline.core.parallel`), at most
    one per point; one (this process) for a model behind a server, whose throughput is the
    server's (as :func:`pipeline.session.collection.worker_count` rules for ``evaluate``)."""
    if plays_with_model(play_cfg.agent) and not is_local(play_cfg.model):
        return 1
    return stage_workers(play_cfg, limit=max(1, num_points))


def _render_at(ctx: Mapping[str, Any], k: int) -> list[list]:
    """Merge the grounding of the first ``k`` episodes of each scene into ``<work>/k<k>`` and
    render every condition from it (the ``render`` stage's checks); each condition's prompt rows."""
    cfg, root = ctx["cfg"], ctx["root"]
    keep = first_episodes(ctx["episodes"], k)
    merged = merge_at(cfg, root, ctx["grounding_index"], keep, ctx["work"] / f"k{k}")
    rel = merged.relative_to(root) if merged.is_relative_to(root) else merged
    cfg_k = OmegaConf.merge(cfg, {"paths": {"grounding_merged": str(rel)}})
    rendered = render_conditions(ctx["rows"], ctx["conditions"], cfg_k, store_subset(ctx["store"], keep), root,
                                 ctx["length"], ctx["words"], ctx["facts"])
    return [rendered[cond][0] for cond in ctx["conditions"]]


def _play_at(ctx: Mapping[str, Any], prompt_rows: list) -> list[dict]:
    """One point: every task played with its prompt row; the episode records (turns and tensors dropped)."""
    records = play_prompts(ctx["play_cfg"], ctx["root"], ctx["tasks"], prompt_rows, ctx["scenes"])
    return [{"episode": r["episode"]} for r in records]


def _curve_jobs(ctx: dict, ks: list[int], workers: int,
                progress: Callable[[Any], None] | None = None) -> list[tuple[int, str, list, list[dict]]]:
    """``(k, condition, prompt rows, records)`` of every point, ``k`` major, in that order;
    ``progress(records)`` as each point's play finishes.

    Two phases of a partition fixed by the config: every ``k``'s merge and render (a job a
    ``k``), then every point's play (a job a (``k``, condition)). With one worker they run
    here; else in ``workers`` spawn processes (:class:`pipeline.core.parallel.OrderedPool`),
    each job whole in whichever is free and taken back in job order. A job reads only the
    run's inputs (fresh factories per point), so where it runs changes no byte.
    """
    conditions = ctx["conditions"]
    play_cfg = ctx["play_cfg"]
    # each worker pinned as configured (single-threaded, before torch loads); a block length
    # measured in a model's tokens loads that tokenizer at its first use
    with OrderedPool(workers, context=ctx, numerics=play_cfg.numerics,
                     load_torch=plays_with_model(play_cfg.agent) and is_local(play_cfg.model)) as pool:
        rendered = pool.map(_render_at, ks)
        points = [(k, cond, prompt_rows) for k, by_cond in zip(ks, rendered)
                  for cond, prompt_rows in zip(conditions, by_cond)]
        # A point whose every task has the prompt of an earlier point is that point's episodes
        # (a task's episode is a function of its prompt and its seed): played once (C0 at every
        # k; every condition at k=0, where there is nothing to remember yet).
        first: dict[tuple, int] = {}
        plays = [first.setdefault(_prompts_key(p[2]), i) for i, p in enumerate(points)]
        unique = sorted(set(plays))
        done = dict(zip(unique, pool.map(_play_at, [points[i][2] for i in unique], progress=progress)))
        if progress is not None:
            for _ in range(len(points) - len(unique)):  # the points an earlier point played
                progress(None)
    return [(k, cond, prompt_rows, done[plays[i]]) for i, (k, cond, prompt_rows) in enumerate(points)]


def _prompts_key(prompt_rows: Sequence[Mapping[str, Any]]) -> tuple:
    """What decides a point's episodes: each task's prompt (the tasks and seeds are every point's)."""
    return tuple((r["scene_id"], r["quest_id"], r["system_prompt"]) for r in prompt_rows)


def load_experience(root: Path, cfg: Config) -> tuple[list[dict], dict]:
    """The collected episodes and the ground stage's index (what :func:`experience_curve` reads)."""
    episodes = read_parquet(root / cfg.paths.episodes / "episodes.parquet").to_pylist()
    return episodes, read_json(root / cfg.paths.grounding / "index.json")
