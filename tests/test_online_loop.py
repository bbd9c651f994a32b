"""Seed 000's online loop in collection (:mod:`pipeline.session.online`): a scene's k-th
episode is prompted with the grounding its episodes 1..k-1 produced."""

from __future__ import annotations

from pathlib import Path

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
