"""ScienceWorld's simulated user: typed feedback from the gold sequence and the object tree.

The user knows the task's gold sequence (what is left of it: ``info["expert_plan"]``),
where the next gold step's objects are in the object tree (``info["next_places"]``) and
what the step did (``valid``, ``repeated``, ``lost``, the score change). From these it
writes seed 000's typed lines, in the sentences of :mod:`pipeline.envs.scienceworld.text`
(so the ``reader`` agent and the memory read them back as facts)::

    user = SimulatedUser(cfg.user, scene_spec, quest_row, seed=1234)
    fb = user.step_feedback(1, obs_before, {"action": "pick_up", "target": "metal pot"}, info)
    fb.lines    # ['feedback : spatial: The metal pot is in the cupboard.', ...]
    ok, lines = user.end_feedback(last_info)   # ScienceWorld's tasks have no preferences: (True, [])

Which remarks a step warrants:

- ``general``: a command the engine did not understand; a command repeated without effect.
- ``procedural``: a wrong ``focus on`` that ended the task (focus only on what the task
  names); when the agent stalls next to what the next gold step needs, that step
  ("What you need is right here: move metal pot to sink.").
- ``spatial``: when the agent stalls (2nd, 5th, 8th, ... step without progress) away from
  what the next gold step needs: where it is ("The metal pot is in the cupboard.", "The
  cupboard is in the kitchen.").
- ``user_preference``: none (the tasks state no preferences).

A step that warrants remarks gets them with probability ``user.feedback_prob``; each line
is replaced by an unhelpful or wrong one with probability ``user.noise``; all draws from
``numpy.random.default_rng(seed)``. Status (seed 000): ``Success`` when the step won,
raised the score or played the next gold step, ``Failure`` when it was not understood or
lost the task, ``WiP`` otherwise.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from pipeline.core.conf_schema import UserConfig
from pipeline.core.facts import fact
from pipeline.envs.common import UNHELPFUL, StepFeedback, speak  # the users' shared record, noise lines, draws
from pipeline.envs.scienceworld.text import sentence
from pipeline.grounding.feedback import format_feedback_line

STALL_STEPS = (2, 5, 8, 12, 16, 20, 25, 30, 40, 50)


def step_status(info: Mapping[str, Any], plan_before: int | None) -> str:
    """Seed 000's status of a ScienceWorld step (module docstring)."""
    if not info.get("valid", True) or info.get("lost", False):
        return "Failure"
    if info.get("won", False) or (info.get("reward_parts") or {}).get("score", 0.0) > 0:
        return "Success"
    plan = info.get("expert_plan")
    if plan is not None and plan_before is not None and len(plan) < plan_before:
        return "Success"
    return "WiP"


class SimulatedUser:
    """A user who knows the task's gold sequence and the object tree (module docstring).

    Args:
        user_cfg: the ``user`` config group (``feedback_prob``, ``noise``).
        scene_spec: the task's entry of ``scenes.json`` (its rooms, for noise lines).
        quest_row: the variation's manifest row, or a mapping with its ``expert_plan``.
        seed: seed of this user's random draws (one user per episode).
    """

    def __init__(self, user_cfg: UserConfig, scene_spec: Mapping[str, Any], quest_row: Mapping[str, Any], seed: int):
        self.feedback_prob = user_cfg.feedback_prob
        self.noise = user_cfg.noise
        for key, value in (("user.feedback_prob", self.feedback_prob), ("user.noise", self.noise)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{key}={value!r}: expected a probability in [0, 1]")
        self.scene = dict(scene_spec)
        plan = quest_row.get("expert_plan")
        self._plan_len: int | None = len(plan) if plan is not None else None
        self.rng = np.random.default_rng(seed)
        self._stall = 0
        self._said: dict[str, int] = {}  # hint line -> step it was last given
        self._seen_things: list[str] = []

    def _hints(self, step_id: int, info: Mapping[str, Any], here: str | None) -> list[str]:
        """Where the next gold step's objects are, or the step itself when they are at hand."""
        plan = list(info.get("expert_plan") or [])
        places = [p for p in info.get("next_places") or [] if len(p) == 3]
        if not plan or not places:  # nothing known of where its objects are (a door of another room)
            return []
        away = [p for p in places if p[1] != "inventory" and p[2] != here]
        if away:
            lines = []
            for thing, holder, room in away:
                lines.append(format_feedback_line("spatial", sentence(fact("in", thing, holder))))
                if holder != room:
                    lines.append(format_feedback_line("spatial", sentence(fact("in", holder, room))))
        else:
            lines = [format_feedback_line("procedural", f"What you need is right here: {plan[0]}.")]
        out = []
        for line in dict.fromkeys(lines):
            if step_id - self._said.get(line, -99) > 3:  # said within three steps: not again
                self._said[line] = step_id
                out.append(line)
        return out

    def _noise_line(self) -> str:
        rooms = list(self.scene.get("rooms") or [])
        if self._seen_things and rooms and self.rng.random() < 0.5:
            thing = self._seen_things[int(self.rng.integers(len(self._seen_things)))]
            room = rooms[int(self.rng.integers(len(rooms)))]
            return format_feedback_line("spatial", sentence(fact("in", thing, room)))
        return format_feedback_line("general", UNHELPFUL[int(self.rng.integers(len(UNHELPFUL)))])

    def step_feedback(self, step_id: int, obs: Mapping[str, Any], action: Mapping[str, Any] | None,
                      info: Mapping[str, Any]) -> StepFeedback:
        """Lines and status for one step (see the module docstring)."""
        action = dict(action or {})
        for thing in obs.get("visible_entities") or []:
            if thing not in self._seen_things:
                self._seen_things.append(thing)
        status = step_status(info, self._plan_len)
        lines: list[str] = []
        shown = info.get("command") or " ".join(str(action.get(k)) for k in ("action", "target", "receptacle")
                                                if action.get(k))
        if not info.get("valid", True):
            lines.append(format_feedback_line("general", f"'{shown}' is not something you can do here; choose one of "
                                                         "the admissible actions."))
        elif info.get("lost"):
            lines.append(format_feedback_line("procedural", f"'{shown}' ended the task: focus only on what the task "
                                                            "names."))
        elif info.get("repeated"):
            lines.append(format_feedback_line("general", f"You repeated '{shown}' without effect; try something new."))
        self._stall = 0 if status == "Success" else self._stall + 1
        if info.get("valid", True) and not info.get("won") and not info.get("lost") and self._stall in STALL_STEPS:
            lines += [ln for ln in self._hints(step_id, info, obs.get("agent_location")) if ln not in lines]
        if info.get("expert_plan") is not None:
            self._plan_len = len(info["expert_plan"])
        return speak(self.rng, self.feedback_prob, self.noise, lines, status, self._noise_line)

    def end_feedback(self, final: Mapping[str, Any] | Iterable[str] | None) -> tuple[bool, list[str]]:
        """``(True, [])``: ScienceWorld's tasks state no user preferences to judge."""
        return True, []
