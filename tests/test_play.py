"""The interactive feedback session ``python -m pipeline.tools.play``, driven through stdin."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline import grounding as G
from pipeline.tools import play as P

ROOT = Path(__file__).resolve().parents[1]
# Jericho warns that GameMaker games lack score/move detection; the env does not use them.
pytestmark = pytest.mark.filterwarnings("ignore:Game .* is not fully supported")
PLAY_OVERRIDES = ["env.max_steps=4", "agent=react"]


@pytest.fixture(scope="module")
def project(tiny_cfg, tiny_games, tmp_path_factory):
    """A project copy (conf/, plugin, params) holding the session's tiny compiled games."""
    root = tmp_path_factory.mktemp("play_project")
    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, root / name)
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    (root / "dvc.yaml").write_text("stages: {}\n")
    shutil.copytree(tiny_games.root / tiny_cfg.paths.games, root / tiny_cfg.paths.games)
    cfg = OmegaConf.merge(tiny_cfg, {"env": {"max_steps": 4}, "agent": {"name": "react"}})
    return root, cfg


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "SOURCE_DATE_EPOCH")}
    return env


def test_session_driven_through_stdin_writes_the_pipeline_grounding_files(project):
    root, _ = project
    script = "\n".join([
        "zero",                                   # not a number: asked again
        "1",                                      # episode number
        "feedback : spatial: 부엌은 초록색이다",
        "feedback : colour: 厨房是绿色的",           # unknown type: kept under general, warned
        "status : Done",                          # bad status: error, asked again
        "status : Failure",
        "",                                       # step 1 done
        "",                                       # step 2: Enter skips
        "feedback : procedural: open Fridge_0 first",
        "quit",                                   # ends the episode at step 3
    ]) + "\n"
    # The quests come from the copied data/games; only the step cap and the agent matter here.
    proc = subprocess.run([sys.executable, "-m", "pipeline.tools.play", *PLAY_OVERRIDES], input=script, cwd=root,
                          env=_env(),
                          capture_output=True, text=True, encoding="utf-8", timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "error: 'zero' is not an episode number" in out
    assert "error: status 'Done': expected one of Success | Failure | WiP" in out
    assert "Grounding in effect:\n  (none)" in out
    assert "unknown type 'colour' kept under 'general'" in proc.stderr

    folder = root / "outputs" / "play"
    doc = json.loads((folder / "episode_1" / "grounding_episode_1.json").read_text(encoding="utf-8"))
    assert list(doc) == ["expr_info", "grounding_per_step", "stacked_grounding", "final_grounding"]
    assert doc["expr_info"]["episode_id"] == 1 and doc["expr_info"]["agent"] == "react"
    assert [s["step_id"] for s in doc["grounding_per_step"]] == [1, 2, 3]
    assert doc["grounding_per_step"][1]["feedback"] == {t: None for t in G.FINAL_KEYS}
    assert doc["stacked_grounding"] == {
        "user_preference": [],
        "spatial": ["[ Step1 - Failure ] : 부엌은 초록색이다"],
        "procedural": [f"[ Step3 - {doc['grounding_per_step'][2]['status']} ] : open Fridge_0 first"],
        "general": ["[ Step1 - Failure ] : colour: 厨房是绿色的"],
    }
    assert doc["final_grounding"]["spatial_grounding"] == {"content": "부엌은 초록색이다."}
    txt = (folder / "episode_1" / "grounding_episode_1.txt").read_text(encoding="utf-8")
    assert txt == G.render_episode_text(doc) + "\n"
    assert "#### Spatial Grounding\n\n- 부엌은 초록색이다." in txt and "厨房是绿色的" in txt
    assert (folder / "grounding_latest.json").read_bytes() == (
        folder / "episode_1" / "grounding_episode_1.json").read_bytes()
    # Ready to be merged into the next run.
    merged = G.merge_grounding_files("outputs/play/grounding_latest.json", root=root)
    assert merged.content == txt.rstrip("\n")


def _session(cfg, root, out, lines, **kw):
    cfg = OmegaConf.create(OmegaConf.to_container(cfg))  # run_session edits grounding.files
    console = P.Console(io.StringIO("\n".join(lines) + "\n"), io.StringIO())
    paths = P.run_session(cfg, root, console, out_dir=out, **kw)
    return paths, console.stdout.getvalue()


def test_next_episode_sees_the_previous_grounding_and_reruns_are_byte_identical(project, tmp_path, monkeypatch):
    root, cfg = project
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    first = ["1", "feedback : spatial: Spoon_0 is in the Bathroom", "", "feedback : general: 不要重复"]
    _session(cfg, root, tmp_path / "a", first)
    _, shown = _session(cfg, root, tmp_path / "a", ["2", "", "quit"])
    assert "Grounding in effect:\n#### Spatial Grounding\n\n- Spoon_0 is in the Bathroom." in shown
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "episode_1", "episode_2", "grounding_latest.json", "grounding_latest.txt"]
    latest = json.loads((tmp_path / "a" / "grounding_latest.json").read_text(encoding="utf-8"))
    assert latest["expr_info"]["episode_id"] == 2
    # Same episode, same input: the same bytes (no wall-clock time anywhere).
    _session(cfg, root, tmp_path / "b", first)
    for name in ("grounding_episode_1.json", "grounding_episode_1.txt"):
        assert (tmp_path / "a" / "episode_1" / name).read_bytes() == (tmp_path / "b" / "episode_1" / name).read_bytes()


def test_rejected_lines_are_reported_and_not_recorded(project, tmp_path):
    root, cfg = project
    strict = OmegaConf.merge(cfg, {"grounding": {"unknown_type": "reject"}})
    paths, shown = _session(strict, root, tmp_path, ["not a feedback line", "feedback : spatial: ok", "quit"],
                            episode=5)
    assert "error: step 1: malformed feedback line 'not a feedback line'" in shown
    assert "the line was not recorded" in shown
    doc = json.loads(paths[0].read_text(encoding="utf-8"))
    assert doc["stacked_grounding"]["general"] == []
    assert doc["stacked_grounding"]["spatial"] == [f"[ Step1 - {doc['grounding_per_step'][0]['status']} ] : ok"]


def test_no_matching_quest_and_ended_input_are_clear_errors(project, tmp_path):
    root, cfg = project
    with pytest.raises(G.GroundingError, match=r"no train quest matches scene='nope'"):
        _session(cfg, root, tmp_path, ["1"], scene="nope")
    console = P.Console(io.StringIO(""), io.StringIO())
    with pytest.raises(G.GroundingError, match=r"no episode number given \(input ended\)"):
        P.run_session(OmegaConf.create(OmegaConf.to_container(cfg)), root, console, out_dir=tmp_path)
    assert not list(tmp_path.iterdir())
