"""The demonstrator of the default policy: an expert that knows only what it was told or saw.

TextWorld's walkthrough (and :func:`pipeline.envs.household.planner.shortest_plan`) is omniscient: it walks
straight to an object hidden in a closed cabinet of a room it has never entered. A model
imitating that learns nothing a prompt could change. This expert acts on *knowledge*:

- what the prompt tells it (:func:`read_knowledge`): the grounding text and the advisory
  block are scanned for statements the simulated user makes (``"Cup_3 is in Cabinet_2 in
  the Bathroom."``, ``"Key_2 is in the Bathroom."``) and for the scene's preference
  sentences (``"Lock Cabinet_2 again after you unlock it."``), the scene facts of memory
  advisories (``"Key_1 was in Drawer_0 in the Bedroom"``) and the commands of a verified
  plan (the positive control's advisories: ``"take Cup_3 from Cabinet_2"``); only
  statements that are true in this scene count (a placebo advisory about another house
  changes nothing);
- what it has seen during the episode (visible entities, opened containers).

When every entity the shortest plan needs is known, it follows that plan (planned with the
known preferences only); otherwise it searches: opens the unsearched containers of the
room, picks up keys once a locked container is in sight, unlocks what it can, then walks
to the nearest unvisited room. So a demonstration with grounding walks straight to the
goal and keeps the user's preferences, and one without explores and may break them,
which is what makes the trained model's behaviour depend on its memory::

    env = HouseholdEnv(game_file, ..., preferences=prefs)
    obs = env.reset()
    know = read_knowledge(grounding_text + block_text, env.world, prefs)
    expert = BeliefExpert(env, know)
    decision = expert.decide()            # Decision(command, mode, plan, find)
    reasoning, action, memory = expert.response(decision, obs)

:func:`expert_episode` plays one such episode (with optional random slips the expert
recovers from) and returns its turns in the agent's answer format.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pipeline.agents.llm import render_response
from pipeline.envs.household.env import is_household_command
from pipeline.envs.household.games import CONTAINER_KINDS, OBJECT_KINDS, ROOM_NAMES, SUPPORTER_KINDS
from pipeline.envs.household.planner import breadth_first, shortest_plan
from pipeline.envs.household.text import preference_text, read_locations, things_in_commands
from pipeline.envs.household.world import INVENTORY, World, parse_fact, parse_preference
from pipeline.prompts.verified import read_verified_steps

# The positive control's advisories (C2_oracle, pipeline.memory.injection) say their steps
# "solve this exact task"; the commands they write name where the task's objects are.
VERIFIED_PLAN = "solve this exact task"
_ENTITY_TYPES = frozenset({"c", "s", "o", "k", "f"})  # containers, supporters, portable things
DIRECTIONS_CYCLE = ("north", "east", "south", "west")  # clockwise


@dataclass(frozen=True)
class Knowledge:
    """What a prompt tells about the scene (only true statements count).

    Attributes:
        located: entities whose room the text states correctly.
        preferences: the scene preferences (spec dicts) whose sentence the text contains.
    """

    located: frozenset[str] = frozenset()
    preferences: tuple = ()
    verified_plan: tuple[str, ...] = ()


def read_knowledge(text: str, world: World, preferences: Iterable[Mapping[str, Any]]) -> Knowledge:
    """The knowledge a text (grounding + advisory block) gives about ``world``.

    Args:
        text: everything the prompt tells beyond the observation.
        world: the scene's state at the start of the episode.
        preferences: the scene preferences (spec dicts with ``id``, ``kind``, ``target``).
    """
    located = set()
    for loc in read_locations(text):
        if world.room_of(loc.thing) != loc.room:
            continue  # false here (another scene's advisory, a noisy user): ignored
        if loc.holder is not None:
            _, holder = world.location.get(loc.thing, (None, None))
            if holder != loc.holder:
                continue
            located.add(loc.holder)
        located.add(loc.thing)
    verified: tuple[str, ...] = ()
    if VERIFIED_PLAN in (text or ""):  # a verified plan names where its objects are
        located.update(name for name in things_in_commands(text) if world.room_of(name) is not None)
        plan = read_verified_steps(text)
        # True here only if every name it uses is one of this house's (another task's plan is not)
        if plan and all(world.kinds.get(tok) is not None or tok in DIRECTIONS_CYCLE
                        for cmd in plan for tok in cmd.split()[1:] if tok not in ("from", "into", "on", "with")):
            verified = tuple(plan)
    prefs = []
    for p in preferences:
        _, kind, target = parse_preference(p)
        if preference_text(kind, target) in (text or ""):
            prefs.append(dict(p))
    return Knowledge(frozenset(located), tuple(prefs), verified)


@dataclass
class Decision:
    """One expert choice: the TextWorld ``command``, ``mode`` (plan | search), the plan
    left after it (plan mode) and the goal entities still to find (search mode)."""

    command: str
    mode: str
    plan: list[str] = field(default_factory=list)
    find: list[str] = field(default_factory=list)


def _goal_entities(goal: Sequence[str]) -> list[str]:
    out = []
    for g in goal:
        pred, args = parse_fact(g)
        for a in args:
            if a not in ("P", INVENTORY) and a not in out and pred in ("in", "on", "at", "open", "closed", "locked"):
                out.append(a)
    return out


class BeliefExpert:
    """The knowledge-limited expert of one episode (see the module docstring).

    Args:
        env: the episode's :class:`pipeline.envs.household.env.HouseholdEnv`, already reset.
        knowledge: what the prompt told (:func:`read_knowledge`).
        explore_cap: search steps after which the expert follows the full plan anyway
            (a demonstration never wanders until the step cap).
    """

    def __init__(self, env: Any, knowledge: Knowledge, *, explore_cap: int = 12):
        self.env = env
        self.knowledge = knowledge
        self.explore_cap = int(explore_cap)
        self.seen: set[str] = set()
        self.visited: list[str] = []
        self.searched: list[str] = []  # containers whose contents the expert has seen
        self.search_steps = 0
        # A verified plan the prompt states is followed step by step, as written, until a
        # step is not possible or something else was done (then the expert plans itself).
        self.verified = list(knowledge.verified_plan)
        self.verified_done = 0
        self.off_verified = not self.verified
        self.observe()

    def did(self, command: str | None) -> None:
        """Record the command just played (keeps the place in a verified plan)."""
        if self.off_verified:
            return
        if self.verified_done < len(self.verified) and command == self.verified[self.verified_done]:
            self.verified_done += 1
        else:
            self.off_verified = True

    # -- belief ----------------------------------------------------------------------

    def observe(self) -> None:
        """Update what has been seen from the env's current state (call after every step)."""
        w = self.env.world
        self.seen.update(w.visible_entities())
        self.seen.update(w.inventory())
        if w.player and w.player not in self.visited:
            self.visited.append(w.player)
        for c, room in sorted(w.container_room.items()):
            if room == w.player and w.container_state.get(c) == "open" and c not in self.searched:
                self.searched.append(c)

    def known(self, entity: str) -> bool:
        return entity in self.seen or entity in self.knowledge.located

    def notes(self) -> str:
        """The ``notes`` memory field: rooms visited and containers searched so far."""
        text = "visited: " + ", ".join(self.visited)
        if self.searched:
            text += "; searched: " + ", ".join(self.searched)
        return text

    # -- decisions ---------------------------------------------------------------------

    def plan(self) -> list[str]:
        """Shortest plan from the true state, keeping the preferences the expert knows."""
        env = self.env
        plan = shortest_plan(env.world, env.goal, list(self.knowledge.preferences), opened=env.opened,
                             unlocked=env.unlocked)
        if plan is None:
            plan = env.expert_plan()
        return list(plan or [])

    def needed(self, plan: Sequence[str]) -> list[str]:
        """Entities (not rooms) the plan's commands name, in order of first use."""
        kinds = self.env.world.kinds
        out: list[str] = []
        for cmd in plan:
            for tok in cmd.split()[1:]:
                if kinds.get(tok) in _ENTITY_TYPES and tok not in out:
                    out.append(tok)
        return out

    def decide(self) -> Decision:
        """The next command: the plan when everything it needs is known, else a search step."""
        if not self.off_verified and self.verified_done < len(self.verified) \
                and self.verified[self.verified_done] in self.env.admissible:
            k = self.verified_done
            return Decision(self.verified[k], "plan", self.verified[k + 1:], [])
        plan = self.plan()
        if not plan:
            return Decision("look", "plan", [], [])
        unknown = [e for e in self.needed(plan) if not self.known(e)]
        if unknown and self.search_steps < self.explore_cap:
            cmd = self.search_step()
            if cmd is not None:
                self.search_steps += 1
                goal_unknown = [e for e in _goal_entities(self.env.goal) if not self.known(e)]
                return Decision(cmd, "search", [], goal_unknown or unknown[:1])
        return Decision(plan[0], "plan", plan[1:], [])

    def search_step(self) -> str | None:
        """One exploration command (admissible), or None when there is nothing left to try."""
        env, w = self.env, self.env.world
        adm = set(env.admissible)
        here = w.player
        held = set(w.inventory())
        containers = sorted(c for c, r in w.container_room.items() if r == here)
        for c in containers:
            if c in self.searched:
                continue
            state = w.container_state.get(c)
            if state == "closed" and f"open {c}" in adm:
                return f"open {c}"
            if state == "locked":
                for k in sorted(k for k, opens in w.key_opens.items() if opens == c and k in held):
                    if f"unlock {c} with {k}" in adm:
                        return f"unlock {c} with {k}"
        locked_unsearched = [c for c in self.seen if w.container_state.get(c) == "locked" and c not in self.searched]
        if locked_unsearched:
            for cmd in sorted(adm):
                parts = cmd.split()
                if parts[0] == "take" and w.kinds.get(parts[1]) == "k" and parts[1] not in held:
                    return cmd
        step = self._toward_unexplored(held)
        if step is not None and f"go {step}" in adm:
            return f"go {step}"
        return None

    def _toward_unexplored(self, held: set[str]) -> str | None:
        """First direction toward the nearest room worth visiting (unvisited, or holding a
        locked unsearched container whose key is now held), over the known map.

        The search is the planner's (:func:`pipeline.envs.household.planner.breadth_first`),
        limited to what the expert knows: only visited rooms' exits are expanded, in
        N/S/E/W order.
        """
        w = self.env.world

        def worth(room: str) -> bool:
            if room not in self.visited:
                return True
            for c, r in w.container_room.items():
                if r == room and c not in self.searched and w.container_state.get(c) == "locked" \
                        and any(w.key_opens.get(k) == c for k in held):
                    return True
            return False

        def exits(room: str) -> list[tuple[str, str]]:
            return list(w.room_exits(room).items())

        # The exits of an unvisited room are not known yet.
        path = breadth_first(w.player, exits, worth, expand=lambda room: room in self.visited)
        return path[0] if path else None

    # -- answer format -----------------------------------------------------------------

    def response(self, decision: Decision, obs: Mapping[str, Any]) -> tuple[str, dict, dict]:
        """``(reasoning, action, memory)`` of a decision, in the agent's answer format.

        The reasoning line names the command (copied from the valid commands); the
        memory keeps the ``plan`` left (or what is still to find) and ``notes`` on rooms
        visited and containers searched. It has no ``previous_action``: that repeated the
        reasoning line's command, and the small model confused the two copies (greedy
        JSON validity 0.82-0.99 with it, 0.95-1.0 without, in our trials).
        """
        action = command_action(decision.command, obs)
        if decision.mode == "search":
            reasoning = f"Find {decision.find[0]}: {decision.command}." if decision.find else \
                f"Search: {decision.command}."
            plan = "; ".join(f"find {e}" for e in decision.find)
        else:
            reasoning = f"Plan: {decision.command}."
            plan = "; ".join(decision.plan)
        memory = {"plan": plan, "notes": self.notes()}
        return reasoning, action, memory


def command_action(command: str, obs: Mapping[str, Any]) -> dict:
    """The action dict of an admissible TextWorld command, as the expert writes it.

    ``go <direction>`` keeps the direction as its target (``{"action": "go_to", "target":
    "south"}``, which the agent and the env accept): the word is in the command, whereas
    the room it leads to must be looked up in the description.
    """
    parts = command.split()
    if len(parts) == 2 and parts[0] == "go" and command in (obs.get("admissible_commands") or []):
        return {"action": "go_to", "target": parts[1]}
    for a in obs.get("admissible_actions") or []:
        if a.get("command") == command:
            return {k: v for k, v in a.items() if k != "command" and (v is not None or k == "target")}
    raise ValueError(f"command {command!r} is not admissible here (admissible: {obs.get('admissible_commands')})")


@dataclass
class DemoTurn:
    """One turn of a demonstration: the observation the agent saw and its answer.

    ``train`` is False for a slip (a random action the expert then recovers from): its
    answer is replayed into the memory dict but never learned.
    """

    obs: dict
    response: str
    train: bool = True


@dataclass
class DemoEpisode:
    """A played demonstration: its turns and how it ended."""

    turns: list[DemoTurn]
    won: bool
    preferences_ok: bool
    searched_steps: int


def expert_episode(env: Any, knowledge: Knowledge, *, slip_prob: float = 0.0, rng: np.random.Generator | None = None,
                   explore_cap: int = 12) -> DemoEpisode:
    """Play one episode with :class:`BeliefExpert`; ``env`` must be freshly reset
    (:func:`pipeline.policy.teacher.teacher_episode` with the expert as the teacher).

    Args:
        env: a reset :class:`pipeline.envs.household.env.HouseholdEnv`.
        knowledge: what the demonstration's prompt tells.
        slip_prob: probability that a turn is a wrong one instead (:func:`slip`),
            recorded with ``train=False`` and its memory keeping the stale plan, so that
            the learned policy sees how to recover from its own mistakes.
        rng: source of the slips.
        explore_cap: see :class:`BeliefExpert`.
    """
    from pipeline.policy.teacher import ExpertTeacher, teacher_episode  # deferred: teacher.py imports this module

    return teacher_episode(env, ExpertTeacher(env, knowledge, explore_cap=explore_cap), slip_prob=slip_prob, rng=rng)


def slip(env: Any, obs: Mapping[str, Any], others: Sequence[str], rng: np.random.Generator,
          last: tuple[str, dict] | None = None) -> tuple[str, dict]:
    """A wrong turn: another admissible command, a move through a wall, an action on
    something that is not here, or the last action again (the env refuses the last three
    when they no longer apply, as it refuses a model's hallucinated or looping action)."""
    w = env.world
    blocked = [d for d in DIRECTIONS_CYCLE if f"go {d}" not in env.admissible]
    here = set(w.visible_entities()) | set(w.inventory())
    away = sorted(c for c in w.container_state if c not in here)
    kind = int(rng.integers(4))
    if kind == 3 and last is not None:
        return last
    if kind == 1 and blocked:
        d = blocked[int(rng.integers(len(blocked)))]
        return f"go {d}", {"action": "go_to", "target": d}
    if kind == 2 and away:
        c = away[int(rng.integers(len(away)))]
        return f"open {c}", {"action": "open", "target": c}
    cmd = others[int(rng.integers(len(others)))]
    return cmd, command_action(cmd, obs)




# --------------------------------------------------------------------------- renaming


def rename_pattern(mapping: Mapping[str, str]) -> re.Pattern | None:
    if not mapping:
        return None
    names = sorted(mapping, key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")


def rename_text(text: str, mapping: Mapping[str, str], pattern: re.Pattern | None = None) -> str:
    """Replace whole entity / room names in ``text`` (all at once, so swaps are safe)."""
    pattern = pattern or rename_pattern(mapping)
    if pattern is None or not text:
        return text
    return pattern.sub(lambda m: mapping[m.group(0)], text)


def rename_obj(obj: Any, mapping: Mapping[str, str], pattern: re.Pattern | None = None) -> Any:
    """``rename_text`` over every string of a JSON-able object."""
    if not mapping:
        return obj
    pattern = pattern or rename_pattern(mapping)
    return json.loads(rename_text(json.dumps(obj, ensure_ascii=False), mapping, pattern))


def draw_renaming(spec: Mapping[str, Any], rng: np.random.Generator) -> dict[str, str]:
    """A consistent renaming of a scene: kinds, indices, rooms and compass.

    Object, container and supporter kinds are permuted within their pools
    (:data:`pipeline.envs.household.games.OBJECT_KINDS`, ...), the indices of each category are permuted
    too (a key follows the container it opens: ``Key_<i>`` opens ``<Kind>_<i>``), rooms are
    permuted among :data:`pipeline.envs.household.games.ROOM_NAMES` and the compass is turned or
    mirrored. The renamed demonstration is an isomorphic house in which other names sit
    in other places and the exits point other ways, which teaches the model to read
    names and exits from its prompt instead of memorising the train scenes.
    """
    def perm(pool: Sequence[str]) -> dict[str, str]:
        pool = sorted(set(pool))
        shuffled = [pool[i] for i in rng.permutation(len(pool))]
        return dict(zip(pool, shuffled))

    def split(name: str) -> tuple[str, str]:
        kind, _, idx = name.rpartition("_")
        return kind, idx

    mapping: dict[str, str] = {}
    containers = {c["name"] for c in spec.get("containers", [])}
    for names, pool in (([o["name"] for o in spec.get("objects", [])], OBJECT_KINDS),
                        (sorted(containers), [k for ks in CONTAINER_KINDS.values() for k in ks]),
                        ([s["name"] for s in spec.get("supporters", [])],
                         [k for ks in SUPPORTER_KINDS.values() for k in ks])):
        names = [n for n in names if split(n)[1].isdigit()]
        kinds = perm(pool)
        idx = sorted({split(n)[1] for n in names}, key=int)
        new_idx = dict(zip(idx, [idx[i] for i in rng.permutation(len(idx))]))
        for n in names:
            kind, i = split(n)
            mapping[n] = f"{kinds.get(kind, kind)}_{new_idx[i]}"
            if n in containers:  # the key of container <i> is Key_<i>
                for k in spec.get("keys", []):
                    if k.get("opens") == n and split(k["name"])[1] == i:
                        mapping[k["name"]] = f"{split(k['name'])[0]}_{new_idx[i]}"
    rooms = perm(ROOM_NAMES)
    for room in spec.get("rooms", []):
        if room in rooms:
            mapping[room] = rooms[room]
    # A symmetry of the compass (rotation or reflection: opposite directions stay
    # opposite), so the same house is walked with other words.
    turn = int(rng.integers(4))
    order = list(DIRECTIONS_CYCLE[turn:] + DIRECTIONS_CYCLE[:turn])
    if rng.random() < 0.5:
        order = order[::-1]
    mapping.update(zip(DIRECTIONS_CYCLE, order))
    return {k: v for k, v in mapping.items() if k != v}
