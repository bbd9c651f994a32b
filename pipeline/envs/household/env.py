"""The household environment: TextWorld games seen through seed 004's observation dict.

Seed 004's agents got stuck in an examine loop because the old environment only gave
them a scene name and paid a small reward for every ``examine``. Here every
observation field is filled from the game's logic state (TextWorld facts), success is
TextWorld's ``won`` (never ``done``), and the reward is shaped against loops::

    from pipeline.envs.household.env import HouseholdEnv

    env = HouseholdEnv("data/games/scene_00/q00.z8", scene_id="scene_00", quest_id="q00",
                       objective="Put Apple_2 in Fridge_0 and close it.", max_steps=30,
                       reward=cfg.env.reward, preferences=scene["preferences"])
    obs = env.reset()
    obs, reward, done, info = env.step({"action": "open", "target": "Fridge_0"})
    info["won"], info["valid"], info["expert_plan"], info["preferences_ok"]

The module also holds the household semantics shared with the ``games`` stage:
:class:`World` (the state read from facts), :func:`shortest_plan` (the expert planner),
:func:`check_preferences` (scene-level user preferences) and the action <-> command
mapping (:func:`action_to_command`, :func:`command_to_action`).
"""

from __future__ import annotations

import json
import re
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pipeline.core.io import ArtifactError

VERBS = ("go_to", "pick_up", "put", "open", "close", "unlock", "lock", "drop", "examine", "look",
         "inventory", "wait")
DIRECTIONS = ("north", "south", "east", "west")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
PORTABLE_TYPES = frozenset({"o", "k", "f"})  # TextWorld types that can be carried
PREFERENCE_KINDS = ("close_containers", "keep_closed", "lock_after_use")
REWARD_DEFAULTS = {"win": 1.0, "repeat_penalty": -0.1, "first_visit_bonus": 0.05,
                   "first_examine_bonus": 0.02, "examine_reward": 0.0, "invalid_penalty": -0.05,
                   "step_cost": 0.0}
INVENTORY = "I"  # TextWorld's inventory entity

TypedFact = tuple[str, tuple[tuple[str, str], ...]]  # (predicate, ((name, type), ...))
_FACT_RE = re.compile(r"^\s*(\w+)\(([^()]*)\)\s*$")


class GameFileError(ArtifactError):
    """A game file (``.z8`` or its ``.json`` sidecar) is missing or corrupt."""


class ActionError(ValueError):
    """An action dict that is malformed or not admissible now (the message says why)."""


# --------------------------------------------------------------------------- facts


def fact_str(pred: str, names: Sequence[str]) -> str:
    """``fact_str("in", ["Apple_2", "Fridge_0"]) -> "in(Apple_2, Fridge_0)"``."""
    return f"{pred}({', '.join(names)})"


def parse_fact(text: str) -> tuple[str, tuple[str, ...]]:
    """Inverse of :func:`fact_str`; raises ``ValueError`` naming the text."""
    m = _FACT_RE.match(text)
    if not m:
        raise ValueError(f"not a fact {text!r}: expected pred(arg, ...)")
    args = tuple(a.strip() for a in m.group(2).split(",") if a.strip())
    return m.group(1), args


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
        w = cls()
        strs = set()
        for pred, args in facts:
            names = [n for n, _ in args]
            strs.add(fact_str(pred, names))
            for n, t in args:
                if n not in ("P", INVENTORY):
                    w.kinds[n] = t
            if pred == "at" and args[0][1] == "P":
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

    def describe(self) -> str:
        """Concise deterministic description of the player's surroundings (no flavour text)."""
        v = self.room_view()
        parts = [f"You are in the {self.player}."]
        seen = []
        for c in v["containers"]:
            state = self.container_state.get(c, "closed")
            empty = state == "open" and not self.contents(c)
            seen.append(f"{c} ({state}{', empty' if empty else ''})")
        seen += v["supporters"] + v["floor"]
        parts.append(f"You see {', '.join(seen)}." if seen else "You see nothing here.")
        for holder, prep in [(s, "On") for s in v["supporters"]] + [
                (c, "In") for c in v["containers"] if self.container_state.get(c) == "open"]:
            items = self.contents(holder)
            if items:
                parts.append(f"{prep} {holder}: {', '.join(items)}.")
        ex = self.room_exits()
        parts.append("Exits: " + ", ".join(f"{d} to {r}" for d, r in ex.items()) + "." if ex else "No exits.")
        inv = self.inventory()
        parts.append(f"You are carrying: {', '.join(inv)}." if inv else "You are carrying nothing.")
        return " ".join(parts)


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


def preference_text(kind: str, target: str | None = None) -> str:
    """The sentence a user says for a preference (what the simulated user enforces)."""
    return {"close_containers": "Close containers after use.",
            "keep_closed": f"Always leave {target} closed.",
            "lock_after_use": f"Lock {target} again after you unlock it."}[kind]


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


def _final_constraints(preferences, world: World, opened, unlocked) -> tuple[frozenset, frozenset]:
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


# --------------------------------------------------------------------------- planner


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
    not_open, must_lock = _final_constraints(preferences, world, opened, unlocked)
    containers = sorted(world.container_state)
    cidx = {c: i for i, c in enumerate(containers)}
    key_of: dict[str, list[str]] = {}
    for k, c in sorted(world.key_opens.items()):
        key_of.setdefault(c, []).append(k)

    # Relevant objects and containers, closed under "what holds it" and "what unlocks it".
    rel_obj = {a[0] for p, a in goal_facts if p in ("in", "on", "at") and a[0] in world.location}
    rel_cont = {a[-1] for p, a in goal_facts if p == "in" and a[-1] in cidx}
    rel_cont |= {a[0] for p, a in goal_facts if p in ("open", "closed", "locked")}
    rel_cont |= {c for c in must_lock if world.container_state.get(c) != "locked"}
    while True:
        size = (len(rel_obj), len(rel_cont))
        rel_cont |= {world.location[o][1] for o in rel_obj if world.location[o][1] in cidx}
        for c in list(rel_cont):
            if world.container_state.get(c) == "locked" or c in must_lock:
                rel_obj |= set(key_of.get(c, ()))
        if (len(rel_obj), len(rel_cont)) == size:
            break
    objs = sorted(rel_obj)
    oidx = {o: i for i, o in enumerate(objs)}
    targets: dict[str, list[tuple[str, str]]] = {o: [] for o in objs}  # where the goal wants o
    checks = []
    for p, a in goal_facts:
        if p == "at" and a[0] == "P":
            checks.append(lambda s, r=a[1]: s[0] == r)
        elif p in ("in", "on", "at") and a[0] in oidx:
            targets[a[0]].append((p, a[1]))
            checks.append(lambda s, i=oidx[a[0]], w=(p, a[1]): s[2][i] == w)
        elif p in ("open", "closed", "locked") and a[0] in cidx:
            checks.append(lambda s, i=cidx[a[0]], w=p: s[1][i] == w)
        else:
            raise ValueError(f"goal fact {fact_str(p, a)!r} is not supported by the planner")
    no_open = [cidx[c] for c in sorted(not_open) if c in cidx]
    locked_ix = [cidx[c] for c in sorted(must_lock) if c in cidx]

    def won(s):
        return all(chk(s) for chk in checks)

    def prefs_ok(s):
        return all(s[1][i] != "open" for i in no_open) and all(s[1][i] == "locked" for i in locked_ix)

    start = (world.player, tuple(world.container_state[c] for c in containers),
             tuple(world.location[o] for o in objs))
    if won(start):
        return [] if prefs_ok(start) else None
    inv = ("in", INVENTORY)
    room_fixtures = {}
    for c, r in world.container_room.items():
        room_fixtures.setdefault(r, ([], []))[0].append(c)
    for s_, r in world.supporter_room.items():
        room_fixtures.setdefault(r, ([], []))[1].append(s_)

    def successors(s):
        # Breadth-first search returns the shortest plan whose steps come first in this
        # order, which reads naturally: handle objects, unlock, close and lock before
        # moving on, and open a container only when nothing else is left to do here.
        return sorted(_moves(s), key=lambda m: _MOVE_ORDER[m[0].split(" ", 1)[0]])

    def _moves(s):
        room, cs, locs = s
        for d, r2 in world.room_exits(room).items():
            yield f"go {d}", (r2, cs, locs)
        here_c, here_s = room_fixtures.get(room, ([], []))
        held = {objs[i] for i, l in enumerate(locs) if l == inv}
        for c in sorted(here_c):
            i, st = cidx[c], cs[cidx[c]]
            keys = [k for k in key_of.get(c, ()) if k in held]
            if st == "locked" and c in rel_cont and keys:
                yield f"unlock {c} with {keys[0]}", (room, cs[:i] + ("closed",) + cs[i + 1:], locs)
            if st == "closed" and c in rel_cont:
                yield f"open {c}", (room, cs[:i] + ("open",) + cs[i + 1:], locs)
            if st == "open":
                yield f"close {c}", (room, cs[:i] + ("closed",) + cs[i + 1:], locs)
            if st == "closed" and c in must_lock and keys:
                yield f"lock {c} with {keys[0]}", (room, cs[:i] + ("locked",) + cs[i + 1:], locs)
        for i, o in enumerate(objs):
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
                for rel2, h2 in targets[o]:
                    if rel2 == "in" and h2 in here_c and cs[cidx[h2]] == "open":
                        cmd = f"insert {o} into {h2}"
                    elif rel2 == "on" and h2 in here_s:
                        cmd = f"put {o} on {h2}"
                    elif rel2 == "at" and h2 == room:
                        cmd = f"drop {o}"
                    else:
                        continue
                    yield cmd, (room, cs, locs[:i] + ((rel2, h2),) + locs[i + 1:])

    parent: dict[Any, tuple[Any, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        s = queue.popleft()
        for cmd, s2 in successors(s):
            if s2 in parent:
                continue
            parent[s2] = (s, cmd)
            if won(s2):
                if not prefs_ok(s2):
                    continue  # the game would end here with a preference broken
                plan = []
                node = s2
                while parent[node] is not None:
                    node, c = parent[node]
                    plan.append(c)
                return plan[::-1]
            if len(parent) > max_states:
                return None
            queue.append(s2)
    return None


# --------------------------------------------------------------------------- actions


def _norm(x: Any) -> str | None:
    if x is None:
        return None
    if not isinstance(x, str):
        raise ActionError(f"expected an entity name string, got {x!r}")
    x = x.strip()
    return x or None


def action_to_command(action: Mapping[str, Any], admissible_commands: Sequence[str],
                      exits: Mapping[str, str] | None = None) -> str | None:
    """Map an action dict to the admissible TextWorld command it means.

    Args:
        action: ``{"action": verb, "target": entity_or_null}`` plus optional
            ``"receptacle"`` (put / take-from) and ``"key"`` (unlock / lock).
        admissible_commands: the commands admissible now.
        exits: direction -> adjacent room, so ``go_to`` accepts a room name.

    Returns:
        The command (with TextWorld's spelling), or ``None`` for ``wait`` (a no-op).

    Raises:
        ActionError: malformed, unknown verb, or no admissible command matches.
    """
    if not isinstance(action, Mapping):
        raise ActionError(f"expected an action dict {{'action': verb, 'target': ...}}, got {action!r}")
    verb = action.get("action")
    if not isinstance(verb, str) or verb.strip() not in VERBS:
        raise ActionError(f"unknown verb {verb!r}: expected one of {', '.join(VERBS)}")
    verb = verb.strip()
    target, rec, key = _norm(action.get("target")), _norm(action.get("receptacle")), _norm(action.get("key"))
    by_lower = {c.lower(): c for c in admissible_commands}

    def need(what: str | None, name: str) -> str:
        if what is None:
            raise ActionError(f"{verb} needs a {name}")
        return what

    def pick(cands: list[str], desc: str) -> str:
        found = sorted(by_lower[c.lower()] for c in cands if c.lower() in by_lower)
        if not found:
            raise ActionError(f"{desc} is not possible now")
        return found[0]

    if verb == "wait":
        return None
    if verb in ("look", "inventory"):
        return pick([verb], verb)
    if verb == "go_to":
        t = need(target, "target room or direction").lower()
        if t not in DIRECTIONS:
            dirs = [d for d, r in (exits or {}).items() if r.lower() == t]
            if not dirs:
                where = ", ".join(f"{d} to {r}" for d, r in (exits or {}).items()) or "none known"
                raise ActionError(f"go_to {target}: not an adjacent room or a direction (exits: {where})")
            t = dirs[0]
        return pick([f"go {t}"], f"go_to {target}")
    t = need(target, "target")
    if verb == "pick_up":
        if rec is not None:
            return pick([f"take {t} from {rec}"], f"pick_up {t} from {rec}")
        pat = re.compile(rf"^take {re.escape(t.lower())}( from \S+)?$")
        return pick([c for c in by_lower if pat.match(c)], f"pick_up {t}")
    if verb == "put":
        r = need(rec, "receptacle")
        return pick([f"put {t} on {r}", f"insert {t} into {r}"], f"put {t} in/on {r}")
    if verb in ("unlock", "lock"):
        if key is not None:
            return pick([f"{verb} {t} with {key}"], f"{verb} {t} with {key}")
        prefix = f"{verb} {t.lower()} with "
        return pick([c for c in by_lower if c.startswith(prefix)], f"{verb} {t} (no matching key in inventory?)")
    # open, close, drop, examine
    return pick([f"{verb} {t}"], f"{verb} {t}")


_COMMAND_PATTERNS = [
    (re.compile(r"^go (north|south|east|west)$"), lambda m: {"action": "go_to", "target": m[1]}),
    (re.compile(r"^take (\S+) from (\S+)$"), lambda m: {"action": "pick_up", "target": m[1], "receptacle": m[2]}),
    (re.compile(r"^take (\S+)$"), lambda m: {"action": "pick_up", "target": m[1]}),
    (re.compile(r"^insert (\S+) into (\S+)$"), lambda m: {"action": "put", "target": m[1], "receptacle": m[2]}),
    (re.compile(r"^put (\S+) on (\S+)$"), lambda m: {"action": "put", "target": m[1], "receptacle": m[2]}),
    (re.compile(r"^(unlock|lock) (\S+) with (\S+)$"), lambda m: {"action": m[1], "target": m[2], "key": m[3]}),
    (re.compile(r"^(open|close|drop|examine) (\S+)$"), lambda m: {"action": m[1], "target": m[2]}),
    (re.compile(r"^(look|inventory|wait)$"), lambda m: {"action": m[1], "target": None}),
]


def command_to_action(command: str | None, exits: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Map a TextWorld command back to an action dict (``None`` -> wait).

    With ``exits`` (direction -> room), a ``go`` command's target is the room it leads to.
    Raises ``ValueError`` for a command outside the household verbs.
    """
    if command is None:
        return {"action": "wait", "target": None}
    c = command.strip()
    for pat, make in _COMMAND_PATTERNS:
        m = pat.match(c)
        if m:
            act = make(m)
            if act["action"] == "go_to" and exits and act["target"] in exits:
                act["target"] = exits[act["target"]]
            return act
    raise ValueError(f"command {command!r} has no household action (verbs: {', '.join(VERBS)})")


def available_verbs(admissible_commands: Iterable[str]) -> list[str]:
    """Verbs with at least one admissible command now, in :data:`VERBS` order (+ ``wait``)."""
    verbs = {"wait"}
    for c in admissible_commands:
        try:
            verbs.add(command_to_action(c)["action"])
        except ValueError:
            pass  # e.g. "eat X": not a household verb
    return [v for v in VERBS if v in verbs]


# --------------------------------------------------------------------------- game files


def check_game_file(game_file: str | Path) -> Path:
    """Check a compiled game before the interpreter sees it (Jericho exits the process
    on a bad story file instead of raising). Returns the path; raises :class:`GameFileError`."""
    p = Path(game_file)
    hint = "(rebuild the games: `python -m pipeline.stages.games` or `dvc repro games`)"
    if not p.is_file():
        raise GameFileError(f"missing game file {p} {hint}")
    side = p.with_suffix(".json")
    if not side.is_file():
        raise GameFileError(f"missing game info file {side} next to {p} {hint}")
    data = p.read_bytes()
    # Z-machine v8 header: version byte, file length / 8 at 0x1A, checksum of 0x40.. at 0x1C.
    length = int.from_bytes(data[0x1A:0x1C], "big") * 8 if len(data) >= 64 else 0
    if (len(data) < 64 or data[0] != 8 or length < 64 or len(data) < length
            or sum(data[0x40:length]) & 0xFFFF != int.from_bytes(data[0x1C:0x1E], "big")):
        raise GameFileError(f"corrupt game file {p}: not a valid Z-machine v8 story (bad header or checksum) {hint}")
    try:
        json.loads(side.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GameFileError(f"corrupt game info file {side}: {exc} {hint}") from exc
    return p


def clean_feedback(text: str | None) -> str:
    """The game's response without the prompt/status line, score notices and end banner."""
    text = (text or "").replace("\r", "")
    text = re.split(r"\n>", "\n" + text, maxsplit=1)[0]
    for marker in ("Your score has just gone up", "*** The End ***", "*** You lost! ***"):
        text = text.split(marker, 1)[0]
    return " ".join(text.split())


# --------------------------------------------------------------------------- environment


class HouseholdEnv:
    """One household quest played through TextWorld (``reset`` / ``step``).

    Args:
        game_file: the compiled ``.z8`` (its ``.json`` sidecar beside it); a relative path
            is read from the working directory, else from the project root.
        scene_id, quest_id: for the observation / logs.
        objective: goal text; defaults to the game's own objective.
        max_steps: step cap (``done`` when reached; ``truncated`` in info).
        reward: ``cfg.env.reward`` (or a dict with the same keys); missing keys default.
        preferences: scene preferences (ids or scene-spec dicts) for ``preferences_ok``.
        compute_expert_plan: fill ``info["expert_plan"]`` (a BFS per step).
    """

    def __init__(self, game_file: str | Path, *, scene_id: str | None = None, quest_id: str | None = None,
                 objective: str | None = None, max_steps: int = 30, reward: Mapping[str, Any] | None = None,
                 preferences: Iterable[str | Mapping[str, Any]] = (), compute_expert_plan: bool = True) -> None:
        p = Path(game_file)
        if not p.is_absolute() and not p.exists():
            from pipeline.core.config import project_root

            p = project_root() / p
        self.game_file = check_game_file(p)
        self.scene_id = scene_id or p.parent.name
        self.quest_id = quest_id or p.stem
        self.max_steps = int(max_steps)
        if self.max_steps < 1:
            raise ValueError(f"max_steps={max_steps}: expected >= 1")
        self.reward_cfg = dict(REWARD_DEFAULTS)
        for k in REWARD_DEFAULTS:
            if reward is not None and k in reward:
                self.reward_cfg[k] = float(reward[k])
        self.preferences = list(preferences)
        for pref in self.preferences:
            parse_preference(pref)  # fail early on a bad preference
        self.compute_expert_plan = compute_expert_plan
        self._objective = objective
        self._tw = None
        self._aliases: dict[str, str] = {}
        self.goal: list[str] = []
        self._done = True

    # -- TextWorld plumbing -----------------------------------------------------------

    def _start(self):
        import textworld
        from textworld.core import EnvInfos

        # Location and inventory are read from the facts (TextWorld fills no `location` for
        # Inform games, and `inventory` would cost an extra game command per step).
        infos = EnvInfos(admissible_commands=True, facts=True, won=True, lost=True, feedback=True,
                         objective=True, win_facts=True)
        try:
            with warnings.catch_warnings():
                # Jericho cannot detect score/moves in GameMaker games; the env does not use them.
                warnings.filterwarnings("ignore", message="Game .* is not fully supported")
                self._tw = textworld.start(str(self.game_file), request_infos=infos)
        except Exception as exc:  # TextWorld raises many kinds on a broken game
            raise GameFileError(f"corrupt game file {self.game_file}: {_one_line(exc)}") from exc

    def _read(self, state) -> None:
        self.world = World.from_facts(typed_facts(state["facts"]))
        self.admissible = list(state["admissible_commands"])

    def close(self) -> None:
        if self._tw is not None:
            self._tw.close()
            self._tw = None

    def __enter__(self) -> "HouseholdEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- API ----------------------------------------------------------------------------

    def reset(self) -> dict[str, Any]:
        """Start (or restart) the quest; returns the first observation."""
        if self._tw is None:
            self._start()
        try:
            state = self._tw.reset()
        except Exception as exc:
            raise GameFileError(f"corrupt game file {self.game_file}: {_one_line(exc)}") from exc
        self._aliases = dict(state.get("extra.parser_aliases") or {})
        win = state.get("win_facts") or []
        if not win or not win[0]:
            raise GameFileError(f"game file {self.game_file} has no quest (win facts missing)")
        self.goal = sorted(fact_str(f.name, [v.name for v in f.arguments]) for f in win[0][0])
        self.objective = self._objective or state.get("objective") or ""
        self._read(state)
        self.steps = 0
        self._done = False
        self.won = False
        self.lost = False
        self.visited = {self.world.player}
        self.examined: set[str] = set()
        self.opened: set[str] = set()
        self.unlocked: set[str] = set()
        self._no_change: set[str] = set()
        return self.observation()

    def observation(self) -> dict[str, Any]:
        w = self.world
        exits = w.room_exits()
        return {
            "scene": self.scene_id,
            "agent_location": w.player,
            "agent_inventory": w.inventory(),
            "visible_entities": w.visible_entities(),
            "available_actions": available_verbs(self.admissible),
            "description": w.describe(),
            "objective": self.objective,
            "admissible_commands": list(self.admissible),
            "admissible_actions": [dict(command_to_action(c, exits), command=c) for c in self.admissible
                                   if _is_household(c)],
            "step": self.steps,
            "max_steps": self.max_steps,
        }

    def expert_plan(self) -> list[str] | None:
        """Shortest remaining plan from the current state (``None`` if none exists)."""
        if self.won:
            return []
        return shortest_plan(self.world, self.goal, self.preferences, opened=self.opened, unlocked=self.unlocked)

    def preferences_status(self) -> dict[str, bool]:
        return check_preferences(self.preferences, self.world.facts, opened=self.opened, unlocked=self.unlocked)

    def step(self, action: Mapping[str, Any]) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Play one action dict; an invalid one is a recorded failed step, never an exception."""
        if self._tw is None or self._done:
            if self._tw is None and not hasattr(self, "steps"):
                raise RuntimeError("call reset() before step()")
            info = self._info(None, False, "The episode is over.", False, False, {k: 0.0 for k in _PARTS})
            return self.observation(), 0.0, True, info
        self.steps += 1
        before = self.world
        try:
            command = action_to_command(action, self.admissible, before.room_exits())
            valid, error = True, None
        except ActionError as exc:
            command, valid, error = None, False, str(exc)
        if not valid:
            feedback = f"Invalid action: {error}."
            key = "invalid:" + json.dumps(action, sort_keys=True, default=str)
        elif command is None:
            feedback, key = "You wait. Nothing happens.", "wait"
        else:
            key = command
            sent = " ".join(self._aliases.get(tok, tok) for tok in command.split())
            state, _, _ = self._tw.step(sent)
            self._read(state)
            self.won = self.won or bool(state.get("won"))
            self.lost = self.lost or bool(state.get("lost"))
            feedback = clean_feedback(state.get("feedback"))
            if command in ("look",) or feedback.startswith("-="):
                feedback = self.world.describe()  # room text is flavour; say it from facts
        after = self.world
        changed = after.facts != before.facts
        for c, s in after.container_state.items():
            if s == "open" and before.container_state.get(c) != "open":
                self.opened.add(c)
            if before.container_state.get(c) == "locked" and s != "locked":
                self.unlocked.add(c)
        repeated = not changed and key in self._no_change
        if not changed:
            self._no_change.add(key)
        r = self.reward_cfg
        parts = {k: 0.0 for k in _PARTS}
        parts["step_cost"] = 0.0 - r["step_cost"]
        if not valid:
            parts["invalid"] = r["invalid_penalty"]
        if repeated:
            parts["repeat"] = r["repeat_penalty"]
        if after.player != before.player and after.player not in self.visited:
            self.visited.add(after.player)
            parts["first_visit"] = r["first_visit_bonus"]
        if valid and command and command.startswith("examine "):
            parts["examine"] = r["examine_reward"]
            target = command.split(" ", 1)[1]
            if target not in self.examined:
                self.examined.add(target)
                parts["first_examine"] = r["first_examine_bonus"]
        if self.won:
            parts["win"] = r["win"]
        reward = float(sum(parts[k] for k in _PARTS))
        truncated = self.steps >= self.max_steps and not (self.won or self.lost)
        self._done = self.won or self.lost or self.steps >= self.max_steps
        info = self._info(command, valid, feedback, changed, repeated, parts)
        info["truncated"] = truncated
        if error:
            info["error"] = error
        return self.observation(), reward, self._done, info

    def _info(self, command, valid, feedback, changed, repeated, parts) -> dict[str, Any]:
        plan = self.expert_plan() if self.compute_expert_plan else None
        prefs = self.preferences_status()
        return {
            "command": command,
            "valid": valid,
            "env_feedback": feedback,
            "won": self.won,
            "lost": self.lost,
            "changed": changed,
            "repeated": repeated,
            "facts": sorted(self.world.facts),
            "expert_plan": plan or [],
            "solvable": plan is not None if self.compute_expert_plan else None,
            "preferences_ok": all(prefs.values()),
            "preferences": prefs,
            "reward_parts": parts,
            "step": self.steps,
            "truncated": False,
        }


_MOVE_ORDER = {"take": 0, "insert": 1, "put": 1, "drop": 1, "unlock": 2, "close": 3, "lock": 4, "go": 5, "open": 6}
_PARTS = ("win", "invalid", "repeat", "first_visit", "first_examine", "examine", "step_cost")


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _is_household(command: str) -> bool:
    try:
        command_to_action(command)
        return True
    except ValueError:
        return False
