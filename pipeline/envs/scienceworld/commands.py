"""ScienceWorld's command grammar as action dicts: ``{"action", "target", "receptacle"}``.

ScienceWorld's parser takes commands built from 25 templates (``open OBJ``, ``move OBJ to
OBJ``, ``use OBJ on OBJ``, ...). An agent sends the project's action dict instead; the
verb is the template's words joined by ``_`` (``pick up`` -> ``pick_up``), ``target`` is
the first object and ``receptacle`` the second one of a two-object command (the only
second-object field the action dict has: :func:`pipeline.core.schemas.clean_action`)::

    action_to_command({"action": "move", "target": "metal pot", "receptacle": "sink"})   # 'move metal pot to sink'
    command_to_action("use thermometer on substance in metal pot")
    # {'action': 'use', 'target': 'thermometer', 'receptacle': 'substance in metal pot'}

Object names are the engine's referents (``metal pot``, ``substance in metal pot``,
``door to kitchen``). ``examine`` and ``drop`` are not templates but the engine (and its
gold sequences) use them: they are verbs here too.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable, Mapping

# verb -> (the command's words, number of objects, the word before the second object).
# `use` takes one object or two (``use OBJ`` / ``use OBJ on OBJ``); `pour` / `dunk` are
# written "into" (the engine's valid combinations and gold sequences) and read with "in"
# too (its templates say ``pour OBJ in OBJ``).
GRAMMAR: dict[str, tuple[str, int, str]] = {
    "look_around": ("look around", 0, ""),
    "inventory": ("inventory", 0, ""),
    "task": ("task", 0, ""),
    "wait": ("wait", 0, ""),
    "wait1": ("wait1", 0, ""),
    "go_to": ("go to", 1, ""),
    "open": ("open", 1, ""),
    "close": ("close", 1, ""),
    "pick_up": ("pick up", 1, ""),
    "put_down": ("put down", 1, ""),
    "drop": ("drop", 1, ""),
    "look_at": ("look at", 1, ""),
    "look_in": ("look in", 1, ""),
    "examine": ("examine", 1, ""),
    "read": ("read", 1, ""),
    "focus_on": ("focus on", 1, ""),
    "activate": ("activate", 1, ""),
    "deactivate": ("deactivate", 1, ""),
    "eat": ("eat", 1, ""),
    "flush": ("flush", 1, ""),
    "mix": ("mix", 1, ""),
    "disconnect": ("disconnect", 1, ""),
    "move": ("move", 2, "to"),
    "connect": ("connect", 2, "to"),
    "pour": ("pour", 2, "into"),
    "dunk": ("dunk", 2, "into"),
    "use": ("use", 2, "on"),
}
VERBS = tuple(GRAMMAR)
# Longest words first: "look at" is tried before "look around" could match "look".
_LONGEST_FIRST = tuple(sorted(GRAMMAR, key=lambda v: -len(GRAMMAR[v][0])))
# The second-object words each two-object verb reads (the first one is what it writes).
_JOINERS = {"pour": ("into", "in"), "dunk": ("into", "in")}


class ActionError(ValueError):
    """An action dict that names no ScienceWorld command (the message says why)."""


def _name(x: Any, what: str) -> str | None:
    if x is None:
        return None
    if not isinstance(x, str):
        raise ActionError(f"expected the {what} as an object name string, got {x!r}")
    return " ".join(x.split()) or None


def action_to_command(action: Mapping[str, Any]) -> str:
    """The ScienceWorld command an action dict means.

    Raises:
        ActionError: not a dict, an unknown verb, or a missing object.
    """
    if not isinstance(action, Mapping):
        raise ActionError(f"expected an action dict {{'action': verb, 'target': ...}}, got {action!r}")
    verb = action.get("action")
    if not isinstance(verb, str) or verb.strip() not in GRAMMAR:
        raise ActionError(f"unknown verb {verb!r}: expected one of {', '.join(VERBS)}")
    words, arity, joiner = GRAMMAR[verb.strip()]
    target, second = _name(action.get("target"), "target"), _name(action.get("receptacle"), "receptacle")
    if arity == 0:
        return words
    if target is None:
        raise ActionError(f"{verb} needs a target")
    if arity == 2 and second is not None:
        return f"{words} {target} {joiner} {second}"
    if arity == 2 and verb != "use":
        raise ActionError(f"{verb} needs a receptacle (the second object: {words} X {joiner} Y)")
    return f"{words} {target}"


def command_to_action(command: str | None, objects: Iterable[str] = ()) -> dict[str, Any]:
    """The action dict of a ScienceWorld command (``None`` or ``""`` -> ``look_around``).

    Args:
        command: the command text.
        objects: names of the objects there are now; where a two-object command's text can
            be split in several places (a name with ``to`` in it), the split whose both
            sides are known objects wins, else the first.

    Raises:
        ValueError: the command starts with no verb of :data:`GRAMMAR`.
    """
    text = " ".join(str(command or "look around").split()).lower()
    return dict(_parse(text, frozenset(objects)))


@lru_cache(maxsize=65536)
def _parse(text: str, objects: frozenset[str]) -> tuple[tuple[str, Any], ...]:
    """:func:`command_to_action` of a normalised text, as items (cached: commands recur every step)."""
    command = text
    for verb in _LONGEST_FIRST:
        words, arity, joiner = GRAMMAR[verb]
        if text != words and not text.startswith(words + " "):
            continue
        rest = text[len(words):].strip()
        if arity == 0:
            if rest:
                continue
            return (("action", verb), ("target", None))
        if not rest:
            raise ValueError(f"command {command!r}: {words} needs an object")
        if arity == 2:
            split = _split(rest, _JOINERS.get(verb, (joiner,)), objects)
            if split is not None:
                return (("action", verb), ("target", split[0]), ("receptacle", split[1]))
            if verb != "use":
                raise ValueError(f"command {command!r}: {words} X {joiner} Y expected")
        return (("action", verb), ("target", rest))
    raise ValueError(f"command {command!r} has no ScienceWorld verb (verbs: {', '.join(VERBS)})")


def _split(rest: str, joiners: tuple[str, ...], known: frozenset[str]) -> tuple[str, str] | None:
    """``"a to b"`` -> ``("a", "b")``: the split with both sides in ``known``, else the first
    of the first-ranked joiner."""
    words = rest.split()
    # by the joiner's rank ("into" before "in": "pour cup in table into bowl"), then position
    cands = [(" ".join(words[:i]), " ".join(words[i + 1:])) for j in joiners for i, w in enumerate(words)
             if w == j and 0 < i < len(words) - 1]
    if not cands:
        return None
    return next((c for c in cands if c[0] in known and c[1] in known), cands[0])


def verbs_of(commands: Iterable[str]) -> list[str]:
    """The verbs with at least one command in ``commands``, in :data:`VERBS` order."""
    found = set()
    for c in commands:
        try:
            found.add(command_to_action(c)["action"])
        except ValueError:
            pass
    return [v for v in VERBS if v in found]
