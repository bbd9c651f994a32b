"""A recorded household turn, read as typed facts (the household's :class:`~pipeline.core.facts.FactReader`).

The live env hands the rest of the house the facts of what the player sees
(``HouseholdEnv.facts()``, :meth:`pipeline.envs.household.world.World.observation_facts`),
and its description is rendered from the same facts
(:func:`pipeline.envs.household.text.describe`). A recorded turn keeps the observation as
the agent saw it, so :class:`HouseholdFactReader` reads the facts back from it (the
description's inverse, :func:`pipeline.envs.household.text.read_description`) and the
command's effect from the one command grammar
(:func:`pipeline.envs.household.env.command_to_action`)::

    step = HouseholdFactReader().read_turn(turn_row)
    step.seen      # (here(Kitchen), at(Fridge_0, Kitchen), closed(Fridge_0), ...)
    step.did       # (took(Key_1, Drawer_0),)
    step.after     # the facts of a room described after the step
    HouseholdFactReader().read_text("Key_1 is on Table_0 in the Kitchen.")   # (on(Key_1, Table_0), at(Table_0, Kitchen))
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from pipeline.core.facts import SEED_ENTITY_NAME, Fact, StepFacts, fact
from pipeline.core.schemas import json_object
from pipeline.envs.household.env import command_to_action
from pipeline.envs.household.text import habit_text, is_description, kind_of, read_description, read_statements


def command_facts(command: str | None) -> tuple[Fact, ...]:
    """What a household command does when it is carried out: ``took``, ``unlocked``, ``went``.

    ``"take Key_1 from Drawer_0"`` -> ``(took(Key_1, Drawer_0),)``; ``"unlock Chest_2 with
    Key_1"`` -> ``(unlocked(Chest_2, Key_1),)``; ``"go south"`` -> ``(went(south),)``; other
    commands (and text that is no household command) show nothing of the scene.
    """
    command = (command or "").strip()
    if not command:
        return ()
    try:
        action = command_to_action(command)
    except ValueError:
        return ()
    verb, target = action["action"], action.get("target")
    if verb == "pick_up":
        return (fact("took", target, action["receptacle"]) if action.get("receptacle") else fact("took", target),)
    if verb == "unlock":
        return (fact("unlocked", target, action["key"]),)
    if verb == "go_to":
        return (fact("went", target),)
    return ()


# A command named in prose whose effect tells where something was or what opens what
# ("What you need is right here: take Cup_3 from Cabinet_2.", "unlock Cabinet_2 with Key_2").
_PROSE_COMMAND_RE = re.compile(r"\b(?:take [A-Za-z]+_\d+ from [A-Za-z]+_\d+|unlock [A-Za-z]+_\d+ with [A-Za-z]+_\d+)\b")


class HouseholdFactReader:
    """Reads a recorded household turn as :class:`~pipeline.core.facts.StepFacts`.

    ``seen``: the facts of the observation's description (its ``agent_location`` when the
    description names no room); ``after``: the facts of the step's response when it is a
    room description (after ``look`` or a move); ``did``: :func:`command_facts` of the
    turn's command.
    """

    entity_pattern = SEED_ENTITY_NAME  # Apple_2, Fridge_0, Key_1: the household names things as seed 004 did

    def read_turn(self, turn: Mapping[str, Any]) -> StepFacts:
        obs = json_object(turn.get("observation"))
        location = obs.get("agent_location")
        seen = read_description(obs.get("description"), room=location if isinstance(location, str) else None)
        feedback = turn.get("env_feedback")
        after = read_description(feedback) if is_description(feedback) else ()
        return StepFacts(seen=seen, did=command_facts(turn.get("command")), after=after)

    def read_text(self, text: str | None) -> tuple[Fact, ...]:
        """:func:`~pipeline.envs.household.text.read_statements` of ``text``, then what each
        command named in it does, in order (:func:`command_facts`: ``took(Cup_3, Cabinet_2)``
        says where Cup_3 was, ``unlocked(Cabinet_2, Key_2)`` what opens Cabinet_2)."""
        commands = [f for m in _PROSE_COMMAND_RE.finditer(text or "") for f in command_facts(m[0])]
        return read_statements(text) + tuple(commands)

    def kind(self, name: str) -> str | None:
        """``Cabinet_2`` -> ``Cabinet`` (:func:`~pipeline.envs.household.text.kind_of`); None for a room."""
        return kind_of(name)

    def sentence(self, f: Fact) -> str | None:
        """A general preference's sentence (:func:`~pipeline.envs.household.text.habit_text`); None otherwise."""
        if f.pred == "prefer" and len(f.args) == 1:
            return habit_text(f.args[0])
        return None

    def free_command(self, command: str) -> dict[str, Any] | None:
        """None: the household's games accept only their admissible commands."""
        return None
