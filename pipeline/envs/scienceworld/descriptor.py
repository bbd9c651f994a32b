"""ScienceWorld as the registry knows it (:mod:`pipeline.envs.registry`). Importing it needs
neither the ``scienceworld`` package nor Java: the engine starts in an env's ``reset``
(:mod:`pipeline.envs.scienceworld.engine`)::

    WORLD.make_env(cfg, task, root, scenes)     # a ScienceWorldTaskEnv on the task's variation spec
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pipeline.core.conf_schema import Config
from pipeline.envs.common import WorldDescriptor
from pipeline.envs.scienceworld.build import build_games
from pipeline.envs.scienceworld.env import ScienceWorldTaskEnv
from pipeline.envs.scienceworld.reader import ScienceWorldFactReader
from pipeline.envs.scienceworld.text import WORDS
from pipeline.envs.scienceworld.user import SimulatedUser


def make_env(cfg: Config, task: Any, root: Path, scenes: Mapping[str, Mapping[str, Any]]) -> ScienceWorldTaskEnv:
    """The env of one episode: the task's variation spec, played in a JVM as ``env.scienceworld`` sets."""
    return ScienceWorldTaskEnv(root / task.game_file, scene_id=task.scene_id, quest_id=task.quest_id,
                               objective=task.objective, max_steps=cfg.env.max_steps,
                               fresh_jvm=cfg.env.scienceworld.fresh_jvm,
                               call_timeout_s=cfg.env.scienceworld.call_timeout_s,
                               heap_mb=cfg.env.scienceworld.jvm_heap_mb,
                               start_timeout_s=cfg.env.scienceworld.start_timeout_s)


WORLD = WorldDescriptor(
    names=("scienceworld", "scienceworld_tiny"),  # `scienceworld_tiny`: two short tasks, for tests
    family="scienceworld",
    make_env=make_env,
    build_games=build_games,
    fact_reader=ScienceWorldFactReader,
    words=WORDS,
    make_user=SimulatedUser,
    unread_env_keys=(),
)
