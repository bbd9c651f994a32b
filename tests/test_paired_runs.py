"""`python -m pipeline.tools.paired_runs`: two runs on one world paired by task, per condition and pooled."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.tools.paired_runs import PairingError, main, pair


def write_run(root, outcomes: dict[str, list[bool]]):
    """``root/<condition>/episodes.parquet`` with one episode per task (scene s<i // 2>, quest q<i>, its seed)."""
    for cond, wins in outcomes.items():
        (root / cond).mkdir(parents=True)
        n = len(wins)
        pq.write_table(pa.table({"episode_id": [f"ep_eval_s{i // 2}_q{i}_0" for i in range(n)],
                                 "seed": [7 * i for i in range(n)],
                                 "scene_id": [f"s{i // 2}" for i in range(n)], "quest_id": [f"q{i}" for i in range(n)],
                                 "is_correct": wins, "won": [True] * n}), root / cond / "episodes.parquet")
    return root


def test_pairs_by_task_counts_b_and_c_and_pools_all_but_the_left_out(tmp_path):
    cand = write_run(tmp_path / "a", {"C0": [1, 1, 0, 0, 1], "C1": [1, 0, 0, 0, 0], "C2_silent": [1, 0, 0, 0, 0]})
    ctl = write_run(tmp_path / "b", {"C0": [0, 1, 1, 0, 0], "C1": [0, 0, 0, 0, 0], "C2_silent": [0, 0, 0, 0, 0]})
    out = pair(cand, ctl, leave_out=["C2_silent"])
    rows = {r["condition"]: r for r in out["conditions"]}
    assert (rows["C0"]["b"], rows["C0"]["c"], rows["C0"]["candidate"], rows["C0"]["control"]) == (2, 1, 0.6, 0.4)
    assert (rows["C1"]["b"], rows["C1"]["c"]) == (1, 0) and rows["C1"]["p_exact"] == 1.0
    assert rows["C2_silent"]["pooled"] is False and rows["C2_silent"]["b"] == 1
    assert out["pooled"] == {"conditions": ["C0", "C1"], "b": 3, "c": 1, "p_exact": 0.625}


def test_a_one_sided_pool_is_significant(tmp_path):
    cand = write_run(tmp_path / "a", {"C0": [True] * 8})
    ctl = write_run(tmp_path / "b", {"C0": [False] * 8})
    assert pair(cand, ctl)["pooled"]["p_exact"] == pytest.approx(2 / 2 ** 8)


def test_runs_of_different_worlds_are_refused_with_the_task_named(tmp_path):
    cand = write_run(tmp_path / "a", {"C0": [1, 0, 1]})
    ctl = write_run(tmp_path / "b", {"C0": [1, 0]})
    with pytest.raises(PairingError, match=r"condition C0: task s1/q2 is in one run only \(3 tasks in .*, 2 in"):
        pair(cand, ctl)
    with pytest.raises(PairingError, match="share no evaluated condition"):
        pair(cand, write_run(tmp_path / "c", {"C1": [1]}))
    with pytest.raises(PairingError, match=r"C9.*episodes.parquet: no episodes"):
        pair(cand, ctl, conditions=["C9"])


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    cand = write_run(tmp_path / "a", {"C0": [1, 1, 0], "C1": [0, 1, 1]})
    ctl = write_run(tmp_path / "b", {"C0": [0, 1, 0], "C1": [0, 0, 1]})
    assert main([str(cand), str(ctl), "--leave-out", "C1", "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "| C1 (not pooled) | 3 | 0.67 | 0.33 | 1 / 0 | 1 |" in out
    assert "| **pooled** (C0) | | | | **1 / 0** | **1** |" in out
    assert json.loads((tmp_path / "p.json").read_text())["pooled"]["b"] == 1
    assert main([str(tmp_path / "missing"), str(ctl)]) == 2
    assert "missing: not a folder" in capsys.readouterr().err
