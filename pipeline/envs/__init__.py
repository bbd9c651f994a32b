"""Environments the agents play: the household world (TextWorld games) and ScienceWorld.

    games = build_games(cfg, root)               # the `games` stage: data/games of cfg.env.name's world
    env = make_env(cfg, task, root, scenes)     # the world named by cfg.env.name
    obs = env.reset()                            # the observation dict
    env.facts()                                  # what it shows, as typed facts (pipeline.core.facts)
    obs, reward, done, info = env.step({"action": "open", "target": "Fridge_0"})
    env.admissible                               # the commands admissible now
    env.close()
    reader = fact_reader(cfg)                    # a recorded turn of this world, as typed facts
    reader.read_turn(turn_row).seen

Every environment satisfies the :class:`Env` protocol; :func:`make_env`,
:func:`build_games` and :func:`fact_reader` are the only places that look at
``env.name``. The household world lives in :mod:`pipeline.envs.household` (``env``: the
game adapter, ``world``: the state read from facts and the typed facts of an observation,
``reader``: a recorded turn read as typed facts, ``text``: every sentence that is read back, ``planner``: the expert plan,
``user``: its simulated user, ``games``: building the games). ScienceWorld lives in
:mod:`pipeline.envs.scienceworld` (``engine``: one JVM per process, ``env``: the adapter,
``world``: the object tree's typed facts, ``text``: its sentences, ``commands``: action
dicts <-> commands, ``reader``, ``user``, ``build``: the variations and splits); its
package and Java are optional (``make scienceworld``): importing this module needs neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol

from pipeline.core.conf_schema import Config, EnvName
from pipeline.core.facts import Fact, FactReader, WorldWords
from pipeline.envs.household import build as household_build
from pipeline.envs.household.env import HouseholdEnv
from pipeline.envs.household.reader import HouseholdFactReader
from pipeline.envs.household.text import WORDS as HOUSEHOLD_WORDS
from pipeline.envs.scienceworld import build as scienceworld_build
from pipeline.envs.scienceworld.env import ScienceWorldTaskEnv
from pipeline.envs.scienceworld.reader import ScienceWorldFactReader
from pipeline.envs.scienceworld.text import WORDS as SCIENCEWORLD_WORDS

# The `env.name` values (EnvName) that are the household world (`tiny` is it shrunk for smoke runs).
HOUSEHOLD_ENVS = (EnvName.household, EnvName.tiny)
# The `env.name` values that are ScienceWorld (`scienceworld_tiny`: two short tasks, for tests).
SCIENCEWORLD_ENVS = (EnvName.scienceworld, EnvName.scienceworld_tiny)

__all__ = ["Env", "EnvTask", "HOUSEHOLD_ENVS", "SCIENCEWORLD_ENVS", "build_games", "env_family", "fact_reader",
           "make_env", "scene_preferences", "unread_env_keys"]


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

    def facts(self) -> tuple[Fact, ...]:
        """What the current observation shows, as typed facts (:mod:`pipeline.core.facts`):
        the room, the things in it and their states, what holds what, the exits, what is
        carried. The observation's text is rendered from the same facts."""
        ...

    def step(self, action: Mapping[str, Any]) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Play one action dict (``{"action": verb, "target": ...}``); returns
        ``(observation, reward, done, info)``. An invalid action is a recorded failed
        step (``info["valid"]`` false), never an exception."""
        ...

    def close(self) -> None:
        """Release the game (the env can be reset again later)."""
        ...


def env_family(cfg: Config) -> str:
    """The environment family ``cfg.env.name`` belongs to (``household`` | ``scienceworld``); raises for an unknown name."""
    name = str(cfg.env.name)
    if name in HOUSEHOLD_ENVS:
        return "household"
    if name in SCIENCEWORLD_ENVS:
        return "scienceworld"
    raise ValueError(f"env.name={name!r}: unknown environment, expected one of "
                     f"{', '.join(HOUSEHOLD_ENVS + SCIENCEWORLD_ENVS)}")


def world_words(cfg: Config) -> WorldWords:
    """The words of the world ``cfg.env.name`` names, for the world-agnostic packages' text
    (an advisory's preference principle, the report's definition of success)."""
    return HOUSEHOLD_WORDS if env_family(cfg) == "household" else SCIENCEWORLD_WORDS


def unread_env_keys(cfg: Config) -> tuple[str, ...]:
    """The dotted ``env`` keys the world ``cfg.env.name`` names never reads: left out of the
    config hash that labels its episodes and keys their checkpoints
    (:func:`pipeline.session.collection.collection_hash`), so that adding a world's keys
    leaves another world's episodes and their bytes as they were."""
    if env_family(cfg) == "household":
        return ("env.scienceworld",)
    return ()


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
    if env_family(cfg) == "scienceworld":
        return ScienceWorldTaskEnv(root / task.game_file, scene_id=task.scene_id, quest_id=task.quest_id,
                                   objective=task.objective, max_steps=cfg.env.max_steps,
                                   fresh_jvm=cfg.env.scienceworld.fresh_jvm,
                                   call_timeout_s=cfg.env.scienceworld.call_timeout_s,
                                   heap_mb=cfg.env.scienceworld.jvm_heap_mb)
    return HouseholdEnv(str(root / task.game_file), scene_id=task.scene_id, quest_id=task.quest_id,
                        objective=task.objective, max_steps=cfg.env.max_steps, reward=cfg.env.reward,
                        preferences=scene_preferences(scenes[task.scene_id], task.preferences))


def build_games(cfg: Config, root: Path, *, progress: bool = True) -> household_build.GamesResult:
    """Build the games of the world ``cfg.env`` names into ``root / cfg.paths.games`` (the
    ``games`` stage): its manifest, scene specs and game files, in the format of
    ``docs/contracts.md``.

    Raises:
        ValueError: ``env.name`` names no known environment.
    """
    if env_family(cfg) == "scienceworld":
        return scienceworld_build.build_games(cfg, root, progress=progress)
    return household_build.build_games(cfg, root, progress=progress)


def fact_reader(cfg: Config) -> FactReader:
    """The reader of a recorded turn of the world ``cfg.env`` names, as typed facts (what
    the ``store`` stage builds the memory's scene facts from).

    Raises:
        ValueError: ``env.name`` names no known environment.
    """
    if env_family(cfg) == "scienceworld":
        return ScienceWorldFactReader()
    return HouseholdFactReader()
