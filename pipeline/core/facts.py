"""Typed facts: what a world tells the rest of the house, beside its text.

An environment states what an observation shows, and what a step did, as :class:`Fact`
records (a predicate over names, like TextWorld's logic facts). Readers that must not
depend on a world's wording (the episodic memory's scene facts, a rule agent that reads
its prompt) take these facts and never parse prose::

    facts = env.facts()                                  # the live observation, typed
    # (Fact("here", ("Kitchen",)), Fact("at", ("Fridge_0", "Kitchen")), Fact("closed", ("Fridge_0",)), ...)
    step = reader.read_turn(turn_row)                    # a recorded turn, typed (StepFacts)
    step.seen, step.did, step.after
    reader.read_text(grounding)                          # what a prompt's sentences state, typed

The shared vocabulary (an environment may add predicates of its own; a reader keeps what
it understands and passes the rest on unchanged, see :mod:`pipeline.memory.scene`):

=====================  ==========================================================
``here(room)``         the agent is in ``room``
``at(thing, room)``    a thing stands in a room (a fixture, or a thing on the floor)
``in(thing, holder)``  ``thing`` is inside ``holder``; ``on(thing, holder)``: on it
``open(c)``            a container is open; ``closed(c)``, ``locked(c)`` likewise
``empty(c)``           an open container holds nothing
``exit(room, d, to)``  going ``d`` from ``room`` leads to ``to``
``carried(thing)``     the agent holds ``thing``
=====================  ==========================================================

What a step did (``StepFacts.did``): ``took(thing)`` / ``took(thing, holder)``,
``unlocked(c, key)``, ``went(direction)``; ``advanced(command)``: the command raised the
world's score (a world that keeps one says so; the memory keeps it, the reader retries it);
in a focus task (:class:`FocusTask`), ``ended(focus on thing)``: that focus ended the task,
``missed(focus on thing)``: it changed nothing, and ``found(room)``: a focus in that room
raised the score.

The order of an observation's facts is the order the world presents things in (its
text follows the same order), so a tuple of facts is compared as a sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

# Entity names as the seeds write them (seed 004: ``Apple_2``, ``Fridge_0``, ``Key_1``: a kind
# and an index): a world's ``FactReader.entity_pattern`` when its things are named so (the
# household), and what the memory's signature counts when no world is given.
SEED_ENTITY_NAME = r"[A-Za-z]+_\d+"


@dataclass(frozen=True, order=True)
class Fact:
    """One relation a world states: ``pred(arg, ...)`` over entity, room or direction names."""

    pred: str
    args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.pred}({', '.join(self.args)})"


def fact(pred: str, *args: str) -> Fact:
    """``fact("in", "Key_1", "Drawer_0")`` -> ``Fact("in", ("Key_1", "Drawer_0"))``."""
    return Fact(pred, tuple(args))


def first(facts: Iterable[Fact], pred: str) -> Fact | None:
    """The first fact of ``facts`` with predicate ``pred`` (None: there is none)."""
    return next((f for f in facts if f.pred == pred), None)


@dataclass(frozen=True)
class StepFacts:
    """What one recorded turn shows of its world, as an environment reads it.

    Attributes:
        seen: the facts of the observation the agent acted on.
        did: what the turn's command does when it is carried out (``took``, ``unlocked``,
            ``went``), whether or not it was: the reader decides what a turn that failed
            or changed nothing counts for.
        after: the facts the step's response showed (a room described after it), if any.
    """

    seen: tuple[Fact, ...] = ()
    did: tuple[Fact, ...] = ()
    after: tuple[Fact, ...] = ()


# What a step's outcome said (the ``did`` facts above that a world with a score states): a command
# that raised it, a focus that ended the task or changed nothing, a room where a focus raised it. The memory states
# them before anything else an episode saw (:mod:`pipeline.memory.scene`, :mod:`pipeline.memory.knowledge`).
OUTCOME_PREDICATES = frozenset({"advanced", "ended", "missed", "found"})


@dataclass(frozen=True)
class FocusTask:
    """An objective that asks to find a thing, focus on it, and maybe move it to a box: a
    wrong focus ends the task (ScienceWorld's find and life-span tasks).

    A world whose tasks are of this kind says so with a ``focus_task(objective)`` method on
    its :class:`FactReader` (:class:`ReadsFocusTasks`); the ``reader`` agent then tests one
    candidate at a time and keeps what the prompt says ended a past trial.

    Attributes:
        kind: what to find, as the objective says it (``living thing``).
        room: where the objective says the candidates are (None: it does not say).
        box, box_room: where to move the thing after the focus (None: the focus ends it).
    """

    kind: str
    room: str | None = None
    box: str | None = None
    box_room: str | None = None


@runtime_checkable
class ReadsFocusTasks(Protocol):
    """A world's fact reader that knows focus tasks (:class:`FocusTask`)."""

    def focus_task(self, objective: str | None) -> FocusTask | None:
        """The focus task ``objective`` states, None for another kind of task."""
        ...

    def door_to(self, name: str) -> str | None:
        """The room a door's name says it leads to (``door to hallway``), None for a name that says none."""
        ...


class FactReader(Protocol):
    """Reads a recorded turn (a row of ``turns.parquet``), or a text, as typed facts.

    Each environment family supplies one (:func:`pipeline.envs.fact_reader`): a recorded
    observation is the dict the agent saw, in its world's own shape, so only its world
    can read it.

    Attributes:
        entity_pattern: a regular expression (no groups that capture) of the world's names of
            things as an objective writes them: what the memory's signature counts as the
            entities an objective names (:class:`pipeline.memory.signature.SignatureBuilder`);
            :data:`SEED_ENTITY_NAME` for the household.
    """

    entity_pattern: str

    def read_turn(self, turn: Mapping[str, Any]) -> StepFacts:
        """The typed facts of one turn row (its ``observation``, ``command`` and
        ``env_feedback``; a missing or empty field gives no facts)."""
        ...

    def read_text(self, text: str | None) -> tuple[Fact, ...]:
        """What the world's sentences in a text state (a prompt's grounding and advisory
        block: where things are, routes, the user's preferences, what a command named in
        prose did), in the order they appear; text it does not know states nothing."""
        ...

    def kind(self, name: str) -> str | None:
        """The kind of a named thing (``Apple_2`` -> ``Apple``): what lessons across houses
        are stated in, never naming an entity; None for a name that is no thing (a room)."""
        ...

    def sentence(self, f: Fact) -> str | None:
        """The world's sentence for a fact :meth:`read_text` reads back (a general preference
        ``prefer(close_containers)``: ``"Close containers after use."``); None when it has none."""
        ...

    def free_command(self, command: str) -> dict[str, Any] | None:
        """The action dict of a command the world accepts although its admissible list
        does not show it (ScienceWorld's parser takes more spellings than it lists, and
        its gold sequences use them); None where only admissible commands are accepted
        (the household)."""
        ...


@dataclass(frozen=True)
class WorldWords:
    """A world's own words in the runtime text of the world-agnostic packages.

    Memory, grounding and analysis never name a world; where their text needs one (an
    advisory's principle, the report's definition of success) the world supplies it
    through :func:`pipeline.envs.world_words`, and each default here is world-neutral.
    """

    preference_principle: str = "Respect the user's preferences while completing the goal."
    """The advisory principle of a case the user's preference feedback corrected."""
    success: str = "the world's own completion signal"
    """What ``is_correct`` means in this world (the report's definition, in parentheses)."""
