"""Every core, the same bytes (issue 46): the parallel stages at ``workers=1`` and ``workers=3``.

The stages that cut their work into a partition fixed by the config (``games``: one game a
job; ``evaluate_reader``: whole batches; ``curve``: one (k, condition) point a job) are run
in the tiny project (``project`` fixture) once in one process and once in three, and every
file they write is compared byte for byte. Their metrics may differ only in the fields that
measure the run itself (wall-clock times, speeds, the worker count), which are dropped
before the comparison. The upstream stages the reader and the curve read (``collect`` ->
``ground``/``merge``/``store``/``render``) run once, at ``workers=1``.

The tiny eval split (2 tasks) is one batch of the reader's (``agent.batch_size``: 56), so
``evaluate_reader`` plays it in one process at either count: it is here for the bytes of
its outputs; batches played side by side are tested in ``test_resume.py``
(``test_llm_evaluate_in_two_worker_processes_gives_the_same_bytes``).
"""

from __future__ import annotations

import json

import pytest

# What a metrics file may say about the run rather than the result.
RUN_FIELDS = ("workers", "model_workers", "compile_workers", "s_per_turn", "mean_game_compile_s")
# The outputs of each compared stage: folders (every file) and metrics files.
OUTPUTS = {
    "games": ("data/games", "metrics/games.json"),
    "evaluate_reader": ("data/eval_reader/C2", "metrics/eval_reader/C2.json"),
    "curve": ("data/curve", "metrics/curve.json", "metrics/curve_success.csv", "metrics/curve_turns.csv"),
}


def _without_run_fields(node):
    if isinstance(node, dict):
        return {k: _without_run_fields(v) for k, v in node.items()
                if not (k in RUN_FIELDS or k.endswith(("_time_s", "_wall_s", "_per_s")))}
    if isinstance(node, list):
        return [_without_run_fields(v) for v in node]
    return node


def _snapshot(project, paths) -> dict[str, bytes]:
    """Every file under the given folders / the given files, by path; JSON metrics without their run fields."""
    out: dict[str, bytes] = {}
    for rel in paths:
        base = project.root / rel
        files = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else [base]
        assert files, f"{rel}: nothing written"
        for p in files:
            data = p.read_bytes()
            if rel.startswith("metrics/") and p.suffix == ".json":
                data = json.dumps(_without_run_fields(json.loads(data)), sort_keys=True).encode()
            out[p.relative_to(project.root).as_posix()] = data
    return out


# Two of the curve's ks (8 points: more than three workers, in seconds).
CURVE_KS = "experiment.curve.ks=[0, 2]"


@pytest.mark.slow
@pytest.mark.e2e  # what `make reprocheck` checks on the whole tiny DAG: `make test-e2e`, CI's second step
def test_games_reader_and_curve_give_the_same_bytes_on_one_and_three_workers(rendered_project):
    project = rendered_project  # C2's prompts rendered (the same bytes at any worker count)
    runs = {}
    for workers in (1, 3):
        project.configure(f"workers={workers}", CURVE_KS)
        project.run("games", "+", "evaluate_reader", "--condition", "C2", "+", "curve")
        runs[workers] = {stage: _snapshot(project, paths) for stage, paths in OUTPUTS.items()}
        # The counts the runs used, in their metrics only: 4 games, 8 curve points (more than 3 each).
        assert json.loads(project.read("metrics/games.json"))["compile_workers"] == workers
        assert json.loads(project.read("metrics/curve.json"))["workers"] == workers
    for stage in OUTPUTS:
        one, three = runs[1][stage], runs[3][stage]
        assert sorted(one) == sorted(three), stage
        differ = [name for name in one if one[name] != three[name]]
        assert not differ, f"{stage}: workers=1 and workers=3 wrote different bytes: {differ}"
