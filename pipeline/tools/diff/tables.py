"""The row-level diff of two tables (Parquet artifacts): rows matched by key columns, rows
added / removed / changed, changes per column, and the first changed rows side by side."""

from __future__ import annotations

import io
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.tools.diff.revisions import DiffError
from pipeline.tools.diff.values import norm, window

#: Columns shown first when a changed row is printed (what a researcher looks at).
SHOW_FIRST = ("system_prompt", "prompt", "generated_text", "reasoning", "action", "command", "env_feedback",
              "feedback_lines", "status", "won", "is_correct", "final_reward", "num_turns", "memory_block")


def key_columns(names: Sequence[str]) -> list[str]:
    """How rows of a table are matched across revisions."""
    cols = set(names)
    if "entry_id" in cols:
        return ["entry_id"]
    if "episode_id" in cols:
        key = ["episode_id"] + (["turn_index"] if "turn_index" in cols else [])
        return key + (["condition"] if "condition" in cols and "turn_index" not in cols else [])
    for task in (["task_id"], ["scene_id", "quest_id"]):
        if set(task) <= cols:  # a stream's steps: one per agent, condition and task
            return task + [c for c in ("condition", "agent") if c in cols]
    return []


def diff_tables(rows_a: list[dict], rows_b: list[dict], *, limit: int, width: int = 100,
                where: str = "") -> dict[str, Any]:
    """Row-level diff of two tables matched by :func:`key_columns`."""
    cols_a = list(rows_a[0]) if rows_a else []
    cols_b = list(rows_b[0]) if rows_b else []
    names = cols_a + [c for c in cols_b if c not in cols_a]
    key = key_columns(names)
    note = None
    if not key:
        note = "no key column: rows matched by position"
    a, b = _index_rows(rows_a, key, where), _index_rows(rows_b, key, where)
    common = sorted(set(a) & set(b), key=lambda k: tuple(str(x) for x in k))
    compared = [c for c in names if c not in key]
    changed_keys, per_col = _changed_rows(a, b, common, compared)
    examples = _row_examples(a, b, changed_keys[:limit], names, key, width)
    added = sorted(set(b) - set(a), key=lambda k: tuple(str(x) for x in k))
    removed = sorted(set(a) - set(b), key=lambda k: tuple(str(x) for x in k))
    return {
        "kind": "table",
        "key": key,
        "rows_a": len(rows_a),
        "rows_b": len(rows_b),
        "added": len(added),
        "removed": len(removed),
        "changed": len(changed_keys),
        "unchanged": len(common) - len(changed_keys),
        "columns_added": [c for c in cols_b if c not in cols_a] if rows_a and rows_b else [],
        "columns_removed": [c for c in cols_a if c not in cols_b] if rows_a and rows_b else [],
        "column_changes": {c: n for c, n in per_col.items() if n},
        "added_keys": [_key_text(key, k) for k in added[:limit]],
        "removed_keys": [_key_text(key, k) for k in removed[:limit]],
        "examples": examples,
        **({"note": note} if note else {}),
    }


def _index_rows(rows: list[dict], key: list[str], where: str) -> dict[tuple, dict]:
    """Rows by their key values (by position when there is no key column)."""
    out: dict[tuple, dict] = {}
    for i, r in enumerate(rows):
        k = tuple(r.get(c) for c in key) if key else (i,)
        if k in out:
            raise DiffError(f"{where}: key {dict(zip(key, k))} occurs twice; cannot match rows")
        out[k] = r
    return out


def _changed_rows(a: dict[tuple, dict], b: dict[tuple, dict], common: list[tuple],
                  compared: list[str]) -> tuple[list[tuple[tuple, list[str]]], dict[str, int]]:
    """``(key, differing columns)`` of every common row that differs, and changes per column."""
    per_col = {c: 0 for c in compared}
    changed_keys = []
    for k in common:
        diff_cols = [c for c in compared if norm(a[k].get(c)) != norm(b[k].get(c))]
        for c in diff_cols:
            per_col[c] += 1
        if diff_cols:
            changed_keys.append((k, diff_cols))
    return changed_keys, per_col


def _row_examples(a: dict[tuple, dict], b: dict[tuple, dict], shown: list[tuple[tuple, list[str]]],
                  names: list[str], key: list[str], width: int) -> list[dict]:
    """The shown changed rows side by side, :data:`SHOW_FIRST` columns first."""

    def order(c: str) -> tuple:
        return (SHOW_FIRST.index(c) if c in SHOW_FIRST else len(SHOW_FIRST), names.index(c))

    examples = []
    for k, diff_cols in shown:
        cells = []
        for c in sorted(diff_cols, key=order):
            va, vb = window(a[k].get(c), b[k].get(c), width)
            cells.append({"column": c, "a": va, "b": vb})
        examples.append({"key": {c: v for c, v in zip(key or ["row"], k)}, "changes": cells})
    return examples


def _key_text(key: Sequence[str], k: tuple) -> str:
    return ", ".join(f"{c}={v}" for c, v in zip(key or ["row"], k))


def read_table_rows(data: bytes, path: str) -> list[dict]:
    """A Parquet file's rows (``path`` names it in the error when it cannot be read)."""
    try:
        return pq.read_table(io.BytesIO(data)).to_pylist()
    except (pa.ArrowInvalid, OSError) as exc:
        raise DiffError(f"corrupt Parquet file {path}: {exc}") from exc
