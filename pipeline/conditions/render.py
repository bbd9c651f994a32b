"""Rendering: one eval task's frozen system prompt under one condition, and the stage's core.

For one eval task: the condition's memory block (its kind's object,
:func:`pipeline.conditions.sources.memory_slot`: signature -> retrieval -> advisory bundle ->
gate) -> system prompt (``prompts.system_template`` with
the scene's merged grounding ``data/grounding_merged/<scene_id>.md`` (+ ``configured.md``
when ``grounding.files`` is set) and the injected block, assembled by
:func:`pipeline.prompts.task_prompt`, as the policy's demonstrations are). :class:`Renderer`
gives one row of :data:`~pipeline.conditions.schema.PROMPTS_SCHEMA`; :func:`render_condition`
renders every configured condition and runs the evidence checks
(:mod:`pipeline.conditions.evidence`)::

    r = Renderer(cfg, store, root)
    row = r.row(task, "C2")                      # one row of PROMPTS_SCHEMA
    rows, report = render_condition(tasks, "C2", cfg, store, root, block_length_for(cfg, root), world_words(cfg))
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from pipeline import prompts
from pipeline.conditions import sources
from pipeline.conditions.evidence import (
    EvidenceError,
    check_injected_blocks,
    check_masked_identical,
    check_no_advisory_text,
    check_no_grounding_text,
    check_only_block_differs,
    placebo_unavailable,
)
from pipeline.conditions.hints import label_hint_of, label_hint_totals
from pipeline.conditions.length import BlockLength
from pipeline.conditions.schema import task_id
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError
from pipeline.core.facts import FactReader, WorldWords
from pipeline.core.io import safe_name, sha256_text
from pipeline.core.schemas import canonical_json
from pipeline.memory import EpisodicStore
from pipeline.prompts import FrozenPrompt, PromptOrganizer, render_turn_prompt, split_grounding_paths

#: Observation used to fill the turn slots of a frozen prompt for the evidence checks.
PROBE_OBSERVATION: dict[str, Any] = {}
#: An unmasked retrieval: what a masked prompt must not show (:meth:`Renderer.reference_advisories`).
REFERENCE_CONDITION = {"kind": "memory"}


def grounding_files_for(scene_id: str, *, merged_dir: str, use_in_prompt: bool, configured: bool,
                        root: Path) -> list[str]:
    """The grounding files a task's prompt merges (paths relative to the project root).

    The scene's merged grounding when the merge stage wrote one (a held-out scene has
    none), then ``configured.md`` (the merge of ``grounding.files``) when files are set.
    """
    if not use_in_prompt:
        return []
    out = []
    safe_name(scene_id, f"{merged_dir.rstrip('/')}/<scene_id>.md", "scene_id")  # "../../README" would read README.md
    for name in (f"{scene_id}.md", "configured.md" if configured else None):
        if name and (root / merged_dir / name).is_file():
            out.append(f"{merged_dir.rstrip('/')}/{name}")
    return out


@dataclass
class Renderer:
    """Renders one task's prompt under one condition (the stage's core, no file writes).

    Args:
        cfg: The composed config.
        store: The loaded episodic store (``pipeline.memory.load_store``).
        root: Project root (templates, grounding files).
        length: How a memory block's length is measured (the placebo matches C2's in it):
            ``BlockLength()`` counts characters; the render stage passes one that counts
            the model's tokens (:func:`~pipeline.conditions.length.block_length_for`).
        words: The world's words in the advisories (the stage passes
            :func:`pipeline.envs.world_words`); None: world-neutral.
        facts: The world's fact reader (the stage passes :func:`pipeline.envs.fact_reader`):
            the kinds and preferences of the memory's lessons across houses; None: no lessons.
    """

    cfg: Config
    store: EpisodicStore
    root: Path
    length: BlockLength = field(default_factory=lambda: BlockLength())
    words: Optional[WorldWords] = None
    facts: Optional[FactReader] = None

    def __post_init__(self) -> None:
        # Read-only here: its templates, grounding files and settings; every prompt is
        # frozen with PromptOrganizer.freeze, which keeps no per-task state.
        self.organizer = PromptOrganizer.from_config(self.cfg, root=self.root)
        self.template_path = self.organizer.system_template_path
        self.template_sha256 = sha256_text(self.organizer.template(self.template_path))
        self.memory_defaults = canonical_json(self.organizer.memory_defaults)
        g = self.cfg.grounding
        self._configured = bool(split_grounding_paths(list(g.files) if not isinstance(g.files, str) else g.files))

    def grounding(self, scene_id: str, condition: str | None = None) -> list[str]:
        """The grounding files of ``scene_id``'s prompt (:func:`grounding_files_for`); none
        for a condition with ``grounding: false``."""
        if condition is not None and not bool(self.cfg.condition[condition].grounding):
            return []
        return grounding_files_for(scene_id, merged_dir=str(self.cfg.paths.grounding_merged),
                                   use_in_prompt=self.cfg.grounding.use_in_prompt,
                                   configured=self._configured, root=self.root)

    def prompt(self, task: Mapping[str, Any], block: str, files: list[str]) -> FrozenPrompt:
        """The frozen prompt of ``task`` with ``block`` as the injected memory block and the
        content of ``files`` as its grounding, and the memory block as the prompt shows it
        (:func:`pipeline.prompts.task_prompt`, as the policy's demonstrations are built)."""
        # Looked up on the package at call time, so a test can see that both callers use it.
        return prompts.task_prompt(self.organizer, str(task["objective"]), str(task["scene_id"]),
                                   self.organizer.grounding_content(files), block)

    def seen_text(self, frozen: str) -> str:
        """What the model sees at a turn (probe observation, memory defaults)."""
        org = self.organizer
        return render_turn_prompt(frozen, PROBE_OBSERVATION, org.memory_defaults, template_name="<frozen prompt>",
                                  strict=True, missing_memory_value=org.missing_memory_value,
                                  empty_string_value=org.empty_string_value, max_depth=org.max_depth)

    def row(self, task: Mapping[str, Any], condition: str) -> dict:
        """One Parquet row: retrieval, bundle, gate and prompt of ``task`` under ``condition``."""
        cond_cfg = self.cfg.condition[condition]
        # Looked up on the module at call time, so a test can substitute it.
        slot = sources.memory_slot(self.store, dict(task), cond_cfg, self.cfg.memory, rng=self.cfg.seed,
                                   name=condition, measure=self.length.measure, words=self.words, facts=self.facts)
        files = self.grounding(str(task["scene_id"]), condition)
        frozen = self.prompt(task, slot.injected_block_text, files)
        bundle = slot.bundle
        grounding_text = self.organizer.grounding_content(files)
        min_commands = self.cfg.memory.label_hint_min_commands
        g_hint, g_commands = label_hint_of(grounding_text, task, min_commands)
        m_hint, m_commands = label_hint_of(frozen.memory_block, task, min_commands)
        return {
            "task_id": task_id(task),
            "scene_id": str(task["scene_id"]),
            "quest_id": str(task["quest_id"]),
            "split": str(task.get("split") or ""),
            "scene_split": str(task.get("scene_split") or ""),
            "objective": str(task["objective"]),
            "condition": condition,
            "template": self.template_path,
            "template_sha256": self.template_sha256,
            "system_prompt": frozen.text,
            "prompt_sha256": sha256_text(frozen.text),
            "memory_block": frozen.memory_block,
            "injected": bool(frozen.memory_block),
            "bundle_json": canonical_json(bundle.model_dump(mode="json")),
            "memory_on": bool(bundle.memory_on),
            "memory_mode": str(bundle.meta.memory_mode),
            "retrieval_executed": bool(bundle.meta.retrieval_executed),
            "gate_ok": bool(slot.gate_ok),
            "gate_reason": str(slot.reason),
            "advisory_ids": [a.advisory_id for a in bundle.retrieved],
            "retrieved_entry_ids": [str(i) for i in slot.retrieved_entry_ids],
            "injected_entry_ids": [str(i) for i in slot.injected_entry_ids],
            "notes": [str(n) for n in slot.notes],
            "store_hash": bundle.meta.store_hash,
            "grounding_files": files,
            "grounding_sha256": sha256_text(grounding_text),
            "memory_defaults": self.memory_defaults,
            "grounding_label_hint": g_hint,
            "memory_label_hint": m_hint,
            "grounding_hint_commands": g_commands,
            "memory_hint_commands": m_commands,
        }

    def reference_advisories(self, task: Mapping[str, Any]) -> list[str]:
        """Messages an unmasked retrieval would give ``task`` (what masked prompts must not show)."""
        slot = sources.memory_slot(self.store, dict(task), REFERENCE_CONDITION, self.cfg.memory, rng=self.cfg.seed,
                                   name="reference", words=self.words, facts=self.facts)
        return [a.message for a in slot.bundle.retrieved]


def render_condition(tasks: Sequence[Mapping[str, Any]], condition: str, cfg: Config, store: EpisodicStore,
                     root: Path, length: Optional[BlockLength] = None, words: Optional[WorldWords] = None,
                     facts: Optional[FactReader] = None) -> tuple[list[dict], dict]:
    """The stage's core: rows for ``condition`` and the evidence report.

    Renders every configured condition (cheap) so the checks can compare them; raises
    :class:`~pipeline.conditions.evidence.EvidenceError` listing the violations when a check
    fails. ``length``: the unit of block lengths (default characters; the stage passes
    :func:`~pipeline.conditions.length.block_length_for`); ``words``: the world's words in the
    advisories (the stage passes :func:`pipeline.envs.world_words`); ``facts``: the world's fact
    reader (the stage passes :func:`pipeline.envs.fact_reader`: the memory's lessons need it).
    """
    return render_conditions(tasks, [condition], cfg, store, root, length, words, facts)[condition]


def render_conditions(tasks: Sequence[Mapping[str, Any]], conditions: Sequence[str], cfg: Config,
                      store: EpisodicStore, root: Path, length: Optional[BlockLength] = None,
                      words: Optional[WorldWords] = None,
                      facts: Optional[FactReader] = None) -> dict[str, tuple[list[dict], dict]]:
    """:func:`render_condition` for several conditions at once: every configured condition
    is rendered once and each of ``conditions`` is checked against them.

    Returns:
        ``{condition: (rows, report)}`` for each of ``conditions``.
    """
    for condition in conditions:
        if condition not in cfg.condition:
            raise ConfigError(f"--condition {condition!r}: not a configured condition "
                              f"(condition: {', '.join(cfg.condition)})")
    r = Renderer(cfg, store, root, length or BlockLength(), words, facts)
    tasks = sorted(tasks, key=lambda t: (str(t["scene_id"]), str(t["quest_id"])))
    rows_by = {c: [r.row(t, c) for t in tasks] for c in cfg.condition}
    exposed = {c: sources.is_exposed(cfg.condition[c]) for c in cfg.condition}
    out = {}
    for condition in conditions:
        checks, violations = run_evidence_checks(r, tasks, rows_by, condition, exposed)
        target = rows_by[condition]
        unavailable = placebo_unavailable(target)  # noted by a placebo slot only: [] for every other source
        report = {
            "condition": condition,
            "placebo_unavailable": unavailable,
            "exposed": exposed[condition],
            "tasks": len(target),
            "injected": sum(row["injected"] for row in target),
            "gate_reasons": dict(sorted(Counter(row["gate_reason"] for row in target).items())),
            "store_hash": store.store_hash,
            "template": r.template_path,
            "template_sha256": r.template_sha256,
            "mean_prompt_chars": round(sum(len(row["system_prompt"]) for row in target) / max(1, len(target)), 1),
            "block_length_unit": r.length.unit,
            "mean_block_length": round(sum(r.length.measure(row["memory_block"]) for row in target)
                                       / max(1, len(target)), 1),
            "label_hints": label_hint_totals(target),
            "evidence": {"checks": checks, "passed": not violations, "compared_conditions": list(cfg.condition)},
        }
        if violations:
            shown = "\n  ".join(violations[:10]) + (f"\n  ... ({len(violations)} in all)" if len(violations) > 10 else "")
            raise EvidenceError(f"render {condition}: evidence checks failed:\n  {shown}", violations)
        out[condition] = (target, report)
    return out


def run_evidence_checks(r: Renderer, tasks: Sequence[Mapping[str, Any]], rows_by: Mapping[str, list[dict]],
                        condition: str, exposed: Mapping[str, bool]) -> tuple[dict[str, int], list[str]]:
    """The evidence checks of ``condition`` (:mod:`pipeline.conditions.evidence`) on what the model sees.

    Args:
        r: The renderer that rendered ``rows_by``.
        tasks: The tasks, sorted by scene and quest.
        rows_by: ``{condition: rows}`` for every configured condition, in config order.
        condition: The condition checked.
        exposed: ``{condition: is_exposed(...)}``.

    Returns:
        ``(checks, violations)``: the number of violations per check that ran, and every
        violation as ``"[<check>] <condition> <task_id>: <what>"``.
    """
    cfg = r.cfg
    grounded = bool(cfg.condition[condition].grounding)
    seen = {c: {row["task_id"]: r.seen_text(row["system_prompt"]) for row in rows} for c, rows in rows_by.items()}
    files = {task_id(t): r.grounding(str(t["scene_id"]), condition) for t in tasks}
    baseline = {task_id(t): r.seen_text(r.prompt(t, "", files[task_id(t)]).text) for t in tasks}
    advisory_texts = _advisory_texts(r, tasks, rows_by)
    # Grounding and objective may quote the same feedback an advisory was built from.
    allowed = {task_id(t): r.organizer.grounding_content(files[task_id(t)]) + "\n" + str(t["objective"])
               for t in tasks}
    markers = [str(cfg.memory.io.slot_memory_name), r.organizer.slot_heading, '"advisory_id"', "advisory_type: "]

    seen_rows = [{**row, "seen_prompt": seen[condition][row["task_id"]],
                  "seen_block": row["memory_block"]} for row in rows_by[condition]]
    violations: list[str] = []
    checks: dict[str, int] = {}

    def run(name: str, found: list[str]) -> None:
        checks[name] = len(found)
        violations.extend(f"[{name}] {v}" for v in found)

    run("injected_block_present", check_injected_blocks(seen_rows, exposed=exposed[condition]))
    run("only_block_differs", check_only_block_differs(seen_rows, baseline))
    masked = [c for c in cfg.condition if not exposed[c] and bool(cfg.condition[c].grounding) == grounded]
    if condition in masked:
        run("no_advisory_text", check_no_advisory_text(seen_rows, advisory_texts, markers, allowed))
        run("masked_identical", check_masked_identical({c: seen[c] for c in masked}))
    if not grounded:
        scene_grounding = {task_id(t): r.organizer.grounding_content(r.grounding(str(t["scene_id"]))) for t in tasks}
        run("no_grounding_text", check_no_grounding_text(seen_rows, scene_grounding))
    def entry_scene() -> dict[str, str]:
        return {e["entry_id"]: str((e.get("provenance") or {}).get("scene_id"))
                for e in r.store.table.select(["entry_id", "provenance"]).to_pylist()}

    own = sources.source_for(cfg.condition[condition], condition).checks(
        sources.CheckRequest(cfg, condition, rows_by, tasks, entry_scene, r.length.measure, r.length.unit))
    for name, found in own.items():  # the condition's own checks (its kind's: placebo_matched, oracle_content)
        run(name, found)
    return checks, violations


def _advisory_texts(r: Renderer, tasks: Sequence[Mapping[str, Any]],
                    rows_by: Mapping[str, list[dict]]) -> dict[str, set[str]]:
    """Per task, every advisory message retrieval gave it: an unmasked retrieval's and
    those of every condition's bundle (what a masked prompt must not show)."""
    texts: dict[str, set[str]] = {task_id(t): set(r.reference_advisories(t)) for t in tasks}
    for rows in rows_by.values():
        for row in rows:
            texts[row["task_id"]].update(a["message"] for a in json.loads(row["bundle_json"])["retrieved"])
    return texts
