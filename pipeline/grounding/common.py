"""What every part of :mod:`pipeline.grounding` shares: names, formats, errors (seed 000).

The ``final_grounding`` keys and section titles, the check of an option value against its
closed set (a ``StrEnum`` of :mod:`pipeline.core.conf_schema`), the joiners of merged
text, the ``[ StepN - Status ] : text`` form of a stacked entry and the error types.
Nothing here reads or writes files.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pipeline.core.io import SAFE_NAME_RE  # noqa: F401 - ids used in file names (the one definition)
from pipeline.core.schemas import FEEDBACK_TYPES

# final_grounding key of each feedback category, in seed 000's order.
FINAL_KEYS: dict[str, str] = {
    "user_preference": "user_preference_grounding",
    "spatial": "spatial_grounding",
    "procedural": "procedural_grounding",
    "general": "general_grounding_rules",
}
# Section titles of the Markdown rendering (H3 before the H3 -> H4 shift).
SECTION_TITLES: dict[str, str] = {
    "user_preference_grounding": "User Preference Grounding",
    "spatial_grounding": "Spatial Grounding",
    "procedural_grounding": "Procedural Grounding",
    "general_grounding_rules": "General Grounding Rules",
}
CONTENT_JOINER = "\n\n"  # between "- <content>" items of one category (seed: "- <c>\n\n- <c>")
TEXT_JOINER = "\n\n---\n\n"  # between TXT files, and between JSON Markdown and TXT text
CONFIGURED_NAME = "configured"  # merge stage: <merged dir>/configured.md = merge of grounding.files

# "[ Step12 - Failure ] : " in front of every stacked entry (seed 000).
_STEP_PREFIX_RE = re.compile(r"^\s*\[\s*Step\s*\d+\s*-\s*(?:Success|Failure|WiP)\s*\]\s*:\s*", re.IGNORECASE)
# Characters that end a statement (ASCII and CJK full-width stops).
TERMINAL = ".!?。！？"


class GroundingError(ValueError):
    """Bad grounding input (status, feedback, config value); the message names it."""


class GroundingMergeError(GroundingError):
    """No usable grounding file among those given (the message names each and why)."""


def check_choice(value: Any, allowed: type[StrEnum], key: str) -> str:
    """``value`` as a plain string when it is one of ``allowed``'s values::

        check_choice(cfg.grounding.save_format, SaveFormat, "grounding.save_format")  # -> "both"
        check_choice("xml", SaveFormat, "grounding.save_format")  # GroundingError: ... json | txt | both

    Args:
        value: a member of ``allowed`` or a plain string (the library functions take both).
        allowed: the closed set (:class:`~pipeline.core.conf_schema.SaveFormat`, ...).
        key: the config key, for the message.

    Raises:
        GroundingError: any other value; the message names ``key`` and the choices.
    """
    v = str(value) if isinstance(value, str) else value
    if v not in {m.value for m in allowed}:
        raise GroundingError(f"{key}={v!r}: expected one of {' | '.join(allowed)}")
    return v


def empty_stacked() -> dict[str, list[str]]:
    return {t: [] for t in FEEDBACK_TYPES}


def stacked_entry(step_id: int, status: str, text: str) -> str:
    """One ``stacked_grounding`` entry: ``[ Step1 - Success ] : kitchen is green``."""
    return f"[ Step{step_id} - {status} ] : {text}"


def strip_step_prefix(entry: str) -> str:
    """``"[ Step1 - Success ] : kitchen is green"`` -> ``"kitchen is green"``."""
    return _STEP_PREFIX_RE.sub("", entry, count=1)


def fact_key(s: str) -> str:
    """What makes two statements the same fact: case, spacing and the final stop ignored."""
    return " ".join(s.casefold().split()).rstrip(TERMINAL + " ")
