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

What a focus showed (issue 65: trials that learn from how they ended). A ``focus on`` is
the find tasks' answer, so what it did is stated without ever naming a right one (seed 001:
no memory names the task's answer):

- a focus that ended the task (negative reward: ``lost``) did ``ended(focus on <thing>)``:
  the thing is not what the task asks for ("focusing on the axe ended the task"); one that
  neither ended the task nor raised the score (the engine took it but did not count it: a
  bathtub, which cannot be moved to the box) did ``missed(focus on <thing>)``;
- a focus that raised the score did ``found(<room>)``: what the task asks for was found in
  the room the turn was played in (the room, not the thing);
- a step that handles a thing the task may ask for (``focus on``, ``pick up``, ``move``)
  is never ``advanced``: after a right focus, picking the thing up and moving it to the box
  raise the score, and their commands would name it. Doors, rooms and devices that raised
  the score stay ``advanced``.

The simulated user's line for a lost task (``'focus on axe' ended the task: ...``) is read
as the same ``ended`` fact (:meth:`ScienceWorldFactReader.read_text`).

The engine's own response text (``env_feedback``) is its prose, not this module's
sentences: it states nothing here (``after`` is empty).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from pipeline.core.facts import Fact, FocusTask, StepFacts, fact
from pipeline.core.schemas import json_object
from pipeline.envs.scienceworld.commands import command_to_action
from pipeline.envs.scienceworld.text import ENTITY_PATTERN, read_description, read_statements


# Steps that handle a thing a find task may ask for: their score changes are not stated as
# ``advanced`` (module docstring), a focus's outcome is ``ended`` or ``found``.
ANSWER_ACTIONS = ("focus_on", "pick_up", "move")


def command_facts(command: str | None, reward: float | None = None,
                  exits: Iterable[str] = (), here: str | None = None) -> tuple[Fact, ...]:
    """What a command does when it is carried out: ``took(x)`` (pick up), ``went(room)`` (go to
    one of ``exits``, the rooms the turn's room has doors to: ``go to door to hallway`` or
    ``go to hallway door`` went to the hallway; a door it does not name alone says nothing);
    then what its score change says (``reward``; ``here``: the room it was played in):
    ``advanced(command)`` when it raised the score, but for a focus ``ended(command)`` when
    it ended the task, ``missed(command)`` when it changed nothing and ``found(here)`` when it
    raised the score (module docstring)."""
    done: tuple[Fact, ...] = ()
    action = _action(command)
    if action is not None and action["action"] == "pick_up":
        done = (fact("took", action["target"]),)
    elif action is not None and action["action"] == "go_to":
        room = way_to(action["target"], exits)
        done = (fact("went", room),) if room else ()
    if not (command and command.strip()) or reward is None:
        return done
    said = " ".join(command.split())
    verb = action["action"] if action is not None else None
    if verb == "focus_on" and reward < 0:
        done += (fact("ended", said),)
    elif verb == "focus_on" and reward == 0:
        done += (fact("missed", said),)
    elif verb == "focus_on" and reward > 0 and here:
        done += (fact("found", here),)
    elif reward > 0 and verb not in ANSWER_ACTIONS:
        done += (fact("advanced", said),)
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
# the simulated user's line for a lost task (pipeline.envs.scienceworld.user)
_ENDED = re.compile(r"'(focus on [^']+)' ended the task")
# ScienceWorld's find tasks: "Your task is to find a(n) living thing. First, focus on the thing. Then, move it
# to the red box in the kitchen." and "Your task is to find the animal with the longest life span.  The animals
# are in the 'outside' location.  Focus on the animal with the longest life span."
_FIND = re.compile(r"your task is to find (?:a\(n\) |the )(?P<kind>[a-z][a-z -]*?)[.,]", re.IGNORECASE)
_BOX = re.compile(r"move it to the (?P<box>[a-z ]+ box) in the (?P<room>[a-z ]+?)\.", re.IGNORECASE)
_WHERE = re.compile(r"(?:are|is) in the '(?P<room>[a-z ]+)' location", re.IGNORECASE)


def _door_to(name: str) -> str | None:
    """The room a door's name says it leads to (``door to hallway``, ``hallway door``), else None."""
    m = _DOOR_TO.fullmatch(name)
    return (m["to"] or m["of"]) if m else None


def focus_task(objective: str | None) -> FocusTask | None:
    """The find task an objective states: what to find, the room it names (``'outside'``),
    the box to move it to and the box's room; None when it states no focus task.

    >>> focus_task("Your task is to find a(n) living thing. First, focus on the thing. "
    ...            "Then, move it to the red box in the kitchen.")
    FocusTask(kind='living thing', room=None, box='red box', box_room='kitchen')
    """
    text = " ".join(str(objective or "").split())
    m = _FIND.search(text)
    if m is None or "focus on" not in text.lower():
        return None
    box, where = _BOX.search(text), _WHERE.search(text)
    return FocusTask(kind=m["kind"].strip(), room=where["room"] if where else None,
                     box=box["box"] if box else None, box_room=box["room"] if box else None)


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
        here = next((f.args[0] for f in seen if f.pred == "here"), None)
        return StepFacts(seen=seen, did=command_facts(turn.get("command"), reward, exits, here), after=())

    def read_text(self, text: str | None) -> tuple[Fact, ...]:
        """The facts the sentences of ``text`` state (:func:`~pipeline.envs.scienceworld.text.read_statements`)
        and ``ended(focus on x)`` from the simulated user's line for a focus that ended the task.
        (Where a door is, is a way from that room: the reader reads that from any line,
        :func:`pipeline.agents.reader.doors_as_ways`, through :meth:`door_to`.)"""
        ended = tuple(fact("ended", " ".join(m[1].split())) for m in _ENDED.finditer(text or ""))
        return tuple(dict.fromkeys(read_statements(text) + ended))

    def focus_task(self, objective: str | None) -> FocusTask | None:
        """The find task an objective states (:func:`focus_task`), None for another task."""
        return focus_task(objective)

    def door_to(self, name: str) -> str | None:
        """The room a door's name says it leads to (``door to hallway``, ``hallway door``), else None."""
        return _door_to(name)

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
