"""ScienceWorld seen through seed 004's observation dict (the :class:`pipeline.envs.Env` seam).

One episode is one variation of one task, loaded into a simulator (a JVM) it holds from
``reset`` to ``close`` (:mod:`pipeline.envs.scienceworld.engine`: a process's pool)::

    from pipeline.envs.scienceworld.env import ScienceWorldTaskEnv

    env = ScienceWorldTaskEnv("data/games/boil/v0003.json", max_steps=40)
    obs = env.reset()             # scene = task, description from the object tree's facts
    obs, reward, done, info = env.step({"action": "open", "target": "door to kitchen"})
    info["won"], info["valid"], info["score"], info["expert_plan"]

- ``admissible_commands``: the engine's valid action-object combinations now (sorted);
  ``admissible_actions`` the same as action dicts (each with its ``command``).
- An action dict becomes a command (:mod:`pipeline.envs.scienceworld.commands`) and is sent
  to the engine's parser, which is the judge of validity (a command the parser does not
  know, ``No known action matches that input.``, is a recorded failed step): the engine
  accepts more spellings than it lists (its own gold sequences use them). A malformed
  dict is a failed step that never reaches the engine.
- An ambiguous command (the engine asks which of several objects is meant) is answered
  with the choice whose text sorts first (:func:`send`: the engine lists them in an order
  that changes between JVM runs), recorded in ``info["disambiguated"]``.
- Reward: the engine's score change over the step, scaled to 0..1 (score 0..100).
  Success (``won``) is the engine's task completion with a score that is not negative;
  a negative score (a wrong ``focus on``) is ``lost``; the step cap is neither.
- ``info["expert_plan"]``: the rest of the task's gold sequence after the longest prefix
  of it the episode has played (a reference the simulated user reads, not a planner's).
- A simulator that gives no answer within ``env.scienceworld.call_timeout_s``, or whose JVM
  died, fails the episode loudly (:class:`~pipeline.envs.scienceworld.engine.EngineFailed`
  from ``reset`` or ``step``): it is discarded, never reused, and the episode is not
  recorded (a rerun plays it again from its start; finished episodes are checkpointed).
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any, Iterator, Mapping

from pipeline.core.config import project_root
from pipeline.core.facts import Fact
from pipeline.core.io import ArtifactError
from pipeline.envs.common import EnvLifecycle
from pipeline.envs.scienceworld.commands import ActionError, action_to_command, command_to_action, verbs_of
from pipeline.envs.scienceworld.engine import (CALL_TIMEOUT_S, HEAP_MB, START_TIMEOUT_S, EngineFailed, acquire,
                                               answering, release)
from pipeline.envs.scienceworld.text import describe
from pipeline.envs.scienceworld.world import fact_strings, locate, observation_facts

UNKNOWN_COMMAND = "No known action matches that input."
_AMBIGUOUS = "Ambiguous request"
_PARTS = ("score",)


_CHOICE = re.compile(r"^\s*(\d+):\s*(.*?)\s*$")


def send(sw: Any, command: str) -> tuple[str, bool]:
    """One command to a simulator: ``(response, disambiguated)``.

    An ambiguous command (the engine asks which of several objects is meant, listing them
    in an order that changes from one JVM run to the next) is answered with the choice
    whose text sorts first: the same object in every run.
    """
    text = str(sw.server.step(command))
    if not text.startswith(_AMBIGUOUS):
        return text, False
    choices = [(m[2], m[1]) for m in map(_CHOICE.match, text.splitlines()) if m and m[2]]
    pick = min(choices)[1] if choices else "0"
    return str(sw.server.step(pick)), True


class SpecFileError(ArtifactError):
    """A variation's spec file (``data/games/<task>/<quest>.json``) is missing or corrupt."""


def read_spec(path: str | Path) -> dict[str, Any]:
    """A variation's spec: ``task``, ``variation``, ``simplifications``, ``objective``, ``gold``."""
    p = Path(path)
    hint = "(rebuild the games: `python -m pipeline.stages.games` or `dvc repro games`)"
    if not p.is_file():
        raise SpecFileError(f"missing ScienceWorld variation file {p} {hint}")
    try:
        spec = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecFileError(f"corrupt ScienceWorld variation file {p}: {exc} {hint}") from exc
    for key in ("task", "variation", "simplifications", "gold"):
        if key not in spec:
            raise SpecFileError(f"ScienceWorld variation file {p}: key {key!r} missing {hint}")
    return spec


def is_command(command: str) -> bool:
    """Whether an action dict can say ``command`` (``reset task`` is the engine's, not an agent's)."""
    try:
        command_to_action(command)
        return True
    except ValueError:
        return False


def normalise(command: str | None) -> str:
    """A command compared with another: lower case, single spaces."""
    return " ".join(str(command or "").lower().split())


def clean_text(text: str | None) -> str:
    """The engine's response on one line (its tabs and line breaks collapsed)."""
    return " ".join(str(text or "").split())


class ScienceWorldTaskEnv(EnvLifecycle):
    """One ScienceWorld variation played in a simulator (a JVM) held from ``reset`` to ``close`` (``reset`` / ``step``).

    Args:
        spec_file: the variation's spec (:func:`read_spec`); a relative path is read from
            the working directory, else from the project root.
        scene_id, quest_id: for the observation (``scene`` is the task) and logs.
        objective: the goal text; defaults to the engine's task description.
        max_steps: step cap (``done`` when reached; ``truncated`` in info).
        fresh_jvm: play in a JVM of its own, stopped at ``close`` (``env.scienceworld.fresh_jvm``):
            the episode's bytes then depend on nothing played before it; false: a JVM of the
            process's pool, reused.
        call_timeout_s, heap_mb, start_timeout_s: a new JVM's read timeout on every call, heap limit
            and bound on its start (``env.scienceworld.call_timeout_s``, ``.jvm_heap_mb``, ``.start_timeout_s``).
    """

    def __init__(self, spec_file: str | Path, *, scene_id: str | None = None, quest_id: str | None = None,
                 objective: str | None = None, max_steps: int = 30, fresh_jvm: bool = True,
                 call_timeout_s: float = CALL_TIMEOUT_S, heap_mb: int = HEAP_MB,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        p = Path(spec_file)
        if not p.is_absolute() and not p.exists():
            p = project_root() / p
        self.spec = read_spec(p)
        self.spec_file = p
        self.scene_id = scene_id or str(self.spec["task"])
        self.quest_id = quest_id or p.stem
        self.max_steps = int(max_steps)
        if self.max_steps < 1:
            raise ValueError(f"max_steps={max_steps}: expected >= 1")
        self._objective = objective
        self.fresh_jvm = fresh_jvm
        self.limits = {"call_timeout_s": float(call_timeout_s), "heap_mb": int(heap_mb),
                       "start_timeout_s": float(start_timeout_s)}
        self.gold = [str(c) for c in self.spec["gold"]]
        self._sw: Any = None
        self._done = True
        self.admissible: list[str] = []

    # -- engine -----------------------------------------------------------------------

    def _read(self, look: str) -> None:
        """The state after a command: facts, admissible commands, score."""
        sw = self._sw
        self.look_text = look
        self._tree = sw.getObjectTree()
        self._facts = observation_facts(self._tree, look)
        # The JSON forms: one py4j call each (iterating the Java list costs a call per command).
        valid = json.loads(sw.server.getValidActionObjectCombinationsJSON())["validActions"]
        names = json.loads(sw.server.getPossibleObjectReferentLUTJSON())
        actions: dict[str, dict[str, Any]] = {}
        for v in valid:
            command = " ".join(str(v["action"]).split())
            if command in actions:
                continue
            objs = [names.get(str(i)) for i in v.get("obj_ids") or []]
            try:
                actions[command] = dict(command_to_action(command, [o for o in objs if o]), command=command)
            except ValueError:
                continue  # `reset task`: the engine's, not an agent's
        self.admissible = sorted(actions)
        self._actions = [actions[c] for c in self.admissible]
        self.score = int(round(100 * sw.server.getScore()))
        self.completed = bool(sw.server.getCompleted())

    def _send(self, command: str) -> tuple[str, bool]:
        return send(self._sw, command)

    @contextlib.contextmanager
    def _engine(self, what: str) -> Iterator[None]:
        """The engine calls of ``reset`` or one step (:func:`~pipeline.envs.scienceworld.engine.answering`):
        on a timeout or a dead JVM the simulator is gone and the episode over, and the error propagates."""
        try:
            with answering(self._sw, f"{self.scene_id}/{self.quest_id} {what}"):
                yield
        except EngineFailed as exc:
            self._sw, self._done = None, True
            raise EngineFailed(f"{exc}; the episode is not recorded: a rerun plays it again from its start, in a new "
                               "JVM") from exc

    def close(self) -> None:
        """Give the simulator back to the pool (its JVM stays up for the next episode)."""
        if self._sw is not None:
            release(self._sw, stop=self.fresh_jvm)
            self._sw = None

    # -- API ----------------------------------------------------------------------------

    def reset(self) -> dict[str, Any]:
        """Load the variation (a fresh state) and look around; returns the first observation."""
        if self._sw is None:
            self._sw = acquire(fresh=self.fresh_jvm, **self.limits)
        spec = self.spec
        with self._engine("reset"):
            self._sw.load(str(spec["task"]), int(spec["variation"]), str(spec["simplifications"]),
                          generateGoldPath=False)
            # load() gives the fresh state; the wrapper's reset() would reload it once more (~1 s).
            look, _ = self._send("look around")
            self._read(self._sw.look())
            self.objective = self._objective or str(self._sw.get_task_description())
        self.steps = 0
        self._done = False
        self.won = False
        self.lost = False
        self.gold_at = 0
        self.last_feedback = clean_text(look)
        self._no_change: set[str] = set()
        return self.observation()

    def facts(self) -> tuple[Fact, ...]:
        """What the current observation shows, as typed facts (the description renders them)."""
        return self._facts

    def observation(self) -> dict[str, Any]:
        facts = self._facts
        here = next((f.args[0] for f in facts if f.pred == "here"), "")
        visible = [f.args[0] for f in facts if f.pred in ("at", "in")]
        return {
            "scene": self.scene_id,
            "agent_location": here,
            "agent_inventory": [f.args[0] for f in facts if f.pred == "carried"],
            "visible_entities": list(dict.fromkeys(visible)),
            "available_actions": verbs_of(self.admissible),
            "description": describe(facts),
            "objective": self.objective,
            "admissible_commands": list(self.admissible),
            "admissible_actions": [dict(a) for a in self._actions],
            "step": self.steps,
            "max_steps": self.max_steps,
        }

    def places(self, commands: list[str]) -> list[list[str]]:
        """``[thing, holder, room]`` of every object the commands name, from the object tree
        (``holder`` is ``inventory`` when carried, the room when it stands there); what the
        simulated user knows of where the next gold step's objects are."""
        out = []
        for command in commands:
            try:
                action = command_to_action(command)
            except ValueError:
                continue
            for key in ("target", "receptacle"):
                name = action.get(key)
                if not name:
                    continue
                name = name.removesuffix(" in inventory")
                here = next((f.args[0] for f in self._facts if f.pred == "here"), "")
                if any(f.pred in ("open", "closed") and f.args == (name,) for f in self._facts):
                    out.append([name, here, here])  # a door of this room (doors are not in the tree)
                    continue
                found = locate(self._tree, name)
                if found is not None:
                    out.append([name, found[0], found[1]])
        return out

    def step(self, action: Mapping[str, Any]) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Play one action dict; an invalid one is a recorded failed step, never an exception.

        Returns:
            ``(observation, reward, done, info)``; info: ``command``, ``valid``,
            ``env_feedback``, ``won``, ``lost``, ``changed``, ``repeated``, ``facts``,
            ``expert_plan``, ``next_places`` (:meth:`places` of its first command), ``score``, ``disambiguated``, ``reward_parts``, ``step``,
            ``truncated`` (and ``error`` for a malformed action).
        """
        if self._sw is None or self._done:
            if not hasattr(self, "steps"):
                raise RuntimeError("call reset() before step()")
            info = self._info(None, False, "The episode is over.", False, False, False, {k: 0.0 for k in _PARTS})
            return self.observation(), 0.0, True, info
        self.steps += 1
        before_facts, before_score = self._facts, self.score
        error, disambiguated = None, False
        try:
            command = action_to_command(action)
        except ActionError as exc:
            command, error = None, str(exc)
        if command is None:
            valid, feedback, key = False, f"Invalid action: {error}.", "invalid:" + json.dumps(action, sort_keys=True,
                                                                                              default=str)
        else:
            with self._engine(f"step {self.steps} ({command!r})"):
                text, disambiguated = self._send(command)
                self._read(self._sw.look())
            feedback = clean_text(text)
            valid = not feedback.startswith(UNKNOWN_COMMAND)
            key = normalise(command)
            if valid and self.gold_at < len(self.gold) and normalise(self.gold[self.gold_at]) == key:
                self.gold_at += 1
        self.lost = self.lost or self.score < 0
        self.won = self.won or (self.completed and self.score >= 0)
        changed = self._facts != before_facts or self.score != before_score
        repeated = not changed and key in self._no_change
        if not changed:
            self._no_change.add(key)
        parts = {"score": (self.score - before_score) / 100.0}
        reward = float(sum(parts.values()))
        truncated = self.steps >= self.max_steps and not (self.won or self.lost)
        self._done = self.won or self.lost or self.steps >= self.max_steps
        self.last_feedback = feedback
        info = self._info(command if valid else None, valid, feedback, changed, repeated,
                          disambiguated, parts)
        info["truncated"] = truncated
        if error:
            info["error"] = error
        return self.observation(), reward, self._done, info

    def _info(self, command, valid, feedback, changed, repeated, disambiguated, parts) -> dict[str, Any]:
        return {
            "command": command,
            "valid": valid,
            "env_feedback": feedback,
            "won": self.won,
            "lost": self.lost,
            "changed": changed,
            "repeated": repeated,
            "facts": fact_strings(self._facts),
            "expert_plan": [] if self.won else list(self.gold[self.gold_at:]),
            "next_places": [] if self.won else self.places(self.gold[self.gold_at:self.gold_at + 1]),
            "solvable": None,
            "score": self.score,
            "disambiguated": disambiguated,
            "preferences_ok": True,
            "preferences": {},
            "reward_parts": parts,
            "step": self.steps,
            "truncated": False,
        }

