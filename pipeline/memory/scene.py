"""What an episode saw of its scene: scene facts from typed facts, and how an entry carries them.

The memory never reads a world's prose. Each recorded turn reaches it as typed facts
(:class:`pipeline.core.facts.StepFacts`, from the world's
:class:`~pipeline.core.facts.FactReader`, :func:`pipeline.envs.fact_reader`), and
:func:`scene_facts` keeps what they show of the scene, as sentences of that scene, never
commands::

    reader = fact_reader(cfg)                                   # the world's, from pipeline.envs
    facts = scene_facts([(t, reader.read_turn(t)) for t in turns])
    # ["Key_1 was in Drawer_0 in the Bedroom", "Chest_2 in the Bedroom is locked (Key_1 unlocks it)",
    #  "Kitchen -> south -> Bathroom", "Mug_1 was on Table_0 in the Kitchen", "Drawer_1 in the Kitchen was empty"]
    text = with_scene_facts(rationale, facts)                   # they ride in case_summary.rationale_summary
    rationale, facts = split_scene_facts(text)
    read_scene_facts("Key_1 was in Drawer_0 in the Bedroom")    # back as typed facts (a reader of its prompt)
    # (Fact("in", ("Key_1", "Drawer_0")), Fact("at", ("Drawer_0", "Bedroom")))

It reads the shared vocabulary of :mod:`pipeline.core.facts` (``here``, ``at``, ``in``,
``on``, ``open``, ``locked``, ``empty``, ``exit``; ``took``, ``unlocked``, ``went``). A
world's own predicates (a lab's ``temperature(beaker, hot)``) are kept too, as they were
first seen, written in fact notation: a new world needs no change here.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from pipeline.core.facts import OUTCOME_PREDICATES, Fact, StepFacts, fact, first

MAX_SUMMARY_CHARS = 600
# Scene facts ride in ``rationale_summary`` after this marker, separated by FACT_SEPARATOR
# (a fact never contains ";"). The rationale before them keeps at least
# RATIONALE_CHARS_WITH_FACTS characters when the facts need the room.
SCENE_FACTS_MARKER = ". Scene facts: "
FACT_SEPARATOR = "; "
RATIONALE_CHARS_WITH_FACTS = 240

# The predicates of pipeline.core.facts this module reads or deliberately leaves out
# (the agent's own state is no fact of the scene); any other is a world's own.
KNOWN_PREDICATES = frozenset({"here", "at", "in", "on", "open", "closed", "locked", "empty", "exit", "carried",
                              "took", "unlocked", "went"})


@functools.lru_cache(maxsize=4096)
def whole_words(words: tuple[str, ...], ignore_case: bool = False) -> re.Pattern:
    """A pattern of any of ``words`` where no ASCII letter, digit or underscore touches it on
    either side (lookarounds, not ``\\b``: a word may begin or end with punctuation, and
    Korean particles follow names directly); compiled once per argument."""
    return re.compile(r"(?<![A-Za-z0-9_])(?:" + "|".join(re.escape(w) for w in words) + r")(?![A-Za-z0-9_])",
                      re.IGNORECASE if ignore_case else 0)


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at a word boundary, ending in an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


@dataclass
class SceneLog:
    """What an episode saw of its scene, first sightings first (the state before the agent acted).

    Names are matched case-insensitively (a command may lower-case them) and reported as
    the world first spelled them.
    """

    place: dict[str, tuple[str, Optional[str], Optional[str]]] = field(default_factory=dict)  # item -> (prep, holder, room)
    room_of: dict[str, str] = field(default_factory=dict)  # thing / holder -> room
    prep_of: dict[str, str] = field(default_factory=dict)  # holder -> "in" | "on"
    locked: set[str] = field(default_factory=set)
    key_of: dict[str, str] = field(default_factory=dict)  # container -> the key that unlocked it
    first_open: dict[str, bool] = field(default_factory=dict)  # container -> empty when first seen open
    closed: set[str] = field(default_factory=set)  # containers seen closed (never looked into, unless first_open)
    routes: set[tuple[str, str, str]] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)
    other: dict[Fact, None] = field(default_factory=dict)  # a world's own facts, in the order first seen
    names: dict[str, str] = field(default_factory=dict)  # lower-case -> name as the world spells it

    def see(self, facts: Sequence[Fact]) -> Optional[str]:
        """Take in one observation's facts; returns the room they place the agent in (or None)."""
        room = _room(facts)
        empty = {f.args[0] for f in facts if f.pred == "empty"}
        for f in facts:
            for name in f.args:
                self.names.setdefault(name.lower(), name)
            a = f.args
            if f.pred == "at":
                self.room_of.setdefault(a[0], a[1])
            elif f.pred in ("open", "closed", "locked"):
                if room:
                    self.room_of.setdefault(a[0], room)
                self.prep_of.setdefault(a[0], "in")
                if f.pred == "locked":
                    self.locked.add(a[0])
                elif f.pred == "open":
                    self.first_open.setdefault(a[0], a[0] in empty)
                else:
                    self.closed.add(a[0])
            elif f.pred in ("in", "on"):
                item, holder = a
                self.prep_of.setdefault(holder, f.pred)
                if room:
                    self.room_of.setdefault(holder, room)
                self.place.setdefault(item, (f.pred, holder, room))
            elif f.pred == "exit" and room:
                self.routes.add((a[0], a[1].lower(), a[2]))
            elif f.pred not in KNOWN_PREDICATES:
                self.other.setdefault(f)
        return room

    def act(self, did: Sequence[Fact], here: Optional[str], there: Optional[str]) -> None:
        """What a carried-out step shows: where a taken item was, which key opens what, a route.

        Args:
            did: the step's :attr:`~pipeline.core.facts.StepFacts.did` facts.
            here: the room the step was taken in; ``there``: the room it led to.
        """
        for f in did:
            a = [self.canon(x) for x in f.args]
            if f.pred == "took" and len(a) == 2:
                item, holder = a
                self.taken.add(item)
                self.place.setdefault(item, (self.prep_of.get(holder, "in"), holder, self.room_of.get(holder, here)))
            elif f.pred == "took" and len(a) == 1:
                self.taken.add(a[0])
                if here:
                    self.place.setdefault(a[0], ("on", None, here))
            elif f.pred == "unlocked" and len(a) == 2:
                container, key = a
                self.locked.add(container)
                self.key_of.setdefault(container, key)
                if here:
                    self.room_of.setdefault(container, here)
            elif f.pred == "went" and here and there and here != there:
                self.routes.add((here, f.args[0].lower(), there))
            elif f.pred not in KNOWN_PREDICATES:  # a world's own (advanced(command): it raised the score)
                self.other.setdefault(Fact(f.pred, tuple(a)))

    def canon(self, name: str) -> str:
        """``name`` as the world spells it (commands may be lower-cased)."""
        return self.names.get(name.lower(), name)

    def facts(self) -> list[str]:
        """Every fact, in a fixed order: groups by priority, each group sorted."""
        def where(item: str) -> str:
            prep, holder, room = self.place[item]
            if holder is None:
                return f"{item} was on the floor of the {room}"
            return f"{item} was {prep} {holder}" + (f" in the {room}" if room else "")

        def at(c: str) -> str:
            return f"{c} in the {self.room_of[c]}" if c in self.room_of else c

        taken = sorted(where(i) for i in self.taken if i in self.place)
        locked = sorted(f"{at(c)} is locked" + (f" ({self.key_of[c]} unlocks it)" if c in self.key_of else "")
                        for c in self.locked)
        routes = sorted(f"{a} -> {d} -> {b}" for a, d, b in self.routes)
        seen = sorted(where(i) for i in self.place if i not in self.taken)
        empty = sorted(f"{at(c)} was empty" for c, was_empty in self.first_open.items() if was_empty)
        holders = {holder for _, holder, _ in self.place.values()}
        unsearched = sorted(f"{at(c)} was never opened" for c in self.closed
                            if c not in self.first_open and c not in self.locked and c not in holders)
        outcomes = [str(f) for f in self.other if f.pred in OUTCOME_PREDICATES]
        other = [str(f) for f in self.other if f.pred not in OUTCOME_PREDICATES]
        return outcomes + taken + locked + routes + seen + empty + unsearched + other


def _room(facts: Sequence[Fact]) -> Optional[str]:
    """The room a ``here`` fact places the agent in (None: no fact says)."""
    here = first(facts, "here")
    return here.args[0] if here else None


def scene_facts(turns: Sequence[tuple[Mapping[str, Any], StepFacts]]) -> list[str]:
    """What an episode's turns show of its scene, as sentences of the scene (never commands).

    In priority order, each group sorted: what the steps' outcomes said (a world's
    :data:`~pipeline.core.facts.OUTCOME_PREDICATES`: few, and what the entry's bounded summary
    must keep), where the items the agent took were found
    ("Key_1 was in Drawer_0 in the Bedroom"), locked containers and the key that opened
    them ("Chest_2 in the Bedroom is locked (Key_1 unlocks it)"), routes between rooms
    ("Kitchen -> south -> Bathroom"), where the other items seen were, containers found
    empty ("Drawer_1 in the Kitchen was empty"), containers seen closed and never looked
    into ("Chest_3 in the Bedroom was never opened"), then a world's other facts. An item's place
    is its first sighting (before the agent moved it).

    Args:
        turns: ``(turn row, its StepFacts)`` in ``turn_index`` order. A turn's ``did``
            counts only when its row says it was carried out: ``action_valid`` true and
            ``changed`` not false.

    Returns:
        Distinct facts; none contains ``;``.
    """
    log = SceneLog()
    rooms = [_room(step.seen) for _, step in turns]
    for i, (row, step) in enumerate(turns):
        here = log.see(step.seen)
        if row.get("action_valid") is True and row.get("changed") is not False and step.did:
            # Where the step led: the room its response described, else the next turn's.
            there = _room(step.after) or (rooms[i + 1] if i + 1 < len(rooms) else None)
            log.act(step.did, here, there)
        log.see(step.after)
    return [f for f in dict.fromkeys(log.facts()) if ";" not in f]


def join_facts(facts: Sequence[str], limit: int) -> str:
    """The leading facts joined by :data:`FACT_SEPARATOR`, whole facts only, at most ``limit`` characters."""
    out: list[str] = []
    size = 0
    for f in facts:
        extra = len(f) + (len(FACT_SEPARATOR) if out else 0)
        if size + extra > limit:
            break
        out.append(f)
        size += extra
    return FACT_SEPARATOR.join(out)


def with_scene_facts(rationale: str, facts: Sequence[str], limit: int = MAX_SUMMARY_CHARS) -> str:
    """``rationale`` (clipped) then :data:`SCENE_FACTS_MARKER` and as many whole facts as fit in ``limit``.

    The rationale gives way to the facts down to :data:`RATIONALE_CHARS_WITH_FACTS`
    characters; without facts (or when none fits) it is the rationale clipped to ``limit``.
    """
    if not facts:
        return clip(rationale, limit)
    wanted = len(SCENE_FACTS_MARKER) + len(FACT_SEPARATOR.join(facts)) + 1
    head = clip(rationale, max(min(RATIONALE_CHARS_WITH_FACTS, limit), limit - wanted))
    text = join_facts(facts, limit - len(head) - len(SCENE_FACTS_MARKER) - 1)
    return f"{head}{SCENE_FACTS_MARKER}{text}." if text else clip(rationale, limit)


def split_scene_facts(text: str) -> tuple[str, list[str]]:
    """``(rationale, facts)`` of a ``rationale_summary`` written by :func:`with_scene_facts`."""
    if SCENE_FACTS_MARKER not in text:
        return text, []
    head, _, tail = text.rpartition(SCENE_FACTS_MARKER)
    tail = tail[:-1] if tail.endswith(".") else tail
    return head, [f for f in tail.split(FACT_SEPARATOR) if f.strip()]


# --------------------------------------------------------------------------- reading them back

# The sentences of SceneLog.facts(), in any text (an advisory carries them after its lead);
# a fact holds no "." or ";". A fact cut by a message's length bound matches only when what
# is left is a whole sentence of this form. A name is one word (the household's Key_1,
# Bedroom), or several lower-case words, no article first (ScienceWorld's metal pot, art
# studio): a sentence that starts with such a name starts the text or follows ": " or "; "
# (a lead, another fact), and one that ends with it ends at ";", "." or the text's end.
_W = r"[A-Za-z][A-Za-z0-9_]*"
_MW = r"(?!(?:the|an?) )[a-z][a-z0-9]*(?: [a-z0-9]+)+?"
_N = rf"({_W}|{_MW})"  # followed by a sentence's own words
_F = rf"((?<![A-Za-z0-9_]){_W}|(?:^|(?<=: )|(?<=; )){_MW})"  # a sentence's first name
_L = rf"({_MW}(?=[;.]|$)|{_W}\b)"  # a sentence's last name
_FLOOR_RE = re.compile(rf"{_F} was on the floor of the {_L}")
_PLACE_RE = re.compile(rf"{_F} was (in|on) (?!the\b){_N}(?: in the {_N})?(?=[;.]|$)")
_LOCKED_RE = re.compile(rf"{_F}(?: in the {_N})? is locked(?: \({_N} unlocks it\))?")
_ROUTE_RE = re.compile(rf"{_F} -> {_N} -> {_L}")
_EMPTY_RE = re.compile(rf"{_F}(?: in the {_N})? was empty\b")
_UNOPENED_RE = re.compile(rf"{_F}(?: in the {_N})? was never opened\b")
_OTHER_RE = re.compile(r"\b([a-z_]+)\(([A-Za-z0-9_, ]*)\)")


def read_scene_facts(text: str | None) -> tuple[Fact, ...]:
    """The typed facts that the scene-fact sentences of :meth:`SceneLog.facts` state, in
    ``text`` (their inverse, in the order the sentences appear).

    ``"Key_1 was in Drawer_0 in the Bedroom"`` -> ``in(Key_1, Drawer_0), at(Drawer_0, Bedroom)``;
    ``"Mug_2 was on the floor of the Kitchen"`` -> ``at(Mug_2, Kitchen)``; ``"Chest_2 in the
    Bedroom is locked (Key_1 unlocks it)"`` -> ``locked(Chest_2), at(Chest_2, Bedroom),
    unlocked(Chest_2, Key_1)`` (the key that unlocked it); ``"Kitchen -> south -> Bathroom"`` ->
    ``exit(Kitchen, south, Bathroom)``; ``"Drawer_1 in the Kitchen was empty"`` -> ``empty(Drawer_1),
    at(Drawer_1, Kitchen)``; ``"Chest_3 in the Bedroom was never opened"`` -> ``closed(Chest_3),
    at(Chest_3, Bedroom)`` (its contents unknown); a world's own fact in fact notation (``temperature(Beaker_1, hot)``) as it is.
    """
    text = text or ""
    found: list[tuple[int, tuple[Fact, ...]]] = []
    for m in _FLOOR_RE.finditer(text):
        found.append((m.start(), (fact("at", m[1], m[2]),)))
    for m in _PLACE_RE.finditer(text):
        found.append((m.start(), (fact(m[2], m[1], m[3]),) + ((fact("at", m[3], m[4]),) if m[4] else ())))
    for m in _LOCKED_RE.finditer(text):
        found.append((m.start(), (fact("locked", m[1]),) + ((fact("at", m[1], m[2]),) if m[2] else ())
                      + ((fact("unlocked", m[1], m[3]),) if m[3] else ())))
    for m in _ROUTE_RE.finditer(text):
        found.append((m.start(), (fact("exit", m[1], m[2], m[3]),)))
    for m in _EMPTY_RE.finditer(text):
        found.append((m.start(), (fact("empty", m[1]),) + ((fact("at", m[1], m[2]),) if m[2] else ())))
    for m in _UNOPENED_RE.finditer(text):
        found.append((m.start(), (fact("closed", m[1]),) + ((fact("at", m[1], m[2]),) if m[2] else ())))
    for m in _OTHER_RE.finditer(text):
        if m[1] not in KNOWN_PREDICATES:
            found.append((m.start(), (Fact(m[1], tuple(a.strip() for a in m[2].split(",") if a.strip())),)))
    return tuple(f for _, facts in sorted(found, key=lambda x: x[0]) for f in facts)
