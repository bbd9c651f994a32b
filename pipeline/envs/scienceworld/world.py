"""What a ScienceWorld state shows, as typed facts read from the engine's object tree.

The engine exposes its state as an object tree (``getObjectTree()``: the universe, its
rooms, their contents, each with container / device / material properties). The facts of
an observation are what the agent can see: its room's things, the contents of open
containers in it (recursively), what it carries, and the room's doors (doors are not in
the tree: they are read from the engine's ``look around`` text, the one sentence form
this module reads: a door stands in its room, and is an exit taken by the name of the room it
leads to, ``go to hallway``). In the shared vocabulary of :mod:`pipeline.core.facts`::

    here(kitchen)  at(stove, kitchen)  in(metal pot, cupboard)  closed(cupboard)
    carried(thermometer)  exit(kitchen, hallway, hallway)  open(door to hallway)

plus ScienceWorld's own predicates: ``active(x)`` / ``inactive(x)`` (a device that can be
switched on), ``matter(x, liquid|gas)`` (a thing that is not solid; air excluded)::

    facts = observation_facts(tree, look_text)

Siblings are ordered by name, then by what they hold (the tree's own order follows object
ids, which change with what the JVM loaded before); electrical terminals (``terminal 1``, ``anode``, ...) are parts of
things and are not listed.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping

from pipeline.core.facts import Fact, fact

AGENT = "agent"
_PARTS = re.compile(r"^(terminal \d+|anode|cathode)$")
_DOOR = re.compile(r"A door to the ([a-z][a-z ]*?) \(that is (open|closed)\)")
_SKIP_MATTER = ("air",)


def _children(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    kids = [c for c in (node.get("contents") or {}).values() if not c.get("isDeleted")]
    return sorted(kids, key=_order_key)


def _order_key(node: Mapping[str, Any]) -> tuple[str, str]:
    """A sibling's place: its name, then what it is and holds (things of one name, three wood
    cups, are told apart by their contents, never by their object ids, which depend on what
    the JVM loaded before)."""
    return str(node.get("name", "")), json.dumps(_shape(node), sort_keys=True)


def _shape(node: Mapping[str, Any], depth: int = 0) -> list:
    """A node's name and states and its contents' shapes, sorted (no ids, no temperatures)."""
    if depth > 8:
        return []
    inner = sorted(json.dumps(_shape(c, depth + 1), sort_keys=True)
                   for c in (node.get("contents") or {}).values() if not c.get("isDeleted"))
    return [str(node.get("name", "")), [str(f) for f in _state_facts(node)] if node.get("name") else [], inner]


def _is_open_container(node: Mapping[str, Any]) -> bool:
    c = node.get("propContainer") or {}
    return str(c.get("isContainer")).lower() == "true" and bool(c.get("isOpen"))


def find_agent_room(tree: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The room (a child of the universe) that holds the agent."""
    for room in _children(tree):
        if any(c.get("name") == AGENT for c in _children(room)):
            return room
    return None


def _state_facts(node: Mapping[str, Any]) -> list[Fact]:
    name = str(node["name"])
    out = []
    c = node.get("propContainer") or {}
    if c.get("isClosable"):
        out.append(fact("open" if c.get("isOpen") else "closed", name))
    d = node.get("propDevice") or {}
    if d.get("isActivable"):
        out.append(fact("active" if d.get("isActivated") else "inactive", name))
    m = node.get("propMaterial") or {}
    state = m.get("stateOfMatter")
    if state and state != "solid" and name not in _SKIP_MATTER:
        out.append(fact("matter", name, str(state)))
    return out


def _contents(holder: Mapping[str, Any], depth: int = 0) -> list[Fact]:
    """``in(x, holder)`` and each x's state, into open containers (bounded depth)."""
    out: list[Fact] = []
    if depth > 6 or not _is_open_container(holder):
        return out
    for c in _children(holder):
        name = str(c.get("name", ""))
        if not name or _PARTS.match(name):
            continue
        out.append(fact("in", name, str(holder["name"])))
        out += _state_facts(c)
        out += _contents(c, depth + 1)
    return out


def observation_facts(tree: Mapping[str, Any], look_text: str | None = None) -> tuple[Fact, ...]:
    """The facts of what the agent sees now (module docstring); ``()`` without an agent."""
    room = find_agent_room(tree)
    if room is None:
        return ()
    rname = str(room["name"])
    out = [fact("here", rname)]
    carried: list[Fact] = []
    for c in _children(room):
        name = str(c.get("name", ""))
        if not name or _PARTS.match(name):
            continue
        if name == AGENT:
            for inv in _children(c):
                if inv.get("name") == "inventory":
                    for x in _children(inv):
                        xname = str(x.get("name", ""))
                        if xname and not _PARTS.match(xname):
                            carried.append(fact("carried", xname))
                            carried += _state_facts(x)
                            carried += _contents(x, 1)
            continue
        out.append(fact("at", name, rname))
        out += _state_facts(c)
        out += _contents(c)
    for to, state in _DOOR.findall(look_text or ""):
        out.append(fact("at", f"door to {to}", rname))  # a door stands in its room like any thing seen there
        out.append(fact("exit", rname, to, to))  # taken by the room's name: go to hallway
        out.append(fact(state, f"door to {to}"))
    return tuple(dict.fromkeys(out + carried))


def rooms_of(tree: Mapping[str, Any]) -> list[str]:
    """The rooms of the world (the universe's children that hold things), by name."""
    return [str(r["name"]) for r in _children(tree) if r.get("contents")]


def locate(tree: Mapping[str, Any], name: str) -> tuple[str, str] | None:
    """``(holder, room)`` of the first thing called ``name`` (holder = the room when it
    stands there; ``("inventory", room)`` when carried); None when there is none."""
    for room in _children(tree):
        found = _find(room, name, str(room["name"]))
        if found is not None:
            return found[0], str(room["name"])
    return None


def _find(node: Mapping[str, Any], name: str, holder: str, depth: int = 0) -> tuple[str] | None:
    if depth > 8:
        return None
    for c in _children(node):
        cname = str(c.get("name", ""))
        if cname == name:
            return (holder,)
        inner = "inventory" if cname in (AGENT, "inventory") else cname
        found = _find(c, name, inner, depth + 1)
        if found is not None:
            return found
    return None


def fact_strings(facts: Iterable[Fact]) -> list[str]:
    """Facts as sorted strings (``info["facts"]``)."""
    return sorted(str(f) for f in facts)
