"""What an agent returns, and the goal-directed core shared by the rule agents (seed 004).

Seed 004's rule agents looked at an observation, saw entities, and examined the first one
forever: they had no goal, no admissible actions and no memory of what they had done.
The rule agents here keep the seed's shape (ReAct: thought, then action; RAG: entities,
retrieval, then action) but pursue the objective with simple heuristics over the
observation's ``admissible_actions``:

1. parse the objective (``"Put Apple_2 in Fridge_0 and close it."``) into a :class:`Goal`;
2. if the object is carried, go to the destination, unlock / open it, put it, close it;
3. otherwise take it if it is reachable, else search: examine (seed behaviour) and open
   the containers of the room, take keys, unlock what they open, then explore rooms.

What the agent has examined, opened and visited is remembered (seed 004's fix for "no
state memory") unless ``agent.remember_examined=false``: then every step starts from a
blank memory and the agent re-examines the same container forever, reproducing the
examine loop. ``agent.epsilon`` replaces the chosen action by a random admissible one.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pipeline.core.conf_schema import AgentConfig
from pipeline.core.facts import SEED_ENTITY_NAME
from pipeline.core.schemas import clean_action  # noqa: F401 - the agents' name for it
from pipeline.core.seeding import crc_rng
from pipeline.llm.backends.base import Generation

ROOM_WORDS = ("kitchen", "bedroom", "bathroom", "living", "dining", "office", "hallway", "pantry", "garage",
              "study", "cellar", "attic", "laundry")
# An entity of an objective: a seed-004 name (Apple_2, the memory signature's pattern) or a room (Bedroom).
ENTITY_RE = rf"({SEED_ENTITY_NAME}|[A-Z][A-Za-z]*)"


@dataclass
class ModelTurn:
    """What a model-backed agent's step adds: the backend's generation and what the agent made of it.

    Attributes:
        generation: the backend's typed turn (prompt, token ids, tracked action, stop
            reason, decoding, ...): :class:`pipeline.llm.backends.Generation`.
        seed: the turn's sampling seed.
        action_valid: the output gave an admissible action (otherwise the agent's
            fallback action was sent).
        parse_error: why it did not (None when it did).
        memory: the agent's memory dict after this turn (seed 002), None if it keeps none.
        action_scores: ``choice`` decoding: every admissible command's summed
            log-probability (None for ``-inf``); None under other decodings.
    """

    generation: Generation
    seed: int
    action_valid: bool
    parse_error: str | None = None
    memory: dict | None = None
    action_scores: dict[str, float | None] | None = None


@dataclass
class AgentStep:
    """One decision of an agent (the rollout turns it into a :class:`~pipeline.core.schemas.TurnRecord`).

    Attributes:
        action: the action dict sent to the env (``{"action", "target"}`` plus optional
            ``"receptacle"`` / ``"key"``).
        reasoning: the agent's thought or retrieval summary (stored in the turn row).
        generated_text: the raw text the agent produced (for the llm agent, the decoded
            output; for rule agents, a readable trace of the decision).
        model: the model turn behind the step (the llm agent); None for rule agents.
    """

    action: dict
    reasoning: str = ""
    generated_text: str = ""
    model: ModelTurn | None = None


@dataclass
class Goal:
    """A parsed objective: ``verb`` in put | bring | take | open | close | unlock | lock | go | explore."""

    verb: str
    obj: str | None = None
    dest: str | None = None
    prep: str = "in"
    close_after: bool = False
    lock_after: bool = False  # "... and lock it": read by the reader only (the rule agents of seed 004 never lock)


def etype(name: str | None) -> str:
    """Entity type from a seed 004 name: ``"Cabinet_0"`` -> ``"cabinet"``."""
    return str(name or "").split("_")[0].lower()


def parse_objective(objective: str | None) -> Goal:
    """Turn an objective sentence into a :class:`Goal` (``explore`` when unrecognised).

    >>> parse_objective("Put Apple_2 in Fridge_0 and close it.")
    Goal(verb='put', obj='Apple_2', dest='Fridge_0', prep='in', close_after=True, lock_after=False)
    >>> parse_objective("Bring Mug_0 to the Bedroom and drop it there.")
    Goal(verb='bring', obj='Mug_0', dest='Bedroom', prep='at', close_after=False, lock_after=False)
    >>> parse_objective("Put Towel_6 in Drawer_0 and lock it.").lock_after
    True
    """
    text = " ".join(str(objective or "").split())
    low = text.lower()
    close_after = bool(re.search(r"\b(and|then)\s+close\b", low))
    lock_after = bool(re.search(r"\b(and|then)\s+lock\b", low))
    m = re.search(rf"\b(?:put|place|insert|move|store|return)\s+(?:the\s+)?{ENTITY_RE}\s+"
                  rf"(in|into|inside|on|onto|on top of)\s+(?:the\s+)?{ENTITY_RE}", text, re.IGNORECASE)
    if m:
        prep = "on" if m.group(2).lower().startswith("on") else "in"
        return Goal("put", m.group(1), m.group(3), prep, close_after, lock_after)
    m = re.search(rf"\b(?:bring|carry|take|move)\s+(?:the\s+)?{ENTITY_RE}\s+to\s+(?:the\s+)?{ENTITY_RE}",
                  text, re.IGNORECASE)
    if m:
        return Goal("bring", m.group(1), m.group(2), "at", False)
    m = re.search(rf"\b(open|close|unlock|lock)\s+(?:the\s+)?{ENTITY_RE}", text, re.IGNORECASE)
    if m:
        return Goal(m.group(1).lower(), m.group(2), None, "in", close_after)
    m = re.search(rf"\b(?:take|pick up|get|fetch|find|grab|hold|carry)\s+(?:the\s+)?{ENTITY_RE}", text, re.IGNORECASE)
    if m:
        return Goal("take", m.group(1))
    m = re.search(rf"\b(?:go to|enter|reach|visit)\s+(?:the\s+)?{ENTITY_RE}", text, re.IGNORECASE)
    if m:
        return Goal("go", m.group(1))
    return Goal("explore")


def _same(a: Any, b: Any) -> bool:
    return a is not None and b is not None and str(a).lower() == str(b).lower()


def candidate_actions(obs: Mapping[str, Any]) -> list[dict]:
    """The observation's admissible action dicts; without them, seed 004's verb x entity grid."""
    adm = obs.get("admissible_actions")
    if adm:
        return [dict(a) for a in adm if isinstance(a, Mapping) and a.get("action")]
    verbs = list(obs.get("available_actions") or [])
    ents = list(obs.get("visible_entities") or [])
    cands = [{"action": v, "target": e} for v in verbs for e in ents if v not in ("look", "inventory", "wait")]
    cands += [{"action": v, "target": None} for v in verbs if v in ("look", "inventory", "wait")]
    return cands


class Memory:
    """What the agent knows about this episode beyond the current observation."""

    def __init__(self) -> None:
        self.examined: set[str] = set()
        self.opened: set[str] = set()  # containers this agent opened
        self.closed_again: set[str] = set()
        self.searched: set[str] = set()  # containers opened and looked into
        self.visited: list[str] = []
        self.last_visit: dict[str, int] = {}  # room -> step it was last seen
        self.exits_seen: dict[str, set[str]] = {}  # room -> go targets seen there
        self.room_map: dict[tuple[str, str], str] = {}  # (room, go target) -> room reached
        self.seen_in: dict[str, str] = {}  # entity -> room it was last seen in
        self.locked_seen: set[str] = set()
        self.placed = False


@dataclass
class _View:
    """What one observation shows, as :meth:`RuleAgent.decide` uses it."""

    inv: list[str]  # carried entities
    visible: list[str]  # entities in sight
    here: Any  # the room
    openable: list[str]  # containers an `open` action exists for
    closable: list[str]  # containers a `close` action exists for
    unlockable: list[dict]  # the `unlock` actions (a matching key is held)

    def holding(self, e: Any) -> bool:
        return any(_same(e, x) for x in self.inv)

    def seen(self, e: Any) -> bool:
        return any(_same(e, x) for x in self.visible)


class RuleAgent:
    """Shared core of the rule agents: goal parsing, memory, heuristics, epsilon.

    Subclasses implement :meth:`act` around :meth:`decide`, and may override the hooks
    :meth:`examine_first`, :meth:`rank_containers` and :meth:`close_after_use`.

    Args:
        agent_cfg: the ``agent`` config group (``remember_examined``, ``epsilon``,
            ``fallback_action``).
        seed: base seed; each episode's random stream is derived from it and the episode id.
    """

    name = "rule"

    def __init__(self, agent_cfg: AgentConfig, seed: int = 0):
        self.remember = agent_cfg.remember_examined
        self.epsilon = agent_cfg.epsilon
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"agent.epsilon={self.epsilon!r}: expected a probability in [0, 1]")
        fb = agent_cfg.fallback_action
        self.fallback = {"action": fb.action, "target": fb.target}
        self.seed = int(seed)
        self.reset({})

    # -- episode -----------------------------------------------------------------------

    def reset(self, episode_meta: Mapping[str, Any] | None = None) -> None:
        """Start an episode: fresh memory, goal from ``objective``, per-episode random stream.

        Args:
            episode_meta: ``episode_id``, ``objective``, ``seed`` (all optional). The random
                stream depends on (agent seed, episode seed, episode id), never on the
                order episodes are played in.
        """
        meta = dict(episode_meta or {})
        self.episode_meta = meta
        self.view: _View | None = None  # what the current turn's observation shows (set by decide)
        eid = str(meta.get("episode_id", ""))
        ep_seed = int(meta.get("seed", 0) or 0)
        self.rng = crc_rng(self.seed, eid, ints=(ep_seed,))
        self.objective = meta.get("objective")
        self.goal = parse_objective(self.objective) if self.objective else None
        self.mem = Memory()
        self.last_action: dict | None = None
        self.last_location: str | None = None
        self.steps = 0

    # -- helpers -----------------------------------------------------------------------

    @staticmethod
    def find(cands: list[dict], verb: str, target: Any = None, receptacle: Any = None, key: Any = None) -> dict | None:
        for a in cands:
            if a.get("action") != verb:
                continue
            if target is not None and not _same(a.get("target"), target):
                continue
            if receptacle is not None and not _same(a.get("receptacle"), receptacle):
                continue
            if key is not None and not _same(a.get("key"), key):
                continue
            return a
        return None

    def observe(self, obs: Mapping[str, Any]) -> None:
        """Update memory from the new observation (before deciding)."""
        if not self.remember:
            # Seed 004's agents: nothing survives from one step to the next.
            self.mem = Memory()
            self.last_action = None
        if self.goal is None:
            self.objective = obs.get("objective") or self.objective
            self.goal = parse_objective(self.objective)
        room = obs.get("agent_location")
        m = self.mem
        if room:
            if self.last_action and self.last_action.get("action") == "go_to" and self.last_location:
                m.room_map[(self.last_location, str(self.last_action.get("target")))] = room
            if room not in m.visited:
                m.visited.append(room)
            m.last_visit[room] = self.steps
            m.exits_seen[room] = {str(a.get("target")) for a in candidate_actions(obs) if a.get("action") == "go_to"}
            for e in obs.get("visible_entities") or []:
                m.seen_in[e] = room
        self.last_location = room

    def room_path(self, start: str | None, goal_room: str | None) -> str | None:
        """The first go target on the known map from ``start`` to ``goal_room``."""
        if not start or not goal_room or start == goal_room:
            return None
        prev: dict[str, tuple[str, str] | None] = {start: None}
        todo = deque([start])
        while todo:
            r = todo.popleft()
            for (a, tgt), b in sorted(self.mem.room_map.items()):
                if a == r and b not in prev:
                    prev[b] = (r, tgt)
                    todo.append(b)
        if goal_room not in prev:
            return None
        cur = goal_room
        while prev[cur] is not None and prev[cur][0] != start:
            cur = prev[cur][0]
        return prev[cur][1] if prev[cur] else None

    def explore(self, obs: Mapping[str, Any], cands: list[dict]) -> tuple[dict | None, str]:
        """A go action: an untried exit here, else toward a room with one, else the
        neighbour visited least recently."""
        room = obs.get("agent_location") or ""
        goes = [a for a in cands if a.get("action") == "go_to"]
        if not goes:
            return None, "there is no exit to take"
        if not self.remember:  # no map in mind: any exit
            return goes[int(self.rng.integers(len(goes)))], "I will look in another room"
        m = self.mem

        def untried(r: str, tgt: str) -> bool:
            return (r, tgt) not in m.room_map and tgt not in m.visited

        for a in goes:
            if untried(room, str(a.get("target"))):
                return a, f"I have not been through '{a.get('target')}' from the {room} yet"
        for r in m.visited:
            if r != room and any(untried(r, t) for t in m.exits_seen.get(r, ())):
                step = self.room_path(room, r)
                a = self.find(goes, "go_to", step) if step else None
                if a:
                    return a, f"the {r} still has unexplored exits"
        best = min(goes, key=lambda a: m.last_visit.get(m.room_map.get((room, str(a.get("target"))), ""), -1))
        return best, "I will look in another room"

    # -- hooks -------------------------------------------------------------------------

    def examine_first(self, entity: str, ctx: dict) -> bool:
        """Examine ``entity`` before opening it? (seed behaviour; once with memory)."""
        return True

    def rank_containers(self, names: list[str], ctx: dict) -> list[str]:
        """Order in which to search the room's closed containers."""
        return names

    def close_after_use(self, entity: str, ctx: dict) -> bool:
        """Close a container after searching / taking from it?"""
        return False

    def want_keys(self, ctx: dict) -> bool:
        """Pick up keys seen lying around even before a locked container is met?"""
        return bool(self.mem.locked_seen) or (self.goal is not None and self.goal.verb in ("unlock", "lock"))

    def decision_parts(self) -> tuple[Callable[..., tuple[dict, str] | None], ...]:
        """The steps :meth:`decide` tries in order, each ``(goal, view, cands, ctx) -> (action,
        rationale) | None``; an agent reorders or adds to them."""
        return (self._finish_put, self._direct_progress, self._tidy_up, self._toward_goal, self._search)

    # -- decision ----------------------------------------------------------------------

    def decide(self, obs: Mapping[str, Any], cands: list[dict], ctx: dict) -> tuple[dict, str]:
        """Pick an action for the goal; returns ``(admissible action dict, rationale)``.

        The first of these that has something to do decides: finish a put, make direct
        progress, tidy up, move toward the goal, search; else explore.
        """
        g = self.goal or Goal("explore")
        view = self.view = self._view(obs, cands)  # this turn's, for the hooks (the reader's rank_containers)
        for part in self.decision_parts():
            found = part(g, view, cands, ctx)
            if found is not None:
                return found
        a, why = self.explore(obs, cands)
        if a is not None:
            return a, why
        return self.find(cands, "look") or self.fallback, "nothing left to try here"

    def _view(self, obs: Mapping[str, Any], cands: list[dict]) -> "_View":
        """What the observation shows; containers in sight that cannot be opened or closed
        are remembered as locked."""
        view = _View(
            inv=[str(x) for x in obs.get("agent_inventory") or []],
            visible=[str(x) for x in obs.get("visible_entities") or []],
            here=obs.get("agent_location"),
            # Containers of the room by what the admissible actions allow.
            openable=[a["target"] for a in cands if a.get("action") == "open" and a.get("target")],
            closable=[a["target"] for a in cands if a.get("action") == "close" and a.get("target")],
            unlockable=[a for a in cands if a.get("action") == "unlock"],
        )
        for e in view.visible:
            if etype(e) in ("cabinet", "drawer", "chest", "safe", "box", "wardrobe", "locker", "fridge", "closet") \
                    and e not in view.openable and e not in view.closable:
                self.mem.locked_seen.add(e)
        return view

    def _finish_put(self, g: Goal, view: "_View", cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """After the put, close the destination when asked (or by habit). The observation
        shows the object in place even when the agent forgot putting it."""
        m = self.mem
        if g.verb == "put" and g.obj and g.dest and self.find(cands, "pick_up", g.obj, g.dest):
            m.placed = True
        if g.verb == "put" and m.placed:
            if g.dest and (g.close_after or self.close_after_use(g.dest, ctx)):
                a = self.find(cands, "close", g.dest)
                if a:
                    return a, f"{g.obj} is {g.prep} {g.dest}; now I close {g.dest}"
            return self.find(cands, "look") or self.fallback, "the task should be done"
        return None

    def _direct_progress(self, g: Goal, view: "_View", cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """Take the object, put it where it belongs."""
        if g.verb in ("put", "take", "bring") and g.obj and not view.holding(g.obj):
            a = self.find(cands, "pick_up", g.obj)
            if a:
                return a, f"{g.obj} is within reach: take it"
        if g.verb == "put" and g.obj and view.holding(g.obj):
            a = self.find(cands, "put", g.obj, g.dest)
            if a:
                self.mem.placed = True
                return a, f"I hold {g.obj} and {g.dest} is here: put it {g.prep} {g.dest}"
        return None

    def _tidy_up(self, g: Goal, view: "_View", cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """Close a container searched (or emptied) when the habit says so."""
        m = self.mem
        for c in view.closable:
            if c in m.searched and c not in m.closed_again and not _same(c, g.dest) and self.close_after_use(c, ctx):
                m.closed_again.add(c)
                return self.find(cands, "close", c), f"I am done with {c}, so I close it again"  # type: ignore[return-value]
        return None

    def _toward_goal(self, g: Goal, view: "_View", cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """The goal verb's own step: reach, open or unlock the destination, carry, act."""
        m = self.mem
        here = view.here
        if g.verb == "put" and g.obj and view.holding(g.obj) and g.dest:
            if view.seen(g.dest):
                a = self.find(cands, "open", g.dest)
                if a:
                    m.opened.add(a["target"])
                    return a, f"{g.dest} is closed: open it before putting {g.obj} {g.prep} it"
                a = self.find(view.unlockable, "unlock", g.dest)
                if a:
                    return a, f"{g.dest} is locked and I have its key: unlock it"
            elif g.dest in m.seen_in:
                step = self.room_path(here, m.seen_in[g.dest])
                a = self.find(cands, "go_to", step) if step else None
                if a:
                    return a, f"I saw {g.dest} in the {m.seen_in[g.dest]}: go there"
            # Destination not found yet (or locked without a key): keep searching.
        elif g.verb == "bring" and g.obj and view.holding(g.obj) and g.dest:
            if _same(here, g.dest):
                a = self.find(cands, "drop", g.obj)
                if a:
                    return a, f"I am in the {g.dest} with {g.obj}: drop it here"
            step = self.room_path(here, g.dest)
            a = self.find(cands, "go_to", g.dest) or (self.find(cands, "go_to", step) if step else None)
            if a:
                return a, f"I carry {g.obj}; the way to the {g.dest} is through '{a.get('target')}'"
        elif g.verb == "take" and g.obj and view.holding(g.obj):
            return self.find(cands, "look") or self.fallback, f"I already hold {g.obj}"
        elif g.verb in ("open", "close", "lock", "unlock") and g.obj:
            a = self.find(cands, g.verb, g.obj)
            if a:
                return a, f"the task is to {g.verb} {g.obj}, and I can"
        elif g.verb == "go" and g.obj:
            if _same(here, g.obj):
                return self.find(cands, "look") or self.fallback, f"I am in the {g.obj}"
            a = self.find(cands, "go_to", g.obj)
            if a:
                return a, f"the {g.obj} is next door"
        return None

    def _search(self, g: Goal, view: "_View", cands: list[dict], ctx: dict) -> tuple[dict, str] | None:
        """Unlock, take keys, examine and open the room's containers.

        Carrying the object to a destination not in sight: search nothing more, explore
        (unless the destination is locked and no key is at hand yet).
        """
        m = self.mem
        carrying = g.verb in ("put", "bring") and bool(g.obj) and view.holding(g.obj)
        need_key = carrying and g.dest in m.locked_seen and not any(etype(x) == "key" for x in view.inv)
        if carrying and not need_key:
            return None
        # Locked containers: unlock with a key held, to search them (not one already searched
        # and locked again: a tidy agent would unlock and relock it for ever).
        for a in view.unlockable:
            if a.get("target") not in m.searched:
                return a, f"I hold {a.get('key') or 'a key'} and {a.get('target')} is locked: unlock it"

        # Keys lying around open locked containers later.
        if self.want_keys(ctx):
            for a in cands:
                key = a.get("target")
                if a.get("action") == "pick_up" and etype(key) == "key" and not view.holding(key):
                    return a, f"{key} may open a locked container: take it"

        # Search the room's closed containers, examining each first (seed 004 habit).
        for c in self.rank_containers([c for c in view.openable if c not in m.opened], ctx):
            if self.examine_first(c, ctx) and c not in m.examined:
                a = self.find(cands, "examine", c)
                if a:
                    m.examined.add(c)
                    return a, f"I see {c}; I should examine it to learn what it holds"
            a = self.find(cands, "open", c)
            if a:
                m.opened.add(c)
                m.searched.add(c)
                return a, f"{c} may hold what I need: open it"
        return None

    def choose(self, obs: Mapping[str, Any], ctx: dict) -> tuple[dict, str, bool]:
        """``(action, rationale, random)``: epsilon-random or :meth:`decide`."""
        cands = candidate_actions(obs)
        if not cands:
            return dict(self.fallback), "no admissible action: fallback", False
        if self.epsilon > 0 and self.rng.random() < self.epsilon:
            a = cands[int(self.rng.integers(len(cands)))]
            return clean_action(a), "random exploration (epsilon)", True
        a, why = self.decide(obs, cands, ctx)
        return clean_action(a), why, False

    def finish_step(self, action: dict) -> None:
        self.last_action = dict(action)
        self.steps += 1

    def act(self, obs: Mapping[str, Any]) -> AgentStep:  # pragma: no cover - subclasses implement
        raise NotImplementedError
