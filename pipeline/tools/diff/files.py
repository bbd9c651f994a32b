"""One file at both revisions: added, removed, the same, changed (a Parquet table's rows, a JSON
document's keys, a text's lines), or not compared because its data is missing."""

from __future__ import annotations

import difflib
import json
from pathlib import PurePosixPath
from typing import Any

from pipeline.tools.diff.revisions import MissingData, Rev
from pipeline.tools.diff.tables import diff_tables, read_table_rows
from pipeline.tools.diff.values import flatten, norm, window


def diff_json_docs(doc_a: Any, doc_b: Any, *, limit: int, width: int = 100) -> dict[str, Any]:
    """Two JSON documents by flattened key (:func:`~pipeline.tools.diff.values.flatten`): keys
    changed / added / removed, and the first ``limit`` of them with both values."""
    fa, fb = flatten(doc_a), flatten(doc_b)
    changed = sorted(k for k in set(fa) & set(fb) if norm(fa[k]) != norm(fb[k]))
    added, removed = sorted(set(fb) - set(fa)), sorted(set(fa) - set(fb))
    examples = []
    for k in (changed + added + removed)[:limit]:
        va, vb = window(fa.get(k), fb.get(k), width)
        examples.append({"key": k, "a": va if k in fa else "(absent)", "b": vb if k in fb else "(absent)"})
    return {"kind": "json", "keys_changed": len(changed), "keys_added": len(added), "keys_removed": len(removed),
            "examples": examples}


def diff_text(text_a: str, text_b: str, *, limit: int, name: str = "") -> dict[str, Any]:
    """Two texts line by line: lines added / removed, and the first ``8 * limit`` lines of their
    unified diff (one line of context)."""
    lines = list(difflib.unified_diff(text_a.splitlines(), text_b.splitlines(), "a/" + name, "b/" + name,
                                      lineterm="", n=1))
    body = [ln for ln in lines[2:]]
    return {"kind": "text", "lines_added": sum(ln.startswith("+") for ln in body),
            "lines_removed": sum(ln.startswith("-") for ln in body),
            "diff": body[: max(limit, 1) * 8]}


def diff_file(path: str, a: Rev, b: Rev, *, limit: int, width: int) -> dict[str, Any]:
    """One file at both revisions: ``status`` added / removed / same / changed (with its diff), or
    ``unavailable`` with ``missing`` = {side: the DVC output (or this file) whose data is not there}."""
    present, data, missing = _read_both(path, a, b)
    if missing:
        return {"path": path, "status": "unavailable", "missing": missing}
    if not present["a"] or not present["b"]:
        return {"path": path, "status": "added" if present["b"] else "removed"}
    if data["a"] == data["b"]:
        return {"path": path, "status": "same"}
    return {"path": path, "status": "changed", **diff_contents(path, data["a"], data["b"], limit=limit, width=width)}


def _read_both(path: str, a: Rev, b: Rev) -> tuple[dict[str, bool], dict[str, bytes], dict[str, str]]:
    """``(present, data, missing)`` by side (``a``, ``b``): whether the file is there, its bytes
    when it is there at both, and what is missing where its DVC output's data is not here."""
    sides = (("a", a), ("b", b))
    present, data, missing = {}, {}, {}
    for side, rev in sides:
        try:
            present[side] = rev.present(path)
        except MissingData as exc:
            missing[side] = exc.what
    if not missing and present["a"] and present["b"]:
        for side, rev in sides:
            try:
                data[side] = rev.read_bytes(path)
            except MissingData as exc:
                missing[side] = exc.what
    return present, data, missing


def diff_contents(path: str, da: bytes, db: bytes, *, limit: int, width: int) -> dict[str, Any]:
    """The diff of a file's two versions, by its suffix: a Parquet table's rows, a JSON document's
    keys (its lines when a side is not valid JSON), or a text's lines."""
    suffix = PurePosixPath(path).suffix
    if suffix == ".parquet":
        return diff_tables(read_table_rows(da, path), read_table_rows(db, path), limit=limit, width=width,
                           where=path)
    if suffix == ".json":
        try:
            return diff_json_docs(json.loads(da), json.loads(db), limit=limit, width=width)
        except json.JSONDecodeError:
            pass
    return diff_text(da.decode("utf-8", "replace"), db.decode("utf-8", "replace"), limit=limit, name=path)
