"""The household world as the registry knows it (:mod:`pipeline.envs.registry`)::

    WORLD.make_env(cfg, task, root, scenes)     # a HouseholdEnv on the task's compiled game
    WORLD.build_games(cfg, root, progress=False)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pipeline.core.conf_schema import Config
from pipeline.envs.common import WorldDescriptor, scene_preferences
from pipeline.envs.household.build import build_games
from pipeline.envs.household.env import HouseholdEnv
from pipeline.envs.household.reader import HouseholdFactReader
from pipeline.envs.household.text import WORDS
from pipeline.envs.household.user import SimulatedUser


def make_env(cfg: Config, task: Any, root: Path, scenes: Mapping[str, Mapping[str, Any]]) -> HouseholdEnv:
    """The household env of one episode: the task's compiled game, its scene's preferences."""
    return HouseholdEnv(str(root / task.game_file), scene_id=task.scene_id, quest_id=task.quest_id,
                        objective=task.objective, max_steps=cfg.env.max_steps, reward=cfg.env.reward,
                        preferences=scene_preferences(scenes[task.scene_id], task.preferences))


WORLD = WorldDescriptor(
    names=("household", "tiny"),  # `tiny`: the same world shrunk for smoke runs (conf/env/tiny.yaml)
    family="household",
    make_env=make_env,
    build_games=build_games,
    fact_reader=HouseholdFactReader,
    words=WORDS,
    make_user=SimulatedUser,
    unread_env_keys=("env.scienceworld",),
)
