"""The human-readable comparison report: Markdown tables and PNG figures (matplotlib, Agg).

Written by the ``compare`` stage from ``metrics/compare.json`` and the plot rows::

    write_report(metrics, plots, Path("reports"))
    # reports/report.md        headline, figures, tables: open it to see the result at a glance
    # reports/compare.md       the tables only (small, diffable)
    # reports/*.png            success by condition, paired differences, success by group, turns

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot state,
no display) and saved without the version-dependent ``Software`` metadata, so the same
numbers give the same bytes.

Where a condition's metrics carry ``label_hint_prompts`` (:func:`label_hint_counts` of its
rendered prompts, ``data/prompts/<C>.parquet``), the tables say per condition how many
prompts reveal the task's answer through the grounding and through the memory block
(the advisories' label-hint rule, recorded per prompt by ``pipeline.conditions``).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.core.io import atomic_write_bytes, atomic_write_text
from pipeline.core.facts import WorldWords

#: Fixed colours for the standard conditions (others cycle through tab10).
CONDITION_COLORS = {"C1": "#7f7f7f", "C2": "#1f77b4", "C2_silent": "#ff7f0e", "C2_placebo": "#9467bd"}
TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
FIGURES = {
    "learning_curves": "learning_curves.png",
    "success_by_condition": "success_by_condition.png",
    "paired_differences": "paired_differences.png",
    "success_by_group": "success_by_group.png",
    "turns_distribution": "turns_distribution.png",
}
GROUP_TITLES = {"scene_id": "scene", "quest_length": "quest length (expert commands)", "scene_split": "scene split"}
#: Per-prompt label-hint flags written by the render stage (``pipeline.conditions.PROMPTS_SCHEMA``).
LABEL_HINT_FLAGS = {"grounding": "grounding_label_hint", "memory": "memory_label_hint"}


def label_hint_counts(prompts_rows: Sequence[Mapping[str, Any]] | None) -> dict[str, int] | None:
    """How many of a condition's rendered prompts reveal the task's answer, and through what.

    Args:
        prompts_rows: The condition's ``data/prompts/<C>.parquet`` rows.

    Returns:
        ``{"prompts", "grounding", "memory", "either"}`` (prompt counts), or None when the
        rows carry no label-hint flags (rendered before the render stage recorded them).
    """
    rows = list(prompts_rows or [])
    if not any(r.get(col) is not None for r in rows for col in LABEL_HINT_FLAGS.values()):
        return None
    flags = {k: [bool(r.get(col)) for r in rows] for k, col in LABEL_HINT_FLAGS.items()}
    return {"prompts": len(rows), **{k: sum(v) for k, v in flags.items()},
            "either": sum(g or m for g, m in zip(flags["grounding"], flags["memory"]))}


def colors_for(conditions: Sequence[str]) -> dict[str, str]:
    unknown = iter([c for c in TAB10 if c not in CONDITION_COLORS.values()] * 4)
    return {c: CONDITION_COLORS.get(c) or next(unknown) for c in conditions}


# --------------------------------------------------------------------------- text


def format_value(x: Any, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals; "–" for None or a non-finite number."""
    if x is None:
        return "–"
    if isinstance(x, float) and not np.isfinite(x):
        return "–"
    return f"{x:.{digits}f}"


def _signed(x: Any, digits: int = 2) -> str:
    return "–" if x is None else f"{x:+.{digits}f}"


def format_ci(d: Mapping[str, Any], digits: int = 2, signed: bool = False) -> str:
    """``0.66 [0.59, 0.73]`` from ``{"value", "ci_low", "ci_high"}`` ("–" without a value)."""
    fmt = _signed if signed else format_value
    if d.get("value") is None:
        return "–"
    return f"{fmt(d['value'], digits)} [{fmt(d['ci_low'], digits)}, {fmt(d['ci_high'], digits)}]"


def _p(p: Any) -> str:
    if p is None:
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _settings(metrics: Mapping[str, Any]) -> dict:
    s = metrics.get("settings") or [{}]
    return s[0] if isinstance(s, list) else s


def _level_pct(metrics: Mapping[str, Any]) -> str:
    return f"{round(100 * float(_settings(metrics).get('ci_level', 0.95)))}%"


def ceiling_control_lines(metrics: Mapping[str, Any]) -> list[str]:
    """The reader's controls (:mod:`pipeline.analysis.ceiling`): read before anything else."""
    lines = []
    for ctl in (metrics.get("reader") or {}).get("controls", []):
        if ctl["check"] == "positive_control":
            lines.append(f"reader positive control: {ctl['treatment']} vs {ctl['control']}: the reader's difference "
                         f"{_signed(ctl['reader_diff'])} (Holm p={_p(ctl['reader_p_holm'])}): "
                         + ("**ok**, the oracle's text is worth a wide margin to an agent that uses it" if ctl["ok"] else
                            "**not shown**: the reader gains, but not significantly on this many tasks" if
                            (ctl["reader_diff"] or 0) > 0 else
                            "**BROKEN**: the oracle's text does not help even an agent that acts on every statement; "
                            "a failing pipeline (render, advisories), not a failing model"))
        else:
            lines.append(f"reader placebo check: {ctl['treatment']} vs {ctl['control']}: the reader's difference "
                         f"{_signed(ctl['reader_diff'])}: " + ("**ok** (no help)" if ctl["ok"] else
                                                               "**the placebo helps the reader**: its text is not "
                                                               "content-free"))
    return lines


def ceiling_markdown(metrics: Mapping[str, Any]) -> list[str]:
    """Markdown lines: every condition's success for the model and the reader (its ceiling),
    every comparison's difference for both, and the model's utilisation."""
    ceiling = metrics.get("reader")
    if not ceiling:
        return []
    level = _level_pct(metrics)
    rows = [[c, format_ci(v["model"]), format_ci(v["reader"]) if "reader" in v else "–"] for c, v in ceiling["conditions"].items()]
    parts = ["## What each condition's text is worth (the reader)", "",
             "The reader (`agent=reader`, `evaluate_reader@C`) plays the same tasks with the same prompts and acts on "
             "exactly what its prompt states: its success is the condition's information ceiling, its difference "
             "is what the treatment's text is worth, and the model's difference over the reader's is the share "
             f"of it the model realises (utilisation; {level} interval resampling tasks).", "",
             markdown_table(["condition", "model success", "reader success (ceiling)"], rows), ""]
    rows = [[f"{v['treatment']} − {v['control']}", v["role"], v["n_pairs"], format_ci(v["model_diff"], signed=True),
             format_ci(v["reader_diff"], signed=True), f"{v['reader_b']} / {v['reader_c']}", _p(v["reader_p_value"]),
             _p(v["reader_p_holm"]), v["reader_verdict"], _signed(v.get("reader_turns_diff"), 1),
             _p(v.get("reader_turns_p_holm") if v.get("reader_turns_p_holm") is not None else v.get("reader_turns_p_value")),
             format_ci(v["utilisation"])]
            for v in ceiling["comparisons"].values()]
    parts += [markdown_table(["comparison", "role", "pairs", "model Δ success", "reader Δ success", "reader b / c",
                      "reader p (McNemar)", "reader p (Holm)", "reader verdict", "reader Δ turns",
                      "reader turns p (Wilcoxon, Holm)", "utilisation (model Δ / reader Δ)"],
                     rows) if rows else "_no comparison_", "",
              "Utilisation is shown only where the reader's difference is not 0: a text worth nothing to an agent "
              "that uses all of it leaves nothing to realise.", ""]
    return parts


def worth_lines(metrics: Mapping[str, Any]) -> list[str]:
    """What the memory and the grounding are worth to the reader (its C2 − C1 and C1 − C0):
    the experiment's question asked of an agent that uses every statement of its prompt."""
    comps = (metrics.get("reader") or {}).get("comparisons") or {}
    lines = []
    for t, c, what in (("C2", "C1", "the memory beyond the grounding"), ("C1", "C0", "the grounding")):
        v = comps.get(f"{t}_vs_{c}")
        if not v:
            continue
        turns = (f"; turns {_signed(v.get('reader_turns_diff'), 1)} (Wilcoxon Holm p="
                 f"{_p(v.get('reader_turns_p_holm') if v.get('reader_turns_p_holm') is not None else v.get('reader_turns_p_value'))})"
                 if v.get("reader_turns_diff") is not None else "")
        lines.append(f"to the reader, {what} is worth {_signed(v['reader_diff']['value'])} success ({t} "
                     f"{format_value(v['reader_treatment'])} vs {c} {format_value(v['reader_control'])}, b={v['reader_b']}, "
                     f"c={v['reader_c']}, Holm p={_p(v['reader_p_holm'])}){turns}")
    return lines


def headline_lines(metrics: Mapping[str, Any]) -> list[str]:
    """One line per comparison and per prompt check: what a person reads first (the reader's
    controls first of all, then what the memory and the grounding are worth to the reader)."""
    lines = ceiling_control_lines(metrics) + worth_lines(metrics)
    level = _level_pct(metrics)
    details = metrics.get("details", [])
    # Controls first (positive controls, then checks: identical by construction), then the
    # primary comparisons.
    order = {"positive_control": 0, "check": 1}
    for d in sorted(details, key=lambda d: order.get(d.get("role", "primary"), 2)):
        s = d["success"]
        power = s.get("power") or {}
        cluster = d.get("success_cluster_diff") or s["diff"]
        verdict = s.get("verdict", "no detectable difference")
        holm_p = f", Holm p={_p(s.get('p_holm'))}" if d.get("role", "primary") != "check" else ""
        role = {"check": "check (identical by construction, outside the Holm family): ",
                "positive_control": "positive control: "}.get(d.get("role", "primary"), "")
        mde = power.get("mde")
        mde_text = (f"; minimum detectable difference {format_value(mde)} at {round(100 * power['power'])}% power"
                    if mde is not None else
                    f"; {d['n_pairs']} pairs cannot reach {round(100 * power.get('power', 0.8))}% power")
        lines.append(f"{role}{d['treatment']} vs {d['control']}: success {format_value(s['treatment'])} vs {format_value(s['control'])}, "
                     f"difference {format_ci(cluster, signed=True)} ({level} scene-cluster bootstrap), "
                     f"n={d['n_pairs']} pairs, b={s['table']['b']} (treatment only), c={s['table']['c']} "
                     f"(control only), exact McNemar p={_p(s['p_value'])}{holm_p}{mde_text}: **{verdict}**")
        if d.get("role") == "positive_control" and verdict != "better":
            lines.append(f"  → the positive control {d['treatment']} does not beat {d['control']}: in this setting "
                         "the agent cannot be shown to use its memory block at all, so the memory comparisons "
                         "below cannot show a memory effect either way.")
    for r in metrics.get("prompt_identity_details", []):
        a, b = r["conditions"]
        mark = "identical" if r["identical"] else "NOT identical"
        lines.append(f"prompts {a} vs {b}: {mark} ({r['tasks_compared']} tasks compared, {r['mismatches']} "
                     f"mismatches; first turn: {r['first_turn']['episodes_compared']} compared, "
                     f"{r['first_turn']['mismatches']} mismatches)")
    for s in metrics.get("skipped_comparisons", []):
        lines.append(f"skipped {s['name']}: {s['reason']}")
    return lines


def curves_markdown(metrics: Mapping[str, Any]) -> list[str]:
    """Markdown lines: the learning curves' points and their paired comparisons at each k."""
    curves = metrics.get("curves")
    if not curves or not curves.get("points"):
        return []
    points = curves["points"]
    agents = list(dict.fromkeys(p["agent"] for p in points))
    conds = list(dict.fromkeys(p["condition"] for p in points))
    parts = ["## Learning curves", "",
             "Every eval task replayed with the grounding and the episodic memory of the first k collected episodes "
             "of each scene (`dvc repro curve`, `experiment.curve`): success / mean turns per condition.", ""]
    for agent in agents:
        parts += [f"**{agent}**", "", markdown_table(["k", "held", *conds], curve_rows(points, agent, conds)), ""]
    rows = [[p["agent"], p["k"], f"{p['treatment']} − {p['control']}", p["n_pairs"],
             _signed(p["success"]["diff"]["value"]), f"{p['success']['table']['b']} / {p['success']['table']['c']}",
             _p(p["success"]["p_value"]), _signed(p["turns"]["diff"], 1), _p(p["turns"]["p_value"])]
            for p in curves.get("paired", [])]
    if rows:
        parts += [markdown_table(["agent", "k", "comparison", "pairs", "Δ success", "b / c", "p (McNemar)", "Δ turns",
                          "p (Wilcoxon)"], rows), ""]
    return parts


def stream_markdown(metrics: Mapping[str, Any]) -> list[str]:
    """Markdown lines: the streaming protocol's section (:func:`stream_tables`), when it streamed."""
    stream = metrics.get("stream")
    if not stream or not stream.get("points"):
        return []
    return ["## The streaming protocol", "",
            "Each house's eval tasks in one seeded order; every episode entered its condition's own grounding and "
            "memory before the house's next task (`dvc repro stream`, `experiment.stream`). Success per condition "
            "over all positions and over each stream's second half (what the first half's memory is worth). "
            "Every step, with the entries its memory held and the block it showed: [stream.html](stream.html).", "",
            *stream_tables(stream)]


def stream_tables(stream: Mapping[str, Any]) -> list[str]:
    """Markdown lines of a ``stream`` summary (``metrics/stream.json``, or ``compare.json``'s ``stream``):
    success per condition (all positions, each stream's second half), the paired comparisons with exact
    and Holm p, and the memory-induced errors (the first five, each with its block)."""
    conds = list(stream.get("conditions") or dict.fromkeys(p["condition"] for p in stream["points"]))
    by = {(p["agent"], p["window"], p["condition"]): p for p in stream["points"]}
    rows = [[agent, window.replace("_", " "), by[(agent, window, conds[0])]["n"] if (agent, window, conds[0]) in by else "–",
             *(f"{by[(agent, window, c)]['success']:.2f}" if (agent, window, c) in by else "–" for c in conds)]
            for agent, window in dict.fromkeys((a, w) for a, w, _ in by)]
    parts = [markdown_table(["agent", "window", "tasks", *conds], rows), ""]
    rows = [[p["agent"], p["window"].replace("_", " "), p["family"].replace("_", " "), f"{p['treatment']} − {p['control']}",
             p["n_pairs"], format_ci(p["success"]["diff"], signed=True),
             f"{p['success']['table']['b']} / {p['success']['table']['c']}", _p(p["success"]["p_value"]),
             _p(p.get("p_holm")), _signed(p.get("mde"))]
            for p in stream.get("paired", [])]
    if rows:
        parts += [markdown_table(["agent", "window", "family", "comparison", "pairs", "Δ success", "b / c", "p (exact)",
                                  "p (Holm)", "MDE"], rows), ""]
    errors = stream.get("degradations") or []
    parts += [f"Memory-induced errors (C2 lost a task C1 won, after an advisory): {len(errors)}." +
              (" The first:" if errors else ""), ""]
    for e in errors[:5]:
        block = " ".join(str(e["memory_block"]).split())
        parts += [f"- {e['agent']}, {e['scene_id']}/{e['quest_id']} at position {e['position']}: "
                  f"`{block[:300]}{'…' if len(block) > 300 else ''}`"]
    return parts + ([""] if errors else [])


def curve_rows(points: Sequence[Mapping[str, Any]], agent: str, conds: Sequence[str]) -> list[list[Any]]:
    """One row per k of ``agent``'s curve points: k, the episodes per scene held, then
    ``success / turns`` per condition of ``conds`` ("–" where not played)."""
    by = {(p["k"], p["condition"]): p for p in points if p["agent"] == agent}
    return [[k, max(by[(k, c)]["held"] for c in conds if (k, c) in by),
             *(f"{by[(k, c)]['success']:.2f} / {by[(k, c)]['turns']:.1f}" if (k, c) in by else "–" for c in conds)]
            for k in sorted({k for k, _ in by})]


def _gee(g: Mapping[str, Any] | None) -> str:
    if not g:
        return "–"
    if not g.get("estimable"):
        return f"n/a ({g.get('reason')})"
    return f"{_signed(g['log_odds'])} (p={_p(g['p_value'])}, {g['clusters']} scenes)"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table of ``rows`` under ``header``."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def markdown_tables(metrics: Mapping[str, Any]) -> str:
    """The per-condition, comparison, breakdown and prompt-check tables in Markdown."""
    level = _level_pct(metrics)
    parts = [f"### Conditions (value [{level} bootstrap interval])", ""]
    rows = []
    for m in metrics.get("conditions", []):
        rows.append([m["condition"], m["num_episodes"], format_ci(m["success_rate"]), format_ci(m["won_rate"]),
                     format_ci(m["mean_reward"]), format_ci(m["mean_turns"], 1), format_ci(m["invalid_action_rate"]),
                     format_ci(m["repeated_action_rate"]), format_ci(m["gate_pass_rate"]), format_value(m["prompt_tokens_per_episode"]["value"], 0),
                     format_value(m["generated_tokens_per_episode"]["value"], 0)])
    parts += [markdown_table(["condition", "episodes", "success", "won", "reward", "turns", "invalid rate", "repeated rate",
                      "gate pass", "prompt tok/ep", "gen tok/ep"], rows), ""]
    failed = [f"{m['condition']}: {m['backend_error_turns']} of {m['num_turns']} turns"
              for m in metrics.get("conditions", []) if m.get("backend_error_turns")]
    if failed:  # below agent.max_error_fraction (else evaluate stopped), but not nothing
        parts += [f"**Model calls failed** (recorded as failed turns, the fallback action taken): {'; '.join(failed)}.",
                  ""]
    parts += label_hint_table(metrics)

    details = metrics.get("details", [])
    parts += [f"### Paired comparisons (treatment − control, {level} intervals; exact McNemar; verdict from Holm p)",
              ""]
    rows = [[f"{d['treatment']} − {d['control']}", d.get("role", "primary"), d["n_pairs"], format_value(d["success"]["treatment"]),
             format_value(d["success"]["control"]), format_ci(d.get("success_cluster_diff") or d["success"]["diff"], signed=True),
             format_ci(d["success"]["diff"], signed=True), f"{d['success']['table']['b']} / {d['success']['table']['c']}",
             _p(d["success"]["p_value"]), _p(d["success"].get("p_holm")),
             format_value((d["success"].get("power") or {}).get("mde")), format_value((d["success"].get("power") or {}).get("power_20pt")),
             _gee(d.get("gee")), d["success"].get("verdict", "–"), format_ci(d["won"]["diff"], signed=True),
             format_ci(d["reward"]["diff"], signed=True), format_ci(d["turns"]["diff"], 1, signed=True),
             _p((d.get("turns_test") or {}).get("p_value")), _p((d.get("turns_test") or {}).get("p_holm"))]
            for d in details]
    parts += [markdown_table(["comparison", "role", "pairs", "success T", "success C", "Δ success (scene clusters)",
                      "Δ success (pairs)", "b / c", "p (McNemar)", "p (Holm)", "MDE", "power at 20 pt", "GEE check",
                      "verdict", "Δ won", "Δ reward", "Δ turns", "turns p (Wilcoxon)", "turns p (Holm)"], rows)
              if rows else "_no comparison_", "",
              "b: pairs only the treatment succeeded on; c: only the control. MDE: the smallest success difference "
              "the exact test detects with the configured power at alpha/m and the planning discordance "
              "(`experiment.power`, `experiment.planning_discordance`). GEE check: logistic GEE of success on "
              "condition with scenes as clusters (statsmodels), log-odds and p. Turns are compared per task with the "
              "Wilcoxon signed-rank test (pairs with equal turns left out), Holm within the same family.", ""]

    for by, title in GROUP_TITLES.items():
        rows = []
        for d in details:
            for g in d["breakdowns"].get(by, []):
                rows.append([f"{d['treatment']} − {d['control']}", g["group"], g["n_pairs"], format_value(g["treatment"]),
                             format_value(g["control"]), format_ci(g["diff"], signed=True), _p(g["p_value"]), format_ci(g["turns"], 1, signed=True)])
        if rows:
            parts += [f"### By {title}", "",
                      markdown_table(["comparison", title, "pairs", "success T", "success C", "Δ success", "p (McNemar)",
                              "Δ turns"], rows), ""]

    ident = metrics.get("prompt_identity_details", [])
    if ident:
        parts += ["### Byte-identical prompts", ""]
        rows = [[f"{r['conditions'][0]} vs {r['conditions'][1]}", "yes" if r["identical"] else "**NO**",
                 r["compared_by"] or "–", r["tasks_compared"], r["mismatches"], r["only_first"] + r["only_second"],
                 f"{r['first_turn']['episodes_compared']} / {r['first_turn']['mismatches']}",
                 ", ".join(r["mismatched_tasks"][:5]) or "–"] for r in ident]
        parts += [markdown_table(["conditions", "identical", "compared by", "tasks", "mismatches", "unmatched tasks",
                          "first turn compared / mismatches", "first mismatches"], rows), ""]
    skipped = metrics.get("skipped_comparisons", [])
    if skipped:
        parts += ["### Skipped", ""] + [f"- {s['name']}: {s['reason']}" for s in skipped] + [""]
    return "\n".join(parts)


def label_hint_table(metrics: Mapping[str, Any]) -> list[str]:
    """Markdown lines: per condition, the prompts that reveal the task's answer through the
    grounding and through the memory block (none when no condition recorded them)."""
    conds = metrics.get("conditions", [])
    if not any(m.get("label_hint_prompts") for m in conds):
        return []
    rows = []
    for m in conds:
        c = m.get("label_hint_prompts")
        rows.append([m["condition"], *((c["prompts"], c["grounding"], c["memory"], c["either"]) if c else ("–",) * 4)])
    return ["### Prompts that reveal the task's answer", "",
            markdown_table(["condition", "prompts", "via grounding", "via memory", "either"], rows), "",
            "A text reveals the answer when it holds the task's ground truth or names enough of its expert plan's "
            "object commands (`memory.label_hint_min_commands`; navigation is the scene's map and not counted): "
            "the rule that drops an advisory before injection, applied to the grounding text and the injected "
            "memory block of each rendered prompt.", ""]


def report_markdown(metrics: Mapping[str, Any], figures: Mapping[str, str],
                    success: str = WorldWords().success) -> str:
    """The whole report: headline, figures, tables, definitions (``success``: what
    ``is_correct`` means in the world, :func:`pipeline.envs.world_words`)."""
    s = _settings(metrics)
    conds = s.get("conditions") or [m["condition"] for m in metrics.get("conditions", [])]
    n_eps = {m["condition"]: m["num_episodes"] for m in metrics.get("conditions", [])}
    parts = [
        "# Condition comparison",
        "",
        f"Conditions: {', '.join(f'{c} ({n_eps.get(c, 0)} episodes)' for c in conds)}. "
        f"Seed {s.get('seed')}, {s.get('bootstrap_samples')} bootstrap resamples, "
        f"{_level_pct(metrics)} percentile intervals. Success = `is_correct` ({success}); episodes are paired by `episode_id` "
        "(same task, same seed under every condition).",
        "",
        "## Headline",
        "",
    ]
    parts += [f"- {line}" for line in headline_lines(metrics)] or ["- (no comparison configured)"]
    parts.append("")
    parts += ["Transcripts: [episodes.html](episodes.html), every eval task's runs side by side, turn by turn.", ""]
    parts += ceiling_markdown(metrics)
    parts += curves_markdown(metrics)
    parts += stream_markdown(metrics)
    captions = {
        "learning_curves": "Success (left) and turns (right) against the past episodes per scene that the memory "
                           "and the grounding hold (the curve stage; k = 0: neither).",
        "success_by_condition": "Success rate per condition with its bootstrap interval.",
        "paired_differences": "Paired difference in success (treatment − control): a bar that crosses 0 means no "
                              "detectable difference at this level.",
        "success_by_group": "Success per scene, quest length and scene split (intervals are wide on few tasks).",
        "turns_distribution": "Turns per episode (box: quartiles, line: median, points: episodes).",
    }
    parts += ["## Figures", ""]
    shown = set(FIGURES) - ({"learning_curves"} if not (metrics.get("curves") or {}).get("points") else set())
    for key, name in ((k, v) for k, v in figures.items() if k in shown):
        parts += [f"![{key}]({name})", "", f"_{captions.get(key, '')}_", ""]
    parts += ["## Tables", "", markdown_tables(metrics)]
    return "\n".join(parts).rstrip() + "\n"


# --------------------------------------------------------------------------- figures


def _new_figure(width: float, height: float):
    # deferred: heavy optional dependency (matplotlib)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None}, bbox_inches="tight")
    return buf.getvalue()


def _yerr(values: Sequence[float | None], lows: Sequence[float | None], highs: Sequence[float | None]) -> np.ndarray:
    lo = [0.0 if v is None or lw is None else max(0.0, v - lw) for v, lw in zip(values, lows)]
    hi = [0.0 if v is None or h is None else max(0.0, h - v) for v, h in zip(values, highs)]
    return np.asarray([lo, hi])


def figure_success_by_condition(rows: Sequence[Mapping[str, Any]], level: str) -> bytes:
    conds = [r["condition"] for r in rows]
    colors = colors_for(conds)
    vals = [r["success_rate"] for r in rows]
    fig = _new_figure(max(4.5, 1.3 * len(rows) + 1.5), 4.2)
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    ax.bar(x, [v or 0.0 for v in vals], color=[colors[c] for c in conds], width=0.6, edgecolor="black", linewidth=0.6)
    ax.errorbar(x, [v or 0.0 for v in vals], yerr=_yerr(vals, [r["ci_low"] for r in rows], [r["ci_high"] for r in rows]),
                fmt="none", ecolor="black", capsize=6, linewidth=1.3)
    for xi, r in zip(x, rows):
        if r["success_rate"] is None:
            ax.text(xi, 0.02, "no data", ha="center", va="bottom", fontsize=9)
            continue
        top = r["ci_high"] if r["ci_high"] is not None else r["success_rate"]
        ax.text(xi, min(top + 0.03, 1.08), f"{r['success_rate']:.2f}\n[{format_value(r['ci_low'])}, {format_value(r['ci_high'])}]",
                ha="center", va="bottom", fontsize=8.5)
    ax.set_xticks(x, [f"{c}\nn={r['n']}" for c, r in zip(conds, rows)])
    ax.set_xlim(-0.7, len(rows) - 0.3)
    ax.set_ylim(0, 1.22)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("success rate")
    ax.set_title(f"Success rate by condition ({level} bootstrap interval)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return _png(fig)


#: The results figure of the README, written by ``compare`` into ``plots/`` (committed, not cached).
MODEL_AND_READER_FIGURE = "success_model_and_reader.png"


def figure_model_and_reader(metrics: Mapping[str, Any]) -> bytes | None:
    """Success per condition, the model's bar beside the reader's (its ceiling), with intervals;
    ``None`` when the run has no reader (``experiment.reader`` off)."""
    conditions = (metrics.get("reader") or {}).get("conditions") or {}
    if not conditions:
        return None
    # the order of metrics["conditions"] (the config's), which survives compare.json's sorted keys
    listed = [m["condition"] for m in metrics.get("conditions", []) if m.get("condition") in conditions]
    conds = listed + sorted(c for c in conditions if c not in listed)
    fig = _new_figure(max(5.5, 1.25 * len(conds) + 1.5), 4.4)
    ax = fig.add_subplot()
    x = np.arange(len(conds))
    width = 0.38
    for offset, who, color, hatch in ((-width / 2, "model", "#1f77b4", None), (width / 2, "reader", "#d9d9d9", "//")):
        ds = [conditions[c].get(who) or {} for c in conds]
        vals = [d.get("value") for d in ds]
        ax.bar(x + offset, [v or 0.0 for v in vals], width=width, color=color, hatch=hatch, edgecolor="black",
               linewidth=0.6, label={"model": "model (the agent under test)", "reader": "reader (the text's ceiling)"}[who])
        ax.errorbar(x + offset, [v or 0.0 for v in vals], yerr=_yerr(vals, [d.get("ci_low") for d in ds],
                                                                      [d.get("ci_high") for d in ds]),
                    fmt="none", ecolor="black", capsize=4, linewidth=1.1)
        for xi, d in zip(x + offset, ds):
            if d.get("value") is None:
                continue
            top = d.get("ci_high") if d.get("ci_high") is not None else d["value"]
            ax.text(xi, min(top + 0.02, 1.1), f"{d['value']:.2f}", ha="center", va="bottom", fontsize=8)
    n = (conditions[conds[0]].get("model") or {}).get("n")
    ax.set_xticks(x, conds)
    ax.set_xlim(-0.7, len(conds) - 0.3)
    ax.set_ylim(0, 1.2)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("success rate")
    ax.set_title(f"Success per condition, model and reader ({_level_pct(metrics)} interval"
                 + (f", {n} paired tasks)" if n else ")"))
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return _png(fig)


def figure_paired_differences(details: Sequence[Mapping[str, Any]], level: str) -> bytes:
    n = max(1, len(details))
    fig = _new_figure(7.5, 1.0 + 0.7 * n)
    ax = fig.add_subplot()
    ax.axvline(0, color="black", linewidth=1, linestyle="--")
    if not details:
        ax.text(0, 0, "no comparison (fewer than two conditions evaluated)", ha="center", va="center",
                bbox={"facecolor": "white", "edgecolor": "none"})
    ys = np.arange(len(details))[::-1]
    for y, d in zip(ys, details):
        diff = d["success"]["diff"]
        v, lo, hi = diff["value"], diff["ci_low"], diff["ci_high"]
        excludes_zero = lo is not None and (lo > 0 or hi < 0)
        color = CONDITION_COLORS.get(d["treatment"], "#1f77b4") if excludes_zero else "#555555"
        ax.plot([lo, hi], [y, y], color=color, linewidth=2.5, solid_capstyle="butt")
        ax.plot([v], [y], "o", color=color, markersize=8, markeredgecolor="black")
        ax.text(1.02, y, f"{v:+.2f} [{lo:+.2f}, {hi:+.2f}]   p={_p(d['success']['p_value'])}   n={d['n_pairs']}",
                va="center", ha="left", fontsize=8.5, transform=ax.get_yaxis_transform())
    ax.set_yticks(ys, [f"{d['treatment']} − {d['control']}" for d in details])
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(-0.7, max(0.7, len(details) - 0.3))
    ax.set_xlabel(f"difference in success rate (treatment − control), {level} paired bootstrap")
    ax.set_title("Paired comparisons of success (coloured: interval excludes 0; p: exact McNemar)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def figure_success_by_group(groups: Sequence[Mapping[str, Any]], conditions: Sequence[str], level: str) -> bytes:
    bys = [b for b in GROUP_TITLES if any(g["by"] == b for g in groups)]
    colors = colors_for(conditions)
    most = max([len({g["group"] for g in groups if g["by"] == b}) for b in bys] or [1])
    fig = _new_figure(min(20.0, max(7.0, 2.0 + 0.45 * len(conditions) * most)), 2.8 * max(1, len(bys)) + 0.4)
    axes = fig.subplots(max(1, len(bys)), 1, squeeze=False)[:, 0]
    span = min(0.8, 0.22 * max(1, len(conditions)))  # a lone condition gets a bar, not a wall
    width = span / max(1, len(conditions))
    for ax, by in zip(axes, bys):
        rows = [g for g in groups if g["by"] == by]
        labels = list(dict.fromkeys(g["group"] for g in rows))
        x = np.arange(len(labels))
        for i, c in enumerate(conditions):
            rc = {g["group"]: g for g in rows if g["condition"] == c}
            vals = [rc[lab]["success_rate"]["value"] if lab in rc else None for lab in labels]
            lows = [rc[lab]["success_rate"]["ci_low"] if lab in rc else None for lab in labels]
            highs = [rc[lab]["success_rate"]["ci_high"] if lab in rc else None for lab in labels]
            xs = x - span / 2 + width * (i + 0.5)
            ax.bar(xs, [v or 0.0 for v in vals], width=width * 0.92, color=colors[c], edgecolor="black",
                   linewidth=0.4, label=c)
            ax.errorbar(xs, [v or 0.0 for v in vals], yerr=_yerr(vals, lows, highs), fmt="none", ecolor="black",
                        capsize=2.5, linewidth=0.9)
            for xv, v in zip(xs, vals):  # a zero-height bar is invisible: say it is 0, not missing
                if v == 0:
                    ax.text(xv, 0.01, "0", ha="center", va="bottom", fontsize=7, color=colors[c])
        ns = {lab: max(g["success_rate"]["n"] for g in rows if g["group"] == lab) for lab in labels}
        ax.set_xticks(x, [f"{lab}\n(n={ns[lab]})" for lab in labels])
        ax.set_xlim(-0.6, len(labels) - 0.4)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("success rate")
        ax.set_title(f"by {GROUP_TITLES[by]}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0].legend(ncol=len(conditions), loc="lower center", bbox_to_anchor=(0.5, 1.12), frameon=False, fontsize=9)
    fig.suptitle(f"Success by group and condition ({level} bootstrap interval)", y=1.0)
    fig.tight_layout()
    return _png(fig)


def figure_turns(turns_by_condition: Mapping[str, Sequence[int]]) -> bytes:
    conds = list(turns_by_condition)
    colors = colors_for(conds)
    fig = _new_figure(max(4.5, 1.3 * len(conds) + 1.5), 4.2)
    ax = fig.add_subplot()
    data = [np.asarray(turns_by_condition[c], dtype=float) for c in conds]
    present = [i for i, d in enumerate(data) if d.size]
    if present:
        bp = ax.boxplot([data[i] for i in present], positions=[i for i in present], widths=0.55, patch_artist=True,
                        showfliers=False, medianprops={"color": "black", "linewidth": 1.5})
        for patch, i in zip(bp["boxes"], present):
            patch.set_facecolor(colors[conds[i]])
            patch.set_alpha(0.45)
    # Seeded jitter: the figure is an artifact and must not change between runs.
    rng = np.random.default_rng(0)
    for i, d in enumerate(data):
        ax.scatter(i + rng.uniform(-0.18, 0.18, d.size), d, s=12, color=colors[conds[i]], edgecolor="black",
                   linewidth=0.3, zorder=3)
        if d.size:
            ax.text(i, float(d.max()) + 0.4, f"mean {d.mean():.1f}", ha="center", va="bottom", fontsize=8.5)
        else:
            ax.text(i, 0.5, "no data", ha="center", fontsize=9)
    ax.set_xticks(range(len(conds)), [f"{c}\nn={d.size}" for c, d in zip(conds, data)])
    ax.set_xlim(-0.6, len(conds) - 0.4)
    top = max([float(d.max()) for d in data if d.size] or [1.0])
    ax.set_ylim(0, top * 1.15 + 1)
    ax.set_ylabel("turns per episode")
    ax.set_title("Turns per episode by condition")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return _png(fig)


def figure_curves(points: Sequence[Mapping[str, Any]]) -> bytes:
    """Success and mean turns against k, one line per condition (solid: the reader, dashed: the model)."""
    conds = list(dict.fromkeys(p["condition"] for p in points))
    colors = colors_for(conds)
    fig = _new_figure(10.0, 4.0)
    axes = fig.subplots(1, 2)
    for agent, style in zip(dict.fromkeys(p["agent"] for p in points), ("-", "--", ":")):
        for c in conds:
            ps = sorted((p for p in points if p["agent"] == agent and p["condition"] == c), key=lambda p: p["k"])
            if not ps:
                continue
            ks = [p["k"] for p in ps]
            axes[0].plot(ks, [p["success"] for p in ps], style, marker="o", color=colors[c], label=f"{c} ({agent})")
            axes[1].plot(ks, [p["turns"] for p in ps], style, marker="o", color=colors[c], label=f"{c} ({agent})")
    axes[0].set_ylim(0, 1.05)
    axes[0].set_ylabel("success rate")
    axes[1].set_ylabel("turns per episode")
    for ax in axes:
        ax.set_xlabel("past episodes per scene (k)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, max(1, len(labels))), fontsize=8,
               bbox_to_anchor=(0.5, -0.02 - 0.045 * ((len(labels) - 1) // 4)), frameon=False)
    fig.suptitle("Learning curves: what k past episodes per scene are worth")
    fig.tight_layout(rect=(0, 0.06 + 0.045 * ((len(labels) - 1) // 4), 1, 1))
    return _png(fig)


def turns_from_histogram(hist: Sequence[Mapping[str, Any]], conditions: Sequence[str]) -> dict[str, list[int]]:
    """Per-condition turn counts from the ``turns_distribution`` rows (num_turns, one count per condition)."""
    return {c: [int(r["num_turns"]) for r in hist for _ in range(int(r.get(c, 0)))] for c in conditions}


def write_report(metrics: Mapping[str, Any], plots: Mapping[str, Sequence[Mapping[str, Any]]],
                 out_dir: str | Path, success: str = WorldWords().success) -> list[Path]:
    """Write ``report.md``, ``compare.md`` and the PNG figures into ``out_dir``.

    Args:
        metrics: Content of ``metrics/compare.json``.
        plots: The plot rows (``success_by_condition``, ``turns_distribution``, ...).
        out_dir: The reports folder.
        success: What ``is_correct`` means in the world (:func:`pipeline.envs.world_words`).

    Returns:
        The paths written.
    """
    out = Path(out_dir)
    level = _level_pct(metrics)
    conds = [r["condition"] for r in plots.get("success_by_condition", [])]
    pngs = {
        **({"learning_curves": figure_curves(metrics["curves"]["points"])}
           if (metrics.get("curves") or {}).get("points") else {}),
        "success_by_condition": figure_success_by_condition(plots.get("success_by_condition", []), level),
        "paired_differences": figure_paired_differences(metrics.get("details", []), level),
        "success_by_group": figure_success_by_group(metrics.get("by_condition", []), conds, level),
        "turns_distribution": figure_turns(turns_from_histogram(plots.get("turns_distribution", []), conds)),
    }
    written = [atomic_write_bytes(out / FIGURES[k], data) for k, data in pngs.items()]
    written.append(atomic_write_text(out / "compare.md", "# Comparison tables\n\n" + markdown_tables(metrics)))
    written.append(atomic_write_text(out / "report.md", report_markdown(metrics, FIGURES, success)))
    return written
