"""Smaller traps of issue 32 (part 6), each with a clear message: feedback records that reach
no episode, a command started outside the project, an empty checkpoint folder left by a
failed run. (A failed check_params keeping its stamp: ``tests/test_exp_workflow.py``; a
backend error blamed on ``agent.on_backend_error=fail`` only when it was:
``tests/reliability/test_faulty_server.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pipeline.core.io import read_parquet
from pipeline.session.rollout import tasks_from_manifest

from .conftest import subprocess_env


def test_feedback_records_of_no_train_episode_are_named(project):
    rows = read_parquet(project.root / "data/games/manifest.parquet").to_pylist()
    train = tasks_from_manifest(rows, split="train", master_seed=0)
    lines = [{"episode_id": train[0].episode_id, "step_id": 1, "line": "feedback : general: Look around first."},
             {"episode_id": "ep_train_scene_99_q9_0", "step_id": 1, "line": "feedback : general: A typo's id."}]
    (project.root / "feedback.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    project.configure("user=file", "user.feedback_file=feedback.jsonl")
    proc = project.run("collect")
    assert "records of 1 episode id(s) that are no train task of this config are ignored: ep_train_scene_99_q9_0" \
        in proc.stderr


def test_a_command_started_outside_the_project_says_so(tmp_path):
    for cmd in (["-m", "pipeline.stages.evaluate", "--condition", "C1"], ["-m", "pipeline.core.config", "compose"]):
        p = subprocess.run([sys.executable, *cmd], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 1 and "Traceback" not in p.stderr
        assert f"error: {tmp_path.resolve()} is not inside the project" in p.stderr
        assert "run `python -m pipeline.core.config compose`" not in p.stderr


def test_a_run_that_fails_before_any_episode_leaves_no_empty_checkpoint_folder(project):
    (project.root / "data" / "games" / "scenes.json").write_text("{}")  # every task's scene is unknown
    proc = project.run("collect", check=False)
    assert proc.returncode != 0
    folder = project.root / ".checkpoints" / "collect"
    assert not folder.exists() or not any(folder.iterdir()), sorted(os.listdir(folder))
