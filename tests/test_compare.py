"""Per-condition metrics, the ``compare`` stage, its plots and report (on hand-made outcomes)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from omegaconf import OmegaConf

from pipeline.session.episodes import write_episodes
from pipeline.core.conf_schema import Config
from pipeline.core.config import section
from pipeline.core.io import write_parquet
from pipeline.analysis.metrics import condition_metrics
from pipeline.core.schemas import manifest_table
from pipeline.analysis import compare as C
from pipeline.stages import compare as compare_stage
from pipeline.core.stats import PairingError

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = ("C0", "C1", "C2", "C2_silent", "C2_placebo", "C2_oracle")

# The plots / metrics sections proposed for dvc.yaml (checked against DVC below).
DVC_SECTIONS = """
metrics:
  - metrics/eval
  - metrics/compare.json
plots:
  - success_by_condition:
      template: bar_horizontal
      x: success_rate
      y:
        plots/success_by_condition.json: condition
  - success_by_scene:
      template: bar_horizontal
      x: success_rate
      y:
        plots/success_by_scene.json: group
  - success_diff:
      template: bar_horizontal
      x: diff
      y:
        plots/success_diff.json: comparison
  - turns_distribution:
      template: linear
      x: num_turns
      y:
        plots/turns_distribution.json: [C1, C2, C2_silent, C2_placebo]
"""


def _cfg(**experiment):
    exp = {"bootstrap_samples": 300, "ci_level": 0.95, "comparisons": [["C2", "C1"], ["C2_silent", "C1"]],
           "identical_prompts": [["C1", "C2_silent"]], **experiment}
    return section(Config, {"seed": 0, "experiment": exp})


def _manifest(n_scenes=2, n_quests=5):
    return [{"scene_id": f"s{s}", "quest_id": f"q{q}", "split": "eval", "quest_length": 2 + q % 2,
             "scene_split": "heldout" if s == n_scenes - 1 else "seen"}
            for s in range(n_scenes) for q in range(n_quests)]


def _condition(cond, manifest, won, *, turns=4, seed_offset=0, prompt=None):
    """Episodes/turns/prompts of one condition; ``won[i]`` is task i's outcome."""
    eps, trs, prompts = [], [], []
    for i, (m, w) in enumerate(zip(manifest, won)):
        eid = f"ep_eval_{m['scene_id']}_{m['quest_id']}_0"
        n = turns if w else turns + 3
        eps.append({"episode_id": eid, "scene_id": m["scene_id"], "quest_id": m["quest_id"], "split": "eval",
                    "condition": cond, "won": bool(w), "is_correct": bool(w), "preferences_ok": True,
                    "final_reward": 1.0 if w else -0.1, "num_turns": n, "num_invalid": 1, "num_repeated": 0,
                    "prompt_tokens": 100 * n, "generated_tokens": 10 * n, "seed": 1000 + i + seed_offset})
        trs += [{"episode_id": eid, "turn_index": k, "prompt_hash": None} for k in range(n)]
        text = prompt(m) if prompt else f"You are in {m['scene_id']}. Goal {m['quest_id']}."
        prompts.append({"task_id": f"{m['scene_id']}/{m['quest_id']}", "scene_id": m["scene_id"],
                        "quest_id": m["quest_id"], "condition": cond, "system_prompt": text,
                        "gate_ok": cond != "C1", "injected": cond == "C2"})
    return C.ConditionData(eps, trs, prompts)


# --------------------------------------------------------------------------- condition_metrics


def test_condition_metrics_known_values():
    man = _manifest(1, 4)
    d = _condition("C2", man, [1, 1, 0, 1])
    d.episodes[2]["is_correct"] = False
    d.episodes[0]["is_correct"] = False  # won but a preference broken
    m = condition_metrics(d.episodes, d.turns, d.prompts, _cfg())
    assert m["condition"] == "C2" and m["num_episodes"] == 4 and m["num_turns"] == 4 * 3 + 7
    assert m["won_rate"]["value"] == 0.75 and m["success_rate"]["value"] == 0.5
    assert m["mean_turns"]["value"] == pytest.approx(19 / 4)
    assert m["invalid_action_rate"]["value"] == pytest.approx(4 / 19, abs=1e-6)  # per turn, not per episode
    assert m["repeated_action_rate"] == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0, "n": 4}
    assert m["gate_pass_rate"]["value"] == 1.0 and m["injection_rate"]["value"] == 1.0
    assert m["prompt_tokens_per_episode"]["value"] == pytest.approx(1900 / 4)
    for key in ("success_rate", "mean_reward", "mean_turns", "generated_tokens_per_episode"):
        assert m[key]["ci_low"] <= m[key]["value"] <= m[key]["ci_high"]
    assert m["bootstrap"] == {"method": "percentile", "samples": 300, "ci_level": 0.95, "seed": 0}
    # Input order does not matter, and the result is plain JSON.
    again = condition_metrics(list(reversed(d.episodes)), d.turns, list(reversed(d.prompts)), _cfg())
    assert json.dumps(again, sort_keys=True) == json.dumps(m, sort_keys=True)


def test_condition_metrics_without_prompts_and_bad_inputs():
    man = _manifest(1, 2)
    d = _condition("C1", man, [1, 0])
    m = condition_metrics(pa.Table.from_pylist(d.episodes), None, None, _cfg())
    assert m["gate_pass_rate"] == {"value": None, "ci_low": None, "ci_high": None, "n": 0}
    with pytest.raises(ValueError, match="num_turns=4 but turns has 3 rows"):
        condition_metrics(d.episodes, d.turns[1:], None, _cfg())
    mixed = d.episodes + [{**_condition("C2", man, [1, 0]).episodes[0], "episode_id": "x"}]
    with pytest.raises(ValueError, match="several conditions"):
        condition_metrics(mixed, None, None, _cfg())


# --------------------------------------------------------------------------- compare core


def test_compare_on_hand_made_outcomes():
    man = _manifest(2, 5)  # 10 tasks
    c1 = [0, 0, 0, 0, 0, 1, 1, 0, 0, 0]
    c2 = [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]  # C2 wins 5 tasks C1 loses: b=5, c=0
    data = {"C1": _condition("C1", man, c1), "C2": _condition("C2", man, c2),
            "C2_silent": _condition("C2_silent", man, c1)}
    res = C.compare(data, man, _cfg())
    m = res.metrics
    assert list(m["comparisons"]) == ["C2_vs_C1", "C2_silent_vs_C1"]
    head = m["comparisons"]["C2_vs_C1"]
    assert head["n_pairs"] == 10 and head["p_value"] == pytest.approx(0.0625)
    assert head["success_diff"]["value"] == pytest.approx(0.5)
    assert head["p_holm"] == pytest.approx(0.125)  # 2 comparisons: 2 x 0.0625
    d = m["details"][0]
    assert d["success"]["table"] == {"both": 2, "b": 5, "c": 0, "neither": 3}
    assert d["turns"]["diff"]["value"] == pytest.approx(-1.5)  # 5 of 10 tasks 3 turns shorter
    # Breakdowns: s0 holds the 5 discordant pairs, s1 none.
    scenes = {g["group"]: g for g in d["breakdowns"]["scene_id"]}
    assert scenes["s0"]["table"]["b"] == 5 and scenes["s0"]["p_value"] == pytest.approx(0.0625)
    assert scenes["s1"]["diff"] == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0, "n": 5}
    assert [g["group"] for g in d["breakdowns"]["quest_length"]] == ["2", "3"]
    assert {g["group"] for g in d["breakdowns"]["scene_split"]} == {"seen", "heldout"}
    # C2_silent played exactly like C1: a zero-variance difference.
    z = m["details"][1]["success"]
    assert z["diff"] == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0, "n": 10} and z["p_value"] == 1.0
    # Prompt identity, conditions in config order in the plots.
    assert m["prompt_identity"] == {"C1_vs_C2_silent": {"tasks_compared": 10, "mismatches": 0}}
    assert m["prompt_identity_details"][0]["identical"] is True
    assert [r["condition"] for r in res.plots["success_by_condition"]] == ["C1", "C2", "C2_silent"]
    assert res.plots["success_by_condition"][1]["success_rate"] == 0.7
    hist = {r["num_turns"]: r for r in res.plots["turns_distribution"]}
    assert hist[4] == {"num_turns": 4, "C1": 2, "C2": 7, "C2_silent": 2}
    assert [r["group"] for r in res.plots["success_by_scene"]][:3] == ["s0 · C1", "s0 · C2", "s0 · C2_silent"]
    # Same inputs, same seed: identical numbers.
    assert json.dumps(C.compare(data, man, _cfg()).metrics, sort_keys=True) == json.dumps(m, sort_keys=True)


def test_prompt_identity_reports_mismatches_and_first_turn_hashes():
    man = _manifest(1, 3)
    a = _condition("C1", man, [1, 0, 1])
    b = _condition("C2_silent", man, [1, 0, 1], prompt=lambda m: f"You are in {m['scene_id']}. Goal {m['quest_id']}."
                   + (" " if m["quest_id"] == "q1" else ""))
    for t in a.turns + b.turns:
        if t["turn_index"] == 0:
            t["prompt_hash"] = "h-" + t["episode_id"]
    b.turns[0]["prompt_hash"] = "different"
    r = C.prompt_identity("C1", "C2_silent", a, b)
    assert r["tasks_compared"] == 3 and r["mismatches"] == 1 and r["mismatched_tasks"] == ["s0/q1"]
    assert r["first_turn"] == {"episodes_compared": 3, "mismatches": 1, "mismatched_episodes": ["ep_eval_s0_q0_0"]}
    assert r["identical"] is False
    b.prompts.pop()  # a task rendered for C1 only
    assert C.prompt_identity("C1", "C2_silent", a, b)["only_first"] == 1


def test_compare_refuses_broken_pairing():
    man = _manifest(1, 3)
    data = {"C1": _condition("C1", man, [0, 0, 1]), "C2": _condition("C2", man, [1, 0, 1], seed_offset=7),
            "C2_silent": _condition("C2_silent", man, [0, 0, 1])}
    with pytest.raises(PairingError, match="different seeds"):
        C.compare(data, man, _cfg())
    other = [{**m, "quest_id": m["quest_id"] + "x"} for m in man]
    data = {"C1": _condition("C1", man, [0, 0, 1]), "C2": _condition("C2", other, [1, 0, 1])}
    with pytest.raises(PairingError, match="no episode_id is shared"):
        C.compare(data, man + other, _cfg(comparisons=[["C2", "C1"]]))
    with pytest.raises(Exception, match="not in the games manifest"):
        C.compare({"C1": _condition("C1", man, [0, 0, 1])}, man[:1], _cfg(comparisons=[]))


def test_compare_single_task_single_condition(tmp_path):
    man = _manifest(1, 1)
    res = C.compare({"C2": _condition("C2", man, [1])}, man, _cfg())
    m = res.metrics
    assert m["details"] == [] and {s["name"] for s in m["skipped_comparisons"]} == {
        "C2_vs_C1", "C2_silent_vs_C1", "C1_vs_C2_silent"}
    assert m["conditions"][0]["success_rate"] == {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0, "n": 1}
    from pipeline.analysis.report import write_report

    paths = write_report(m, res.plots, tmp_path)
    assert {p.name for p in paths} >= {"report.md", "compare.md", "success_by_condition.png"}
    assert "skipped C2_vs_C1" in (tmp_path / "report.md").read_text()


# --------------------------------------------------------------------------- the stage


def _project(tmp_path: Path, conditions=CONDITIONS) -> Path:
    """A project root with the real conf/, a params.yaml composed from it, and eval outputs."""
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copytree(ROOT / "conf", root / "conf")
    shutil.copytree(ROOT / "hydra_plugins", root / "hydra_plugins", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "dvc.yaml").write_text(DVC_SECTIONS)
    from pipeline.core.config import compose

    compose(root)
    man = _manifest(2, 3)
    write_parquet(manifest_table(man), root / "data/games/manifest.parquet", sort_by=["scene_id", "quest_id"])
    outcomes = {"C2_oracle": [1, 1, 1, 1, 1, 1], "C0": [0, 0, 0, 0, 1, 0], "C1": [0, 1, 0, 0, 1, 0], "C2": [1, 1, 1, 0, 1, 1], "C2_silent": [0, 1, 0, 0, 1, 0],
                "C2_placebo": [0, 1, 1, 0, 1, 0]}
    # what evaluate_reader@C writes: the reader's outcomes on the same tasks
    reader = {"C2_oracle": [1, 1, 1, 1, 1, 1], "C0": [0, 0, 1, 0, 1, 0], "C1": [1, 1, 0, 0, 1, 0], "C2": [1, 1, 0, 1, 1, 1],
              "C2_silent": [1, 1, 0, 0, 1, 0], "C2_placebo": [1, 1, 0, 0, 1, 0]}
    for c in conditions:
        d = _condition(c, man, outcomes[c])
        write_episodes(root / "data/eval" / c, d.episodes, d.turns)
        write_parquet(pa.Table.from_pylist(d.prompts), root / "data/prompts" / f"{c}.parquet")
        r = _condition(c, man, reader[c])
        write_episodes(root / "data/eval_reader" / c, r.episodes, r.turns)
    return root


def _outputs(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for d in ("metrics", "plots", "reports")
            for p in sorted((root / d).rglob("*")) if p.is_file()}


def test_stage_main_writes_metrics_plots_report_reproducibly(tmp_path, monkeypatch, capsys):
    root = _project(tmp_path)
    monkeypatch.chdir(root)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert compare_stage.main() == 0
    out = capsys.readouterr().out
    assert "C2 vs C1: success 0.83 vs 0.33" in out and "prompts C1 vs C2_silent: identical" in out
    first = _outputs(root)
    m = json.loads(first["metrics/compare.json"])
    assert set(m["comparisons"]) == {"C2_oracle_vs_C1", "C2_vs_C1", "C2_vs_C2_silent", "C2_vs_C2_placebo", "C1_vs_C0",
                                     "C2_silent_vs_C1"}
    report = first["reports/report.md"].decode()
    assert report.startswith("# Condition comparison") and "![success_by_condition](success_by_condition.png)" in report
    for name in ("success_by_condition", "paired_differences", "success_by_group", "turns_distribution"):
        png = first[f"reports/{name}.png"]
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert json.loads(first["plots/success_by_condition.json"])[0]["condition"] == "C0"
    # The README's results figure: model beside reader per condition, drawn from what compare.json holds
    # (so pipeline.tools.results' test can check the committed figure against the committed metrics).
    from pipeline.analysis.report import MODEL_AND_READER_FIGURE, figure_model_and_reader

    assert first[f"plots/{MODEL_AND_READER_FIGURE}"] == figure_model_and_reader(m)
    # The reader beside the model: its controls read first, its section in the report.
    assert out.startswith("reader positive control: C2_oracle vs C1")
    assert m["reader"]["conditions"]["C2"] == {"model": m["reader"]["conditions"]["C2"]["model"],
                                              "reader": {**m["reader"]["conditions"]["C2"]["reader"], "value": 0.833333}}
    assert "## What each condition's text is worth (the reader)" in report
    # Rerun: byte-identical outputs (seeded bootstrap, no timestamps, PNG without metadata).
    assert compare_stage.main() == 0
    assert _outputs(root) == first


def test_stage_names_the_missing_condition_file(tmp_path, monkeypatch, capsys):
    root = _project(tmp_path, conditions=("C2_oracle", "C0", "C1", "C2", "C2_silent"))
    monkeypatch.chdir(root)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert compare_stage.main() == 1
    err = capsys.readouterr().err
    assert "condition C2_placebo: missing" in err and "data/eval/C2_placebo/episodes.parquet" in err
    assert "dvc repro evaluate@C2_placebo" in err
    assert not (root / "metrics/compare.json").exists()


def test_proposed_dvc_metrics_and_plots_sections_render(tmp_path, monkeypatch):
    root = _project(tmp_path)
    monkeypatch.chdir(root)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert compare_stage.main() == 0
    from pipeline.analysis.metrics import condition_metrics as cm
    from pipeline.core.io import atomic_write_json, read_parquet

    cfg = _cfg()
    for c in CONDITIONS:  # what evaluate writes
        eps = read_parquet(root / "data/eval" / c / "episodes.parquet")
        atomic_write_json(root / "metrics/eval" / f"{c}.json", cm(eps, None, None, cfg))
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run(dvc + ["init", "--no-scm", "-q"], cwd=root, check=True)
    shown = subprocess.run(dvc + ["plots", "show", "--json"], cwd=root, check=True, capture_output=True, text=True)
    plots = json.loads(shown.stdout)
    assert "errors" not in plots, plots.get("errors")
    assert set(plots["data"]) == {"success_by_condition", "success_by_scene", "success_diff", "turns_distribution"}
    table = subprocess.run(dvc + ["metrics", "show"], cwd=root, check=True, capture_output=True, text=True).stdout
    rows = [line for line in table.splitlines() if line.startswith("metrics/eval/")]
    assert len(rows) == len(CONDITIONS)  # one row per condition


def test_checks_are_outside_the_holm_family_and_the_verdict_follows_holm():
    man = _manifest(3, 3)  # 9 tasks in 3 scenes
    c1 = [1, 1, 1, 1, 0, 0, 0, 0, 0]
    c2 = [0, 0, 0, 0, 0, 0, 0, 0, 0]  # b=0, c=4, n=9: the case the bootstrap alone called "worse"
    data = {"C1": _condition("C1", man, c1), "C2": _condition("C2", man, c2),
            "C2_silent": _condition("C2_silent", man, c1), "C2_placebo": _condition("C2_placebo", man, c1)}
    cfg = _cfg(comparisons=[["C2", "C1"], ["C2", "C2_placebo"]], checks=[["C2_silent", "C1"]])
    m = C.compare(data, man, cfg).metrics
    head = m["comparisons"]["C2_vs_C1"]
    assert (head["b"], head["c"], head["p_value"]) == (0, 4, pytest.approx(0.125))
    assert head["p_holm"] == pytest.approx(0.25)  # a family of 2: the check is not in it
    assert head["verdict"] == "no detectable difference" and head["role"] == "primary"
    check = m["comparisons"]["C2_silent_vs_C1"]
    assert check["role"] == "check" and check["p_holm"] is None and check["verdict"] == "no detectable difference"
    d = next(x for x in m["details"] if x["name"] == "C2_vs_C1")
    assert d["clusters"] == 3 and d["success"]["power"]["alpha"] == pytest.approx(0.025)
    assert d["success"]["power"]["mde"] is None  # 9 pairs cannot reach 80% power
    assert d["gee"]["clusters"] == 3
    # The report: controls first, the verdict from Holm, b and c named.
    from pipeline.analysis.report import headline_lines

    lines = headline_lines(m)
    assert lines[0].startswith("check (identical by construction")
    assert "b=0 (treatment only), c=4 (control only)" in lines[1] and lines[1].endswith("**no detectable difference**")


def test_a_large_clear_effect_is_called_and_its_mde_reported():
    man = _manifest(4, 15)  # 60 tasks in 4 scenes
    c1 = [0] * 60
    c2 = [1] * 20 + [0] * 40  # b=20, c=0
    data = {"C1": _condition("C1", man, c1), "C2": _condition("C2", man, c2)}
    m = C.compare(data, man, _cfg(comparisons=[["C2", "C1"]])).metrics
    head = m["comparisons"]["C2_vs_C1"]
    assert head["verdict"] == "better" and head["p_holm"] < 1e-5
    assert 0.1 < head["mde"] < 0.3
    cl = head["success_diff_cluster"]
    assert cl["value"] == pytest.approx(1 / 3) and cl["ci_low"] <= cl["value"] <= cl["ci_high"]


def test_backend_errors_are_counted_per_condition_and_named_in_the_report():
    """Turns whose model call failed (stop_reason=error) are counted in the metrics and the report
    names them; a clean run's report says nothing of them (its bytes do not change)."""
    from pipeline.analysis.report import markdown_tables

    man = _manifest(1, 4)
    d = _condition("C1", man, [1, 0, 1, 1])
    clean = condition_metrics(d.episodes, d.turns, d.prompts, _cfg())
    assert clean["backend_error_turns"] == 0 and clean["backend_error_rate"] == 0.0
    assert "Model calls failed" not in markdown_tables({"conditions": [clean]})
    for t in d.turns[:3]:
        t["stop_reason"] = "error"
    m = condition_metrics(d.episodes, d.turns, d.prompts, _cfg())
    assert m["backend_error_turns"] == 3 and m["backend_error_rate"] == pytest.approx(3 / m["num_turns"], abs=1e-6)
    assert f"C1: 3 of {m['num_turns']} turns" in markdown_tables({"conditions": [m]})


def test_the_reader_sits_beside_the_model_with_the_models_utilisation():
    """The reader's difference is what a condition's text is worth; the model's share of it
    is utilisation; the reader's controls: the oracle must beat C1, the placebo must not help."""
    from pipeline.analysis.report import headline_lines

    man = _manifest(4, 15)  # 60 tasks
    model = {"C1": [0] * 60, "C2": [1] * 10 + [0] * 50, "C2_oracle": [1] * 12 + [0] * 48, "C2_placebo": [0] * 60}
    reader = {"C1": [0] * 20 + [1] * 20 + [0] * 20, "C2": [1] * 40 + [0] * 20, "C2_oracle": [1] * 60,
              "C2_placebo": [0] * 25 + [1] * 15 + [0] * 20}
    data = {c: _condition(c, man, w) for c, w in model.items()}
    episodes = {c: _condition(c, man, w).episodes for c, w in reader.items()}
    cfg = OmegaConf.merge(_cfg(comparisons=[["C2", "C1"], ["C2", "C2_placebo"]], positive_controls=[["C2_oracle", "C1"]],
                               checks=[]), {"condition": {"C2_placebo": {"kind": "placebo"}}})
    m = C.compare(data, man, cfg, episodes).metrics
    r = m["reader"]
    assert r["conditions"]["C2"]["reader"]["value"] == pytest.approx(2 / 3, abs=1e-6)
    assert r["conditions"]["C2"]["model"]["value"] == pytest.approx(1 / 6, abs=1e-6)
    c2 = r["comparisons"]["C2_vs_C1"]
    assert c2["reader_diff"]["value"] == pytest.approx(1 / 3, abs=1e-6) and (c2["reader_b"], c2["reader_c"]) == (20, 0)
    assert c2["utilisation"]["value"] == pytest.approx(0.5, abs=1e-6)  # (10/60) / (20/60)
    assert c2["utilisation"]["ci_low"] <= 0.5 <= c2["utilisation"]["ci_high"]
    assert c2["reader_verdict"] == "better" and c2["reader_p_holm"] is not None
    controls = {c["check"]: c for c in r["controls"]}
    assert controls["positive_control"]["ok"] and controls["placebo"]["ok"]
    assert controls["placebo"]["reader_diff"] == pytest.approx(-5 / 60, abs=1e-6)
    lines = headline_lines(m)
    assert lines[0].startswith("reader positive control: C2_oracle vs C1") and "**ok**" in lines[0]
    assert lines[1].startswith("reader placebo check: C2_placebo vs C1") and "**ok**" in lines[1]
    # then what the memory is worth to the reader, with its paired turns
    assert lines[2].startswith("to the reader, the memory beyond the grounding is worth +0.33 success (C2 0.67 vs C1 0.33, "
                               "b=20, c=0, Holm p=") and "turns" in lines[2] and "Wilcoxon" in lines[2]
    # a reader that gains nothing: no utilisation; a placebo that helps it, said so
    episodes["C2"] = episodes["C1"]
    episodes["C2_placebo"] = _condition("C2_placebo", man, [1] * 60).episodes
    m = C.compare(data, man, cfg, episodes).metrics
    assert m["reader"]["comparisons"]["C2_vs_C1"]["utilisation"]["value"] is None
    assert "the placebo helps the reader" in headline_lines(m)[1]
    # an oracle worth nothing to the reader: the pipeline is broken, and the report says so first
    episodes["C2_oracle"] = episodes["C1"]
    assert "**BROKEN**" in headline_lines(C.compare(data, man, cfg, episodes).metrics)[0]
    # without the reader's episodes, no reader section
    assert "reader" not in C.compare(data, man, cfg).metrics
