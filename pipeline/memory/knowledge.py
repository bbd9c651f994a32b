"""What the store knows beyond one episode: a house's facts over all its visits, and lessons across houses.

An entry keeps what its own episode saw (:mod:`pipeline.memory.scene`). Experience is more
than that: a house visited four times is known better than after one visit (Reflexion and
CLIN adapt over trials), and what many houses had in common carries over to a house never
seen (CLIN's and ExpeL's abstract lessons). :class:`StoreKnowledge` gathers both from the
store's entries, through the world's :class:`~pipeline.core.facts.FactReader` (the memory
reads no world's prose)::

    know = StoreKnowledge.from_store(store, reader=fact_reader(cfg))
    know.house_facts("scene_03")        # every fact past visits of scene_03 saw, first sightings
    know.lessons()                      # ["Apple in a Fridge (5 of 6 seen)", "Key in a Drawer (7 of 9 seen)", ...]
    know.habits()                       # the users' preferences most houses shared, as the world words them

Lessons are stated at the level of kinds (``Apple``, ``Drawer``: the world's
``FactReader.kind``), never an entity of a house, so they can name no task's answer; how
many sightings support them is part of the sentence. :func:`read_lessons` reads them back
(the ``reader`` agent's search priors).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipeline.core.facts import OUTCOME_PREDICATES, Fact, FactReader
from pipeline.memory.scene import read_scene_facts, split_scene_facts, whole_words
from pipeline.memory.schemas import table_to_entries

# "Apple in a Fridge (5 of 6 seen)": things of a kind, the kind of holder most of them were
# found in, and the support. Kinds are the world's (one or more words, no digits needed).
LESSON = "{thing} {prep} a {holder} ({count} of {total} seen)"
# read_lessons finds what r"\b([A-Za-z][A-Za-z ]*?) (in|on) an? ([A-Za-z][A-Za-z ]*?) \((\d+) of (\d+) seen\)"
# finds, in linear time: that one regex backtracks cubically on a long line of "Apple in a " (1.24 s for 200
# repeats; it runs over the reader's whole prompt, feedback a person typed included). Everything before " (" in
# a match is letters and spaces, so a match lies in one maximal run of them (_LESSON_RUN) that ends with the
# space of the support (_LESSON_SUPPORT); the holder then runs to that space, the thing to the first connector
# (_LESSON_LINK) after its start, and the thing starts at the run's first word that has a connector after it.
_LESSON_RUN = re.compile(r"[A-Za-z ]+")
_LESSON_SUPPORT = re.compile(r" \((\d+) of (\d+) seen\)")
_LESSON_LINK = re.compile(r"(?=( (in|on) an? )[A-Za-z])")  # a lookahead: links may overlap (" in a in a ")
_LESSON_START = re.compile(r"\b[A-Za-z]")


def _lesson_matches(text: str) -> Iterable[tuple[str, str, str, str, str]]:
    """``(thing, prep, holder, count, total)`` of every lesson sentence in ``text``, in order (module comment)."""
    for run in _LESSON_RUN.finditer(text):
        end = run.end() - 1  # the space before "(" (the run is maximal: "(" follows it, or nothing)
        support = _LESSON_SUPPORT.match(text, end)
        if support is None:
            continue
        links = [(m.start(), m[1], m[2]) for m in _LESSON_LINK.finditer(text, run.start(), end)]
        start = _LESSON_START.search(text, run.start(), links[-1][0]) if links else None
        if start is None:
            continue
        s = start.start()
        i, link, prep = next(lk for lk in links if lk[0] > s)
        yield text[s:i], prep, text[i + len(link):end], support[1], support[2]
HOUSE_LEAD = "This house, from {n} past visit{s}"
LESSONS_LEAD = "Lessons from {n} past house{s}"
HABITS_LEAD = "What users asked in past houses"
MIN_SUPPORT = 2  # sightings a placement lesson needs
MAX_COUNT_DIGITS = 9  # read_lessons: a longer count is no support this project writes


@dataclass(frozen=True)
class Lesson:
    """Things of kind ``thing`` were found ``prep`` (in / on) a holder of kind ``holder``, ``count`` of ``total`` times."""

    thing: str
    holder: str
    count: int
    total: int
    prep: str = "in"

    def text(self) -> str:
        return LESSON.format(thing=self.thing, prep=self.prep, holder=self.holder, count=self.count, total=self.total)


def read_lessons(text: str | None) -> list[Lesson]:
    """The placement lessons stated in ``text`` (:meth:`Lesson.text`'s inverse), in order.

    A count of more than :data:`MAX_COUNT_DIGITS` digits is no lesson of this project's (a
    store's support is a number of entries): such a sentence is skipped, never handed to
    ``int`` (which refuses more than 4,300 digits: typed feedback could crash the reader).
    """
    return [Lesson(thing, holder, int(count), int(total), prep)
            for thing, prep, holder, count, total in _lesson_matches(text or "")
            if len(count) <= MAX_COUNT_DIGITS and len(total) <= MAX_COUNT_DIGITS and 0 < int(count) <= int(total)]


def store_entries(store: Any) -> list[dict[str, Any]]:
    """The entries of an :class:`~pipeline.memory.store.EpisodicStore`, a store table or a list of entries."""
    if hasattr(store, "entries"):
        return list(store.entries())
    if hasattr(store, "table"):
        return table_to_entries(store.table)
    return list(store)


def of_quest(entry: Mapping[str, Any], scene: str | None, quest: str) -> bool:
    """Whether ``entry`` is an episode of quest ``quest`` of ``scene`` (any scene's when None):
    the entries ``memory.exclude_same_quest`` keeps from a query of that quest, as the
    retriever leaves them out (:meth:`pipeline.memory.retrieval.RetrievalIndex.top`)."""
    p = entry.get("provenance") or {}
    return str(p.get("quest_id")) == str(quest) and (scene is None or str(p.get("scene_id")) == str(scene))


def entry_facts(entry: Mapping[str, Any]) -> list[str]:
    """An entry's scene facts: the complete list when it carries one, else those its rationale keeps."""
    facts = entry.get("scene_facts")
    if facts:
        return list(facts)
    return split_scene_facts(str((entry.get("case_summary") or {}).get("rationale_summary") or ""))[1]


@dataclass
class StoreKnowledge:
    """Per house, the facts of all its visits, where kinds of things were, and what its users asked.

    Attributes:
        facts: scene id -> distinct scene facts over its entries (entry order: earlier visits first).
        visits: scene id -> entries of that scene.
        placements: scene id -> {(thing kind, holder kind)} of every thing seen in a holder
            there (a house counts a thing once: its quests all start from the same layout).
        preferences: scene id -> the ``prefer`` facts its users' preference feedback states.
        sentences: a general ``prefer`` fact -> the world's sentence for it.
        unlockers: the kinds of things seen unlocking a container (keys).
    """

    facts: dict[str, list[str]] = field(default_factory=dict)
    visits: dict[str, int] = field(default_factory=dict)
    placements: dict[str, set[tuple[str, str, str, str]]] = field(default_factory=dict)
    preferences: dict[str, set[str]] = field(default_factory=dict)
    sentences: dict[str, str] = field(default_factory=dict)
    unlockers: set[str] = field(default_factory=set)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)  # answers, computed once per question

    @classmethod
    def from_entries(cls, entries: Iterable[Mapping[str, Any]], reader: FactReader | None) -> "StoreKnowledge":
        """Gather it from entries (any order: sorted by entry id here). Without a ``reader``
        there are house facts but no lessons (kinds and preferences are the world's)."""
        know = cls()
        for e in sorted(entries, key=lambda x: str(x["entry_id"])):
            scene = str((e.get("provenance") or {}).get("scene_id") or "")
            know.visits[scene] = know.visits.get(scene, 0) + 1
            house = know.facts.setdefault(scene, [])
            facts = entry_facts(e)
            house.extend(f for f in facts if f not in house)
            if reader is None:
                continue
            seen = know.placements.setdefault(scene, set())
            for f in read_scene_facts("; ".join(facts)):
                if f.pred in ("in", "on") and len(f.args) == 2:
                    thing, holder = (reader.kind(a) for a in f.args)
                    if thing and holder:
                        seen.add((f.args[0], thing, f.pred, holder))
                elif f.pred == "unlocked" and len(f.args) == 2 and reader.kind(f.args[1]):
                    know.unlockers.add(str(reader.kind(f.args[1])))
            prefs = know.preferences.setdefault(scene, set())
            said = ((e.get("correction") or {}).get("by_type") or {}).get("user_preference") or []
            for f in reader.read_text(" ".join(said)):
                if f.pred == "prefer" and f.args:
                    general = Fact("prefer", f.args[:1])
                    sentence = reader.sentence(general)
                    if sentence:
                        prefs.add(str(general))
                        know.sentences[str(general)] = sentence
        return know

    @classmethod
    def from_store(cls, store: Any, reader: FactReader | None) -> "StoreKnowledge":
        """From an :class:`~pipeline.memory.store.EpisodicStore`, a store table or a list of entries."""
        return cls.from_entries(store_entries(store), reader)

    def unlocking_kinds(self) -> set[str]:
        """The kinds of things seen unlocking a container (a lesson about them concerns every locked holder)."""
        return set(self.unlockers)

    def houses(self, exclude: str | None = None) -> list[str]:
        return sorted(s for s in self.visits if s != exclude)

    def house_facts(self, scene: str | None) -> list[str]:
        """Every scene fact the past visits of ``scene`` saw (none for a house never visited):
        what past steps' outcomes said first (:data:`~pipeline.core.facts.OUTCOME_PREDICATES`: the commands that raised a
        world's score, the focuses that ended a task, the rooms where one raised it), then where
        things were and what is locked, then the containers no visit looked into, then those
        found empty, then routes between rooms (a walk shows those), each group in the order
        first seen."""
        return self._answer("house", scene, self._house_facts)

    def _answer(self, question: str, arg: Any, compute: Callable[[Any], list]) -> list:
        """``compute(arg)``, computed once per ``(question, arg)``; a copy (callers may change it)."""
        key = (question, arg)
        if key not in self._memo:
            self._memo[key] = compute(arg)
        return list(self._memo[key])

    def _house_facts(self, scene: str | None) -> list[str]:
        facts = list(self.facts.get(str(scene), [])) if scene is not None else []
        read = {f: read_scene_facts(f) for f in facts}
        # what some visit looked into is no longer "never opened"
        searched = {x.args[1] for fs in read.values() for x in fs if x.pred in ("in", "on", "unlocked") and len(x.args) == 2}
        searched |= {x.args[0] for fs in read.values() for x in fs if x.pred in ("empty", "locked")}

        def unsearched(f: str) -> bool:
            return any(x.pred == "closed" for x in read[f])

        def group(f: str) -> int:
            preds = {x.pred for x in read[f]}
            return -1 if preds & OUTCOME_PREDICATES else 3 if "exit" in preds else 2 if "empty" in preds else \
                1 if "closed" in preds else 0

        return sorted((f for f in facts if not (unsearched(f) and read[f][0].args[0] in searched)), key=group)

    def lessons(self, exclude: str | None = None) -> list[Lesson]:
        """Placement lessons over the houses (but ``exclude``): per kind of thing, the kind of
        holder most often found holding it, with at least :data:`MIN_SUPPORT` sightings and
        more than half of them; most supported first, then by name."""
        return self._answer("lessons", exclude, self._lessons)

    def _lessons(self, exclude: str | None) -> list[Lesson]:
        counts: dict[str, Counter] = {}
        for scene in self.houses(exclude):
            for _, thing, prep, holder in self.placements.get(scene, ()):
                counts.setdefault(thing, Counter())[(holder, prep)] += 1
        out = []
        for thing, by_holder in counts.items():
            total = sum(by_holder.values())
            (holder, prep), count = sorted(by_holder.items(), key=lambda kv: (-kv[1], kv[0]))[0]
            if count >= MIN_SUPPORT and 2 * count > total:
                out.append(Lesson(thing, holder, count, total, prep))
        return sorted(out, key=lambda l: (-l.count, -l.count / l.total, l.thing))

    def habits(self, exclude: str | None = None) -> list[tuple[str, int, int]]:
        """``(sentence, houses, of houses)``: each general preference some users of the houses
        (but ``exclude``) asked for, most shared first."""
        houses = self.houses(exclude)
        counts = Counter(p for s in houses for p in self.preferences.get(s, ()))
        return [(self.sentences[p], n, len(houses)) for p, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def relevant_first(items: Sequence[str], words: Iterable[str]) -> list[str]:
    """``items`` with those naming any of ``words`` (whole words, case-insensitive) first, order kept otherwise."""
    keys = tuple(sorted({w.lower() for w in words if w}))
    if not keys:
        return list(items)
    pattern = whole_words(keys, ignore_case=True)
    return sorted(items, key=lambda s: pattern.search(s) is None)
