"""The default run's results in the docs, written from ``metrics/``: a table copied by hand goes stale.

    python -m pipeline.tools.results            # rewrite every marked block from metrics/
    python -m pipeline.tools.results --check    # exit 1 naming each document that differs (what the test runs)

A document holds a block between ``<!-- results:<name> -->`` and ``<!-- /results:<name> -->``
lines; this tool replaces what is between them with the table ``<name>`` rendered from the
committed metrics (``metrics/compare.json``, ``metrics/eval/<C>.json``,
``metrics/eval_reader/<C>.json``, ``metrics/curve.json``). The blocks:

- ``conditions``: per condition, the model's and the reader's success with intervals, turns;
- ``comparisons``: per comparison, the model's and the reader's paired differences (b / c,
  Holm p) and the reader's paired turns (Wilcoxon, Holm), controls first;
- ``curve``: the reader's success / turns per k and condition, and C2 − C1 at each k;
- ``headline``: the first lines of ``reports/report.md``'s headline (the reader's controls, what the
  memory and the grounding are worth to it, the model's positive control and C2 vs C1), as ``compare`` writes them;
- ``targets``: the design's targets for the reader (docs/memory.md) with the default run's figure
  and met / missed, each computed from ``metrics/compare.json``;
- ``model_targets``: issue 64's targets for the model under test (its C2 − C1 and the memory's utilisation, the
  positive control, C0, the placebo, C2_silent's prompts, admissible actions) with the default run's figure and
  met / missed, and the grounding's worth to the model beside the reader's, from ``metrics/compare.json``;
- ``policy``: the default model's in-context probe (``models/metrics/policy.json``), before and after training;
- ``episodes``: the default model's whole-episode probe (``models/metrics/policy.json``): success in held-out
  generated houses under plain, grounded and oracle prompts after the demonstrations and after each DAgger round;
- ``runtime_summary`` (the README's): each pipeline's summed stage minutes, its longest stages, the projection;
- ``runtime``: each stage's wall time and process count as the run recorded them (``metrics/*.json``), the model
  pipeline's (``make model``: ``models/metrics/*.json``), and the scaling benchmark's projection of the cold run
  to more cores (``benchmarks/results.json``);
- one block per name in :data:`RUN_BLOCKS` (``scienceworld_adaptation``, ``scienceworld_generalisation``,
  ``stream``): another experiment's run, from its committed snapshot
  (``metrics/runs/<name>/``): how many config keys it set apart from the default,
  per condition the agent under test's and the reader's success, the paired comparisons, its learning
  curves and its streams where it drew them, its stage minutes.

A snapshot is what a run of another experiment left in its ``metrics/`` (a scratch copy's, such as
``reprocheck --scratch <overrides> --keep``'s), copied with its overrides::

    python -m pipeline.tools.results --snapshot scienceworld_adaptation --from /tmp/reprocheck-xyz

The model's metrics are the model pipeline's (``models/metrics/``, beside the checkpoint they describe).

Documents: README.md and every docs/*.md (:func:`documents`); a block may appear in any of them,
and must appear in the documents :data:`HOMES` names for it.

The markers are parsed strictly (:func:`parse_blocks`): each is a line of its own, every opener
has its own closer before the next opener, a line that looks like a marker and is not one
(``<!--results:x -->``, ``<!-- /result:x -->``) is an error naming the file and line, and so is
a block missing from its document. Any such error is exit 1 with nothing written, ``--check`` or not.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.analysis.report import curve_rows, format_ci, format_value, headline_lines, markdown_table, stream_tables
from pipeline.core.config import project_root
from pipeline.core.io import atomic_write_text
from pipeline.core.revision import head_commit

DOCS = ("README.md", "docs/*.md")  # globs under the project root


def documents(root: Path) -> list[Path]:
    """The files ``DOCS`` names under ``root``, in a fixed order."""
    return [p for pattern in DOCS for p in sorted(root.glob(pattern)) if p.is_file()]
# A marker is a whole line: "<!-- results:NAME -->" opens block NAME, "<!-- /results:NAME -->" closes it.
_OPENER_RE = re.compile(r"<!-- results:(?P<name>[a-z_]+) -->")
_CLOSER_RE = re.compile(r"<!-- /results:(?P<name>[a-z_]+) -->")
# A line shaped like an HTML comment (starts "<!" / "<-" or ends "->") with a word close to "results"
# looks like a marker: unless it is one exactly, it is an error, never prose left alone.
_COMMENT_LIKE_RE = re.compile(r"^<\s*[!-]|-\s*>$")


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _ci(d: Mapping[str, Any] | None, signed: bool = False) -> str:
    return format_ci(d or {}, signed=signed)  # a metric the run did not write: "–"


def _p(p: Any) -> str:
    """A p value in prose (the report's tables keep three decimals): "< 0.001", "0.023", "0.61"."""
    if p is None:
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def _p_eq(p: Any) -> str:
    """``p`` after "p": "=0.023", or " < 0.001"."""
    text = _p(p)
    return f" {text}" if text.startswith("<") else f"={text}"


def _count(n: Any) -> str:
    """An integer with thousands separators ("664,192"), "?" when the metrics lack it."""
    return f"{n:,}" if isinstance(n, int) else "?"


def conditions_table(metrics: Path, agent: str = "model") -> str:
    """Per condition: the agent under test's success and turns (``agent``: its name in the
    headers), the reader's success and turns."""
    compare = _read(metrics / "compare.json")
    reader = (compare.get("reader") or {}).get("conditions") or {}
    rows = []
    for m in compare.get("conditions", []):
        c = m["condition"]
        r = _read(metrics / "eval_reader" / f"{c}.json")
        rows.append([c, _ci(m.get("success_rate")), format_value((m.get("mean_turns") or {}).get("value"), 1),
                     _ci((reader.get(c) or {}).get("reader")), format_value((r.get("mean_turns") or {}).get("value"), 1)])
    n = compare.get("conditions", [{}])[0].get("num_episodes", "?") if compare.get("conditions") else "?"
    return (markdown_table(["condition", f"{agent} success [95% interval]", f"{agent} turns", "reader success (ceiling)",
                    "reader turns"], rows)
            + f"\n\n{n} paired eval tasks per condition{'; the model greedy' if agent == 'model' else ''}.")


def comparisons_table(metrics: Path, agent: str = "model") -> str:
    """Per comparison (controls first): the agent under test's (``agent``) and the reader's
    differences, the reader's turns."""
    compare = _read(metrics / "compare.json")
    reader = (compare.get("reader") or {}).get("comparisons") or {}
    order = {"positive_control": 0, "check": 1}
    details = sorted(compare.get("details", []), key=lambda d: order.get(d.get("role", "primary"), 2))
    rows = []
    for d in details:
        v = reader.get(d["name"]) or {}
        s = d["success"]
        rows.append([f"{d['treatment']} − {d['control']}", d.get("role", "primary"),
                     _ci(d.get("success_cluster_diff") or s["diff"], signed=True),
                     f"{s['table']['b']} / {s['table']['c']}", _p(s.get("p_holm") if s.get("p_holm") is not None
                                                                  else s.get("p_value")),
                     _ci(v.get("reader_diff"), signed=True),
                     f"{v['reader_b']} / {v['reader_c']}" if v else "–",
                     _p(v.get("reader_p_holm") if v.get("reader_p_holm") is not None else v.get("reader_p_value")),
                     f"{v['reader_turns_diff']:+.1f}" if v.get("reader_turns_diff") is not None else "–",
                     _p(v.get("reader_turns_p_holm") if v.get("reader_turns_p_holm") is not None
                        else v.get("reader_turns_p_value")),
                     format_value(s.get("power", {}).get("mde"))])
    return markdown_table(["comparison", "role", f"{agent} Δ success", f"{agent} b / c", f"{agent} p (Holm)", "reader Δ success",
                   "reader b / c", "reader p (Holm)", "reader Δ turns", "reader turns p (Wilcoxon, Holm)", "MDE"], rows)


def curve_table(metrics: Path, agent: str = "reader") -> str:
    """``agent``'s learning curves (the reader's by default): success / turns per k and condition, C2 − C1 per k."""
    curve = _read(metrics / "curve.json")
    points = [p for p in curve.get("points", []) if p["agent"] == agent]
    if not points:
        return "_no learning curve in metrics/curve.json_"
    conds = list(dict.fromkeys(p["condition"] for p in points))
    paired = {(p["k"], p["treatment"], p["control"]): p for p in curve.get("paired", []) if p["agent"] == agent}
    rows = []
    for row in curve_rows(points, agent, conds):
        q = paired.get((row[0], "C2", "C1"))
        rows.append([*row, (f"{q['success']['diff']['value']:+.2f} ({q['success']['table']['b']} / "
                            f"{q['success']['table']['c']}, p{_p_eq(q['success']['p_value'])})") if q else "–"])
    return markdown_table(["k (asked)", "k (held)", *conds, "C2 − C1 (b / c, exact p)"], rows)


# The design's targets for the reader (docs/memory.md): a worth of at least this much success...
TARGET_WORTH = 0.15
# ... at a Holm p below this (the memory's), and the largest detectable difference allowed.
TARGET_P, TARGET_MDE = 0.01, 0.15


def _reader_row(v: Mapping[str, Any]) -> str:
    """A reader comparison in prose: "+0.19 [+0.12, +0.25], b=46, c=7, Holm p < 0.001"."""
    return f"{_ci(v.get('reader_diff'), signed=True)}, b={v['reader_b']}, c={v['reader_c']}, Holm p{_p_eq(v.get('reader_p_holm'))}"


def _mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _model_row(d: Mapping[str, Any]) -> str:
    """A comparison of the model under test in prose, as :func:`_reader_row` the reader's."""
    s = d["success"]
    return f"{_ci(s['diff'], signed=True)}, b={s['table']['b']}, c={s['table']['c']}, Holm p{_p_eq(s.get('p_holm'))}"


def targets_table(metrics: Path) -> str:
    """The design's targets, the default run's figure for each, and whether it is met."""
    compare = _read(metrics / "compare.json")
    comps = (compare.get("reader") or {}).get("comparisons") or {}
    conds = (compare.get("reader") or {}).get("conditions") or {}
    rows = []
    for name, label, p_max in (("C2_vs_C1", "reader C2 − C1", TARGET_P), ("C1_vs_C0", "reader C1 − C0", None)):
        v = comps.get(name)
        if not v:
            continue
        d = (v.get("reader_diff") or {}).get("value") or 0.0
        p = v.get("reader_p_holm")  # 0.0 is a p-value (rounded in compare.json), not a missing one
        ok = d >= TARGET_WORTH and (p_max is None or (p is not None and p < p_max))
        rows.append([f"{label} >= +{TARGET_WORTH:.2f}" + (f" at Holm p < {p_max}" if p_max else ""), _reader_row(v),
                     _mark(ok) if ok else f"**missed** by {round(100 * (TARGET_WORTH - d))} points" if d < TARGET_WORTH
                     else _mark(False)])
    reader = lambda c: (conds.get(c) or {}).get("reader") or {}  # noqa: E731
    for c, label in (("C2_placebo", "reader C2_placebo not better than C1"), ("C2_silent", "reader C2_silent == C1")):
        if c in conds and "C1" in conds:
            a, b = reader(c).get("value"), reader("C1").get("value")
            rows.append([label, f"{format_value(a)} vs {format_value(b)}",
                         _mark(a is not None and b is not None and (a <= b if c == "C2_placebo" else a == b))])
    mdes = [d["success"]["power"]["mde"] for d in compare.get("details", [])
            if d.get("role", "primary") == "primary" and (d["success"].get("power") or {}).get("mde") is not None]
    if mdes:
        rows.append([f"MDE of the primary comparisons <= {TARGET_MDE}", format_value(max(mdes), 3), _mark(max(mdes) <= TARGET_MDE)])
    return markdown_table(["target", "the default run", ""], rows) if rows else "_no reader comparisons in metrics/compare.json_"


# Issue 64's targets for the model under test (docs/policy.md): (comparison, least difference, Holm p below).
MODEL_TARGETS = (("C2_vs_C1", 0.08, 0.01), ("C2_oracle_vs_C1", 0.35, 0.01))
MODEL_UTILISATION = 0.5  # the model's C2 − C1 over the reader's
MODEL_SUCCESS = (("C2_oracle", 0.60), ("C0", 0.30))  # the least success of these conditions


def model_targets_table(metrics: Path) -> str:
    """Issue 64's targets for the model under test, the default run's figure for each and whether it is
    met, computed from ``metrics/compare.json``; the grounding's worth to the model beside the reader's is
    reported (no target)."""
    compare = _read(metrics / "compare.json")
    details = {d["name"]: d for d in compare.get("details", [])}
    comps = (compare.get("reader") or {}).get("comparisons") or {}
    conds = {m["condition"]: m for m in compare.get("conditions", [])}
    if not details or not conds:
        return "_no model comparisons in metrics/compare.json_"
    rows = []
    for name, least, p_max in MODEL_TARGETS:
        d = details.get(name)
        if d is None:
            continue
        diff, p = d["success"]["diff"]["value"], d["success"].get("p_holm")
        rows.append([f"model {d['treatment']} − {d['control']} >= +{least:.2f} at Holm p < {p_max}", _model_row(d),
                     _mark(diff >= least and p is not None and p < p_max)])
        if name == "C2_vs_C1" and (comps.get(name) or {}).get("utilisation"):
            u = comps[name]["utilisation"]
            rows.append([f"its utilisation (the model's C2 − C1 over the reader's) >= {MODEL_UTILISATION}",
                         f"{_ci(u)} (the reader: {_reader_row(comps[name])})", _mark(u["value"] >= MODEL_UTILISATION)])
    for c, least in MODEL_SUCCESS:
        if c in conds:
            v = conds[c]["success_rate"]
            rows.append([f"model {c} >= {least:.2f}", _ci(v), _mark(v["value"] >= least)])
    g, gr = details.get("C1_vs_C0"), comps.get("C1_vs_C0")
    if g is not None and gr:
        rows.append(["the grounding (C1 − C0): the model beside the reader, its utilisation",
                     f"{_model_row(g)}; the reader {_reader_row(gr)}; utilisation {_ci(gr.get('utilisation'))}", "reported"])
    if "C2_placebo" in conds and "C1" in conds:
        a, b = conds["C2_placebo"]["success_rate"]["value"], conds["C1"]["success_rate"]["value"]
        rows.append(["model C2_placebo not better than C1", f"{format_value(a)} vs {format_value(b)}", _mark(a <= b)])
    for pair in (compare.get("prompt_identity") or {}).values():
        rows.append(["C2_silent's prompts identical to C1's", f"{pair['tasks_compared'] - pair['mismatches']} of "
                     f"{pair['tasks_compared']} tasks", _mark(pair["mismatches"] == 0)])
    invalid = [conds[c]["invalid_action_rate"]["value"] for c in conds if "invalid_action_rate" in conds[c]]
    if invalid:
        rows.append(["100% admissible actions (every condition)", f"invalid-action rate at most {format_value(max(invalid))}",
                     _mark(max(invalid) == 0)])
    return markdown_table(["target", "the default run", ""], rows)


HEADLINE_LINES = 6  # the reader's two controls, the two worths, the model's positive control, its C2 vs C1


def headline(metrics: Path) -> str:
    """The report's first headline lines, from the same function ``compare`` writes them with (the
    C2_silent check, identical by construction, left out)."""
    compare = _read(metrics / "compare.json")
    lines = [line for line in headline_lines(compare) if not line.startswith("check")][:HEADLINE_LINES] if compare else []
    return "\n".join(f"- {line}" for line in lines) if lines else "_no comparison in metrics/compare.json_"


def model_metrics(metrics: Path) -> Path:
    """The model pipeline's metrics folder beside the experiment's ``metrics/``: ``models/metrics``."""
    return metrics.parent / "models" / "metrics"


def policy_table(metrics: Path) -> str:
    """The in-context probe of the default model: first step with / without the plan, plan copied."""
    policy = _read(model_metrics(metrics) / "policy.json")
    probe = policy.get("incontext") or {}
    if not probe:
        return "_no in-context probe in models/metrics/policy.json_"
    before = probe.get("before_training") or {}
    row = lambda name, d: [name, format_value(d.get("oracle_first_step")), format_value(d.get("plain_first_step")),  # noqa: E731
                           format_value(d.get("oracle_plan_copied"))]
    model, training = policy.get("model") or {}, policy.get("training") or {}
    return (markdown_table(["", "first step, plan in the prompt", "first step, no plan", "plan copied into memory"],
                           [row("before training", before), row("after training", probe)])
            + f"\n\n{probe.get('tasks', '?')} held-out generated houses; {_count(model.get('parameters'))} parameters "
              f"({model.get('n_layer', '?')} layers, width {model.get('hidden_size', '?')}), "
              f"{_count(training.get('steps'))} training steps; greedy.")


def episodes_table(metrics: Path) -> str:
    """The whole-episode probe: success (and turns) per prompt kind, after the demonstrations and each round."""
    policy = _read(model_metrics(metrics) / "policy.json")
    probe = policy.get("episode_probe") or {}
    if not probe:
        return "_no whole-episode probe in models/metrics/policy.json_"
    stages = [("after the demonstrations", probe.get("after_demonstrations") or {})]
    for r in (policy.get("dagger") or {}).get("rounds") or []:
        stages.append((f"after DAgger round {r['round'] + 1} ({_count(r.get('labelled_turns'))} labelled turns)",
                       r.get("episode_probe") or {}))

    def cell(d: Mapping[str, Any], kind: str) -> str:
        if f"{kind}_success" not in d:
            return "—"
        return f"{format_value(d[f'{kind}_success'])} ({d.get(f'{kind}_turns', 0):.1f} turns)"

    kinds = ("plain", "grounded", "oracle")
    first = stages[0][1]
    return (markdown_table(["", "plain (C0-like)", "own grounding (C1-like)", "verified plan (C2_oracle-like)"],
                           [[name, *(cell(d, k) for k in kinds)] for name, d in stages])
            + f"\n\n{first.get('houses', '?')} held-out generated houses, each under each prompt (grounded: the "
              f"{first.get('grounded_episodes', '?')} whose rule agent drew feedback); whole episodes, greedy.")


def _summed(metrics: Path, folder: str) -> tuple[float | None, int]:
    """The summed ``wall_time_s`` of a matrix stage's conditions (None: one not recorded), and their count."""
    files = sorted((metrics / folder).glob("*.json"))
    times = [_read(f).get("wall_time_s") for f in files]
    return (sum(times) if times and all(isinstance(t, (int, float)) for t in times) else None), len(files)


def _games_time(games: Mapping[str, Any]) -> float | None:
    return (games.get("plan_wall_s") or 0) + (games.get("compile_wall_s") or 0) if "compile_wall_s" in games else None


def _stage_times(metrics: Path) -> list[tuple[str, float | None, Any]]:
    """``(stage, wall seconds, processes)`` of each experiment stage as its metrics recorded them
    (None: not recorded); the conditions' ``evaluate`` / ``evaluate_reader`` summed."""
    games, curve, collect = _read(metrics / "games.json"), _read(metrics / "curve.json"), _read(metrics / "collect.json")
    stream = _read(metrics / "stream.json")  # the streaming protocol: no stream (0 s) unless experiment.stream
    render_metrics = _read(metrics / "render.json")  # one stage for every condition
    render, n_render = render_metrics.get("wall_time_s"), len(render_metrics.get("conditions") or {})
    evaluate, n_eval = _summed(metrics, "eval")
    reader, n_reader = _summed(metrics, "eval_reader")
    return [("games", _games_time(games), games.get("compile_workers")),
            ("collect", collect.get("wall_time_s"), 1),
            ("ground", _read(metrics / "ground.json").get("wall_time_s"), 1),
            ("store", _read(metrics / "store.json").get("wall_time_s"), 1),
            (f"render ({n_render} conditions)", render, 1),
            (f"evaluate ({n_eval} conditions)", evaluate, None),
            (f"evaluate_reader ({n_reader} conditions)", reader, None),
            ("curve", curve.get("wall_time_s"), curve.get("workers")),
            ("stream", stream.get("wall_time_s"), (stream.get("workers") or {}).get("reader"))]


def _model_times(metrics: Path) -> list[tuple[str, float | None, Any]]:
    """``(step, wall seconds, processes)`` of the model pipeline's steps (``make model``) as its
    metrics recorded them (``models/metrics``)."""
    games, demos = _read(metrics / "games.json"), _read(metrics / "demos.json")
    policy, ckpt = _read(metrics / "policy.json"), _read(metrics / "checkpoint.json")
    ptimes = policy.get("wall_time_s") if isinstance(policy.get("wall_time_s"), dict) else {}
    return [("games", _games_time(games), games.get("compile_workers")),
            ("demos", demos.get("wall_time_s"), demos.get("workers")),
            ("policy", ptimes.get("total_s"), _policy_processes(ptimes)),
            ("checkpoint", ckpt.get("wall_time_s"), 1)]


def _policy_processes(ptimes: dict) -> Any:
    """The policy step's processes: its training's, and its whole episodes' where they differ
    (``rollout_workers``: the DAgger rounds and the episode probe, recorded since 2026-11-29)."""
    train, episodes = ptimes.get("train_processes"), ptimes.get("rollout_workers")
    if episodes is None or train is None or episodes == train:
        return train
    return f"{train} (its episodes: {episodes})"


def _times_table(times: list[tuple[str, float | None, Any]], first: str) -> str:
    rows, total = [], 0.0
    for stage, secs, procs in times:
        rows.append([stage, "–" if secs is None else f"{secs / 60:.1f}", "–" if procs is None else str(procs)])
        total += secs or 0.0
    return markdown_table([first, "minutes", "processes"], rows + [["**the sum**", f"**{total / 60:.1f}**", ""]])


def _fraction(x: Any) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "?"


def _measured_where(meta: Mapping[str, Any], measured_at: Mapping[str, Any] | None) -> str:
    """Where the scaling benchmark measured its fractions, and where it projected from them
    when that was a later ``--skip-run`` (which measures nothing)."""
    def at(m: Mapping[str, Any]) -> str:
        return (f"at commit {m.get('git') or '?'}, {m.get('date') or '?'}, {m.get('cores') or '?'} cores, "
                f"load {(m.get('load_average') or ['?'])[0]}")
    if not measured_at:
        return "; " + at(meta)
    return (f"; the fractions measured {at(measured_at)}; projected from them and this run's stage times "
            f"at commit {meta.get('git') or '?'}, {meta.get('date') or '?'}")


def _scaling(metrics: Path) -> tuple[dict, dict, dict]:
    """The scaling benchmark's ``(meta, details, projection)`` (``benchmarks/results.json``; empty when not run)."""
    bench = _read(metrics.parent / "benchmarks" / "results.json").get("benchmarks", {}).get("scaling") or {}
    details = (bench.get("runs") or [{}])[0].get("details") or {}
    return bench.get("meta") or {}, details, details.get("projection") or {}


def _projected(cores: Mapping[str, Any]) -> str:
    return ", ".join(f"{cores[c]['total_s'] / 60:.0f} min on {c} cores" for c in sorted(cores, key=int))


def runtime_table(metrics: Path) -> str:
    """The default run's stage wall times as its metrics recorded them, the model pipeline's
    (``make model``), and the scaling benchmark's projection of the cold run to more cores
    (``benchmarks/results.json``)."""
    text = _times_table(_stage_times(metrics), "stage (`make repro`)")
    model = model_metrics(metrics)
    if model.is_dir():
        text += "\n\n" + _times_table(_model_times(model), "step (`make model`)")
    meta, details, proj = _scaling(metrics)
    cores = proj.get("cores") or {}
    if cores:
        slice_ = details.get("experiment") == "slice"
        capped = any((s or {}).get("parts") for s in (proj.get("stages") or {}).values())
        text += ("\n\nProjected cold `make repro` (install included) by `python -m benchmarks --only scaling"
                 + (" --experiment slice" if slice_ else "") + "` ("
                 + ("parallel fractions measured on a slice of the default config" if slice_
                    else "parallel fractions measured on `experiment=tiny`, a floor")
                 + ("; no stage on more cores than its work has parts" if capped else "")
                 + _measured_where(meta, details.get("measured_at")) + "): " + _projected(cores)
                 + f"; parallel fraction of the run's time {_fraction(proj.get('parallel_fraction'))}.")
    return text


def _minutes(times: list[tuple[str, float | None, Any]]) -> str:
    """``total: stage m, ...`` in minutes (stages that took under 0.1 min left out of the list)."""
    total = sum(secs or 0.0 for _, secs, _ in times)
    parts = [f"{stage.split(' (')[0]} {secs / 60:.1f}" for stage, secs, _ in times if secs and secs >= 6]
    return f"**{total / 60:.1f}** ({', '.join(parts)})"


def runtime_summary(metrics: Path) -> str:
    """The README's short form of :func:`runtime_table`: each pipeline's summed stage minutes and
    its longest stages, and the projected cold run (install and DVC included) by core count."""
    rows = [["`make repro`", _minutes(_stage_times(metrics))]]
    stream = metrics / RUNS / "stream"
    if (stream / RUN_FILE).is_file():  # the streaming protocol's committed run: the default's stages and its streams
        model = (_read(stream / RUN_FILE).get("params") or {}).get("experiment.stream.model")
        rows.append(["`experiment=stream`" + (", model too" if model else ""), _minutes(_stage_times(stream))])
    model = model_metrics(metrics)
    if model.is_dir():
        rows.append(["`make model`", _minutes(_model_times(model))])
    text = markdown_table(["command", "minutes of stage work as the committed metrics recorded it"], rows)
    cores = (_scaling(metrics)[2].get("cores")) or {}
    if cores:
        text += "\n\nProjected cold `make repro`, the install and DVC's own work included: " + _projected(cores) + "."
    return text


RUNS = "runs"  # metrics/runs/<name>/: committed snapshots of other experiments' runs (:func:`snapshot`)
RUN_FILE = "run.json"  # a snapshot's record: the keys it set apart from the default, its agent, the revision
SNAPSHOT_FILES = ("compare.json", "games.json", "collect.json", "ground.json", "store.json", "render.json",
                  "curve.json", "stream.json")  # with eval/ and eval_reader/: what the run blocks read
_RUN_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")


def run_table(name: str) -> Callable[[Path], str]:
    """The block of the committed snapshot ``metrics/runs/<name>/``: the keys it set apart from the
    default (counted; ``run.json`` lists them), per condition the agent under test's and the
    reader's success, the paired comparisons (controls first), its learning curves, its stage minutes."""
    def table(metrics: Path) -> str:
        run = metrics / RUNS / name
        meta = _read(run / RUN_FILE)
        if not meta:
            return (f"_no run of {name} is committed: run it (`python -m pipeline.tools.reprocheck --scratch "
                    f"experiment={name} --keep`) and snapshot it (`python -m pipeline.tools.results --snapshot "
                    f"{name} --from <its folder>`)_")
        agent = str(meta.get("agent") or "agent")
        apart = len(meta.get("params") or {}) + len(meta.get("removed") or [])
        return (f"The committed run `{name}`: {apart} config keys set apart from the "
                f"default (`metrics/{RUNS}/{name}/{RUN_FILE}` lists them), copied at revision "
                f"{meta.get('revision', '?')}; `{agent}` is the agent under test.\n\n"
                + conditions_table(run, agent=agent) + "\n\n" + comparisons_table(run, agent=agent)
                + _run_curves(run) + _run_stream(run)
                + f"\n\nMinutes of stage work as the run recorded them: {_minutes(_stage_times(run))}.")
    table.__doc__ = f"The committed run of {name} (:func:`run_table`)."
    return table


def _run_curves(run: Path) -> str:
    """A run's learning curves (success / turns per k earlier episodes per scene): the reader's first,
    then each other agent's that played them (the agent under test's); nothing when the run drew none."""
    played = list(dict.fromkeys(p["agent"] for p in _read(run / "curve.json").get("points", [])))
    return "".join(f"\n\nLearning curve, `{who}`{' (the ceiling)' if who == 'reader' else ''}: success / turns with "
                   f"the first k earlier episodes of each scene as its grounding and memory.\n\n"
                   + curve_table(run, agent=who) for who in sorted(played, key=lambda w: w != "reader"))


def _run_stream(run: Path) -> str:
    """A run's streams (``stream.json``: the streaming protocol), when it streamed: success per window and
    condition, the paired comparisons, the memory-induced errors; nothing otherwise."""
    stream = _read(run / "stream.json")
    if not stream.get("points"):
        return ""
    start = stream.get("start", "empty")
    return (f"\n\nThe streaming protocol (`stream` stage; each stream started {'empty' if start == 'empty' else 'from the collected episodes'}): "
            "each house's eval tasks in one seeded order, every episode entering its condition's own memory and "
            "grounding before the house's next task.\n\n" + "\n".join(stream_tables(stream)).rstrip())


def snapshot(root: Path, name: str, source: Path) -> Path:
    """Copy the metrics a finished run left in ``source`` (a project folder: ``<source>/metrics``,
    ``<source>/params.overrides.yaml``, ``<source>/params.yaml``) into ``<root>/metrics/runs/<name>/``,
    replacing what was there, with a ``run.json`` holding the config keys the run set apart from the
    default (``params``, from its overrides record), its agent under test and this project's
    revision. Returns the snapshot's folder.

    Raises:
        ValueError: ``name`` is not a lower-case identifier, ``source`` holds no finished run
            (no ``metrics/compare.json``), naming what is missing, or its overrides record is
            malformed (:class:`pipeline.core.overrides.OverridesError`).
    """
    import shutil

    import yaml

    from pipeline.core import overrides
    from pipeline.core.io import atomic_dir, atomic_write_json

    if not _RUN_NAME_RE.fullmatch(name):
        raise ValueError(f"--snapshot {name!r}: expected a lower-case identifier such as scienceworld_adaptation")
    metrics = Path(source) / "metrics"
    if not (metrics / "compare.json").is_file():
        raise ValueError(f"--from {source}: no finished run there ({metrics / 'compare.json'} does not exist): "
                         "run the experiment's `dvc repro` in it first")
    params = yaml.safe_load((Path(source) / "params.yaml").read_text(encoding="utf-8")) \
        if (Path(source) / "params.yaml").is_file() else {}
    changed = overrides.read(Path(source))  # the run's record (pipeline.core.overrides): [{key, value | removed}]
    out = root / "metrics" / RUNS / name
    with atomic_dir(out) as tmp:
        for f in SNAPSHOT_FILES:
            if (metrics / f).is_file():
                shutil.copy2(metrics / f, tmp / f)
        for folder in ("eval", "eval_reader"):
            if (metrics / folder).is_dir():
                shutil.copytree(metrics / folder, tmp / folder)
        meta = {"name": name, "params": {o["key"]: o["value"] for o in changed if not o.get("removed")},
                "agent": str(((params or {}).get("agent") or {}).get("name") or "agent"),
                "revision": head_commit(root)}
        removed = [o["key"] for o in changed if o.get("removed")]
        if removed:  # keys the run's params.yaml dropped from the default
            meta["removed"] = removed
        atomic_write_json(tmp / RUN_FILE, meta)
    return out


# The experiments whose committed run a document shows (a block each, named as the run).
RUN_BLOCKS = ("scienceworld_adaptation", "scienceworld_generalisation", "stream")

TABLES: dict[str, Callable[[Path], str]] = {"conditions": conditions_table, "comparisons": comparisons_table,
                                            "curve": curve_table, "headline": headline,
                                            "policy": policy_table, "targets": targets_table,
                                            "runtime": runtime_table, "runtime_summary": runtime_summary,
                                            "episodes": episodes_table, "model_targets": model_targets_table,
                                            **{name: run_table(name) for name in RUN_BLOCKS}}


# The documents each block must appear in (it may appear in others too): a deleted block is an
# error, not a document silently left without its figures.
HOMES: dict[str, tuple[str, ...]] = {"conditions": ("README.md",), "headline": ("docs/experiments.md",),
                                     "runtime_summary": ("README.md",), "runtime": ("docs/performance.md",),
                                     "comparisons": ("docs/experiments.md",),
                                     "curve": ("docs/experiments.md", "docs/memory.md"),
                                     "targets": ("docs/memory.md",), "policy": ("docs/policy.md",),
                                     "episodes": ("docs/policy.md",), "model_targets": ("docs/policy.md",),
                                     **{name: ("docs/scienceworld.md",) for name in RUN_BLOCKS if name != "stream"},
                                     "stream": ("docs/experiments.md",)}
assert set(HOMES) == set(TABLES), "every block has a home document"

MARKER_FORMS = "`<!-- results:NAME -->` ... `<!-- /results:NAME -->`, each alone on its line"


class MarkerError(ValueError):
    """Malformed, unpaired, unknown or missing results markers; one line per fault, each naming
    the file and line (or the file and block)."""


@dataclass(frozen=True)
class Block:
    """A marked block: ``name``, and the 0-based line numbers of its opener and closer."""

    name: str
    opener: int
    closer: int


def _looks_like_marker(line: str) -> bool:
    s = line.strip()
    return bool(_COMMENT_LIKE_RE.search(s)) and any(
        difflib.SequenceMatcher(None, w, "results").ratio() >= 0.75 for w in re.findall(r"[a-z]+", s.lower()))


def parse_blocks(text: str, source: str = "<text>") -> list[Block]:
    """The blocks of ``text``, or a :class:`MarkerError` naming ``source`` and the line of every
    fault: an unknown name, an opener before the previous block's closer, a closer of another
    block or of none, an opener never closed, a line that looks like a marker and is not one."""
    errors: list[str] = []
    blocks: list[Block] = []
    open_: tuple[str, int] | None = None
    for i, line in enumerate(text.split("\n")):
        where = f"{source}:{i + 1}"
        if m := _OPENER_RE.fullmatch(line):
            if m["name"] not in TABLES:
                errors.append(f"{where}: <!-- results:{m['name']} -->: unknown block (known: {', '.join(TABLES)})")
            if open_ is not None:
                errors.append(f"{where}: {line} opens a block before results:{open_[0]} (opened at line "
                              f"{open_[1] + 1}) is closed: expected <!-- /results:{open_[0]} --> first")
            open_ = (m["name"], i)
        elif m := _CLOSER_RE.fullmatch(line):
            if open_ is None:
                errors.append(f"{where}: {line} closes no block: expected <!-- results:{m['name']} --> before it")
            elif m["name"] != open_[0]:
                errors.append(f"{where}: {line} does not close results:{open_[0]} (opened at line {open_[1] + 1}): "
                              f"expected <!-- /results:{open_[0]} -->")
            else:
                blocks.append(Block(m["name"], open_[1], i))
            open_ = None
        elif _looks_like_marker(line):
            errors.append(f"{where}: {line.strip()!r} looks like a results marker but is not one: expected "
                          f"{MARKER_FORMS}")
    if open_ is not None:
        errors.append(f"{source}:{open_[1] + 1}: <!-- results:{open_[0]} --> is never closed: expected "
                      f"<!-- /results:{open_[0]} --> after its table")
    if errors:
        raise MarkerError("\n".join(errors))
    return blocks


def render(text: str, metrics: Path, source: str = "<text>") -> str:
    """``text`` with every marked block replaced by its table; a :class:`MarkerError` (a
    ``ValueError``) for any fault of :func:`parse_blocks`, naming ``source``."""
    lines = text.split("\n")
    out: list[str] = []
    pos = 0
    for b in parse_blocks(text, source):
        out += [*lines[pos:b.opener + 1], TABLES[b.name](metrics)]
        pos = b.closer
    return "\n".join(out + lines[pos:])


def missing_blocks(root: Path, found: Mapping[str, set[str]]) -> list[str]:
    """One line per block of :data:`HOMES` absent from its document (``found``: the blocks of each
    parsed document, by path relative to ``root``; a document that failed to parse is skipped)."""
    errors = []
    for doc in dict.fromkeys(d for homes in HOMES.values() for d in homes):
        want = [n for n, homes in HOMES.items() if doc in homes]
        if not (root / doc).is_file():
            errors.append(f"{doc}: missing: it must hold the blocks {', '.join(want)}")
        elif doc in found:
            errors += [f"{doc}: the results:{n} block is missing: expected {MARKER_FORMS.replace('NAME', n)}"
                       for n in want if n not in found[doc]]
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.tools.results", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a document's blocks differ from the metrics")
    ap.add_argument("--root", type=Path, default=None, help="the project whose documents and metrics/ to use "
                                                              "(default: this project)")
    ap.add_argument("--snapshot", metavar="NAME", help="copy the run in --from into metrics/runs/NAME/ first")
    ap.add_argument("--from", dest="source", type=Path, metavar="DIR",
                    help="with --snapshot: the project folder where the run finished")
    args = ap.parse_args(argv)
    root = args.root or project_root()
    if args.snapshot is not None or args.source is not None:
        if args.snapshot is None or args.source is None:
            ap.error("--snapshot NAME and --from DIR go together")
        try:
            print(f"snapshot: {snapshot(root, args.snapshot, args.source).relative_to(root)}")
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    errors: list[str] = []
    found: dict[str, set[str]] = {}
    rendered: dict[Path, str] = {}
    stale = []
    for path in documents(root):  # every document parsed and rendered before anything is written
        doc = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        try:
            found[doc] = {b.name for b in parse_blocks(text, doc)}
            new = render(text, root / "metrics", doc)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        if new != text:
            stale.append(doc)
            rendered[path] = new
    errors += missing_blocks(root, found)
    if errors:
        for line in "\n".join(errors).splitlines():
            print(f"error: {line}", file=sys.stderr)
        print("nothing written", file=sys.stderr)
        return 1
    if args.check and stale:
        print(f"results tables differ from metrics/ in {', '.join(stale)}: run `python -m pipeline.tools.results`",
              file=sys.stderr)
        return 1
    if not args.check:
        for path, new in rendered.items():
            atomic_write_text(path, new)
    print(("stale: " if args.check else "rewrote: ") + ", ".join(stale) if stale else "results tables up to date")
    return 0

if __name__ == "__main__":
    sys.exit(main())
