"""A recorded ScienceWorld turn, read as typed facts (ScienceWorld's :class:`~pipeline.core.facts.FactReader`).

The observation's description is written from the object tree's facts, one sentence per
fact (:func:`pipeline.envs.scienceworld.text.describe`); the reader reads them back with
its inverse, and a command's effect from the command grammar
(:mod:`pipeline.envs.scienceworld.commands`)::

    step = ScienceWorldFactReader().read_turn(turn_row)
    step.seen      # (here(kitchen), at(stove, kitchen), in(metal pot, cupboard), ...)
    step.did       # (took(metal pot),) for "pick up metal pot"; (went(kitchen),) for "go to kitchen" (a door of the room)
                   # + advanced(focus on banana tree) when the turn raised the engine's score (reward > 0)
    ScienceWorldFactReader().read_text("The metal pot is in the cupboard.")   # (in(metal pot, cupboard),)

Which actions advanced the score: a turn whose recorded ``reward`` (the engine's score
change over the step, :class:`~pipeline.envs.scienceworld.env.ScienceWorldTaskEnv`) is
positive did ``advanced(<its command>)``, a fact of ScienceWorld's own that the memory keeps
(:mod:`pipeline.memory.scene`) and the ``reader`` agent tries again. The score is the
engine's sum of subgoals, some of them states (the agent in the right room), so the command
of a turn that completed a state subgoal is the one that advanced it, whatever it was.

The engine's own response text (``env_feedback``) is its prose, not this module's
sentences: it states nothing here (``after`` is empty).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from pipeline.core.facts import Fact, StepFacts, fact
from pipeline.core.schemas import json_object
from pipeline.envs.scienceworld.commands import command_to_action
from pipeline.envs.scienceworld.text import ENTITY_PATTERN, read_description, read_statements


def command_facts(command: str | None, reward: float | None = None,
                  exits: Iterable[str] = ()) -> tuple[Fact, ...]:
    """What a command does when it is carried out: ``took(x)`` (pick up), ``went(room)`` (go to
    one of ``exits``, the rooms the turn's room has doors to: ``go to door to hallway`` or
    ``go to hallway door`` went to the hallway; a door it does not name alone says nothing);
    then ``advanced(command)`` when it raised the score (``reward`` > 0)."""
    done: tuple[Fact, ...] = ()
    action = _action(command)
    if action is not None and action["action"] == "pick_up":
        done = (fact("took", action["target"]),)
    elif action is not None and action["action"] == "go_to":
        room = way_to(action["target"], exits)
        done = (fact("went", room),) if room else ()
    if command and command.strip() and reward is not None and reward > 0:
        done += (fact("advanced", " ".join(command.split())),)
    return done


def way_to(target: str, exits: Iterable[str]) -> str | None:
    """The room ``go to <target>`` leads to from a room with doors to ``exits`` (None: not one of them)."""
    rooms = list(exits)
    m = _DOOR_TO.fullmatch(target)
    name = m["to"] or m["of"] if m else target
    if name in rooms:
        return name
    return rooms[0] if target == "door" and len(rooms) == 1 else None


_DOOR_TO = re.compile(r"door to (?P<to>.+)|(?P<of>.+) door")


def _action(command: str | None) -> dict[str, Any] | None:
    if not (command or "").strip():
        return None
    try:
        return command_to_action(command)
    except ValueError:
        return None


class ScienceWorldFactReader:
    """Reads a recorded ScienceWorld turn as :class:`~pipeline.core.facts.StepFacts` (module docstring)."""

    entity_pattern = ENTITY_PATTERN  # the answer boxes and rooms its task descriptions name

    def read_turn(self, turn: Mapping[str, Any]) -> StepFacts:
        obs = json_object(turn.get("observation"))
        location = obs.get("agent_location")
        seen = read_description(obs.get("description"), room=location if isinstance(location, str) else None)
        reward = turn.get("reward")
        reward = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None
        exits = [f.args[2] for f in seen if f.pred == "exit"]
        return StepFacts(seen=seen, did=command_facts(turn.get("command"), reward, exits), after=())

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
