"""The whole diff of two revisions as a JSON-ready dict (what ``--json`` prints): params,
metrics, every artifact's files, and the data that was missing.

    d = diff_revisions(root, "HEAD~1", "HEAD", artifacts=["turns"], limit=3)
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pipeline.tools.diff.files import diff_file
from pipeline.tools.diff.revisions import (
    DEFAULT_PATHS,
    DiffError,
    MissingData,
    Rev,
    has_dvc_remote,
    load_params_at,
    open_rev,
    paths_at,
)
from pipeline.tools.diff.values import flatten, norm

#: Artifact -> (paths key, glob patterns under it). ``**`` matches any depth.
ARTIFACTS: dict[str, list[tuple[str, list[str]]]] = {
    "episodes": [("episodes", ["episodes.parquet"]), ("eval", ["*/episodes.parquet"])],
    "turns": [("episodes", ["turns.parquet"]), ("eval", ["*/turns.parquet"])],
    "prompts": [("prompts", ["*.parquet"])],
    "store": [("store", ["*.parquet"])],
    "grounding": [("grounding", ["**.json", "**.txt"]), ("grounding_merged", ["**.md", "**.json"])],
    "stream": [("stream", ["steps.parquet"])],  # the streaming protocol's steps (the stream stage)
}


def diff_params(pa_: Mapping[str, Any], pb: Mapping[str, Any]) -> list[dict]:
    """Every flattened key whose value differs between two params documents (``(absent)`` on the
    side that lacks it)."""
    fa, fb = flatten(pa_), flatten(pb)
    return [{"key": k, "a": fa.get(k, "(absent)"), "b": fb.get(k, "(absent)")}
            for k in sorted(set(fa) | set(fb)) if norm(fa.get(k, "(absent)")) != norm(fb.get(k, "(absent)"))]


def _numbers(doc: Any) -> dict[str, Any]:
    """A metrics document's scalar leaves by flattened key (lists are not metrics)."""
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
            try:
                data = rev.read(f"{d}/{rel}")
                docs.append(_numbers(json.loads(data)) if data is not None else {})
            except json.JSONDecodeError:
                docs.append({})
            except MissingData as exc:
                missing[side] = exc.what
        if missing:
            unavailable.append({"file": rel, "missing": missing})
            continue
        for k in sorted(set(docs[0]) | set(docs[1])):
            va, vb = docs[0].get(k), docs[1].get(k)
            if norm(va) == norm(vb):
                continue
            row = {"file": rel, "key": k, "a": va, "b": vb}
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and not isinstance(va, bool) \
                    and not isinstance(vb, bool):
                row["delta"] = round(vb - va, 10)
            out.append(row)
    return out, len(files) - len(unavailable), unavailable


def artifact_files(rev: Rev, paths: Mapping[str, str], artifact: str) -> list[str]:
    """The files of ``artifact`` at ``rev``: those under its :data:`ARTIFACTS` folders that match
    its patterns."""
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
    params_a, params_b, params_missing = _params_at_both(a, b)
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
        result["artifacts"][name] = artifact_diff(name, a, paths_a, b, paths_b, limit=limit, width=width,
                                                  progress=progress)
        files = result["artifacts"][name]["files"]
        compared_files += sum(files.values()) - files["unavailable"]
    result["compared"] = {"params": not params_missing and bool(params_a or params_b),
                          "metrics_files": metrics_files, "artifact_files": compared_files}
    result["unavailable"] = {"params": params_missing, "metrics": metrics_unavailable,
                             "metrics_outputs": _missing_under(["metrics"], (a, paths_a), (b, paths_b))}
    result["missing_data"] = missing_data(a, b, has_remote=bool((a.missing or b.missing) and has_dvc_remote(root)))
    return result


def _params_at_both(a: Rev, b: Rev) -> tuple[dict, dict, dict[str, str]]:
    """``(params at A, params at B, {side: what is missing})``: a ``params.yaml`` tracked by DVC
    whose data is not at a revision reads as ``{}`` there."""
    params_missing: dict[str, str] = {}
    params = []
    for side, rev in (("a", a), ("b", b)):
        try:
            params.append(load_params_at(rev))
        except MissingData as exc:  # params.yaml tracked by DVC and not here
            params_missing[side] = exc.what
            params.append({})
    return params[0], params[1], params_missing


def artifact_diff(name: str, a: Rev, paths_a: Mapping[str, str], b: Rev, paths_b: Mapping[str, str], *,
                  limit: int, width: int, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One artifact's files at both revisions (with each one's :func:`paths_at`): how many are
    added / removed / changed / the same / not compared, the entries of those not the same, and
    the missing outputs in or above its folders."""
    files = sorted(set(artifact_files(a, paths_a, name)) | set(artifact_files(b, paths_b, name)))
    entries = []
    for path in files:
        if progress:
            progress(path)
        entries.append(diff_file(path, a, b, limit=limit, width=width))
    summary = {s: sum(e["status"] == s for e in entries)
               for s in ("added", "removed", "changed", "same", "unavailable")}
    return {"files": summary,
            "entries": [e for e in entries if e["status"] != "same"],
            "missing_outputs": _missing_under([k for k, _ in ARTIFACTS[name]], (a, paths_a), (b, paths_b))}


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
