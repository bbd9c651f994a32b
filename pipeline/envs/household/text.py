"""Every household sentence that something reads back: written here, and parsed here.

The household world keeps its state in facts (:mod:`pipeline.envs.household.world`) and
states an observation as typed facts (:mod:`pipeline.core.facts`,
:func:`pipeline.envs.household.facts.observation_facts`). Prose is only rendering, and
whatever rendering another module must read again is written and read in this one
module, so that a reworded sentence cannot silently break its reader (a test holds every
writer and its reader together):

- the observation's description: :func:`describe` writes it from the facts,
  :func:`read_description` gives the facts back (recorded turns keep the observation as
  the agent saw it, so the memory's fact reader reads it there);
- where a thing is (``"Key_1 is on Table_0 in the Kitchen."``): the simulated user says it
  (:func:`location_sentence`), the expert demonstrator reads it from its prompt, together
  with the memory's scene facts of the same form (:func:`read_locations`);
- the scene preferences (``"Close containers after use."``): :func:`preference_text`;
- the user's route hints (:func:`route_sentence`, :func:`exits_sentence`).

Commands (``take Key_1 from Drawer_0``) are not prose: their one grammar is
:func:`pipeline.envs.household.env.command_to_action`. The user's other remarks (the
procedural and general lines of :mod:`pipeline.envs.household.user`) are speech that no
module parses; they stay with the user who says them::

    text = describe(world.observation_facts())
    # "You are in the Kitchen. You see Fridge_0 (closed), Table_0. On Table_0: Key_1. Exits: south to Bedroom. ..."
    read_description(text) == world.observation_facts()       # True for every state of a game
    read_locations("Key_1 is on Table_0 in the Kitchen.")     # [("Key_1", "on", "Table_0", "Kitchen")]
    read_statements(grounding_text)                           # every sentence above, as typed facts
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple, Sequence

from pipeline.core.facts import Fact, WorldWords, fact, first

# The household's words in the world-agnostic packages' text (pipeline.envs.world_words).
WORDS = WorldWords(
    preference_principle="Respect the user's household preferences while completing the goal.",
    success="TextWorld `won`, and the scene's preferences held when `user.preference_in_success`",
)

# Container states as the description words them: "Fridge_0 (closed)", "Drawer_1 (open, empty)".
STATES = ("open", "closed", "locked")
_ROOM_SENTENCE = "You are in the "
_NOTHING = "nothing here"  # "You see nothing here."

# --------------------------------------------------------------------------- the description


def describe(facts: Sequence[Fact]) -> str:
    """The description of an observation's facts (no flavour text, deterministic).

    Things are listed in the order of their ``at`` facts (containers, with their state,
    then supporters and loose things), the contents of each holder in the order of its
    ``on`` / ``in`` facts, the exits in the order of the ``exit`` facts.

    Example: ``"You are in the Kitchen. You see Fridge_0 (open, empty), Table_0, Apple_2.
    On Table_0: Key_1. Exits: south to Bathroom. You are carrying nothing."``
    """
    here_fact = first(facts, "here")
    here = here_fact.args[0] if here_fact else ""
    state = {f.args[0]: f.pred for f in facts if f.pred in STATES}
    empty = {f.args[0] for f in facts if f.pred == "empty"}
    seen = []
    for f in facts:
        if f.pred == "at":
            thing = f.args[0]
            seen.append(f"{thing} ({state[thing]}{', empty' if thing in empty else ''})" if thing in state else thing)
    holders: dict[str, tuple[str, list[str]]] = {}
    for f in facts:
        if f.pred in ("on", "in"):
            holders.setdefault(f.args[1], ("On" if f.pred == "on" else "In", []))[1].append(f.args[0])
    exits = [f"{f.args[1]} to {f.args[2]}" for f in facts if f.pred == "exit"]
    carried = [f.args[0] for f in facts if f.pred == "carried"]
    parts = [f"{_ROOM_SENTENCE}{here}."]
    parts.append(f"You see {', '.join(seen)}." if seen else f"You see {_NOTHING}.")
    parts += [f"{prep} {holder}: {', '.join(items)}." for holder, (prep, items) in holders.items()]
    parts.append("Exits: " + ", ".join(exits) + "." if exits else "No exits.")
    parts.append(f"You are carrying: {', '.join(carried)}." if carried else "You are carrying nothing.")
    return " ".join(parts)


# Entity and room names are single words; a description's sentences end at the first ".".
_ROOM_RE = re.compile(r"You are in the (\w+)\.")
_SEE_RE = re.compile(r"You see ([^.]*)\.")
_SEEN_RE = re.compile(r"(\w+)(?: \(([^)]*)\))?")  # "Fridge_0 (open, empty)" or "Table_0"
_HOLDS_RE = re.compile(r"\b(In|On) (\w+): ([^.]*)\.")
_EXITS_RE = re.compile(r"Exits: ([^.]*)\.")
_EXIT_RE = re.compile(r"(\w+) to (\w+)")
_CARRIED_RE = re.compile(r"You are carrying: ([^.]*)\.")
_NAME_RE = re.compile(r"\w+")


def is_description(text: object) -> bool:
    """Whether ``text`` is a room description (the env's response to ``look`` or a move)."""
    return isinstance(text, str) and text.startswith(_ROOM_SENTENCE)


def read_description(text: object, room: str | None = None) -> tuple[Fact, ...]:
    """The facts a description states, in :func:`describe`'s order (its inverse).

    Args:
        text: a description; anything else (None, other text) states no facts but ``room``.
        room: the room to assume when the text names none (the observation's
            ``agent_location``).

    Returns:
        ``here``, then ``at`` of each thing seen (with the state of a container right
        after it, and ``empty`` when it says so), ``in`` / ``on`` of what holders hold,
        ``exit`` of each exit (only when the room is known), ``carried``. A thing listed
        with a state word that is not a container state keeps its ``at`` fact only.
    """
    text = text if isinstance(text, str) else ""
    m = _ROOM_RE.search(text)
    room = m[1] if m else (room if isinstance(room, str) and _NAME_RE.fullmatch(room) else None)
    out: list[Fact] = [fact("here", room)] if room else []
    m = _SEE_RE.search(text)
    for thing, state in _SEEN_RE.findall(m[1]) if m and m[1] != _NOTHING else ():
        if room:
            out.append(fact("at", thing, room))
        words = [w.strip() for w in state.split(",")] if state else []
        if words and words[0] in STATES:
            out.append(fact(words[0], thing))
            if "empty" in words[1:]:
                out.append(fact("empty", thing))
    for prep, holder, items in _HOLDS_RE.findall(text):
        out += [fact(prep.lower(), item, holder) for item in _NAME_RE.findall(items)]
    m = _EXITS_RE.search(text)
    if m and room:
        out += [fact("exit", room, d, to) for d, to in _EXIT_RE.findall(m[1])]
    m = _CARRIED_RE.search(text)
    if m:
        out += [fact("carried", thing) for thing in _NAME_RE.findall(m[1])]
    return tuple(out)


# --------------------------------------------------------------------------- where things are


class Location(NamedTuple):
    """A statement of where a thing is: ``holder`` is None for "in the <room>" alone."""

    thing: str
    prep: str | None  # "in" | "on" (None with no holder)
    holder: str | None
    room: str


def location_sentence(thing: str, where: tuple[str, str], room: str | None) -> str:
    """What the simulated user says of a thing's place: ``where`` is ``(relation, holder)``.

    ``("at", "Kitchen")`` -> ``"Apple_2 is in the Kitchen."``; ``("on", "Table_0")`` with
    room ``Kitchen`` -> ``"Key_1 is on Table_0 in the Kitchen."``.
    """
    rel, holder = where
    if rel == "at":
        return f"{thing} is in the {holder}."
    return f"{thing} is {rel} {holder}" + (f" in the {room}" if room else "") + "."


# "Cup_3 is in the Bathroom." / "Cup_3 is in Cabinet_2 in the Bathroom." / "... on Table_0 in the Kitchen."
# / "Key_1 was in Drawer_0 in the Bedroom" (a memory advisory's scene fact: the scene started the same way).
_LOCATION_RE = re.compile(
    r"\b(?P<e>[A-Za-z]+_\d+) (?:is|was) (?:(?P<rel>in|on) (?P<h>[A-Za-z]+_\d+) in the |in the )(?P<room>[A-Za-z]+)\b")


def read_locations(text: str | None) -> list[Location]:
    """Every statement of where a thing is in ``text``, in order (the user's
    :func:`location_sentence` and the memory's "X was in Y in the Z" scene facts)."""
    return [Location(m["e"], m["rel"], m["h"], m["room"]) for m in _LOCATION_RE.finditer(text or "")]


# A command named in prose (a verified plan of the positive control's advisories:
# "take Cup_3 from Cabinet_2", "unlock Cabinet_2 with Key_1", "put Cup_3 in Fridge_0").
_NAMED_COMMAND_RE = re.compile(
    r"\b(?:take|open|unlock|put|insert|close|lock) (?P<a>[A-Za-z]+_\d+)(?: (?:from|with|in|on|into) (?P<b>[A-Za-z]+_\d+))?")


def things_in_commands(text: str | None) -> list[str]:
    """The entities the commands written in ``text`` act on, in order (repeats kept)."""
    out = []
    for m in _NAMED_COMMAND_RE.finditer(text or ""):
        out += [name for name in (m["a"], m["b"]) if name]
    return out


# --------------------------------------------------------------------------- routes


def route_sentence(here: str, direction: str, next_room: str, goal_room: str) -> str:
    """``"From the Kitchen, go south to reach the Hallway (on the way to the Bedroom)."``"""
    return f"From the {here}, go {direction} to reach the {next_room}" + (
        f" (on the way to the {goal_room})." if next_room != goal_room else ".")


def exits_sentence(here: str, exits: Iterable[tuple[str, str]]) -> str:
    """``"From the Kitchen you can go east to the Bedroom, south to the Hall."``"""
    ways = ", ".join(f"{d} to the {r}" for d, r in exits)
    return f"From the {here} you can go {ways}."


# --------------------------------------------------------------------------- preferences


def preference_text(kind: str, target: str | None = None) -> str:
    """The sentence a user says for a preference kind (what the simulated user enforces)."""
    return {"close_containers": "Close containers after use.",
            "keep_closed": f"Always leave {target} closed.",
            "lock_after_use": f"Lock {target} again after you unlock it."}[kind]


# The general form of each preference kind: what a lesson across houses says (memory's
# "What users asked in past houses: ..."), read back as ``prefer(kind)`` with no target.
HABIT_TEXT = {"close_containers": "Close containers after use.",
              "keep_closed": "Leave containers closed when you are done with them.",
              "lock_after_use": "Lock containers again after you unlock them."}


def habit_text(kind: str) -> str | None:
    """The general sentence of a preference kind (any container), or None for an unknown kind."""
    return HABIT_TEXT.get(kind)


# An entity's kind is its name before the index: Cabinet_2 -> Cabinet (rooms have no index).
_KIND_RE = re.compile(r"([A-Za-z]+)_\d+")


def kind_of(name: str) -> str | None:
    """``"Cabinet_2"`` -> ``"Cabinet"``; None for a name without an index (a room)."""
    m = _KIND_RE.fullmatch(str(name))
    return m[1] if m else None


# --------------------------------------------------------------------------- a text, as typed facts

_ROUTE_RE = re.compile(r"From the (\w+), go (\w+) to reach the (\w+)")
_EXITS_SENTENCE_RE = re.compile(r"From the (\w+) you can go ((?:\w+ to the \w+(?:, )?)+)")
_WAY_RE = re.compile(r"(\w+) to the (\w+)")
_TARGET = "TARGET"  # stands for the target in a preference sentence turned into its pattern
_PREFERENCE_RES = tuple((kind, re.compile(re.escape(preference_text(kind, _TARGET)).replace(_TARGET, r"([A-Za-z]+_\d+)")))
                        for kind in ("close_containers", "keep_closed", "lock_after_use"))


def read_statements(text: str | None) -> tuple[Fact, ...]:
    """What the sentences of this module state in ``text`` (a prompt's grounding or advisory
    block), as typed facts, in the order they appear:

    - where things are (:func:`read_locations`): ``"Key_1 is on Table_0 in the Kitchen."`` ->
      ``on(Key_1, Table_0), at(Table_0, Kitchen)``; ``"Cup_3 is in the Bathroom."`` -> ``at(Cup_3, Bathroom)``;
    - routes (:func:`route_sentence`, :func:`exits_sentence`): ``exit(Kitchen, south, Hallway)``;
    - preferences (:func:`preference_text`), as the household's own predicate
      ``prefer(kind)`` / ``prefer(kind, target)``: ``"Lock Cabinet_2 again after you unlock it."``
      -> ``prefer(lock_after_use, Cabinet_2)``; their general forms (:func:`habit_text`, any
      container): ``"Lock containers again after you unlock them."`` -> ``prefer(lock_after_use)``.
    """
    text = text or ""
    found: list[tuple[int, tuple[Fact, ...]]] = []
    for m in _LOCATION_RE.finditer(text):
        if m["h"]:
            found.append((m.start(), (fact(m["rel"], m["e"], m["h"]), fact("at", m["h"], m["room"]))))
        else:
            found.append((m.start(), (fact("at", m["e"], m["room"]),)))
    for m in _ROUTE_RE.finditer(text):
        found.append((m.start(), (fact("exit", m[1], m[2], m[3]),)))
    for m in _EXITS_SENTENCE_RE.finditer(text):
        found.append((m.start(), tuple(fact("exit", m[1], d, r) for d, r in _WAY_RE.findall(m[2]))))
    for kind, pattern in _PREFERENCE_RES:
        for m in pattern.finditer(text):
            found.append((m.start(), (fact("prefer", kind, *m.groups()),)))
    for kind, sentence in HABIT_TEXT.items():
        if sentence != preference_text(kind, _TARGET):  # close_containers' is its own general form
            for m in re.finditer(re.escape(sentence), text):
                found.append((m.start(), (fact("prefer", kind),)))
    return tuple(f for _, facts in sorted(found, key=lambda x: x[0]) for f in facts)
