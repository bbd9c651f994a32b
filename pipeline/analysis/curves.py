"""Learning curves: success and turns against the past episodes the memory and grounding hold.

The ``curve`` stage plays every eval task under each condition with the first ``k`` past
episodes of each scene (:mod:`pipeline.session.experience`); its rows are one outcome per
(agent, k, condition, task). This module summarises them, pure functions of the rows::

    summary = summarise_curves(rows, comparisons=[("C2", "C1"), ("C1", "C0")], n_resamples=2000, level=0.95, seed=0)
    summary["points"]      # per agent, k, condition: n, success with its interval, mean turns
    summary["paired"]      # per agent, k, comparison: success difference (b, c, exact p), turns (Wilcoxon p)
    curve_csv(rows, agent="reader", value="success")   # one row per k, a column per condition (dvc plots)

Every comparison is paired (the same tasks at the same ``k``); p-values are the exact
McNemar test for success and the Wilcoxon signed-rank test for turns.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pipeline.core.stats import paired_binary, wilcoxon_paired

ROW_FIELDS = ("agent", "k", "held", "condition", "scene_id", "quest_id", "scene_split", "success", "turns")
# The comparisons drawn at every k (those whose conditions were both played).
CURVE_COMPARISONS = (("C2", "C1"), ("C1", "C0"), ("C2", "C2_placebo"))


def _key(r: Mapping[str, Any]) -> tuple[str, str]:
    return str(r["scene_id"]), str(r["quest_id"])


def paired_success(treated: Sequence[Mapping[str, Any]], control: Sequence[Mapping[str, Any]], *, n_resamples: int,
                   level: float, rng: np.random.Generator) -> tuple[list, dict, dict, dict[str, Any]]:
    """The tasks both groups of rows played (by ``(scene_id, quest_id)``) and their paired success
    (:func:`~pipeline.core.stats.paired_binary`): ``(keys, treated rows by key, control rows by key, success)``."""
    tb, cb = {_key(r): r for r in treated}, {_key(r): r for r in control}
    keys = sorted(set(tb) & set(cb))
    succ = paired_binary([bool(tb[x]["success"]) for x in keys], [bool(cb[x]["success"]) for x in keys],
                         n_resamples=n_resamples, level=level, rng=rng)
    return keys, tb, cb, succ


def summarise_curves(rows: Iterable[Mapping[str, Any]], *, n_resamples: int, level: float, seed: int,
                     comparisons: Sequence[Sequence[str]] = CURVE_COMPARISONS) -> dict[str, Any]:
    """Per-point success and turns, and the paired comparisons at each ``k`` (module docstring)."""
    rows = list(rows)
    groups: dict[tuple[str, int, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((str(r["agent"]), int(r["k"]), str(r["condition"])), []).append(r)
    points = []
    for (agent, k, cond), rs in sorted(groups.items()):
        rs = sorted(rs, key=_key)
        succ = np.array([bool(r["success"]) for r in rs], float)
        points.append({"agent": agent, "k": k, "held": int(rs[0]["held"]), "condition": cond, "n": len(rs),
                       "success": round(float(succ.mean()), 6), "turns": round(float(np.mean([r["turns"] for r in rs])), 4),
                       "by_split": {s: round(float(np.mean([bool(r["success"]) for r in rs if r["scene_split"] == s])), 6)
                                    for s in sorted({str(r["scene_split"]) for r in rs})}})
    paired = []
    rng = np.random.default_rng(seed)
    for agent in sorted({a for a, _, _ in groups}):
        for k in sorted({k for a, k, _ in groups if a == agent}):
            for treatment, control in comparisons:
                t, c = groups.get((agent, k, treatment)), groups.get((agent, k, control))
                if not t or not c:
                    continue
                keys, tb, cb, succ = paired_success(t, c, n_resamples=n_resamples, level=level, rng=rng)
                turns = wilcoxon_paired([float(tb[x]["turns"]) for x in keys], [float(cb[x]["turns"]) for x in keys])
                paired.append({"agent": agent, "k": k, "treatment": treatment, "control": control, "n_pairs": len(keys),
                               "success": succ, "turns": turns})
    return {"points": points, "paired": paired}


def curve_csv(rows: Iterable[Mapping[str, Any]], *, agent: str, value: str, conditions: Sequence[str]) -> str:
    """A wide CSV for ``dvc plots`` (template ``linear``, ``x: k``): one row per ``k``, a column
    per condition holding the mean ``value`` (``success`` or ``turns``) of ``agent``'s tasks."""
    by: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        if str(r["agent"]) == agent:
            by.setdefault((int(r["k"]), str(r["condition"])), []).append(float(r[value]))
    ks = sorted({k for k, _ in by})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["k", *conditions])
    for k in ks:
        w.writerow([k, *(f"{np.mean(by[(k, c)]):.4f}" if (k, c) in by else "" for c in conditions)])
    return buf.getvalue()
