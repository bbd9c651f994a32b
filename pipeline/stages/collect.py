"""``collect`` stage: agents play the train quests; the user gives typed feedback.

    python -m pipeline.stages.collect          # what `dvc repro collect` runs
    dvc exp run -S agent=rag                   # collect with another agent

Reads ``data/games`` (manifest + scenes), writes ``data/episodes/{episodes,turns}.parquet``,
``data/episodes/tensors/<episode_id>.pt`` (llm agent) and ``metrics/collect.json``.
Finished episodes are checkpointed under ``.checkpoints/collect/<config hash>/`` so an
interrupted run (SIGKILL, Ctrl-C) resumes where it stopped.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from pipeline.config import ConfigError, config_hash, load_params, project_root
from pipeline.episodes import TENSORS_DIR, statistics, write_episodes
from pipeline.io import ArtifactError, atomic_write_json, read_json, read_parquet, sha256_file
from pipeline.rollout import Checkpoints, Task, play, tasks_from_manifest

# Config subtrees whose change invalidates checkpointed episodes.
CHECKPOINT_KEYS = ("seed", "env", "user", "agent", "model", "sampling", "prompts", "grounding.unknown_type")


def load_games(root: Path, cfg: DictConfig) -> tuple[list[dict], dict]:
    games = root / cfg.paths.games
    manifest = read_parquet(games / "manifest.parquet").to_pylist()
    scenes = read_json(games / "scenes.json")
    return manifest, scenes


def make_factories(cfg: DictConfig, root: Path, scenes: dict, *, feedback_source: Any = None):
    """Environment, agent and user constructors for one task each."""
    from pipeline.agents import make_agent
    from pipeline.env import HouseholdEnv
    from pipeline.user import SimulatedUser

    shared: dict = {}

    def make_env(task: Task):
        return HouseholdEnv(str(root / task.game_file), scene_id=task.scene_id, quest_id=task.quest_id,
                            objective=task.objective, max_steps=cfg.env.max_steps, reward=cfg.env.reward,
                            preferences=_scene_preferences(scenes, task))

    def make_agent_for(task: Task):
        return make_agent(cfg, seed=task.seed, shared=shared)

    def make_user(task: Task):
        if feedback_source is not None:
            return feedback_source.for_episode(task.episode_id, scenes[task.scene_id], task)
        return SimulatedUser(cfg.user, scenes[task.scene_id], {"quest_id": task.quest_id,
                             "objective": task.objective, "expert_plan": task.expert_plan,
                             "preferences": task.preferences}, task.seed)

    return make_env, make_agent_for, make_user


def _scene_preferences(scenes: dict, task: Task) -> list[dict]:
    prefs = scenes[task.scene_id].get("preferences", [])
    return [p for p in prefs if p["id"] in set(task.preferences)]


def run_collection(cfg: DictConfig, root: Path, tasks: list[Task], out_dir: Path, *, scenes: dict,
                   ckpt_name: str, desc: str, feedback_source: Any = None) -> tuple[list[dict], dict]:
    """Play ``tasks`` with checkpoints, write the collection to ``out_dir``; return (records, stats)."""
    manifest_hash = sha256_file(root / cfg.paths.games / "manifest.parquet")[:16]
    ckpt_root = root / cfg.paths.checkpoints / ckpt_name / f"{config_hash(cfg, *CHECKPOINT_KEYS)}-{manifest_hash}"
    ckpts = Checkpoints(ckpt_root)
    for t in tasks:  # provenance: which config produced the episode (the store records it)
        t.metadata.setdefault("config_hash", config_hash(cfg, *CHECKPOINT_KEYS))
    make_env, make_agent_for, make_user = make_factories(cfg, root, scenes, feedback_source=feedback_source)
    model_name = str(cfg.model.name_or_path or "") if cfg.agent.name == "llm" else ""
    t0 = time.perf_counter()
    try:
        with tqdm(total=len(tasks), desc=desc, unit="ep", file=sys.stderr) as bar:
            records = play(tasks, make_env=make_env, make_agent=make_agent_for, make_user=make_user,
                           batch_size=cfg.agent.batch_size if cfg.agent.batched else 1, checkpoints=ckpts,
                           agent_name=str(cfg.agent.name), model_name=model_name,
                           preference_in_success=cfg.user.preference_in_success,
                           unknown_feedback=str(cfg.grounding.unknown_type), progress=bar)
    except KeyboardInterrupt:
        kept = len(list(ckpt_root.glob("*.json")))
        print(f"\ninterrupted: {kept} of {len(tasks)} finished episodes kept in {ckpt_root}; "
              "rerun the stage to finish the rest", file=sys.stderr)
        raise SystemExit(130)
    wall = time.perf_counter() - t0
    episodes = [r["episode"] for r in records]
    turns = [t for r in records for t in r["turns"]]
    write_episodes(out_dir, episodes, turns)
    tensor_dir = out_dir / TENSORS_DIR
    if tensor_dir.exists():
        shutil.rmtree(tensor_dir)
    with_tensors = [r for r in records if r["tensors"]]
    if with_tensors:
        from pipeline.llm.tensors import save_episode_tensors

        for r in with_tensors:
            save_episode_tensors(tensor_dir / f"{r['episode']['episode_id']}.pt", r["tensors"])
    stats = statistics(episodes, turns)
    stats["wall_time_s"] = round(wall, 3)
    stats["steps_per_s"] = round(len(turns) / wall, 3) if wall > 0 else 0.0
    shutil.rmtree(ckpt_root, ignore_errors=True)
    return records, stats


def main() -> int:
    try:
        cfg = load_params()
        root = project_root()
        manifest, scenes = load_games(root, cfg)
        feedback_source = None
        if cfg.user.source == "file":
            from pipeline.user import FileFeedback

            feedback_source = FileFeedback(root / cfg.user.feedback_file, cfg.user)
        tasks = tasks_from_manifest(manifest, split="train", master_seed=cfg.seed)
        if not tasks:
            raise ConfigError("the games manifest has no train quests (env.train_quests_per_scene=0?)")
        out_dir = root / cfg.paths.episodes
        _, stats = run_collection(cfg, root, tasks, out_dir, scenes=scenes, ckpt_name="collect",
                                  desc=f"collect [{cfg.agent.name}]", feedback_source=feedback_source)
        atomic_write_json(root / cfg.paths.metrics / "collect.json", stats)
        print(f"collected {stats['num_episodes']} episodes ({stats['num_turns']} turns) -> {out_dir}; "
              f"success {stats['success_rate']:.2f}, repeated-action rate {stats['repeated_action_rate']:.2f}")
    except (ConfigError, ArtifactError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
