"""pipeline.tools.results: the docs' result tables are the committed metrics, never a hand copy."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from pipeline.tools import results

ROOT = Path(__file__).resolve().parents[1]


# What the docs' blocks are rendered from (and the docs themselves): what --check reads.
RESULTS_FILES = ("README.md", "docs", "metrics", "models/metrics", "benchmarks/results.json")


def _committed(tmp_path: Path) -> Path:
    """The files of :data:`RESULTS_FILES` as committed at HEAD, in a scratch folder: a run in this
    clone (`make repro` rewrites metrics/ with this machine's wall times) never changes what this reads."""
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "README.md"], cwd=ROOT, capture_output=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: no committed docs to read")
    blob = subprocess.run(["git", "archive", "--format=tar", "HEAD", *RESULTS_FILES], cwd=ROOT, capture_output=True,
                          check=True).stdout
    root = tmp_path / "committed"
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(root, filter="data")
    return root


def test_the_committed_docs_carry_the_committed_metrics(tmp_path):
    """README.md and docs/*.md hold the default run's tables between results markers, and as
    committed they are what the committed metrics/ render (both read at HEAD, so a run in this
    clone, which rewrites the wall times in metrics/, cannot fail it): rerun
    `python -m pipeline.tools.results` after a run and commit the two together."""
    root = _committed(tmp_path)
    readme = (root / "README.md").read_text(encoding="utf-8")
    for block in ("conditions", "runtime_summary"):
        assert f"<!-- results:{block} -->" in readme
    for block in ("comparisons", "headline"):
        assert f"<!-- results:{block} -->" in (root / "docs" / "experiments.md").read_text(encoding="utf-8")
    assert "<!-- results:runtime -->" in (root / "docs" / "performance.md").read_text(encoding="utf-8")
    assert "<!-- results:curve -->" in (root / "docs" / "memory.md").read_text(encoding="utf-8")
    docs = results.documents(root)
    assert root / "README.md" in docs and root / "docs" / "policy.md" in docs
    for path in docs:
        text = path.read_text(encoding="utf-8")
        assert results.render(text, root / "metrics") == text, f"{path.name}: run `python -m pipeline.tools.results`"
    assert results.main(["--check", "--root", str(root)]) == 0


def test_the_committed_results_figure_is_the_committed_metrics():
    """plots/success_model_and_reader.png (shown in the README) is what compare draws from the
    committed metrics/compare.json: a figure left from another run fails here."""
    from pipeline.analysis.report import MODEL_AND_READER_FIGURE, figure_model_and_reader

    metrics = json.loads((ROOT / "metrics" / "compare.json").read_text(encoding="utf-8"))
    assert (ROOT / "plots" / MODEL_AND_READER_FIGURE).read_bytes() == figure_model_and_reader(metrics)
    assert f"(plots/{MODEL_AND_READER_FIGURE})" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_check_fails_when_one_number_of_the_readme_results_is_edited(tmp_path, capsys):
    """The staleness test: one hand-edited figure in the README's results table makes
    `python -m pipeline.tools.results --check` exit 1 naming README.md; the copy as committed passes."""
    root = _committed(tmp_path)
    assert results.main(["--check", "--root", str(root)]) == 0
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    start = text.index("<!-- results:conditions -->")
    end = text.index("<!-- /results:conditions -->")
    block = text[start:end]
    m = re.search(r"\| C1 \| (\d\.\d\d) ", block)
    assert m, "the README's conditions table has no C1 row"
    edited = f"{float(m[1]) + 0.01:.2f}"
    readme.write_text(text[:start] + block.replace(f"| C1 | {m[1]} ", f"| C1 | {edited} ", 1) + text[end:],
                      encoding="utf-8")
    capsys.readouterr()
    assert results.main(["--check", "--root", str(root)]) == 1
    assert "README.md" in capsys.readouterr().err
    assert readme.read_text(encoding="utf-8") != text  # --check never rewrites


def _metrics(tmp_path: Path) -> Path:
    m = tmp_path / "metrics"
    (m / "eval_reader").mkdir(parents=True, exist_ok=True)
    ci = lambda v: {"value": v, "ci_low": v - 0.1, "ci_high": v + 0.1}  # noqa: E731
    compare = {"conditions": [{"condition": "C1", "success_rate": ci(0.5), "mean_turns": {"value": 9.0},
                               "num_episodes": 40}],
               "reader": {"conditions": {"C1": {"reader": ci(0.75)}}, "comparisons": {}},
               "details": []}
    (m / "compare.json").write_text(json.dumps(compare))
    (m / "eval_reader" / "C1.json").write_text(json.dumps({"mean_turns": {"value": 7.25}}))
    return m


def test_a_block_is_rewritten_from_the_metrics_and_the_rest_kept(tmp_path):
    text = "before\n<!-- results:conditions -->\nold table\n<!-- /results:conditions -->\nafter\n"
    out = results.render(text, _metrics(tmp_path))
    assert out.startswith("before\n<!-- results:conditions -->\n") and out.endswith("<!-- /results:conditions -->\nafter\n")
    assert "old table" not in out
    assert "| C1 | 0.50 [0.40, 0.60] | 9.0 | 0.75 [0.65, 0.85] | 7.2 |" in out
    assert "40 paired eval tasks" in out
    assert results.render(out, _metrics(tmp_path)) == out  # idempotent: --check passes right after a write


def test_an_unknown_block_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"results:nonsense.*known: conditions, comparisons, curve, headline, policy, targets"):
        results.render("<!-- results:nonsense -->\nx\n<!-- /results:nonsense -->\n", _metrics(tmp_path))


def test_the_runtime_block_sums_the_stages_metrics_and_quotes_the_scaling_projection(tmp_path):
    """Run times are figures of the default run too: read from what each stage recorded, and the
    projection from the committed scaling benchmark, never typed."""
    from pipeline.tools.results import runtime_table

    m = tmp_path / "metrics"
    (m / "eval").mkdir(parents=True)
    (m / "games.json").write_text(json.dumps({"plan_wall_s": 6.0, "compile_wall_s": 54.0, "compile_workers": 2}))
    for c, t in (("C0", 30.0), ("C1", 90.0)):
        (m / "eval" / f"{c}.json").write_text(json.dumps({"wall_time_s": t}))
    mm = tmp_path / "models" / "metrics"  # the model pipeline's (make model)
    mm.mkdir(parents=True)
    (mm / "games.json").write_text(json.dumps({"plan_wall_s": 6.0, "compile_wall_s": 54.0, "compile_workers": 2}))
    (mm / "demos.json").write_text(json.dumps({"wall_time_s": 120.0, "workers": 2}))
    (mm / "policy.json").write_text(json.dumps({"wall_time_s": {"total_s": 600.0, "train_processes": 1}}))
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "results.json").write_text(json.dumps({"benchmarks": {"scaling": {
        "meta": {"date": "D", "cores": 2, "load_average": [0.1], "git": "abc1234"},
        "runs": [{"details": {"projection": {"parallel_fraction": 0.9149,
                                             "cores": {"16": {"total_s": 480.0}, "2": {"total_s": 1500.0}}}}}]}}}))
    text = runtime_table(m)
    experiment, model = text.split("| step (`make model`)")
    assert "| games | 1.0 | 2 |" in experiment and "| evaluate (2 conditions) | 2.0 | – |" in experiment
    assert "| curve | – | – |" in experiment and "**3.0**" in experiment  # 60 + 120 s
    assert "| games | 1.0 | 2 |" in model and "| demos | 2.0 | 2 |" in model and "| policy | 10.0 | 1 |" in model
    assert "| checkpoint | – | 1 |" in model and "**13.0**" in model  # 60 + 120 + 600 s; checkpoint not recorded
    assert ("`python -m benchmarks --only scaling` (parallel fractions measured on `experiment=tiny`, a floor; "
            "at commit abc1234, D, 2 cores, load 0.1): 25 min on 2 cores, 8 min on 16 cores") in text
    assert "parallel fraction of the run's time 0.91." in text
    # measured on the slice of the default, each stage capped at its parts: the text says so
    doc = json.loads((tmp_path / "benchmarks" / "results.json").read_text())
    det = doc["benchmarks"]["scaling"]["runs"][0]["details"]
    det["experiment"] = "slice"
    det["projection"]["stages"] = {"evaluate": {"parts": 4}}
    (tmp_path / "benchmarks" / "results.json").write_text(json.dumps(doc))
    assert ("`python -m benchmarks --only scaling --experiment slice` (parallel fractions measured on a slice of "
            "the default config; no stage on more cores than its work has parts; at commit abc1234") in runtime_table(m)
    # a re-projection (--skip-run) quotes where the fractions were measured, then its own commit
    det["measured_at"] = {"git": "ee797c4", "date": "E", "cores": 2, "load_average": [0.25]}
    (tmp_path / "benchmarks" / "results.json").write_text(json.dumps(doc))
    assert ("parts; the fractions measured at commit ee797c4, E, 2 cores, load 0.25; projected from them and this "
            "run's stage times at commit abc1234, D): 25 min on 2 cores") in runtime_table(m)


def test_a_target_is_met_at_a_holm_p_rounded_to_zero_and_missed_without_one(tmp_path):
    """compare.json rounds a tiny p to 0.0: that meets 'Holm p < 0.01'; a missing p does not."""
    m = _metrics(tmp_path)
    compare = json.loads((m / "compare.json").read_text())
    comp = {"reader_diff": {"value": 0.26, "ci_low": 0.19, "ci_high": 0.34}, "reader_b": 61, "reader_c": 7,
            "reader_p_holm": 0.0}
    compare["reader"]["comparisons"]["C2_vs_C1"] = comp
    (m / "compare.json").write_text(json.dumps(compare))
    assert "Holm p < 0.001 | met |" in results.targets_table(m)
    del comp["reader_p_holm"]
    (m / "compare.json").write_text(json.dumps(compare))
    assert "| **missed** |" in results.targets_table(m)


def test_the_policy_row_names_its_episodes_processes_where_they_differ_from_its_training(tmp_path):
    """The policy stage trains in ``train_processes`` and plays its DAgger rollouts and probe in
    ``rollout_workers``: both counts are the run's, read from its metrics."""
    from pipeline.tools.results import runtime_table

    m = tmp_path / "metrics"
    m.mkdir()
    (tmp_path / "models" / "metrics").mkdir(parents=True)
    policy = tmp_path / "models" / "metrics" / "policy.json"
    policy.write_text(json.dumps({"wall_time_s": {"total_s": 600.0, "train_processes": 1, "rollout_workers": 2}}))
    assert "| policy | 10.0 | 1 (its episodes: 2) |" in runtime_table(m)
    policy.write_text(json.dumps({"wall_time_s": {"total_s": 600.0, "train_processes": 2, "rollout_workers": 2}}))
    assert "| policy | 10.0 | 2 |" in runtime_table(m)


def test_the_episodes_block_has_a_row_after_the_demonstrations_and_each_dagger_round(tmp_path):
    """The whole-episode probe's block: one row per stage of training, a cell per prompt kind
    ('—' where a kind was not played), written from metrics/policy.json."""
    from pipeline.tools.results import episodes_table

    m = tmp_path / "metrics"
    m.mkdir()
    (tmp_path / "models" / "metrics").mkdir(parents=True)
    first = {"plain_success": 0.083333, "plain_turns": 18.4, "oracle_success": 0.52, "oracle_turns": 11.7,
             "houses": 48, "grounded_episodes": 26}
    last = {**first, "plain_success": 0.229167, "grounded_success": 0.115385, "grounded_turns": 16.3}
    (tmp_path / "models" / "metrics" / "policy.json").write_text(json.dumps({"episode_probe": {**last, "after_demonstrations": first},
                                               "dagger": {"rounds": [{"round": 0, "labelled_turns": 6795,
                                                                      "episode_probe": last}]}}))
    lines = episodes_table(m).splitlines()
    assert lines[2] == "| after the demonstrations | 0.08 (18.4 turns) | — | 0.52 (11.7 turns) |"
    assert lines[3] == "| after DAgger round 1 (6,795 labelled turns) | 0.23 (18.4 turns) | 0.12 (16.3 turns) | 0.52 (11.7 turns) |"
    assert "48 held-out generated houses" in lines[-1] and "the 26 whose" in lines[-1]
    (tmp_path / "models" / "metrics" / "policy.json").write_text("{}")
    assert episodes_table(m) == "_no whole-episode probe in models/metrics/policy.json_"


def _stale_memory_md(root: Path) -> bytes:
    """Make docs/memory.md's targets block stale (what a write would rewrite); return its bytes."""
    path = root / "docs" / "memory.md"
    text = path.read_text(encoding="utf-8")
    start = text.index("<!-- results:targets -->\n") + len("<!-- results:targets -->\n")
    path.write_text(text[:start] + "a stale table\n" + text[text.index("<!-- /results:targets -->"):], encoding="utf-8")
    return path.read_bytes()


def _line_of(text: str, marker: str) -> int:
    return text[:text.index(marker)].count("\n") + 1


def test_an_opener_whose_closer_is_forgotten_is_an_error_naming_the_line_and_nothing_is_written(tmp_path, capsys):
    """Issue 66, finding 5: a forgotten closer made the opener's block reach the next closer of its
    name (prose and headings replaced) or left the block unread ('up to date', exit 0); now it is
    exit 1 naming the file and the line, in --check and write mode, and no document is written."""
    text = "intro\n<!-- results:conditions -->\nold table\n## A heading\nprose\n<!-- results:conditions -->\nx\n" \
           "<!-- /results:conditions -->\nafter\n"
    with pytest.raises(results.MarkerError, match=r"notes\.md:6: <!-- results:conditions --> opens a block before "
                                                  r"results:conditions \(opened at line 2\) is closed"):
        results.render(text, _metrics(tmp_path), "notes.md")
    root = _committed(tmp_path)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    opener = _line_of(text, "<!-- results:runtime_summary -->")
    text = text.replace("<!-- /results:runtime_summary -->\n", "", 1)
    readme.write_text(text, encoding="utf-8")
    before, memory = readme.read_bytes(), _stale_memory_md(root)
    for argv in (["--check"], []):
        capsys.readouterr()
        assert results.main([*argv, "--root", str(root)]) == 1
        err = capsys.readouterr().err
        assert f"README.md:{_line_of(text, '<!-- results:conditions -->')}: <!-- results:conditions --> opens a block " \
               f"before results:runtime_summary (opened at line {opener}) is closed" in err
        assert "nothing written" in err
        assert readme.read_bytes() == before and (root / "docs" / "memory.md").read_bytes() == memory


@pytest.mark.parametrize("good, bad, expected", [
    ("<!-- /results:conditions -->", "<!-- /results:conditons -->", "does not close results:conditions"),
    ("<!-- /results:conditions -->", "<!-- /result:conditions -->", "looks like a results marker but is not one"),
    ("<!-- results:conditions -->", "<!--results:conditions -->", "looks like a results marker but is not one"),
    ("<!-- results:conditions -->", "<!-- results:conditions-->", "looks like a results marker but is not one"),
], ids=["closer-name-typo", "closer-word-typo", "opener-missing-space", "opener-missing-space-at-end"])
def test_a_malformed_marker_is_an_error_naming_the_file_and_line_in_check_and_write_mode(tmp_path, capsys, good,
                                                                                         bad, expected):
    """Issue 66, finding 5: a closer with a typo or an opener with a missing space left the block
    unread and `--check` said 'up to date'; now exit 1 naming README.md and the line, nothing written."""
    root = _committed(tmp_path)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    line = _line_of(text, good + "\n")
    readme.write_text(text.replace(good + "\n", bad + "\n", 1), encoding="utf-8")
    before, memory = readme.read_bytes(), _stale_memory_md(root)
    for argv in (["--check"], []):
        capsys.readouterr()
        assert results.main([*argv, "--root", str(root)]) == 1
        err = capsys.readouterr().err
        assert f"README.md:{line}: " in err and expected in err, err
        assert "up to date" not in err
        assert readme.read_bytes() == before and (root / "docs" / "memory.md").read_bytes() == memory


def test_a_deleted_block_or_document_is_an_error_in_check_and_write_mode(tmp_path, capsys):
    """Issue 66, finding 5: a block deleted whole (markers and table) left `--check` saying 'up to
    date'; every block the tool knows must be in its document (HOMES), else exit 1, nothing written."""
    root = _committed(tmp_path)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    start, end = text.index("<!-- results:conditions -->"), text.index("<!-- /results:conditions -->\n")
    readme.write_text(text[:start] + text[end + len("<!-- /results:conditions -->\n"):], encoding="utf-8")
    before, memory = readme.read_bytes(), _stale_memory_md(root)
    for argv in (["--check"], []):
        capsys.readouterr()
        assert results.main([*argv, "--root", str(root)]) == 1
        err = capsys.readouterr().err
        assert "README.md: the results:conditions block is missing" in err
        assert readme.read_bytes() == before and (root / "docs" / "memory.md").read_bytes() == memory
    (root / "docs" / "policy.md").unlink()
    capsys.readouterr()
    assert results.main(["--check", "--root", str(root)]) == 1
    assert "docs/policy.md: missing: it must hold the blocks policy, episodes" in capsys.readouterr().err


def _finished_run(folder: Path, agent: str = "react") -> Path:
    """A project folder as a finished run leaves it: the default run's committed metrics, its
    overrides and its agent."""
    import shutil

    shutil.copytree(ROOT / "metrics", folder / "metrics", ignore=shutil.ignore_patterns("runs"))
    (folder / "params.overrides.yaml").write_text("overrides:\n- {key: env.name, value: scienceworld}\n"
                                                   "- {key: env.max_steps, value: 12}\n"
                                                   "- {key: memory.lessons, removed: true}\n")
    (folder / "params.yaml").write_text(f"agent:\n  name: {agent}\n")
    return folder


def test_a_snapshot_copies_a_runs_metrics_and_its_block_renders_from_it(tmp_path):
    """``--snapshot NAME --from DIR``: another experiment's run into metrics/runs/NAME/, with its
    overrides and agent; the run's block in its document is then rewritten from that copy."""
    project = _committed(tmp_path)
    run = _finished_run(tmp_path / "scratch")
    assert results.main(["--root", str(project), "--snapshot", "scienceworld_adaptation", "--from", str(run)]) == 0
    snap = project / "metrics" / "runs" / "scienceworld_adaptation"
    meta = json.loads((snap / "run.json").read_text())
    assert meta["params"] == {"env.name": "scienceworld", "env.max_steps": 12} and meta["agent"] == "react"
    assert meta["removed"] == ["memory.lessons"]
    assert (snap / "compare.json").read_bytes() == (run / "metrics" / "compare.json").read_bytes()
    assert sorted(p.name for p in (snap / "eval").iterdir()) == sorted(p.name for p in (run / "metrics" / "eval").iterdir())
    text = results.run_table("scienceworld_adaptation")(project / "metrics")
    assert "`scienceworld_adaptation`: 3 config keys set apart" in text and "`react` is the agent under test" in text
    assert "react success [95% interval]" in text and "react Δ success" in text and "model success" not in text
    assert results.conditions_table(snap, agent="react") in text and "Minutes of stage work" in text
    # its learning curve: the reader's (the default run's metrics hold only the reader's points)
    assert "Learning curve, `reader` (the ceiling)" in text and results.curve_table(snap) in text
    assert "Learning curve, `react`" not in text
    assert text in (project / "docs" / "scienceworld.md").read_text(encoding="utf-8")  # the document rewritten
    assert results.main(["--check", "--root", str(project)]) == 0
    # the default run's tables keep their words
    assert "model success [95% interval]" in results.conditions_table(project / "metrics")


def test_a_run_block_shows_the_agent_under_test_s_curve_after_the_reader_s(tmp_path):
    project = _committed(tmp_path)
    run = _finished_run(tmp_path / "scratch", agent="trial")
    curve = json.loads((run / "metrics" / "curve.json").read_text())
    curve["points"] += [{**p, "agent": "trial", "success": 0.0} for p in curve["points"] if p["agent"] == "reader"]
    (run / "metrics" / "curve.json").write_text(json.dumps(curve))
    assert results.main(["--root", str(project), "--snapshot", "scienceworld_adaptation", "--from", str(run)]) == 0
    snap = project / "metrics" / "runs" / "scienceworld_adaptation"
    text = results.run_table("scienceworld_adaptation")(project / "metrics")
    reader, trial = results.curve_table(snap), results.curve_table(snap, agent="trial")
    assert reader != trial and "0.00 / " in trial
    assert text.index("Learning curve, `reader`") < text.index(reader) < text.index("Learning curve, `trial`") \
        < text.index(trial)


def test_a_snapshot_of_no_finished_run_or_a_bad_name_is_refused_and_copies_nothing(tmp_path, capsys):
    project = tmp_path / "project"
    (project / "metrics").mkdir(parents=True)
    assert results.main(["--root", str(project), "--snapshot", "scienceworld_adaptation", "--from",
                         str(tmp_path / "nothing")]) == 1
    assert "no finished run there" in capsys.readouterr().err
    assert results.main(["--root", str(project), "--snapshot", "../escape", "--from",
                         str(_finished_run(tmp_path / "scratch"))]) == 1
    assert "expected a lower-case identifier" in capsys.readouterr().err
    bad = _finished_run(tmp_path / "bad_record")
    (bad / "params.overrides.yaml").write_text("overrides:\n- seed=7\n")  # not pipeline.core.overrides' record
    assert results.main(["--root", str(project), "--snapshot", "scienceworld_adaptation", "--from", str(bad)]) == 1
    assert "params.overrides.yaml: expected `overrides:` followed by a list of {key, value}" in capsys.readouterr().err
    assert not (project / "metrics" / "runs").exists()
    with pytest.raises(SystemExit):
        results.main(["--root", str(project), "--snapshot", "x"])  # --from missing


def test_a_run_block_without_its_snapshot_says_how_to_make_one(tmp_path):
    text = results.run_table("scienceworld_adaptation")(tmp_path)
    assert text.startswith("_no run of scienceworld_adaptation is committed") and "--snapshot" in text


def test_the_model_s_targets_are_met_only_at_their_size_and_holm_p(tmp_path):
    """Issue 64's targets for the model, from compare.json: a difference meets its target only at its
    least size and Holm p; a success only at its least value; the placebo on its point estimate."""
    m = tmp_path / "metrics"
    m.mkdir()
    compare = json.loads((Path(results.__file__).parents[2] / "metrics" / "compare.json").read_text())  # the default run's
    c2 = next(d for d in compare["details"] if d["name"] == "C2_vs_C1")
    c2["success"]["diff"] = {"value": 0.09, "ci_low": 0.03, "ci_high": 0.15}
    c2["success"]["p_holm"], c2["success"]["table"] = 0.004, {"b": 25, "c": 7, "both": 20, "neither": 152}
    (m / "compare.json").write_text(json.dumps(compare))
    table = results.model_targets_table(m)
    assert "| model C2 − C1 >= +0.08 at Holm p < 0.01 | +0.09 [+0.03, +0.15], b=25, c=7, Holm p=0.004 | met |" in table
    c2["success"]["p_holm"] = 0.02  # the size, not the p
    (m / "compare.json").write_text(json.dumps(compare))
    assert "Holm p=0.020 | **missed** |" in results.model_targets_table(m)
    conds = {c["condition"]: c for c in compare["conditions"]}
    conds["C2_oracle"]["success_rate"]["value"] = 0.61
    conds["C2_placebo"]["success_rate"]["value"] = conds["C1"]["success_rate"]["value"] + 0.01
    (m / "compare.json").write_text(json.dumps(compare))
    table = results.model_targets_table(m)
    assert re.search(r"\| model C2_oracle >= 0.60 \| 0.61 \[[^]]*\] \| met \|", table), table
    assert re.search(r"\| model C2_placebo not better than C1 \| [0-9.]+ vs [0-9.]+ \| \*\*missed\*\* \|", table), table
    assert "| C2_silent's prompts identical to C1's | 204 of 204 tasks | met |" in table
