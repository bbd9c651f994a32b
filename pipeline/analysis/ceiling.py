"""The reader beside the model: each condition's information ceiling, and the model's share of it.

The conditions differ only in their prompt's text, so the reader (``agent=reader``, a
rule agent that acts on exactly what its prompt states; ``evaluate_reader@C``) measures
what a condition's text is worth: its success is the condition's ceiling, and its
difference between two conditions is what the treatment's text adds. The model's
difference over the reader's, on the same tasks, is the model's *utilisation* of it::

    ceiling = reader_ceiling(model_episodes, reader_episodes, details, cfg)
    ceiling["comparisons"]["C2_vs_C1"]          # model and reader differences, utilisation
    ceiling["controls"]                         # the reader's positive control and placebo check

- per condition: the reader's success next to the model's (bootstrap intervals);
- per comparison of ``experiment.positive_controls`` / ``comparisons`` / ``checks``: the
  reader's paired difference (exact McNemar, Holm within the same families as the
  model's) and its paired turns (Wilcoxon signed-rank, Holm likewise), the model's, and utilisation = model difference / reader difference with an
  interval that resamples tasks (all four outcomes of a task together); none when the
  reader's difference is 0 (the text is worth nothing to an agent that uses all of it);
- the controls that read first: the reader must beat the positive control's baseline by a
  wide margin (Holm p < ``alpha``), otherwise the oracle's text itself is broken (a
  pipeline failure, not a model's); a placebo condition (``condition.<C>.kind: placebo``) must
  not help the reader against that baseline.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pipeline.analysis.metrics import bootstrap_settings
from pipeline.core.conf_schema import Config
from pipeline.core.seeding import labelled_rng
from pipeline.core.stats import (bootstrap_mean, holm, pair_rows, paired_binary, ratio_of_paired_diffs, verdict,
                                 wilcoxon_paired)



def _by_id(episodes: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    return {str(e["episode_id"]): bool(e["is_correct"]) for e in episodes}


def reader_ceiling(model: Mapping[str, Sequence[Mapping[str, Any]]], reader: Mapping[str, Sequence[Mapping[str, Any]]],
                   details: Sequence[Mapping[str, Any]], cfg: Config) -> dict[str, Any]:
    """The reader's figures beside the model's (see the module docstring).

    Args:
        model: ``{condition: the model's episode rows}`` (``evaluate@C``).
        reader: ``{condition: the reader's episode rows}`` (``evaluate_reader@C``); a
            condition missing here is shown without a reader.
        details: the model's paired comparisons (:func:`pipeline.analysis.compare.paired_comparisons`).
        cfg: the composed config (``seed``, ``experiment``, ``condition``).

    Returns:
        ``{"conditions", "comparisons", "controls"}``: dicts of numbers (``dvc metrics``
        lists them) keyed by condition and comparison name, and the control verdicts.
    """
    seed, n_resamples, level = bootstrap_settings(cfg)
    conditions = {}
    for c, eps in model.items():
        row = {"model": bootstrap_mean([float(bool(e["is_correct"])) for e in eps], n_resamples=n_resamples,
                                       level=level, rng=labelled_rng(seed, "ceiling", c, "model")).as_dict()}
        if c in reader:
            row["reader"] = bootstrap_mean([float(bool(e["is_correct"])) for e in reader[c]], n_resamples=n_resamples,
                                           level=level, rng=labelled_rng(seed, "ceiling", c, "reader")).as_dict()
        conditions[c] = row

    comparisons: dict[str, dict] = {}
    for d in details:
        t, c = d["treatment"], d["control"]
        if t not in reader or c not in reader:
            continue
        pairs, _, _ = pair_rows(reader[t], reader[c], where=(f"reader {t}", f"reader {c}"))
        rs = paired_binary([bool(p[0]["is_correct"]) for p in pairs], [bool(p[1]["is_correct"]) for p in pairs],
                           n_resamples=n_resamples, level=level, rng=labelled_rng(seed, "ceiling", d["name"], "reader"))
        turns = wilcoxon_paired([float(p[0]["num_turns"]) for p in pairs], [float(p[1]["num_turns"]) for p in pairs])
        mt, mc, rt, rc = _by_id(model[t]), _by_id(model[c]), _by_id(reader[t]), _by_id(reader[c])
        tasks = sorted(set(mt) & set(mc) & set(rt) & set(rc))
        util = ratio_of_paired_diffs([float(mt[k]) for k in tasks], [float(mc[k]) for k in tasks],
                                     [float(rt[k]) for k in tasks], [float(rc[k]) for k in tasks],
                                     n_resamples=n_resamples, level=level,
                                     rng=labelled_rng(seed, "ceiling", d["name"], "utilisation"))
        comparisons[d["name"]] = {
            "role": d.get("role", "primary"), "treatment": t, "control": c, "n_pairs": rs["n_pairs"],
            "model_diff": _interval(d["success"]["diff"]), "reader_diff": _interval(rs["diff"]),
            "reader_treatment": rs["treatment"], "reader_control": rs["control"],
            "reader_b": rs["table"]["b"], "reader_c": rs["table"]["c"], "reader_p_value": rs["p_value"],
            "reader_turns_diff": turns["diff"], "reader_turns_p_value": turns["p_value"],
            "utilisation": util.as_dict(),
        }
    for role in ("positive_control", "primary"):  # Holm within the model's families
        members = [v for v in comparisons.values() if v["role"] == role]
        for v, p in zip(members, holm([v["reader_p_value"] for v in members])):
            v["reader_p_holm"] = p
        for v, p in zip(members, holm([v["reader_turns_p_value"] for v in members])):
            v["reader_turns_p_holm"] = p
    for v in comparisons.values():
        v.setdefault("reader_p_holm", None)
        v.setdefault("reader_turns_p_holm", None)
        p = v["reader_p_holm"] if v["role"] != "check" else v["reader_p_value"]
        v["reader_verdict"] = verdict(p, v["reader_b"], v["reader_c"], cfg.experiment.alpha)
    return {"conditions": conditions, "comparisons": comparisons, "controls": controls(comparisons, reader, cfg)}


def controls(comparisons: Mapping[str, Mapping[str, Any]], reader: Mapping[str, Sequence[Mapping[str, Any]]],
             cfg: Config) -> list[dict[str, Any]]:
    """The reader's positive controls (must be ``better``) and each placebo condition
    against the positive control's baseline (its difference must not be positive)."""
    out = []
    baseline = None
    for v in comparisons.values():
        if v["role"] == "positive_control":
            baseline = baseline or v["control"]
            out.append({"check": "positive_control", "treatment": v["treatment"], "control": v["control"],
                        "reader_diff": v["reader_diff"]["value"], "reader_p_holm": v["reader_p_holm"],
                        "ok": v["reader_verdict"] == "better"})
    placebos = [c for c, spec in cfg.condition.items() if str(spec.kind) == "placebo" and c in reader]
    for c in placebos:
        if baseline is None or baseline not in reader:
            continue
        pairs, _, _ = pair_rows(reader[c], reader[baseline], where=(f"reader {c}", f"reader {baseline}"))
        diff = sum(bool(p[0]["is_correct"]) - bool(p[1]["is_correct"]) for p in pairs) / max(1, len(pairs))
        out.append({"check": "placebo", "treatment": c, "control": baseline, "reader_diff": round(diff, 6),
                    "ok": diff <= 0})
    return out


def _interval(d: Mapping[str, Any]) -> dict:
    return {"value": d["value"], "ci_low": d["ci_low"], "ci_high": d["ci_high"]}
