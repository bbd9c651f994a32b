"""Step feedback capture (seed 000 "Step별 피드백 수집"): one episode's record and files.

A :class:`GroundingFileManager` records each step's typed feedback
(``grounding_per_step``), stacks it per type as ``[ StepN - Status ] : text`` entries
(``stacked_grounding``), makes the episode's ``final_grounding`` from them and writes the
episode's files. :func:`feedback_from_lines` turns raw ``feedback : <type>: <text>``
lines into the per-type texts a step takes.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipeline.core.conf_schema import SaveFormat, UnknownFeedback
from pipeline.core.schemas import FEEDBACK_TYPES, STATUSES
from pipeline.grounding.common import (
    FINAL_KEYS,
    SAFE_NAME_RE,
    GroundingError,
    check_choice,
    empty_stacked,
    stacked_entry,
)
from pipeline.grounding.feedback import FeedbackFormatError, UnknownFeedbackType, parse_feedback_line
from pipeline.grounding.files import write_grounding_files, write_latest_files
from pipeline.grounding.generate import generate_grounding

# The package's one logger: its name is what log filters (and tests) select.
log = logging.getLogger("pipeline.grounding")


def feedback_from_lines(lines: Iterable[str], unknown: str = "keep", where: str = "") -> dict[str, str | None]:
    """Group ``feedback : <type>: <text>`` lines by type (the parser of :mod:`pipeline.grounding.feedback`).

    Unlike :func:`pipeline.grounding.feedback.classify_feedback_lines`, a *malformed* line is not an
    error under ``unknown="keep"``: it is kept whole under ``general`` with a warning
    naming it (issue 4: never silently dropped); under ``"reject"`` it raises.

    Returns:
        ``{type: text or None}`` for the four types; texts of one type joined with ``"; "``.
    """
    policy = check_choice(unknown, UnknownFeedback, "grounding.unknown_type")
    grouped: dict[str, list[str]] = {t: [] for t in FEEDBACK_TYPES}
    for line in lines:
        if isinstance(line, str) and not line.strip():
            continue
        try:
            ftype, text = parse_feedback_line(line, unknown=policy, where=where)
        except UnknownFeedbackType:
            raise
        except FeedbackFormatError:
            if policy == "reject" or not isinstance(line, str):
                raise
            at = f"{where}: " if where else ""
            log.warning("%smalformed feedback line %r kept under 'general' (grounding.unknown_type=keep)", at, line)
            ftype, text = "general", " ".join(line.split())
        grouped[ftype].append(text)
    return {t: ("; ".join(v) if v else None) for t, v in grouped.items()}


class GroundingFileManager:
    """Per-episode feedback record and grounding files (seed 000's ``GroundingFileManager``).

    Args:
        episode_id: the episode's id (int as in the seed, or the pipeline's string id);
            it names the episode folder ``episode_<id>`` and files ``grounding_episode_<id>.*``.
        out_dir: where :meth:`save_final_grounding` writes; ``None`` keeps everything in
            memory (the ``ground`` stage writes later, through :func:`write_grounding_files`).
        save_format: ``json`` | ``txt`` | ``both`` (seed's GROUNDING_SAVE_FORMAT).
        unknown_type: ``keep`` (unknown feedback types go under ``general`` with a
            warning) | ``reject`` (a :class:`GroundingError`).
        expr_info: extra ``expr_info`` fields (scene_id, quest_id, ...), after ``episode_id``.
        latest_dirs: folders that also get ``grounding_latest.{json,txt}`` on save.
    """

    def __init__(self, episode_id: int | str, *, out_dir: str | os.PathLike | None = None,
                 save_format: str = "both", unknown_type: str = "keep",
                 expr_info: Mapping[str, Any] | None = None, latest_dirs: Iterable[str | os.PathLike] = ()):
        if isinstance(episode_id, bool) or not isinstance(episode_id, (int, str)) \
                or not SAFE_NAME_RE.match(str(episode_id)):
            raise GroundingError(f"episode_id={episode_id!r}: expected an int or a string of letters, digits, "
                                 "'_', '-', '.'")
        self.episode_id = episode_id
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.save_format = check_choice(save_format, SaveFormat, "grounding.save_format")
        self.unknown_type = check_choice(unknown_type, UnknownFeedback, "grounding.unknown_type")
        self.latest_dirs = [Path(d) for d in latest_dirs]
        self.expr_info: dict[str, Any] = {"episode_id": episode_id}
        for k, v in (expr_info or {}).items():
            if k != "episode_id":
                self.expr_info[k] = v
        self.grounding_per_step: list[dict] = []
        self.stacked_grounding: dict[str, list[str]] = empty_stacked()
        self.final_grounding: dict | None = None

    def append_step_feedback(self, step_id: int, instruction: str | None, status: str,
                             feedback: Mapping[str, str | None] | Sequence[str] | str | None) -> dict:
        """Record one step's feedback and stack it per type (seed 000).

        Args:
            step_id: the step number (1 for the first step; shown as ``Step1``).
            instruction: what was asked/done at this step (the executed command).
            status: ``"Success"`` | ``"Failure"`` | ``"WiP"``.
            feedback: ``{"user_preference": ..., "spatial": ..., ...}`` (missing keys and
                empty texts are ``None``), or ``feedback : <type>: <text>`` line(s).

        Returns:
            The ``grounding_per_step`` record that was appended.

        Raises:
            GroundingError: bad status, step id, feedback value, or an unknown feedback
                type with ``unknown_type="reject"``.
        """
        if isinstance(step_id, bool) or not isinstance(step_id, int) or step_id < 0:
            raise GroundingError(f"step_id={step_id!r}: expected a non-negative int")
        if status not in STATUSES:
            raise GroundingError(f"step {step_id}: status={status!r}: expected one of {' | '.join(STATUSES)}")
        if instruction is not None and not isinstance(instruction, str):
            raise GroundingError(f"step {step_id}: instruction={instruction!r}: expected a string or None")
        per_type = self._normalise_feedback(step_id, feedback)
        record = {"step_id": step_id, "instruction": instruction, "status": status, "feedback": per_type}
        self.grounding_per_step.append(record)
        for ftype in FEEDBACK_TYPES:
            if per_type[ftype] is not None:
                self.stacked_grounding[ftype].append(stacked_entry(step_id, status, per_type[ftype]))
        return copy.deepcopy(record)

    def _normalise_feedback(self, step_id: int, feedback: Any) -> dict[str, str | None]:
        if feedback is None:
            return {t: None for t in FEEDBACK_TYPES}
        if isinstance(feedback, str):
            feedback = [feedback]
        if isinstance(feedback, Sequence):
            try:
                return feedback_from_lines(feedback, self.unknown_type, where=f"step {step_id}")
            except ValueError as exc:
                raise GroundingError(str(exc)) from exc
        if not isinstance(feedback, Mapping):
            raise GroundingError(f"step {step_id}: feedback={feedback!r}: expected a dict of the four types or lines")
        out: dict[str, str | None] = {t: None for t in FEEDBACK_TYPES}
        extra: list[str] = []
        for key, text in feedback.items():
            if text is not None and not isinstance(text, str):
                raise GroundingError(f"step {step_id}: feedback[{key!r}]={text!r}: expected a string or None")
            text = text.strip() if text else None
            if key in FEEDBACK_TYPES:
                out[key] = text or None
            elif text:
                if self.unknown_type == "reject":
                    raise GroundingError(f"step {step_id}: unknown feedback type {key!r}: expected one of "
                                         f"{' | '.join(FEEDBACK_TYPES)} (grounding.unknown_type=reject)")
                log.warning("step %s: unknown feedback type %r kept under 'general' (grounding.unknown_type=keep)",
                            step_id, key)
                extra.append(f"{key}: {text}")
        if extra:
            out["general"] = "; ".join(([out["general"]] if out["general"] else []) + extra)
        return out

    def get_stacked_grounding(self) -> dict[str, list[str]]:
        """The stacked grounding of this episode: ``{type: ["[ StepN - Status ] : text", ...]}``."""
        return copy.deepcopy(self.stacked_grounding)

    def generate_final_grounding(self, generator: str = "extractive", *, generate: Callable[[str], str] | None = None,
                                 timestamp: str | None = None) -> dict:
        """Seed 000's ``_generate_grounding_from_episode``: this episode's feedback only.

        Records which generator ran (and why the llm one fell back) in ``expr_info``.
        """
        final, info = generate_grounding(self.get_stacked_grounding(), generator, generate=generate,
                                         timestamp=timestamp)
        self.expr_info.update(info)
        return final

    def save_final_grounding(self, final_grounding: Mapping[str, Any]) -> list[Path]:
        """Store ``final_grounding`` and, with ``out_dir``, write the episode and latest files.

        Returns:
            The paths written (empty without ``out_dir``).

        Raises:
            GroundingError: ``final_grounding`` lacks a key or a content is not a string.
        """
        self.final_grounding = validate_final_grounding(final_grounding, "final_grounding")
        if self.out_dir is None:
            return []
        doc = self.to_dict()
        paths = write_grounding_files(doc, self.out_dir, self.save_format)
        for d in self.latest_dirs:
            paths += write_latest_files(doc, d, self.save_format)
        return paths

    def to_dict(self) -> dict:
        """The episode's grounding document, keys in seed 000's order."""
        doc = {
            "expr_info": copy.deepcopy(self.expr_info),
            "grounding_per_step": copy.deepcopy(self.grounding_per_step),
            "stacked_grounding": self.get_stacked_grounding(),
        }
        if self.final_grounding is not None:
            doc["final_grounding"] = copy.deepcopy(self.final_grounding)
        return doc


def validate_final_grounding(final: Any, where: str) -> dict:
    """Check and copy a ``final_grounding`` dict into seed 000's key order."""
    if not isinstance(final, Mapping):
        raise GroundingError(f"{where}: expected a dict, got {type(final).__name__}")
    out: dict[str, Any] = {"generation_timestamp": final.get("generation_timestamp")}
    for key in FINAL_KEYS.values():
        item = final.get(key)
        if not isinstance(item, Mapping) or not isinstance(item.get("content"), str):
            raise GroundingError(f"{where}.{key}: expected {{\"content\": <string>}}, got {item!r}")
        out[key] = {"content": item["content"]}
    return out
