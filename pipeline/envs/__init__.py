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

Every environment satisfies the :class:`Env` protocol. A world is one
:class:`~pipeline.envs.common.WorldDescriptor` registered in :mod:`pipeline.envs.registry`;
:func:`make_env`, :func:`build_games`, :func:`fact_reader`, :func:`world_words`,
:func:`unread_env_keys` (and :func:`pipeline.users.make_user`) look it up by ``env.name``, and
an unknown name fails with a ValueError listing the known ones. What the worlds share (the
user's :class:`~pipeline.envs.common.StepFeedback`, :func:`~pipeline.envs.common.step_status`,
:class:`~pipeline.envs.common.GamesResult`, the env lifecycle) is :mod:`pipeline.envs.common`.
The household world lives in :mod:`pipeline.envs.household` (``env``: the
game adapter, ``world``: the state read from facts and the typed facts of an observation,
``reader``: a recorded turn read as typed facts, ``text``: every sentence that is read back, ``planner``: the expert plan,
``user``: its simulated user, ``games``: building the games, ``descriptor``: its registry entry). ScienceWorld lives in
:mod:`pipeline.envs.scienceworld` (``engine``: one JVM per process, ``env``: the adapter,
``world``: the object tree's typed facts, ``text``: its sentences, ``commands``: action
dicts <-> commands, ``reader``, ``user``, ``build``: the variations and splits, ``descriptor``); its
package and Java are optional (``make scienceworld``): importing this module needs neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol

from pipeline.core.conf_schema import Config
from pipeline.core.facts import Fact, FactReader, WorldWords
from pipeline.envs.common import GamesResult, scene_preferences
from pipeline.envs.registry import world_of

__all__ = ["Env", "EnvTask", "build_games", "env_family", "fact_reader", "make_env", "scene_preferences",
           "unread_env_keys", "world_words"]


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

    The ``info`` of :meth:`step` is the step's record. Every world fills these keys, which
    the users read (:func:`pipeline.envs.common.step_status`, the simulated users,
    :class:`pipeline.users.file.FileFeedback`) and the session records:

    - ``command`` (str | None): the command played; None for an invalid action or a wait.
    - ``valid`` (bool): the action was understood and played (false: a recorded failed step).
    - ``won`` / ``lost`` (bool): the task is solved / can no longer be solved.
    - ``expert_plan`` (list[str] | None): the commands left to solve it from here (a
      planner's, or the rest of a gold sequence); None when the world has none.
    - ``solvable`` (bool | None): false when no plan exists from here (``expert_plan`` is
      then ``[]`` and no progress); None when the world does not know.
    - ``repeated`` (bool): the action repeated one that changed nothing.
    - ``env_feedback`` (str), ``changed`` (bool), ``reward_parts`` (dict), ``step`` (int),
      ``truncated`` (bool), and ``error`` (str) for a malformed action.

    A world may add its own (the household: ``facts``, ``preferences``, ``preferences_ok``;
    ScienceWorld: ``score``, ``next_places``, ``disambiguated``).
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
        ``(observation, reward, done, info)`` (``info``: the keys of the class docstring). An
        invalid action is a recorded failed step (``info["valid"]`` false), never an exception."""
        ...

    def close(self) -> None:
        """Release the game (the env can be reset again later)."""
        ...


def env_family(cfg: Config) -> str:
    """The world ``cfg.env.name`` belongs to (``household`` | ``scienceworld`` | a registered
    one's family); raises ValueError, listing the known names, for an unknown name."""
    return world_of(cfg).family


def world_words(cfg: Config) -> WorldWords:
    """The words of the world ``cfg.env.name`` names, for the world-agnostic packages' text
    (an advisory's preference principle, the report's definition of success)."""
    return world_of(cfg).words


def unread_env_keys(cfg: Config) -> tuple[str, ...]:
    """The dotted ``env`` keys the world ``cfg.env.name`` names never reads: left out of the
    config hash that labels its episodes and keys their checkpoints
    (:func:`pipeline.session.collection.collection_hash`), so that adding a world's keys
    leaves another world's episodes and their bytes as they were."""
    return world_of(cfg).unread_env_keys


def make_env(cfg: Config, task: EnvTask, root: Path, scenes: Mapping[str, Mapping[str, Any]]) -> Env:
    """The environment of one episode, as ``cfg.env`` configures it.

    Args:
        cfg: the composed config (``env.name``, ``env.max_steps``, ``env.reward``, ...).
        task: the episode's task (game file relative to ``root``, scene, quest, objective,
            preference ids).
        root: the project root.
        scenes: ``{scene_id: scene spec}`` (``scenes.json``).

    Raises:
        ValueError: ``env.name`` names no known environment.
    """
    return world_of(cfg).make_env(cfg, task, root, scenes)


def build_games(cfg: Config, root: Path, *, progress: bool = True) -> GamesResult:
    """Build the games of the world ``cfg.env`` names into ``root / cfg.paths.games`` (the
    ``games`` stage): its manifest, scene specs and game files, in the format of
    ``docs/contracts.md``.

    Raises:
        ValueError: ``env.name`` names no known environment.
    """
    return world_of(cfg).build_games(cfg, root, progress=progress)


def fact_reader(cfg: Config) -> FactReader:
    """The reader of a recorded turn of the world ``cfg.env`` names, as typed facts (what
    the ``store`` stage builds the memory's scene facts from).

    Raises:
        ValueError: ``env.name`` names no known environment.
    """
    return world_of(cfg).fact_reader()
