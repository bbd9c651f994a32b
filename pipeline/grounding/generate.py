"""``final_grounding`` from one episode's stacked grounding: extractive or by a model (seed 000).

:func:`generate_grounding` makes the four contents of seed 000's ``final_grounding``
from *this episode's* feedback only: ``extractive`` splits the stacked entries into
statements (deterministic), ``llm`` asks a text-generation backend and falls back to
the extractive result, recording why, when the answer is unusable (empty, a refusal, no
grounding JSON in it, or cut off at ``grounding.max_new_tokens``: :class:`AnswerTruncated`)
or the call failed (:class:`GenerationFailed`: a request that still failed after the
backend's retries, :func:`pipeline.grounding.episodes.make_generate`). A configuration error
(a wrong key, HTTP 401/403/404: a ``ConfigError``) or any other exception (a programming
error) is never hidden behind the extractive result: it propagates and stops the stage. How
many episodes may fall back, for an unusable answer or a failed call alike, is
``grounding.max_error_fraction`` (:func:`pipeline.grounding.episodes.check_backend_fallbacks`).
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipeline.core.conf_schema import GroundingGenerator
from pipeline.core.jsonscan import iter_json_objects
from pipeline.core.schemas import FEEDBACK_TYPES
from pipeline.grounding.common import (
    FINAL_KEYS,
    TERMINAL,
    GroundingError,
    check_choice,
    fact_key,
    strip_step_prefix,
)

# The fallback_reason prefixes of an episode the model was asked for and whose grounding fell back:
# its call failed, its answer held no usable grounding JSON (empty, a refusal, ...), or its answer
# was cut off at grounding.max_new_tokens. Each is a failure of the llm generator, counted against
# grounding.max_error_fraction (pipeline.grounding.episodes.check_backend_fallbacks).
BACKEND_ERROR = "backend error"
UNPARSEABLE = "unparseable answer"
TRUNCATED = "truncated answer"
FAILURES = (BACKEND_ERROR, UNPARSEABLE, TRUNCATED)


class GenerationFailed(GroundingError):
    """A text-generation call failed for this episode (after the backend's retries): its grounding
    falls back to the extractive one, counted against ``grounding.max_error_fraction``."""


class AnswerTruncated(GroundingError):
    """The model's answer stopped at its token budget (``grounding.max_new_tokens``; a server's
    ``finish_reason=length``): unusable whatever it holds, it falls back to the extractive grounding,
    counted against ``grounding.max_error_fraction``."""

# A statement ends at . ! ? (followed by a space or the end), at a CJK full stop (Chinese
# does not put a space after it), or at a semicolon (how several lines of one type are joined);
# a parenthesis right after a stop belongs to the statement before it ("use. (Fridge_0 ...)").
_SPLIT_RE = re.compile(r"(?<=[.!?])\s+(?![(\[（])|(?<=[。！？])\s*(?![(\[（])|\s*[;；]\s*")
_CLOSERS = ")]}\"'）」』”’"


def grounding_timestamp(config_value: str | None = None) -> str:
    """The ``generation_timestamp``: ``SOURCE_DATE_EPOCH`` when set, else the config value.

    Never the wall clock, so that reruns write identical files (reproducible-builds
    convention: ``SOURCE_DATE_EPOCH`` is seconds since the epoch, UTC).

    Raises:
        GroundingError: ``SOURCE_DATE_EPOCH`` is not an integer, or the config value is
            not an ISO 8601 date-time.
    """
    env = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if env:
        try:
            return datetime.fromtimestamp(int(env), tz=timezone.utc).isoformat()
        except (ValueError, OverflowError, OSError) as exc:
            raise GroundingError(f"SOURCE_DATE_EPOCH={env!r}: expected an integer number of seconds") from exc
    value = "1970-01-01T00:00:00+00:00" if config_value is None else str(config_value)
    try:
        datetime.fromisoformat(value)
    except ValueError as exc:
        raise GroundingError(f"grounding.timestamp={value!r}: expected an ISO 8601 date-time "
                             "such as 2026-01-27T00:00:00+00:00") from exc
    return value


def _finish_statement(s: str) -> str:
    core = s.rstrip(_CLOSERS)
    if core and core[-1] in TERMINAL:  # "done." and "(not as asked.)" are finished
        return s
    # A CJK sentence ends with a full-width stop; everything else (Korean included) with "."
    return s + ("。" if "\u3040" <= s[-1] <= "\u9fff" else ".")


def extract_statements(entries: Iterable[str]) -> list[str]:
    """Step prefixes stripped, split into statements, duplicates removed (first kept).

    >>> extract_statements(["[ Step1 - Success ] : kitchen is green",
    ...                     "[ Step2 - WiP ] : Kitchen is green.  The fridge is cold"])
    ['kitchen is green.', 'The fridge is cold.']
    """
    seen: set[str] = set()
    out: list[str] = []
    for entry in entries:
        for part in _SPLIT_RE.split(strip_step_prefix(entry)):
            s = " ".join(part.split()).strip(";；")
            if not s.strip(TERMINAL + " "):
                continue
            key = fact_key(s)
            if key not in seen:
                seen.add(key)
                out.append(_finish_statement(s))
    return out


def empty_final_grounding(timestamp: str) -> dict:
    return {"generation_timestamp": timestamp, **{k: {"content": ""} for k in FINAL_KEYS.values()}}


def extractive_final_grounding(stacked: Mapping[str, Sequence[str]], timestamp: str) -> dict:
    """Deterministic grounding: one statement per line and fact, grouped per category."""
    final = empty_final_grounding(timestamp)
    for ftype, key in FINAL_KEYS.items():
        final[key]["content"] = "\n".join(extract_statements(stacked.get(ftype, [])))
    return final


def llm_grounding_prompt(stacked: Mapping[str, Sequence[str]]) -> str:
    """The request sent to the text-generation backend (current episode's feedback only)."""
    feedback = json.dumps({t: list(stacked.get(t, [])) for t in FEEDBACK_TYPES}, ensure_ascii=False, indent=2)
    keys = ", ".join(f'"{k}": "..."' for k in FINAL_KEYS.values())
    return (
        "You turn a user's feedback on an agent's steps in a text game into grounding knowledge "
        "for the agent's next episodes.\n"
        "Feedback of this episode by category (each entry: [ Step<N> - <status> ] : <text>):\n"
        f"{feedback}\n"
        "Answer with one JSON object and nothing else, with these keys, each a string of short, clear "
        "statements (one per line and fact, no step numbers, \"\" when there is nothing):\n"
        f"{{{keys}}}\n"
    )


# Accepted spellings of each final_grounding key in a model's answer.
_KEY_ALIASES: dict[str, str] = {}
for _ftype, _key in FINAL_KEYS.items():
    for _alias in (_key, _ftype, f"{_ftype}s", f"{_ftype}_grounding", f"{_ftype}_rules", f"{_ftype}_grounding_rules"):
        _KEY_ALIASES[_alias] = _key


def parse_llm_grounding(text: str, stacked: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """The four contents from a model's answer, or :class:`GroundingError` with the reason.

    Accepts prose or code fences around the JSON, values as strings, ``{"content": ...}``
    or lists of strings, and short key names (``"spatial"``). A key may be missing only
    when its category had no feedback.
    """
    if not isinstance(text, str) or not text.strip():
        raise GroundingError("the backend returned an empty answer")
    found_object = False
    # Every JSON value starting at a `{`, objects inside others included (prose, fences ignored).
    for _, _, obj in iter_json_objects(text, nested=True, strict=True):
        if not isinstance(obj, dict):
            continue
        found_object = True
        contents: dict[str, str] = {}
        for raw_key, value in obj.items():
            key = _KEY_ALIASES.get(re.sub(r"[\s\-]+", "_", str(raw_key).strip().lower()))
            if key is None:
                continue
            if isinstance(value, Mapping):
                value = value.get("content")
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = "\n".join(v.strip() for v in value if v.strip())
            if value is None:
                value = ""
            if not isinstance(value, str):
                raise GroundingError(f"the answer's {raw_key!r} is a {type(value).__name__}, expected a string")
            contents[key] = value.strip()
        if not contents:
            continue
        missing = [k for t, k in FINAL_KEYS.items() if k not in contents and stacked.get(t)]
        if missing:
            raise GroundingError(f"the answer's JSON lacks {', '.join(missing)}")
        return {k: contents.get(k, "") for k in FINAL_KEYS.values()}
    if found_object:
        raise GroundingError("no JSON object in the answer has grounding keys")
    raise GroundingError("no JSON object in the answer")


def generate_grounding(stacked: Mapping[str, Sequence[str]], generator: str = "extractive", *,
                       generate: Callable[[str], str] | None = None,
                       timestamp: str | None = None) -> tuple[dict, dict]:
    """``final_grounding`` from one episode's stacked grounding, and how it was made.

    Args:
        stacked: the episode's ``stacked_grounding`` (earlier groundings never enter).
        generator: ``extractive`` (deterministic) or ``llm`` (asks ``generate``; an unusable
            answer or a failed call gives the extractive result, the reason recorded).
        generate: the text-generation backend, ``generate(prompt) -> text`` (llm only); it
            raises :class:`GenerationFailed` for a failed call and :class:`AnswerTruncated`
            for an answer cut off at its token budget.
        timestamp: ``generation_timestamp``; see :func:`grounding_timestamp`.

    Returns:
        ``(final_grounding, info)`` with ``info = {"generator", "generator_used",
        "fallback_reason"}`` (the reason is ``None`` when nothing fell back).

    Raises:
        Exception: whatever ``generate`` raised that is no :class:`GenerationFailed`: a
            ``ConfigError`` (a refused key, an unknown model: every episode would fall back
            the same way) or a bug.
    """
    generator = check_choice(generator, GroundingGenerator, "grounding.generator")
    ts = grounding_timestamp(timestamp)
    info: dict[str, Any] = {"generator": generator, "generator_used": "extractive", "fallback_reason": None}
    extractive = extractive_final_grounding(stacked, ts)
    if generator == "extractive":
        return extractive, info
    if not any(stacked.get(t) for t in FEEDBACK_TYPES):
        info["fallback_reason"] = "no feedback in this episode: the backend was not asked"
        return extractive, info
    if generate is None:
        raise GroundingError("grounding.generator=llm needs a text-generation backend (model.name_or_path or "
                             "model.base_url); none was given")
    try:
        answer = generate(llm_grounding_prompt(stacked))
    except GenerationFailed as exc:  # a failed call; anything else (a setting to fix, a bug) propagates
        info["fallback_reason"] = f"{BACKEND_ERROR}: {exc}"
        return extractive, info
    except AnswerTruncated as exc:
        info["fallback_reason"] = f"{TRUNCATED}: {exc}"
        return extractive, info
    try:
        contents = parse_llm_grounding(answer, stacked)
    except GroundingError as exc:
        info["fallback_reason"] = f"{UNPARSEABLE}: {exc}"
        return extractive, info
    final = empty_final_grounding(ts)
    for key, content in contents.items():
        final[key]["content"] = content
    info["generator_used"] = "llm"
    return final, info


def generate_final_grounding(stacked: Mapping[str, Sequence[str]], generator: str = "extractive", *,
                             generate: Callable[[str], str] | None = None, timestamp: str | None = None) -> dict:
    """Only the ``final_grounding`` of :func:`generate_grounding`."""
    return generate_grounding(stacked, generator, generate=generate, timestamp=timestamp)[0]
