"""Trust, third round (issue 66), finding 4: ids read from data that become paths.

A scene, quest or episode id read from a data file (``data/grounding/index.json``, the games
manifest, an episode record or checkpoint, ``episodes.parquet``) names a file or folder: the
merge's ``<scene_id>.md``, the online loop's ``online_grounding/<scene_id>/<episode_id>.json``,
checkpoints and tensors. One check (:func:`pipeline.core.io.safe_name`, the ``SAFE_NAME_RE``
that ``ground`` already applied) refuses an id that would leave its folder, naming the file, the
key and the value, before anything is written; the ids the pipeline makes pass unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.core.io import ArtifactError, safe_name

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["../../../ESCAPED", "../../README"]


def test_the_ids_the_pipeline_makes_pass_the_check_unchanged():
    """Scene ids (``scene_03``, ``gen_00012``, ScienceWorld's ``boil`` / ``use-thermometer-v0007``),
    quest ids (``q00``, ``v0007``, ``v0007_t1``) and episode ids pass as they are."""
    from pipeline.core.conf_schema import SwSetup
    from pipeline.envs.household.games import scene_id as household_scene
    from pipeline.envs.scienceworld.build import quest_id as sw_quest, scene_id as sw_scene
    from pipeline.session.rollout import format_episode_id

    ids = [household_scene(3), "s00", "s0", "gen_00012", sw_scene("boil", SwSetup.generalisation, 7),
           sw_scene("use-thermometer", SwSetup.adaptation, 7), "q00", sw_quest(7), sw_quest(7, 1),
           format_episode_id("train", "scene_03", "q01", 0), format_episode_id("test", "boil", sw_quest(7, 1), 2)]
    assert ids[4:6] == ["boil", "use-thermometer-v0007"]
    assert [safe_name(i, "x", "id") for i in ids] == ids
    assert safe_name(12, "x", "episode_id") == "12"  # the grounding library's int episode ids


@pytest.mark.parametrize("bad", [*HOSTILE, ".hidden", "a/b", "s00\n", "", None])
def test_a_hostile_id_is_refused_naming_the_source_the_key_the_value_and_what_was_expected(bad):
    with pytest.raises(ArtifactError) as exc:
        safe_name(bad, "data/grounding/index.json", "episodes[0].scene_id")
    assert str(exc.value) == (f"data/grounding/index.json: episodes[0].scene_id={bad!r} cannot be a file name: "
                              "expected letters, digits, '_', '-', '.', not starting with '.'")


# --------------------------------------------------------------------------- merge


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A project two folders below ``tmp_path`` (so ``../../..`` stays in it) with the ground
    stage's outputs of two episodes of scene ``s0``, merged once."""
    import pipeline.grounding as G
    from pipeline.core.config import compose
    from pipeline.grounding.episodes import write_ground_outputs
    from pipeline.stages import merge as merge_stage

    root = tmp_path / "a" / "project"
    root.mkdir(parents=True)
    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, root / name)
    (root / "dvc.yaml").write_text("stages: {}\n")
    compose(root)  # params.yaml from the copied conf/
    (root / "README.md").write_text("the project's README\n")
    docs = []
    for eid, text in (("ep_train_s0_q0_0", "kitchen is green"), ("ep_train_s0_q1_0", "fridge is cold")):
        gfm = G.GroundingFileManager(eid, expr_info={"scene_id": "s0"})
        gfm.append_step_feedback(1, "look", "WiP", {"spatial": text})
        gfm.save_final_grounding(gfm.generate_final_grounding(timestamp="2025-01-01T00:00:00"))
        docs.append(gfm.to_dict())
    write_ground_outputs(docs, root / "data" / "grounding", "both")
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(root)
    assert merge_stage.main() == 0
    return root


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("bad", HOSTILE)
def test_merge_refuses_a_scene_id_of_the_index_that_leaves_its_folder_and_writes_nothing(project, tmp_path, capsys,
                                                                                         bad):
    """``"../../../ESCAPED"`` in ``index.json`` wrote ``ESCAPED.md`` outside the project and
    ``"../../README"`` overwrote its README, exit 0; now exit 1 naming the file, key and value,
    the previous merge left as it was."""
    from pipeline.stages import merge as merge_stage

    index_path = project / "data" / "grounding" / "index.json"
    index = json.loads(index_path.read_text())
    index["episodes"][1]["scene_id"] = bad
    index_path.write_text(json.dumps(index))
    before = _tree(tmp_path)
    capsys.readouterr()
    assert merge_stage.main() == 1
    assert (f"error: data/grounding/index.json: episodes[1].scene_id={bad!r} cannot be a file name: expected letters, "
            "digits, '_', '-', '.', not starting with '.'") in capsys.readouterr().err
    assert _tree(tmp_path) == before  # nothing written anywhere: no ESCAPED.md, the README and the merge intact
    assert (project / "README.md").read_text() == "the project's README\n"


@pytest.mark.parametrize("bad", HOSTILE)
def test_the_merged_grounding_of_a_scene_is_never_read_from_outside_its_folder(project, bad):
    """``scene_grounding_content`` and the render stage's ``grounding_files_for`` read
    ``<merged>/<scene_id>.md``: ``"../../README"`` read the project's README into a prompt."""
    import pipeline.grounding as G
    from pipeline.conditions.render import grounding_files_for

    merged = project / "data" / "grounding_merged"
    assert G.scene_grounding_content(merged, "s0").startswith("#### Spatial Grounding")
    with pytest.raises(ArtifactError, match=rf"grounding_merged/<scene_id>.md: scene_id={bad!r} cannot be a file name"):
        G.scene_grounding_content(merged, bad)
    assert grounding_files_for("s0", merged_dir="data/grounding_merged", use_in_prompt=True, configured=False,
                               root=project) == ["data/grounding_merged/s0.md"]
    with pytest.raises(ArtifactError, match=rf"data/grounding_merged/<scene_id>.md: scene_id={bad!r}"):
        grounding_files_for(bad, merged_dir="data/grounding_merged", use_in_prompt=True, configured=False, root=project)


# --------------------------------------------------------------------------- manifest ids -> checkpoints, tensors


def _row(scene: str, quest: str, split: str = "train") -> dict:
    return {"scene_id": scene, "quest_id": quest, "split": split, "objective": "x", "game_file": "",
            "expert_plan": [], "preferences": []}


@pytest.mark.parametrize("key", ["scene_id", "quest_id"])
@pytest.mark.parametrize("bad", HOSTILE)
def test_a_manifest_id_that_would_name_a_checkpoint_outside_its_folder_is_refused(tmp_path, key, bad):
    """A manifest's scene and quest ids make the episode id that names its checkpoint
    (``<ckpt>/<episode_id>.json``) and tensors (``tensors/<episode_id>.pt``): a quest id
    ``../../../ESCAPED`` put the checkpoint three folders up. Refused at the manifest, naming the row."""
    from pipeline.conditions.schema import load_eval_tasks
    from pipeline.core.io import write_parquet
    from pipeline.core.schemas import manifest_table
    from pipeline.session.rollout import Checkpoints, tasks_from_manifest

    rows = [_row("s0", "q00"), {**_row("s0", "q01"), key: bad}]
    healthy = tasks_from_manifest(rows[:1], split="train", master_seed=0)
    assert [t.episode_id for t in healthy] == ["ep_train_s0_q00_0"]
    with pytest.raises(ArtifactError, match=rf"the games manifest \(manifest.parquet\), row 1: {key}={bad!r} cannot "
                                            "be a file name"):
        tasks_from_manifest(rows, split="train", master_seed=0)
    assert tasks_from_manifest(rows, split="eval", master_seed=0) == []  # only the split's rows become paths
    ckpts = Checkpoints(tmp_path / "ckpt")
    with pytest.raises(ArtifactError, match=r"ckpt: episode_id='ep_train_s0_\.\./"):
        ckpts.save(f"ep_train_s0_{bad}_0", {"episode": {}})
    assert list(tmp_path.rglob("*")) == []  # refused before the checkpoint folder is made
    # the render stage's tasks (load_eval_tasks) come from the same manifest
    full = [{**_row("s0", "q00", "eval"), "scene_split": "seen", "quest_length": 0, "scene_seed": 0, "quest_seed": 0,
             "metadata": "{}"}]
    full.append({**full[0], key: bad})
    games = tmp_path / "data" / "games"
    write_parquet(manifest_table(full), games / "manifest.parquet")
    cfg = OmegaConf.create({"paths": {"games": "data/games"}, "experiment": {"eval_split": "eval"}})
    with pytest.raises(ArtifactError, match=rf"data/games/manifest.parquet, row 1: {key}={bad!r} cannot be a file name"):
        load_eval_tasks(tmp_path, cfg)


def test_an_episode_id_of_episodes_parquet_never_names_a_tensor_file_outside_its_folder(tmp_path):
    from pipeline.session.episodes import EPISODES_FILE, EpisodeStore

    store = EpisodeStore(tmp_path / "episodes")
    assert store.tensor_path("ep_train_s0_q00_0") == tmp_path / "episodes" / "tensors" / "ep_train_s0_q00_0.pt"
    with pytest.raises(ArtifactError, match=rf"episodes/{EPISODES_FILE}: episode_id='\.\./\.\./\.\./ESCAPED' cannot"):
        store.tensor_path("../../../ESCAPED")  # what load_tensors reads (torch.load)


# --------------------------------------------------------------------------- the online loop


@pytest.mark.parametrize("bad", HOSTILE)
def test_the_online_loop_never_writes_a_record_s_grounding_outside_its_folder(tiny_cfg, tmp_path, bad):
    """``online_grounding/<scene_id>/<episode_id>.json`` from an episode record (a checkpoint read
    back: its scene id is not checked against the task's) wrote outside the checkpoint folder.
    (An episode id that leaves it was already refused, by the grounding document's own check.)"""
    key = "scene_id"
    from pipeline.session.online import play_online
    from pipeline.session.rollout import Task

    cfg = OmegaConf.merge(tiny_cfg, {"agent": {"name": "llm"}})
    task = Task(episode_id="ep_train_s0_q00_0", scene_id="s0", quest_id="q00", split="train", objective="x",
                game_file="", expert_plan=[], preferences=[], seed=1)
    ep = {"episode_id": task.episode_id, "scene_id": "s0", "quest_id": "q00", "objective": "x", key: bad}
    turn = {"episode_id": ep["episode_id"], "turn_index": 0, "command": "look", "action": "look", "status": "WiP",
            "feedback_lines": ["spatial: the key is in Drawer_0"], "feedback_spatial": "the key is in Drawer_0",
            "feedback_user_preference": None, "feedback_procedural": None, "feedback_general": None}
    work = tmp_path / "a" / "ckpt"
    with pytest.raises(ArtifactError, match=rf"a/ckpt/ep_train_s0_q00_0.json: episode.scene_id={bad!r} cannot be a "
                                            "file name"):
        play_online(cfg, ROOT, [task], lambda batch: [{"episode": ep, "turns": [turn], "tensors": []}], work)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
