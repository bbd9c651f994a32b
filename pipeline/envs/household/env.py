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

The household semantics it plays by live beside it: the state read from facts and the
scene preferences in :mod:`pipeline.envs.household.world`, the expert planner in
:mod:`pipeline.envs.household.planner`. This module holds the action <-> command mapping
(:func:`action_to_command`, :func:`command_to_action`) and the game-file checks.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import re
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pipeline.core.conf_schema import RewardConfig
from pipeline.core.config import project_root, section
from pipeline.core.io import ArtifactError
from pipeline.core.facts import Fact
from pipeline.envs.common import EnvLifecycle
from pipeline.envs.household.planner import shortest_plan
from pipeline.envs.household.text import describe
from pipeline.envs.household.world import (DIRECTIONS, World, check_preferences, fact_str, parse_preference,
                                           typed_facts)

VERBS = ("go_to", "pick_up", "put", "open", "close", "unlock", "lock", "drop", "examine", "look",
         "inventory", "wait")


class GameFileError(ArtifactError):
    """A game file (``.z8`` or its ``.json`` sidecar) is missing or corrupt."""


class ActionError(ValueError):
    """An action dict that is malformed or not admissible now (the message says why)."""


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
    if verb == "wait":
        return None
    if verb in ("look", "inventory"):
        return _pick(by_lower, [verb], verb)
    if target is None:
        raise ActionError(f"{verb} needs a {'target room or direction' if verb == 'go_to' else 'target'}")
    if verb == "go_to":
        return _go_command(target, exits, by_lower)
    return _entity_command(verb, target, rec, key, by_lower)


def _pick(by_lower: Mapping[str, str], cands: list[str], desc: str) -> str:
    """The first (sorted) admissible command among ``cands``, matched case-insensitively."""
    found = sorted(by_lower[c.lower()] for c in cands if c.lower() in by_lower)
    if not found:
        raise ActionError(f"{desc} is not possible now")
    return found[0]


def _go_command(target: str, exits: Mapping[str, str] | None, by_lower: Mapping[str, str]) -> str:
    """``go <direction>`` for a direction or an adjacent room's name."""
    t = target.lower()
    if t not in DIRECTIONS:
        dirs = [d for d, r in (exits or {}).items() if r.lower() == t]
        if not dirs:
            where = ", ".join(f"{d} to {r}" for d, r in (exits or {}).items()) or "none known"
            raise ActionError(f"go_to {target}: not an adjacent room or a direction (exits: {where})")
        t = dirs[0]
    return _pick(by_lower, [f"go {t}"], f"go_to {target}")


def _entity_command(verb: str, t: str, rec: str | None, key: str | None, by_lower: Mapping[str, str]) -> str:
    """The command of a verb acting on entity ``t`` (pick_up, put, unlock, lock, open, ...)."""
    if verb == "pick_up":
        if rec is not None:
            return _pick(by_lower, [f"take {t} from {rec}"], f"pick_up {t} from {rec}")
        pat = re.compile(rf"^take {re.escape(t.lower())}( from \S+)?$")
        return _pick(by_lower, [c for c in by_lower if pat.match(c)], f"pick_up {t}")
    if verb == "put":
        if rec is None:
            raise ActionError(f"{verb} needs a receptacle")
        return _pick(by_lower, [f"put {t} on {rec}", f"insert {t} into {rec}"], f"put {t} in/on {rec}")
    if verb in ("unlock", "lock"):
        if key is not None:
            return _pick(by_lower, [f"{verb} {t} with {key}"], f"{verb} {t} with {key}")
        prefix = f"{verb} {t.lower()} with "
        return _pick(by_lower, [c for c in by_lower if c.startswith(prefix)],
                     f"{verb} {t} (no matching key in inventory?)")
    # open, close, drop, examine
    return _pick(by_lower, [f"{verb} {t}"], f"{verb} {t}")


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


# The planner is a pure function of the state, the goal, the preferences and what was opened and
# unlocked, and a BFS costs milliseconds at every step: a process keeps its recent answers (a
# looping agent revisits states; the learning curve replays each task at every k, C0 identically).
_PLANS: collections.OrderedDict[bytes, tuple[str, ...] | None] = collections.OrderedDict()
_PLANS_KEPT = 50_000


def cached_plan(world: World, goal: Sequence[str], preferences: Sequence[Any], opened: Iterable[str],
                unlocked: Iterable[str]) -> list[str] | None:
    """:func:`pipeline.envs.household.planner.shortest_plan` of these inputs, remembered (an LRU of
    :data:`_PLANS_KEPT` answers per process, keyed by a digest of every input): the same list."""
    parts = [sorted(world.facts), sorted(world.kinds.items()), list(goal),
             [p if isinstance(p, str) else json.dumps(p, sort_keys=True) for p in preferences],
             sorted(opened), sorted(unlocked)]
    key = hashlib.blake2b(json.dumps(parts, separators=(",", ":")).encode(), digest_size=20).digest()
    if key in _PLANS:
        _PLANS.move_to_end(key)
        plan = _PLANS[key]
    else:
        found = shortest_plan(world, goal, preferences, opened=opened, unlocked=unlocked)
        plan = tuple(found) if found is not None else None
        _PLANS[key] = plan
        if len(_PLANS) > _PLANS_KEPT:
            _PLANS.popitem(last=False)
    return list(plan) if plan is not None else None


def _reward_parts_of(reward: RewardConfig | Mapping[str, float] | None) -> dict[str, float]:
    """``env.reward`` as plain floats, every part the schema has (its defaults where ``reward``
    says nothing); typed once per distinct reward, not per episode (the curve makes thousands)."""
    items = tuple(sorted((str(k), float(v)) for k, v in (reward or {}).items()))
    return dict(_typed_reward(items))


@functools.lru_cache(maxsize=16)
def _typed_reward(items: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
    return tuple((k, float(v)) for k, v in section(RewardConfig, dict(items)).items())


class HouseholdEnv(EnvLifecycle):
    """One household quest played through TextWorld (``reset`` / ``step``).

    Args:
        game_file: the compiled ``.z8`` (its ``.json`` sidecar beside it); a relative path
            is read from the working directory, else from the project root.
        scene_id, quest_id: for the observation / logs.
        objective: goal text; defaults to the game's own objective.
        max_steps: step cap (``done`` when reached; ``truncated`` in info).
        reward: ``cfg.env.reward`` (or a dict with some of its keys); missing keys take
            :class:`pipeline.core.conf_schema.RewardConfig`'s defaults.
        preferences: scene preferences (ids or scene-spec dicts) for ``preferences_ok``.
        compute_expert_plan: fill ``info["expert_plan"]`` (a BFS per step).
    """

    def __init__(self, game_file: str | Path, *, scene_id: str | None = None, quest_id: str | None = None,
                 objective: str | None = None, max_steps: int = 30,
                 reward: RewardConfig | Mapping[str, float] | None = None,
                 preferences: Iterable[str | Mapping[str, Any]] = (), compute_expert_plan: bool = True) -> None:
        p = Path(game_file)
        if not p.is_absolute() and not p.exists():
            p = project_root() / p
        self.game_file = check_game_file(p)
        self._configure(scene_id or p.parent.name, quest_id or p.stem, objective, max_steps, reward, preferences,
                        compute_expert_plan)

    def _configure(self, scene_id, quest_id, objective, max_steps, reward, preferences, compute_expert_plan) -> None:
        """Everything but the game: ids, step cap, reward, preferences (checked)."""
        self.scene_id = scene_id
        self.quest_id = quest_id
        self.max_steps = int(max_steps)
        if self.max_steps < 1:
            raise ValueError(f"max_steps={max_steps}: expected >= 1")
        self.reward_cfg = _reward_parts_of(reward)
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
        import textworld  # deferred: heavy optional dependency (textworld)
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

    def _sent(self, command: str) -> str:
        """The command as the game's parser takes it (the compiled games' short aliases)."""
        return " ".join(self._aliases.get(tok, tok) for tok in command.split())

    def _read(self, state) -> None:
        self.world = World.from_facts(typed_facts(state["facts"]))
        self.admissible = list(state["admissible_commands"])

    def close(self) -> None:
        if self._tw is not None:
            self._tw.close()
            self._tw = None

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
            "description": describe(w.observation_facts()),
            "objective": self.objective,
            "admissible_commands": list(self.admissible),
            "admissible_actions": [dict(command_to_action(c, exits), command=c) for c in self.admissible
                                   if is_household_command(c)],
            "step": self.steps,
            "max_steps": self.max_steps,
        }

    def facts(self) -> tuple[Fact, ...]:
        """What the current observation shows, as typed facts (the description renders them)."""
        return self.world.observation_facts()

    def expert_plan(self) -> list[str] | None:
        """Shortest remaining plan from the current state (``None`` if none exists)."""
        if self.won:
            return []
        return cached_plan(self.world, self.goal, self.preferences, self.opened, self.unlocked)

    def preferences_status(self) -> dict[str, bool]:
        return check_preferences(self.preferences, self.world.facts, opened=self.opened, unlocked=self.unlocked)

    def step(self, action: Mapping[str, Any]) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Play one action dict; an invalid one is a recorded failed step, never an exception.

        Returns:
            ``(observation, reward, done, info)``: the next observation, the step's shaped
            reward (``info["reward_parts"]`` sums to it), whether the episode is over, and
            the step's record (``command``, ``valid``, ``won``, ``facts``, ``expert_plan``,
            ``preferences_ok``, ... see :meth:`_info`).
        """
        if self._tw is None or self._done:
            if self._tw is None and not hasattr(self, "steps"):
                raise RuntimeError("call reset() before step()")
            info = self._info(None, False, "The episode is over.", False, False, {k: 0.0 for k in _PARTS})
            return self.observation(), 0.0, True, info
        self.steps += 1
        before = self.world
        command, valid, error, feedback, key = self._play(action)
        after = self.world
        changed = after.facts != before.facts
        self._track_containers(before, after)
        repeated = not changed and key in self._no_change
        if not changed:
            self._no_change.add(key)
        parts = self._reward_parts(before, after, command, valid, repeated)
        reward = float(sum(parts[k] for k in _PARTS))
        truncated = self.steps >= self.max_steps and not (self.won or self.lost)
        self._done = self.won or self.lost or self.steps >= self.max_steps
        info = self._info(command, valid, feedback, changed, repeated, parts)
        info["truncated"] = truncated
        if error:
            info["error"] = error
        return self.observation(), reward, self._done, info

    def _play(self, action: Mapping[str, Any]) -> tuple[str | None, bool, str | None, str, str]:
        """Send the action's command to the game (if it has one); read the new state.

        Returns:
            ``(command, valid, error, feedback, key)``: ``key`` names the action for the
            repeat check (the command, ``wait``, or the invalid action's JSON).
        """
        try:
            command = action_to_command(action, self.admissible, self.world.room_exits())
            valid, error = True, None
        except ActionError as exc:
            command, valid, error = None, False, str(exc)
        if not valid:
            return command, valid, error, f"Invalid action: {error}.", \
                "invalid:" + json.dumps(action, sort_keys=True, default=str)
        if command is None:
            return command, valid, error, "You wait. Nothing happens.", "wait"
        state, _, _ = self._tw.step(self._sent(command))
        self._read(state)
        self.won = self.won or bool(state.get("won"))
        self.lost = self.lost or bool(state.get("lost"))
        feedback = clean_feedback(state.get("feedback"))
        if command in ("look",) or feedback.startswith("-="):
            feedback = describe(self.world.observation_facts())  # room text is flavour; say it from facts
        return command, valid, error, feedback, command

    def _track_containers(self, before: World, after: World) -> None:
        """Remember the containers opened / unlocked during the episode (for the preferences)."""
        for c, s in after.container_state.items():
            if s == "open" and before.container_state.get(c) != "open":
                self.opened.add(c)
            if before.container_state.get(c) == "locked" and s != "locked":
                self.unlocked.add(c)

    def _reward_parts(self, before: World, after: World, command: str | None, valid: bool,
                      repeated: bool) -> dict[str, float]:
        """The step's reward by part (:data:`_PARTS`); records first visits and examines."""
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
        return parts

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


_PARTS = ("win", "invalid", "repeat", "first_visit", "first_examine", "examine", "step_cost")


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def is_household_command(command: str) -> bool:
    """Whether ``command`` is one of the household verbs (an action dict can express it)."""
    try:
        command_to_action(command)
        return True
    except ValueError:
        return False


class LogicHouseholdEnv(HouseholdEnv):
    """A household quest played on TextWorld's own logic engine, without compiling it.

    ``textworld.envs.tw.TextWorldEnv`` runs the game's rules (its ``KnowledgeBase``) on the
    game's facts: the same facts, admissible commands and ``won`` / ``lost`` the compiled
    game's TextWorld wrapper tracks (``tests/test_env.py``'s differential test checks it,
    step by step, against the compiled games), at ~1 ms a reset instead of ~1.5 s of
    Inform 7 compiling. Its game text is a placeholder, which changes nothing here: the
    observation is built from facts. What it is for: the policy's demonstrations in
    thousands of generated houses (:mod:`pipeline.envs.household.generate`); the compiled
    games stay the evaluation environment.

    Args:
        game: a ``textworld.Game`` (e.g. :meth:`GeneratedHouse.game`) or the path of a
            game's ``.json`` (a compiled game's sidecar).
        The other arguments are :class:`HouseholdEnv`'s.
    """

    def __init__(self, game: Any, *, scene_id: str, quest_id: str, objective: str | None = None,
                 max_steps: int = 30, reward: RewardConfig | Mapping[str, float] | None = None,
                 preferences: Iterable[str | Mapping[str, Any]] = (), compute_expert_plan: bool = True) -> None:
        self.game_file = None
        self._game = game
        self._configure(scene_id, quest_id, objective, max_steps, reward, preferences, compute_expert_plan)

    def _start(self):
        import textworld  # deferred: heavy optional dependency (textworld)
        from textworld.core import EnvInfos
        from textworld.envs import TextWorldEnv
        from textworld.generator.inform7 import Inform7Game

        infos = EnvInfos(admissible_commands=True, facts=True, won=True, lost=True, feedback=True,
                         objective=True, win_facts=True)
        game = self._game
        if isinstance(game, (str, Path)):
            game = textworld.Game.load(str(game))
        env = TextWorldEnv(infos)
        # TextWorldEnv.load() only reads a file into these two; an in-memory game sets them
        # directly (thousands of generated houses are never written to disk).
        env._game, env._inform7 = game, Inform7Game(game)
        self._tw = _WithWinFacts(env)

    def reset(self) -> dict[str, Any]:
        obs = super().reset()
        self._aliases = {}  # the logic engine takes the entity names themselves
        return obs

    def _sent(self, command: str) -> str:
        return command


class _WithWinFacts:
    """A ``TextWorldEnv`` whose reset state also carries ``win_facts`` (with entity names),
    as TextWorld's wrapper of the compiled games gives them."""

    def __init__(self, env: Any):
        self.env = env

    def reset(self):
        state = self.env.reset()
        i7 = self.env._inform7
        state["win_facts"] = [[tuple(map(i7.get_human_readable_fact, e.condition.preconditions))
                               for e in q.win_events] for q in self.env._game.quests]
        return state

    def step(self, command: str):
        return self.env.step(command)

    def close(self) -> None:
        self.env.close()
