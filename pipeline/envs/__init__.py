"""Environments the agents play: today the household world (TextWorld games).

    games = build_games(cfg, root)               # the `games` stage: data/games of cfg.env.name's world
    env = make_env(cfg, task, root, scenes)     # the world named by cfg.env.name
    obs = env.reset()                            # the observation dict
    obs, reward, done, info = env.step({"action": "open", "target": "Fridge_0"})
    env.admissible                               # the commands admissible now
    env.close()

Every environment satisfies the :class:`Env` protocol; :func:`make_env` and
:func:`build_games` are the only places that look at ``env.name``. The household world lives in :mod:`pipeline.envs.household`
(``env``: the game adapter, ``world``: the state read from facts, ``planner``: the expert
plan, ``user``: its simulated user, ``games``: building the games).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol

from pipeline.core.conf_schema import Config
from pipeline.envs.household import build as household_build
from pipeline.envs.household.env import HouseholdEnv

# conf/env/*.yaml `name:` values of the household world (`tiny` is it shrunk for smoke runs).
HOUSEHOLD_ENVS = ("household", "tiny")

__all__ = ["Env", "EnvTask", "HOUSEHOLD_ENVS", "build_games", "make_env", "scene_preferences"]


class EnvTask(Protocol):
    """What :func:`make_env` reads of an episode's task (a :class:`pipeline.session.rollout.Task`)."""

    scene_id: str
    quest_id: str
    objective: str
    game_file: str  # relative to the project root
    preferences: list[str]  # ids of the scene preferences the quest keeps


class Env(Protocol):
    """What a session needs from an environment: reset, one action per step, close.

    Attributes:
        admissible: the game commands admissible now (``obs["admissible_commands"]``).
    """

    admissible: list[str]

    def reset(self) -> dict[str, Any]:
        """Start (or restart) the episode; returns the first observation dict
        (``agent_location``, ``visible_entities``, ``description``, ``objective``,
        ``admissible_commands``, ``admissible_actions``, ``step``, ``max_steps``, ...)."""
        ...

    def step(self, action: Mapping[str, Any]) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Play one action dict (``{"action": verb, "target": ...}``); returns
        ``(observation, reward, done, info)``. An invalid action is a recorded failed
        step (``info["valid"]`` false), never an exception."""
        ...

    def close(self) -> None:
        """Release the game (the env can be reset again later)."""
        ...


def scene_preferences(scene: Mapping[str, Any], ids: list[str]) -> list[dict]:
    """The scene's preference specs whose ids a quest keeps (scene order)."""
    return [p for p in scene.get("preferences", []) if p["id"] in set(ids)]


def make_env(cfg: Config, task: EnvTask, root: Path, scenes: Mapping[str, Mapping[str, Any]]) -> Env:
    """The environment of one episode, as ``cfg.env`` configures it.

    Args:
        cfg: the composed config (``env.name``, ``env.max_steps``, ``env.reward``).
        task: the episode's task (game file relative to ``root``, scene, quest, objective,
            preference ids).
        root: the project root.
        scenes: ``{scene_id: scene spec}`` (``scenes.json``).

    Raises:
        ValueError: ``env.name`` names no known environment.
    """
    name = str(cfg.env.name)
    if name in HOUSEHOLD_ENVS:
        return HouseholdEnv(str(root / task.game_file), scene_id=task.scene_id, quest_id=task.quest_id,
                            objective=task.objective, max_steps=cfg.env.max_steps, reward=cfg.env.reward,
                            preferences=scene_preferences(scenes[task.scene_id], task.preferences))
    raise ValueError(f"env.name={name!r}: unknown environment, expected one of {', '.join(HOUSEHOLD_ENVS)}")


def build_games(cfg: Config, root: Path, *, progress: bool = True) -> household_build.GamesResult:
    """Build the games of the world ``cfg.env`` names into ``root / cfg.paths.games`` (the
    ``games`` stage): its manifest, scene specs and game files, in the format of
    ``docs/contracts.md``.

    Raises:
        ValueError: ``env.name`` names no known environment.
    """
    name = str(cfg.env.name)
    if name in HOUSEHOLD_ENVS:
        return household_build.build_games(cfg, root, progress=progress)
    raise ValueError(f"env.name={name!r}: unknown environment, expected one of {', '.join(HOUSEHOLD_ENVS)}")
