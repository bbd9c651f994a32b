"""The household world model: facts, directions, the state read from facts, preferences.

One model serves the environment (:class:`pipeline.envs.household.env.HouseholdEnv`), the
games stage, the simulated user (:mod:`pipeline.envs.household.user`, which reads the same
:class:`World` together with the scene spec) and the expert demonstrations
(:mod:`pipeline.policy.expert`)::

    world = World.from_facts(typed_facts(state["facts"]))     # TextWorld propositions
    world = World.from_strings(info["facts"], kinds)           # the env's fact strings
    world.player, world.room_exits(), world.where("Apple_2"), world.room_of("Key_1")
    world.observation_facts()                                  # what the player sees, typed (HouseholdEnv.facts())
    parse_fact("in(Apple_2, Fridge_0)")                        # ("in", ("Apple_2", "Fridge_0"))
    check_preferences(["close_containers"], info["facts"])     # {"close_containers": True}

Facts are written ``pred(arg, ...)`` (:func:`fact_str`); TextWorld's own strings may carry
types (``in(Apple_2: o, Cabinet_0: c)``), which :func:`parse_fact` reads with ``lenient=True``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipeline.core.facts import Fact, fact

DIRECTIONS = ("north", "south", "east", "west")  # the compass of the generated scenes
# Opposite directions; up / down only ever come from a hand-written scene's connections.
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east", "up": "down", "down": "up"}
DIRECTION_FACTS = {f"{d}_of": d for d in DIRECTIONS}  # east_of(r2, r1): r2 lies east of r1
PORTABLE_TYPES = frozenset({"o", "k", "f"})  # TextWorld types that can be carried
PLAYER = "P"  # TextWorld's player entity
INVENTORY = "I"  # TextWorld's inventory entity
PREFERENCE_KINDS = ("close_containers", "keep_closed", "lock_after_use")

TypedFact = tuple[str, tuple[tuple[str, str], ...]]  # (predicate, ((name, type), ...))
_FACT_RE = re.compile(r"^\s*(\w+)\(([^()]*)\)\s*$")  # the env's fact strings, exactly
_LENIENT_FACT_RE = re.compile(r"^\s*([A-Za-z_][\w]*)\s*\((.*)\)\s*$")  # also TextWorld's "name: type"
_ARITY = {"at": 2, "in": 2, "on": 2, "open": 1, "closed": 1, "locked": 1, "match": 2}  # what World reads


# --------------------------------------------------------------------------- facts


def fact_str(pred: str, names: Sequence[str]) -> str:
    """``fact_str("in", ["Apple_2", "Fridge_0"]) -> "in(Apple_2, Fridge_0)"``."""
    return f"{pred}({', '.join(names)})"


def parse_fact(text: str, *, lenient: bool = False) -> tuple[str, tuple[str, ...]] | None:
    """Inverse of :func:`fact_str`: ``"in(Apple_2, Fridge_0)"`` -> ``("in", ("Apple_2", "Fridge_0"))``.

    Args:
        text: the fact.
        lenient: also accept TextWorld's ``name: type`` arguments (``"in(Apple_2: o, I)"``
            -> ``("in", ("Apple_2", "I"))``) and anything that looks like a predicate
            (what the simulated user reads); return ``None`` instead of raising for a
            string that is not one.

    Raises:
        ValueError: (strict only) the text is not ``pred(arg, ...)``; the message names it.
    """
    if lenient:
        split = _split_lenient(text)
        return None if split is None else (split[0], tuple(name for name, _ in split[1]))
    m = _FACT_RE.match(text)
    if not m:
        raise ValueError(f"not a fact {text!r}: expected pred(arg, ...)")
    args = tuple(a.strip() for a in m.group(2).split(",") if a.strip())
    return m.group(1), args


def _split_lenient(text: Any) -> tuple[str, list[tuple[str, str]]] | None:
    """``"in(Apple_2: o, I)"`` -> ``("in", [("Apple_2", "o"), ("I", "")])`` (None if not a fact)."""
    m = _LENIENT_FACT_RE.match(str(text))
    if m is None:
        return None
    if not m.group(2).strip():
        return m.group(1), []
    args = []
    for a in m.group(2).split(","):
        name, _, kind = a.partition(":")
        args.append((name.strip(), kind.strip()))
    return m.group(1), args


def plain_fact(fact: str) -> str:
    """``"open(Fridge_0: c)"`` -> ``"open(Fridge_0)"`` (the env's fact strings; others unchanged)."""
    p = parse_fact(fact, lenient=True)
    return fact_str(p[0], p[1]) if p else str(fact)


def typed_facts(propositions: Iterable[Any], name_of: Mapping[str, str] | None = None) -> list[TypedFact]:
    """TextWorld ``Proposition`` objects -> sorted typed facts with entity names.

    Args:
        propositions: ``textworld.logic.Proposition`` objects.
        name_of: variable id -> entity name (for the GameMaker's ids such as ``c_0``);
            without it the variables' own names are used (the env's facts carry names).
    """
    out = set()
    for p in propositions:
        args = tuple(((name_of or {}).get(v.name, v.name), v.type) for v in p.arguments)
        out.add((p.name, args))
    return sorted(out)


def scene_kinds(scene: Mapping[str, Any]) -> dict[str, str]:
    """Entity name -> TextWorld type from a scene spec (rooms, containers, supporters, objects, keys)."""
    kinds = {r: "r" for r in scene.get("rooms", [])}
    for group, kind in (("containers", "c"), ("supporters", "s"), ("objects", "o"), ("keys", "k")):
        for e in scene.get(group, []):
            kinds[e["name"]] = kind
    return kinds


# --------------------------------------------------------------------------- world


@dataclass
class World:
    """A household state read from facts: where the player and every entity are.

    ``location`` maps each portable entity to ``(relation, holder)`` exactly as TextWorld's
    facts say: ``("at", room)`` on the floor, ``("in", container)``, ``("on", supporter)``
    or ``("in", "I")`` when carried.
    """

    player: str = ""
    kinds: dict[str, str] = field(default_factory=dict)  # name -> TextWorld type
    exits: dict[str, dict[str, str]] = field(default_factory=dict)  # room -> direction -> room
    container_room: dict[str, str] = field(default_factory=dict)
    supporter_room: dict[str, str] = field(default_factory=dict)
    container_state: dict[str, str] = field(default_factory=dict)  # open | closed | locked
    location: dict[str, tuple[str, str]] = field(default_factory=dict)
    key_opens: dict[str, str] = field(default_factory=dict)
    facts: frozenset[str] = frozenset()

    @classmethod
    def from_facts(cls, facts: Iterable[TypedFact]) -> "World":
        """The state of typed facts (:func:`typed_facts`)."""
        w = cls()
        strs = set()
        for pred, args in facts:
            names = [n for n, _ in args]
            strs.add(fact_str(pred, names))
            for n, t in args:
                if n not in (PLAYER, INVENTORY):
                    w.kinds[n] = t
            if pred == "at" and args[0][1] == PLAYER:
                w.player = names[1]
            elif pred == "at" and args[0][1] == "c":
                w.container_room[names[0]] = names[1]
            elif pred == "at" and args[0][1] == "s":
                w.supporter_room[names[0]] = names[1]
            elif pred in ("at", "in", "on") and args[0][1] in PORTABLE_TYPES:
                w.location[names[0]] = (pred, names[1])
            elif pred in ("open", "closed", "locked") and args[0][1] == "c":
                w.container_state[names[0]] = pred
            elif pred == "match":
                w.key_opens[names[0]] = names[1]
            elif pred.endswith("_of") and pred[:-3] in DIRECTIONS and len(args) == 2:
                # north_of(a, b): a is north of b, so going north from b leads to a.
                w.exits.setdefault(names[1], {})[pred[:-3]] = names[0]
                w.exits.setdefault(names[0], {})[OPPOSITE[pred[:-3]]] = names[1]
        w.facts = frozenset(strs)
        return w

    @classmethod
    def from_strings(cls, facts: Iterable[str], kinds: Mapping[str, str],
                     canon: Callable[[str], str] | None = None) -> "World":
        """The state of fact strings (the env's ``info["facts"]`` or TextWorld's typed strings).

        Args:
            facts: ``in(Apple_2, Fridge_0)`` or ``in(Apple_2: o, Fridge_0: c)``; strings that
                are not facts, and facts with the wrong number of arguments, are skipped.
            kinds: name -> TextWorld type for arguments without a ``: type`` (a scene's
                :func:`scene_kinds`); ``P`` and ``I`` need none.
            canon: maps each argument to its canonical spelling (e.g. the scene's, for
                lower-cased names) before it is typed.
        """
        typed = []
        for f in facts:
            split = _split_lenient(f)
            if split is None or len(split[1]) != _ARITY.get(split[0], len(split[1])):
                continue
            args = []
            for name, kind in split[1]:
                name = canon(name) if canon is not None else name
                args.append((name, kind or kinds.get(name) or (name if name in (PLAYER, INVENTORY) else "")))
            typed.append((split[0], tuple(args)))
        return cls.from_facts(typed)

    # -- queries -------------------------------------------------------------------

    def rooms(self) -> list[str]:
        return sorted(n for n, t in self.kinds.items() if t == "r")

    def inventory(self) -> list[str]:
        return sorted(o for o, (rel, h) in self.location.items() if rel == "in" and h == INVENTORY)

    def room_exits(self, room: str | None = None) -> dict[str, str]:
        """direction -> room for ``room`` (the player's by default), in N/S/E/W order."""
        ex = self.exits.get(room or self.player, {})
        return {d: ex[d] for d in DIRECTIONS if d in ex}

    def contents(self, holder: str) -> list[str]:
        return sorted(o for o, (rel, h) in self.location.items() if h == holder and rel in ("in", "on"))

    def where(self, entity: str) -> tuple[str, str] | None:
        """``("in"|"on"|"at", holder)`` of an entity as the facts say; ``("in", "I")`` when carried.

        Containers and supporters are ``("at", room)``, and so is the player (``P``);
        ``None`` for a room or an entity no fact places.
        """
        if entity in self.location:
            return self.location[entity]
        if entity in self.container_room:
            return "at", self.container_room[entity]
        if entity in self.supporter_room:
            return "at", self.supporter_room[entity]
        if entity == PLAYER and self.player:
            return "at", self.player
        return None

    def room_of(self, entity: str, depth: int = 0) -> str | None:
        """The room an entity is in (through its holder); None when carried or unknown."""
        if entity in self.container_room:
            return self.container_room[entity]
        if entity in self.supporter_room:
            return self.supporter_room[entity]
        rel, holder = self.location.get(entity, (None, None))
        if holder is None or holder == INVENTORY or depth > 4:
            return None
        return holder if rel == "at" else self.room_of(holder, depth + 1)

    def room_view(self, room: str | None = None) -> dict[str, list[str]]:
        """What the player sees in ``room``: fixtures, loose objects, reachable contents."""
        room = room or self.player
        containers = sorted(c for c, r in self.container_room.items() if r == room)
        supporters = sorted(s for s, r in self.supporter_room.items() if r == room)
        floor = sorted(o for o, (rel, h) in self.location.items() if rel == "at" and h == room)
        inside = []
        for s in supporters:
            inside += self.contents(s)
        for c in containers:
            if self.container_state.get(c) == "open":
                inside += self.contents(c)
        return {"containers": containers, "supporters": supporters, "floor": floor, "inside": inside}

    def visible_entities(self) -> list[str]:
        v = self.room_view()
        return (v["containers"] + v["supporters"] + v["floor"] + v["inside"]
                + list(self.room_exits().values()))

    def observation_facts(self) -> tuple[Fact, ...]:
        """What the player sees, as typed facts (:mod:`pipeline.core.facts`), in the order the
        description states them (:func:`pipeline.envs.household.text.describe`).

        ``here``; each container of the room (``at``, its state, ``empty`` when open and
        holding nothing), each supporter, each thing on the floor; what supporters and open
        containers hold; the exits (N/S/E/W); what the player carries.
        """
        room = self.player
        view = self.room_view(room)
        out = [fact("here", room)]
        for c in view["containers"]:
            state = self.container_state.get(c, "closed")
            out += [fact("at", c, room), fact(state, c)]
            if state == "open" and not self.contents(c):
                out.append(fact("empty", c))
        out += [fact("at", thing, room) for thing in view["supporters"] + view["floor"]]
        for holder in view["supporters"] + [c for c in view["containers"] if self.container_state.get(c) == "open"]:
            out += [fact(self.location[item][0], item, holder) for item in self.contents(holder)]
        out += [fact("exit", room, d, to) for d, to in self.room_exits().items()]
        out += [fact("carried", thing) for thing in self.inventory()]
        return tuple(out)


# --------------------------------------------------------------------------- preferences


def parse_preference(pref: str | Mapping[str, Any]) -> tuple[str, str, str | None]:
    """A preference (id string ``kind`` / ``kind:target`` or a scene-spec dict) -> (id, kind, target)."""
    if isinstance(pref, Mapping):
        pid = str(pref.get("id", ""))
        kind = str(pref.get("kind", pid.split(":")[0]))
        target = pref.get("target") or (pid.split(":", 1)[1] if ":" in pid else None)
    else:
        pid = str(pref)
        kind, _, rest = pid.partition(":")
        target = rest or None
    if kind not in PREFERENCE_KINDS:
        raise ValueError(f"unknown preference kind {kind!r} in {pref!r}: expected one of {PREFERENCE_KINDS}")
    if kind != "close_containers" and not target:
        raise ValueError(f"preference {pref!r} of kind {kind} needs a target container")
    return pid or (kind if target is None else f"{kind}:{target}"), kind, target


def check_preferences(preferences: Iterable[str | Mapping[str, Any]], facts: Iterable[str],
                      opened: Iterable[str] | None = None,
                      unlocked: Iterable[str] | None = None) -> dict[str, bool]:
    """Which scene preferences hold in the final facts.

    Args:
        preferences: ids (``close_containers``, ``keep_closed:Fridge_0``,
            ``lock_after_use:Cabinet_1``) or scene-spec dicts.
        facts: fact strings such as ``info["facts"]`` (``open(Fridge_0)``, ``locked(Cabinet_1)``).
        opened: containers opened during the episode; ``None`` assumes every container
            started closed (true of the generated scenes), so any open one was opened.
        unlocked: containers unlocked during the episode; ``None`` assumes the
            ``lock_after_use`` container started locked.

    Returns:
        ``{preference_id: held}``.
    """
    facts = set(facts)
    open_now = {parse_fact(f)[1][0] for f in facts if f.startswith("open(")}
    out = {}
    for pref in preferences:
        pid, kind, target = parse_preference(pref)
        if kind == "close_containers":
            ok = not (open_now & set(opened)) if opened is not None else not open_now
        elif kind == "keep_closed":
            ok = target not in open_now
        else:  # lock_after_use
            ok = fact_str("locked", [target]) in facts or (unlocked is not None and target not in set(unlocked))
        out[pid] = ok
    return out
