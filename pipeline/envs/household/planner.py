"""Household planning: one breadth-first search behind every plan and route.

:func:`breadth_first` is the search core; on top of it:

- :func:`shortest_plan`: the expert plan of a quest from a full-knowledge :class:`World`
  (the env's ``info["expert_plan"]``, the games' verified quests, the demonstrations);
- :func:`room_route`: the hops between two rooms over a map of exits (the simulated
  user's directions);
- :func:`pipeline.policy.expert.BeliefExpert` searches the map it has seen with
  :func:`breadth_first` directly (only visited rooms' exits are known to it).

::

    shortest_plan(world, ["in(Mug_1, Fridge_0)", "closed(Fridge_0)"], ["close_containers"])
    room_route("Bedroom", "Kitchen", world.room_exits)    # [("west", "Kitchen")]
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

from pipeline.envs.household.world import INVENTORY, PLAYER, World, fact_str, parse_fact, parse_preference

State = TypeVar("State", bound=Hashable)
Label = TypeVar("Label")

# Order of a state's successors (by verb): breadth-first search returns the shortest plan
# whose steps come first in this order.
MOVE_ORDER = {"take": 0, "insert": 1, "put": 1, "drop": 1, "unlock": 2, "close": 3, "lock": 4, "go": 5, "open": 6}


def breadth_first(start: State, successors: Callable[[State], Iterable[tuple[Label, State]]],
                  is_goal: Callable[[State], bool], *, is_dead_end: Callable[[State], bool] | None = None,
                  expand: Callable[[State], bool] | None = None, max_states: int | None = None) -> list[Label] | None:
    """Labels of the first-found shortest path from ``start`` to a goal state.

    States are tested when first reached, in the order ``successors`` yields them (the
    tie-break); ``start`` itself is never tested (the callers decide about it).

    Args:
        start: the first state.
        successors: ``state -> [(label, next state), ...]``.
        is_goal: whether a state ends the search.
        is_dead_end: goal states that may not end it (kept as seen, never expanded).
        expand: whether a state's successors are known (default: all are).
        max_states: give up (``None``) once more states than this have been seen.

    Returns:
        The labels along the path, or ``None`` when no goal state is reachable.
    """
    parent: dict[Any, tuple[Any, Any] | None] = {start: None}
    queue = deque([start])
    while queue:
        s = queue.popleft()
        if expand is not None and not expand(s):
            continue
        for label, s2 in successors(s):
            if s2 in parent:
                continue
            parent[s2] = (s, label)
            if is_goal(s2):
                if is_dead_end is not None and is_dead_end(s2):
                    continue
                return _labels(parent, s2)
            if max_states is not None and len(parent) > max_states:
                return None
            queue.append(s2)
    return None


def _labels(parent: Mapping[Any, tuple[Any, Any] | None], end: Any) -> list[Any]:
    path = []
    node = end
    while parent[node] is not None:
        node, label = parent[node]
        path.append(label)
    return path[::-1]


def room_route(start: str, goal: str, exits: Callable[[str], Mapping[str, str]]) -> list[tuple[str, str]]:
    """Shortest list of ``(direction, room)`` hops from ``start`` to ``goal``.

    Args:
        start, goal: rooms.
        exits: ``room -> {direction: neighbour}``; ties go to the alphabetically first direction.

    Returns:
        The hops; ``[]`` when ``start == goal`` or ``goal`` cannot be reached.
    """
    if start == goal:
        return []

    def hops(room: str) -> list[tuple[tuple[str, str], str]]:
        return [((d, nb), nb) for d, nb in sorted(exits(room).items())]

    return breadth_first(start, hops, lambda room: room == goal) or []


# --------------------------------------------------------------------------- expert plan


def final_constraints(preferences: Iterable[Any], world: World, opened: Iterable[str] | None,
                      unlocked: Iterable[str] | None) -> tuple[frozenset, frozenset]:
    """Preferences as constraints on a plan's final state: (must not be open, must be locked)."""
    not_open, locked = set(), set()
    opened, unlocked = set(opened or ()), set(unlocked or ())
    for pref in preferences:
        _, kind, target = parse_preference(pref)
        if kind == "close_containers":
            # Opened so far, or closed now (so any opening would happen during the plan).
            not_open |= opened | {c for c, s in world.container_state.items() if s != "open"}
        elif kind == "keep_closed":
            not_open.add(target)
        elif world.container_state.get(target) == "locked" or target in unlocked:
            locked.add(target)
    return frozenset(not_open), frozenset(locked)


def shortest_plan(world: World, goal: Iterable[str], preferences: Iterable[Any] = (), *,
                  opened: Iterable[str] = (), unlocked: Iterable[str] = (),
                  max_states: int = 200_000) -> list[str] | None:
    """Shortest command sequence from ``world`` that wins with the preferences held.

    Breadth-first search over a compact state (player room, container states, places of
    the relevant objects). Only actions that can matter are expanded: moving, opening /
    unlocking containers that hold (or are) something the goal needs, taking the goal's
    objects and the keys they need, placing them where the goal says, closing any open
    container and locking containers a preference wants locked. With no carrying limit,
    a shortest plan never needs any other action, so the result is a true shortest plan.
    The game ends as soon as the goal holds, so a state where the goal holds but a
    preference does not is a dead end.

    Args:
        world: the current state.
        goal: win facts (``in(Apple_2, Fridge_0)``, ``closed(Fridge_0)``, ``on(o, s)``,
            ``at(o, room)``, ``in(o, I)``, ``at(P, room)``, ``open/locked(c)``).
        preferences: scene preferences the final state must satisfy.
        opened, unlocked: containers opened / unlocked earlier in the episode.
        max_states: search budget.

    Returns:
        TextWorld commands (``[]`` when the goal already holds), or ``None`` if no plan exists.
    """
    goal_facts = [parse_fact(g) for g in goal]
    not_open, must_lock = final_constraints(preferences, world, opened, unlocked)
    space = PlanSpace(world, goal_facts, not_open, must_lock)
    start = space.start()
    if space.won(start):
        return [] if space.prefs_ok(start) else None
    return breadth_first(start, space.successors, space.won, is_dead_end=lambda s: not space.prefs_ok(s),
                         max_states=max_states)


class PlanSpace:
    """The planner's state space for one world, goal and final-state constraints.

    A state is ``(player room, container states in sorted container order, places of the
    relevant objects in sorted order)``.

    Args:
        world: the current state.
        goal_facts: parsed win facts (:func:`pipeline.envs.household.world.parse_fact`).
        not_open, must_lock: containers that must not be open / must be locked at the end.

    Raises:
        ValueError: a goal fact the planner does not support.
    """

    def __init__(self, world: World, goal_facts: Sequence[tuple[str, tuple[str, ...]]], not_open: frozenset,
                 must_lock: frozenset):
        self.world = world
        self.must_lock = must_lock
        self.containers = sorted(world.container_state)
        self.cidx = {c: i for i, c in enumerate(self.containers)}
        self.key_of: dict[str, list[str]] = {}
        for k, c in sorted(world.key_opens.items()):
            self.key_of.setdefault(c, []).append(k)
        rel_obj, self.rel_cont = self._relevant(goal_facts)
        self.objs = sorted(rel_obj)
        self.oidx = {o: i for i, o in enumerate(self.objs)}
        self.targets, self.checks = self._goal_checks(goal_facts)
        self.no_open = [self.cidx[c] for c in sorted(not_open) if c in self.cidx]
        self.locked_ix = [self.cidx[c] for c in sorted(must_lock) if c in self.cidx]
        self.room_fixtures: dict[str, tuple[list[str], list[str]]] = {}
        for c, r in world.container_room.items():
            self.room_fixtures.setdefault(r, ([], []))[0].append(c)
        for s_, r in world.supporter_room.items():
            self.room_fixtures.setdefault(r, ([], []))[1].append(s_)

    def _relevant(self, goal_facts) -> tuple[set[str], set[str]]:
        """Relevant objects and containers, closed under "what holds it" and "what unlocks it"."""
        world, cidx, must_lock = self.world, self.cidx, self.must_lock
        rel_obj = {a[0] for p, a in goal_facts if p in ("in", "on", "at") and a[0] in world.location}
        rel_cont = {a[-1] for p, a in goal_facts if p == "in" and a[-1] in cidx}
        rel_cont |= {a[0] for p, a in goal_facts if p in ("open", "closed", "locked")}
        rel_cont |= {c for c in must_lock if world.container_state.get(c) != "locked"}
        while True:
            size = (len(rel_obj), len(rel_cont))
            rel_cont |= {world.location[o][1] for o in rel_obj if world.location[o][1] in cidx}
            for c in list(rel_cont):
                if world.container_state.get(c) == "locked" or c in must_lock:
                    rel_obj |= set(self.key_of.get(c, ()))
            if (len(rel_obj), len(rel_cont)) == size:
                return rel_obj, rel_cont

    def _goal_checks(self, goal_facts) -> tuple[dict[str, list[tuple[str, str]]], list[Callable]]:
        """Where the goal wants each relevant object, and one test per goal fact."""
        oidx, cidx = self.oidx, self.cidx
        targets: dict[str, list[tuple[str, str]]] = {o: [] for o in self.objs}
        checks = []
        for p, a in goal_facts:
            if p == "at" and a[0] == PLAYER:
                checks.append(lambda s, r=a[1]: s[0] == r)
            elif p in ("in", "on", "at") and a[0] in oidx:
                targets[a[0]].append((p, a[1]))
                checks.append(lambda s, i=oidx[a[0]], w=(p, a[1]): s[2][i] == w)
            elif p in ("open", "closed", "locked") and a[0] in cidx:
                checks.append(lambda s, i=cidx[a[0]], w=p: s[1][i] == w)
            else:
                raise ValueError(f"goal fact {fact_str(p, a)!r} is not supported by the planner")
        return targets, checks

    def start(self) -> tuple:
        w = self.world
        return (w.player, tuple(w.container_state[c] for c in self.containers),
                tuple(w.location[o] for o in self.objs))

    def won(self, s: tuple) -> bool:
        return all(chk(s) for chk in self.checks)

    def prefs_ok(self, s: tuple) -> bool:
        return all(s[1][i] != "open" for i in self.no_open) and all(s[1][i] == "locked" for i in self.locked_ix)

    def successors(self, s: tuple) -> list[tuple[str, tuple]]:
        # Breadth-first search returns the shortest plan whose steps come first in this
        # order, which reads naturally: handle objects, unlock, close and lock before
        # moving on, and open a container only when nothing else is left to do here.
        return sorted(self._moves(s), key=lambda m: MOVE_ORDER[m[0].split(" ", 1)[0]])

    def _moves(self, s: tuple) -> Iterable[tuple[str, tuple]]:
        room, cs, locs = s
        for d, r2 in self.world.room_exits(room).items():
            yield f"go {d}", (r2, cs, locs)
        here_c, here_s = self.room_fixtures.get(room, ([], []))
        yield from self._container_moves(s, here_c)
        yield from self._object_moves(s, here_c, here_s)

    def _container_moves(self, s: tuple, here_c: list[str]) -> Iterable[tuple[str, tuple]]:
        """Unlock / open what the goal needs, close anything open, lock what must be locked."""
        room, cs, locs = s
        inv = ("in", INVENTORY)
        held = {self.objs[i] for i, l in enumerate(locs) if l == inv}
        for c in sorted(here_c):
            i, st = self.cidx[c], cs[self.cidx[c]]
            keys = [k for k in self.key_of.get(c, ()) if k in held]
            if st == "locked" and c in self.rel_cont and keys:
                yield f"unlock {c} with {keys[0]}", (room, cs[:i] + ("closed",) + cs[i + 1:], locs)
            if st == "closed" and c in self.rel_cont:
                yield f"open {c}", (room, cs[:i] + ("open",) + cs[i + 1:], locs)
            if st == "open":
                yield f"close {c}", (room, cs[:i] + ("closed",) + cs[i + 1:], locs)
            if st == "closed" and c in self.must_lock and keys:
                yield f"lock {c} with {keys[0]}", (room, cs[:i] + ("locked",) + cs[i + 1:], locs)

    def _object_moves(self, s: tuple, here_c: list[str], here_s: list[str]) -> Iterable[tuple[str, tuple]]:
        """Take the relevant objects within reach; put a held one where the goal wants it."""
        room, cs, locs = s
        inv = ("in", INVENTORY)
        cidx = self.cidx
        for i, o in enumerate(self.objs):
            rel, h = locs[i]
            new = None
            if rel == "at" and h == room:
                new, cmd = inv, f"take {o}"
            elif rel == "on" and h in here_s:
                new, cmd = inv, f"take {o} from {h}"
            elif rel == "in" and h in here_c and cs[cidx[h]] == "open":
                new, cmd = inv, f"take {o} from {h}"
            if new is not None:
                yield cmd, (room, cs, locs[:i] + (new,) + locs[i + 1:])
            if locs[i] == inv:
                for rel2, h2 in self.targets[o]:
                    if rel2 == "in" and h2 in here_c and cs[cidx[h2]] == "open":
                        cmd = f"insert {o} into {h2}"
                    elif rel2 == "on" and h2 in here_s:
                        cmd = f"put {o} on {h2}"
                    elif rel2 == "at" and h2 == room:
                        cmd = f"drop {o}"
                    else:
                        continue
                    yield cmd, (room, cs, locs[:i] + ((rel2, h2),) + locs[i + 1:])
