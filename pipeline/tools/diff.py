"""Artifact diff between two experiments: params, metrics, and the rows of every artifact.

    python -m pipeline.tools.diff HEAD~1 HEAD                 # two git revisions
    python -m pipeline.tools.diff main my-exp                 # a branch and a DVC experiment name
    python -m pipeline.tools.diff HEAD workspace              # the last commit and the working tree
    python -m pipeline.tools.diff exp-a exp-b --artifact turns --limit 3
    python -m pipeline.tools.diff exp-a exp-b --json > diff.json

A and B are git revisions (commit, branch, tag, ``HEAD~2``), DVC experiment names (as
``dvc exp show`` lists them) or ``workspace``. Artifacts are read at each revision through
``dvc.api.DVCFileSystem`` (DVC-tracked outputs come from the local cache, so experiments
run here with ``dvc exp run`` / ``dvc queue start`` are readable; pull first otherwise).

What is shown:

- params: every ``params.yaml`` key whose value differs;
- metrics: every number under ``paths.metrics`` (``metrics/**/*.json``) that differs, with
  its delta;
- artifacts (``--artifact`` picks some): ``episodes`` (collect + evaluate episodes),
  ``turns``, ``prompts``, ``store`` (Parquet, rows matched by key: ``entry_id``;
  ``episode_id`` + ``turn_index``; task + ``condition``) with rows added / removed /
  changed, per-column change counts and the first ``--limit`` changed rows side by side
  (prompt, generated text, action, feedback first); ``grounding`` (per-episode JSON/TXT
  files and the merged Markdown/JSON) with files added / removed / changed, changed JSON
  keys and the first differing lines of text files.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.core.config import project_root

WORKSPACE = "workspace"

#: Default artifact locations (``paths.*`` in params.yaml at each revision overrides them).
DEFAULT_PATHS = {"episodes": "data/episodes", "eval": "data/eval", "prompts": "data/prompts",
                 "store": "data/store", "grounding": "data/grounding",
                 "grounding_merged": "data/grounding_merged", "metrics": "metrics"}

#: Artifact -> (paths key, glob patterns under it). ``**`` matches any depth.
ARTIFACTS: dict[str, list[tuple[str, list[str]]]] = {
    "episodes": [("episodes", ["episodes.parquet"]), ("eval", ["*/episodes.parquet"])],
    "turns": [("episodes", ["turns.parquet"]), ("eval", ["*/turns.parquet"])],
    "prompts": [("prompts", ["*.parquet"])],
    "store": [("store", ["*.parquet"])],
    "grounding": [("grounding", ["**.json", "**.txt"]), ("grounding_merged", ["**.md", "**.json"])],
}

#: Columns shown first when a changed row is printed (what a researcher looks at).
SHOW_FIRST = ("system_prompt", "prompt", "generated_text", "reasoning", "action", "command", "env_feedback",
              "feedback_lines", "status", "won", "is_correct", "final_reward", "num_turns", "memory_block")


class DiffError(RuntimeError):
    """A revision cannot be resolved or an artifact cannot be read (message names it)."""


# --------------------------------------------------------------------------- revisions


@dataclass
class Rev:
    """Read access to the project's files at one revision.

    Attributes:
        name: What the user typed (``HEAD~1``, ``my-exp``, ``workspace``).
        sha: The resolved commit (None for the workspace).
        kind: ``workspace`` | ``experiment`` | ``git``.
    """

    name: str
    sha: str | None
    kind: str
    root: Path
    fs: Any = None  # DVCFileSystem for git revisions / experiments

    def exists(self, path: str) -> bool:
        if self.fs is None:
            return (self.root / path).is_file()
        return bool(self.fs.exists(path)) and bool(self.fs.isfile(path))

    def read_bytes(self, path: str) -> bytes:
        try:
            if self.fs is None:
                return (self.root / path).read_bytes()
            with self.fs.open(path, "rb") as fh:
                return fh.read()
        except Exception as exc:  # missing cache object, permission, ...
            raise DiffError(f"cannot read {path} at {self.label}: {exc} (not in the local DVC cache? "
                            "`dvc pull` / `dvc exp pull` it first)") from exc

    def find(self, folder: str) -> list[str]:
        """Files under ``folder`` (posix paths relative to the repo root), sorted."""
        if self.fs is None:
            base = self.root / folder
            if not base.is_dir():
                return []
            return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())
        if not self.fs.exists(folder) or not self.fs.isdir(folder):
            return []
        return sorted(str(p).lstrip("/") for p in self.fs.find(folder))

    @property
    def label(self) -> str:
        return self.name if self.sha is None else f"{self.name} ({self.sha[:7]})"


def open_rev(root: str | Path, name: str) -> Rev:
    """Resolve ``name`` (``workspace``, a DVC experiment name or a git revision)."""
    root = Path(root).resolve()
    if name == WORKSPACE:
        return Rev(name=name, sha=None, kind=WORKSPACE, root=root)
    # deferred: heavy dependency (dvc), needed for git revisions and experiments only
    from dvc.api import DVCFileSystem
    from dvc.repo import Repo

    try:
        repo = Repo(str(root))
    except Exception as exc:
        raise DiffError(f"{root} is not a DVC repository: {exc}") from exc
    kind, sha = "git", None
    try:
        from dvc.repo.experiments.utils import resolve_name  # deferred: heavy dependency (dvc)

        ref = resolve_name(repo.scm, name).get(name)
        if ref is not None:
            sha, kind = repo.scm.get_ref(str(ref)), "experiment"
    except Exception:  # not an experiment name (or ambiguous): try it as a git revision
        sha = None
    if sha is None:
        try:
            sha = repo.scm.resolve_rev(name)
        except Exception as exc:
            raise DiffError(f"unknown revision {name!r}: not a git revision, a DVC experiment name "
                            f"(see `dvc exp show`) or 'workspace'") from exc
    return Rev(name=name, sha=sha, kind=kind, root=root, fs=DVCFileSystem(str(root), rev=sha))


# --------------------------------------------------------------------------- values


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys -> leaf values (lists are leaves: compared whole)."""
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k in obj:
            key = f"{prefix}.{k}" if prefix else str(k)
            out.update(flatten(obj[k], key))
        if not obj and prefix:
            out[prefix] = {}
        return out
    return {prefix: obj}


def _norm(v: Any) -> Any:
    """A hashable, comparable form of a cell (lists/structs as canonical JSON; NaN == NaN)."""
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    return v


def _short(v: Any, width: int) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
    s = s.replace("\n", "\\n")
    return s if len(s) <= width else s[: width - 1] + "…"


def _window(a: Any, b: Any, width: int) -> tuple[str, str]:
    """Both values around their first difference (long prompts differ deep inside)."""
    sa = a if isinstance(a, str) else json.dumps(a, ensure_ascii=False, default=str)
    sb = b if isinstance(b, str) else json.dumps(b, ensure_ascii=False, default=str)
    if len(sa) <= width and len(sb) <= width:
        return _short(sa, width), _short(sb, width)
    i = next((k for k, (x, y) in enumerate(zip(sa, sb)) if x != y), min(len(sa), len(sb)))
    start = max(0, i - width // 3)
    pre = f"…[@{start}]" if start else ""
    return pre + _short(sa[start:], width - len(pre)), pre + _short(sb[start:], width - len(pre))


def key_columns(names: Sequence[str]) -> list[str]:
    """How rows of a table are matched across revisions."""
    cols = set(names)
    if "entry_id" in cols:
        return ["entry_id"]
    if "episode_id" in cols:
        key = ["episode_id"] + (["turn_index"] if "turn_index" in cols else [])
        return key + (["condition"] if "condition" in cols and "turn_index" not in cols else [])
    for task in (["task_id"], ["scene_id", "quest_id"]):
        if set(task) <= cols:
            return task + (["condition"] if "condition" in cols else [])
    return []


# --------------------------------------------------------------------------- per file


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
        diff_cols = [c for c in compared if _norm(a[k].get(c)) != _norm(b[k].get(c))]
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
            va, vb = _window(a[k].get(c), b[k].get(c), width)
            cells.append({"column": c, "a": va, "b": vb})
        examples.append({"key": {c: v for c, v in zip(key or ["row"], k)}, "changes": cells})
    return examples


def _key_text(key: Sequence[str], k: tuple) -> str:
    return ", ".join(f"{c}={v}" for c, v in zip(key or ["row"], k))


def diff_json_docs(doc_a: Any, doc_b: Any, *, limit: int, width: int = 100) -> dict[str, Any]:
    fa, fb = flatten(doc_a), flatten(doc_b)
    changed = sorted(k for k in set(fa) & set(fb) if _norm(fa[k]) != _norm(fb[k]))
    added, removed = sorted(set(fb) - set(fa)), sorted(set(fa) - set(fb))
    examples = []
    for k in (changed + added + removed)[:limit]:
        va, vb = _window(fa.get(k), fb.get(k), width)
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


def read_table_rows(data: bytes, path: str) -> list[dict]:
    try:
        return pq.read_table(io.BytesIO(data)).to_pylist()
    except (pa.ArrowInvalid, OSError) as exc:
        raise DiffError(f"corrupt Parquet file {path}: {exc}") from exc


def diff_file(path: str, a: Rev, b: Rev, *, limit: int, width: int) -> dict[str, Any]:
    in_a, in_b = a.exists(path), b.exists(path)
    out: dict[str, Any] = {"path": path}
    if not in_a or not in_b:
        out["status"] = "added" if in_b else "removed"
        return out
    da, db = a.read_bytes(path), b.read_bytes(path)
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


# --------------------------------------------------------------------------- whole diff


def load_params_at(rev: Rev) -> dict:
    if not rev.exists("params.yaml"):
        return {}
    try:
        return yaml.safe_load(rev.read_bytes("params.yaml")) or {}
    except yaml.YAMLError as exc:
        raise DiffError(f"params.yaml at {rev.label} is not valid YAML: {exc}") from exc


def paths_at(params: Mapping[str, Any]) -> dict[str, str]:
    paths = dict(DEFAULT_PATHS)
    for k, v in (params.get("paths") or {}).items():
        if isinstance(v, str):
            paths[k] = v.rstrip("/")
    return paths


def diff_params(pa_: Mapping[str, Any], pb: Mapping[str, Any]) -> list[dict]:
    fa, fb = flatten(pa_), flatten(pb)
    return [{"key": k, "a": fa.get(k, "(absent)"), "b": fb.get(k, "(absent)")}
            for k in sorted(set(fa) | set(fb)) if _norm(fa.get(k, "(absent)")) != _norm(fb.get(k, "(absent)"))]


def _numbers(doc: Any) -> dict[str, Any]:
    return {k: v for k, v in flatten(doc).items() if isinstance(v, (int, float, str, bool)) or v is None}


def diff_metrics(a: Rev, b: Rev, dir_a: str, dir_b: str) -> list[dict]:
    files = sorted({p[len(dir_a) + 1:] for p in a.find(dir_a) if p.endswith(".json")}
                   | {p[len(dir_b) + 1:] for p in b.find(dir_b) if p.endswith(".json")})
    out = []
    for rel in files:
        docs = []
        for rev, d in ((a, dir_a), (b, dir_b)):
            path = f"{d}/{rel}"
            try:
                docs.append(_numbers(json.loads(rev.read_bytes(path))) if rev.exists(path) else {})
            except json.JSONDecodeError:
                docs.append({})
        for k in sorted(set(docs[0]) | set(docs[1])):
            va, vb = docs[0].get(k), docs[1].get(k)
            if _norm(va) == _norm(vb):
                continue
            row = {"file": rel, "key": k, "a": va, "b": vb}
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and not isinstance(va, bool) \
                    and not isinstance(vb, bool):
                row["delta"] = round(vb - va, 10)
            out.append(row)
    return out


def artifact_files(rev: Rev, paths: Mapping[str, str], artifact: str) -> list[str]:
    files = []
    for key, patterns in ARTIFACTS[artifact]:
        base = paths.get(key, DEFAULT_PATHS[key])
        for p in rev.find(base):
            rel = p[len(base) + 1:]
            if any(fnmatch.fnmatch(rel, pat.replace("**", "*")) for pat in patterns):
                files.append(p)
    return files


def diff_revisions(root: str | Path, rev_a: str, rev_b: str, *, artifacts: Iterable[str] | None = None,
                   limit: int = 5, width: int = 100,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The whole diff as a JSON-ready dict (what ``--json`` prints).

    Args:
        root: The repository (a DVC project inside a git repository).
        rev_a: ``workspace``, an experiment name or a git revision.
        rev_b: Same.
        artifacts: Names from :data:`ARTIFACTS` (default: all).
        limit: Changed rows / keys / files shown per file.
        width: Characters kept per shown value.
    """
    names = list(artifacts or ARTIFACTS)
    unknown = [n for n in names if n not in ARTIFACTS]
    if unknown:
        raise DiffError(f"--artifact {unknown[0]!r}: expected one of {', '.join(ARTIFACTS)}")
    a, b = open_rev(root, rev_a), open_rev(root, rev_b)
    params_a, params_b = load_params_at(a), load_params_at(b)
    paths_a, paths_b = paths_at(params_a), paths_at(params_b)
    result: dict[str, Any] = {
        "a": {"rev": a.name, "sha": a.sha, "kind": a.kind},
        "b": {"rev": b.name, "sha": b.sha, "kind": b.kind},
        "params": diff_params(params_a, params_b),
        "metrics": diff_metrics(a, b, paths_a["metrics"], paths_b["metrics"]),
        "artifacts": {},
    }
    for name in names:
        files = sorted(set(artifact_files(a, paths_a, name)) | set(artifact_files(b, paths_b, name)))
        entries = []
        for path in files:
            if progress:
                progress(path)
            entries.append(diff_file(path, a, b, limit=limit, width=width))
        summary = {s: sum(e["status"] == s for e in entries) for s in ("added", "removed", "changed", "same")}
        result["artifacts"][name] = {"files": summary,
                                     "entries": [e for e in entries if e["status"] != "same"]}
    return result


# --------------------------------------------------------------------------- text output


def format_diff(d: Mapping[str, Any], *, limit: int = 5) -> str:
    a, b = d["a"]["rev"], d["b"]["rev"]
    out = [f"diff A={a}{' (' + d['a']['sha'][:7] + ')' if d['a']['sha'] else ''} "
           f"B={b}{' (' + d['b']['sha'][:7] + ')' if d['b']['sha'] else ''}", ""]
    out.append(f"params: {len(d['params'])} differ")
    for p in d["params"]:
        out.append(f"  {p['key']}: {_short(p['a'], 60)} -> {_short(p['b'], 60)}")
    out.append(f"metrics: {len(d['metrics'])} differ")
    for m in d["metrics"]:
        delta = f"  (Δ {m['delta']:+.6g})" if "delta" in m else ""
        out.append(f"  {m['file']}  {m['key']}: {_short(m['a'], 30)} -> {_short(m['b'], 30)}{delta}")
    for name, art in d["artifacts"].items():
        s = art["files"]
        if not any(s.values()):
            out += ["", f"== {name}: not present at either revision"]
            continue
        out += ["", f"== {name}: {s['changed']} file(s) changed, {s['added']} added, {s['removed']} removed, "
                    f"{s['same']} identical"]
        for e in art["entries"]:
            out += _format_entry(e, limit)
    return "\n".join(out) + "\n"


def _format_entry(e: Mapping[str, Any], limit: int) -> list[str]:
    """The lines of one file's entry: added / removed, or its table, JSON or text changes."""
    if e["status"] != "changed":
        return [f"  {e['status']}: {e['path']}"]
    if e["kind"] == "table":
        return _format_table_entry(e, limit)
    out = []
    if e["kind"] == "json":
        out.append(f"  {e['path']}: {e['keys_changed']} key(s) changed, {e['keys_added']} added, "
                   f"{e['keys_removed']} removed")
        for ex in e["examples"]:
            out.append(f"    {ex['key']}:  A: {ex['a']}")
            out.append(f"    {'':<{len(ex['key'])}}   B: {ex['b']}")
    else:
        out.append(f"  {e['path']}: +{e['lines_added']} -{e['lines_removed']} lines")
        out += [f"    {ln}" for ln in e["diff"]]
    return out


def _format_table_entry(e: Mapping[str, Any], limit: int) -> list[str]:
    """A changed Parquet file: counts, column changes, added / removed keys, changed rows."""
    out = [f"  {e['path']}  (key: {', '.join(e['key']) or 'row position'}; rows {e['rows_a']} -> "
           f"{e['rows_b']}): {e['added']} added, {e['removed']} removed, {e['changed']} changed"]
    if e["columns_added"] or e["columns_removed"]:
        out.append(f"    columns added {e['columns_added']}, removed {e['columns_removed']}")
    if e["column_changes"]:
        out.append("    changed cells per column: " + ", ".join(
            f"{c}={n}" for c, n in sorted(e["column_changes"].items(), key=lambda x: (-x[1], x[0]))))
    for k in e["added_keys"]:
        out.append(f"    + {k}")
    for k in e["removed_keys"]:
        out.append(f"    - {k}")
    for ex in e["examples"][:limit]:
        out.append("    ~ " + ", ".join(f"{c}={v}" for c, v in ex["key"].items()))
        colw = max(len(c["column"]) for c in ex["changes"])
        for c in ex["changes"]:
            out.append(f"        {c['column']:<{colw}}  A: {c['a']}")
            out.append(f"        {'':<{colw}}  B: {c['b']}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.diff", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="git revision, DVC experiment name or 'workspace'")
    parser.add_argument("b", help="git revision, DVC experiment name or 'workspace'")
    parser.add_argument("--artifact", action="append", choices=list(ARTIFACTS),
                        help="artifact to diff (repeatable; default: all)")
    parser.add_argument("--limit", type=int, default=5, help="changed rows/keys shown per file (default 5)")
    parser.add_argument("--width", type=int, default=100, help="characters shown per value (default 100)")
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")
    parser.add_argument("--repo", default=".", help="repository root (default: the current folder)")
    args = parser.parse_args(argv)
    if args.limit < 0:
        parser.error("--limit must be >= 0")
    try:
        root = project_root(Path(args.repo))
        d = diff_revisions(root, args.a, args.b, artifacts=args.artifact, limit=args.limit, width=args.width)
    except DiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(d, ensure_ascii=False, indent=2, sort_keys=True, default=str) + "\n")
    else:
        sys.stdout.write(format_diff(d, limit=args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
