"""The trial agent: the reader's decisions with seeded draws, for the trials a memory is made of.

A focus task's trials (ScienceWorld's find tasks, :class:`~pipeline.core.facts.FocusTask`)
must try something and learn from how it ended, as Reflexion's and CLIN's trials do (issue
65). The ``reader`` (:mod:`pipeline.agents.reader`) tests where it stands when it is told
nothing of where; a trial draws, from the episode's seeded stream, how many rooms to walk
through first (0 to :data:`MAX_HOPS`) and which door to take.

Everything else is the reader's: it reads its prompt (in collection, the online loop's
grounding of the variation's earlier trials: the user's "'focus on axe' ended the task"),
goes to the room the objective names, focuses on the first candidate in sight that no
prompt line says ended a past trial, and takes a right find to its box. So the trials of
one variation walk down the reader's own order of candidates, each past what the earlier
ones were told had failed, and a memory that states every failure takes the reader to the
next untested one (design seed 1: a trial drawing its candidate at random left the
reader's C2 equal to its C1, docs/scienceworld.md)::

    agent = TrialAgent(section(AgentConfig, {"name": "trial"}), seed=0, facts=fact_reader(cfg))
    agent.reset({"episode_id": "ep", "objective": task.objective, "system_prompt": prompt})
    step = agent.act(obs)

Outside focus tasks it plays as the reader does (its draws are never used).
"""

from __future__ import annotations

from typing import Any, Mapping

from pipeline.agents.base import _View
from pipeline.agents.reader import ReaderAgent

MAX_HOPS = 3  # rooms a trial may walk through before testing, when nothing says where


class TrialAgent(ReaderAgent):
    """The reader with seeded draws of where to test (module docstring)."""

    name = "trial"

    def reset(self, episode_meta: Mapping[str, Any] | None = None) -> None:
        super().reset(episode_meta)
        self.hops = int(self.rng.integers(MAX_HOPS + 1))

    def explore_door(self, rooms: list[str]) -> str:
        return rooms[int(self.rng.integers(len(rooms)))]

    def walk_on(self, view: _View) -> bool:
        return len(self.seen.rooms_entered) <= self.hops
