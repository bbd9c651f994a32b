"""A recorded ScienceWorld turn, read as typed facts (ScienceWorld's :class:`~pipeline.core.facts.FactReader`).

The observation's description is written from the object tree's facts, one sentence per
fact (:func:`pipeline.envs.scienceworld.text.describe`); the reader reads them back with
its inverse, and a command's effect from the command grammar
(:mod:`pipeline.envs.scienceworld.commands`)::

    step = ScienceWorldFactReader().read_turn(turn_row)
    step.seen      # (here(kitchen), at(stove, kitchen), in(metal pot, cupboard), ...)
    step.did       # (took(metal pot),) for "pick up metal pot"; (went(kitchen),) for "go to kitchen"
    ScienceWorldFactReader().read_text("The metal pot is in the cupboard.")   # (in(metal pot, cupboard),)

The engine's own response text (``env_feedback``) is its prose, not this module's
sentences: it states nothing here (``after`` is empty).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from pipeline.core.facts import Fact, StepFacts, fact
from pipeline.core.schemas import json_object
from pipeline.envs.scienceworld.commands import command_to_action
from pipeline.envs.scienceworld.text import read_description, read_statements


def command_facts(command: str | None) -> tuple[Fact, ...]:
    """What a command does when it is carried out: ``took(x)`` (pick up), ``went(room)`` (go to)."""
    if not (command or "").strip():
        return ()
    try:
        action = command_to_action(command)
    except ValueError:
        return ()
    if action["action"] == "pick_up":
        return (fact("took", action["target"]),)
    if action["action"] == "go_to":
        return (fact("went", action["target"]),)
    return ()


class ScienceWorldFactReader:
    """Reads a recorded ScienceWorld turn as :class:`~pipeline.core.facts.StepFacts` (module docstring)."""

    def read_turn(self, turn: Mapping[str, Any]) -> StepFacts:
        obs = json_object(turn.get("observation"))
        location = obs.get("agent_location")
        seen = read_description(obs.get("description"), room=location if isinstance(location, str) else None)
        return StepFacts(seen=seen, did=command_facts(turn.get("command")), after=())

    def read_text(self, text: str | None) -> tuple[Fact, ...]:
        """The facts the sentences of ``text`` state (:func:`~pipeline.envs.scienceworld.text.read_statements`)."""
        return read_statements(text)

    def kind(self, name: str) -> str | None:
        """A ScienceWorld thing's name is its kind (``metal pot``); a trailing index is dropped."""
        base = re.sub(r"\s*\d+$", "", str(name)).strip()
        return base or None

    def sentence(self, f: Fact) -> str | None:
        """None: ScienceWorld's users state no preferences."""
        return None

    def free_command(self, command: str) -> dict[str, Any] | None:
        """The action dict of any command of ScienceWorld's grammar (the engine's parser
        judges it); None for text that is no command."""
        try:
            return command_to_action(command)
        except ValueError:
            return None
