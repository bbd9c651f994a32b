"""Seed 000's online loop in collection (:mod:`pipeline.session.online`): a scene's k-th
episode is prompted with the grounding its episodes 1..k-1 produced."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.session.online import play_online, rounds
from pipeline.session.rollout import Task

ROOT = Path(__file__).resolve().parents[1]


def _task(scene: str, quest: str) -> Task:
    return Task(episode_id=f"ep_{scene}_{quest}", scene_id=scene, quest_id=quest, split="train",
                objective=f"Put Apple_0 in Fridge_0 ({scene} {quest}).", game_file="", expert_plan=[],
                preferences=[], seed=1)


def _record(task: Task) -> dict:
    """What playing ``task`` returns: the user told the agent where the key is."""
    turn = {"episode_id": task.episode_id, "turn_index": 0, "command": "open fridge_0", "action": "open",
            "status": "Failure", "feedback_lines": [f"spatial: the key of {task.scene_id} is in Drawer_{task.quest_id}"],
            "feedback_spatial": f"the key of {task.scene_id} is in Drawer_{task.quest_id}",
            "feedback_user_preference": None, "feedback_procedural": None, "feedback_general": None}
    ep = {"episode_id": task.episode_id, "scene_id": task.scene_id, "quest_id": task.quest_id,
          "objective": task.objective}
    return {"episode": ep, "turns": [turn], "tensors": []}


def test_each_episode_sees_the_grounding_of_its_scenes_earlier_episodes(tiny_cfg, tmp_path):
    cfg = OmegaConf.merge(tiny_cfg, {"agent": {"name": "llm"}})
    tasks = [_task("s0", "0"), _task("s0", "1"), _task("s0", "2"), _task("s1", "0"), _task("s1", "1")]
    assert [[t.episode_id for t in r] for r in rounds(tasks)] == [
        ["ep_s0_0", "ep_s1_0"], ["ep_s0_1", "ep_s1_1"], ["ep_s0_2"]]
    seen: dict[str, str | None] = {}

    def play_round(batch: list[Task]) -> list[dict]:
        for t in batch:
            seen[t.episode_id] = t.system_prompt
        return [_record(t) for t in batch]

    records = play_online(cfg, ROOT, tasks, play_round, tmp_path)
    assert [r["episode"]["episode_id"] for r in records] == [t.episode_id for t in tasks]
    assert seen["ep_s0_0"] is None and seen["ep_s1_0"] is None  # first of its scene: the default prompt
    assert "the key of s0 is in Drawer_0" in seen["ep_s0_1"] and "Drawer_1" not in seen["ep_s0_1"]
    assert "the key of s0 is in Drawer_0" in seen["ep_s0_2"] and "the key of s0 is in Drawer_1" in seen["ep_s0_2"]
    assert "the key of s0" not in seen["ep_s1_1"]  # no other scene's grounding
    assert "the key of s1 is in Drawer_0" in seen["ep_s1_1"]
    assert str(tmp_path) not in seen["ep_s0_2"]  # the prompt shows content, never where it was written
    # Deterministic: the same records give the same prompts.
    again: dict[str, str | None] = {}

    def replay(batch: list[Task]) -> list[dict]:
        for t in batch:
            again[t.episode_id] = t.system_prompt
        return [_record(t) for t in batch]

    play_online(cfg, ROOT, [_task(t.scene_id, t.quest_id) for t in tasks], replay, tmp_path / "b")
    assert again == seen


def test_rule_agents_and_the_switch_leave_collection_unchanged(tiny_cfg):
    from pipeline.session.collection import online_loop

    assert online_loop(OmegaConf.merge(tiny_cfg, {"agent": {"name": "llm"}}))
    assert not online_loop(OmegaConf.merge(tiny_cfg, {"agent": {"name": "llm"}, "grounding": {"online": False}}))
    assert not online_loop(tiny_cfg)  # react reads no prompt
    assert not online_loop(OmegaConf.merge(tiny_cfg, {"agent": {"name": "rag"}}))
    # the rule agents that read their prompt: a trial learns from the grounding of the scene's earlier ones
    assert online_loop(OmegaConf.merge(tiny_cfg, {"agent": {"name": "trial"}}))
    assert online_loop(OmegaConf.merge(tiny_cfg, {"agent": {"name": "reader"}}))


def test_tasks_with_a_rendered_prompt_are_refused(tiny_cfg, tmp_path):
    cfg = OmegaConf.merge(tiny_cfg, {"agent": {"name": "llm"}})
    tasks = [_task("s0", "0"), _task("s0", "1")]
    tasks[1].system_prompt = "rendered for C2"
    with pytest.raises(ValueError, match="ep_s0_1.*would replace it"):
        play_online(cfg, ROOT, tasks, lambda batch: [_record(t) for t in batch], tmp_path)


def test_evaluation_plays_every_task_with_its_rendered_prompt(tiny_games, tmp_path, monkeypatch):
    """The online loop is collect's: under it (``grounding.online``, the default for the llm
    agent), a scene's 2nd eval task would get a prompt of earlier episodes' grounding and
    lose its condition's memory block. Each task must reach the model as ``render`` wrote it."""
    import pyarrow as pa

    from pipeline.core.config import compose_text, validate
    from pipeline.core.io import read_parquet, write_parquet
    from pipeline.memory.store import STORE_HASH
    from pipeline.session.evaluation import evaluate_condition
    from reliability.helpers import FakeOpenAI

    monkeypatch.setenv("ONLINE_TEST_KEY", "k")
    root = tmp_path / "project"  # the shared games, and the real conf/ (templates) the online loop would use
    games_rel = tiny_games.games_dir.relative_to(tiny_games.root)
    (root / games_rel).parent.mkdir(parents=True)
    (root / games_rel).symlink_to(tiny_games.games_dir)
    (root / "conf").symlink_to(ROOT / "conf")
    with FakeOpenAI() as server:
        cfg = validate(OmegaConf.create(compose_text(ROOT, [
            "env.num_scenes=2", "env.heldout_scenes=1", "env.rooms_per_scene=2", "env.containers_per_scene=2",
            "env.locked_containers=1", "env.supporters_per_scene=1", "env.objects_per_scene=2",
            "env.train_quests_per_scene=2", "env.eval_quests_per_scene=1", "env.max_steps=2",
            "agent=llm", "model=openai", "sampling=greedy", f"model.base_url={server.url}",
            "model.api_model=fake-model", "model.api_key_env=ONLINE_TEST_KEY", "experiment.eval_split=train",  # 2 tasks in scene_00
            f"paths.prompts={tmp_path / 'prompts'}", f"paths.store={tmp_path / 'store'}",
            f"paths.eval={tmp_path / 'eval'}"])))
        assert cfg.grounding.online  # the switch collect uses is on
        rows = [r for r in tiny_games.rows if r["split"] == "train"]
        assert len({r["scene_id"] for r in rows}) < len(rows)  # a scene with 2 tasks: the loop's 2nd round
        (tmp_path / "store").mkdir()
        (tmp_path / "store" / STORE_HASH).write_text("h0\n")
        prompts = [{"scene_id": r["scene_id"], "quest_id": r["quest_id"], "store_hash": "h0", "gate_ok": True,
                    "system_prompt": f"MARKER {r['scene_id']}/{r['quest_id']}: {r['objective']}"} for r in rows]
        write_parquet(pa.Table.from_pylist(prompts), tmp_path / "prompts" / "C2.parquet")
        _, _, out_dir = evaluate_condition(cfg, root, "C2")
    systems = [body["messages"][0]["content"] for _, body in server.requests]
    assert len(systems) >= len(rows) and all(s.startswith("MARKER ") for s in systems)
    assert {s.split(":")[0] for s in systems} == {f"MARKER {p['scene_id']}/{p['quest_id']}" for p in prompts}
    assert read_parquet(out_dir / "episodes.parquet").num_rows == len(rows)


def _play_real(cfg, games, tmp_path, name: str, resumed: bool = False) -> dict[str, str | None]:
    """The tiny world's train tasks played through the online loop by real agents, env and user;
    each episode's system prompt as the agent got it. ``resumed``: every record as a resumed run
    reads it back from its checkpoint (a JSON file)."""
    import json

    from pipeline.session.collection import make_factories
    from pipeline.session.rollout import play, tasks_from_manifest

    tasks = tasks_from_manifest(games.rows, split="train", master_seed=int(cfg.seed))
    make_env, make_agent, make_user = make_factories(cfg, games.root, dict(games.scenes))
    seen: dict[str, str | None] = {}

    def play_round(batch: list[Task]) -> list[dict]:
        for t in batch:
            seen[f"{t.scene_id}/{t.quest_id}"] = t.system_prompt
        records = play(batch, make_env=make_env, make_agent=make_agent, make_user=make_user, batch_size=1,
                       agent_name=str(cfg.agent.name))
        return [json.loads(json.dumps(r, sort_keys=True)) for r in records] if resumed else records

    play_online(cfg, ROOT, tasks, play_round, tmp_path / name)
    return seen


def test_the_online_memory_shows_each_trial_the_memory_of_the_episodes_before_it(tiny_cfg, tiny_games, tmp_path):
    """``grounding.online_memory=C2``: a scene's 2nd episode is prompted with C2's memory block
    from a store of the 1st round's episodes (what the render stage would show with that store);
    null: no block, the prompts as before."""
    from pipeline.conditions.sources import memory_slot
    from pipeline.core.schemas import episodes_table, turns_table
    from pipeline.envs import fact_reader, world_words
    from pipeline.memory.build import build_store
    from pipeline.session.collection import make_factories
    from pipeline.session.rollout import play, tasks_from_manifest

    base = OmegaConf.merge(tiny_cfg, {"agent": {"name": "reader"}, "env": {"max_steps": 6}})
    plain = _play_real(base, tiny_games, tmp_path, "plain")
    cfg = OmegaConf.merge(base, {"grounding": {"online_memory": "C2"}})
    told = _play_real(cfg, tiny_games, tmp_path, "told")
    tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=int(cfg.seed))
    first, second = rounds(tasks)[0], rounds(tasks)[1]
    assert all(told[f"{t.scene_id}/{t.quest_id}"] is None for t in first)  # nothing played before: the default prompt
    # the store of round 1, built here as the store stage builds it, and C2's block as render retrieves it
    make_env, make_agent, make_user = make_factories(cfg, tiny_games.root, dict(tiny_games.scenes))
    played = play(list(first), make_env=make_env, make_agent=make_agent, make_user=make_user, batch_size=1,
                  agent_name="reader")
    store = build_store(episodes_table([r["episode"] for r in played]), turns_table([t for r in played for t in r["turns"]]),
                        reader=fact_reader(cfg), splits=None, config_hash=None, tie_seed=int(cfg.seed))
    for t in second:
        key = f"{t.scene_id}/{t.quest_id}"
        row = {"scene_id": t.scene_id, "quest_id": t.quest_id, "split": t.split, "objective": t.objective,
               "expert_plan": list(t.expert_plan)}
        block = memory_slot(store, row, cfg.condition.C2, cfg.memory, rng=int(cfg.seed), name="C2",
                            words=world_words(cfg), facts=fact_reader(cfg)).injected_block_text
        assert block.strip(), f"{key}: C2 retrieves nothing from round 1's store"
        assert block in told[key] and block not in (plain[key] or "")
        assert plain[key] is not None and told[key] != plain[key]  # the grounding is in both
    assert _play_real(cfg, tiny_games, tmp_path, "again") == told  # the same records, the same prompts
    assert _play_real(cfg, tiny_games, tmp_path, "resumed", resumed=True) == told  # read back from checkpoints


def test_the_online_memory_keys_label_episodes_only_when_it_is_on(tiny_cfg):
    """Null changes no episode's hash (every recorded collection keeps its label); on, the memory
    and condition sections decide what an episode is, so a memory edit is another collection."""
    from pipeline.session.collection import collection_hash

    def h(**over):
        return collection_hash(OmegaConf.merge(tiny_cfg, over))

    assert h(memory={"topk": 2}) == h()  # off: the memory is no input of a collection
    on = {"grounding": {"online_memory": "C2"}}
    assert h(**on) != h()
    assert h(**on, memory={"topk": 2}) != h(**on)


def test_an_online_memory_that_names_no_condition_is_refused(tiny_cfg, tmp_path):
    from pipeline.core.config import ConfigError

    cfg = OmegaConf.merge(tiny_cfg, {"agent": {"name": "reader"}, "grounding": {"online_memory": "C9"}})
    with pytest.raises(ConfigError, match="online_memory='C9'.*not a configured condition"):
        play_online(cfg, ROOT, [_task("s0", "0")], lambda batch: [_record(t) for t in batch], tmp_path)
