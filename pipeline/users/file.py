"""A user who is a file: feedback lines a person wrote, read per episode and step.

JSONL records ``{"episode_id", "step_id", "line"}`` (``step_id`` may be ``"end"``) answer
through the same interface as the simulated user (:class:`pipeline.users.User`)::

    fb = FileFeedback("feedback.jsonl").for_episode("ep_train_s0_q1_0")
    fb.step_feedback(1, obs, action, info).lines
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pipeline.core.conf_schema import UserConfig
from pipeline.core.schemas import STATUSES
from pipeline.envs.common import StepFeedback, step_status
from pipeline.grounding.feedback import FeedbackFormatError, format_feedback_line, parse_feedback_line

# The user that judges the scene preferences at the end: only its preference checks are
# used (never its probabilities or random draws).
_PREFERENCE_JUDGE = UserConfig()


class FileFeedback:
    """Feedback written by a person: JSONL records ``{"episode_id", "step_id", "line"}``.

    The whole file is read and checked when constructed, so a bad record fails before
    any episode is played, with ``<file>:<line number>`` in the message. ``step_id`` is
    the 1-based step or ``"end"`` for episode-end remarks; an optional ``"status"`` field
    overrides the status derived from the env. Preferences at the end are judged by the
    env's ``preferences_ok`` (or, when a scene spec and a ``judge`` are given, by the world's
    simulated user on the scene's preferences)::

        fb = FileFeedback("feedback.jsonl").for_episode("ep_train_s0_q1_0")
        fb.step_feedback(1, obs, action, info).lines

    Args:
        path: the JSONL file.
        user_cfg: the ``user`` config group (unused for now; kept for parity with SimulatedUser).
        unknown: ``grounding.unknown_type`` for lines with an unknown type.
        episode_id: the episode to answer for (or bind one later with :meth:`for_episode`).
        scene_spec, quest_row: optional, to check scene preferences at the end (the quest
            row: a manifest row, or a mapping with its ``expert_plan`` / ``preferences``).
        judge: the world's simulated user class, ``(user_cfg, scene_spec, quest_row, seed) -> User``
            (its descriptor's ``make_user``): only its end verdict on the preferences is used,
            never its probabilities or random draws.
    """

    def __init__(self, path: str | Path, user_cfg: UserConfig | None = None, unknown: str = "keep",
                 episode_id: str | None = None, scene_spec: Mapping[str, Any] | None = None,
                 quest_row: Mapping[str, Any] | None = None, judge: Callable[..., Any] | None = None):
        self.path = Path(path)
        self.judge = judge
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
            if raw.strip():
                self._add_record(raw, f"{self.path}:{n}")

    def _add_record(self, raw: str, where: str) -> None:
        """Check one JSONL line (``where`` = ``<file>:<line>``) and file its canonical line."""
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

    def unmatched(self, episode_ids: Iterable[str]) -> list[str]:
        """The file's episode ids that are none of ``episode_ids`` (sorted): their lines reach no
        episode, most likely a typo or a file written for another world."""
        return sorted(set(self.records) - {str(e) for e in episode_ids})

    def for_episode(self, episode_id: str, scene_spec: Mapping[str, Any] | None = None,
                    quest_row: Mapping[str, Any] | None = None,
                    judge: Callable[..., Any] | None = None) -> "FileFeedback":
        """A view of the same records that answers for one episode (``judge``: the world's
        simulated user class that judges its preferences at the end, see the class docstring)."""
        view = object.__new__(FileFeedback)
        view.path, view.unknown, view.records = self.path, self.unknown, self.records
        view.judge = judge if judge is not None else self.judge
        view.episode_id = episode_id
        view.scene = scene_spec if scene_spec is not None else self.scene
        view.quest = quest_row if quest_row is not None else self.quest
        plan = view.quest.get("expert_plan") if view.quest is not None else None
        view._plan_len = len(plan) if plan is not None else None
        return view

    def _entries(self, step: Any) -> list[tuple[str, str | None]]:
        if self.episode_id is None:
            raise ValueError(f"{self.path}: FileFeedback has no episode bound; use for_episode(episode_id)")
        return self.records.get(str(self.episode_id), {}).get(step, [])

    def step_feedback(self, step_id: int, obs: Mapping[str, Any], action: Mapping[str, Any] | None,
                      info: Mapping[str, Any]) -> StepFeedback:
        """The file's lines for this step; its status if the file gives one, else the env's."""
        entries = self._entries(step_id)
        status = step_status(info, self._plan_len)
        if info.get("expert_plan") is not None and info.get("solvable") is not False:
            self._plan_len = len(info["expert_plan"])
        given = [s for _, s in entries if s is not None]
        return StepFeedback([line for line, _ in entries], given[-1] if given else status, [False] * len(entries))

    def end_feedback(self, final: Mapping[str, Any] | Iterable[str] | None) -> tuple[bool, list[str]]:
        """The file's ``end`` lines, plus the scene's broken preferences when a scene and a judge are known."""
        lines = [line for line, _ in self._entries("end")]
        info = final if isinstance(final, Mapping) else {"facts": list(final) if final is not None else None}
        if self.scene is not None and self.judge is not None:
            known = self.quest or {}
            quest = {k: known.get(k) for k in ("expert_plan", "preferences") if known.get(k) is not None}
            ok, pref_lines = self.judge(_PREFERENCE_JUDGE, self.scene, quest, 0).end_feedback(info)
            return ok, lines + [p for p in pref_lines if p not in lines]
        return bool(info.get("preferences_ok", True)), lines
