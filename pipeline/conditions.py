"""Experimental conditions: what each one injects into the prompt, and the evidence that it did.

A condition (``conf/condition/<name>.yaml``, schema :class:`~pipeline.core.conf_schema.ConditionConfig`)
says whether the scene's grounding is in the prompt (``grounding``), whether retrieval runs
(``retrieval_executed``), whether its advisories are shown (``memory_mode``,
``injection_mask``) and whether real advisories are swapped for length-matched ones from
other scenes (``placebo``): grounding and memory are orthogonal switches. The standard
conditions: C0 (no grounding, no memory), C1 (grounding, no memory), C2 (grounding,
advisories shown), C2_silent (retrieval runs, nothing shown), C2_placebo.

To add a condition: write ``conf/condition/<name>.yaml``, list it under ``condition`` in
``conf/config.yaml`` (and in ``experiment.comparisons`` to compare it); what it injects is
decided by ``pipeline.memory.build_memory_slot`` from those four fields, and the checks
below hold it to them.

For one eval task: signature -> retrieval -> advisory bundle -> gate
(``pipeline.memory.build_memory_slot``) -> system prompt (``prompts.system_template`` with
the scene's merged grounding ``data/grounding_merged/<scene_id>.md`` (+ ``configured.md``
when ``grounding.files`` is set) and the injected block). :class:`Renderer` gives one
row of :data:`PROMPTS_SCHEMA`; :func:`render_condition` renders every configured condition
and runs the evidence checks; the ``render`` stage (``python -m pipeline.stages.render``)
writes the rows of one condition.

The stored ``system_prompt`` is the per-episode ("frozen") prompt: everything fixed for the
episode is in it verbatim, and the per-turn slots (observation fields, ``$memory[...]``)
are kept for the agent to fill each turn with
``pipeline.prompts.render_turn_prompt(system_prompt, observation, memory_dict)`` (``$`` in
inserted text is escaped as ``$$`` so that fill reproduces it exactly).

Evidence checks run on the text the model sees (the frozen prompt filled with a probe
observation and the memory defaults); a failure raises :class:`EvidenceError`:

1. an exposed condition's prompt whose gate passed contains its injected block;
2. every prompt equals the no-memory prompt of its task (with the condition's grounding
   setting) with its injected block removed (so the memory block is the only difference,
   and a prompt without one is identical);
3. a masked condition (C0, C1, C2_silent: not ``memory_mode=on`` or ``injection_mask``)
   injects nothing and shows no advisory text (slot name, heading, advisory JSON, messages);
4. for the same task, the prompts of all masked conditions with the same grounding
   setting are byte-identical (C1 and C2_silent);
5. a condition without grounding shows none of its scene's grounding text;
6. a placebo (C2_placebo), wherever its reference (the exposed, real-memory condition
   with the same grounding: C2) injects, injects as many advisories, from entries C2 did
   not inject and of other scenes than the task's, in a block within 2% of C2's length
   in the model's tokens (characters when no local model plays: :func:`block_length_for`); where C2 injects nothing, neither does it. Where the store has too few
   such entries (a world with one seen scene), the placebo injects nothing and the task
   is listed as ``placebo_unavailable`` in the render report, not as a violation;
7. an oracle (C2_oracle) injects, for every task with an expert plan, a block that holds
   every step of that plan.

Every row also records whether its grounding text and its memory block reveal the task's
answer by the advisories' label-hint rule (:func:`pipeline.memory.advisory.find_label_hints`
against the task's expert plan / ground truth, ``memory.label_hint_min_commands``):
``grounding_label_hint`` / ``memory_label_hint``, and how many of the plan's object commands
each names (``grounding_hint_commands`` / ``memory_hint_commands``). These are counted, not
enforced: the render report gives the totals (``label_hints``), the comparison report shows
them per condition. Advisories that reveal it are already dropped before injection; the
grounding is the users' feedback, which may name the steps of a task.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import pyarrow as pa

from pipeline import memory
from pipeline.core.conf_schema import AgentName, Backend, ConditionConfig, Config
from pipeline.core.config import ConfigError
from pipeline.core.io import ArtifactError, read_parquet, sha256_text
from pipeline.core.schemas import canonical_json
from pipeline.memory import EpisodicStore
from pipeline.memory.advisory import find_label_hints, named_plan_commands
from pipeline.prompts import PromptOrganizer, render_turn_prompt, split_grounding_paths

PROMPTS_SCHEMA_VERSION = "2"
PROMPTS_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),  # "<scene_id>/<quest_id>"
        ("scene_id", pa.string()),
        ("quest_id", pa.string()),
        ("split", pa.string()),
        ("scene_split", pa.string()),
        ("objective", pa.string()),
        ("condition", pa.string()),
        ("template", pa.string()),  # template file (relative to the project root)
        ("template_sha256", pa.string()),
        ("system_prompt", pa.string()),  # frozen per-episode prompt (turn slots kept)
        ("prompt_sha256", pa.string()),  # sha256 of system_prompt
        ("memory_block", pa.string()),  # exactly what $memory_slot inserted ("" when nothing)
        ("injected", pa.bool_()),  # memory_block non-empty
        ("bundle_json", pa.string()),  # AdvisoryBundleV1_1, canonical JSON
        ("memory_on", pa.bool_()),
        ("memory_mode", pa.string()),
        ("retrieval_executed", pa.bool_()),
        ("gate_ok", pa.bool_()),
        ("gate_reason", pa.string()),
        ("advisory_ids", pa.list_(pa.string())),
        ("retrieved_entry_ids", pa.list_(pa.string())),
        ("injected_entry_ids", pa.list_(pa.string())),
        ("notes", pa.list_(pa.string())),  # record-only remarks (placebo draws), never shown
        ("store_hash", pa.string()),  # content hash of the episodic store used (null: no retrieval)
        ("grounding_files", pa.list_(pa.string())),
        ("grounding_sha256", pa.string()),  # sha256 of the $grounding_content text
        ("memory_defaults", pa.string()),  # JSON: memory dict the turn slots start from
        # Does the text reveal the task's answer (label-hint rule)? Null: rendered without the check.
        ("grounding_label_hint", pa.bool_()),  # the $grounding_content text does
        ("memory_label_hint", pa.bool_()),  # the memory block does
        ("grounding_hint_commands", pa.int32()),  # expert-plan object commands the grounding names
        ("memory_hint_commands", pa.int32()),  # expert-plan object commands the memory block names
    ]
)
#: Columns a row may lack (null in the table): the label-hint counts.
LABEL_HINT_COLUMNS = ("grounding_label_hint", "memory_label_hint", "grounding_hint_commands", "memory_hint_commands")

#: Observation used to fill the turn slots of a frozen prompt for the evidence checks.
PROBE_OBSERVATION: dict[str, Any] = {}


class EvidenceError(RuntimeError):
    """An evidence check failed: what the model would see contradicts the condition.

    Attributes:
        violations: Every violation, ``"[<check>] <condition> <task_id>: <what>"``.
    """

    def __init__(self, message: str, violations: Sequence[str] = ()):
        super().__init__(message)
        self.violations = list(violations)


def is_exposed(condition_cfg: ConditionConfig) -> bool:
    """Whether a condition may show advisories at all (seed 001: mode ``on``, unmasked)."""
    return condition_cfg.memory_mode == "on" and not bool(condition_cfg.injection_mask)


def task_id(row: Mapping[str, Any]) -> str:
    """``"<scene_id>/<quest_id>"`` of a task or prompt row."""
    return f"{row['scene_id']}/{row['quest_id']}"


def task_answer(task: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """``(expert_plan, ground_truth)`` of a task, as the memory slot's label-hint check reads
    them: the manifest's ``expert_plan``, else the ``ground_truth`` commands split at ``;``."""
    plan = task.get("expert_plan")
    gt = task.get("ground_truth")
    if plan is None and gt:
        plan = [c.strip() for c in str(gt).split(";")]
    return [str(c) for c in (plan or [])], (str(gt) if gt else None)


def label_hint_of(text: str, task: Mapping[str, Any], min_commands: int) -> tuple[bool, int]:
    """Whether ``text`` reveals ``task``'s answer by the advisories' label-hint rule
    (:func:`pipeline.memory.advisory.find_label_hints`), and how many of the expert plan's
    object commands it names.

    Args:
        text: The text the prompt shows (grounding content, memory block).
        task: A manifest row (``expert_plan``, optionally ``ground_truth``).
        min_commands: ``memory.label_hint_min_commands``.
    """
    if not text:
        return False, 0
    plan, gt = task_answer(task)
    hints = find_label_hints(text, ground_truth=gt, expert_plan=plan, min_commands=min_commands)
    return bool(hints), len(named_plan_commands(text, plan))


def label_hint_totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Prompts whose grounding / memory block reveals the task's answer, and those with either."""
    rows = list(rows)
    return {
        "prompts": len(rows),
        "grounding": sum(bool(r.get("grounding_label_hint")) for r in rows),
        "memory": sum(bool(r.get("memory_label_hint")) for r in rows),
        "either": sum(bool(r.get("grounding_label_hint")) or bool(r.get("memory_label_hint")) for r in rows),
    }


def grounding_files_for(scene_id: str, *, merged_dir: str, use_in_prompt: bool, configured: bool,
                        root: Path) -> list[str]:
    """The grounding files a task's prompt merges (paths relative to the project root).

    The scene's merged grounding when the merge stage wrote one (a held-out scene has
    none), then ``configured.md`` (the merge of ``grounding.files``) when files are set.
    """
    if not use_in_prompt:
        return []
    out = []
    for name in (f"{scene_id}.md", "configured.md" if configured else None):
        if name and (root / merged_dir / name).is_file():
            out.append(f"{merged_dir.rstrip('/')}/{name}")
    return out


# --------------------------------------------------------------------------- rendering


@dataclass(frozen=True)
class BlockLength:
    """The unit a memory block's length is measured in: ``measure(text)`` and its name.

    Characters by default; :func:`block_length_for` gives the model's tokens when a local
    model plays (the placebo is matched to C2 in what the model reads)."""

    measure: Callable[[str], int] = len
    unit: str = "characters"


def block_length_for(cfg: Config, root: Path, tokenizer: Optional[Any] = None) -> BlockLength:
    """The model's tokens when the eval agent runs a local transformers model whose
    tokenizer is on disk (``model.name_or_path``) or given; characters otherwise (a remote
    endpoint's tokenizer is unknown here; a non-LLM agent reads no tokens).

    Raises:
        ConfigError: the model directory exists but its tokenizer cannot be loaded.
    """
    m = cfg.model
    if tokenizer is None:
        if str(cfg.agent.name) != AgentName.llm or str(m.backend) != Backend.transformers or not m.name_or_path:
            return BlockLength()
        path = Path(str(m.name_or_path))
        path = path if path.is_absolute() else root / path
        if not path.is_dir():
            return BlockLength()
        from transformers import AutoTokenizer  # deferred: heavy optional dependency

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.name_or_path={m.name_or_path!r}: cannot load its tokenizer to measure "
                              f"memory blocks in tokens: {exc}") from exc
    tok = tokenizer

    def measure(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"]) if text else 0

    return BlockLength(measure, f"tokens ({type(tok).__name__}, {len(tok)} entries)")


@dataclass
class Renderer:
    """Renders one task's prompt under one condition (the stage's core, no file writes).

    Args:
        cfg: The composed config.
        store: The loaded episodic store (``pipeline.memory.load_store``).
        root: Project root (templates, grounding files).
        length: How a memory block's length is measured (the placebo matches C2's in it):
            ``BlockLength()`` counts characters; the render stage passes one that counts
            the model's tokens (:func:`block_length_for`).
    """

    cfg: Config
    store: EpisodicStore
    root: Path
    length: "BlockLength" = field(default_factory=lambda: BlockLength())

    def __post_init__(self) -> None:
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
                                   use_in_prompt=bool(self.cfg.grounding.use_in_prompt),
                                   configured=self._configured, root=self.root)

    def prompt(self, task: Mapping[str, Any], block: str, files: list[str]) -> str:
        """The frozen prompt of ``task`` with ``block`` as the injected memory block."""
        org = self.organizer
        org.set_variables(objective=str(task["objective"]), scene=str(task["scene_id"]))
        org.set_memory_block(block)
        return org.freeze_system_prompt(files)

    def seen_text(self, frozen: str) -> str:
        """What the model sees at a turn (probe observation, memory defaults)."""
        org = self.organizer
        return render_turn_prompt(frozen, PROBE_OBSERVATION, org.memory_defaults, template_name="<frozen prompt>",
                                  strict=True, missing_memory_value=org.missing_memory_value,
                                  empty_string_value=org.empty_string_value, max_depth=org.max_depth)

    def row(self, task: Mapping[str, Any], condition: str) -> dict:
        """One Parquet row: retrieval, bundle, gate and prompt of ``task`` under ``condition``."""
        cond_cfg = self.cfg.condition[condition]
        # Looked up on the package at call time, so a test can substitute it.
        slot = memory.build_memory_slot(self.store, dict(task), cond_cfg, self.cfg.memory, rng=int(self.cfg.seed),
                                        condition_name=condition, measure=self.length.measure)
        files = self.grounding(str(task["scene_id"]), condition)
        frozen = self.prompt(task, slot.injected_block_text, files)
        bundle = slot.bundle
        grounding_text = self.organizer.grounding_content(files)
        min_commands = int(self.cfg.memory.label_hint_min_commands)
        g_hint, g_commands = label_hint_of(grounding_text, task, min_commands)
        m_hint, m_commands = label_hint_of(self.organizer.memory_slot, task, min_commands)
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
            "system_prompt": frozen,
            "prompt_sha256": sha256_text(frozen),
            "memory_block": self.organizer.memory_slot,
            "injected": bool(self.organizer.memory_slot),
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
        on = {"memory_mode": "on", "retrieval_executed": True, "injection_mask": False, "placebo": False}
        slot = memory.build_memory_slot(self.store, dict(task), on, self.cfg.memory, rng=int(self.cfg.seed),
                                        condition_name="reference")
        return [a.message for a in slot.bundle.retrieved]


def render_condition(tasks: Sequence[Mapping[str, Any]], condition: str, cfg: Config, store: EpisodicStore,
                     root: Path, length: Optional[BlockLength] = None) -> tuple[list[dict], dict]:
    """The stage's core: rows for ``condition`` and the evidence report.

    Renders every configured condition (cheap) so the checks can compare them; raises
    :class:`EvidenceError` listing the violations when a check fails. ``length``: the unit
    of block lengths (default characters; the stage passes :func:`block_length_for`).
    """
    if condition not in cfg.condition:
        raise ConfigError(f"--condition {condition!r}: not a configured condition "
                          f"(condition: {', '.join(cfg.condition)})")
    r = Renderer(cfg, store, root, length or BlockLength())
    tasks = sorted(tasks, key=lambda t: (str(t["scene_id"]), str(t["quest_id"])))
    rows_by = {c: [r.row(t, c) for t in tasks] for c in cfg.condition}
    exposed = {c: is_exposed(cfg.condition[c]) for c in cfg.condition}
    checks, violations = run_evidence_checks(r, tasks, rows_by, condition, exposed)
    target = rows_by[condition]
    unavailable = placebo_unavailable(target) if bool(cfg.condition[condition].placebo) else []
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
    return target, report


def run_evidence_checks(r: Renderer, tasks: Sequence[Mapping[str, Any]], rows_by: Mapping[str, list[dict]],
                        condition: str, exposed: Mapping[str, bool]) -> tuple[dict[str, int], list[str]]:
    """The evidence checks of ``condition`` (module docstring, 1-4) on what the model sees.

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
    baseline = {task_id(t): r.seen_text(r.prompt(t, "", files[task_id(t)])) for t in tasks}
    advisory_texts: dict[str, set[str]] = {task_id(t): set(r.reference_advisories(t)) for t in tasks}
    for rows in rows_by.values():
        for row in rows:
            advisory_texts[row["task_id"]].update(a["message"] for a in json.loads(row["bundle_json"])["retrieved"])
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
    this = cfg.condition[condition]
    if bool(this.placebo):
        ref = next((c for c in cfg.condition if exposed[c] and not bool(cfg.condition[c].placebo)
                    and not bool(cfg.condition[c].oracle) and bool(cfg.condition[c].grounding) == grounded), None)
        if ref is not None:
            scenes = {e["entry_id"]: str((e.get("provenance") or {}).get("scene_id"))
                      for e in r.store.table.select(["entry_id", "provenance"]).to_pylist()}
            run("placebo_matched", check_placebo_matched(rows_by[condition], rows_by[ref], scenes,
                                                         measure=r.length.measure, unit=r.length.unit))
    if bool(this.oracle):
        run("oracle_content", check_oracle_content(rows_by[condition], {task_id(t): list(t.get("expert_plan") or [])
                                                                      for t in tasks}))
    return checks, violations


# --------------------------------------------------------------------------- evidence checks
# Pure functions over plain rows: each returns the list of violations (empty = passed).
# A row carries task_id, condition, gate_ok, memory_block, and seen_prompt / seen_block:
# the text the model sees and the block as it appears there.


def check_injected_blocks(rows: Iterable[Mapping[str, Any]], *, exposed: bool) -> list[str]:
    """An exposed condition's prompt whose gate passed contains its (non-empty) block;
    a prompt whose gate refused carries no block."""
    out = []
    for row in rows:
        tid, block, prompt = row["task_id"], row["seen_block"], row["seen_prompt"]
        if row["gate_ok"] and exposed:
            if not block:
                out.append(f"{row['condition']} {tid}: gate passed but no memory block was injected")
            elif block not in prompt:
                out.append(f"{row['condition']} {tid}: gate passed but the prompt lacks its memory block")
        elif block:
            out.append(f"{row['condition']} {tid}: memory block injected although "
                       f"{'the gate refused (' + str(row.get('gate_reason')) + ')' if exposed else 'the condition is masked'}")
    return out


def check_only_block_differs(rows: Iterable[Mapping[str, Any]], baseline: Mapping[str, str]) -> list[str]:
    """Each prompt, with its block removed once, equals its task's no-memory prompt."""
    out = []
    for row in rows:
        tid, block, prompt = row["task_id"], row["seen_block"], row["seen_prompt"]
        if tid not in baseline:
            out.append(f"{row['condition']} {tid}: no reference prompt for this task")
            continue
        stripped = prompt.replace(block, "", 1) if block else prompt
        if stripped != baseline[tid]:
            out.append(f"{row['condition']} {tid}: differs from the no-memory prompt beyond its memory block "
                       f"(first difference at character {_first_diff(stripped, baseline[tid])})")
    return out


def check_no_advisory_text(rows: Iterable[Mapping[str, Any]], advisory_texts: Mapping[str, Iterable[str]],
                           markers: Sequence[str], allowed: Mapping[str, str] | None = None) -> list[str]:
    """A masked condition's prompt injects nothing and shows no advisory text.

    Args:
        rows: Rows of a masked condition.
        advisory_texts: Per task, the advisory messages retrieval produced (any condition).
        markers: Strings only an injected slot contains (slot name, heading, ``"advisory_id"``).
        allowed: Per task, text the prompt legitimately shows without memory (its
            grounding and objective, which may quote the feedback an advisory was built
            from); a message found there is not counted.
    """
    out = []
    for row in rows:
        tid, prompt = row["task_id"], row["seen_prompt"]
        if row["seen_block"]:
            out.append(f"{row['condition']} {tid}: masked condition has a memory block")
        for m in markers:
            if m and m in prompt:
                out.append(f"{row['condition']} {tid}: prompt contains {m!r}")
        ok_text = (allowed or {}).get(tid, "")
        for msg in sorted(set(advisory_texts.get(tid, ()))):
            if msg and msg in prompt and msg not in ok_text:
                out.append(f"{row['condition']} {tid}: prompt contains advisory text {msg[:60]!r}")
    return out


def check_masked_identical(seen_by_condition: Mapping[str, Mapping[str, str]]) -> list[str]:
    """For each task, the prompts of every masked condition (C1, C2_silent) are byte-identical."""
    out = []
    conds = sorted(seen_by_condition)
    if len(conds) < 2:
        return out
    first = conds[0]
    tasks = set().union(*(set(v) for v in seen_by_condition.values()))
    for tid in sorted(tasks):
        ref = seen_by_condition[first].get(tid)
        for c in conds[1:]:
            other = seen_by_condition[c].get(tid)
            if ref is None or other is None:
                out.append(f"{tid}: missing under {first if ref is None else c}")
            elif other.encode("utf-8") != ref.encode("utf-8"):
                out.append(f"{tid}: {c} differs from {first} (first difference at character "
                           f"{_first_diff(other, ref)})")
    return out


def check_no_grounding_text(rows: Iterable[Mapping[str, Any]], scene_grounding: Mapping[str, str]) -> list[str]:
    """A condition without grounding shows no line of its scene's grounding text."""
    out = []
    for row in rows:
        tid, prompt = row["task_id"], row["seen_prompt"]
        lines = [ln.strip() for ln in scene_grounding.get(tid, "").splitlines() if len(ln.strip()) >= 20]
        leaked = next((ln for ln in lines if ln in prompt), None)
        if leaked is not None:
            out.append(f"{row['condition']} {tid}: prompt contains grounding text {leaked[:60]!r}")
    return out


#: Notes of a placebo the store could not supply (pipeline.memory.injection.draw_placebo).
PLACEBO_UNAVAILABLE = ("too few entries of other scenes", "no entries of other scenes")


def placebo_unavailable(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Tasks whose placebo injects nothing because the store ran out of eligible entries."""
    return [row["task_id"] for row in rows if not row["injected"]
            and any(u in str(n) for n in row.get("notes") or [] for u in PLACEBO_UNAVAILABLE)]


def check_placebo_matched(placebo: Iterable[Mapping[str, Any]], reference: Iterable[Mapping[str, Any]],
                          entry_scene: Mapping[str, str], tolerance: float = 0.02,
                          measure: Callable[[str], int] = len, unit: str = "characters") -> list[str]:
    """A placebo matches its reference (C2) task by task: as many advisories, none from an
    entry the reference injected or of the task's scene, a block within ``tolerance`` of
    the reference's length (``measure``: characters, or the model's tokens); nothing where
    the reference injects nothing. A task the store could not supply
    (:func:`placebo_unavailable`) is not a violation."""
    placebo = list(placebo)
    unavailable = set(placebo_unavailable(placebo))
    placebo = [row for row in placebo if row["task_id"] not in unavailable]
    out = []
    ref = {row["task_id"]: row for row in reference}
    for row in placebo:
        tid, c = row["task_id"], row["condition"]
        r2 = ref.get(tid)
        if r2 is None:
            out.append(f"{c} {tid}: no reference row")
            continue
        if not r2["injected"]:
            if row["injected"]:
                out.append(f"{c} {tid}: injects although the reference {r2['condition']} injects nothing")
            continue
        if not row["injected"]:
            out.append(f"{c} {tid}: injects nothing although {r2['condition']} does")
            continue
        if len(row["advisory_ids"]) != len(r2["advisory_ids"]):
            out.append(f"{c} {tid}: {len(row['advisory_ids'])} advisories, {r2['condition']} {len(r2['advisory_ids'])}")
        shared = sorted(set(row["injected_entry_ids"]) & set(r2["injected_entry_ids"]))
        if shared:
            out.append(f"{c} {tid}: injects entries {r2['condition']} injected too: {', '.join(shared[:3])}")
        same_scene = [e for e in row["injected_entry_ids"] if entry_scene.get(e) == str(row["scene_id"])]
        if same_scene:
            out.append(f"{c} {tid}: injects entries of the task's own scene: {', '.join(same_scene[:3])}")
        a, b = measure(row["memory_block"]), measure(r2["memory_block"])
        if abs(a - b) > tolerance * b:
            out.append(f"{c} {tid}: block of {a} {unit}, {r2['condition']}'s {b} (more than {tolerance:.0%} apart)")
    return out


def check_oracle_content(rows: Iterable[Mapping[str, Any]], plans: Mapping[str, Sequence[str]]) -> list[str]:
    """An oracle's block holds every step of its task's expert plan."""
    out = []
    for row in rows:
        tid, plan = row["task_id"], [str(p) for p in plans.get(row["task_id"], []) if str(p).strip()]
        if not plan:
            continue
        if not row["injected"]:
            out.append(f"{row['condition']} {tid}: the positive control injects nothing")
            continue
        missing = [p for p in plan if p not in row["memory_block"]]
        if missing:
            out.append(f"{row['condition']} {tid}: block lacks plan steps {missing[:3]}")
    return out


def _first_diff(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


# --------------------------------------------------------------------------- tables


def prompts_table(rows: list[dict]) -> pa.Table:
    """Rows of :func:`render_condition` as a table of :data:`PROMPTS_SCHEMA` (a clear error per
    bad field; a row without the :data:`LABEL_HINT_COLUMNS` gets nulls there)."""
    cols = {}
    for f in PROMPTS_SCHEMA:
        try:
            values = [r.get(f.name) if f.name in LABEL_HINT_COLUMNS else r[f.name] for r in rows]
            cols[f.name] = pa.array(values, type=f.type)
        except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"prompts row field {f.name!r}: {exc}") from exc
    return pa.table(cols, schema=PROMPTS_SCHEMA)


def load_eval_tasks(root: Path, cfg: Config) -> list[dict]:
    """The games manifest's tasks of ``experiment.eval_split`` (an error when there is none)."""
    manifest = root / cfg.paths.games / "manifest.parquet"
    rows = read_parquet(manifest).to_pylist()
    split = str(cfg.experiment.eval_split)
    tasks = [r for r in rows if r["split"] == split]
    if not tasks:
        raise ArtifactError(f"{manifest}: no task with split={split!r} (experiment.eval_split)")
    return tasks
