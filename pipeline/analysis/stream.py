"""The streaming protocol's figures: success by stream position, and paired comparisons.

The ``stream`` stage plays each condition's stream (:mod:`pipeline.session.stream`); its rows
are one outcome per (agent, condition, task), with the task's ``position`` in its scene's
stream and that stream's ``length``. Pure functions of the rows::

    summary = summarise_streams(rows, families={"comparisons": [["C2", "C1"]]}, n_resamples=2000,
                                level=0.95, seed=0, alpha=0.05, power=0.8, discordance=0.35)
    summary["points"]   # per agent, window, condition: n, success, mean turns
    summary["paired"]   # per agent, window, family, comparison: the paired difference, exact and Holm p, MDE
    degradations(steps)  # memory-induced errors: C2 lost where C1 won, after an advisory
    stream_summary(steps, cfg)   # both, under the experiment's families and bootstrap settings
    stream_csv(rows, agent="reader", value="success", conditions=["C1", "C2"])  # a row per position (dvc plots)

Windows: ``all`` positions, and the ``second_half`` of each stream (positions ``>= length // 2``):
what the memory of the first half is worth. Every comparison is paired (the same tasks at the
same positions: the order is every condition's); each family's p-values are Holm-adjusted within
its agent and window, as the ``compare`` stage adjusts the frozen protocol's.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pipeline.analysis.curves import paired_success
from pipeline.analysis.metrics import bootstrap_settings
from pipeline.core.conf_schema import Config
from pipeline.core.stats import holm, mcnemar_mde

ROW_FIELDS = ("agent", "condition", "position", "length", "scene_id", "quest_id", "scene_split", "success", "turns")
WINDOWS = ("all", "second_half")


def in_window(row: Mapping[str, Any], window: str) -> bool:
    """Whether a row's task is in ``window`` (``all`` or ``second_half``)."""
    if window == "all":
        return True
    if window == "second_half":
        return int(row["position"]) >= int(row["length"]) // 2
    raise ValueError(f"window={window!r}: expected one of {', '.join(WINDOWS)}")


def _key(r: Mapping[str, Any]) -> tuple[str, str]:
    return str(r["scene_id"]), str(r["quest_id"])


def summarise_streams(rows: Iterable[Mapping[str, Any]], *, families: Mapping[str, Sequence[Sequence[str]]],
                      n_resamples: int, level: float, seed: int, alpha: float, power: float,
                      discordance: float) -> dict[str, Any]:
    """Per-window success and turns, and each family's paired comparisons (module docstring).

    ``families``: ``{name: [[treatment, control], ...]}`` (``positive_controls``, ``comparisons``,
    ``checks``: the experiment's); a comparison with a condition not streamed is left out."""
    rows = list(rows)
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        for w in WINDOWS:
            if in_window(r, w):
                groups.setdefault((str(r["agent"]), w, str(r["condition"])), []).append(r)
    points = []
    for (agent, w, cond), rs in sorted(groups.items()):
        points.append({"agent": agent, "window": w, "condition": cond, "n": len(rs),
                       "success": round(float(np.mean([bool(r["success"]) for r in rs])), 6),
                       "turns": round(float(np.mean([int(r["turns"]) for r in rs])), 4)})
    paired = []
    rng = np.random.default_rng(seed)
    for agent in sorted({a for a, _, _ in groups}):
        for w in WINDOWS:
            for family, pairs in families.items():
                found = []
                for treatment, control in pairs:
                    t, c = groups.get((agent, w, str(treatment))), groups.get((agent, w, str(control)))
                    if not t or not c:
                        continue
                    keys, _, _, succ = paired_success(t, c, n_resamples=n_resamples, level=level, rng=rng)
                    found.append({"agent": agent, "window": w, "family": family, "treatment": str(treatment),
                                  "control": str(control), "n_pairs": len(keys), "success": succ,
                                  "mde": mcnemar_mde(len(keys), alpha, power=power, discordance=discordance)})
                for p, adjusted in zip(found, holm([p["success"]["p_value"] for p in found])):
                    p["p_holm"] = adjusted
                paired += found
    return {"points": points, "paired": paired}


def stream_csv(rows: Iterable[Mapping[str, Any]], *, agent: str, value: str, conditions: Sequence[str]) -> str:
    """A wide CSV for ``dvc plots`` (``x: position``): one row per stream position, a column per
    condition holding the mean ``value`` (``success`` or ``turns``) of ``agent``'s tasks there."""
    by: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        if str(r["agent"]) == agent:
            by.setdefault((int(r["position"]), str(r["condition"])), []).append(float(r[value]))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["position", *conditions])
    for pos in sorted({p for p, _ in by}):
        w.writerow([pos, *(f"{np.mean(by[(pos, c)]):.4f}" if (pos, c) in by else "" for c in conditions)])
    return buf.getvalue()


def degradations(rows: Iterable[Mapping[str, Any]], treatment: str = "C2", control: str = "C1") -> list[dict[str, Any]]:
    """Memory-induced errors: the tasks the ``control`` stream won and the ``treatment`` stream lost
    after its prompt carried an advisory, per agent, each with the block and the entries it came from
    (rows of ``data/stream/steps.parquet``)."""
    rows = list(rows)
    won = {(str(r["agent"]), *_key(r)): bool(r["success"]) for r in rows if r["condition"] == control}
    return [{"agent": str(r["agent"]), "scene_id": str(r["scene_id"]), "quest_id": str(r["quest_id"]),
             "position": int(r["position"]), "injected_entry_ids": list(r["injected_entry_ids"] or []),
             "memory_block": str(r["memory_block"] or "")}
            for r in sorted(rows, key=lambda r: (str(r["agent"]), *_key(r)))
            if r["condition"] == treatment and not r["success"] and r["injected_entry_ids"]
            and won.get((str(r["agent"]), *_key(r)))]


def stream_summary(rows: Sequence[Mapping[str, Any]], cfg: Config) -> dict[str, Any]:
    """The streams' figures under the experiment's families (``positive_controls``, ``comparisons``,
    ``checks``) and bootstrap settings, from the stage's step rows: ``conditions`` (in row order),
    ``points``, ``paired`` (:func:`summarise_streams`) and ``degradations`` (:func:`degradations`).
    What the ``stream`` stage writes to ``metrics/stream.json`` and ``compare`` to its report."""
    e = cfg.experiment
    seed, n_resamples, level = bootstrap_settings(cfg)
    families = {"positive_controls": list(e.positive_controls), "comparisons": list(e.comparisons),
                "checks": list(e.checks)}
    summary = summarise_streams([{k: r[k] for k in ROW_FIELDS} for r in rows], families=families,
                                n_resamples=n_resamples, level=level, seed=seed, alpha=e.alpha, power=e.power,
                                discordance=e.planning_discordance)
    return {"conditions": list(dict.fromkeys(str(r["condition"]) for r in rows)), **summary,
            "degradations": degradations(rows)}
