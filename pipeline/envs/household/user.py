"""The household world's simulated user: typed feedback from the game's facts.

The simulated user knows the game: its facts after every step (``info["facts"]``, e.g.
``in(Apple_2, Cabinet_0)``; TextWorld's typed ``in(Apple_2: o, Cabinet_0: c)`` also
reads), the scene layout (``scenes.json``) and the remaining expert plan
(``info["expert_plan"]``). From these it writes typed lines (seed 000)::

    user = SimulatedUser(cfg.user, scene_spec, quest_row, seed=1234)
    fb = user.step_feedback(1, obs_before, {"action": "open", "target": "Cabinet_0"}, info)
    fb.lines   # ['feedback : procedural: Cabinet_0 is locked: unlock it with Key_1 first.']
    fb.status  # 'Failure'
    preferences_ok, lines = user.end_feedback(last_info)

Which remarks a step warrants:

- ``procedural``: the action broke a precondition (take from a closed container, open a
  locked one, unlock without the key, put something not held, ...); or, when the agent
  stalls next to what it needs, the next thing to do with it.
- ``spatial``: where a needed object or key is and how to get to its room (``user.spatial``:
  ``full`` both, ``room`` the way to its room only, ``none`` neither); given when the
  action named something that is not here, when the step moved away from the goal (the
  remaining expert plan got longer) and when the agent stalls (2nd, 5th, 8th, ... step
  without progress; one line is not repeated within three steps).
- ``general``: an action repeated without effect, or an impossible action with no more
  specific diagnosis.
- ``user_preference``: a scene preference (``Close containers after use.``) broken when
  the agent leaves a room (a container it opened left open there) and, at the end, every
  preference that does not hold (the kinds and checks of :mod:`pipeline.envs.household.world`).

A step that warrants remarks gets them with probability ``user.feedback_prob``; each line
is then replaced by an unhelpful or wrong one with probability ``user.noise``. The end
verdict on preferences is always given. All draws come from ``numpy.random.default_rng(seed)``:
the same seed and the same steps give the same lines.

Status of a step (seed 000): ``Success`` when it won or shortened the remaining expert
plan, ``Failure`` when it was invalid (a broken precondition is invalid in TextWorld) or
lost, ``WiP`` otherwise.

A person's feedback from a file gives the same interface: :class:`pipeline.users.file.FileFeedback`.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

import numpy as np

from pipeline.core.conf_schema import SpatialFeedback, UserConfig
from pipeline.envs.common import UNHELPFUL, StepFeedback, speak, step_status
from pipeline.envs.household.planner import room_route
from pipeline.envs.household.text import exits_sentence, location_sentence, preference_text, route_sentence
from pipeline.envs.household.world import (OPPOSITE, World, check_preferences, parse_preference, plain_fact,
                                           scene_kinds)
from pipeline.grounding.feedback import format_feedback_line

# --------------------------------------------------------------------------- what the user reads


class SceneView:
    """A game state as the simulated user reads it: the :class:`World` of the step's facts,
    with the scene spec for names, layout and keys.

    Entity names are matched case-insensitively (TextWorld commands may lower-case them)
    and reported with the scene's spelling. Before the first step (``facts`` is None) the
    player's room and the containers' states are unknown, and entities are where the
    scene spec first put them.

    Args:
        facts: the step's fact strings (``info["facts"]``), or None when there are none yet.
        scene: the scene's entry of ``scenes.json``.
    """

    def __init__(self, facts: Iterable[str] | None, scene: Mapping[str, Any]):
        self.scene = scene
        self.names: dict[str, str] = {}
        for r in scene.get("rooms", []):
            self.names[r.lower()] = r
        for group in ("containers", "supporters", "objects", "keys"):
            for e in scene.get(group, []):
                self.names[e["name"].lower()] = e["name"]
        self.has_facts = facts is not None
        self.world = World.from_strings(facts or [], scene_kinds(scene), self.canon)
        self.containers = {c["name"]: c for c in scene.get("containers", [])}
        self.supporters = {s["name"]: s for s in scene.get("supporters", [])}
        self.rooms = list(scene.get("rooms", []))

    def canon(self, name: str | None) -> str:
        if name is None:
            return ""
        return self.names.get(str(name).lower(), str(name))

    def location(self) -> str | None:
        """The player's room (``at(P, room)``)."""
        return self.world.player or None

    def inventory(self) -> list[str]:
        return self.world.inventory()

    def is_container(self, name: str) -> bool:
        return name in self.containers or name in self.world.container_state

    def is_open(self, c: str) -> bool:
        return self.world.container_state.get(c) == "open"

    def is_closed(self, c: str) -> bool:
        return self.world.container_state.get(c) in ("closed", "locked")

    def is_locked(self, c: str) -> bool:
        return self.world.container_state.get(c) == "locked"

    def key_for(self, c: str) -> str | None:
        for k, cc in self.world.key_opens.items():
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
        w = self.world.where(entity)
        if w is not None:
            return w
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
        """The room an entity is in (through its holders); the player's room when carried."""
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
        return location_sentence(entity, w, None if w[0] == "at" else self.room_of(w[1]))

    def exits(self, room: str) -> dict[str, str]:
        """``{direction: neighbour}`` from the scene's connections (or the facts)."""
        out: dict[str, str] = {}
        for a, d, b in self.scene.get("connections", []):
            a, b, d = self.canon(a), self.canon(b), str(d).lower()
            if a == room:
                out[d] = b
            if b == room and d in OPPOSITE:
                out.setdefault(OPPOSITE[d], a)
        for d, nb in self.world.exits.get(room, {}).items():
            out.setdefault(d, nb)
        return out

    def route(self, start: str, goal: str) -> list[tuple[str, str]]:
        """Shortest list of ``(direction, room)`` hops from ``start`` to ``goal``."""
        return room_route(start, goal, self.exits)


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
    _, kind, target = parse_preference(pref)
    return preference_text(kind, target)


def broken_in_room(pref: Mapping[str, Any], world: SceneView, room: str, opened: set[str],
                   unlocked: set[str]) -> list[str]:
    """Containers of ``room`` that break a preference now (the env's kinds).

    ``close_containers``: a container opened in this episode is open; ``keep_closed``: the
    target is open; ``lock_after_use``: the target was unlocked and is not locked again.
    """
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


def _proc(text: str) -> str:
    return format_feedback_line("procedural", text)


def _gen(text: str) -> str:
    return format_feedback_line("general", text)


def _locked_line(container: str, key: str | None) -> str:
    return _proc(f"{container} is locked: unlock it with {key} first." if key else f"{container} is locked.")


class SimulatedUser:
    """A user who knows the game and comments on each step with typed feedback lines.

    Args:
        user_cfg: the ``user`` config group (``feedback_prob``, ``noise``).
        scene_spec: the scene's entry of ``scenes.json``.
        quest_row: the quest's manifest row, or a mapping with its ``quest_id``,
            ``objective``, ``expert_plan`` and ``preferences`` (missing keys are None).
        seed: seed of this user's random draws (one user per episode).
    """

    def __init__(self, user_cfg: UserConfig, scene_spec: Mapping[str, Any], quest_row: Mapping[str, Any], seed: int):
        self.feedback_prob = user_cfg.feedback_prob
        self.noise = user_cfg.noise
        self.spatial = SpatialFeedback(user_cfg.spatial)
        for key, value in (("user.feedback_prob", self.feedback_prob), ("user.noise", self.noise)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{key}={value!r}: expected a probability in [0, 1]")
        self.scene = dict(scene_spec)
        self.quest = {k: quest_row.get(k) for k in ("quest_id", "objective", "expert_plan", "preferences")}
        self.rng = np.random.default_rng(seed)
        wanted = self.quest.get("preferences")
        prefs = list(self.scene.get("preferences", []))
        self.preferences = prefs if wanted is None else [p for p in prefs if p.get("id") in set(wanted)]
        plan = self.quest.get("expert_plan")
        self._plan_len: int | None = len(plan) if plan is not None else None
        self._world = SceneView(None, self.scene)
        self._stall = 0
        self._warned_rooms: set[tuple[str, str]] = set()
        self._opened: set[str] = set()  # containers opened during the episode (all start closed)
        self._hinted: dict[str, int] = {}  # stall hint line -> step it was last given
        self._unlocked: set[str] = set()

    # -- helpers ------------------------------------------------------------------------

    def _needed(self, plan: list[str], world: SceneView) -> tuple[str | None, str | None]:
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

    def _stall_hint(self, world: SceneView, plan: list[str]) -> list[str]:
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

    def _spatial_hint(self, world: SceneView, entity: str | None) -> list[str]:
        """Where ``entity`` is and the way to its room, as ``user.spatial`` allows: ``full``
        both, ``room`` the way only, ``none`` nothing."""
        if not entity or self.spatial == SpatialFeedback.none:
            return []
        lines = []
        desc = world.describe(entity) if self.spatial == SpatialFeedback.full else None
        if desc:
            lines.append(format_feedback_line("spatial", desc))
        here, there = world.location(), world.room_of(entity)
        if here and there and here != there:
            hops = world.route(here, there)
            if hops:
                d, nxt = hops[0]
                lines.append(format_feedback_line("spatial", route_sentence(here, d, nxt, there)))
        return lines

    # -- an action the game refused ------------------------------------------------------

    def _diagnose_invalid(self, action: Mapping[str, Any], world: SceneView, here: str | None) -> list[str]:
        """Lines for an action the game refused: a broken precondition if one is found."""
        verb = str(action.get("action") or "").lower()
        target = world.canon(action.get("target"))
        recep = world.canon(action.get("receptacle"))
        key = world.canon(action.get("key"))
        held = set(world.inventory())

        def away(entity: str) -> list[str]:
            room = world.room_of(entity)
            if room and here and room != here:
                return self._spatial_hint(world, entity)
            return []

        found: list[str] | None = None
        if verb == "pick_up" and target:
            found = self._invalid_pick_up(world, target, held, away)
        elif verb in ("open", "close") and target:
            found = self._invalid_open_close(world, verb, target, held, away)
        elif verb in ("unlock", "lock") and target:
            found = self._invalid_lock(world, verb, target, key, held, away)
        elif verb in ("put", "drop") and target:
            found = self._invalid_put(world, target, recep, held, away)
        elif verb == "go_to" and here:
            exits = world.exits(here)
            if exits:
                found = [format_feedback_line("spatial", exits_sentence(here, sorted(exits.items())))]
        elif verb == "examine" and target:
            found = away(target) or None
        if found is not None:
            return found
        shown = info_command(action)
        return [_gen(f"'{shown}' is not possible here; choose one of the admissible actions.")]

    def _invalid_pick_up(self, world: SceneView, target: str, held: set[str], away) -> list[str]:
        if target in held:
            return [_gen(f"You already hold {target}.")]
        w = world.where(target)
        if w and w[0] == "in" and world.is_container(w[1]) and world.is_closed(w[1]):
            out = [_proc(f"Open {w[1]} before taking things from it.")]
            if world.is_locked(w[1]):
                out.append(_locked_line(w[1], world.key_for(w[1])))
            return out + away(target)
        return away(target) or [_gen(f"You cannot pick up {target} here.")]

    def _invalid_open_close(self, world: SceneView, verb: str, target: str, held: set[str], away) -> list[str]:
        if verb == "close":
            if world.is_closed(target):
                return [_gen(f"{target} is already closed.")]
            return away(target) or [_gen(f"{target} cannot be closed.")]
        if world.is_locked(target):
            k = world.key_for(target)
            out = [_locked_line(target, k)]
            if k and k not in held:
                out += self._spatial_hint(world, k)
            return out
        if world.is_open(target):
            return [_gen(f"{target} is already open.")]
        return away(target) or [_gen(f"{target} cannot be opened.")]

    def _invalid_lock(self, world: SceneView, verb: str, target: str, key: str, held: set[str], away) -> list[str]:
        k = world.key_for(target)
        if verb == "unlock" and world.has_facts and not world.is_locked(target) and world.is_container(target):
            return [_gen(f"{target} is not locked.")]
        if key and k and key != k:
            return [_proc(f"{target} opens with {k}, not {key}.")]
        if k and k not in held:
            return [_proc(f"Take {k} before you {verb} {target}.")] + self._spatial_hint(world, k)
        if verb == "lock" and world.is_open(target):
            return [_proc(f"Close {target} before locking it.")]
        return away(target) or [_gen(f"You cannot {verb} {target} now.")]

    def _invalid_put(self, world: SceneView, target: str, recep: str, held: set[str], away) -> list[str] | None:
        """Lines for put / drop; None when nothing specific applies (dropping a held thing)."""
        if target not in held:
            dest = f" in {recep}" if recep else ""
            return [_proc(f"Pick up {target} before putting it{dest}.")] + away(target)
        if recep and world.is_container(recep) and world.is_closed(recep):
            out = [_proc(f"Open {recep} before putting things in it.")]
            if world.is_locked(recep):
                out.append(_locked_line(recep, world.key_for(recep)))
            return out
        if recep:
            return away(recep) or [_gen(f"You cannot put {target} there.")]
        return None

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
            return format_feedback_line("spatial", location_sentence(obj, (prep, holder), room))
        return format_feedback_line("general", UNHELPFUL[int(self.rng.integers(len(UNHELPFUL)))])

    # -- one step ------------------------------------------------------------------------

    def _track_containers(self, before: SceneView, world: SceneView) -> None:
        """Remember the containers opened / unlocked during the episode."""
        for c, spec in world.containers.items():
            if world.is_open(c):
                self._opened.add(c)
            was_locked = before.is_locked(c) if before.has_facts else bool(spec.get("locked"))
            if world.has_facts and was_locked and not world.is_locked(c):
                self._unlocked.add(c)

    def _valid_step_lines(self, action: Mapping[str, Any], world: SceneView, info: Mapping[str, Any],
                          here_before: str | None, here_now: str | None) -> list[str]:
        """Preferences broken by leaving a room (e.g. a container left open there); a repeat."""
        lines = []
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
            lines.append(format_feedback_line("general", f"You repeated '{shown}' without effect; try something new."))
        return lines

    def _add_stall_hints(self, lines: list[str], step_id: int, world: SceneView, plan: list[str]) -> None:
        """Append the stall hints not already said, nor said within the last three steps."""
        for line in self._stall_hint(world, plan):
            # A hint repeated within a few steps is noise to a person: say it once.
            if line not in lines and step_id - self._hinted.get(line, -99) > 3:
                self._hinted[line] = step_id
                lines.append(line)

    def _speak(self, lines: list[str], status: str) -> StepFeedback:
        """One draw decides whether the user speaks; then one noise draw per line (:func:`speak`)."""
        return speak(self.rng, self.feedback_prob, self.noise, lines, status, self._noise_line)

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
        world = SceneView(info.get("facts"), self.scene) if info.get("facts") is not None else before
        self._track_containers(before, world)
        here_before = obs.get("agent_location") or before.location()
        here_now = world.location() or here_before
        status = step_status(info, self._plan_len)
        plan = list(info.get("expert_plan") or [])
        valid = bool(info.get("valid", True))
        if valid:
            lines = self._valid_step_lines(action, world, info, here_before, here_now)
        else:
            lines = self._diagnose_invalid(action, world, here_before)
        self._stall = 0 if status == "Success" else self._stall + 1
        grew = self._plan_len is not None and info.get("expert_plan") is not None and len(plan) > self._plan_len
        if valid and not info.get("won") and (grew or self._stall in (2, 5, 8, 12, 16, 20)):
            self._add_stall_hints(lines, step_id, world, plan)
        if info.get("expert_plan") is not None and info.get("solvable") is not False:
            self._plan_len = len(plan)
        self._world = world
        return self._speak(lines, status)

    def end_feedback(self, final: Mapping[str, Any] | Iterable[str] | None) -> tuple[bool, list[str]]:
        """Judge the scene preferences on the final state.

        Args:
            final: the last ``info`` dict (the env's per-preference verdict
                ``preferences`` and ``preferences_ok`` win; else its ``facts`` are checked
                with :func:`pipeline.envs.household.world.check_preferences`) or the final facts as strings.

        Returns:
            ``(preferences_ok, lines)``: one ``user_preference`` line per broken preference.
        """
        info = final if isinstance(final, Mapping) else {"facts": list(final) if final is not None else None}
        held = info.get("preferences")
        if held is None:  # no per-preference verdict from the env: check the facts here
            facts = info.get("facts")
            if facts is None:
                return bool(info.get("preferences_ok", True)), []
            plain = [plain_fact(f) for f in facts]
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
