"""The streaming protocol (test-time learning): memory that grows while the agent is evaluated.

The frozen protocol (``evaluate``, ``curve``) builds the memory from the collected train
episodes before any eval task is played. The streaming one (ReasoningBank, Agent Workflow
Memory's online mode, Evo-Memory, AgentCL) plays each house's eval tasks in one order, and
every episode's record enters the memory of the tasks after it::

    streams = play_streams(cfg, root, conditions=["C1", "C2"], start=StreamStart.empty)
    # {"C1": [StreamStep(position=0, task=..., prompt_row=..., episode=...), ...], "C2": [...]}

- **The order.** Each scene's eval tasks in one seeded order (:func:`stream_rounds`, from
  ``seed``), the same for every condition; round ``i`` plays the ``i``-th task of every scene
  (scenes stay independent: each one's memory is its own stream's, as each house's is).
- **Each condition its own stream.** A condition's episodes enter *its own* grounding (each
  episode's document, merged per scene as the ``merge`` stage merges) and *its own* episodic
  store (the ``store`` stage's entries) before its next round is rendered, by the library the
  stages use (:func:`pipeline.grounding.episodes.episode_grounding`,
  :func:`pipeline.memory.build.build_store`, :func:`pipeline.conditions.render.render_conditions`
  with its evidence checks). So C1's grounding grows from C1's feedback, C2 reads its own
  episodes, C2_silent retrieves from its own stream and shows nothing, C2_placebo's block is
  drawn from the *other* houses' entries of its own stream (length-matched, as always),
  C2_oracle states the plan as today, C0 has nothing.
- **Where a stream starts** (``experiment.stream.start``): ``empty`` (the field's protocol:
  nothing before the first eval task) or ``collect`` (the frozen protocol's memory, the
  collected train episodes, which the stream then extends).
- **The record.** Every step keeps the prompt row it was played with (the store's hash and
  size, the entries retrieved and injected, the block) and the episode's outcome: a stream
  can be replayed and two streams diffed.
- **Resumable.** Each finished round's episodes are kept under ``work_dir/<key>/<condition>/rounds/``
  (:func:`stream_key`: the config's hash and the inputs'); a stream killed at round ``i`` reruns
  from round ``i``: the rounds before it are read back, their memory rebuilt from them. A played
  round is read back from what was written, as a resumed one is, so both give the same bytes.

Deterministic: a round's prompts are a function of the config and the records of the rounds
before it, and an episode a function of its prompt and seed, so C2_silent's stream is C1's
prompt for prompt (:func:`check_identical_streams`). A stream is one job of ``workers`` spawn
processes (:class:`pipeline.core.parallel.OrderedPool`), taken back in condition order: the
same bytes for any worker count.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any, Mapping, Sequence

from omegaconf import OmegaConf
from tqdm import tqdm

from pipeline.agents import plays_with_model
from pipeline.conditions.length import BlockLength
from pipeline.conditions.render import render_conditions
from pipeline.core.conf_schema import Config, StreamStart
from pipeline.core.config import ConfigError, config_hash, config_subtrees  # the subtrees collection_hash reads
from pipeline.core.facts import FactReader, WorldWords
from pipeline.core.io import atomic_write_text, read_json, read_parquet
from pipeline.core.parallel import OrderedPool
from pipeline.core.schemas import episodes_table, turns_table
from pipeline.core.seeding import labelled_rng
from pipeline.grounding.episodes import episode_grounding, write_ground_outputs
from pipeline.llm.backends import is_local
from pipeline.memory.build import build_store
from pipeline.agents.llm import SharedBackend
from pipeline.session.collection import CHECKPOINT_IGNORED, DERIVED_KEYS, inputs_hash, load_games
from pipeline.session.evaluation import reader_config
from pipeline.session.experience import merge_at, play_prompts
from pipeline.session.rollout import Task, tasks_from_manifest


@dataclass(frozen=True)
class StreamStep:
    """One task of one condition's stream: where it stood, what the prompt held, how it went.

    Attributes:
        position: the task's place in its scene's stream (0: first).
        length: how many tasks the scene's stream has.
        task: the eval task.
        prompt_row: the rendered prompt's row (the ``render`` stage's columns: ``system_prompt``,
            ``memory_block``, ``store_hash``, ``retrieved_entry_ids``, ``injected_entry_ids``, ...).
        store_entries: entries the store held when the prompt was rendered.
        grounding_episodes: episodes of the scene the prompt's grounding was merged from.
        episode: the episode's row (``is_correct``, ``num_turns``, ...).
    """

    position: int
    length: int
    task: Task
    prompt_row: Mapping[str, Any]
    store_entries: int
    grounding_episodes: int
    episode: Mapping[str, Any]


def stream_rounds(tasks: Sequence[Task], seed: int) -> list[list[Task]]:
    """Round ``i``: the ``i``-th task of every scene's stream (scenes by id). A scene's stream is
    its tasks in an order drawn from ``seed`` and the scene id alone, so adding a scene or a
    condition moves no other stream."""
    by_scene: dict[str, list[Task]] = {}
    for t in sorted(tasks, key=lambda t: t.episode_id):
        by_scene.setdefault(t.scene_id, []).append(t)
    orders = [[ts[i] for i in labelled_rng(seed, "stream", scene).permutation(len(ts))]
              for scene, ts in sorted(by_scene.items())]
    return [[t for t in group if t is not None] for group in zip_longest(*orders)]


@dataclass
class _Memory:
    """What a stream has experienced so far: episode rows, their turns, their grounding documents."""

    episodes: list[dict]
    turns: list[dict]
    docs: list[dict]

    def add(self, episode: dict, turns: list[dict], doc: dict) -> None:
        self.episodes.append(episode)
        self.turns.extend(turns)
        self.docs.append(doc)


def start_memory(cfg: Config, root: Path, start: StreamStart) -> _Memory:
    """A stream's memory before its first task: nothing, or the collected train episodes with
    the ``ground`` stage's documents of them (what the frozen protocol's memory is built from)."""
    if start == StreamStart.empty:
        return _Memory([], [], [])
    episodes = read_parquet(root / cfg.paths.episodes / "episodes.parquet").to_pylist()
    turns = read_parquet(root / cfg.paths.episodes / "turns.parquet").to_pylist()
    index = read_json(root / cfg.paths.grounding / "index.json")
    docs = [read_json(root / cfg.paths.grounding / e["json"]) for e in index.get("episodes", [])]
    return _Memory(episodes, turns, docs)


# The config a stream's steps are a function of (besides its input files): the ``stream`` stage's
# params without the analysis's keys, and of ``experiment.stream`` only where it starts (each
# condition's stream is its own, whichever others a run plays). Read as subtrees, never the
# whole config (the stage reads only what its params list: ``python -m pipeline.tools.deps record``).
STREAM_KEYS = ("seed", "env.name", "env.max_steps", "env.reward", "user", "agent", "model", "sampling", "numerics",
               "prompts", "memory", "condition", "grounding", "experiment.eval_split", "experiment.eval_greedy",
               "experiment.stream.start")


def stream_key(cfg: Config, play_cfg: Config, root: Path, tasks: Sequence[Task], memory: _Memory) -> str:
    """``<config hash>-<inputs hash>``: the folder a run's stream checkpoints are kept in, so that
    a changed config, game, template, model, ``pipeline`` source or start memory never resumes
    from another run's rounds (:func:`pipeline.session.collection.inputs_hash`; the start memory
    by its content)."""
    start = hashlib.sha256(json.dumps([memory.episodes, memory.turns, memory.docs], sort_keys=True,
                                      ensure_ascii=False, default=str).encode("utf-8")).hexdigest()
    inputs = hashlib.sha256(f"{inputs_hash(play_cfg, root, list(tasks))}-{start}".encode()).hexdigest()[:16]
    plain = config_subtrees(cfg, STREAM_KEYS)
    return f"{config_hash(plain, *STREAM_KEYS, ignore=CHECKPOINT_IGNORED + DERIVED_KEYS)}-{inputs}"


def play_streams(cfg: Config, root: Path, *, conditions: Sequence[str], start: StreamStart, work_dir: Path,
                 length: BlockLength | None = None, words: WorldWords | None = None,
                 facts: FactReader | None = None, reader: bool = True, workers: int = 1,
                 progress: bool = True) -> dict[str, list[StreamStep]]:
    """Every condition's stream over the eval tasks (module docstring).

    Args:
        cfg: the composed config (its ``condition`` section names the conditions).
        root: the project root (games, templates, grounding files).
        conditions: the streams to play (each a configured condition).
        start: where every stream starts (:class:`~pipeline.core.conf_schema.StreamStart`).
        work_dir: where each stream's grounding documents, merges and finished rounds are kept
            (``<work_dir>/<key>/<condition>/``, :func:`stream_key`), relative to ``root`` or
            absolute inside it: a rerun resumes from the rounds found there.
        length, words, facts: as the ``render`` stage passes them.
        reader: play with the ``reader`` agent (else ``cfg.agent``).
        workers: processes the streams are played in (one stream a job).

    Raises:
        ConfigError: an unknown condition, or no eval tasks.
    """
    unknown = [c for c in conditions if c not in cfg.condition]
    if unknown:
        raise ConfigError(f"stream: {', '.join(unknown)} not configured (condition: {', '.join(cfg.condition)})")
    manifest, scenes = load_games(root, cfg)
    tasks = tasks_from_manifest(manifest, split=cfg.experiment.eval_split, master_seed=cfg.seed)
    if not tasks:
        raise ConfigError(f"no tasks in split experiment.eval_split={cfg.experiment.eval_split!r}")
    play_cfg = reader_config(cfg) if reader else cfg
    memory = start_memory(cfg, root, start)
    work = (work_dir if work_dir.is_absolute() else root / work_dir) / stream_key(cfg, play_cfg, root, tasks, memory)
    ctx = {"cfg": cfg, "play_cfg": play_cfg, "root": root, "scenes": dict(scenes),
           "rows": {(r["scene_id"], r["quest_id"]): r for r in manifest}, "rounds": stream_rounds(tasks, cfg.seed),
           "memory": memory, "work": work, "length": length or BlockLength(),
           "words": words, "facts": facts}
    n = max(1, min(int(workers), len(conditions)))
    bar = tqdm(total=len(conditions), desc=f"streams ({n} worker{'s' if n != 1 else ''})", unit="stream",
               file=sys.stderr, disable=not progress)
    with OrderedPool(n, context=ctx, numerics=play_cfg.numerics,
                     load_torch=plays_with_model(play_cfg.agent) and is_local(play_cfg.model)) as pool:
        played = pool.map(_stream, list(conditions), progress=lambda _: bar.update(1))
    bar.close()
    return dict(zip(conditions, played))


def _stream(ctx: Mapping[str, Any], condition: str) -> list[StreamStep]:
    """One condition's stream, round by round: merge, store, render, play, remember."""
    cfg, root, facts = ctx["cfg"], ctx["root"], ctx["facts"]
    g = cfg.grounding
    start: _Memory = ctx["memory"]  # its rows are never changed: each stream extends its own lists
    memory = _Memory(list(start.episodes), list(start.turns), list(start.docs))
    work = ctx["work"] / condition
    rel = _relative(work, root)
    rounds = ctx["rounds"]
    lengths = Counter(t.scene_id for r in rounds for t in r)
    steps: list[StreamStep] = []
    shared = SharedBackend()  # the model loaded once a stream, not once a round
    resumed = 0
    for i, batch in enumerate(rounds):
        index = write_ground_outputs(memory.docs, work / "grounding", "json")
        cfg_g = OmegaConf.merge(cfg, {"paths": {"grounding": f"{rel}/grounding"}})
        merged = merge_at(cfg_g, root, index, [e["episode_id"] for e in index["episodes"]], work / "merged")
        cfg_i = OmegaConf.merge(cfg, {"paths": {"grounding_merged": _relative(merged, root)}})
        store = build_store(episodes_table(memory.episodes), turns_table(memory.turns), reader=facts, splits=None,
                            config_hash=None, tie_seed=cfg.seed)
        rows = [ctx["rows"][(t.scene_id, t.quest_id)] for t in batch]
        rendered = {(r["scene_id"], r["quest_id"]): r for r in
                    render_conditions(rows, [condition], cfg_i, store, root, ctx["length"], ctx["words"], facts)[condition][0]}
        prompt_rows = [rendered[(t.scene_id, t.quest_id)] for t in batch]
        kept = work / "rounds" / f"{i:04d}.json"
        records = _finished_round(kept, prompt_rows)
        if records is None:
            records = _keep_round(kept, prompt_rows,
                                  play_prompts(ctx["play_cfg"], root, batch, prompt_rows, ctx["scenes"], shared=shared))
        else:
            resumed += 1
        per_scene = Counter(str(d["expr_info"].get("scene_id")) for d in memory.docs)
        for t, row, rec in zip(batch, prompt_rows, records):
            ep = rec["episode"]
            steps.append(StreamStep(i, lengths[t.scene_id], t, row, len(store), per_scene.get(t.scene_id, 0),
                                    {k: ep[k] for k in ("episode_id", "is_correct", "won", "num_turns")}))
        for rec in records:  # after the round: no episode of a round is memory of its own round
            doc = episode_grounding(rec["episode"], rec["turns"], generator="extractive", timestamp=str(g.timestamp),
                                    unknown_type=str(g.unknown_type))
            memory.add(dict(rec["episode"]), [dict(t) for t in rec["turns"]], doc)
    if resumed:
        print(f"stream {condition}: {resumed} of {len(rounds)} rounds resumed from {work / 'rounds'}", file=sys.stderr)
    return steps


def _keep_round(path: Path, prompt_rows: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Write a finished round (its prompts' hashes, each episode's row and turns) atomically and
    return it as read back: a played round and a resumed one are the same values."""
    text = json.dumps({"prompts": [r["prompt_sha256"] for r in prompt_rows],
                       "records": [{"episode": r["episode"], "turns": r["turns"]} for r in records]},
                      sort_keys=True, ensure_ascii=False)
    atomic_write_text(path, text)
    return json.loads(text)["records"]


def _finished_round(path: Path, prompt_rows: Sequence[Mapping[str, Any]]) -> list[dict] | None:
    """The records of a round kept by :func:`_keep_round` for exactly these prompts, else None
    (then the round is played again: a kept round never costs more than replaying it)."""
    if not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"warning: ignoring {path} ({exc}); the round is played again", file=sys.stderr)
        return None
    if not isinstance(kept, dict) or kept.get("prompts") != [r["prompt_sha256"] for r in prompt_rows] \
            or len(kept.get("records") or []) != len(prompt_rows):
        print(f"warning: ignoring {path} (not this round's prompts); the round is played again", file=sys.stderr)
        return None
    return kept["records"]


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def check_identical_streams(streams: Mapping[str, Sequence[StreamStep]], pairs: Sequence[Sequence[str]]) -> list[str]:
    """The pairs of streams whose prompts must be the same at every step (``experiment.identical_prompts``:
    C1 and C2_silent): one line per step where they are not (empty: all equal). Pairs with a stream
    not played are skipped."""
    out = []
    for a, b in pairs:
        if a not in streams or b not in streams:
            continue
        xs = {(s.task.scene_id, s.task.quest_id): s for s in streams[a]}
        for s in streams[b]:
            x = xs.get((s.task.scene_id, s.task.quest_id))
            if x is None or x.prompt_row["system_prompt"] != s.prompt_row["system_prompt"]:
                out.append(f"{b} vs {a}: {s.task.scene_id}/{s.task.quest_id} (position {s.position}): prompts differ")
    return out
