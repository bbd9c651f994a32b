"""Seed 000's online loop in collection: each episode's prompt carries the grounding of the
episodes before it in its scene.

Without it every collected episode starts from the same prompt and nothing the user said
reaches a later episode until the ``ground`` -> ``merge`` -> ``render`` stages, which only
evaluation sees. With it (``grounding.online``, the default), the train tasks of a scene
are played in order: the k-th episode of a scene is played with a system prompt whose
grounding merges (seed 000's rules, as the ``merge`` stage does) the grounding documents
of that scene's episodes 1..k-1 (and ``grounding.files``). Scenes stay independent, so
round k plays the k-th episode of every scene at once, batched.

With ``grounding.online_memory`` (a condition's name, ``C2``), each round's prompts also carry
that condition's memory block, retrieved (as the ``render`` stage retrieves it) from a store
built of every episode the rounds before played (their entries, as the ``store`` stage builds
them, each once): a trial reads the memory of the trials before it, as CLIN's and
Reflexion's do, and not only what the user said of them (the user speaks with
``user.feedback_prob``; the memory keeps what the episode did: a focus that ended it, a way
walked, a room where the score rose).

Deterministic and resumable: a round's prompts are a function of the config and the
records of the rounds before it, which are checkpointed one file per episode like every
collection. Only an agent that reads its prompt (:func:`pipeline.agents.reads_prompt`: the
``llm``, ``reader`` and ``trial`` agents) is played this way; ``react`` and ``rag`` ignore
prompts, so their collection is unchanged.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from itertools import zip_longest
from pathlib import Path
from typing import Callable

from pipeline.conditions.sources import memory_slot
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError
from pipeline.core.io import atomic_write_text, safe_name
from pipeline.core.schemas import episodes_table, turns_table
from pipeline.envs import fact_reader, world_words
from pipeline.grounding.episodes import episode_grounding
from pipeline.memory.schemas import EpisodicMemoryEntryV1_1
from pipeline.memory.store import EpisodicStore, build_entries
from pipeline.prompts import PromptOrganizer, split_grounding_paths, task_prompt
from pipeline.session.rollout import Task

ONLINE_DIR = "online_grounding"


def rounds(tasks: list[Task]) -> list[list[Task]]:
    """Round k: the k-th task of every scene (scenes in first-appearance order)."""
    by_scene: OrderedDict[str, list[Task]] = OrderedDict()
    for t in tasks:
        by_scene.setdefault(t.scene_id, []).append(t)
    return [[t for t in group if t is not None] for group in zip_longest(*by_scene.values())]


def play_online(cfg: Config, root: Path, tasks: list[Task], play_round: Callable[[list[Task]], list[dict]],
                work_dir: Path) -> list[dict]:
    """Play ``tasks`` round by round, each episode prompted with its scene's earlier grounding.

    Args:
        cfg: The composed config (``grounding``, ``prompts``).
        root: The project root (templates, ``grounding.files``).
        tasks: The train tasks, in the collection's order.
        play_round: Plays a list of tasks (checkpointed) and returns their records.
        work_dir: Where the per-episode grounding documents are written (inside the
            collection's checkpoint folder; the prompt shows their content, never a path).

    Returns:
        The records in the order of ``tasks``.
    """
    rendered = [t.episode_id for t in tasks if t.system_prompt]
    if rendered:  # e.g. eval tasks: their prompt is the condition's, and must reach the model as rendered
        raise ValueError(f"play_online: {len(rendered)} task(s) already carry a rendered system prompt "
                         f"(e.g. {rendered[0]}); the online loop would replace it")
    g = cfg.grounding
    organizer = PromptOrganizer.from_config(cfg, root=root)
    configured = split_grounding_paths(g.files if isinstance(g.files, str) else list(g.files or []))
    earlier: dict[str, list[str]] = {}
    records: dict[str, dict] = {}
    memory = OnlineMemory(cfg) if g.online_memory else None
    for batch in rounds(tasks):
        for t in batch:
            docs = earlier.get(t.scene_id, [])
            grounding = organizer.grounding_content([*configured, *docs]) if docs and g.use_in_prompt else None
            block = memory.block(t) if memory is not None else ""
            if grounding or block:
                t.system_prompt = task_prompt(organizer, t.objective, t.scene_id, grounding, block).text
        played = play_round(batch)
        if memory is not None:
            memory.remember(played)
        for rec in played:
            ep = rec["episode"]
            doc = episode_grounding(ep, rec["turns"], generator="extractive", timestamp=str(g.timestamp),
                                    unknown_type=str(g.unknown_type))
            # a record read back from its checkpoint (work_dir/<episode_id>.json) names these folders:
            # ids that leave them are refused before the write
            episode_id = safe_name(ep["episode_id"], f"the episode records in {work_dir}", "episode_id")
            scene = safe_name(ep["scene_id"], work_dir / f"{episode_id}.json", "episode.scene_id")
            path = work_dir / ONLINE_DIR / scene / f"{episode_id}.json"
            atomic_write_text(path, json.dumps(doc, ensure_ascii=False, sort_keys=True, indent=2))
            earlier.setdefault(str(ep["scene_id"]), []).append(str(path))
            records[str(ep["episode_id"])] = rec
    return [records[t.episode_id] for t in tasks]


class OnlineMemory:
    """The memory block of ``grounding.online_memory``'s condition for a task, from the episodes
    played so far (module docstring): the store is built from their records as the ``store``
    stage builds it from ``episodes.parquet``, and the block retrieved as the ``render`` stage
    retrieves it (:func:`pipeline.conditions.sources.memory_slot`, the gate included)."""

    def __init__(self, cfg: Config):
        name = str(cfg.grounding.online_memory)
        if name not in cfg.condition:
            raise ConfigError(f"grounding.online_memory={name!r}: not a configured condition "
                              f"(condition: {', '.join(cfg.condition)})")
        self.cfg, self.name = cfg, name
        self.facts, self.words = fact_reader(cfg), world_words(cfg)
        self.entries: list[EpisodicMemoryEntryV1_1] = []
        self.store: EpisodicStore | None = None

    def remember(self, played: list[dict]) -> None:
        """Add the entries of ``played`` (records of a round's finished episodes) to the store:
        each episode's entry is built once (:func:`pipeline.memory.store.build_entries`, what
        :func:`pipeline.memory.build_store` builds a store of, entries sorted by id either way)."""
        if not played:
            return
        self.entries += build_entries(episodes_table([r["episode"] for r in played]),
                                      turns_table([t for r in played for t in r["turns"]]),
                                      reader=self.facts, splits=list(self.cfg.memory.store_splits) or None)
        self.store = EpisodicStore.from_entries(self.entries, tie_seed=self.cfg.seed)

    def block(self, task: Task) -> str:
        """``task``'s memory block from the store :meth:`remember` built ("" before any episode)."""
        if self.store is None:
            return ""
        slot = memory_slot(self.store, dict(vars(task)), self.cfg.condition[self.name], self.cfg.memory,
                           rng=self.cfg.seed, name=self.name, words=self.words, facts=self.facts)
        return slot.injected_block_text
