"""The collection loop and the collect stage's storage: round trip, determinism, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.session.episodes import EpisodeStore, statistics, write_episodes
from pipeline.core.io import ArtifactError
from pipeline.core.seeding import task_seed
from pipeline.session.rollout import Checkpoints, format_episode_id, play, tasks_from_manifest
from pipeline.session.collection import make_factories, run_collection


def _collect(cfg, games, out: Path, **kw):
    tasks = tasks_from_manifest(games.rows, split="train", master_seed=cfg.seed)
    return run_collection(cfg, games.root, tasks, out, scenes=games.scenes, ckpt_name="test", desc="t", **kw)


def test_collect_round_trip_and_statistics(tiny_cfg, tiny_games, tmp_path):
    records, stats = _collect(tiny_cfg, tiny_games, tmp_path / "ep")
    store = EpisodeStore(tmp_path / "ep")
    eps = list(store.iter_episodes())
    assert [e["episode_id"] for e in eps] == sorted(r["episode"]["episode_id"] for r in records)
    for ep in eps:
        turns = store.load_turns(ep["episode_id"])
        assert [t["turn_index"] for t in turns] == list(range(ep["num_turns"]))
        assert ep["won"] == turns[-1]["won"]  # success is `won`, recorded from the last step
        assert all(t["status"] in ("Success", "Failure", "WiP") for t in turns)
        obs = json.loads(turns[0]["observation"])
        assert obs["agent_location"] and obs["available_actions"] and obs["objective"] == ep["objective"]
        assert json.loads(ep["metadata"])["config_hash"]
    assert stats["num_episodes"] == len(eps) and 0 <= stats["success_rate"] <= 1
    assert pq.read_metadata(tmp_path / "ep" / "turns.parquet").metadata[b"schema_version"] == b"1"
    with pytest.raises(KeyError, match="nope"):
        store.load_turns("nope")
    with pytest.raises(ArtifactError, match="no tensors"):
        store.load_tensors(eps[0]["episode_id"])  # rule agents store none


def test_same_config_gives_byte_identical_parquet(tiny_cfg, tiny_games, tmp_path):
    _collect(tiny_cfg, tiny_games, tmp_path / "a")
    _collect(tiny_cfg, tiny_games, tmp_path / "b")
    for name in ("episodes.parquet", "turns.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_task_seeds_ignore_condition_and_order(tiny_games):
    a = tasks_from_manifest(tiny_games.rows, split="eval", master_seed=3, condition="C1")
    b = tasks_from_manifest(list(reversed(tiny_games.rows)), split="eval", master_seed=3, condition="C2")
    assert [(t.episode_id, t.seed) for t in a] == [(t.episode_id, t.seed) for t in b]
    assert task_seed(3, "s", "q", 0) != task_seed(4, "s", "q", 0)


def test_episode_ids_are_spelled_in_one_place(tiny_games):
    """A task's episode id is :func:`format_episode_id` of its split, scene, quest and repeat
    (the policy's rule-agent episodes in generated houses are named by it too)."""
    assert format_episode_id("train", "scene_00", "q01", 2) == "ep_train_scene_00_q01_2"
    tasks = tasks_from_manifest(tiny_games.rows, split="eval", master_seed=3, repeats=2)
    assert tasks and all(t.episode_id == format_episode_id("eval", t.scene_id, t.quest_id, int(t.episode_id[-1]))
                         for t in tasks)


def test_finished_episodes_are_not_replayed(tiny_cfg, tiny_games, tmp_path):
    tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=0)
    make_env, make_agent, make_user = make_factories(tiny_cfg, tiny_games.root, tiny_games.scenes)
    ckpts = Checkpoints(tmp_path / "ckpt")
    first = play(tasks[:1], make_env=make_env, make_agent=make_agent, make_user=make_user, checkpoints=ckpts)
    calls = []

    def counting_env(task):
        calls.append(task.episode_id)
        return make_env(task)

    both = play(tasks[:2], make_env=counting_env, make_agent=make_agent, make_user=make_user, checkpoints=ckpts)
    assert calls == [tasks[1].episode_id]
    assert both[0] == json.loads(json.dumps(first[0]))


def test_unknown_agent_name_is_a_clear_error(tiny_cfg):
    from omegaconf import OmegaConf

    from pipeline.agents import make_agent
    from pipeline.core.config import ConfigError, validate

    raw = OmegaConf.to_container(tiny_cfg, enum_to_str=True)
    raw["agent"]["name"] = "wizard"
    with pytest.raises(ConfigError, match="agent.name"):
        validate(OmegaConf.create(raw))  # what every stage runs on params.yaml
    with pytest.raises(ValueError, match="agent.name='wizard'"):
        make_agent(raw, seed=0)


def test_missing_game_file_is_a_clear_error(tiny_cfg, tiny_games, tmp_path):
    tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=0)[:1]
    tasks[0].game_file = "data/games/nowhere/q.z8"
    with pytest.raises(ArtifactError, match="nowhere/q.z8"):
        run_collection(tiny_cfg, tiny_games.root, tasks, tmp_path / "x", scenes=tiny_games.scenes,
                       ckpt_name="t", desc="t")


def test_unwritable_output_dir_is_a_clear_error_and_keeps_old_files(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    (out / "episodes.parquet").write_bytes(b"old")
    out.chmod(0o500)
    try:
        if (out / "probe").exists() or _writable(out):
            pytest.skip("running as a user that ignores directory permissions")
        with pytest.raises(ArtifactError, match=str(out)):
            write_episodes(out, [], [])
        assert (out / "episodes.parquet").read_bytes() == b"old"
    finally:
        out.chmod(0o700)


def test_output_path_blocked_by_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "blocker").write_text("not a folder")
    with pytest.raises(ArtifactError, match="blocker"):
        write_episodes(tmp_path / "blocker" / "episodes", [], [])


def _writable(folder: Path) -> bool:
    try:
        (folder / ".w").write_text("x")
        (folder / ".w").unlink()
        return True
    except OSError:
        return False


def test_statistics_on_known_rows():
    eps = [{"won": True, "is_correct": True, "final_reward": 1.0}, {"won": False, "is_correct": False,
                                                                       "final_reward": 0.0}]
    turns = [{"action_valid": True, "repeated": False, "feedback_lines": ["a"]},
             {"action_valid": False, "repeated": True, "feedback_lines": []}]
    s = statistics(eps, turns)
    assert s["success_rate"] == 0.5 and s["invalid_action_rate"] == 0.5 and s["repeated_action_rate"] == 0.5


def test_sharded_collection_merges_to_the_same_bytes(tiny_cfg, tiny_games, tmp_path):
    from pipeline.core.config import ConfigError
    from pipeline.session.collection import collect_shard, merge_shards, parse_shard

    _collect(tiny_cfg, tiny_games, tmp_path / "whole")
    tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=tiny_cfg.seed)
    shards = [tmp_path / f"s{k}" for k in range(2)]
    for k, d in enumerate(shards):
        collect_shard(tiny_cfg, tiny_games.root, tasks, k, 2, d, scenes=tiny_games.scenes)
    assert {p.name for p in shards[0].iterdir()} >= {"episodes.parquet", "turns.parquet", "shard.json"}
    stats = merge_shards(tiny_cfg, tasks, list(reversed(shards)), tmp_path / "merged")
    assert stats["shards"] == 2 and stats["num_episodes"] == len(tasks)
    for name in ("episodes.parquet", "turns.parquet"):  # rule agent: the very same bytes
        assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()

    with pytest.raises(ArtifactError, match=r"shards missing: \[1\]"):
        merge_shards(tiny_cfg, tasks, shards[:1], tmp_path / "m2")
    with pytest.raises(ArtifactError, match="given twice"):
        merge_shards(tiny_cfg, tasks, [shards[0], shards[0]], tmp_path / "m3")
    other = tiny_cfg.copy()
    other.seed = int(tiny_cfg.seed) + 1
    with pytest.raises(ArtifactError, match="another config"):
        merge_shards(other, tasks, shards, tmp_path / "m4")
    assert not (tmp_path / "m2").exists() and not (tmp_path / "m4").exists()  # nothing half-written
    for bad in ("2/2", "1", "a/3", "-1/2"):
        with pytest.raises(ConfigError, match="expected K/N"):
            parse_shard(bad)
    assert parse_shard("1/4") == (1, 4)
