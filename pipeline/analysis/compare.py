"""Comparison of conditions: per-condition metrics, paired comparisons, prompt identity, plot rows.

The library behind the ``compare`` stage (``python -m pipeline.stages.compare``)::

    data = {c: load_condition(root, cfg, c) for c in cfg.condition}
    reader = load_reader(root, cfg)                  # the reader's episodes per condition (evaluate_reader@C)
    result = compare(data, manifest_rows, cfg, reader)       # CompareResult, nothing written
    write_outputs(result, root, cfg, success)        # compare.json, plots/*.json, reports/

Inputs, for every condition: ``data/eval/<C>/episodes.parquet`` and ``turns.parquet``
(written by ``evaluate@C``), ``data/prompts/<C>.parquet`` (``render``); and the games
manifest for the breakdowns (scene, quest length, scene split).

For every pair ``[treatment, control]`` of ``experiment.comparisons`` the episodes are
paired by ``episode_id`` (the same task played with the same seed under both conditions):

- success (``is_correct``) and ``won``: difference of rates with a paired bootstrap
  interval, and the exact McNemar p-value on the discordant pairs (plus Holm-adjusted
  p-values over the comparisons);
- reward and turns: difference of means with a paired bootstrap interval;
- the same per scene, per quest length and per scene split.

With the reader's episodes (``experiment.reader``), each condition's information ceiling
and the model's utilisation of it beside every comparison (:mod:`pipeline.analysis.ceiling`).

For every pair of ``experiment.identical_prompts`` (C1, C2_silent) the rendered system
prompts are compared byte by byte, task by task (and the first turn's prompt hash where
the agent recorded one): the count of tasks compared and of mismatches is reported.

``metrics/compare.json`` keeps headline numbers as dicts so ``dvc metrics show/diff``
list them, and details as lists, which DVC's table skips. Every interval is seeded from
``seed``: the same inputs give byte-identical outputs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.analysis.ceiling import reader_ceiling
from pipeline.analysis.curves import summarise_curves
from pipeline.analysis.stream import stream_summary
from pipeline.analysis.metrics import as_rows, bootstrap_settings, condition_metrics
from pipeline.analysis.report import MODEL_AND_READER_FIGURE, figure_model_and_reader, label_hint_counts, write_report
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError
from pipeline.core.io import ArtifactError, atomic_write_bytes, atomic_write_json, read_parquet
from pipeline.core.facts import WorldWords
from pipeline.core.seeding import labelled_rng
from pipeline.core.stats import (
    PairingError,
    bootstrap_mean,
    cluster_bootstrap_diff,
    gee_check,
    holm,
    mcnemar_mde,
    mcnemar_power,
    paired_binary,
    paired_continuous,
    pair_rows,
    verdict,
    wilcoxon_paired,
)

#: Manifest columns the outcomes are broken down by.
BREAKDOWNS = ("scene_id", "quest_length", "scene_split")
#: Columns read from turns (the prompt text itself is not needed here).
TURN_COLUMNS = ["episode_id", "turn_index", "prompt_hash"]
#: Tasks listed by name when prompts differ (the count is always complete).
MAX_LISTED = 20


@dataclass
class ConditionData:
    """What ``evaluate@C`` and ``render`` wrote for one condition (rows as dicts)."""

    episodes: list[dict]
    turns: list[dict] | None = None
    prompts: list[dict] | None = None


@dataclass
class CompareResult:
    """The stage's outputs before they are written.

    Attributes:
        metrics: Content of ``metrics/compare.json``.
        conditions: Per-condition metrics (``condition_metrics``), in config order.
        plots: ``{file stem: rows}`` for ``plots/<stem>.json``.
    """

    metrics: dict
    conditions: dict[str, dict]
    plots: dict[str, list[dict]] = field(default_factory=dict)


def comparison_name(treatment: str, control: str) -> str:
    """``"<treatment>_vs_<control>"``: a comparison's key in ``metrics/compare.json``."""
    return f"{treatment}_vs_{control}"


def _task(row: Mapping[str, Any]) -> tuple[str, str]:
    return str(row["scene_id"]), str(row["quest_id"])


def _group_value(v: Any) -> str:
    return "" if v is None else str(v)


def _group_sort_key(v: str) -> tuple:
    # Quest lengths sort as numbers ("10" after "9"); scene ids as text.
    return (0, int(v), "") if v.lstrip("-").isdigit() else (1, 0, v)


def task_info(manifest_rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, str]]:
    """``(scene_id, quest_id) -> {breakdown column: value}`` from the games manifest."""
    out = {}
    for r in manifest_rows:
        out[_task(r)] = {b: _group_value(r.get(b)) for b in BREAKDOWNS}
    return out


def _info_for(info: Mapping[tuple[str, str], dict], ep: Mapping[str, Any], condition: str) -> dict[str, str]:
    try:
        return info[_task(ep)]
    except KeyError:
        raise ArtifactError(f"{condition}: episode {ep['episode_id']!r} plays task {_task(ep)} which is not in the "
                            "games manifest (stale eval outputs? rerun `dvc repro`)") from None


# --------------------------------------------------------------------------- comparisons


def compare_pair(treatment: str, control: str, a: ConditionData, b: ConditionData,
                 info: Mapping[tuple[str, str], dict], cfg: Config) -> dict[str, Any]:
    """Paired comparison of two conditions (the record kept in ``details``).

    Raises:
        PairingError: Duplicate episode ids, seeds that differ within a pair, or no pair.
    """
    seed, n_resamples, level = bootstrap_settings(cfg)
    name = comparison_name(treatment, control)
    pairs, only_t, only_c = pair_rows(a.episodes, b.episodes, where=(treatment, control))
    if not pairs:
        raise PairingError(f"{name}: no episode_id is shared by {treatment} and {control}; the conditions "
                           "did not play the same eval tasks")

    def rng(*labels: str) -> np.random.Generator:
        return labelled_rng(seed, "compare", name, *labels)

    def outcomes(ps: Sequence[tuple[Mapping, Mapping]], col: str) -> tuple[list, list]:
        return [p[0][col] for p in ps], [p[1][col] for p in ps]

    def binary(ps: Sequence[tuple[Mapping, Mapping]], col: str, *labels: str) -> dict:
        t, c = outcomes(ps, col)
        return paired_binary([bool(x) for x in t], [bool(x) for x in c], n_resamples=n_resamples, level=level,
                             rng=rng(col, *labels))

    def continuous(ps: Sequence[tuple[Mapping, Mapping]], col: str, *labels: str) -> dict:
        t, c = outcomes(ps, col)
        return paired_continuous([float(x or 0) for x in t], [float(x or 0) for x in c], n_resamples=n_resamples,
                                 level=level, rng=rng(col, *labels))

    breakdowns: dict[str, list[dict]] = {}
    for by in BREAKDOWNS:
        groups: dict[str, list] = defaultdict(list)
        for p in pairs:
            groups[_info_for(info, p[0], treatment)[by]].append(p)
        rows = []
        for g in sorted(groups, key=_group_sort_key):
            s = binary(groups[g], "is_correct", by, g)
            rows.append({"by": by, "group": g, "n_pairs": s["n_pairs"], "treatment": s["treatment"],
                         "control": s["control"], "diff": s["diff"], "table": s["table"], "p_value": s["p_value"],
                         "turns": continuous(groups[g], "num_turns", by, g)["diff"]})
        breakdowns[by] = rows
    success = binary(pairs, "is_correct")
    t_ok, c_ok = outcomes(pairs, "is_correct")
    scenes = [_info_for(info, p[0], treatment)["scene_id"] for p in pairs]
    return {
        "name": name,
        "treatment": treatment,
        "control": control,
        "n_pairs": len(pairs),
        # Tasks of one scene share grounding and memory: the effect's interval resamples scenes.
        "success_cluster_diff": cluster_bootstrap_diff([float(v) for v in t_ok], [float(v) for v in c_ok], scenes,
                                                       n_resamples=n_resamples, level=level,
                                                       rng=rng("is_correct", "cluster")).as_dict(),
        "clusters": len(set(scenes)),
        "gee": gee_check([bool(v) for v in t_ok], [bool(v) for v in c_ok], scenes),
        "only_treatment": len(only_t),
        "only_control": len(only_c),
        "success": success,
        "won": binary(pairs, "won"),
        "reward": continuous(pairs, "final_reward"),
        "turns": continuous(pairs, "num_turns"),
        # Turns, paired per task: the Wilcoxon signed-rank test (Holm within the family, below).
        "turns_test": wilcoxon_paired(*(list(map(float, x)) for x in outcomes(pairs, "num_turns"))),
        "breakdowns": breakdowns,
    }


# --------------------------------------------------------------------------- prompt identity


def _prompt_text_column(rows: Sequence[Mapping[str, Any]]) -> str | None:
    for col in ("system_prompt", "prompt_sha256", "system_prompt_sha256"):
        if rows and all(col in r and r[col] is not None for r in rows):
            return col
    return None


def prompt_identity(first: str, second: str, a: ConditionData, b: ConditionData) -> dict[str, Any]:
    """Whether two conditions saw byte-identical system prompts, task by task.

    Compares ``system_prompt`` (UTF-8 bytes) per ``(scene_id, quest_id)``, or the prompt
    hash when the text is not stored; and, for episodes played under both conditions,
    the first turn's ``prompt_hash`` when the agent recorded one (llm agent).
    """
    pa_rows, pb_rows = as_rows(a.prompts), as_rows(b.prompts)
    col_a, col_b = _prompt_text_column(pa_rows), _prompt_text_column(pb_rows)
    col = col_a if col_a == col_b else None
    if col is None and pa_rows and pb_rows:
        # One side has text, the other only a hash: compare on the hash if both have it.
        col = "prompt_sha256" if all(r.get("prompt_sha256") for r in pa_rows + pb_rows) else None
    out: dict[str, Any] = {"name": f"{first}_vs_{second}", "conditions": [first, second], "compared_by": col}
    ta = {_task(r): r for r in pa_rows}
    tb = {_task(r): r for r in pb_rows}
    common = sorted(set(ta) & set(tb))
    mismatched = []
    if col is not None:
        mismatched = [t for t in common if str(ta[t][col]).encode("utf-8") != str(tb[t][col]).encode("utf-8")]
    out.update({
        "tasks_compared": len(common) if col is not None else 0,
        "mismatches": len(mismatched),
        "mismatched_tasks": [f"{s}/{q}" for s, q in mismatched[:MAX_LISTED]],
        "only_first": len(set(ta) - set(tb)),
        "only_second": len(set(tb) - set(ta)),
    })
    # What the model saw at the first turn (prompt text includes the first observation,
    # which is the same for the same task): compared only where hashes were recorded.
    first_a = {t["episode_id"]: t.get("prompt_hash") for t in as_rows(a.turns) if int(t["turn_index"]) == 0}
    first_b = {t["episode_id"]: t.get("prompt_hash") for t in as_rows(b.turns) if int(t["turn_index"]) == 0}
    both = sorted(e for e in set(first_a) & set(first_b) if first_a[e] and first_b[e])
    turn_mis = [e for e in both if first_a[e] != first_b[e]]
    out["first_turn"] = {"episodes_compared": len(both), "mismatches": len(turn_mis),
                         "mismatched_episodes": turn_mis[:MAX_LISTED]}
    out["identical"] = bool(out["tasks_compared"] > 0 and not mismatched and not out["only_first"]
                            and not out["only_second"] and not turn_mis)
    return out


# --------------------------------------------------------------------------- per condition


def by_condition(data: Mapping[str, ConditionData], info: Mapping[tuple[str, str], dict],
                 cfg: Config) -> list[dict]:
    """Success rate (with interval) and mean turns per condition within each breakdown group."""
    seed, n_resamples, level = bootstrap_settings(cfg)
    rows = []
    for by in BREAKDOWNS:
        for cond, d in data.items():
            groups: dict[str, list] = defaultdict(list)
            for e in d.episodes:
                groups[_info_for(info, e, cond)[by]].append(e)
            for g in sorted(groups, key=_group_sort_key):
                eps = groups[g]
                est = bootstrap_mean([float(bool(e["is_correct"])) for e in eps], n_resamples=n_resamples,
                                     level=level, rng=labelled_rng(seed, "by_condition", by, g))
                rows.append({"by": by, "group": g, "condition": cond, "success_rate": est.as_dict(),
                             "mean_turns": round(float(np.mean([e["num_turns"] for e in eps])), 6)})
    return rows


def plot_rows(conditions: Mapping[str, dict], groups: Sequence[dict], details: Sequence[dict],
              data: Mapping[str, ConditionData]) -> dict[str, list[dict]]:
    """Rows of the ``plots/*.json`` files ``dvc plots`` renders (conditions in config order)."""
    success = [{"condition": c, "success_rate": m["success_rate"]["value"], "ci_low": m["success_rate"]["ci_low"],
                "ci_high": m["success_rate"]["ci_high"], "won_rate": m["won_rate"]["value"],
                "n": m["num_episodes"]} for c, m in conditions.items()]
    order = {c: i for i, c in enumerate(conditions)}
    scene_rows = sorted((r for r in groups if r["by"] == "scene_id"),
                        key=lambda r: (_group_sort_key(r["group"]), order[r["condition"]]))
    by_scene = [{"group": f"{r['group']} · {r['condition']}", "scene_id": r["group"], "condition": r["condition"],
                 "success_rate": r["success_rate"]["value"], "ci_low": r["success_rate"]["ci_low"],
                 "ci_high": r["success_rate"]["ci_high"], "n": r["success_rate"]["n"]} for r in scene_rows]
    max_turns = max([int(e["num_turns"]) for d in data.values() for e in d.episodes] or [0])
    hist = []
    for k in range(max_turns + 1):
        row: dict[str, Any] = {"num_turns": k}
        for c, d in data.items():
            row[c] = sum(int(e["num_turns"]) == k for e in d.episodes)
        hist.append(row)
    diffs = [{"comparison": f"{d['treatment']} − {d['control']}", "diff": d["success"]["diff"]["value"],
              "ci_low": d["success"]["diff"]["ci_low"], "ci_high": d["success"]["diff"]["ci_high"],
              "p_value": d["success"]["p_value"], "n_pairs": d["n_pairs"]} for d in details]
    return {"success_by_condition": success, "success_by_scene": by_scene, "turns_distribution": hist,
            "success_diff": diffs}


# --------------------------------------------------------------------------- core


def paired_comparisons(data: Mapping[str, ConditionData], info: Mapping[tuple[str, str], dict],
                       cfg: Config) -> tuple[list[dict], list[dict]]:
    """:func:`compare_pair` for every pair of ``experiment.comparisons``, with Holm-adjusted p-values.

    Returns:
        ``(details, skipped)``: one record per comparison (``success.p_holm`` set), and
        ``{"name", "reason"}`` for each comparison naming a condition absent from ``data``.
    """
    details, skipped = [], []
    x = cfg.experiment
    for role, pairs in (("positive_control", x.positive_controls), ("primary", x.comparisons), ("check", x.checks)):
        for pair in pairs:
            t, c = pair[0], pair[1]
            missing = [m for m in (t, c) if m not in data]
            if missing:
                skipped.append({"name": comparison_name(t, c), "reason": f"condition(s) not evaluated: {missing}"})
                continue
            d = compare_pair(t, c, data[t], data[c], info, cfg)
            d["role"] = role
            details.append(d)
    families = {role: [d for d in details if d["role"] == role] for role in ("positive_control", "primary")}
    for members in families.values():  # Holm within each family; a check is outside both
        for d, p in zip(members, holm([d["success"]["p_value"] for d in members])):
            d["success"]["p_holm"] = p
        for d, p in zip(members, holm([d["turns_test"]["p_value"] for d in members])):
            d["turns_test"]["p_holm"] = p
    for d in details:
        d["turns_test"].setdefault("p_holm", None)
        s, table = d["success"], d["success"]["table"]
        s.setdefault("p_holm", None)
        family = len(families.get(d["role"], []))
        level = x.alpha / family if family else x.alpha
        s["verdict"] = verdict(s["p_holm"] if family else s["p_value"], table["b"], table["c"], x.alpha)
        psi = x.planning_discordance
        s["power"] = {"alpha": round(level, 10), "power": x.power, "discordance": psi,
                      "mde": mcnemar_mde(d["n_pairs"], level, power=x.power, discordance=psi),
                      # the power to detect a 20-point success difference (None: above the discordance)
                      "power_20pt": (round(mcnemar_power(d["n_pairs"], (psi + 0.2) / 2, (psi - 0.2) / 2, level), 4)
                                     if psi >= 0.2 else None)}
    return details, skipped


def prompt_identities(data: Mapping[str, ConditionData], cfg: Config) -> tuple[list[dict], list[dict]]:
    """:func:`prompt_identity` for every pair of ``experiment.identical_prompts``.

    Returns:
        ``(identity, skipped)``: one record per pair, and ``{"name", "reason"}`` for each
        pair naming a condition absent from ``data``.
    """
    identity, skipped = [], []
    for pair in cfg.experiment.identical_prompts:
        a, b = pair[0], pair[1]
        if a not in data or b not in data:
            skipped.append({"name": f"{a}_vs_{b}", "reason": "condition(s) not evaluated"})
            continue
        identity.append(prompt_identity(a, b, data[a], data[b]))
    return identity, skipped


def compare(data: Mapping[str, ConditionData], manifest_rows: Sequence[Mapping[str, Any]], cfg: Config,
            reader: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
            curves: Sequence[Mapping[str, Any]] | None = None,
            stream: Sequence[Mapping[str, Any]] | None = None) -> CompareResult:
    """The stage's core: metrics, paired comparisons, prompt checks and plot rows.

    Args:
        data: ``{condition: ConditionData}`` in the order conditions should be shown.
        manifest_rows: Games manifest rows (``scene_id``, ``quest_id``, ``quest_length``,
            ``scene_split``).
        cfg: The composed config (``seed``, ``experiment.*``).
        reader: ``{condition: the reader's episode rows}`` (:func:`load_reader`); None
            (or empty): no reader, no ``reader`` section.
        curves: the ``curve`` stage's outcome rows (:func:`load_curves`); None (or empty):
            no ``curves`` section.
        stream: the ``stream`` stage's step rows (:func:`load_stream`); None (or empty): no
            ``stream`` section.

    Returns:
        A :class:`CompareResult`. Comparisons naming a condition absent from ``data`` are
        listed under ``skipped_comparisons`` with the reason.

    Raises:
        PairingError: Two conditions did not play the same tasks with the same seeds.
        ValueError: Turns that do not match their episodes.
    """
    if not data:
        raise ConfigError("compare: no condition to compare (params key `condition` is empty)")
    info = task_info(manifest_rows)
    seed, n_resamples, level = bootstrap_settings(cfg)
    conditions = {c: condition_metrics(d.episodes, d.turns, d.prompts, cfg) for c, d in data.items()}
    for c, d in data.items():  # what each condition's prompts reveal of the answer (grounding, memory)
        if d.prompts is not None:
            conditions[c]["label_hint_prompts"] = label_hint_counts(as_rows(d.prompts))

    details, skipped = paired_comparisons(data, info, cfg)
    identity, identity_skipped = prompt_identities(data, cfg)
    groups = by_condition(data, info, cfg)
    metrics = {
        # Dicts of numbers: what `dvc metrics show` / `dvc metrics diff` list.
        "comparisons": {d["name"]: {"role": d["role"], "n_pairs": d["n_pairs"], "b": d["success"]["table"]["b"],
                                    "c": d["success"]["table"]["c"], "success_diff": _interval(d["success"]["diff"]),
                                    "success_diff_cluster": _interval(d["success_cluster_diff"]),
                                    "p_value": d["success"]["p_value"], "p_holm": d["success"]["p_holm"],
                                    "verdict": d["success"]["verdict"], "mde": d["success"]["power"]["mde"]}
                        for d in details},
        "prompt_identity": {r["name"]: {"tasks_compared": r["tasks_compared"], "mismatches": r["mismatches"]}
                            for r in identity},
        # Each condition's information ceiling and the model's share of it (issue 31).
        **({"reader": reader_ceiling({c: d.episodes for c, d in data.items()}, reader, details, cfg)}
           if reader else {}),
        # Learning curves: success and turns vs past episodes per scene (the curve stage's rows).
        **({"curves": summarise_curves(curves, n_resamples=n_resamples, level=level, seed=seed)} if curves else {}),
        # The streaming protocol: memory that grew while the eval tasks were played (the stream stage's rows).
        **({"stream": stream_summary(stream, cfg)} if stream else {}),
        # Lists: the details (DVC's table skips lists; the JSON keeps everything).
        "details": details,
        "skipped_comparisons": skipped + identity_skipped,
        "prompt_identity_details": identity,
        "conditions": [conditions[c] for c in data],
        "by_condition": groups,
        "settings": [{"seed": seed, "bootstrap_samples": n_resamples, "ci_level": level,
                      "conditions": list(data), "success": "is_correct", "pairing": "episode_id",
                      "p_value": "exact McNemar (two-sided binomial on discordant pairs); p_holm: Holm over "
                                 "the primary comparisons (checks are outside the family)",
                      "verdict": f"better/worse only when p_holm < alpha={cfg.experiment.alpha}; the "
                                 "intervals are the effect size",
                      "interval": "success_cluster_diff resamples scenes (tasks of a scene share grounding and "
                                  "memory); diff resamples pairs",
                      "power": "exact McNemar power at alpha/m (Holm's strictest step) and the planning "
                               "discordance; mde: smallest success difference detected with that power"}],
    }
    return CompareResult(metrics=metrics, conditions=conditions,
                         plots=plot_rows(conditions, groups, details, data))


def _interval(d: Mapping[str, Any]) -> dict:
    return {"value": d["value"], "ci_low": d["ci_low"], "ci_high": d["ci_high"]}


# --------------------------------------------------------------------------- entry point


def load_condition(root: Path, cfg: Config, condition: str) -> ConditionData:
    """Read one condition's eval episodes/turns and rendered prompts (clear error if missing)."""
    eval_dir = root / cfg.paths.eval / condition
    prompts = root / cfg.paths.prompts / f"{condition}.parquet"
    for path, stage in ((eval_dir / "episodes.parquet", f"evaluate@{condition}"),
                        (eval_dir / "turns.parquet", f"evaluate@{condition}"), (prompts, "render")):
        if not path.is_file():
            raise ArtifactError(f"condition {condition}: missing {path} (run `dvc repro {stage}`)")
    turns_path = eval_dir / "turns.parquet"
    try:  # only the schema: turns hold every prompt and output, and compare needs 3 columns
        names = set(pq.read_schema(turns_path).names)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ArtifactError(f"corrupt Parquet file {turns_path}: {exc}") from exc
    return ConditionData(
        episodes=read_parquet(eval_dir / "episodes.parquet").to_pylist(),
        turns=read_parquet(turns_path, columns=[c for c in TURN_COLUMNS if c in names]).to_pylist(),
        prompts=read_parquet(prompts).to_pylist(),
    )


def load_curves(root: Path, cfg: Config) -> list[dict]:
    """The ``curve`` stage's outcome rows (``<paths.curve>/outcomes.parquet``); empty when it has none."""
    path = root / cfg.paths.curve / "outcomes.parquet"
    return read_parquet(path).to_pylist() if path.is_file() else []


def load_stream(root: Path, cfg: Config) -> list[dict]:
    """The ``stream`` stage's step rows (``<paths.stream>/steps.parquet``); empty when it streamed nothing."""
    path = root / cfg.paths.stream / "steps.parquet"
    return read_parquet(path).to_pylist() if path.is_file() else []


def load_reader(root: Path, cfg: Config) -> dict[str, list[dict]]:
    """The reader's episode rows per condition (``evaluate_reader@C``); empty with
    ``experiment.reader=false`` (the stage then writes only a skip marker).

    Raises:
        ArtifactError: the reader is on and a condition's episodes are missing.
    """
    if not cfg.experiment.reader:
        return {}
    out = {}
    for c in cfg.condition:
        path = root / cfg.paths.eval_reader / c / "episodes.parquet"
        if not path.is_file():
            raise ArtifactError(f"condition {c}: missing {path} (run `dvc repro evaluate_reader@{c}`, or set "
                                "experiment.reader=false)")
        out[c] = read_parquet(path).to_pylist()
    return out


def write_outputs(result: CompareResult, root: Path, cfg: Config, success: str = WorldWords().success) -> list[Path]:
    """Write compare.json, the plot files and the report; returns the paths written (``success``:
    what ``is_correct`` means in the world, :func:`pipeline.envs.world_words`, given by the stage)."""
    written = [atomic_write_json(root / cfg.paths.metrics / "compare.json", result.metrics)]
    for stem, rows in result.plots.items():
        written.append(atomic_write_json(root / cfg.paths.plots / f"{stem}.json", rows))
    figure = figure_model_and_reader(result.metrics)  # the README's results figure (docs: pipeline.tools.results)
    if figure is not None:
        written.append(atomic_write_bytes(root / cfg.paths.plots / MODEL_AND_READER_FIGURE, figure))
    written += write_report(result.metrics, result.plots, root / cfg.paths.reports, success)
    return written
