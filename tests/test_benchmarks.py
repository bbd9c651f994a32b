"""The benchmark suite runs and prints its table (no figure is asserted: tests never time anything)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from benchmarks.__main__ import _table_before, print_table, row, run_parent_one
from benchmarks.common import synthetic_episodes, synthetic_turns
from pipeline.core.schemas import EPISODE_SCHEMA, TURN_SCHEMA, _table, turns_table

ROOT = Path(__file__).resolve().parents[1]


def test_quick_render_prints_the_table_and_writes_results(tmp_path: Path):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "render", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "cores" in lines[0] and "load average" in lines[0]
    assert [c.strip() for c in lines[1].split("|")] == ["figure", "value", "unit", "ratio", "vs", "target", "met"]
    assert any(ln.startswith("get_system_prompt") and "prompts/s" in ln for ln in lines)
    doc = json.loads(out.read_text())
    assert {"date", "cores", "cpu_model", "load_average"} <= set(doc["meta"])
    run = doc["benchmarks"]["render"]["runs"][0]
    assert run["status"] == "ok"
    assert {r["figure"] for r in run["rows"]} >= {"get_system_prompt (per turn, llm agent)"}
    assert all(set(r) >= {"figure", "value", "unit", "ratio", "vs"} for r in run["rows"])


def test_a_failing_benchmark_is_reported_not_raised(capsys):
    res = run_parent_one("load", "no-such-part", True, timeout=120, log=None)
    assert res["status"] == "failed" and "exit 1" in res["error"]
    meta = {"date": "d", "host": "h", "cores": 2, "cpu_model": "cpu", "memory_gib": 1, "python": "3",
            "packages": {}, "load_average": [0.0]}
    print_table(meta, {"load": [res], "x": [{"status": "ok", "variant": "", "wall_s": 1, "load_before": [],
                                             "load_after": [], "rows": [row("a figure", 1.5, "s", ratio=2.0, vs="b")]}]})
    text = capsys.readouterr().out
    assert "load no-such-part: FAILED" in text
    assert "a figure" in text and "2.00x" in text


def test_device_cuda_without_cuda_says_so_and_measures_nothing(tmp_path: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present: `python -m benchmarks --only engines --device cuda` measures for real")
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "engines", "--variants", "cache",
                           "--device", "cuda", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--device cuda: CUDA is not available" in proc.stderr
    doc = json.loads(out.read_text())
    assert doc["meta"]["device"]["device"] == "cuda" and "not available" in doc["meta"]["device"]["problem"]
    runs = doc["benchmarks"]["engines"]["runs"]
    assert [r["variant"] for r in runs] == ["cache"]
    rows = [r for run in runs for r in run["rows"]]
    assert rows and all(r["value"] is None and "CUDA is not available" in r["note"] for r in rows)


def test_list_names_every_benchmark():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    names = [ln.split()[0] for ln in proc.stdout.splitlines()]
    assert names[0] == "pipeline" and {"retrieval", "render", "collect_llm", "parquet", "store"} <= set(names)


def test_synthetic_data_has_the_collect_schemas():
    turns = synthetic_turns(250, turns_per_episode=10, seed=3)
    assert turns.schema == TURN_SCHEMA and turns.num_rows == 250
    assert turns.equals(synthetic_turns(250, turns_per_episode=10, seed=3))  # seeded
    episodes, ep_turns = synthetic_episodes(20, seed=1)
    assert episodes.schema == EPISODE_SCHEMA and episodes.num_rows == 20 and ep_turns.num_rows == 120
    assert set(ep_turns.column("episode_id").to_pylist()) == set(episodes.column("episode_id").to_pylist())


def test_faster_table_conversion_matches_the_former_loop():
    """pipeline.core.schemas._table (issue 9's fix) builds the same table and the same errors."""
    rows = synthetic_turns(300, seed=0).to_pylist()
    for r in rows[::7]:  # a missing nullable field is null, as before
        del r["memory"]
    assert turns_table(rows).equals(_table_before(rows, TURN_SCHEMA))
    strict = pa.schema([pa.field("a", pa.string(), nullable=False), ("b", pa.int32())])
    with pytest.raises(ValueError, match=r"t row 1: missing field 'a'"):
        _table([{"a": "x"}, {"b": 1}], strict, "t")
    with pytest.raises(ValueError, match=r"field 'b' does not fit int32"):
        _table([{"a": "x", "b": "y"}], strict, "t")
    with pytest.raises(ValueError, match=r"unknown fields \['c', 'd'\]"):
        _table([{"a": "x", "c": 1}, {"a": "y", "d": 2}], strict, "t")
    assert _table([], strict, "t").num_rows == 0


@pytest.fixture()
def config_repo(tmp_path: Path) -> Path:
    """A copy of the config route (conf/, params.yaml composed from it, dvc.yaml, plugin)."""
    import shutil

    from pipeline.core import config as C

    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    C.compose(tmp_path)
    return tmp_path


def test_a_passed_stale_check_is_stamped_and_any_change_invalidates_it(config_repo: Path, monkeypatch):
    """Issue 9: stages skip the Hydra compose when exactly these inputs passed the check before."""
    from pipeline.core import config as C

    stamps = config_repo / ".checkpoints" / "params_check"
    C.check(config_repo, use_stamp=False)
    assert not stamps.exists()  # use_stamp=False neither reads nor writes one
    C.check(config_repo)
    assert len(list(stamps.iterdir())) == 1

    def no_compose(*a, **k):
        raise AssertionError("composed despite a stamp")

    with monkeypatch.context() as m:  # a stamp hit does not compose
        m.setattr(C, "compose_text", no_compose)
        C.check(config_repo)

    conf = config_repo / "conf" / "sampling" / "default.yaml"
    conf.write_text(conf.read_text() + "top_p: 0.8  # an option changing the schema default (0.9)\n")
    with pytest.raises(C.ConfigError, match=r"sampling\.top_p"):  # the old stamp does not hide it
        C.check(config_repo)
    C.compose(config_repo)
    C.check(config_repo)
    assert len(list(stamps.iterdir())) == 2
