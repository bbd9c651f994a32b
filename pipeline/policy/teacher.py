"""Who answers the policy's demonstration and DAgger turns: the knowledge-limited expert or the reader.

``policy.teacher`` names it (issue 64, item 1):

- ``expert``: :class:`pipeline.policy.expert.BeliefExpert`, household-only. It reads user statements,
  scene facts and verified plans, searches what it has seen, and after ``policy.explore_cap`` search
  steps follows the true shortest plan (it may read the game's state to plan).
- ``reader``: :class:`pipeline.agents.reader.ReaderAgent`, the instrument that measures what a
  condition's text is worth. It reads everything the memory says (lessons, other users' habits,
  containers never opened or found empty, routes, verified plans), acts on the observations the
  model is shown and nothing else, and never reads the game's state. With it as the teacher the
  model's utilisation (its effect over the reader's) measures only how well the model learned.

Both answer in the ``llm`` agent's format (:func:`pipeline.agents.llm.render_response`: one reasoning
line, the JSON action with a ``memory`` dict of ``plan`` and ``notes``) and both can be told the step
that was played instead of theirs (a demonstration's slip, the policy's own step in DAgger), from
which they go on::

    teacher = make_teacher(cfg.policy.teacher, env, prompt, objective, preferences, facts=..., explore_cap=...)
    answer = teacher.answer(obs)           # Answer(command, action, memory, response, basis)
    obs2, _, done, info = env.step(action_played)
    teacher.played(info.get("command"), action_played)

The reader is one agent with one state per episode; to be told another step it goes back to its
state before it answered and plays that step instead (a deep copy per turn: a few kilobytes).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import numpy as np

from pipeline.agents.llm import render_response
from pipeline.agents.reader import ReaderAgent
from pipeline.core.conf_schema import AgentConfig, Teacher as TeacherName
from pipeline.core.config import section
from pipeline.core.facts import FactReader
from pipeline.core.schemas import clean_action
from pipeline.envs.household.env import is_household_command
from pipeline.policy.expert import BeliefExpert, DemoEpisode, DemoTurn, Knowledge, command_action, read_knowledge, slip


@dataclass(frozen=True)
class Answer:
    """A teacher's answer to one observation: the admissible ``command`` it plays (None: the
    action is no listed command), the ``action`` dict, the ``memory`` dict it writes (``plan``,
    ``notes``), the ``response`` text the model is trained to write (all three rendered), and its
    ``basis``: what it acted on (the expert's mode, plan | search; the reader's belief), so that
    two answers are the same decision when both agree."""

    command: str | None
    action: dict
    memory: dict
    response: str
    basis: str = ""


class Teacher(Protocol):
    """What a demonstration or a DAgger round needs from its teacher (one episode)."""

    def answer(self, obs: Mapping[str, Any]) -> Answer:
        """Its answer to ``obs``, the episode's current observation."""
        ...

    def played(self, command: str | None, action: Mapping[str, Any]) -> None:
        """The step the env took after :meth:`answer` (``command``: the one it played, None when
        it refused ``action``); the teacher goes on from it, its own answer or not."""
        ...

    @property
    def search_steps(self) -> int:
        """Steps it took to look for something (a statistic of the demonstrations)."""
        ...

    def notes(self) -> str:
        """Its ``notes`` memory field now (rooms visited, containers looked into)."""
        ...


def command_of(action: Mapping[str, Any], obs: Mapping[str, Any]) -> str | None:
    """The admissible command an action dict names in ``obs`` (None: none does)."""
    want = clean_action(action)
    return next((a.get("command") for a in obs.get("admissible_actions") or []
                 if isinstance(a, Mapping) and clean_action(a) == want), None)


class ExpertTeacher:
    """:class:`pipeline.policy.expert.BeliefExpert` behind the :class:`Teacher` protocol."""

    def __init__(self, env: Any, knowledge: Knowledge, *, explore_cap: int):
        self.expert = BeliefExpert(env, knowledge, explore_cap=explore_cap)

    def answer(self, obs: Mapping[str, Any]) -> Answer:
        decision = self.expert.decide()
        reasoning, action, memory = self.expert.response(decision, obs)
        return Answer(decision.command, action, memory, render_response(reasoning, action, memory), decision.mode)

    def played(self, command: str | None, action: Mapping[str, Any]) -> None:
        self.expert.did(command)
        self.expert.observe()

    def notes(self) -> str:
        return self.expert.notes()

    @property
    def search_steps(self) -> int:
        return self.expert.search_steps


class _Told(ReaderAgent):
    """The reader, which can be made to play a given action instead of choosing one (``told``):
    its reading of the observation and its bookkeeping of what it opened and unlocked are the
    reader's own (:meth:`ReaderAgent.act`)."""

    told: dict | None = None

    def choose(self, obs: Mapping[str, Any], ctx: dict) -> tuple[dict, str, bool]:
        if self.told is not None:
            return dict(self.told), "another step was played", False
        return super().choose(obs, ctx)


# The reader's rationales that search: nothing it was told or saw places what it needs.
# (pipeline.agents.base.RuleAgent's search and exploration, the reader's likely places)
_SEARCH_OPENINGS = ("may hold what I need", "may open a locked container", "not yet looked into", "usually kept",
                    "unexplored exits", "I have not been through", "look in another room")


class ReaderTeacher:
    """:class:`pipeline.agents.reader.ReaderAgent` as the teacher (see the module docstring).

    Its answer's reasoning line is the belief it acted on and the command; its memory dict keeps
    what is left of a verified plan it follows (else what it still needs and where it believes
    that is) and ``notes`` of the rooms visited and containers looked into, as the expert's does.

    Args:
        facts: the world's fact reader (:func:`pipeline.envs.fact_reader`).
        prompt: the episode's frozen system prompt (what the model is given).
        objective: the quest's objective.
    """

    def __init__(self, facts: FactReader, prompt: str, objective: str):
        self.facts = facts
        self.agent = _Told(section(AgentConfig, {"name": "reader"}), facts=facts)
        self.agent.reset({"episode_id": "teacher", "objective": objective, "system_prompt": prompt})
        self._before: _Told | None = None
        self._obs: Mapping[str, Any] | None = None
        self._answer: Answer | None = None
        self._searching = False  # whether the last answer searched (counted once it is played)
        self.search_steps = 0

    def answer(self, obs: Mapping[str, Any]) -> Answer:
        # the state before this answer, to go back to when another step is played (the fact
        # reader is shared, not copied: it holds no episode state)
        self._before = copy.deepcopy(self.agent, {id(self.facts): self.facts})
        self._obs = obs
        step = self.agent.act(obs)
        why = str(self.agent.trace[-1]["why"])
        command = command_of(step.action, obs)
        # as the expert writes it (a move's direction, not the room: the env takes either)
        action = command_action(command, obs) if command else clean_action(step.action)
        self._searching = any(s in why for s in _SEARCH_OPENINGS)
        reasoning = f"{why[:1].upper()}{why[1:]}"
        if command and not why.endswith(command):  # a verified step's rationale ends with its command
            reasoning += f": {command}"
        memory = self.memory(action)
        self._answer = Answer(command, action, memory, render_response(reasoning + ".", action, memory), why)
        return self._answer

    def played(self, command: str | None, action: Mapping[str, Any]) -> None:
        mine = self._answer
        if mine is None or self._obs is None:
            raise RuntimeError("ReaderTeacher.played before answer: the teacher answers every turn first")
        self.search_steps += int(self._searching and command == mine.command)
        if command is not None and command == mine.command:
            return
        # Another step was played: back to the state before the answer, and read the same
        # observation as if that step had been chosen (a refused one changes nothing: a wait).
        assert self._before is not None
        self.agent = self._before
        self.agent.told = clean_action(action) if command is not None else {"action": "wait", "target": None}
        try:
            self.agent.act(self._obs)
        finally:
            self.agent.told = None
        self._before = None

    def memory(self, action: Mapping[str, Any]) -> dict:
        """The answer's ``memory`` dict after playing ``action``: ``plan`` and ``notes``."""
        a = self.agent
        b = a.beliefs
        if b.plan and a.plan_at and not b.dropped.get(-1):
            plan = "; ".join(b.plan[a.plan_at:])
        else:
            parts = []
            taking = action.get("target") if action.get("action") == "pick_up" else None
            for w in a._wanted(a.view):  # noqa: SLF001 - the reader's own account of what it needs
                if w == taking:
                    continue
                room = a.room_of(w)
                parts.append(f"{w} in the {room}" if room else f"find {w}")
            plan = "; ".join(parts)
        return {"plan": plan, "notes": self.notes()}

    def notes(self) -> str:
        """Rooms visited, then containers looked into (in the order opened)."""
        a = self.agent
        text = "visited: " + ", ".join(a.mem.visited)
        searched = [c for c in a.seen.contents if c in a.mem.searched]
        if searched:
            text += "; searched: " + ", ".join(searched)
        return text


def make_teacher(name: str, env: Any, prompt: str, objective: str, preferences: list[dict], *,
                 facts: FactReader, explore_cap: int) -> Teacher:
    """The teacher ``policy.teacher`` names for one freshly reset episode of ``env``."""
    if str(name) == TeacherName.reader:
        return ReaderTeacher(facts, prompt, objective)
    if str(name) == TeacherName.expert:
        return ExpertTeacher(env, read_knowledge(prompt, env.world, preferences), explore_cap=explore_cap)
    raise ValueError(f"policy.teacher={name!r}: expected one of {', '.join(t.value for t in TeacherName)}")


def teacher_episode(env: Any, teacher: Teacher, *, slip_prob: float = 0.0,
                    rng: np.random.Generator | None = None) -> DemoEpisode:
    """Play one episode with ``teacher`` (``env`` freshly reset): every turn its answer, or with
    probability ``slip_prob`` (never the first turn) a wrong step instead (the expert's slips:
    another admissible command, a move through a wall, an action on something not here, the last
    action again), recorded with ``train=False`` and the memory's plan kept stale, so that the model
    sees how the teacher goes on from a mistake. :func:`pipeline.policy.expert.expert_episode` is
    this with the expert."""
    rng = rng if rng is not None else np.random.default_rng(0)
    obs = env.observation()
    turns: list[DemoTurn] = []
    plan = ""
    last: tuple[str, dict] | None = None
    done, info = False, {}
    while not done:
        mine = teacher.answer(obs)
        slipped = slip_prob > 0 and turns and rng.random() < slip_prob
        if slipped:
            others = sorted(c for c in env.admissible if c != mine.command and is_household_command(c))
            slipped = bool(others)
        if slipped:
            cmd, action = slip(env, obs, others, rng, last)
            turns.append(DemoTurn(obs, render_response(f"Try: {cmd}.", action, {"plan": plan, "notes": teacher.notes()}),
                                  train=False))
        else:
            cmd, action = mine.command or "", mine.action
            turns.append(DemoTurn(obs, mine.response))
            plan = str(mine.memory.get("plan") or "")
        last = (cmd, action)
        obs, _, done, info = env.step(action)
        teacher.played(info.get("command"), action)
    return DemoEpisode(turns, bool(info.get("won")), bool(info.get("preferences_ok")), teacher.search_steps)
