"""Every ScienceWorld sentence that is read back: an observation's description and the
simulated user's statements, written from typed facts and read into them again.

One sentence per fact, one per line in a description, so that the reader of a recorded
turn (:mod:`pipeline.envs.scienceworld.reader`) and the ``reader`` agent get the facts
back without knowing the engine's own prose::

    describe((fact("here", "kitchen"), fact("in", "metal pot", "cupboard")))
    # 'You are in the kitchen.\\nThe metal pot is in the cupboard.'
    read_statements("The metal pot is in the cupboard.")   # (in(metal pot, cupboard),)

Object names are the engine's lower-case referents; a sentence names them after "the".
"""

from __future__ import annotations

import re
from typing import Iterable

from pipeline.core.facts import Fact, WorldWords, fact

# ScienceWorld's words in the world-agnostic packages' text (pipeline.envs.world_words).
WORDS = WorldWords(
    preference_principle="Respect the user's preferences while completing the task.",
    success="the engine's task completion with a score that is not negative",
)

# The things a task description names ("move it to the red box in the kitchen"): the coloured
# answer boxes and the rooms of the engine's map (the memory's signature counts them).
ENTITY_PATTERN = (r"(?:(?:red|green|blue|orange|yellow|purple|violet|black|white) box"
                  r"|art studio|bathroom|bedroom|foundry|greenhouse|hallway|kitchen|living room|outside|workshop)"
                  r"(?![A-Za-z])")

# pred -> (template, regex); the regex reads what the template writes.
_FORMS: list[tuple[str, str, re.Pattern]] = [
    ("here", "You are in the {0}.", re.compile(r"^You are in the (.+)\.$")),
    ("at", "You see the {0} here in the {1}.", re.compile(r"^You see the (.+) here in the (.+)\.$")),
    ("in", "The {0} is in the {1}.", re.compile(r"^The (.+) is in the (.+?)\.$")),
    ("carried", "You carry the {0}.", re.compile(r"^You carry the (.+)\.$")),
    ("open", "The {0} is open.", re.compile(r"^The (.+) is open\.$")),
    ("closed", "The {0} is closed.", re.compile(r"^The (.+) is closed\.$")),
    ("active", "The {0} is on.", re.compile(r"^The (.+) is on\.$")),
    ("inactive", "The {0} is off.", re.compile(r"^The (.+) is off\.$")),
    ("matter", "The {0} is a {1}.", re.compile(r"^The (.+) is a (liquid|gas|plasma)\.$")),
    # exit(kitchen, hallway, hallway): a door of the kitchen, taken by the room's name (go to hallway); the
    # nested group gives the room twice, as way and destination
    ("exit", "From the {0} a door leads to the {2}.", re.compile(r"^From the (.+) a door leads to the ((.+))\.$")),
    ("room_of", "The {0} is a room you can reach.", re.compile(r"^The (.+) is a room you can reach\.$")),
]
_TEMPLATE = {pred: tmpl for pred, tmpl, _ in _FORMS}


def sentence(f: Fact) -> str | None:
    """The sentence of one fact (None for a predicate this module does not write)."""
    tmpl = _TEMPLATE.get(f.pred)
    return tmpl.format(*f.args) if tmpl is not None else None


def describe(facts: Iterable[Fact]) -> str:
    """A description: one sentence per fact, one per line, in the facts' order."""
    return "\n".join(s for s in (sentence(f) for f in facts) if s)


def read_sentence(text: str) -> Fact | None:
    """The fact one sentence states (None when it is no sentence of this module)."""
    text = text.strip()
    for pred, _, rx in _FORMS:
        m = rx.match(text)
        if m:
            return fact(pred, *m.groups())
    return None


_SPLIT = re.compile(r"(?<=\.)\s+|\n")


def read_statements(text: str | None) -> tuple[Fact, ...]:
    """Every fact the sentences of ``text`` state, in order (other text states nothing)."""
    out = []
    for part in _SPLIT.split(text or ""):
        # a feedback line ("feedback : spatial: The metal pot is in the cupboard.") or a bullet
        part = re.sub(r"^.*?:\s(?=(The|You|From) )", "", part.strip().lstrip("-* "))
        f = read_sentence(part)
        if f is not None:
            out.append(f)
    return tuple(dict.fromkeys(out))


def read_description(text: str | None, room: str | None = None) -> tuple[Fact, ...]:
    """The facts of a description (:func:`describe`'s inverse); ``here(room)`` first when
    the text names no room and ``room`` is given."""
    facts = read_statements(text)
    if room and not any(f.pred == "here" for f in facts):
        facts = (fact("here", room),) + facts
    return facts
