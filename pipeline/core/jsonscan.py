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


def iter_json_objects(text: str, *, nested: bool = False, strict: bool = True) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(start, end, obj)`` for each JSON object that starts at a ``{`` of ``text``.

    Args:
        text: free text.
        nested: also yield objects inside an object already yielded (scanning resumes at
            the next ``{``); by default scanning resumes after the object's end.
        strict: reject raw control characters (newlines, tabs) inside JSON strings.

    A ``{`` at which no object parses is skipped; ``end`` is exclusive.
    """
    decoder = _STRICT if strict else _LENIENT
    pos = text.find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            pos = text.find("{", pos + 1)
            continue
        yield pos, end, obj
        pos = text.find("{", pos + 1 if nested else end)


def first_json_object(text: str, *, strict: bool = True) -> tuple[int, int, dict] | None:
    """``(start, end, obj)`` of the first JSON object in ``text``, or None."""
    for start, end, obj in iter_json_objects(text, strict=strict):
        if isinstance(obj, dict):
            return start, end, obj
    return None
