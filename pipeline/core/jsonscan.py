"""The one JSON scanner: JSON objects embedded in free text (model answers, prose, fences).

Built on the standard library's :meth:`json.JSONDecoder.raw_decode` rather than a
brace counter of our own: the decoder already knows strings, escapes and nesting.

    >>> [obj for _, _, obj in iter_json_objects('think... {"action": "look"} then {"a": 1}')]
    [{'action': 'look'}, {'a': 1}]
    >>> first_json_object('no json here') is None
    True
"""

from __future__ import annotations

import json
from typing import Any, Iterator

_STRICT = json.JSONDecoder()
_LENIENT = json.JSONDecoder(strict=False)  # control characters allowed inside strings


def iter_json_objects(text: str, *, nested: bool = False, strict: bool = True,
                      stop_at_unclosed: bool = False) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(start, end, obj)`` for each JSON object that starts at a ``{`` of ``text``.

    Args:
        text: free text.
        nested: also yield objects inside an object already yielded (scanning resumes at
            the next ``{``); by default scanning resumes after the object's end.
        strict: reject raw control characters (newlines, tabs) inside JSON strings.
        stop_at_unclosed: stop at a ``{`` that no ``}`` ever closes (braces counted
            outside JSON strings, escape-aware) instead of trying the ``{`` after it: a
            truncated answer ``{"a": {"b": 1}`` then yields nothing rather than its inner
            object (the prompts' memory/action parser relies on this).

    A ``{`` at which no object parses is skipped; ``end`` is exclusive.
    """
    decoder = _STRICT if strict else _LENIENT
    pos = text.find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            if stop_at_unclosed and not _closes(text, pos):
                return
            pos = text.find("{", pos + 1)
            continue
        yield pos, end, obj
        pos = text.find("{", pos + 1 if nested else end)


def first_json_object(text: str, *, strict: bool = True,
                      stop_at_unclosed: bool = False) -> tuple[int, int, dict] | None:
    """``(start, end, obj)`` of the first JSON object in ``text``, or None (arguments as
    :func:`iter_json_objects`)."""
    for start, end, obj in iter_json_objects(text, strict=strict, stop_at_unclosed=stop_at_unclosed):
        if isinstance(obj, dict):
            return start, end, obj
    return None


def _closes(text: str, start: int) -> bool:
    """Whether the ``{`` at ``start`` is balanced by a later ``}`` (braces inside JSON
    strings not counted, backslash escapes honoured)."""
    depth, in_str, esc = 0, False, False
    for j in range(start, len(text)):
        c = text[j]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return True
    return False
