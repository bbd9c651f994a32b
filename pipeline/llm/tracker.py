"""Streaming tracking of the JSON action while tokens are generated (seed 003, made correct).

Seed 003 finds the action by decoding each token *in isolation* and counting ``{`` /
``}``. That breaks on real tokenizers: byte-level BPE tokens can be partial UTF-8 (an
isolated decode gives U+FFFD), one token can merge a brace with other characters
(``{"``, ``"}``, ``}}``), and braces inside JSON strings must not count. Here every new
token is decoded *in the context of the sequence* (:class:`IncrementalDecoder`), the
characters it adds are scanned by an escape-aware brace counter
(:class:`JsonActionTracker`), and the token that closes the first top-level JSON object
ends generation for that sequence. When the stream finds no closed object (prose with a
stray brace that never balances), seed 003's backup, a string search over the whole
text (:func:`find_json_object`), runs after generation; the turn records which method
found the span::

    stream = ActionStream(tokenizer)
    for token_id in generated:            # inside the generation loop
        if stream.push(token_id):         # True once the JSON object has closed
            break                         # early stop
    turn = stream.finish("json_closed")   # TrackedTurn: ids, mask, start/end, method

``decode(turn.generated_ids[turn.action_token_mask])`` contains ``turn.action_text``
exactly, and dropping the first or the last masked token loses part of it.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from pipeline.core.jsonscan import first_json_object

REPLACEMENT = "\ufffd"  # what a decoder writes for incomplete UTF-8
_WHITESPACE = " \t\r\n"

TRACKING_METHODS = ("stream", "fallback", "none")
STOP_REASONS = ("json_closed", "max_new_tokens", "eos", "error")


def decode_fn(tokenizer: Any) -> Callable[[list[int]], str]:
    """A ``ids -> text`` function that skips special tokens and never cleans up spaces.

    Fast tokenizers are decoded by their Rust tokenizer directly (no Python overhead per
    token); others through ``tokenizer.decode``. ``clean_up_tokenization_spaces`` is off
    so that the text of a token span never depends on its neighbours.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


class IncrementalDecoder:
    """The text each new token adds, decoded in the context of the sequence.

    Keeps a small window of recent tokens (as vLLM/TGI detokenizers do): the new text is
    ``decode(window + token) - decode(window)``, so SentencePiece's leading-space rule and
    byte-level BPE merges are handled. A token that ends inside a multi-byte UTF-8
    character adds only the complete characters; the rest comes with the token that
    completes it. A brace (ASCII) is therefore attributed to the token holding its byte.
    """

    def __init__(self, tokenizer: Any):
        self._decode = decode_fn(tokenizer)
        self.ids: list[int] = []
        self._prefix = 0  # window start (context for the next decode)
        self._read = 0  # tokens up to here have had all their text emitted
        self._prefix_text = ""  # decode(ids[_prefix:_read])
        self._emitted = 0  # chars emitted past _prefix_text while a character was incomplete

    def push(self, token_id: int) -> str:
        """Append one token id and return the text it adds ("" while UTF-8 is incomplete)."""
        self.ids.append(int(token_id))
        full = self._decode(self.ids[self._prefix :])
        stable = full.rstrip(REPLACEMENT)
        start = len(self._prefix_text) + self._emitted
        piece = stable[start:] if len(stable) > start else ""
        if len(stable) != len(full):  # an incomplete character at the end: hold it back
            self._emitted += len(piece)
        else:
            self._commit()
        return piece

    def flush(self) -> str:
        """Text still held back at the end of generation (incomplete UTF-8, as U+FFFD)."""
        full = self._decode(self.ids[self._prefix :])
        start = len(self._prefix_text) + self._emitted
        piece = full[start:] if len(full) > start else ""
        self._commit()
        return piece

    def _commit(self) -> None:
        self._prefix, self._read, self._emitted = self._read, len(self.ids), 0
        self._prefix_text = self._decode(self.ids[self._prefix : self._read])


class JsonActionTracker:
    """Escape-aware brace counter over token texts; finds the first top-level JSON object.

    Fed one token's text at a time. Outside a candidate object everything is prose and
    ignored (quotes included). A ``{`` opens a candidate; inside it, quotes toggle string
    mode (with backslash escapes), braces in strings do not count, and the ``}`` that brings
    the depth back to zero closes it. A candidate whose first non-blank character is not
    ``"`` or ``}`` is prose (``{braces}``, ``{ note``) and is dropped at once; a closed
    candidate that does not parse as a JSON object is dropped too (``require_valid``), and
    scanning resumes just after its opening brace.
    """

    def __init__(self, *, require_valid: bool = True):
        self.require_valid = require_valid
        self.text = ""  # all text fed so far
        self.piece_starts: list[int] = []  # char offset in `text` where each token's text starts
        self.closed = False
        self.start_char: int | None = None  # [start_char, end_char) of the object in `text`
        self.end_char: int | None = None
        self._pos = 0  # next char to scan
        self._cand: int | None = None  # char offset of the candidate's opening brace
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._first = False  # waiting for the first significant char after the opening brace

    @property
    def num_tokens(self) -> int:
        return len(self.piece_starts)

    def feed(self, piece: str) -> bool:
        """Add the text of one new token; True once the JSON object has closed."""
        self.piece_starts.append(len(self.text))
        return self.extend_last(piece)

    def extend_last(self, piece: str) -> bool:
        """Add text to the last token (text a decoder held back until the end)."""
        self.text += piece
        if not self.closed:
            self._scan()
        return self.closed

    def _scan(self) -> None:
        text, i, n = self.text, self._pos, len(self.text)
        while i < n:
            ch = text[i]
            if self._cand is None:
                if ch == "{":
                    self._cand, self._depth, self._in_string, self._escape, self._first = i, 1, False, False, True
                i += 1
                continue
            if self._first:
                if ch in _WHITESPACE:
                    i += 1
                    continue
                self._first = False
                if ch not in '"}':  # `{braces}` in prose: not a JSON object
                    i, self._cand = self._cand + 1, None
                    continue
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch == "{":
                self._depth += 1
            elif ch == "}":
                self._depth -= 1
                if self._depth == 0:
                    if not self.require_valid or _is_json_object(text[self._cand : i + 1]):
                        self.closed, self.start_char, self.end_char = True, self._cand, i + 1
                        self._pos = i + 1
                        return
                    i, self._cand = self._cand + 1, None  # not JSON: look again after its brace
                    continue
            i += 1
        self._pos = i

    def token_of_char(self, offset: int) -> int:
        """Index of the token whose text holds character ``offset`` of :attr:`text`."""
        # The last token starting at or before `offset` (tokens with empty text share a
        # start with the next one, which is the one that emitted the character).
        return bisect.bisect_right(self.piece_starts, offset) - 1


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text, strict=False), dict)
    except ValueError:
        return False


def find_json_object(text: str) -> tuple[int, int, dict] | None:
    """Seed 003's backup: the first ``{`` at which a whole JSON object parses.

    Raw control characters inside strings are accepted (models put raw newlines in
    strings); the scanning is :func:`pipeline.core.jsonscan.first_json_object`'s.

    Returns ``(start_char, end_char, obj)`` (end exclusive) or None.
    """
    return first_json_object(text, strict=False)


def action_text_from_text(text: str) -> str | None:
    """The JSON action of a generated text by the tracker's rules (stream, else fallback).

    Recomputes from the stored ``generated_text`` what tracking found token by token, so
    a turn's mask can be checked against it.
    """
    tracker = JsonActionTracker()
    tracker.feed(text)
    if tracker.closed:
        return text[tracker.start_char:tracker.end_char]
    found = find_json_object(text)
    return text[found[0]:found[1]] if found else None


@dataclass
class TrackedTurn:
    """What tracking stores per turn (see ``TURN_SCHEMA`` and the per-episode ``.pt``)."""

    generated_ids: list[int]  # every generated token id, EOS included (empty if unknown)
    action_token_mask: list[bool]  # one per generated token: part of the JSON action
    action_token_start_index: int | None  # first masked token
    action_token_end_index: int | None  # one past the last masked token
    tracking_method: str  # stream | fallback | none
    stop_reason: str  # json_closed | max_new_tokens | eos | error
    text: str  # the generated text (special tokens skipped)
    action_text: str | None  # the JSON object's text, exactly as generated
    logprobs: list[float] | None = None  # per generated token, when known
    num_tokens: int = 0  # generated tokens (== len(action_token_mask))
    extra: dict = field(default_factory=dict)


def token_mask(num_tokens: int, start: int | None, end: int | None) -> list[bool]:
    """Boolean mask with ``True`` on ``[start, end)``."""
    if start is None or end is None:
        return [False] * num_tokens
    return [start <= i < end for i in range(num_tokens)]


class ActionStream:
    """One generated sequence: token ids (or token texts) in, the JSON action's span out.

    Args:
        tokenizer: decodes ids incrementally; None when the caller gives each token's
            text itself (an API that returns token bytes but no tokenizer).
        require_valid: only a span that parses as a JSON object closes the stream.
    """

    def __init__(self, tokenizer: Any = None, *, require_valid: bool = True):
        self.decoder = IncrementalDecoder(tokenizer) if tokenizer is not None else None
        self.tracker = JsonActionTracker(require_valid=require_valid)
        self.ids: list[int] = []
        self.logprobs: list[float] = []

    @property
    def closed(self) -> bool:
        return self.tracker.closed

    @property
    def num_tokens(self) -> int:
        return self.tracker.num_tokens

    def push(self, token_id: int | None, piece: str | None = None, logprob: float | None = None) -> bool:
        """Add one generated token; True once the JSON action has closed (stop now)."""
        if token_id is not None:
            self.ids.append(int(token_id))
        if piece is None:
            if self.decoder is None:
                raise ValueError("ActionStream without a tokenizer needs each token's text (piece=...)")
            piece = self.decoder.push(int(token_id))  # type: ignore[arg-type]
        if logprob is not None:
            self.logprobs.append(float(logprob))
        return self.tracker.feed(piece)

    def finish(self, stop_reason: str) -> TrackedTurn:
        """Close the stream: locate the action (stream, else fallback search) and build the turn."""
        tr = self.tracker
        if self.decoder is not None and tr.num_tokens:
            tail = self.decoder.flush()
            if tail:
                tr.extend_last(tail)
        n = tr.num_tokens
        method, start, end, action_text = "none", None, None, None
        if tr.closed:
            method = "stream"
            a, b = tr.start_char, tr.end_char
        else:
            found = find_json_object(tr.text)
            a, b = (found[0], found[1]) if found else (None, None)
            if found:
                method = "fallback"
        if a is not None and b is not None and n:
            start, end = tr.token_of_char(a), tr.token_of_char(b - 1) + 1
            action_text = tr.text[a:b]
        return TrackedTurn(
            generated_ids=list(self.ids),
            action_token_mask=token_mask(n, start, end),
            action_token_start_index=start,
            action_token_end_index=end,
            tracking_method=method,
            stop_reason=stop_reason,
            text=tr.text,
            action_text=action_text,
            logprobs=list(self.logprobs) if self.logprobs and len(self.logprobs) == n else None,
            num_tokens=n,
        )


def track_ids(tokenizer: Any, ids: Iterable[int], stop_reason: str = "max_new_tokens", *,
              early_stop: bool = False, require_valid: bool = True) -> TrackedTurn:
    """Run the streaming tracker over an already generated id sequence (tests, re-checks).

    With ``early_stop`` the sequence is cut where generation would have stopped.
    """
    stream = ActionStream(tokenizer, require_valid=require_valid)
    for tid in ids:
        if stream.push(tid) and early_stop:
            return stream.finish("json_closed")
    return stream.finish(stop_reason)
