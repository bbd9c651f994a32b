"""Who comments on the agent's steps: a simulated user or a file written by a person.

The simulated user knows the game: its facts after every step (``info["facts"]``, e.g.
``in(Apple_2: o, Cabinet_0: c)``), the scene layout (``scenes.json``) and the remaining
expert plan (``info["expert_plan"]``). From these it writes typed lines (seed 000)::

    user = SimulatedUser(cfg.user, scene_spec, quest_row, seed=1234)
    fb = user.step_feedback(1, obs_before, {"action": "open", "target": "Cabinet_0"}, info)
    fb.lines   # ['feedback : procedural: Cabinet_0 is locked: unlock it with Key_1 first.']
    fb.status  # 'Failure'
    preferences_ok, lines = user.end_feedback(last_info)

Which remarks a step warrants:

- ``procedural``: the action broke a precondition (take from a closed container, open a
  locked one, unlock without the key, put something not held, ...); or, when the agent
  stalls next to what it needs, the next thing to do with it.
- ``spatial``: where a needed object or key is and how to get to its room; given when the
  action named something that is not here, when the step moved away from the goal (the
  remaining expert plan got longer) and when the agent stalls (2nd, 5th, 8th, ... step
  without progress; one line is not repeated within three steps).
- ``general``: an action repeated without effect, or an impossible action with no more
  specific diagnosis.
- ``user_preference``: a scene preference (``Close containers after use.``) broken when
  the agent leaves a room (a container it opened left open there) and, at the end, every
  preference that does not hold (the env's kinds and checks, :mod:`pipeline.envs.household.env`).

A step that warrants remarks gets them with probability ``user.feedback_prob``; each line
is then replaced by an unhelpful or wrong one with probability ``user.noise``. The end
verdict on preferences is always given. All draws come from ``numpy.random.default_rng(seed)``:
the same seed and the same steps give the same lines.

Status of a step (seed 000): ``Success`` when it won or shortened the remaining expert
plan, ``Failure`` when it was invalid (a broken precondition is invalid in TextWorld) or
lost, ``WiP`` otherwise.

:class:`FileFeedback` gives the same interface from a JSONL file of
``{"episode_id", "step_id", "line"}`` records (``step_id`` may be ``"end"``).
"""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from pipeline.grounding.feedback import FeedbackFormatError, format_feedback_line, parse_feedback_line
from pipeline.core.schemas import STATUSES

OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east", "up": "down", "down": "up"}
_FACT_RE = re.compile(r"^\s*([A-Za-z_][\w]*)\s*\((.*)\)\s*$")
_DIRECTION_FACTS = {"north_of": "north", "south_of": "south", "east_of": "east", "west_of": "west"}

UNHELPFUL = (
    "Hmm, keep going.",
    "I am not sure what you are trying to do.",
    "Maybe look around a bit more.",
    "That is an interesting choice.",
    "Take your time.",
)


@dataclass
class StepFeedback:
    """What the user says about one step.

    Attributes:
        lines: ``feedback : <type>: <text>`` lines (possibly none).
        status: ``Success`` | ``Failure`` | ``WiP`` (seed 000).
        noisy: for each line, whether it is a noise line (simulated user only).
    """

    lines: list[str]
    status: str
    noisy: list[bool] = field(default_factory=list)


# --------------------------------------------------------------------------- world model


def parse_fact(fact: str) -> tuple[str, tuple[str, ...]] | None:
    """``"in(Apple_2: o, Cabinet_0: c)"`` -> ``("in", ("Apple_2", "Cabinet_0"))``.

    Accepts TextWorld's ``name: type`` arguments and plain names; returns None for a
    string that is not a predicate.
    """
    m = _FACT_RE.match(str(fact))
    if m is None:
        return None
    args = tuple(a.split(":")[0].strip() for a in m.group(2).split(",")) if m.group(2).strip() else ()
    return m.group(1), args


class World:
    """The facts of one game state, read with the scene spec as a fallback.

    Entity names are matched case-insensitively (TextWorld commands may lower-case them)
    and reported with the scene's spelling.
    """

    def __init__(self, facts: Iterable[str] | None, scene: Mapping[str, Any]):
        self.scene = scene
        self.names: dict[str, str] = {}
        for r in scene.get("rooms", []):
            self.names[r.lower()] = r
        for group in ("containers", "supporters", "objects", "keys"):
            for e in scene.get(group, []):
                self.names[e["name"].lower()] = e["name"]
        self.preds: dict[str, set[tuple[str, ...]]] = {}
        self.has_facts = facts is not None
        for f in facts or []:
            p = parse_fact(f)
            if p is not None:
                self.preds.setdefault(p[0], set()).add(tuple(self.canon(a) for a in p[1]))
        self.containers = {c["name"]: c for c in scene.get("containers", [])}
        self.supporters = {s["name"]: s for s in scene.get("supporters", [])}
        self.rooms = list(scene.get("rooms", []))

    def canon(self, name: str | None) -> str:
        if name is None:
            return ""
        return self.names.get(str(name).lower(), str(name))

    def holds(self, pred: str, *args: str) -> bool:
        return tuple(args) in self.preds.get(pred, set())

    def location(self) -> str | None:
        """The player's room (``at(P, room)``)."""
        for args in self.preds.get("at", ()):
            if len(args) == 2 and args[0] == "P":
                return args[1]
        return None

    def inventory(self) -> list[str]:
        return sorted(a[0] for a in self.preds.get("in", ()) if len(a) == 2 and a[1] == "I")

    def is_container(self, name: str) -> bool:
        states = ("open", "closed", "locked")
        return name in self.containers or any(a[0] == name for p in states for a in self.preds.get(p, ()))

    def is_open(self, c: str) -> bool:
        return self.holds("open", c)

    def is_closed(self, c: str) -> bool:
        return self.holds("closed", c) or self.holds("locked", c)

    def is_locked(self, c: str) -> bool:
        return self.holds("locked", c)

    def key_for(self, c: str) -> str | None:
        for k, cc in self.preds.get("match", ()):
            if cc == c:
                return k
        spec = self.containers.get(c) or {}
        if spec.get("key"):
            return self.canon(spec["key"])
        for k in self.scene.get("keys", []):
            if self.canon(k.get("opens")) == c:
                return k["name"]
        return None

    def where(self, entity: str) -> tuple[str, str] | None:
        """``("in"|"on"|"at", holder)`` for an entity; ``("in", "I")`` when carried."""
        for pred in ("in", "on", "at"):
            for args in self.preds.get(pred, ()):
                if len(args) == 2 and args[0] == entity:
                    return pred, args[1]
        if not self.has_facts:  # no facts yet: the scene's initial layout
            for group in ("objects", "keys"):
                for e in self.scene.get(group, []):
                    if e["name"] == entity:
                        holder = self.canon(e.get("location"))
                        if holder in self.containers:
                            return "in", holder
                        if holder in self.supporters:
                            return "on", holder
                        return "at", holder
            spec = self.containers.get(entity) or self.supporters.get(entity)
            if spec:
                return "at", self.canon(spec.get("room"))
        return None

    def room_of(self, entity: str, depth: int = 0) -> str | None:
        if entity in self.rooms:
            return entity
        w = self.where(entity)
        if w is None or depth > 5:
            return None
        if w[1] == "I":
            return self.location()
        if w[0] == "at":
            return w[1]
        return self.room_of(w[1], depth + 1)

    def describe(self, entity: str) -> str | None:
        """``"Key_1 is on Table_0 in the Kitchen."`` (None when unknown or carried)."""
        w = self.where(entity)
        if w is None or w[1] == "I":
            return None
        if w[0] == "at":
            return f"{entity} is in the {w[1]}."
        room = self.room_of(w[1])
        tail = f" in the {room}" if room else ""
        return f"{entity} is {w[0]} {w[1]}{tail}."

    def exits(self, room: str) -> dict[str, str]:
        """``{direction: neighbour}`` from the scene's connections (or the facts)."""
        out: dict[str, str] = {}
        for a, d, b in self.scene.get("connections", []):
            a, b, d = self.canon(a), self.canon(b), str(d).lower()
            if a == room:
                out[d] = b
            if b == room and d in OPPOSITE:
                out.setdefault(OPPOSITE[d], a)
        for pred, d in _DIRECTION_FACTS.items():  # east_of(r2, r1): r2 lies east of r1
            for args in self.preds.get(pred, ()):
                if len(args) == 2 and args[1] == room:
                    out.setdefault(d, args[0])
        return out

    def route(self, start: str, goal: str) -> list[tuple[str, str]]:
        """Shortest list of ``(direction, room)`` hops from ``start`` to ``goal``."""
        prev: dict[str, tuple[str, str] | None] = {start: None}
        todo = deque([start])
        while todo:
            r = todo.popleft()
            if r == goal:
                break
            for d, nb in sorted(self.exits(r).items()):
                if nb not in prev:
                    prev[nb] = (r, d)
                    todo.append(nb)
        if goal not in prev:
            return []
        hops = []
        cur = goal
        while prev[cur] is not None:
            r, d = prev[cur]
            hops.append((d, cur))
            cur = r
        return hops[::-1]


def parse_command(command: str | None) -> tuple[str, list[str]]:
    """A TextWorld command -> ``(verb, [entities])``: ``"unlock C with K"`` -> ``("unlock", ["C", "K"])``."""
    if not command:
        return "", []
    words = command.strip().split()
    verb = words[0].lower() if words else ""
    rest = " ".join(words[1:])
    parts = re.split(r"\s+(?:from|into|in|on|onto|with)\s+", rest) if rest else []
    return verb, [p.strip() for p in parts if p.strip()]


# --------------------------------------------------------------------------- preferences


def pref_text(pref: Mapping[str, Any]) -> str:
    """The sentence of a scene preference (its ``text``, else the env's wording)."""
    if pref.get("text"):
        return str(pref["text"])
    from pipeline.envs.household.env import parse_preference, preference_text

    _, kind, target = parse_preference(pref)
    return preference_text(kind, target)


def broken_in_room(pref: Mapping[str, Any], world: World, room: str, opened: set[str], unlocked: set[str]) -> list[str]:
    """Containers of ``room`` that break a preference now (the env's kinds).

    ``close_containers``: a container opened in this episode is open; ``keep_closed``: the
    target is open; ``lock_after_use``: the target was unlocked and is not locked again.
    """
    from pipeline.envs.household.env import parse_preference

    _, kind, target = parse_preference(pref)
    here = [c for c in world.containers if world.room_of(c) == room] if world.containers else []
    here += [c for c in (target,) if c and c not in here and world.room_of(c) == room]
    if kind == "close_containers":
        return sorted(c for c in here if c in opened and world.is_open(c))
    if kind == "keep_closed":
        return [target] if target in here and world.is_open(target) else []
    if kind == "lock_after_use":
        return [target] if target in here and target in unlocked and not world.is_locked(target) else []
    return []


# --------------------------------------------------------------------------- simulated user


def _field(obj: Any, key: str) -> Any:
    """``obj[key]`` for a mapping, ``obj.key`` for an object (a rollout Task), else None."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _get(cfg: Any, key: str, default: Any) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def step_status(info: Mapping[str, Any], plan_before: int | None) -> str:
    """Seed 000's status of a step from the env's ``info`` (see the module docstring)."""
    if not info.get("valid", True) or info.get("lost", False):
        return "Failure"
    if info.get("won", False):
        return "Success"
    plan = info.get("expert_plan")
    if info.get("solvable") is False:  # the env's plan is [] when none exists: not progress
        return "WiP"
    if plan is not None and plan_before is not None and len(plan) < plan_before:
        return "Success"
    return "WiP"


class SimulatedUser:
    """A user who knows the game and comments on each step with typed feedback lines.

    Args:
        user_cfg: the ``user`` config group (``feedback_prob``, ``noise``); a mapping works.
        scene_spec: the scene's entry of ``scenes.json``.
        quest_row: the quest's manifest row (``objective``, ``expert_plan``, ``preferences``).
        seed: seed of this user's random draws (one user per episode).
    """

    def __init__(self, user_cfg: Any, scene_spec: Mapping[str, Any], quest_row: Any, seed: int):
        self.feedback_prob = float(_get(user_cfg, "feedback_prob", 0.8))
        self.noise = float(_get(user_cfg, "noise", 0.0))
        for key, value in (("user.feedback_prob", self.feedback_prob), ("user.noise", self.noise)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{key}={value!r}: expected a probability in [0, 1]")
        self.scene = dict(scene_spec)
        self.quest = {k: _field(quest_row, k) for k in ("quest_id", "objective", "expert_plan", "preferences")}
        self.rng = np.random.default_rng(seed)
        wanted = self.quest.get("preferences")
        prefs = list(self.scene.get("preferences", []))
        self.preferences = prefs if wanted is None else [p for p in prefs if p.get("id") in set(wanted)]
        plan = self.quest.get("expert_plan")
        self._plan_len: int | None = len(plan) if plan is not None else None
        self._world = World(None, self.scene)
        self._stall = 0
        self._warned_rooms: set[tuple[str, str]] = set()
        self._opened: set[str] = set()  # containers opened during the episode (all start closed)
        self._hinted: dict[str, int] = {}  # stall hint line -> step it was last given
        self._unlocked: set[str] = set()

    # -- helpers ------------------------------------------------------------------------

    def _needed(self, plan: list[str], world: World) -> tuple[str | None, str | None]:
        """``(command, entity)``: the next expert command that acts on something, and the
        thing it needs that the agent does not hold (its key first, for unlock / lock)."""
        held = set(world.inventory())
        for cmd in plan:
            verb, ents = parse_command(cmd)
            if verb in ("go", "look", "inventory", "examine", ""):
                continue
            ents = [world.canon(e) for e in ents]
            if verb in ("unlock", "lock") and len(ents) == 2 and ents[1] not in held:
                return cmd, ents[1]
            for e in ents:
                if e not in held:
                    return cmd, e
            return cmd, None
        return None, None

    def _stall_hint(self, world: World, plan: list[str]) -> list[str]:
        """Where the next needed thing is (spatial) or, when it is at hand, what to do
        with it next (procedural)."""
        cmd, entity = self._needed(plan, world)
        here = world.location()
        if entity and world.room_of(entity) not in (None, here):
            return self._spatial_hint(world, entity)
        if cmd is None:
            return []
        verb, ents = parse_command(cmd)
        ents = [world.canon(e) for e in ents]
        todo = {
            "take": lambda: f"take {ents[0]} from {ents[1]}" if len(ents) > 1 else f"take {ents[0]}",
            "insert": lambda: f"put {ents[0]} in {ents[1]}",
            "put": lambda: f"put {ents[0]} on {ents[1]}",
            "drop": lambda: f"drop {ents[0]} here",
            "open": lambda: f"open {ents[0]}",
            "close": lambda: f"close {ents[0]}",
            "unlock": lambda: f"unlock {ents[0]} with {ents[1]}" if len(ents) > 1 else f"unlock {ents[0]}",
            "lock": lambda: f"lock {ents[0]} again with {ents[1]}" if len(ents) > 1 else f"lock {ents[0]} again",
        }.get(verb)
        if todo is None or not ents:
            return []
        return [format_feedback_line("procedural", f"What you need is right here: {todo()}.")]

    def _spatial_hint(self, world: World, entity: str | None) -> list[str]:
        if not entity:
            return []
        lines = []
        desc = world.describe(entity)
        if desc:
            lines.append(format_feedback_line("spatial", desc))
        here, there = world.location(), world.room_of(entity)
        if here and there and here != there:
            hops = world.route(here, there)
            if hops:
                d, nxt = hops[0]
                lines.append(format_feedback_line(
                    "spatial", f"From the {here}, go {d} to reach the {nxt}"
                    + (f" (on the way to the {there})." if nxt != there else ".")))
        return lines

    def _diagnose_invalid(self, action: Mapping[str, Any], world: World, here: str | None) -> list[str]:
        """Lines for an action the game refused: a broken precondition if one is found."""
        verb = str(action.get("action") or "").lower()
        target = world.canon(action.get("target"))
        recep = world.canon(action.get("receptacle"))
        key = world.canon(action.get("key"))
        held = set(world.inventory())
        proc = lambda t: format_feedback_line("procedural", t)  # noqa: E731
        gen = lambda t: format_feedback_line("general", t)  # noqa: E731

        def away(entity: str) -> list[str]:
            room = world.room_of(entity)
            if room and here and room != here:
                return self._spatial_hint(world, entity)
            return []

        if verb == "pick_up" and target:
            if target in held:
                return [gen(f"You already hold {target}.")]
            w = world.where(target)
            if w and w[0] == "in" and world.is_container(w[1]) and world.is_closed(w[1]):
                out = [proc(f"Open {w[1]} before taking things from it.")]
                if world.is_locked(w[1]):
                    k = world.key_for(w[1])
                    out.append(proc(f"{w[1]} is locked: unlock it with {k} first." if k else f"{w[1]} is locked."))
                return out + away(target)
            return away(target) or [gen(f"You cannot pick up {target} here.")]
        if verb == "open" and target:
            if world.is_locked(target):
                k = world.key_for(target)
                out = [proc(f"{target} is locked: unlock it with {k} first." if k else f"{target} is locked.")]
                if k and k not in held:
                    out += self._spatial_hint(world, k)
                return out
            if world.is_open(target):
                return [gen(f"{target} is already open.")]
            return away(target) or [gen(f"{target} cannot be opened.")]
        if verb == "close" and target:
            if world.is_closed(target):
                return [gen(f"{target} is already closed.")]
            return away(target) or [gen(f"{target} cannot be closed.")]
        if verb in ("unlock", "lock") and target:
            k = world.key_for(target)
            if verb == "unlock" and world.has_facts and not world.is_locked(target) and world.is_container(target):
                return [gen(f"{target} is not locked.")]
            if key and k and key != k:
                return [proc(f"{target} opens with {k}, not {key}.")]
            if k and k not in held:
                return [proc(f"Take {k} before you {verb} {target}.")] + self._spatial_hint(world, k)
            if verb == "lock" and world.is_open(target):
                return [proc(f"Close {target} before locking it.")]
            return away(target) or [gen(f"You cannot {verb} {target} now.")]
        if verb in ("put", "drop") and target:
            if target not in held:
                dest = f" in {recep}" if recep else ""
                return [proc(f"Pick up {target} before putting it{dest}.")] + away(target)
            if recep and world.is_container(recep) and world.is_closed(recep):
                out = [proc(f"Open {recep} before putting things in it.")]
                if world.is_locked(recep):
                    k = world.key_for(recep)
                    out.append(proc(f"{recep} is locked: unlock it with {k} first." if k else f"{recep} is locked."))
                return out
            if recep:
                return away(recep) or [gen(f"You cannot put {target} there.")]
        if verb == "go_to" and here:
            exits = world.exits(here)
            if exits:
                ways = ", ".join(f"{d} to the {r}" for d, r in sorted(exits.items()))
                return [format_feedback_line("spatial", f"From the {here} you can go {ways}.")]
        if verb == "examine" and target:
            spots = away(target)
            if spots:
                return spots
        shown = info_command(action)
        return [gen(f"'{shown}' is not possible here; choose one of the admissible actions.")]

    def _noise_line(self) -> str:
        objects = [e["name"] for g in ("objects", "keys") for e in self.scene.get(g, [])]
        holders = [c["name"] for c in self.scene.get("containers", [])] + \
                  [s["name"] for s in self.scene.get("supporters", [])]
        rooms = list(self.scene.get("rooms", []))
        if self.rng.random() < 0.5 and objects and holders and rooms:
            obj = objects[int(self.rng.integers(len(objects)))]
            true = self._world.where(obj)
            choices = [h for h in holders if true is None or h != true[1]] or holders
            holder = choices[int(self.rng.integers(len(choices)))]
            room = rooms[int(self.rng.integers(len(rooms)))]
            prep = "in" if holder in self._world.containers else "on"
            return format_feedback_line("spatial", f"{obj} is {prep} {holder} in the {room}.")
        return format_feedback_line("general", UNHELPFUL[int(self.rng.integers(len(UNHELPFUL)))])

    # -- interface ----------------------------------------------------------------------

    def step_feedback(self, step_id: int, obs: Mapping[str, Any], action: Mapping[str, Any] | None,
                      info: Mapping[str, Any]) -> StepFeedback:
        """Lines and status for one step.

        Args:
            step_id: 1-based step number (kept for interface parity with FileFeedback).
            obs: the observation the agent acted on (before the step).
            action: the action dict the agent sent.
            info: the env's info after the step (``valid``, ``won``, ``facts``, ``expert_plan``, ...).
        """
        action = dict(action or {})
        before = self._world
        world = World(info.get("facts"), self.scene) if info.get("facts") is not None else before
        for c, spec in world.containers.items():
            if world.is_open(c):
                self._opened.add(c)
            was_locked = before.is_locked(c) if before.has_facts else bool(spec.get("locked"))
            if world.has_facts and was_locked and not world.is_locked(c):
                self._unlocked.add(c)
        here_before = obs.get("agent_location") or before.location()
        here_now = world.location() or here_before
        status = step_status(info, self._plan_len)
        plan = list(info.get("expert_plan") or [])
        valid = bool(info.get("valid", True))

        lines: list[str] = []
        if not valid:
            lines += self._diagnose_invalid(action, world, here_before)
        if valid:
            # Preferences broken by leaving a room (e.g. a container left open there).
            if here_before and here_now and here_now != here_before:
                for pref in self.preferences:
                    bad = broken_in_room(pref, world, here_before, self._opened, self._unlocked)
                    if bad and (pref.get("id", ""), here_before) not in self._warned_rooms:
                        self._warned_rooms.add((pref.get("id", ""), here_before))
                        state = "unlocked" if pref.get("kind") == "lock_after_use" else "open"
                        detail = f"{', '.join(bad)} left {state} in the {here_before}."
                        lines.append(format_feedback_line("user_preference", f"{pref_text(pref)} ({detail})"))
            if info.get("repeated"):
                shown = info.get("command") or info_command(action)
                lines.append(format_feedback_line("general",
                                                  f"You repeated '{shown}' without effect; try something new."))
        if status == "Success":
            self._stall = 0
        else:
            self._stall += 1
        grew = self._plan_len is not None and info.get("expert_plan") is not None and len(plan) > self._plan_len
        if valid and not info.get("won") and (grew or self._stall in (2, 5, 8, 12, 16, 20)):
            for line in self._stall_hint(world, plan):
                # A hint repeated within a few steps is noise to a person: say it once.
                if line not in lines and step_id - self._hinted.get(line, -99) > 3:
                    self._hinted[line] = step_id
                    lines.append(line)
        if info.get("expert_plan") is not None and info.get("solvable") is not False:
            self._plan_len = len(plan)
        self._world = world

        # One draw per step decides whether the user speaks; noise draws per line follow.
        speak = self.rng.random() < self.feedback_prob
        if not lines or not speak:
            return StepFeedback([], status, [])
        out, noisy = [], []
        for line in lines:
            if self.noise > 0 and self.rng.random() < self.noise:
                out.append(self._noise_line())
                noisy.append(True)
            else:
                out.append(line)
                noisy.append(False)
        return StepFeedback(out, status, noisy)

    def end_feedback(self, final: Mapping[str, Any] | Iterable[str] | None) -> tuple[bool, list[str]]:
        """Judge the scene preferences on the final state.

        Args:
            final: the last ``info`` dict (the env's per-preference verdict
                ``preferences`` and ``preferences_ok`` win; else its ``facts`` are checked
                with :func:`pipeline.envs.household.env.check_preferences`) or the final facts as strings.

        Returns:
            ``(preferences_ok, lines)``: one ``user_preference`` line per broken preference.
        """
        info = final if isinstance(final, Mapping) else {"facts": list(final) if final is not None else None}
        held = info.get("preferences")
        if held is None:  # no per-preference verdict from the env: check the facts here
            from pipeline.envs.household.env import check_preferences

            facts = info.get("facts")
            if facts is None:
                return bool(info.get("preferences_ok", True)), []
            plain = [_plain_fact(f) for f in facts]
            held = check_preferences(self.preferences, plain, opened=self._opened or None,
                                     unlocked=self._unlocked or None)
        lines = []
        for pref in self.preferences:
            pid = pref.get("id")
            if pid in held and not held[pid]:
                lines.append(format_feedback_line("user_preference", pref_text(pref)))
        ok = info.get("preferences_ok")
        ok = all(held.values()) if ok is None else bool(ok)
        if not ok and not lines:  # the env saw a breach we cannot attribute: restate them all
            lines = [format_feedback_line("user_preference", pref_text(p)) for p in self.preferences]
        return ok, lines


def _plain_fact(fact: str) -> str:
    """``"open(Fridge_0: c)"`` -> ``"open(Fridge_0)"`` (the env's fact strings)."""
    p = parse_fact(fact)
    return f"{p[0]}({', '.join(p[1])})" if p else str(fact)


def info_command(action: Mapping[str, Any]) -> str:
    """A readable form of an action dict for feedback text (not a TextWorld command)."""
    parts = [str(action.get("action") or "?")]
    if action.get("target"):
        parts.append(str(action["target"]))
    if action.get("receptacle"):
        parts.append(f"-> {action['receptacle']}")
    if action.get("key"):
        parts.append(f"with {action['key']}")
    return " ".join(parts)


# --------------------------------------------------------------------------- file feedback


class FileFeedback:
    """Feedback written by a person: JSONL records ``{"episode_id", "step_id", "line"}``.

    The whole file is read and checked when constructed, so a bad record fails before
    any episode is played, with ``<file>:<line number>`` in the message. ``step_id`` is
    the 1-based step or ``"end"`` for episode-end remarks; an optional ``"status"`` field
    overrides the status derived from the env. Preferences at the end are judged by the
    env's ``preferences_ok`` (or the scene's preferences when a scene spec is given)::

        fb = FileFeedback("feedback.jsonl").for_episode("ep_train_s0_q1_0")
        fb.step_feedback(1, obs, action, info).lines

    Args:
        path: the JSONL file.
        user_cfg: the ``user`` config group (unused for now; kept for parity with SimulatedUser).
        unknown: ``grounding.unknown_type`` for lines with an unknown type.
        episode_id: the episode to answer for (or bind one later with :meth:`for_episode`).
        scene_spec, quest_row: optional, to check scene preferences at the end (the quest
            row may be a manifest dict or an object with ``expert_plan`` / ``preferences``).
    """

    def __init__(self, path: str | Path, user_cfg: Any = None, unknown: str = "keep", episode_id: str | None = None,
                 scene_spec: Mapping[str, Any] | None = None, quest_row: Any = None):
        self.path = Path(path)
        self.episode_id = episode_id
        self.unknown = unknown
        self.scene = scene_spec
        self.quest = quest_row
        self.records: dict[str, dict[Any, list[tuple[str, str | None]]]] = {}
        self._plan_len: int | None = None
        self._load()

    def _load(self) -> None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise FeedbackFormatError(f"{self.path}: feedback file not found (user.feedback_file)") from exc
        except UnicodeDecodeError as exc:
            line_no = self.path.read_bytes()[: exc.start].count(b"\n") + 1
            raise FeedbackFormatError(f"{self.path}:{line_no}: not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
        for n, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            where = f"{self.path}:{n}"
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise FeedbackFormatError(f"{where}: not a JSON object ({exc.msg})") from exc
            except RecursionError as exc:
                raise FeedbackFormatError(f"{where}: JSON nested too deeply; expected a flat object") from exc
            if not isinstance(rec, dict):
                raise FeedbackFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            missing = [k for k in ("episode_id", "step_id", "line") if k not in rec]
            if missing:
                raise FeedbackFormatError(f"{where}: missing field(s) {missing}; expected episode_id, step_id, line")
            step = rec["step_id"]
            if not (step == "end" or (isinstance(step, int) and not isinstance(step, bool) and step >= 1)):
                raise FeedbackFormatError(f"{where}: step_id={step!r}: expected an integer >= 1 or \"end\"")
            status = rec.get("status")
            if status is not None and status not in STATUSES:
                raise FeedbackFormatError(f"{where}: status={status!r}: expected one of {', '.join(STATUSES)}")
            line = rec["line"]
            ftype, body = parse_feedback_line(line, unknown=self.unknown, where=where)
            canonical = format_feedback_line(ftype, body)
            self.records.setdefault(str(rec["episode_id"]), {}).setdefault(step, []).append((canonical, status))

    def for_episode(self, episode_id: str, scene_spec: Mapping[str, Any] | None = None,
                    quest_row: Any = None) -> "FileFeedback":
        """A view of the same records that answers for one episode."""
        view = object.__new__(FileFeedback)
        view.path, view.unknown, view.records = self.path, self.unknown, self.records
        view.episode_id = episode_id
        view.scene = scene_spec if scene_spec is not None else self.scene
        view.quest = quest_row if quest_row is not None else self.quest
        plan = _field(view.quest, "expert_plan")
        view._plan_len = len(plan) if plan is not None else None
        return view

    def _entries(self, step: Any) -> list[tuple[str, str | None]]:
        if self.episode_id is None:
            raise ValueError(f"{self.path}: FileFeedback has no episode bound; use for_episode(episode_id)")
        return self.records.get(str(self.episode_id), {}).get(step, [])

    def step_feedback(self, step_id: int, obs: Mapping[str, Any], action: Mapping[str, Any] | None,
                      info: Mapping[str, Any]) -> StepFeedback:
        entries = self._entries(step_id)
        status = step_status(info, self._plan_len)
        if info.get("expert_plan") is not None and info.get("solvable") is not False:
            self._plan_len = len(info["expert_plan"])
        given = [s for _, s in entries if s is not None]
        return StepFeedback([line for line, _ in entries], given[-1] if given else status, [False] * len(entries))

    def end_feedback(self, final: Mapping[str, Any] | Iterable[str] | None) -> tuple[bool, list[str]]:
        lines = [line for line, _ in self._entries("end")]
        info = final if isinstance(final, Mapping) else {"facts": list(final) if final is not None else None}
        if self.scene is not None:
            quest = {k: _field(self.quest, k) for k in ("expert_plan", "preferences")
                     if _field(self.quest, k) is not None}
            ok, pref_lines = SimulatedUser({}, self.scene, quest, seed=0).end_feedback(info)
            return ok, lines + [p for p in pref_lines if p not in lines]
        return bool(info.get("preferences_ok", True)), lines

