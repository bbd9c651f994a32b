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

Missing data: when a DVC output's data is not in the local cache at a revision (a
``dvc.lock`` built on another machine, an experiment whose data ``dvc gc`` removed) or not
in the working tree (``workspace``), its files are listed as "not compared" with the
reason, and a "missing data" block names the revision, the outputs and the commands that
bring them back (``dvc pull``, ``dvc repro``, ``dvc exp apply NAME``, ``dvc checkout``).
Params and metrics (in git) are still diffed. The exit status is 1 only when missing data
left nothing at all to compare.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import io
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.core.config import project_root
from pipeline.tools import git_revision

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


class MissingData(DiffError):
    """A DVC output's data is not readable at one revision: not in the local DVC cache (a git
    revision or an experiment) or not in the working tree (``workspace``).

    Attributes:
        output: The DVC output that ``path`` belongs to.
        path: The file that was asked for.
        what: ``output`` when none of it can be read (its files cannot even be listed),
            ``path`` when only that file's data is missing.
    """

    def __init__(self, rev: "Rev", output: str, path: str, *, whole: bool):
        self.rev, self.output, self.path = rev, output, path
        self.what = output if whole else path
        super().__init__(f"{self.what} at {rev.label} is {rev.missing_reason}")


# --------------------------------------------------------------------------- revisions


def _dvc_read_errors() -> tuple[type[BaseException], ...]:
    """What DVCFileSystem raises for an output whose data is not in the local cache: a
    directory output whose ``.dir`` object is missing cannot be listed
    (``DataIndexDirError``); a file whose object is missing cannot be opened
    (``FileNotFoundError: No storage files available``)."""
    from dvc_data.index import DataIndexDirError  # deferred: heavy dependency (dvc)

    return (DataIndexDirError, FileNotFoundError)


@dataclass
class Rev:
    """Read access to the project's files at one revision.

    Attributes:
        name: What the user typed (``HEAD~1``, ``my-exp``, ``workspace``).
        sha: The resolved commit (None for the workspace).
        kind: ``workspace`` | ``experiment`` | ``git``.
        at_head: The commit is the one checked out (restoring its data needs no checkout).
        missing: DVC outputs (paths) found unreadable so far, whole or in part (see
            :class:`MissingData`); ``partly`` holds those only some of whose files are missing.
    """

    name: str
    sha: str | None
    kind: str
    root: Path
    fs: Any = None  # DVCFileSystem for git revisions / experiments
    at_head: bool = False
    missing: list[str] = field(default_factory=list)
    partly: set[str] = field(default_factory=set)
    _outputs: list[str] | None = field(default=None, repr=False)
    _probed: set[str] = field(default_factory=set, repr=False)

    @property
    def outputs(self) -> list[str]:
        """The cached DVC outputs declared at this revision (paths relative to the root)."""
        if self._outputs is None:
            self._outputs = self._load_outputs()
        return self._outputs

    def _load_outputs(self) -> list[str]:
        from dvc.exceptions import DvcException  # deferred: heavy dependency (dvc)

        if self.fs is not None:
            repo = self.fs.repo
        else:
            from dvc.repo import Repo  # deferred: heavy dependency (dvc)

            try:
                repo = Repo(str(self.root))
            except DvcException:  # not a DVC project: plain files only
                return []
        try:
            outs = [o for o in repo.index.outs if o.use_cache]
            return sorted(repo.fs.relpath(o.fs_path, repo.root_dir).replace("\\", "/") for o in outs)
        except DvcException:  # dvc.yaml being edited in the working tree: no output checks there
            if self.fs is None:
                return []
            raise
        finally:
            if self.fs is None:
                repo.close()

    def output_of(self, path: str) -> str | None:
        """The DVC output that is ``path`` or contains it."""
        owners = [o for o in self.outputs if path == o or path.startswith(o + "/")]
        return max(owners, key=len) if owners else None

    def missing_output_of(self, path: str) -> str | None:
        """The wholly unreadable output that is ``path`` or contains it (None: not known to be)."""
        owners = [o for o in self.missing if o not in self.partly and (path == o or path.startswith(o + "/"))]
        return max(owners, key=len) if owners else None

    def _mark_missing(self, output: str, *, whole: bool = True) -> None:
        if output not in self.missing:
            self.missing.append(output)
            self.missing.sort()
            if not whole:
                self.partly.add(output)
        elif whole:
            self.partly.discard(output)

    @property
    def missing_reason(self) -> str:
        return "not in the working tree" if self.fs is None else "not in the local DVC cache"

    def present(self, path: str) -> bool:
        """Whether ``path`` is a file at this revision; :class:`MissingData` when it is in a DVC
        output whose data is not here (so whether it exists cannot be told)."""
        missing = self.missing_output_of(path)
        if missing is None and not self.exists(path):
            output = self.output_of(path)
            if output is None or output in self._probed:
                return False
            self._probed.add(output)
            self.find(output)  # marks the output missing when its data is not here
            missing = self.missing_output_of(path)
            if missing is None:
                return False
        if missing is not None:
            raise MissingData(self, missing, path, whole=True)
        return True

    def exists(self, path: str) -> bool:
        if self.fs is None:
            return (self.root / path).is_file()
        return bool(self.fs.exists(path)) and bool(self.fs.isfile(path))

    def read_bytes(self, path: str) -> bytes:
        """The file's bytes; :class:`MissingData` when its DVC output's data is not here."""
        missing = self.missing_output_of(path)
        if missing is not None:
            raise MissingData(self, missing, path, whole=True)
        if self.fs is None:
            try:
                return (self.root / path).read_bytes()
            except OSError as exc:
                raise DiffError(f"cannot read {path} at {self.label}: {exc}") from exc
        try:
            with self.fs.open(path, "rb") as fh:
                return fh.read()
        except _dvc_read_errors() as exc:
            output = self.output_of(path)
            if output is None:  # a git-tracked file that vanished: not a cache problem
                raise DiffError(f"cannot read {path} at {self.label}: {exc}") from exc
            # A file output, or one file of a directory output that could be listed.
            whole = output == path or not isinstance(exc, FileNotFoundError)
            self._mark_missing(output, whole=whole)
            raise MissingData(self, output, path, whole=whole) from exc
        except OSError as exc:  # permission, I/O error
            raise DiffError(f"cannot read {path} at {self.label}: {exc}") from exc

    def find(self, folder: str) -> list[str]:
        """Files under ``folder`` (posix paths relative to the repo root), sorted.

        DVC outputs in or above ``folder`` whose data is not here are added to
        :attr:`missing` (their files are then not listed).
        """
        if self.fs is None:
            return self._find_workspace(folder)
        found: list[str] = []
        self._walk(folder.strip("/"), found)
        return sorted(found)

    def _find_workspace(self, folder: str) -> list[str]:
        for out in self.outputs:  # declared outputs, in or above `folder`, absent from the working tree
            if (out == folder or out.startswith(folder + "/") or folder.startswith(out + "/")) \
                    and not (self.root / out).exists():
                self._mark_missing(out)
        base = self.root / folder
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())

    def _walk(self, path: str, found: list[str]) -> None:
        dir_error = _dvc_read_errors()[0]
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return
        except dir_error:  # a directory output (or one above `path`) whose .dir object is not cached
            output = self.output_of(path)
            if output is None:
                raise
            self._mark_missing(output)
            return
        for e in entries:
            name = str(e["name"]).strip("/")
            if e["type"] == "directory":
                self._walk(name, found)
            else:
                found.append(name)

    @property
    def label(self) -> str:
        return self.name if self.sha is None else f"{self.name} ({self.sha[:7]})"

    def restore_commands(self, has_remote: bool) -> list[tuple[str, str]]:
        """``(command, what it does)`` pairs that bring this revision's missing outputs back."""
        if self.kind == WORKSPACE:
            return [("dvc checkout", "restore them from the local DVC cache"),
                    ("dvc pull", "download them from the DVC remote" + ("" if has_remote else NO_REMOTE)),
                    ("dvc repro", "rebuild them")]
        if self.kind == "experiment":
            return [(f"dvc exp apply {self.name} && dvc pull",
                     "download them from the DVC remote, if they were pushed" + ("" if has_remote else NO_REMOTE)),
                    (f"dvc exp apply {self.name} && dvc exp run",
                     f"rebuild: rerun {self.name}'s params (saved as a new experiment)")]
        checkout = "" if self.at_head else f"git checkout {self.sha[:7]} && "
        back = "" if self.at_head else " (`git checkout -` to come back)"
        return [(f"{checkout}dvc pull", "download them from the DVC remote" + ("" if has_remote else NO_REMOTE)),
                (f"{checkout}dvc repro", "rebuild them" + back)]


NO_REMOTE = " (no DVC remote is configured here: `dvc remote add`)"


def open_rev(root: str | Path, name: str) -> Rev:
    """Resolve ``name`` (``workspace``, a DVC experiment name or a git revision)."""
    root = Path(root).resolve()
    if name == WORKSPACE:
        return Rev(name=name, sha=None, kind=WORKSPACE, root=root)
    try:
        git_revision(name, "revision")  # never an option to git: `--output=...` would write a file
    except ValueError as exc:
        raise DiffError(str(exc)) from None
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
    return Rev(name=name, sha=sha, kind=kind, root=root, fs=DVCFileSystem(str(root), rev=sha),
               at_head=kind == "git" and sha == repo.scm.get_rev())


def has_dvc_remote(root: str | Path) -> bool:
    """Whether the project configures a DVC remote (``dvc remote list`` is not empty)."""
    from dvc.exceptions import DvcException  # deferred: heavy dependency (dvc)
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            return bool(repo.config.get("remote"))
    except DvcException:
        return False


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


# --------------------------------------------------------------------------- whole diff


def load_params_at(rev: Rev) -> dict:
    if not rev.present("params.yaml"):
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
    """Every number of the metrics JSON files that differs (see :func:`metrics_diff`)."""
    return metrics_diff(a, b, dir_a, dir_b)[0]


def metrics_diff(a: Rev, b: Rev, dir_a: str, dir_b: str) -> tuple[list[dict], int, list[dict]]:
    """``(differing numbers, files compared, files not compared)``: a metrics file in a DVC
    output whose data is not at one revision is not compared (``file``, ``missing``)."""
    unavailable: list[dict] = []
    files = sorted({p[len(dir_a) + 1:] for p in a.find(dir_a) if p.endswith(".json")}
                   | {p[len(dir_b) + 1:] for p in b.find(dir_b) if p.endswith(".json")})
    out = []
    for rel in files:
        docs, missing = [], {}
        for side, rev, d in (("a", a, dir_a), ("b", b, dir_b)):
            path = f"{d}/{rel}"
            try:
                docs.append(_numbers(json.loads(rev.read_bytes(path))) if rev.present(path) else {})
            except json.JSONDecodeError:
                docs.append({})
            except MissingData as exc:
                missing[side] = exc.what
        if missing:
            unavailable.append({"file": rel, "missing": missing})
            continue
        for k in sorted(set(docs[0]) | set(docs[1])):
            va, vb = docs[0].get(k), docs[1].get(k)
            if _norm(va) == _norm(vb):
                continue
            row = {"file": rel, "key": k, "a": va, "b": vb}
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and not isinstance(va, bool) \
                    and not isinstance(vb, bool):
                row["delta"] = round(vb - va, 10)
            out.append(row)
    return out, len(files) - len(unavailable), unavailable


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
    params_missing: dict[str, str] = {}
    params = []
    for side, rev in (("a", a), ("b", b)):
        try:
            params.append(load_params_at(rev))
        except MissingData as exc:  # params.yaml tracked by DVC and not here
            params_missing[side] = exc.what
            params.append({})
    params_a, params_b = params
    paths_a, paths_b = paths_at(params_a), paths_at(params_b)
    metrics, metrics_files, metrics_unavailable = metrics_diff(a, b, paths_a["metrics"], paths_b["metrics"])
    result: dict[str, Any] = {
        "a": {"rev": a.name, "sha": a.sha, "kind": a.kind},
        "b": {"rev": b.name, "sha": b.sha, "kind": b.kind},
        "params": [] if params_missing else diff_params(params_a, params_b),
        "metrics": metrics,
        "artifacts": {},
    }
    compared_files = 0
    for name in names:
        files = sorted(set(artifact_files(a, paths_a, name)) | set(artifact_files(b, paths_b, name)))
        entries = []
        for path in files:
            if progress:
                progress(path)
            entries.append(diff_file(path, a, b, limit=limit, width=width))
        summary = {s: sum(e["status"] == s for e in entries)
                   for s in ("added", "removed", "changed", "same", "unavailable")}
        compared_files += len(entries) - summary["unavailable"]
        result["artifacts"][name] = {"files": summary,
                                     "entries": [e for e in entries if e["status"] != "same"],
                                     "missing_outputs": _missing_under([k for k, _ in ARTIFACTS[name]],
                                                                         (a, paths_a), (b, paths_b))}
    result["compared"] = {"params": not params_missing and bool(params_a or params_b),
                          "metrics_files": metrics_files, "artifact_files": compared_files}
    result["unavailable"] = {"params": params_missing, "metrics": metrics_unavailable,
                             "metrics_outputs": _missing_under(["metrics"], (a, paths_a), (b, paths_b))}
    result["missing_data"] = missing_data(a, b, has_remote=bool((a.missing or b.missing) and has_dvc_remote(root)))
    return result


def _missing_under(keys: Iterable[str], *sides: tuple[Rev, Mapping[str, str]]) -> dict[str, list[str]]:
    """{side: missing outputs in or above the folders ``paths[key]`` at that revision}."""
    out = {}
    for side, (rev, paths) in zip("ab", sides):
        bases = [paths.get(key, DEFAULT_PATHS[key]) for key in keys]
        hit = [o for o in rev.missing
               if any(o == base or o.startswith(base + "/") or base.startswith(o + "/") for base in bases)]
        if hit:
            out[side] = hit
    return out


def missing_data(a: Rev, b: Rev, *, has_remote: bool) -> list[dict]:
    """Per revision with unreadable outputs: what they are, why, and the commands that fix it."""
    return [{"side": side, "rev": rev.name, "sha": rev.sha, "kind": rev.kind, "reason": rev.missing_reason,
             "outputs": list(rev.missing), "partly": sorted(rev.partly),
             "commands": [{"run": cmd, "does": why} for cmd, why in rev.restore_commands(has_remote)]}
            for side, rev in (("a", a), ("b", b)) if rev.missing]


def nothing_compared(d: Mapping[str, Any]) -> bool:
    """True when missing data left nothing to compare: no params, no metrics file, no artifact file."""
    c = d["compared"]
    return bool(d["missing_data"]) and not (c["params"] or c["metrics_files"] or c["artifact_files"])


# --------------------------------------------------------------------------- text output


def format_diff(d: Mapping[str, Any], *, limit: int = 5) -> str:
    a, b = d["a"]["rev"], d["b"]["rev"]
    out = [f"diff A={a}{' (' + d['a']['sha'][:7] + ')' if d['a']['sha'] else ''} "
           f"B={b}{' (' + d['b']['sha'][:7] + ')' if d['b']['sha'] else ''}", ""]
    if d.get("missing_data"):
        out += format_missing(d) + [""]
    unavailable = d.get("unavailable", {})
    if unavailable.get("params"):
        out.append("params: not compared (" + _missing_text(d, unavailable["params"]) + ")")
    else:
        out.append(f"params: {len(d['params'])} differ")
    for p in d["params"]:
        out.append(f"  {p['key']}: {_short(p['a'], 60)} -> {_short(p['b'], 60)}")
    out.append(f"metrics: {len(d['metrics'])} differ")
    for m in d["metrics"]:
        delta = f"  (Δ {m['delta']:+.6g})" if "delta" in m else ""
        out.append(f"  {m['file']}  {m['key']}: {_short(m['a'], 30)} -> {_short(m['b'], 30)}{delta}")
    for m in unavailable.get("metrics", []):
        out.append(f"  not compared: {m['file']} ({_missing_text(d, m['missing'])})")
    if unavailable.get("metrics_outputs"):
        out.append(f"  not compared: {_missing_text(d, unavailable['metrics_outputs'])}")
    for name, art in d["artifacts"].items():
        s = art["files"]
        missing_outs = art.get("missing_outputs", {})
        if not any(s.values()):
            if missing_outs:
                out += ["", f"== {name}: not compared: " + _missing_text(d, missing_outs)]
            else:
                out += ["", f"== {name}: not present at either revision"]
            continue
        out += ["", f"== {name}: {s['changed']} file(s) changed, {s['added']} added, {s['removed']} removed, "
                    f"{s['same']} identical" + (f", {s['unavailable']} not compared" if s.get("unavailable") else "")]
        for e in art["entries"]:
            out += _format_entry(e, limit, d)
    return "\n".join(out) + "\n"


def _missing_text(d: Mapping[str, Any], missing: Mapping[str, str | Sequence[str]]) -> str:
    """``B=exp-a: data/episodes is not in the local DVC cache`` for each side of ``missing``
    (``{side: path or paths}``)."""
    reasons = {m["side"]: m["reason"] for m in d.get("missing_data", [])}
    groups: dict[tuple, list[str]] = {}  # (paths, reason) -> sides: both sides in one clause when alike
    for side, paths in missing.items():
        key = (tuple([paths] if isinstance(paths, str) else paths), reasons.get(side, "not readable"))
        groups.setdefault(key, []).append(f"{side.upper()}={d[side]['rev']}")
    return "; ".join(f"{' and '.join(sides)}: {', '.join(paths)} {'is' if len(paths) == 1 else 'are'} {reason}"
                     for (paths, reason), sides in groups.items())


def format_missing(d: Mapping[str, Any]) -> list[str]:
    """What the user reads when outputs are missing: which, at which revision, why, and the fix."""
    out = []
    for m in d["missing_data"]:
        sha = f"{m['sha'][:7]}, " if m["sha"] else ""
        kind = {"experiment": "DVC experiment", "git": "git revision"}.get(m["kind"], "working tree")
        out.append(f"missing data: {m['side'].upper()}={m['rev']} ({sha}{kind}): {len(m['outputs'])} "
                   f"output(s) {m['reason']} (their files are not compared):")
        if m["side"] == "b" and d["missing_data"][0]["side"] == "a" and d["missing_data"][0]["outputs"] == m["outputs"] \
                and d["missing_data"][0].get("partly") == m.get("partly"):
            out.append("    (the same as A)")
        else:
            out += [f"    {o}" + (" (some of its files)" if o in m.get("partly", ()) else "") for o in m["outputs"]]
        out.append("  to get them back, one of:")
        width = max(len(c["run"]) for c in m["commands"])
        out += [f"    {c['run']:<{width}}   # {c['does']}" for c in m["commands"]]
    c = d["compared"]
    kept = [w for w, ok in (("params", c["params"]), ("metrics", c["metrics_files"])) if ok]
    if kept:
        out.append(f"  {' and '.join(kept)} are still compared"
                   + (f"; so are {c['artifact_files']} artifact file(s)" if c["artifact_files"] else "") + ".")
    return out


def _format_entry(e: Mapping[str, Any], limit: int, d: Mapping[str, Any] | None = None) -> list[str]:
    """The lines of one file's entry: added / removed, or its table, JSON or text changes."""
    if e["status"] == "unavailable":
        return [f"  not compared: {e['path']} ({_missing_text(d or {}, e['missing'])})"]
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
        if d["missing_data"]:  # stdout is JSON (often redirected): say it where it is seen
            sys.stderr.write("\n".join(format_missing(d)) + "\n")
    else:
        sys.stdout.write(format_diff(d, limit=args.limit))
    if nothing_compared(d):
        print("error: nothing could be compared: the outputs' data is missing (see 'missing data' above) "
              "and there are no params or metrics", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
