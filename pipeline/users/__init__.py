"""Who comments on the agent's steps: the simulated user of the world, or a person's file.

    user = make_user(cfg, scenes, task)                       # cfg.user: the simulated user
    user = make_user(cfg, scenes, task, feedback_source=fb)   # fb: a FileFeedback
    fb = user.step_feedback(1, obs_before, action, info)      # StepFeedback(lines, status, noisy)
    preferences_ok, lines = user.end_feedback(last_info)

Every user satisfies the :class:`User` protocol. The simulated user belongs to its world
(its descriptor's ``make_user``, :mod:`pipeline.envs.registry`: the household's
:class:`pipeline.envs.household.user.SimulatedUser`, ScienceWorld's
:class:`pipeline.envs.scienceworld.user.SimulatedUser`); :class:`StepFeedback` and
:func:`step_status` (which reads the keys of the env's ``info`` that :class:`pipeline.envs.Env`
promises) are shared by every world (:mod:`pipeline.envs.common`); a person's feedback file
(:class:`pipeline.users.file.FileFeedback`) works with any of them, its world's simulated user
judging the preferences at the end.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol

from pipeline.core.conf_schema import Config
from pipeline.envs.common import StepFeedback, step_status
from pipeline.envs.registry import world_of
from pipeline.users.file import FileFeedback

__all__ = ["FileFeedback", "StepFeedback", "User", "UserTask", "make_user", "quest_of", "step_status"]


class UserTask(Protocol):
    """What a user reads of an episode's task (a :class:`pipeline.session.rollout.Task`)."""

    episode_id: str
    scene_id: str
    quest_id: str
    objective: str
    expert_plan: list[str]
    preferences: list[str]  # ids of the scene preferences the quest keeps
    seed: int  # seeds the simulated user's draws


class User(Protocol):
    """What the rollout needs from a user: feedback on each step and a verdict at the end."""

    def step_feedback(self, step_id: int, obs: Mapping[str, Any], action: Mapping[str, Any] | None,
                      info: Mapping[str, Any]) -> StepFeedback:
        """Lines and status for one step.

        Args:
            step_id: 1-based step number.
            obs: the observation the agent acted on (before the step).
            action: the action dict the agent sent.
            info: the env's info after the step.
        """
        ...

    def end_feedback(self, final: Mapping[str, Any] | Iterable[str] | None) -> tuple[bool, list[str]]:
        """``(preferences_ok, lines)`` on the final ``info`` (or the final facts)."""
        ...


def quest_of(task: UserTask) -> dict[str, Any]:
    """What a user knows of a task's quest: ``quest_id``, ``objective``, ``expert_plan``, ``preferences``."""
    return {"quest_id": task.quest_id, "objective": task.objective, "expert_plan": task.expert_plan,
            "preferences": task.preferences}


def make_user(cfg: Config, scenes: Mapping[str, Mapping[str, Any]], task: UserTask,
              feedback_source: FileFeedback | None = None) -> User:
    """The user of one episode.

    Args:
        cfg: the composed config (``cfg.user`` configures the simulated user).
        scenes: ``{scene_id: scene spec}`` (``scenes.json``).
        task: the episode's task (its seed seeds the simulated user's draws).
        feedback_source: a person's feedback file; when given, its view of this episode
            answers instead of the simulated user.

    Raises:
        ValueError: ``env.name`` names no known world; or no feedback file, and its world
            has no simulated user.
    """
    world = world_of(cfg)  # raises for an unknown env.name
    if feedback_source is not None:
        return feedback_source.for_episode(task.episode_id, scenes[task.scene_id], quest_of(task),
                                           judge=world.make_user)
    if world.make_user is None:
        raise ValueError(f"env.name={cfg.env.name!r}: no simulated user for this world; give feedback from a file "
                         "(user=file) or give its descriptor a make_user")
    return world.make_user(cfg.user, scenes[task.scene_id], quest_of(task), task.seed)
