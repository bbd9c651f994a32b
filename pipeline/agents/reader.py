"""The reader: a rule agent that acts on exactly what its prompt states, and on nothing else.

It measures how much a condition's prompt is worth (issue 31): the conditions differ only
in their text, so an agent that uses all of a prompt's statements, and only them, plays
each condition's information ceiling. It reads

- its rendered system prompt (``episode_meta["system_prompt"]``), line by line, through
  the same typed-fact parsers the memory uses: the world's :class:`~pipeline.core.facts.FactReader`
  (``read_text``: where the user said things are, routes, preferences, what a command named
  in prose did), the memory's scene facts (:func:`pipeline.memory.scene.read_scene_facts`)
  and the positive control's verified plan (:func:`pipeline.prompts.verified.read_verified_steps`);
- each observation as the model sees it, read as typed facts by the same reader
  (``read_turn``): never the game's state, the scene id, the expert plan or the ground truth.

Each statement is a belief tied to the prompt line that made it. Every observation is
checked against the beliefs; a belief it contradicts (a holder not in the room it was said
to be in, a container opened and found without the thing, an exit that leads elsewhere)
discredits its whole line: an advisory about another house is one line, so its other
statements go with it, after they have cost the steps it took to find out. Then it acts:

1. a verified plan, step by step while its next command is admissible (a step that is not
   drops the plan);
2. the user's preferences, known only from the prompt: a container opened is closed again
   (and relocked) once nothing wanted is left in it, before the goal is finished;
3. the goal: take the object, carry it, put it (the rule agents' core,
   :class:`pipeline.agents.base.RuleAgent`), walking over the map it has seen plus the
   routes it was told;
4. a believed place of what it needs (the object, the destination, the key of a locked
   holder): go to its room, open or unlock its holder;
5. otherwise ``react``'s systematic search and exploration.

A focus task (a world whose fact reader states one, :class:`~pipeline.core.facts.FocusTask`:
ScienceWorld's find tasks, where a wrong focus ends the task) is played after the plan as a
test of one candidate (:meth:`ReaderAgent._focus_step`): go to the room the objective names,
else to the room the prompt says a past focus raised the score in (``found(room)``), else
stay; focus on the first thing in sight there that no prompt line says ended a past trial
(``ended(focus on thing)``) or missed in one; then take it to the box the objective names.
The reader stays where it is told nothing; the ``trial`` agent (:mod:`pipeline.agents.trial`)
draws how far to walk first.

    agent = ReaderAgent(section(AgentConfig, {"name": "reader"}), facts=fact_reader(cfg))
    agent.reset({"episode_id": "ep", "objective": task.objective, "system_prompt": prompt})
    step = agent.act(obs)            # AgentStep: action, reasoning (the belief it acted on)
    agent.beliefs.dropped            # {prompt line: why it was found wrong}
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from pipeline.agents.base import AgentStep, Goal, RuleAgent, _same, _View, candidate_actions, etype
from pipeline.core.conf_schema import AgentConfig
from pipeline.core.facts import OUTCOME_PREDICATES, Fact, FactReader, FocusTask, ReadsFocusTasks, fact
from pipeline.prompts.verified import read_verified_steps
from pipeline.memory.knowledge import Lesson, read_lessons
from pipeline.memory.scene import read_scene_facts

# The observation fields a model's prompt shows (conf/templates: location, inventory,
# visible entities, verbs, admissible commands, description; the step counter). The
# reader reads no other field (``scene`` is the world's id, not shown to the model).
SHOWN_FIELDS = ("agent_location", "agent_inventory", "visible_entities", "available_actions",
                "admissible_commands", "admissible_actions", "description", "objective", "step", "max_steps")
PLACE_PREDICATES = ("in", "on", "took")  # thing in / on / taken from a holder


@dataclass(frozen=True)
class Belief:
    """A fact the prompt states, and the prompt line that states it (its source)."""

    fact: Fact
    line: int


@dataclass
class Beliefs:
    """What a prompt states, as beliefs; lines found wrong are dropped with the reason."""

    stated: list[Belief] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)  # verified commands, in order
    dropped: dict[int, str] = field(default_factory=dict)  # prompt line -> the contradiction
    priors: list[Lesson] = field(default_factory=list)  # where kinds of things usually are (memory's lessons)

    def live(self, pred: str | tuple[str, ...] | None = None) -> list[Belief]:
        """The beliefs of lines not found wrong (of ``pred``, one or several); a past step's
        outcome (:data:`~pipeline.core.facts.OUTCOME_PREDICATES`: a focus that ended a trial)
        stays live when its line is dropped: it records what happened in that trial, which no
        sight of this episode contradicts (a line of a variation's facts is dropped when one of
        its many things of a shared name, "water", was seen in another holder)."""
        preds = (pred,) if isinstance(pred, str) else pred
        return [b for b in self.stated if (b.line not in self.dropped or b.fact.pred in OUTCOME_PREDICATES)
                and (preds is None or b.fact.pred in preds)]

    def drop(self, line: int, why: str) -> None:
        self.dropped.setdefault(line, why)

    def prefers(self, kind: str, target: str | None = None) -> bool:
        """Whether a live belief asks for preference ``kind`` (of ``target``); a general one
        (no target: a habit of past houses' users) asks it of every target."""
        return any(b.fact.args[0] == kind and (target is None or len(b.fact.args) == 1 or _same(b.fact.args[1], target))
                   for b in self.live("prefer"))

    def usual_holders(self, kind: str | None) -> list[str]:
        """The kinds of holder the lessons say things of ``kind`` were found in, best supported first."""
        if not kind:
            return []
        found = sorted((lesson for lesson in self.priors if lesson.thing.lower() == kind.lower()),
                       key=lambda lesson: (-lesson.count / lesson.total, -lesson.count))
        return list(dict.fromkeys(lesson.holder for lesson in found))


def read_prompt(prompt: str | None, facts: FactReader) -> Beliefs:
    """The beliefs a system prompt states: each line read by the world's reader and the
    memory's scene-fact reader; the verified plan of the whole prompt; the memory's lessons
    (where kinds of things usually are) as search priors."""
    stated = []
    for i, line in enumerate((prompt or "").splitlines()):
        said = tuple(facts.read_text(line)) + read_scene_facts(line)
        for f in said + doors_as_ways(said, facts):
            stated.append(Belief(f, i))
    return Beliefs(stated=list(dict.fromkeys(stated)), plan=read_verified_steps(prompt),
                   priors=read_lessons(prompt))


def doors_as_ways(said: tuple[Fact, ...], facts: FactReader) -> tuple[Fact, ...]:
    """Where a line places a door whose name says where it leads (a world's
    :meth:`~pipeline.core.facts.ReadsFocusTasks.door_to`: ScienceWorld's "door to hallway"), is a
    way from that room: "The door to hallway is in the kitchen." (a user's hint) and "door to
    bathroom in the kitchen was never opened" (a past visit's fact) each give
    ``exit(kitchen, <to>, <to>)``. A world without such names gives none."""
    if not isinstance(facts, ReadsFocusTasks):
        return ()
    return tuple(fact("exit", f.args[1], to, to) for f in said
                 if f.pred in ("at", "in") and len(f.args) == 2 and (to := facts.door_to(f.args[0])) and to != f.args[1])


@dataclass
class Seen:
    """What the observations have shown so far (typed facts of each one)."""

    exits: dict[str, dict[str, str]] = field(default_factory=dict)  # room -> direction -> room
    first_place: dict[str, tuple[str, str | None, str]] = field(default_factory=dict)  # thing -> (rel, holder, room)
    place: dict[str, tuple[str, str | None, str]] = field(default_factory=dict)  # thing -> latest (rel, holder, room)
    state: dict[str, str] = field(default_factory=dict)  # container -> open | closed | locked (latest)
    first_state: dict[str, str] = field(default_factory=dict)
    contents: dict[str, set[str]] = field(default_factory=dict)  # holder -> what was last seen in / on it
    first_contents: dict[str, set[str]] = field(default_factory=dict)  # holder -> what it held when first looked into
    rooms_entered: set[str] = field(default_factory=set)
    in_room: dict[str, set[str]] = field(default_factory=dict)  # room -> everything seen there

    def take_in(self, facts: tuple[Fact, ...]) -> str | None:
        here = next((f.args[0] for f in facts if f.pred == "here"), None)
        if here is None:
            return None
        self.rooms_entered.add(here)
        states = {f.args[0]: f.pred for f in facts if f.pred in ("open", "closed", "locked")}
        at_here = [f.args[0] for f in facts if f.pred == "at"]
        held = {f.args[1]: set() for f in facts if f.pred in ("in", "on")}
        for f in facts:
            if f.pred in ("in", "on"):
                held[f.args[1]].add(f.args[0])
        self.exits[here] = {f.args[1]: f.args[2] for f in facts if f.pred == "exit"}
        seen_here = self.in_room.setdefault(here, set())
        for thing in at_here:
            seen_here.add(thing)
            self._place(thing, ("at", None, here))
        for holder, items in held.items():
            for thing in items:
                seen_here.add(thing)
                rel = next(f.pred for f in facts if f.pred in ("in", "on") and f.args == (thing, holder))
                self._place(thing, (rel, holder, here))
        for thing, st in states.items():
            self.state[thing] = st
            self.first_state.setdefault(thing, st)
        for thing in at_here:
            # A holder's contents are known when it is open, or it is no container (a supporter).
            if states.get(thing, "open") == "open":
                self.contents[thing] = held.get(thing, set())
                self.first_contents.setdefault(thing, set(self.contents[thing]))
        for f in facts:
            if f.pred == "carried":
                self._place(f.args[0], ("carried", None, ""))
        return here

    def _place(self, thing: str, where: tuple[str, str | None, str]) -> None:
        self.first_place.setdefault(thing, where)
        self.place[thing] = where


class ReaderAgent(RuleAgent):
    """Acts on its prompt's statements (see the module docstring); ``trace`` keeps each step.

    Args:
        agent_cfg: the ``agent`` config group (``fallback_action``; ``epsilon`` must be 0:
            a ceiling takes no random steps).
        seed: base seed (unused by its decisions: it draws nothing at random).
        facts: the world's fact reader (:func:`pipeline.envs.fact_reader`).
    """

    name = "reader"

    def __init__(self, agent_cfg: AgentConfig, seed: int = 0, *, facts: FactReader):
        self.facts = facts
        super().__init__(agent_cfg, seed)
        self.epsilon = 0.0

    def reset(self, episode_meta: Mapping[str, Any] | None = None) -> None:
        super().reset(episode_meta)
        self.beliefs = read_prompt((episode_meta or {}).get("system_prompt"), self.facts)
        self.plan_at = 0
        self.seen = Seen()
        self.here: str | None = None
        self.unlocked_by_me: set[str] = set()
        self._advanced_tried: set[str] = set()
        self.trace: list[dict] = []
        objective = (episode_meta or {}).get("objective")
        self.focus_task: FocusTask | None = (self.facts.focus_task(objective)
                                             if isinstance(self.facts, ReadsFocusTasks) else None)
        self.focused: str | None = None  # the thing a focus was played on (the episode went on: it was right)
        self._heading: str | None = None  # the room not yet entered it is walking to
        self._facts_now: tuple[Fact, ...] = ()  # the latest observation's facts
        self._keys_failed: dict[str, set[str]] = {}  # locked container -> keys held beside it that did not open it

    # -- reading -------------------------------------------------------------------------

    def read_observation(self, obs: Mapping[str, Any]) -> tuple[Fact, ...]:
        """The observation's typed facts, from the fields the model is shown only."""
        shown = {k: obs[k] for k in SHOWN_FIELDS if k in obs}
        return self.facts.read_turn({"observation": shown}).seen

    def check_beliefs(self) -> None:
        """Drop the prompt lines whose statements the observations so far contradict."""
        b = self.beliefs
        for belief in b.live():
            why = self._contradiction(belief.fact, belief.line)
            if why:
                b.drop(belief.line, why)

    def _contradiction(self, f: Fact, line: int | None = None) -> str | None:
        """Why what ``f`` states is wrong, by what was seen so far (None: nothing says so);
        ``line``: the prompt line stating it (where that line places a thing of a shared name)."""
        seen = self.seen
        a = f.args
        if f.pred == "at" and len(a) == 2:
            thing, room = a
            first = self._first_place(thing)
            if first is not None and first[0] != "carried" and first[2] and first[2] != room:
                return f"{thing} was in the {first[2]}, not the {room}"
            if room in seen.rooms_entered and thing not in seen.in_room.get(room, set()) and \
                    not self._may_hide(room, thing):
                return f"{thing} is not in the {room}"
        elif f.pred in PLACE_PREDICATES and len(a) == 2:
            thing, holder = a
            first = self._first_place(thing)
            if first is not None and first[0] != "carried" and not _same(first[1], holder):
                return f"{thing} was {'in the ' + first[2] if first[1] is None else 'in ' + str(first[1])}, not in {holder}"
            if first is None and holder in seen.contents and thing not in seen.contents[holder] and \
                    self._the_one_seen(holder, line):
                return f"{holder} does not hold {thing}"
        elif f.pred == "exit" and len(a) == 3:
            room, direction, to = a
            if room in seen.exits and seen.exits[room].get(direction) != to:
                return f"going {direction} from the {room} does not lead to the {to}"
        elif f.pred == "locked" and len(a) == 1:
            if a[0] in seen.first_state and seen.first_state[a[0]] != "locked" and self._the_one_seen(a[0], line):
                return f"{a[0]} was not locked"
        elif f.pred == "empty" and len(a) == 1:
            if seen.first_contents.get(a[0]) and self._the_one_seen(a[0], line):
                return f"{a[0]} was not empty"
        return None

    def _first_place(self, thing: str) -> tuple[str, str | None, str] | None:
        """Where ``thing`` was first seen, as a place that rules out another (``seen.first_place``); None for
        a name of many things (:meth:`_one_of_many`: ScienceWorld's "table", "water", "door to hallway", a
        door named by where it leads being in every room with a way there): seen in one place, a thing of that
        name may still be in another, and only that place, seen without it, says a line is wrong."""
        return None if self._one_of_many(thing) else self.seen.first_place.get(thing)

    def _one_of_many(self, name: str) -> bool:
        """Whether ``name`` names a kind, of which a world may hold several: the world's kind of it is
        the name itself (ScienceWorld's "table"; the household's ``Table_1`` names one thing of kind ``Table``)."""
        return self.facts.kind(name) == name

    def _the_one_seen(self, name: str, line: int | None) -> bool:
        """Whether what was seen of ``name`` (its contents, its lock) was seen of the thing the prompt's
        ``line`` states: always for a name of one thing; for a name of many, when the line places it in
        the room where the one seen last was (one "table" seen says nothing of a "table" in another room)."""
        if not self._one_of_many(name):
            return True
        where = self.seen.place.get(name)
        stated = {b.fact.args[1] for b in self.beliefs.stated
                  if b.line == line and b.fact.pred == "at" and len(b.fact.args) == 2 and b.fact.args[0] == name}
        return where is not None and bool(where[2]) and where[2] in stated

    def _may_hide(self, room: str, thing: str) -> bool:
        """Whether ``thing`` may still be out of sight in ``room``: a thing (not a fixture)
        and a closed container there not yet looked into."""
        if thing in self.seen.state or any(b.fact.args[1] == thing for b in self.beliefs.live(PLACE_PREDICATES)):
            return False  # a container or holder stands in plain sight
        return any(st != "open" and c in self.seen.in_room.get(room, set()) and c not in self.seen.contents
                   for c, st in self.seen.state.items())

    # -- where things are --------------------------------------------------------------

    def room_of(self, thing: str) -> str | None:
        """The room ``thing`` is in: where it was last seen, else where the prompt says."""
        if thing in self.seen.place:
            rel, holder, room = self.seen.place[thing]
            return room or None
        for b in self.beliefs.live("at"):
            if _same(b.fact.args[0], thing):
                return b.fact.args[1]
        holder = self.holder_of(thing)
        return self.room_of(holder) if holder and holder != thing else None

    def holder_of(self, thing: str) -> str | None:
        if thing in self.seen.place:
            return self.seen.place[thing][1]
        for b in self.beliefs.live(PLACE_PREDICATES):
            if _same(b.fact.args[0], thing):
                return b.fact.args[1]
        return None

    def key_for(self, container: str) -> str | None:
        for b in self.beliefs.live("unlocked"):
            if _same(b.fact.args[0], container):
                return b.fact.args[1]
        return None

    def room_path(self, start: str | None, goal_room: str | None) -> str | None:
        """The next room on the way to ``goal_room``, over the exits seen and those stated
        (a door leads both ways); the rooms seen keep only the exits seen there."""
        if not start or not goal_room or start == goal_room:
            return None
        prev = self._paths(start)
        if goal_room not in prev:
            return None
        cur = goal_room
        while prev[cur] != start:
            cur = prev[cur]  # type: ignore[assignment]
        return cur

    def _map(self) -> dict[str, set[str]]:
        """The rooms each room leads to, over the exits seen and those stated (a door leads both
        ways); the rooms seen keep only the exits seen there."""
        graph: dict[str, set[str]] = {}

        def link(a: str, b: str) -> None:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set()).add(a)

        for room, ways in self.seen.exits.items():
            for to in ways.values():
                link(room, to)
        for (room, _), to in self.mem.room_map.items():
            link(room, to)
        for b in self.beliefs.live("exit"):
            room, _, to = b.fact.args
            if room not in self.seen.exits and to not in self.seen.exits:
                link(room, to)
            elif room not in self.seen.exits or to not in self.seen.exits:
                # One end seen: the door is there only if the seen end shows it.
                seen_end, other = (to, room) if to in self.seen.exits else (room, to)
                if other in self.seen.exits[seen_end].values():
                    link(room, to)
        return graph

    def _paths(self, start: str) -> dict[str, str | None]:
        """Breadth first over :meth:`_map` from ``start``: each room reached -> the room before it
        (ties by name), in the order reached."""
        graph = self._map()
        prev: dict[str, str | None] = {start: None}
        todo = deque([start])
        while todo:
            r = todo.popleft()
            for nxt in sorted(graph.get(r, ())):
                if nxt not in prev:
                    prev[nxt] = r
                    todo.append(nxt)
        return prev

    # -- the rule agent's hooks ----------------------------------------------------------

    def examine_first(self, entity: str, ctx: dict) -> bool:
        return False  # examining tells nothing opening does not; a ceiling wastes no steps

    def close_after_use(self, entity: str, ctx: dict) -> bool:
        b = self.beliefs
        return b.prefers("close_containers") or b.prefers("keep_closed", entity) or b.prefers("lock_after_use", entity)

    def rank_containers(self, names: list[str], ctx: dict) -> list[str]:
        """Containers the prompt says hold something wanted first, then those of a kind the
        lessons say things of a wanted kind are usually kept in, then those whose contents
        are unknown; last those the prompt says hold nothing wanted (they may be wrong)."""
        holders = {self.holder_of(w) for w in self._wanted(self.view)}
        usual = self._usual_kinds(self.view)
        return sorted(names, key=lambda c: (c not in holders, str(self.facts.kind(c) or "").lower() not in usual,
                                            not self._worth_opening(c)))

    def known_contents(self, container: str) -> set[str] | None:
        """What ``container`` held at the start, as the prompt states it (its things, or
        nothing when it says it was empty); None when the prompt says nothing of it."""
        held = {b.fact.args[0] for b in self.beliefs.live(PLACE_PREDICATES) if _same(b.fact.args[1], container)}
        if held or any(_same(b.fact.args[0], container) for b in self.beliefs.live("empty")):
            return held
        return None

    def _worth_opening(self, container: str) -> bool:
        """Whether looking into ``container`` may find what is needed: its contents are
        unknown, or what the prompt says it holds includes a wanted thing or a thing of a
        sought kind."""
        if container in self.seen.contents or container in self.mem.searched:
            return False
        held = self.known_contents(container)
        if held is None:
            return True
        wanted = {w.lower() for w in self._wanted(self.view)}
        sought = set(self._sought_kinds(self.view))
        return any(x.lower() in wanted or str(self.facts.kind(x) or "").lower() in sought for x in held)

    def _sought_kinds(self, view: _View | None) -> list[str]:
        """The kinds of what is needed and believed nowhere: the goal's object, and a key
        while a locked container stands in the way and none is held or believed anywhere."""
        out = [str(self.facts.kind(w)) for w in self._wanted(view) if self.holder_of(w) is None and self.facts.kind(w)]
        g = self.goal
        if g is not None and g.obj and not (view is not None and view.holding(g.obj)) and \
                self.holder_of(g.obj) is None and self.facts.kind(g.obj):
            out.append(str(self.facts.kind(g.obj)))
        keys = [x for x in (view.inv if view is not None else []) if etype(x) == "key"]
        if self.mem.locked_seen and not keys and not self.beliefs.live("unlocked"):
            out.append("key")
        return list(dict.fromkeys(k.lower() for k in out))

    def _usual_kinds(self, view: _View | None) -> set[str]:
        """The kinds of holder the lessons say what is sought is usually kept in."""
        return {k.lower() for kind in self._sought_kinds(view) for k in self.beliefs.usual_holders(kind)}

    # -- decision ------------------------------------------------------------------------

    def decision_parts(self) -> tuple:
        """A verified plan's next step first, then the rule agent's steps with tidying first and
        walking to where the prompt says things are before searching."""
        return (self._plan_step, self._focus_step, self._advancing_step, self._tidy, self._finish_put, self._direct_progress,
                self._toward_goal, self._believed, self._likely_place, self._search)

    def _plan_step(self, g: Goal, view: _View, cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        b = self.beliefs
        if not b.plan or self.plan_at >= len(b.plan) or b.dropped.get(-1):
            return None
        command = b.plan[self.plan_at]
        a = next((c for c in cands if str(c.get("command", "")).lower() == command.lower()), None)
        if a is None:  # a world whose parser takes commands it does not list (ScienceWorld's gold spellings)
            a = self.facts.free_command(command)
        if a is None:
            b.drop(-1, f"the verified step {command!r} is not possible here")
            return None
        self.plan_at += 1
        return a, f"verified step {self.plan_at} of {len(b.plan)}: {command}"

    def _advancing_step(self, g: Goal, view: _View, cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """A command the prompt says raised the score in a past trial (``advanced(command)``,
        a world's own fact kept by the memory), each tried once, in the order stated, when it
        is possible here: admissible, or a command the world's parser takes that names a thing
        in sight or in hand; one that is not waits until it is (a past trial played it where
        it was possible: another room, a thing in hand)."""
        done = self._advanced_tried
        for b in self.beliefs.live("advanced"):
            command = b.fact.args[0] if b.fact.args else ""
            if not command or command.lower() in done:
                continue
            a = next((c for c in cands if str(c.get("command", "")).lower() == command.lower()), None)
            free = self.facts.free_command(command) if a is None else None
            if free and any(view.seen(free.get(k)) or view.holding(free.get(k)) for k in ("target", "receptacle")):
                a = free
            if a is not None:
                done.add(command.lower())
                return a, f"{command} raised the score in a past trial"
        return None

    # -- focus tasks (FocusTask: find a thing, focus on it, move it to a box) --------------

    def ended_focuses(self) -> set[str]:
        """The things the prompt says a focus on ended a past trial (``ended(focus on x)``) or
        raised nothing in one (``missed(focus on x)``): not what the task asks for."""
        out = set()
        for b in self.beliefs.live(("ended", "missed")):
            command = str(b.fact.args[0]) if b.fact.args else ""
            if command.lower().startswith("focus on "):
                out.add(command[len("focus on "):].strip().lower())
        return out

    def test_room(self, view: _View) -> str | None:
        """Where to test a candidate: the room the objective names, else the first room the
        prompt says a past focus raised the score in; None: here."""
        ft = self.focus_task
        if ft is not None and ft.room:
            return ft.room
        found = [str(b.fact.args[0]) for b in self.beliefs.live("found") if b.fact.args]
        return found[0] if found else None

    def focus_candidates(self, view: _View, ended: set[str]) -> list[str]:
        """What in sight may be what the task asks for: not a door, the air, the agent, the
        box or a room, not a liquid or gas, not a fixture (a device or a thing that opens), not
        carried in, and not a thing a past focus ended the task on or missed with (``ended``:
        :meth:`ended_focuses`)."""
        ft = self.focus_task
        skip = {"air", "agent", "inventory", str(view.here or "").lower()}
        if ft is not None:
            skip |= {x.lower() for x in (ft.box, ft.box_room, ft.room) if x}
        # a liquid or gas is no thing to carry; a thing switched on and off or opened and closed is a fixture
        skip |= {f.args[0].lower() for f in self._facts_now
                 if f.pred in ("matter", "active", "inactive", "open", "closed", "locked")}
        return [x for x in view.visible if x.lower() not in skip and x.lower() not in ended
                and self._door_to(x) is None and not view.holding(x)]

    def _door_to(self, name: str) -> str | None:
        """The room a door's name leads to, in the world's spelling (:meth:`ReadsFocusTasks.door_to`)."""
        return self.facts.door_to(name) if isinstance(self.facts, ReadsFocusTasks) else None

    def pick_candidate(self, candidates: list[str]) -> str:
        """The candidate to test: the first in sight (the reader draws nothing)."""
        return candidates[0]

    def explore_door(self, rooms: list[str]) -> str:
        """Which room not yet entered to walk into (the reader: the first by name)."""
        return rooms[0]

    def walk_on(self, view: _View) -> bool:
        """Whether to walk on before testing, when nothing says where (the reader: no, it
        has no reason to prefer another room)."""
        return False

    def _toward(self, room: str, view: _View, cands: list[dict]) -> tuple[dict, str] | None:
        """A step toward ``room`` over the map seen and stated: through the next door, opened first."""
        step = self.room_path(view.here, room)
        if step is None:
            return None
        a = self.find(cands, "go_to", step)
        if a:
            return a, f"on the way to the {room}: go to the {step}"
        lone = len(self.seen.exits.get(str(view.here), {})) == 1  # a room's only door may be called "door"
        a = next((c for c in cands if c.get("action") == "open" and _same(self._door_to(str(c.get("target") or "")), step)),
                 None) or (self.find(cands, "open", "door") if lone else None)
        if a:
            return a, f"on the way to the {room}: open the door to the {step}"
        return None

    def _explore_rooms(self, view: _View, cands: list[dict]) -> tuple[dict, str] | None:
        """Toward a room not yet entered, kept until it is: the nearest over the map seen and
        stated (:meth:`explore_door` picks among the nearest), its doors opened on the way. A room
        whose ways the prompt states (a past visit saw them) is known without entering it, so the
        nearest room of unknown ways comes first: a way not known yet can only be found there.
        Known rooms are walked into only when no room of unknown ways is left on the map (a
        prompt may state some of a room's ways, not all)."""
        entered = self.seen.rooms_entered
        if self._heading is None or self._heading in entered:
            prev = self._paths(str(view.here))
            depth: dict[str, int] = {}
            for room, before in prev.items():  # in the order reached: a room's predecessor has its depth
                depth[room] = 0 if before is None else depth[before] + 1
            told = {b.fact.args[0] for b in self.beliefs.live("exit")}
            unknown = [r for r in depth if r not in entered and r not in told]
            rest = [r for r in depth if r not in entered]
            pool = unknown or rest
            nearest = min((depth[r] for r in pool), default=None)
            self._heading = self.explore_door(sorted(r for r in pool if depth[r] == nearest)) if pool else None
        return self._toward(self._heading, view, cands) if self._heading else None

    def _focus_step(self, g: Goal, view: _View, cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """A focus task's step (module docstring): finish after a focus that did not end the
        task; else go where to test, and focus on a candidate there. None: not a focus task."""
        ft = self.focus_task
        if ft is None:
            return None
        if self.focused is not None:
            return self._deliver(ft, view, cands)
        room = self.test_room(view)
        if room and not _same(room, view.here):
            return self._toward(room, view, cands) or self._explore_rooms(view, cands) or self._stuck(cands)
        if room is None and self.walk_on(view):
            walk = self._explore_rooms(view, cands)
            if walk:
                return walk
        ended = self.ended_focuses()
        candidates = self.focus_candidates(view, ended)
        if not candidates:
            return self._explore_rooms(view, cands) or self._stuck(cands)
        thing = self.pick_candidate(candidates)
        a = self.find(cands, "focus_on", thing) or self.facts.free_command(f"focus on {thing}")
        if a is None:
            return None
        self.focused = thing
        told = f" ({len(ended)} ruled out by past trials)" if ended else ""
        return a, f"{thing} may be the {ft.kind}: focus on it{told}"

    def _deliver(self, ft: FocusTask, view: _View, cands: list[dict]) -> tuple[dict, str] | None:
        """After a right focus: take the thing to the box (when the task names one)."""
        thing = self.focused
        if ft.box is None or thing is None:
            return None
        if ft.box_room and not _same(view.here, ft.box_room):
            if not view.holding(thing) and view.seen(thing):
                # the engine lists some things under another name ("move cup to inventory" for the glass
                # cup) and takes the name it showed in a command it does not list, as the focus did
                a = self.find(cands, "pick_up", thing) or self.facts.free_command(f"pick up {thing}")
                if a:
                    return a, f"{thing} is what the task asks for: take it to the {ft.box}"
            return self._toward(ft.box_room, view, cands) or self._explore_rooms(view, cands) or self._stuck(cands)
        a = self.find(cands, "move", thing, ft.box) or self.facts.free_command(f"move {thing} to {ft.box}")
        return (a, f"move {thing} to the {ft.box}") if a else None

    def _stuck(self, cands: list[dict]) -> tuple[dict, str]:
        """Nowhere to go: look around (never a random focus, which would end the task)."""
        return self.find(cands, "look_around") or dict(self.fallback), "nowhere left to go: look around"

    def _wanted(self, view: _View | None) -> list[str]:
        """What the agent still needs to get hold of: the goal's object, then the keys of
        the locked holders it is in (or is to go into)."""
        g = self.goal
        if g is None or not g.obj:
            return []
        holding = (lambda e: view.holding(e)) if view is not None else (lambda e: False)
        out = []
        if g.verb in ("put", "take", "bring") and not holding(g.obj):
            out.append(g.obj)
        for c in (self.holder_of(g.obj), g.dest if g.verb == "put" else None,
                  g.obj if g.verb in ("unlock", "open") else None):
            if c and self._locked(c) and not any(etype(x) == "key" for x in (view.inv if view else [])):
                key = self.key_for(c)
                if key:
                    out.append(key)
        return out

    def _locked(self, c: str) -> bool:
        if c in self.seen.state:
            return self.seen.state[c] == "locked"
        return any(_same(b.fact.args[0], c) for b in self.beliefs.live("locked"))

    def _tidy(self, g: Goal, view: _View, cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """Keep the preferences the prompt states: close a container opened here once nothing
        wanted is left in it, and lock it again when asked to."""
        wanted = set(self._wanted(view))
        keys_wanted = self.want_keys(ctx) and not any(etype(x) == "key" for x in view.inv)
        for c in view.closable:
            if c in self.mem.opened and not _same(c, g.dest) and self.close_after_use(c, ctx):
                inside = self.seen.contents.get(c, set())
                if inside & wanted:
                    continue  # what it is for is still in it
                for key in sorted(x for x in inside if etype(x) == "key") if keys_wanted else ():
                    a = self.find(cands, "pick_up", key, c)
                    if a:
                        return a, f"{key} may open a locked container: take it before closing {c}"
                return self.find(cands, "close", c), f"nothing I need is left in {c}, and the user wants it closed"  # type: ignore[return-value]
        for c in sorted(self.unlocked_by_me):
            # Used (opened since it was unlocked) and closed again: lock it.
            if self.beliefs.prefers("lock_after_use", c) and self.seen.state.get(c) == "closed" and c in self.mem.opened:
                a = self.find(cands, "lock", c)
                if a:
                    self.unlocked_by_me.discard(c)
                    return a, f"the user wants {c} locked again after use"
        return None

    def _finish_put(self, g: Goal, view: _View, cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """The rule agent's, and an objective that says to lock the destination ("... and lock
        it") has it closed and locked with the key in hand once the object is in it."""
        if g.verb == "put" and g.lock_after and g.dest and (self.mem.placed or self.find(cands, "pick_up", g.obj, g.dest)):
            self.mem.placed = True
            a = self.find(cands, "close", g.dest)
            if a:
                return a, f"{g.obj} is {g.prep} {g.dest}; close it to lock it"
            a = self.find(cands, "lock", g.dest)
            if a:
                return a, f"{g.obj} is {g.prep} {g.dest}; now I lock {g.dest}"
        return super()._finish_put(g, view, cands, ctx)

    def _toward_goal(self, g: Goal, view: _View, cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """The rule agent's goal step, but never toward a locked destination without a key: a key
        in sight is taken first, and one not in sight is looked for (the search takes keys it finds;
        walking to the destination and away again was a loop to the step cap)."""
        if g.verb == "put" and g.obj and g.dest and view.holding(g.obj) and \
                (self._locked(g.dest) or g.dest in self.mem.locked_seen) and \
                not any(etype(x) == "key" for x in view.inv):
            for a in cands:
                if a.get("action") == "pick_up" and etype(a.get("target")) == "key":
                    return a, f"{g.dest} is locked: take {a.get('target')}, it may open it"
            if not view.seen(g.dest):
                return None
        return super()._toward_goal(g, view, cands, ctx)

    def _believed(self, g: Goal, view: _View, cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """Go for what is needed where the prompt (or an earlier sight) places it."""
        targets = self._wanted(view)
        if g.verb == "put" and g.dest and g.obj and view.holding(g.obj) and not view.seen(g.dest):
            targets.append(g.dest)
        has_key = any(etype(x) == "key" for x in view.inv)
        for t in targets:
            if not view.holding(t):
                a = self.find(cands, "pick_up", t)
                if a:
                    return a, f"{t} is here and I need it: take it"
            holder = self.holder_of(t)
            if holder and self._locked(holder) and not has_key and not view.holding(t):
                continue  # locked and no key at hand: its key first (stated, or searched for)
            room = self.room_of(t)
            if room and not _same(room, view.here):
                step = self.room_path(view.here, room)
                a = self.find(cands, "go_to", step) if step else None
                if a:
                    return a, f"{t} is in the {room}{' (' + holder + ')' if holder else ''}: go there"
                continue
            if holder and view.seen(holder):
                a = self.find(cands, "pick_up", t, holder)
                if a:
                    return a, f"{t} is in {holder}: take it"
                a = self.find(cands, "open", holder)
                if a:
                    return a, f"{t} should be in {holder}: open it"
                a = self.find(view.unlockable, "unlock", holder)
                if a:
                    return a, f"{holder} holds {t} and I have its key: unlock it"
        return None

    def _likely_place(self, g: Goal, view: _View, cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """Nothing believed where what is needed is: go to the nearest room with a container
        worth opening (:meth:`_worth_opening`: one the lessons say its kind is usually kept
        in first, any whose contents are unknown after), when this room has none left; the
        containers the prompt places in rooms count beside those seen. Without any, None:
        ``react``'s search and exploration."""
        if not self._sought_kinds(view) or self._carrying_to_dest(g, view):
            return None
        if any(self._worth_opening(c) for c in view.openable) or view.unlockable:
            return None  # this room first (rank_containers orders it)
        usual = self._usual_kinds(view)
        spots = []
        for c, room in self._known_containers().items():
            if _same(room, view.here) or not self._worth_opening(c) or (self._locked(c) and not self._may_unlock(c, view)):
                continue  # a locked one waits for its key (the search takes keys it finds)
            spots.append((str(self.facts.kind(c) or "").lower() not in usual, room, c))
        for _, room, c in sorted(spots):
            step = self.room_path(view.here, room)
            a = self.find(cands, "go_to", step) if step else None
            if a:
                why = "usually kept" if str(self.facts.kind(c) or "").lower() in usual else "not yet looked into"
                return a, f"{c} in the {room} may hold what I need ({why}): go there"
        return None

    def _may_unlock(self, container: str, view: _View) -> bool:
        """Whether a key in hand may open ``container``: one not yet held beside it without an
        ``unlock`` to play (a key that does not fit, walked back to, was a loop to the step cap)."""
        failed = self._keys_failed.get(container, set())
        return any(etype(x) == "key" and x not in failed for x in view.inv)

    def _note_keys_that_fail(self, obs: Mapping[str, Any]) -> None:
        """Each locked container in sight that no key in hand can unlock: those keys do not fit it."""
        keys = {str(x) for x in obs.get("agent_inventory") or [] if etype(x) == "key"}
        if not keys:
            return
        unlockable = {str(a.get("target")) for a in candidate_actions(obs) if a.get("action") == "unlock"}
        for c in obs.get("visible_entities") or []:
            if self.seen.state.get(str(c)) == "locked" and str(c) not in unlockable:
                self._keys_failed.setdefault(str(c), set()).update(keys)

    def _carrying_to_dest(self, g: Goal, view: _View) -> bool:
        return g.verb in ("put", "bring") and bool(g.obj) and view.holding(g.obj)

    def _known_containers(self) -> dict[str, str]:
        """Container -> room: those seen in this episode's rooms and those the prompt places."""
        rooms: dict[str, str] = {}
        for room, things in self.seen.in_room.items():
            for c in things:
                if c in self.seen.state:
                    rooms[c] = room
        states = {b.fact.args[0] for b in self.beliefs.live(("closed", "locked", "empty", "open"))}
        holders = {b.fact.args[1] for b in self.beliefs.live(PLACE_PREDICATES)}
        for b in self.beliefs.live("at"):
            thing, room = b.fact.args
            if (thing in states or thing in holders) and thing not in rooms:
                rooms[thing] = room
        return rooms

    def _search(self, g: Goal, view: _View, cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """``react``'s search, but no container of this room is opened while what is needed
        is believed to be in a holder elsewhere (keys lying here are still taken), nor one
        the prompt says holds nothing needed while a container worth opening is known
        anywhere (:meth:`_likely_place` goes there)."""
        targets = self._wanted(view)
        holders = [self.holder_of(t) for t in targets]
        if targets and all(h and not view.seen(h) for h in holders):
            view = replace(view, openable=[])
        elif any(self._worth_opening(c) and not self._locked(c) for c in self._known_containers()):
            view = replace(view, openable=[c for c in view.openable if self._worth_opening(c)])
        return super()._search(g, view, cands, ctx)

    def act(self, obs: Mapping[str, Any]) -> AgentStep:
        """Read the observation, revise the beliefs it contradicts, then act on the rest."""
        shown = {k: obs[k] for k in SHOWN_FIELDS if k in obs}
        self.observe(shown)
        self._facts_now = self.read_observation(shown)
        self.here = self.seen.take_in(self._facts_now)
        before = dict(self.beliefs.dropped)
        self.check_beliefs()
        self._note_keys_that_fail(shown)
        action, rationale, _ = self.choose(shown, {})
        if action.get("action") == "open":  # what it opened and unlocked, it must close and lock again
            self.mem.opened.add(str(action.get("target")))
            self.mem.searched.add(str(action.get("target")))
        elif action.get("action") == "unlock":
            self.unlocked_by_me.add(str(action.get("target")))
        revised = {line: why for line, why in self.beliefs.dropped.items() if line not in before}
        self.trace.append({"action": action, "why": rationale, "dropped": revised})
        self.finish_step(action)
        dropped = "".join(f" (line {line} dropped: {why})" for line, why in revised.items())
        text = f"Belief: {rationale}{dropped}\nAction: {json.dumps(action, ensure_ascii=False, sort_keys=True)}"
        return AgentStep(action=action, reasoning=f"{rationale}{dropped}", generated_text=text)
