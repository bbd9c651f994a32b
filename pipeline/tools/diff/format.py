"""The text ``python -m pipeline.tools.diff`` prints: the dict of
:func:`pipeline.tools.diff.core.diff_revisions` as lines (missing data and how to get it
back first, then params, metrics and each artifact's files)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pipeline.tools.diff.values import short


def format_diff(d: Mapping[str, Any], *, limit: int = 5) -> str:
    """The text of a diff (:func:`~pipeline.tools.diff.core.diff_revisions`): the revisions,
    missing data first, params, metrics, then each artifact's files (``limit`` changed rows each)."""
    a, b = d["a"]["rev"], d["b"]["rev"]
    out = [f"diff A={a}{' (' + d['a']['sha'][:7] + ')' if d['a']['sha'] else ''} "
           f"B={b}{' (' + d['b']['sha'][:7] + ')' if d['b']['sha'] else ''}", ""]
    if d.get("missing_data"):
        out += format_missing(d) + [""]
    out += _format_params(d) + _format_metrics(d)
    for name, art in d["artifacts"].items():
        out += _format_artifact(name, art, limit, d)
    return "\n".join(out) + "\n"


def _format_params(d: Mapping[str, Any]) -> list[str]:
    """``params: N differ`` (or why they are not compared) and each differing key."""
    unavailable = d.get("unavailable", {})
    if unavailable.get("params"):
        out = ["params: not compared (" + _missing_text(d, unavailable["params"]) + ")"]
    else:
        out = [f"params: {len(d['params'])} differ"]
    for p in d["params"]:
        out.append(f"  {p['key']}: {short(p['a'], 60)} -> {short(p['b'], 60)}")
    return out


def _format_metrics(d: Mapping[str, Any]) -> list[str]:
    """``metrics: N differ``, each differing number with its delta, and the files not compared."""
    unavailable = d.get("unavailable", {})
    out = [f"metrics: {len(d['metrics'])} differ"]
    for m in d["metrics"]:
        delta = f"  (Δ {m['delta']:+.6g})" if "delta" in m else ""
        out.append(f"  {m['file']}  {m['key']}: {short(m['a'], 30)} -> {short(m['b'], 30)}{delta}")
    for m in unavailable.get("metrics", []):
        out.append(f"  not compared: {m['file']} ({_missing_text(d, m['missing'])})")
    if unavailable.get("metrics_outputs"):
        out.append(f"  not compared: {_missing_text(d, unavailable['metrics_outputs'])}")
    return out


def _format_artifact(name: str, art: Mapping[str, Any], limit: int, d: Mapping[str, Any]) -> list[str]:
    """One artifact's block: a blank line, its ``== name:`` counts, and its files' entries."""
    s = art["files"]
    missing_outs = art.get("missing_outputs", {})
    if not any(s.values()):
        if missing_outs:
            return ["", f"== {name}: not compared: " + _missing_text(d, missing_outs)]
        return ["", f"== {name}: not present at either revision"]
    out = ["", f"== {name}: {s['changed']} file(s) changed, {s['added']} added, {s['removed']} removed, "
               f"{s['same']} identical" + (f", {s['unavailable']} not compared" if s.get("unavailable") else "")]
    for e in art["entries"]:
        out += _format_entry(e, limit, d)
    return out


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
