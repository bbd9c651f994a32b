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
    lines = list(difflib.unified_diff(text_a.splitlines(), text_b.splitlines(), "a/" + name, "b/" + name,
                                      lineterm="", n=1))
    body = [ln for ln in lines[2:]]
    return {"kind": "text", "lines_added": sum(ln.startswith("+") for ln in body),
            "lines_removed": sum(ln.startswith("-") for ln in body),
            "diff": body[: max(limit, 1) * 8]}


def diff_file(path: str, a: Rev, b: Rev, *, limit: int, width: int) -> dict[str, Any]:
    """One file at both revisions: ``status`` added / removed / same / changed (with its diff), or
    ``unavailable`` with ``missing`` = {side: the DVC output (or this file) whose data is not there}."""
    out: dict[str, Any] = {"path": path}
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
    if missing:
        out.update(status="unavailable", missing=missing)
        return out
    if not present["a"] or not present["b"]:
        out["status"] = "added" if present["b"] else "removed"
        return out
    da, db = data["a"], data["b"]
    if da == db:
        out["status"] = "same"
        return out
    out["status"] = "changed"
    suffix = PurePosixPath(path).suffix
    if suffix == ".parquet":
        out.update(diff_tables(read_table_rows(da, path), read_table_rows(db, path), limit=limit, width=width,
                               where=path))
    elif suffix == ".json":
        try:
            out.update(diff_json_docs(json.loads(da), json.loads(db), limit=limit, width=width))
        except json.JSONDecodeError:
            out.update(diff_text(da.decode("utf-8", "replace"), db.decode("utf-8", "replace"), limit=limit,
                                 name=path))
    else:
        out.update(diff_text(da.decode("utf-8", "replace"), db.decode("utf-8", "replace"), limit=limit, name=path))
    return out
