"""A condition's memory block: one object per kind (``condition.<name>.kind``, :class:`~pipeline.core.conf_schema.ConditionKind`).

Each object says what its block shows and builds it for one task (:meth:`MemorySource.slot`),
and names the render stage's checks that only it has (:meth:`MemorySource.checks`); the checks
every condition gets (masking, only the block differs, no grounding text) are
:func:`pipeline.conditions.render.run_evidence_checks`'. The memory package supplies the
primitives (retrieval, advisories, the gate: :mod:`pipeline.memory.injection`) and names none
of these controls::

    source = source_for(cfg.condition["C2_placebo"])       # Placebo
    slot = source.slot(SlotRequest(store, task, cfg.memory, rng=cfg.seed, name="C2_placebo"))
    slot.injected_block_text, slot.gate_ok, slot.notes

========  ===============================  ==============================================  =========
kind      exposure (seed 001 section 2.4)  the block                                       condition
========  ===============================  ==============================================  =========
none      off: no retrieval                nothing                                         C0, C1
memory    on: shown when the gate passes   the store's advisories for the task             C2
silent    silent: retrieved, masked        nothing (the prompt is the no-memory one)       C2_silent
placebo   on                               other scenes' advisories, C2's count and length C2_placebo
oracle    on                               the task's expert plan in C2's form             C2_oracle
========  ===============================  ==============================================  =========

A new kind of memory source is one class here and one member of ``ConditionKind``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

import numpy as np

from pipeline.conditions.evidence import check_oracle_content, check_placebo_matched
from pipeline.conditions.oracle import oracle_slot
from pipeline.conditions.placebo import placebo_slot
from pipeline.conditions.schema import task_id
from pipeline.core.conf_schema import ConditionKind, Config, MemoryConfig
from pipeline.core.config import ConfigError
from pipeline.core.facts import FactReader, WorldWords
from pipeline.memory.injection import Exposure, MemorySlot, Retrieval, build_memory_slot, retrieve_for


@dataclass(frozen=True)
class SlotRequest:
    """One task's block under one condition: what a source needs to build it.

    Attributes:
        store: The loaded :class:`~pipeline.memory.store.EpisodicStore`.
        task: A manifest row (``scene_id``, ``quest_id``, ``objective``, ``expert_plan``).
        memory_cfg: ``cfg.memory``.
        rng: The config's seed (a per-task generator is derived from it where a source draws),
            or a ``numpy.random.Generator`` used as is.
        name: The condition's name (error messages).
        measure: A block's length (``len``: characters, or the model's tokens).
        words: The world's words in the advisories (:func:`pipeline.envs.world_words`).
        facts: The world's fact reader (:func:`pipeline.envs.fact_reader`).
    """

    store: Any
    task: Mapping[str, Any]
    memory_cfg: MemoryConfig
    rng: int | np.random.Generator = 0
    name: str = "?"
    measure: Callable[[str], int] = len
    words: Optional[WorldWords] = None
    facts: Optional[FactReader] = None

    def retrieval(self, exposure: Exposure) -> Retrieval:
        """The task's retrieval under ``exposure`` (:func:`~pipeline.memory.injection.retrieve_for`):
        what a block built from C2's (its count, its lengths) starts from."""
        return retrieve_for(self.store, self.task, exposure, self.memory_cfg, name=self.name, words=self.words,
                            facts=self.facts)


@dataclass(frozen=True)
class CheckRequest:
    """What a source's own render checks read: the rendered rows of every configured condition.

    Attributes:
        cfg: The composed config.
        condition: The condition checked.
        rows_by: ``{condition: rows}`` (the prompts Parquet's rows), every configured condition.
        tasks: The eval tasks, in row order.
        entry_scene: ``() -> {entry_id: scene_id}`` of the store (read only when needed).
        measure: A block's length; ``unit``: its name.
    """

    cfg: Config
    condition: str
    rows_by: Mapping[str, list[dict]]
    tasks: Sequence[Mapping[str, Any]]
    entry_scene: Callable[[], Mapping[str, str]]
    measure: Callable[[str], int] = len
    unit: str = "characters"


class MemorySource(Protocol):
    """A kind of memory block (``kind``) under its :class:`~pipeline.memory.injection.Exposure`.
    ``real``: its block is the store's own advisories for the task (what a placebo is matched to)."""

    kind: ConditionKind
    exposure: Exposure
    real: bool

    def slot(self, req: SlotRequest) -> MemorySlot:
        """The task's block (:class:`~pipeline.memory.injection.MemorySlot`)."""
        ...

    def checks(self, req: CheckRequest) -> dict[str, list[str]]:
        """This kind's own render checks: ``{check name: violations}`` (none: ``{}``)."""
        ...


@dataclass(frozen=True)
class Retrieved:
    """The store's own advisories under an exposure: none (``off``), shown (``on``: C2) or
    masked (``silent``: C2_silent)."""

    kind: ConditionKind
    exposure: Exposure
    real: bool = False

    def slot(self, req: SlotRequest) -> MemorySlot:
        return build_memory_slot(req.store, dict(req.task), self.exposure, req.memory_cfg, name=req.name,
                                 words=req.words, facts=req.facts)

    def checks(self, req: CheckRequest) -> dict[str, list[str]]:
        return {}


@dataclass(frozen=True)
class Placebo:
    """Other scenes' advisories, as many and as long as the reference's (:mod:`pipeline.conditions.placebo`);
    checked against the reference condition (:func:`placebo_reference`) task by task."""

    kind: ConditionKind = ConditionKind.placebo
    exposure: Exposure = Exposure.of("on")
    real: bool = False

    def slot(self, req: SlotRequest) -> MemorySlot:
        return placebo_slot(req.store, dict(req.task), req.retrieval(self.exposure), req.rng, req.measure)

    def checks(self, req: CheckRequest) -> dict[str, list[str]]:
        ref = placebo_reference(req.cfg, req.condition)
        if ref is None:
            return {}
        return {"placebo_matched": check_placebo_matched(req.rows_by[req.condition], req.rows_by[ref],
                                                         req.entry_scene(), measure=req.measure, unit=req.unit)}


@dataclass(frozen=True)
class Oracle:
    """The positive control: the task's expert plan in C2's form (:mod:`pipeline.conditions.oracle`);
    checked to hold every step of the plan."""

    kind: ConditionKind = ConditionKind.oracle
    exposure: Exposure = Exposure.of("on")
    real: bool = False

    def slot(self, req: SlotRequest) -> MemorySlot:
        return oracle_slot(dict(req.task), req.retrieval(self.exposure))

    def checks(self, req: CheckRequest) -> dict[str, list[str]]:
        plans = {task_id(t): list(t.get("expert_plan") or []) for t in req.tasks}
        return {"oracle_content": check_oracle_content(req.rows_by[req.condition], plans)}


SOURCES: dict[str, MemorySource] = {
    ConditionKind.none: Retrieved(ConditionKind.none, Exposure.of("off")),
    ConditionKind.memory: Retrieved(ConditionKind.memory, Exposure.of("on"), real=True),
    ConditionKind.silent: Retrieved(ConditionKind.silent, Exposure.of("silent")),
    ConditionKind.placebo: Placebo(),
    ConditionKind.oracle: Oracle(),
}
assert set(SOURCES) == set(ConditionKind), "every kind has its object"


def source_for(section: Any, name: str = "?") -> MemorySource:
    """The object of a condition's (or an advisory variant's) ``kind``; a plain dict is read too.

    Raises:
        ConfigError: an unknown kind (the message names the key and the known kinds).
    """
    kind = section.get("kind", ConditionKind.none) if isinstance(section, Mapping) else getattr(section, "kind")
    source = SOURCES.get(str(kind))
    if source is None:
        raise ConfigError(f"condition.{name}.kind={kind!r}: expected one of {', '.join(SOURCES)}")
    return source


def memory_slot(store: Any, task: Mapping[str, Any], section: Any, memory_cfg: MemoryConfig,
                rng: int | np.random.Generator = 0, *, name: str = "?", measure: Callable[[str], int] = len,
                words: Optional[WorldWords] = None, facts: Optional[FactReader] = None) -> MemorySlot:
    """One task's block under ``section``'s kind (a condition, or an advisory variant of the
    policy's demonstrations): what the render stage, the demonstrations and the probes call."""
    return source_for(section, name).slot(SlotRequest(store, task, memory_cfg, rng, name, measure, words, facts))


def is_exposed(section: Any) -> bool:
    """Whether a condition may show advisories at all (seed 001: mode ``on``, unmasked)."""
    return source_for(section).exposure.shown


def placebo_reference(cfg: Config, condition: str) -> Optional[str]:
    """The condition a placebo is matched to: the first, in config order, whose block is the
    store's own advisories, shown, with the placebo's grounding setting (C2 for C2_placebo);
    None when none is configured."""
    grounded = bool(cfg.condition[condition].grounding)
    return next((c for c in cfg.condition if source_for(cfg.condition[c], c).real
                 and bool(cfg.condition[c].grounding) == grounded), None)
