"""What every world shares: the user's step record, the world descriptor, the env lifecycle.

No world owns these, so no world imports another's: the household, ScienceWorld, the
users (:mod:`pipeline.users`) and the tools import them from here::

    fb = speak(rng, user_cfg.feedback_prob, user_cfg.noise, lines, step_status(info, plan_len), noise_line)
    fb.lines, fb.status, fb.noisy                 # a StepFeedback
    result = world.build_games(cfg, root, progress=False)   # a GamesResult
    class MyEnv(EnvLifecycle): ...                # `with MyEnv(...) as env:` closes it at the end

A world is one :class:`WorldDescriptor`, defined in its own package and registered once in
:mod:`pipeline.envs.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Self

import numpy as np

from pipeline.core.facts import FactReader, WorldWords

# A user's noise line when it does not invent a wrong place: said instead of a true remark.
UNHELPFUL = (
    "Hmm, keep going.",
    "I am not sure what you are trying to do.",
    "Maybe look around a bit more.",
    "That is an interesting choice.",
    "Take your time.",
)


@dataclass
class StepFeedback:
    """What the user says about one step.

    Attributes:
        lines: ``feedback : <type>: <text>`` lines (possibly none).
        status: ``Success`` | ``Failure`` | ``WiP`` (seed 000).
        noisy: for each line, whether it is a noise line (simulated user only).
    """

    lines: list[str]
    status: str
    noisy: list[bool] = field(default_factory=list)


def step_status(info: Mapping[str, Any], plan_before: int | None) -> str:
    """Seed 000's status of a step from the env's ``info`` (the keys of :class:`pipeline.envs.Env`'s
    contract): ``Failure`` when it was invalid (``valid`` false) or ``lost``; ``Success`` when it
    ``won`` or shortened the remaining ``expert_plan`` (of ``plan_before`` commands before it;
    a plan of an unsolvable state, ``solvable`` false, is no progress); ``WiP`` otherwise."""
    if not info.get("valid", True) or info.get("lost", False):
        return "Failure"
    if info.get("won", False):
        return "Success"
    plan = info.get("expert_plan")
    if info.get("solvable") is False:  # the env's plan is [] when none exists: not progress
        return "WiP"
    if plan is not None and plan_before is not None and len(plan) < plan_before:
        return "Success"
    return "WiP"


def speak(rng: np.random.Generator, feedback_prob: float, noise: float, lines: list[str], status: str,
          noise_line: Callable[[], str]) -> StepFeedback:
    """A simulated user's say on one step: one draw decides whether it speaks at all
    (``user.feedback_prob``), then one draw per line whether the line is replaced by
    ``noise_line()`` (``user.noise``). The draws are always made in this order, so the same
    seed and the same steps give the same lines."""
    spoken = rng.random() < feedback_prob
    if not lines or not spoken:
        return StepFeedback([], status, [])
    out, noisy = [], []
    for line in lines:
        if noise > 0 and rng.random() < noise:
            out.append(noise_line())
            noisy.append(True)
        else:
            out.append(line)
            noisy.append(False)
    return StepFeedback(out, status, noisy)


@dataclass
class GamesResult:
    """What the stage built: ``root`` is the project root the relative paths start from."""

    root: Path
    games_dir: Path
    scenes: dict[str, dict[str, Any]]
    rows: list[dict[str, Any]]
    metrics: dict[str, Any]

    def game_path(self, row: dict[str, Any]) -> Path:
        return self.root / row["game_file"]


class EnvLifecycle:
    """The lifecycle every world's env shares: ``with Env(...) as env:`` calls its ``close()``
    at the end (the world defines ``close``: release the game, the env can be reset again)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def scene_preferences(scene: Mapping[str, Any], ids: list[str]) -> list[dict]:
    """The scene's preference specs whose ids a quest keeps (scene order)."""
    return [p for p in scene.get("preferences", []) if p["id"] in set(ids)]


@dataclass(frozen=True)
class WorldDescriptor:
    """One world, as the rest of the pipeline finds it by ``env.name`` (:mod:`pipeline.envs.registry`).

    Attributes:
        names: the ``env.name`` values it answers to (``household`` and ``tiny``, its smaller size).
        family: the world's own name (:func:`pipeline.envs.env_family`).
        make_env: ``(cfg, task, root, scenes) -> Env``: one episode's env (:func:`pipeline.envs.make_env`).
        build_games: ``(cfg, root, *, progress) -> GamesResult``: the ``games`` stage's outputs.
        fact_reader: ``() -> FactReader``: a recorded turn or a text of it, as typed facts.
        words: its words in the world-agnostic packages' text.
        make_user: ``(user_cfg, scene_spec, quest_row, seed) -> User``: its simulated user; None
            when it has none (feedback then comes from a file, ``user=file``).
        unread_env_keys: the dotted ``env`` keys it never reads (left out of the config hash
            that labels its episodes: :func:`pipeline.envs.unread_env_keys`).
    """

    names: tuple[str, ...]
    family: str
    make_env: Callable[..., Any]
    build_games: Callable[..., GamesResult]
    fact_reader: Callable[[], FactReader]
    words: WorldWords
    make_user: Callable[..., Any] | None
    unread_env_keys: tuple[str, ...] = ()

    @property
    def entity_pattern(self) -> str:
        """A regular expression of its things' names as an objective writes them (what the
        memory's signature counts): its fact reader's, the one place a world states it."""
        return self.fact_reader().entity_pattern
