"""Merging many grounding files (seed 000 "여러 파일 병합 기능") and the ``merge`` stage."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from pipeline import grounding as G
from pipeline.grounding import scenes as M
from pipeline.stages import merge as merge_stage

ROOT = Path(__file__).resolve().parents[1]
TS = "2026-01-27T00:00:00+00:00"


def _doc(eid, stacked=None, **contents):
    final = G.empty_final_grounding(TS)
    for key, text in contents.items():
        final[key]["content"] = text
    return {"expr_info": {"episode_id": eid},
            "grounding_per_step": [],
            "stacked_grounding": {**G.empty_stacked(), **(stacked or {})},
            "final_grounding": final}


def _write(path: Path, obj) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return path.name


@pytest.fixture()
def files(tmp_path):
    """Two good grounding JSON files, two TXT files and broken ones, under ``tmp_path``."""
    _write(tmp_path / "a.json", _doc(1, {"spatial": ["[ Step1 - Success ] : kitchen is green",
                                                     "[ Step2 - WiP ] : fridge is in kitchen"],
                                         "general": ["[ Step3 - Failure ] : stop looping"]},
                                     spatial_grounding="The green room is the kitchen.",
                                     general_grounding_rules="Do not repeat an action that changed nothing."))
    _write(tmp_path / "b.json", _doc(2, {"spatial": ["[ Step2 - WiP ] : fridge is in kitchen",
                                                     "[ Step1 - Success ] : bedroom is blue",
                                                     "[ Step1 - Success ] : kitchen is green"],
                                         "procedural": ["[ Step1 - Failure ] : open before take"]},
                                     spatial_grounding="The blue room is the bedroom.",
                                     procedural_grounding="Open a container before taking from it.",
                                     user_preference_grounding=""))
    _write(tmp_path / "notes.txt", "Kitchen notes: the fridge sticks.\n")
    _write(tmp_path / "more.txt", "\nBedroom notes: mind the cat.\n\n")
    _write(tmp_path / "corrupt.json", '{"stacked_grounding": {"spatial": ["x"]')
    _write(tmp_path / "wrong.json", '["not", "an", "object"]')
    return tmp_path


def test_stacked_lists_merged_with_duplicates_removed_first_order_kept(files):
    merged = G.merge_grounding_json_files(["a.json", "b.json"], root=files)
    assert merged["stacked_grounding"] == {
        "user_preference": [],
        "spatial": ["[ Step1 - Success ] : kitchen is green", "[ Step2 - WiP ] : fridge is in kitchen",
                    "[ Step1 - Success ] : bedroom is blue"],
        "procedural": ["[ Step1 - Failure ] : open before take"],
        "general": ["[ Step3 - Failure ] : stop looping"],
    }
    assert merged["sources"] == ["a.json", "b.json"] and merged["skipped"] == []


def test_final_contents_joined_timestamp_excluded_empty_skipped(files):
    final = G.merge_grounding_json_files(["a.json", "b.json"], root=files)["final_grounding"]
    assert final == {
        "user_preference_grounding": {"content": ""},
        "spatial_grounding": {"content": "- The green room is the kitchen.\n\n- The blue room is the bedroom."},
        "procedural_grounding": {"content": "- Open a container before taking from it."},
        "general_grounding_rules": {"content": "- Do not repeat an action that changed nothing."},
    }
    assert "generation_timestamp" not in final


def test_render_to_markdown_exact_text_with_h4_headers(files):
    merged = G.merge_grounding_json_files("a.json,b.json", root=files)
    assert G.render_grounding_to_markdown(merged) == (
        "#### Spatial Grounding\n\n"
        "- The green room is the kitchen.\n\n- The blue room is the bedroom.\n\n"
        "#### Procedural Grounding\n\n"
        "- Open a container before taking from it.\n\n"
        "#### General Grounding Rules\n\n"
        "- Do not repeat an action that changed nothing."
    )
    assert G.render_grounding_to_markdown({"final_grounding": G.empty_final_grounding(TS)}) == ""


def test_h3_becomes_h4_inside_contents_too_but_not_in_code_fences():
    merged = G.merge_grounding_docs([_doc(1, spatial_grounding="### Kitchen\nGreen walls.\n#### Fridge\n#tag\n"
                                                                 "```\n### not a header\n```")])
    assert G.render_grounding_to_markdown(merged) == (
        "#### Spatial Grounding\n\n- #### Kitchen\nGreen walls.\n##### Fridge\n#tag\n```\n### not a header\n```")
    shifted = G.shift_markdown_headers("### A\n## B\n###### C\n   ### D\n###E\n- ### F")
    assert shifted == "#### A\n### B\n###### C\n   #### D\n###E\n- #### F"


def test_txt_files_joined_with_the_separator(files):
    merged = G.merge_grounding_files(["notes.txt", "more.txt"], root=files)
    assert merged.content == "Kitchen notes: the fridge sticks.\n\n---\n\nBedroom notes: mind the cat."
    assert merged.merged_json is None and merged.text_sources == ["notes.txt", "more.txt"]


def test_mixed_json_markdown_then_txt_text(files):
    merged = G.merge_grounding_files("notes.txt, a.json ,more.txt,b.json", root=files)
    md = G.render_grounding_to_markdown(G.merge_grounding_json_files(["a.json", "b.json"], root=files))
    assert merged.content == (md + "\n\n---\n\n" + "Kitchen notes: the fridge sticks."
                              + "\n\n---\n\n" + "Bedroom notes: mind the cat.")
    assert merged.sources == ["a.json", "b.json", "notes.txt", "more.txt"]


def test_corrupt_file_among_good_ones_is_skipped_with_a_warning_naming_it(files, caplog):
    with caplog.at_level(logging.WARNING):
        merged = G.merge_grounding_json_files(["a.json", "corrupt.json", "b.json", "wrong.json", "gone.json"],
                                              root=files)
    clean = G.merge_grounding_json_files(["a.json", "b.json"], root=files)
    assert merged["stacked_grounding"] == clean["stacked_grounding"]
    assert merged["final_grounding"] == clean["final_grounding"]
    assert [s["path"] for s in merged["skipped"]] == ["corrupt.json", "wrong.json", "gone.json"]
    assert merged["skipped"][0]["reason"].startswith("corrupt JSON (")
    assert merged["skipped"][1]["reason"] == "expected a JSON object, got list"
    assert merged["skipped"][2]["reason"] == "missing file"
    for name in ("corrupt.json", "wrong.json", "gone.json"):
        assert f"grounding file {name} skipped" in caplog.text


def test_all_files_unusable_is_a_clear_error(files):
    with pytest.raises(G.GroundingMergeError, match=r"no usable grounding JSON file among: corrupt.json "
                                                    r"\(corrupt JSON .*\); gone.json \(missing file\)"):
        G.merge_grounding_json_files("corrupt.json,gone.json", root=files)
    with pytest.raises(G.GroundingMergeError, match=r"no usable grounding file among: corrupt.json .*; "
                                                    r"gone.txt \(missing file\)"):
        G.merge_grounding_files(["corrupt.json", "gone.txt"], root=files)
    with pytest.raises(G.GroundingMergeError, match="no grounding JSON file given"):
        G.merge_grounding_json_files(" , ", root=files)


def test_mixed_with_every_json_corrupt_keeps_the_txt(files, caplog):
    with caplog.at_level(logging.WARNING):
        merged = G.merge_grounding_files(["corrupt.json", "notes.txt"], root=files)
    assert merged.content == "Kitchen notes: the fridge sticks."
    assert merged.skipped[0]["path"] == "corrupt.json" and "corrupt.json" in caplog.text


def test_comma_string_and_list_give_the_same_merge(files):
    as_string = G.merge_grounding_json_files(" a.json , b.json,", root=files)
    as_list = G.merge_grounding_json_files(["a.json", Path("b.json")], root=files)
    assert as_string == as_list
    assert G.split_grounding_paths("a.json,,b.txt ") == ["a.json", "b.txt"]
    with pytest.raises(G.GroundingError, match=r"grounding file 3: expected a path string"):
        G.split_grounding_paths(["a.json", 3])


def test_relative_paths_resolve_against_the_project_root(files, monkeypatch):
    (files / "dvc.yaml").write_text("stages: {}\n")
    (files / "conf").mkdir()
    (files / "sub").mkdir()
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(files / "sub")
    merged = G.merge_grounding_json_files("a.json,b.json")  # not sub/a.json
    assert merged["sources"] == ["a.json", "b.json"]
    assert G.merge_grounding_files([str(files / "notes.txt")]).content == "Kitchen notes: the fridge sticks."


def test_korean_and_chinese_text_kept_as_utf8(tmp_path):
    _write(tmp_path / "ko.json", _doc(1, {"spatial": ["[ Step1 - Success ] : 부엌은 초록색이다"]},
                                      spatial_grounding="초록색 방이 부엌이다."))
    _write(tmp_path / "zh.json", _doc(2, {"spatial": ["[ Step1 - Success ] : 厨房是绿色的"]},
                                      spatial_grounding="绿色的房间是厨房。"))
    _write(tmp_path / "zh.txt", "不要重复同样的动作。\n")
    merged = G.merge_grounding_files(["ko.json", "zh.json", "zh.txt"], root=tmp_path)
    assert merged.content == ("#### Spatial Grounding\n\n- 초록색 방이 부엌이다.\n\n- 绿色的房间是厨房。"
                              "\n\n---\n\n不要重复同样的动作。")
    index = M.write_merge_outputs({"s0": merged}, merged, tmp_path / "out", "both")
    md = (tmp_path / "out" / "s0.md").read_bytes()
    assert md == (merged.content + "\n").encode("utf-8")
    raw = (tmp_path / "out" / "s0.json").read_text(encoding="utf-8")
    assert "부엌은 초록색이다" in raw and "厨房是绿色的" in raw and "\\u" not in raw
    assert index["scenes"]["s0"]["sources"] == ["ko.json", "zh.json", "zh.txt"]


def test_dedupe_contents_option(tmp_path):
    docs = [_doc(1, spatial_grounding="Apple_2 is in Fridge_0.\nKey_1 is on Table_0."),
            _doc(2, spatial_grounding="apple_2 is in fridge_0\nThe Bedroom is east."),
            _doc(3, spatial_grounding="Key_1 is on Table_0.")]
    assert G.merge_grounding_docs(docs)["final_grounding"]["spatial_grounding"]["content"] == (
        "- Apple_2 is in Fridge_0.\nKey_1 is on Table_0.\n\n- apple_2 is in fridge_0\nThe Bedroom is east."
        "\n\n- Key_1 is on Table_0.")
    assert G.merge_grounding_docs(docs, dedupe_contents=True)["final_grounding"]["spatial_grounding"]["content"] == (
        "- Apple_2 is in Fridge_0.\nKey_1 is on Table_0.\n\n- The Bedroom is east.")


def test_episode_txt_equals_what_its_json_contributes(tmp_path):
    gfm = G.GroundingFileManager("e1", out_dir=tmp_path, save_format="both")
    gfm.append_step_feedback(1, "look", "WiP", {"spatial": "kitchen is green", "general": "look around"})
    gfm.save_final_grounding(gfm.generate_final_grounding(timestamp=TS))
    folder = "episode_e1"
    via_json = G.merge_grounding_files([f"{folder}/grounding_episode_e1.json"], root=tmp_path).content
    via_txt = G.merge_grounding_files([f"{folder}/grounding_episode_e1.txt"], root=tmp_path).content
    assert via_json == via_txt == ("#### Spatial Grounding\n\n- kitchen is green.\n\n"
                                   "#### General Grounding Rules\n\n- look around.")


# --------------------------------------------------------------------------- merge stage


@pytest.fixture()
def grounded(tmp_path):
    """The ground stage's folder for two scenes (s1 with a TXT-only episode)."""
    from pipeline.grounding.episodes import write_ground_outputs

    docs = []
    for eid, scene, text in [("ep_s0_a", "s0", "kitchen is green"), ("ep_s0_b", "s0", "fridge is cold"),
                             ("ep_s1_a", "s1", "부엌은 초록색이다")]:
        gfm = G.GroundingFileManager(eid, expr_info={"scene_id": scene})
        gfm.append_step_feedback(1, "look", "WiP", {"spatial": text, "general": "look first"})
        gfm.save_final_grounding(gfm.generate_final_grounding(timestamp=TS))
        docs.append(gfm.to_dict())
    write_ground_outputs(docs, tmp_path / "data" / "grounding", "both")
    _write(tmp_path / "notes" / "extra.txt", "Extra: the cat bites.\n")
    return tmp_path


def test_merge_stage_writes_one_grounding_per_scene_and_the_configured_merge(grounded):
    index = json.loads((grounded / "data/grounding/index.json").read_text())
    scenes, configured = M.merge_groundings(index, "data/grounding",
                                            "data/grounding/grounding_latest.json,notes/extra.txt", root=grounded)
    out = grounded / "data" / "grounding_merged"
    written = M.write_merge_outputs(scenes, configured, out, "both")
    assert sorted(p.name for p in out.iterdir()) == ["configured.json", "configured.md", "index.json",
                                                     "s0.json", "s0.md", "s1.json", "s1.md"]
    assert (out / "s0.md").read_text() == ("#### Spatial Grounding\n\n- kitchen is green.\n\n- fridge is cold.\n\n"
                                           "#### General Grounding Rules\n\n- look first.\n\n- look first.\n")
    assert (out / "configured.md").read_text(encoding="utf-8") == (
        "#### Spatial Grounding\n\n- 부엌은 초록색이다.\n\n#### General Grounding Rules\n\n- look first."
        "\n\n---\n\nExtra: the cat bites.\n")
    assert written["scenes"]["s0"]["sources"] == [
        "data/grounding/episode_ep_s0_a/grounding_episode_ep_s0_a.json",
        "data/grounding/episode_ep_s0_b/grounding_episode_ep_s0_b.json"]
    assert G.scene_grounding_content(out, "s1") == (
        (out / "s1.md").read_text(encoding="utf-8").strip() + "\n\n---\n\n"
        + (out / "configured.md").read_text(encoding="utf-8").strip())
    assert G.scene_grounding_content(out, "unseen_scene", include_configured=False) == ""


def test_merge_stage_txt_format_empty_file_list_and_txt_only_episodes(grounded):
    from pipeline.grounding.episodes import write_ground_outputs

    docs = [json.loads(p.read_text()) for p in sorted((grounded / "data/grounding").glob("episode_*/*.json"))]
    write_ground_outputs(docs, grounded / "data" / "grounding", "txt")
    index = json.loads((grounded / "data/grounding/index.json").read_text())
    scenes, configured = M.merge_groundings(index, "data/grounding", [], root=grounded)
    assert configured is None
    out = grounded / "merged"
    M.write_merge_outputs(scenes, configured, out, "txt")
    assert sorted(p.name for p in out.iterdir()) == ["configured.md", "index.json", "s0.md", "s1.md"]
    assert (out / "configured.md").read_text() == ""
    assert (out / "s0.md").read_text() == ("#### Spatial Grounding\n\n- kitchen is green.\n\n#### General Grounding "
                                           "Rules\n\n- look first.\n\n---\n\n#### Spatial Grounding\n\n- fridge is "
                                           "cold.\n\n#### General Grounding Rules\n\n- look first.\n")


def test_merge_stage_fails_clearly_when_every_configured_file_is_unusable(grounded):
    index = json.loads((grounded / "data/grounding/index.json").read_text())
    with pytest.raises(G.GroundingError, match=r"grounding.files: no usable grounding file among: nope.json "
                                               r"\(missing file\)"):
        M.merge_groundings(index, "data/grounding", ["nope.json"], root=grounded)
    with pytest.raises(G.GroundingError, match=r"grounding.merge_format='yaml'"):
        M.write_merge_outputs({}, None, grounded / "m", "yaml")


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_merge_reruns_are_byte_identical(grounded):
    index = json.loads((grounded / "data/grounding/index.json").read_text())
    trees = []
    for _ in range(2):
        scenes, configured = M.merge_groundings(index, "data/grounding", "notes/extra.txt", root=grounded)
        M.write_merge_outputs(scenes, configured, grounded / "m", "both")
        trees.append(_tree(grounded / "m"))
    assert trees[0] == trees[1] and len(trees[0]) == 7


# --------------------------------------------------------------------------- stage entry points


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A copy of the config route with tiny collected episodes, as the stages see a project."""
    from pipeline.grounding.feedback import classify_feedback_lines
    from pipeline.core.io import write_parquet
    from pipeline.core.schemas import episodes_table, turns_table

    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    lines = {0: ["feedback : spatial: 부엌은 초록색이다"], 1: ["feedback : procedural: open Fridge_0 first"]}
    turns = [{"episode_id": "ep_train_s0_q0_0", "turn_index": i, "command": "look", "status": "WiP",
              "feedback_lines": ls, **{f"feedback_{k}": v for k, v in classify_feedback_lines(ls).items()}}
             for i, ls in lines.items()]
    episodes = [{"episode_id": "ep_train_s0_q0_0", "scene_id": "s0", "quest_id": "q0", "objective": "x"}]
    write_parquet(turns_table(turns), tmp_path / "data/episodes/turns.parquet")
    write_parquet(episodes_table(episodes), tmp_path / "data/episodes/episodes.parquet")
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_ground_and_merge_mains_then_a_changed_file_list(project, capsys):
    from pipeline.core import config as C
    from pipeline.stages import ground as S

    assert S.main() == 0
    assert (project / "data/grounding/episode_ep_train_s0_q0_0/grounding_episode_ep_train_s0_q0_0.json").exists()
    metrics = json.loads((project / "metrics/ground.json").read_text())
    assert metrics["num_steps"] == 2 and metrics["steps_with_feedback"] == 2
    assert merge_stage.main() == 0
    md = (project / "data/grounding_merged/s0.md").read_text(encoding="utf-8")
    assert md == "#### Spatial Grounding\n\n- 부엌은 초록색이다.\n\n#### Procedural Grounding\n\n- open Fridge_0 first.\n"
    assert (project / "data/grounding_merged/configured.md").read_text() == ""
    # Edit the file list in conf, recompose (as documented), merge again.
    _write(project / "notes.txt", "Kitchen notes.\n")
    conf = project / "conf/grounding/default.yaml"
    listed = 'files: "data/grounding/grounding_latest.json,notes.txt"  # the option adds files to the schema\'s []\n'
    conf.write_text(conf.read_text() + listed)
    C.compose(project)
    assert merge_stage.main() == 0
    assert (project / "data/grounding_merged/configured.md").read_text(encoding="utf-8") == md.rstrip("\n") + (
        "\n\n---\n\nKitchen notes.\n")
    conf.write_text(conf.read_text().replace('files: "data/grounding/grounding_latest.json,notes.txt"',
                                             'files: "missing.json"'))
    C.compose(project)
    assert merge_stage.main() == 1
    assert "grounding.files: no usable grounding file among: missing.json (missing file)" in capsys.readouterr().err
    assert (project / "data/grounding_merged/configured.md").read_text(encoding="utf-8").endswith("Kitchen notes.\n")


def test_the_in_memory_scene_groundings_are_what_the_ground_and_merge_stages_write(tiny_cfg, tiny_games, tmp_path):
    """``pipeline.grounding.episodes.scene_groundings`` (the model pipeline's demonstrations and the
    studies) is the ``ground`` + ``merge`` stages' ``<scene_id>.md`` of the same episodes, stripped."""
    from omegaconf import OmegaConf

    from pipeline.grounding.episodes import ground, scene_groundings, write_ground_outputs
    from pipeline.session.collection import make_factories
    from pipeline.session.rollout import play, tasks_from_manifest

    cfg = OmegaConf.merge(tiny_cfg, {"agent": {"epsilon": 0.6}})  # mistakes draw the user's feedback
    tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=0)
    make_env, make_agent, make_user = make_factories(cfg, tiny_games.root, dict(tiny_games.scenes))
    records = play(tasks, make_env=make_env, make_agent=make_agent, make_user=make_user, agent_name="react",
                   preference_in_success=True, unknown_feedback="keep")
    episodes, turns = [r["episode"] for r in records], [t for r in records for t in r["turns"]]
    g = cfg.grounding
    write_ground_outputs(ground(episodes, turns, generator="extractive", timestamp=g.timestamp,
                                unknown_type=g.unknown_type), tmp_path / "data" / "grounding", "both")
    index = json.loads((tmp_path / "data/grounding/index.json").read_text())
    scenes, _ = M.merge_groundings(index, "data/grounding", [], root=tmp_path, dedupe_contents=g.dedupe_contents)
    M.write_merge_outputs(scenes, None, tmp_path / "merged", "both")
    in_memory = scene_groundings(g, episodes, turns)
    assert set(in_memory) == set(scenes) and any(in_memory.values())
    for scene, text in in_memory.items():
        assert text == (tmp_path / "merged" / f"{scene}.md").read_text(encoding="utf-8").strip(), scene
