"""The scaling benchmark's arithmetic (benchmarks/bench_scaling.py): Amdahl's fraction, the
projection of a run to more cores, the default run's times read from metrics. Nothing is timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bench_scaling import (
    EXPERIMENTS,
    SLICE_OVERRIDES,
    amdahl_factor,
    default_counts,
    default_run_parts,
    default_run_times,
    overall_parallel_fraction,
    parallel_fraction,
    previous_experiment,
    previous_fractions,
    previous_measurement,
    project_run,
    projection,
    rescale_time,
    stage_scaling,
)


def test_parallel_fraction_inverts_amdahl():
    assert parallel_fraction(2.0, 2) == pytest.approx(1.0)  # perfect speed-up on 2
    assert parallel_fraction(1.0, 8) == pytest.approx(0.0)  # none
    assert parallel_fraction(1.5, 2) == pytest.approx(2 / 3)  # 10 s -> 6.67 s
    assert parallel_fraction(2.5, 4) == pytest.approx(0.8)  # 0.2 + 0.8/4 = 0.4 of the time
    assert parallel_fraction(0.8, 2) == pytest.approx(-0.5)  # slower on 2: not clamped here
    with pytest.raises(ValueError):
        parallel_fraction(1.2, 1)


def test_amdahl_factor_and_rescaling():
    assert amdahl_factor(0.9, 16) == pytest.approx(0.15625)
    assert amdahl_factor(0.0, 16) == 1.0
    # 100 s measured on 2 workers, half of it parallel: 133.3 s on one, 75 s on 8
    assert rescale_time(100.0, 0.5, 2, 8) == pytest.approx(75.0)
    assert rescale_time(100.0, 0.5, 2, 1) == pytest.approx(133.333, rel=1e-4)
    assert rescale_time(100.0, 0.5, 2, 2) == pytest.approx(100.0)


def test_project_run_adds_the_serial_part_unchanged():
    stages = {"a": (100.0, 1, 1.0), "b": (50.0, 2, 0.0), "c": (75.0, 2, 0.5)}
    r = project_run(stages, 4, serial_s=10.0)
    assert r["stages"]["a"] == pytest.approx(25.0)
    assert r["stages"]["b"] == pytest.approx(50.0)
    assert r["stages"]["c"] == pytest.approx(62.5)  # 100 s on one core: 0.5 + 0.125
    assert r["total_s"] == pytest.approx(147.5)


def test_overall_parallel_fraction_weighs_one_core_time():
    # 75 s on 2 workers at p=0.5 is 100 s of one-core time, 50 of it parallel
    assert overall_parallel_fraction({"c": (75.0, 2, 0.5)}) == pytest.approx(0.5)
    # 100 s fully parallel beside 100 s serial (an install)
    assert overall_parallel_fraction({"a": (100.0, 1, 1.0)}, serial_s=100.0) == pytest.approx(0.5)
    # 50 s on 2 workers fully parallel = 100 s on one; plus 100 s at p=0.8 on one; 50 s serial
    assert overall_parallel_fraction({"x": (50.0, 2, 1.0), "y": (100.0, 1, 0.8)}, serial_s=50.0) == pytest.approx(0.72)


def test_stage_scaling_from_measured_times():
    s = stage_scaling({1: 10.0, 2: 6.0})
    assert s["speedup"][2] == pytest.approx(10 / 6)
    assert s["p"] == pytest.approx(0.8) and s["p_from"] == 2
    s = stage_scaling({1: 40.0, 2: 25.0, 4: 16.0})  # p from the largest count: S=2.5 on 4
    assert s["p"] == pytest.approx(0.8) and s["p_from"] == 4
    assert stage_scaling({2: 5.0})["p"] is None


def test_default_counts():
    assert default_counts(1) == [1, 2]
    assert default_counts(2) == [1, 2]
    assert default_counts(6) == [1, 2, 4, 6]
    assert default_counts(16) == [1, 2, 4, 8, 16]


def _metrics(root: Path) -> None:
    m = root / "metrics"
    (m / "eval").mkdir(parents=True)
    (m / "eval_reader").mkdir()
    (m / "games.json").write_text(json.dumps({"compile_wall_s": 99.0, "plan_wall_s": 1.0, "compile_workers": 2}))
    (m / "collect.json").write_text(json.dumps({"wall_time_s": 200.0}))
    for c, t in (("C0", 30.0), ("C1", 70.0)):
        (m / "eval" / f"{c}.json").write_text(json.dumps({"wall_time_s": t}))


def test_projection_from_metrics(tmp_path: Path):
    _metrics(tmp_path)
    runs = default_run_times(tmp_path)
    assert {k: (v["wall_s"], v["workers"]) for k, v in runs.items()} == {
        "games": (100.0, 2), "collect": (200.0, 1), "evaluate": (100.0, 2)}
    fr = {"games": 1.0, "collect": 0.5, "evaluate": 1.2}  # 1.2: noise, clamped to 1
    p = projection(tmp_path, fr, install_s=150.0, other_s=50.0, cores=(2, 8))
    assert p["as_recorded_s"] == pytest.approx(600.0)
    # games 100 -> 100 on 2, 25 on 8; collect (1 worker) 200 -> 150, 112.5; evaluate 100 -> 100, 25
    assert p["cores"]["2"]["total_s"] == pytest.approx(200 + 100 + 150 + 100)
    assert p["cores"]["8"]["total_s"] == pytest.approx(200 + 25 + 112.5 + 25)
    assert p["stages"]["evaluate"]["p"] == 1.0 and p["stages"]["evaluate"]["from"] == "measured"
    # one-core time: games 200, collect 200, evaluate 200 + 200 serial = 800; parallel 200+100+200
    assert p["parallel_fraction"] == pytest.approx(500 / 800, abs=1e-4)
    p = projection(tmp_path, {}, install_s=0.0, other_s=0.0, cores=(2,))
    assert all(s["from"] == "assumed" for s in p["stages"].values())


def test_previous_fractions(tmp_path: Path):
    f = tmp_path / "results.json"
    f.write_text(json.dumps({"benchmarks": {"scaling": {"runs": [
        {"details": {"fractions": {"games": 0.9, "collect": None}}}]}}}))
    assert previous_fractions(f) == {"games": 0.9}
    assert previous_fractions(tmp_path / "missing.json") == {}


def test_a_reprojection_says_where_its_fractions_were_measured(tmp_path: Path):
    """``--skip-run`` measures nothing: the commit and date it quotes must be the measuring run's,
    also after a second re-projection (which carries the first one's record on)."""
    f = tmp_path / "results.json"
    f.write_text(json.dumps({"benchmarks": {"scaling": {
        "meta": {"git": "ee797c4", "date": "2026-11-28 13:23 UTC", "cores": 2, "load_average": [0.25, 0.5, 1.0]},
        "runs": [{"details": {"fractions": {"games": 0.9}}}]}}}))
    first = previous_measurement(f)
    assert first == {"git": "ee797c4", "date": "2026-11-28 13:23 UTC", "cores": 2, "load_average": [0.25, 0.5, 1.0]}
    f.write_text(json.dumps({"benchmarks": {"scaling": {
        "meta": {"git": "686e5d8", "date": "2026-11-29 07:00 UTC", "cores": 2, "load_average": [1.0]},
        "runs": [{"details": {"fractions": {"games": 0.9}, "measured_at": first}}]}}}))
    assert previous_measurement(f) == first
    f.write_text(json.dumps({"benchmarks": {"scaling": {"meta": {"git": "x"}, "runs": [{"details": {}}]}}}))
    assert previous_measurement(f) is None
    assert previous_measurement(tmp_path / "missing.json") is None


def test_cpu_split_fraction():
    from benchmarks.bench_scaling import cpu_split_fraction

    assert cpu_split_fraction(10.0, 90.0) == pytest.approx(0.9)  # the stage waited while its workers computed
    assert cpu_split_fraction(20.0, 0.0) == 0.0  # no worker process
    assert cpu_split_fraction(0.0, 0.0) is None


def test_a_stage_uses_no_more_workers_than_its_work_has_parts():
    # fully parallel, 100 s on 2 workers: 50 s on 4 parts whether 4 or 16 cores
    assert rescale_time(100.0, 1.0, 2, 16, parts=4) == pytest.approx(50.0)
    assert rescale_time(100.0, 1.0, 2, 4, parts=4) == pytest.approx(50.0)
    # one part (one training process): the time stays what it was on any count
    assert rescale_time(100.0, 0.9, 2, 16, parts=1) == pytest.approx(100.0)
    assert rescale_time(100.0, 1.0, 2, 1, parts=1) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="parts must be >= 1"):
        rescale_time(100.0, 1.0, 2, 4, parts=0)
    r = project_run({"eval": (100.0, 2, 1.0, 4), "train": (300.0, 2, 0.9, 1), "games": (40.0, 2, 1.0)}, 16)
    assert r["stages"] == pytest.approx({"eval": 50.0, "train": 300.0, "games": 5.0})
    # a one-part stage adds its time to the serial side whatever its p says
    assert overall_parallel_fraction({"train": (300.0, 2, 0.9, 1), "eval": (100.0, 1, 1.0, 4)}) == pytest.approx(0.25)


def _default_like(root: Path) -> None:
    _metrics(root)
    m = root / "metrics"
    g = json.loads((m / "games.json").read_text())
    (m / "games.json").write_text(json.dumps({**g, "num_games": 276, "num_train": 72}))
    for c in ("C0", "C1"):
        (m / "eval" / f"{c}.json").write_text(json.dumps({"wall_time_s": 100.0, "num_tasks": 204}))
    (m / "curve.json").write_text(json.dumps({"wall_time_s": 80.0, "workers": 2, "points": [{}] * 20}))
    (root / "params.yaml").write_text("grounding: {online: true}\nagent: {batch_size: 56, batched: true}\n")


def test_default_run_parts_follow_the_stages_rules(tmp_path: Path):
    _default_like(tmp_path)
    parts = {k: v["parts"] for k, v in default_run_parts(tmp_path).items()}
    # 204 tasks in batches of 56 -> 4; the online collect loop is one
    assert parts == {"games": 276, "collect": 1, "evaluate": 4, "curve": 20}
    p = projection(tmp_path, {"evaluate": 1.0, "curve": 1.0}, install_s=0.0, other_s=0.0, cores=(2, 4, 16))
    ev = {c: p["cores"][c]["stages_s"]["evaluate"] for c in ("2", "4", "16")}
    assert ev == pytest.approx({"2": 200.0, "4": 100.0, "16": 100.0})  # 4 batches: no gain past 4 cores
    assert p["cores"]["16"]["stages_s"]["curve"] == pytest.approx(80.0 * 2 / 16)
    assert p["cores"]["16"]["stages_s"]["collect"] == pytest.approx(200.0)  # one part: no gain
    assert p["stages"]["evaluate"]["parts"] == 4


def test_the_slice_gives_every_measured_stage_two_equal_parts():
    from omegaconf import OmegaConf

    from pipeline.core.config import compose_text, project_root, validate

    assert EXPERIMENTS["slice"] == SLICE_OVERRIDES and EXPERIMENTS["tiny"] == ("experiment=tiny",)
    cfg = validate(OmegaConf.create(compose_text(project_root(), SLICE_OVERRIDES)))
    default = validate(OmegaConf.create(compose_text(project_root())))
    eval_tasks = cfg.env.eval_quests_per_scene * cfg.env.num_scenes
    assert eval_tasks == 2 * cfg.agent.batch_size  # evaluate: two equal batches
    assert cfg.env.num_scenes < default.env.num_scenes
    # the default's model and world otherwise
    assert cfg.model == default.model and cfg.env.name == default.env.name


def test_previous_experiment(tmp_path: Path):
    f = tmp_path / "results.json"
    assert previous_experiment(f) is None
    runs = [{"details": {"fractions": {"games": 0.5}}}, {"details": {"fractions": {"games": 0.9}, "experiment": "slice"}},
            {"details": {}}]
    f.write_text(json.dumps({"benchmarks": {"scaling": {"runs": runs}}}))
    assert previous_experiment(f) == "slice"
    f.write_text(json.dumps({"benchmarks": {"scaling": {"runs": runs[:1]}}}))
    assert previous_experiment(f) == "tiny"
