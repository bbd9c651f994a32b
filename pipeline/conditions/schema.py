"""The prompts' Parquet contract: one row per eval task and condition (``data/prompts/<C>.parquet``).

The ``render`` stage reads the eval tasks, renders them (:mod:`pipeline.conditions.render`)
and writes the rows as a table of :data:`PROMPTS_SCHEMA`::

    tasks = load_eval_tasks(root, cfg)
    rows, report = render_condition(tasks, "C2", cfg, store, root)
    write_parquet(prompts_table(rows), out, sort_by=["scene_id", "quest_id"],
                  schema_version=PROMPTS_SCHEMA_VERSION)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa

from pipeline.core.conf_schema import Config
from pipeline.core.io import ArtifactError, read_parquet, safe_name

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


def task_id(row: Mapping[str, Any]) -> str:
    """``"<scene_id>/<quest_id>"`` of a task or prompt row."""
    return f"{row['scene_id']}/{row['quest_id']}"


def prompts_table(rows: list[dict]) -> pa.Table:
    """Rows of :func:`~pipeline.conditions.render.render_condition` as a table of
    :data:`PROMPTS_SCHEMA` (a clear error per bad field; a row without the
    :data:`LABEL_HINT_COLUMNS` gets nulls there)."""
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
    for i, r in enumerate(rows):  # a scene id names the merged grounding file its prompt reads
        if r["split"] == split:
            for key in ("scene_id", "quest_id"):
                safe_name(r[key], f"{manifest}, row {i}", key)
    return tasks
