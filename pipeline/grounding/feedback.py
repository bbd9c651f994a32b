"""Typed user feedback lines (seed 000): ``feedback : <type>: <text>``.

A person (or the simulated user of :mod:`pipeline.envs.household.user`) comments on a step with one
line per remark; the type is one of :data:`pipeline.core.schemas.FEEDBACK_TYPES`::

    >>> parse_feedback_line("Feedback :  Spatial: Key_1 is on Table_0 in the Kitchen.")
    ('spatial', 'Key_1 is on Table_0 in the Kitchen.')
    >>> format_feedback_line("procedural", "Open Cabinet_0 before taking things from it.")
    'feedback : procedural: Open Cabinet_0 before taking things from it.'
    >>> classify_feedback_lines(["feedback : spatial: a", "feedback : spatial: b"])["spatial"]
    'a; b'

The prefix and the type are matched case- and space-insensitively (``User Preference``,
``user-preference`` and ``user_preference`` are the same type; a full-width colon ``：``
counts as a colon because Korean/Chinese keyboards produce it); the text is kept as
written (UTF-8). Unknown types follow ``grounding.unknown_type``: ``keep`` files the line
under ``general`` with a warning naming it, ``reject`` raises :class:`UnknownFeedbackType`.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable

from pipeline.core.conf_schema import UnknownFeedback
from pipeline.core.schemas import FEEDBACK_TYPES

log = logging.getLogger(__name__)

# The type may contain letters, digits, spaces, '_' and '-', never a colon, so the first
# colon after it ends the type and any later colon belongs to the text.
_LINE_RE = re.compile(r"^\s*feedback\s*[:：]\s*([^:：]*?)\s*[:：]\s*(.*?)\s*$", re.IGNORECASE | re.DOTALL)
_TYPE_RE = re.compile(r"^[\w\- ]+$")


class FeedbackFormatError(ValueError):
    """A line that is not ``feedback : <type>: <text>`` (the message quotes the line)."""


class UnknownFeedbackType(FeedbackFormatError):
    """A well-formed line whose type is not one of the four (with ``unknown=reject``)."""


def _normalise_type(raw: str) -> str:
    return re.sub(r"[\s\-]+", "_", raw.strip().lower())


def _check_policy(unknown: str) -> str:
    value = str(unknown) if isinstance(unknown, str) else unknown  # a conf_schema StrEnum -> its value
    if value not in {m.value for m in UnknownFeedback}:
        raise ValueError(f"grounding.unknown_type={value!r}: expected one of {', '.join(UnknownFeedback)}")
    return value


def parse_feedback_line(line: str, unknown: str = "reject", where: str = "") -> tuple[str, str]:
    """Split one feedback line into ``(type, text)``.

    Args:
        line: ``feedback : <type>: <text>``; surrounding whitespace is ignored.
        unknown: ``reject`` (default: raise :class:`UnknownFeedbackType`) or ``keep``
            (log a warning and return ``("general", "<raw type>: <text>")``).
        where: optional location put in front of error messages (``file.jsonl:3``).

    Returns:
        The normalised type (one of ``FEEDBACK_TYPES``) and the text as written.

    Raises:
        FeedbackFormatError: the line does not have the format, or its text is empty.
        UnknownFeedbackType: the type is not one of the four and ``unknown="reject"``.
    """
    policy = _check_policy(unknown)
    at = f"{where}: " if where else ""
    if not isinstance(line, str):
        raise FeedbackFormatError(f"{at}feedback line {line!r}: expected a string 'feedback : <type>: <text>'")
    m = _LINE_RE.match(line)
    if m is None or not m.group(1) or not _TYPE_RE.match(m.group(1)):
        raise FeedbackFormatError(f"{at}malformed feedback line {line!r}: expected 'feedback : <type>: <text>' "
                                  f"with type in {' | '.join(FEEDBACK_TYPES)}")
    raw_type, text = m.group(1), m.group(2)
    if not text:
        raise FeedbackFormatError(f"{at}feedback line {line!r} has an empty text")
    ftype = _normalise_type(raw_type)
    if ftype in FEEDBACK_TYPES:
        return ftype, text
    if policy == "reject":
        raise UnknownFeedbackType(f"{at}feedback line {line!r}: unknown type {raw_type!r}, expected one of "
                                  f"{' | '.join(FEEDBACK_TYPES)} (grounding.unknown_type=reject)")
    # Keep the raw type in the text: it is the only trace of what the person meant.
    log.warning("%sfeedback line %r: unknown type %r kept under 'general' (grounding.unknown_type=keep)",
                at, line, raw_type)
    return "general", f"{raw_type.strip()}: {text}"


def format_feedback_line(ftype: str, text: str) -> str:
    """The canonical line for one remark: ``feedback : <type>: <text>``.

    Whitespace runs (newlines included) in ``text`` become single spaces so that the
    line stays one line.

    Raises:
        ValueError: ``ftype`` is not one of ``FEEDBACK_TYPES`` or ``text`` is empty.
    """
    norm = _normalise_type(ftype)
    if norm not in FEEDBACK_TYPES:
        raise ValueError(f"feedback type {ftype!r}: expected one of {' | '.join(FEEDBACK_TYPES)}")
    flat = " ".join(str(text).split())
    if not flat:
        raise ValueError(f"feedback text for type {norm!r} is empty")
    return f"feedback : {norm}: {flat}"


def classify_feedback_lines(lines: Iterable[str], unknown: str = "keep", where: str = "") -> dict[str, str | None]:
    """Group feedback lines by type, as ``append_step_feedback`` expects (seed 000).

    Args:
        lines: raw feedback lines; blank lines are skipped (a step without a remark).
        unknown: ``keep`` (default) or ``reject``, see :func:`parse_feedback_line`.
        where: optional location for error messages.

    Returns:
        ``{type: text or None}`` with all four types as keys, in ``FEEDBACK_TYPES``
        order; several lines of one type are joined with ``"; "`` in their order.
    """
    grouped: dict[str, list[str]] = {t: [] for t in FEEDBACK_TYPES}
    for line in lines:
        if isinstance(line, str) and not line.strip():
            continue
        ftype, text = parse_feedback_line(line, unknown=unknown, where=where)
        grouped[ftype].append(text)
    return {t: ("; ".join(v) if v else None) for t, v in grouped.items()}
