"""Admissible-only actions for a local model: the token masks of ``agent.decoding``.

Three decodings (``agent.decoding``: :class:`pipeline.core.conf_schema.Decoding`):

``free``
    the model writes its reasoning line and JSON action unconstrained (an inadmissible
    action is a recorded failed step).
``constrained``
    a free reasoning line (at most ``agent.reasoning_max_tokens`` tokens, no ``{``),
    then the JSON action generated under a mask that admits only the admissible
    actions' JSON texts: ``{"action": "take", "target": "Apple_2"`` followed by ``}`` or
    by ``, "memory": `` and the model's own memory notes (unconstrained from there).
``choice``
    the same reasoning line, then every admissible action's complete JSON text scored
    by its summed token log-probability in batched forwards over the cached prompt; the
    best one is the action, the scores are stored with the turn.

The mask is a character-level prefix constraint over those texts (:class:`ActionConstraint`),
evaluated against a table of every token's text (:class:`TokenTexts`): a token is allowed
when the text so far plus its text is still a prefix of some admissible text, or runs
past the end of one. It works with any tokenizer, for any split of a name into tokens
(``Cup`` + ``_3`` or ``Cup_3``), and an action whose text is a prefix of another's
(``take Apple_1`` / ``take Apple_1 from Table_0``) is decided by the characters that
follow, never by the tokenizer.

Why not a grammar engine (llguidance, xgrammar, lm-format-enforcer): the constraint here is
a finite set of literal strings that changes every turn. A grammar engine compiles a
grammar (and a tokenizer trie) per set, then walks it per token; for 10-60 literals of
~45 characters this table lookup costs well under a millisecond per token and needs no
per-turn compilation. ``python -m benchmarks --only constrain`` measures it against
llguidance (the engine vLLM and SGLang use) on the same prompts.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pipeline.core.schemas import clean_action

DECODINGS = ("free", "constrained", "choice")

# What may follow an action's fields: the object closes, or the model adds its memory
# notes (the prompt's own answer format, conf/templates/system_*.txt).
CLOSE = "}"
JSON_START = '{"action": "'  # how every action's JSON text starts
MEMORY_OPEN = ', "memory": '


def action_texts(admissible: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """The JSON texts that name each admissible action, without the closing brace.

    Returns:
        ``(fields_text, index)`` pairs: ``index`` into ``admissible``. Fields in
        :func:`clean_action`'s order, ``json.dumps`` spacing (the format the prompt
        shows); ``go_to`` also by the direction of its command (``{"action": "go_to",
        "target": "south"``: what the env and the agent's parser accept). The first
        action keeps a text two actions share.
    """
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    for i, a in enumerate(admissible):
        if not a.get("action"):
            continue
        forms = [clean_action(a)]
        cmd = str(a.get("command") or "").split()
        if a.get("action") == "go_to" and len(cmd) == 2 and cmd[0] == "go":
            forms.append({"action": "go_to", "target": cmd[1]})
        for f in forms:
            text = json.dumps(f, ensure_ascii=False)[:-1]
            if text not in seen:
                seen.add(text)
                out.append((text, i))
    return out


class TokenTexts:
    """Every token's text as it reads after other text, indexed for prefix lookups.

    A token's text is decoded after an anchor (``decode(anchor + [id])`` minus
    ``decode(anchor)``), so SentencePiece's leading space is kept. Special tokens and
    tokens that end inside a UTF-8 character (partial bytes) have no text here: the
    constraint never allows them.
    """

    def __init__(self, tokenizer: Any, vocab_size: int | None = None):
        known = len(tokenizer)
        n = max(int(vocab_size or known), known)  # a model may pad its vocabulary past the tokenizer's
        anchor = list(tokenizer("a", add_special_tokens=False)["input_ids"])
        backend = getattr(tokenizer, "backend_tokenizer", None)
        seqs = [anchor + [i] for i in range(known)]
        if backend is not None:
            base = backend.decode(anchor, skip_special_tokens=True)
            full = backend.decode_batch(seqs, skip_special_tokens=True)
        else:
            base = tokenizer.decode(anchor, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            full = [tokenizer.decode(s, skip_special_tokens=True, clean_up_tokenization_spaces=False) for s in seqs]
        self.texts: list[str] = []
        for t in full:
            piece = t[len(base):] if t.startswith(base) else ""
            self.texts.append("" if "\ufffd" in piece else piece)
        self.texts += [""] * (n - known)
        self.by_text: dict[str, list[int]] = {}
        for i, t in enumerate(self.texts):
            if t:
                self.by_text.setdefault(t, []).append(i)
        self.sorted_texts = sorted(self.by_text)
        self.vocab_size = n

    def prefixes_of(self, s: str) -> list[int]:
        """Ids whose text is a non-empty prefix of ``s``."""
        out: list[int] = []
        for k in range(1, len(s) + 1):
            ids = self.by_text.get(s[:k])
            if ids:
                out.extend(ids)
        return out

    def starting_with(self, s: str) -> list[int]:
        """Ids whose text starts with ``s`` and is longer than it."""
        out: list[int] = []
        lo = bisect.bisect_right(self.sorted_texts, s)
        for t in self.sorted_texts[lo:]:
            if not t.startswith(s):
                break
            out.extend(self.by_text[t])
        return out

    def line_tokens(self) -> tuple[list[bool], list[tuple[int, str]]]:
        """The reasoning line's tokens: ``(inside, enders)``.

        ``inside``: per token, True when it has text and neither ``{`` nor a newline (the
        JSON comes after the line; EOS and special tokens have no text). ``enders``: the
        ``(id, after)`` of tokens that end the line: a newline with no ``{`` before it;
        ``after`` is the text past the newline (byte-level BPE vocabularies merge
        ``\\n{"action": "go_to", "target": "west`` into one token).
        """
        inside, enders = [], []
        for i, t in enumerate(self.texts):
            inside.append(bool(t) and "{" not in t and "\n" not in t)
            if "\n" in t:
                before, after = t.split("\n", 1)
                if "{" not in before:
                    enders.append((i, after))
        return inside, enders


@dataclass
class Target:
    text: str  # the full literal the constraint must produce
    index: int  # the admissible action it names


class ActionConstraint:
    """One turn's JSON action, constrained to the admissible actions' texts.

    Args:
        texts: the tokenizer's :class:`TokenTexts`.
        admissible: the admissible action dicts.
        lead: text forced before the JSON (``"\\n"`` when the reasoning line was cut off).
    """

    def __init__(self, texts: TokenTexts, admissible: Sequence[Mapping[str, Any]], lead: str = ""):
        self.tok = texts
        self.targets = [Target(lead + fields + tail, i)
                        for fields, i in action_texts(admissible) for tail in (CLOSE, MEMORY_OPEN)]
        # The texts sorted and as a set: `accepts` asks "a prefix of a target, or past one?" with
        # a bisection and a set look-up per prefix instead of a scan of every target (it runs
        # for every line-ending token of the vocabulary at each turn's start).
        self._sorted = sorted({t.text for t in self.targets})
        self._texts = frozenset(self._sorted)
        self.consumed = ""
        self.chosen: int | None = None  # the admissible index, once a target is complete

    @property
    def done(self) -> bool:
        return self.chosen is not None

    def accepts(self, piece: str) -> bool:
        """Could ``piece`` come next: still a prefix of a target, or past the end of one?"""
        s = self.consumed + piece
        i = bisect.bisect_left(self._sorted, s)  # the first target >= s starts with s if any does
        if i < len(self._sorted) and self._sorted[i].startswith(s):
            return True
        return any(s[:k] in self._texts for k in range(1, len(s)))  # a target is a proper prefix of s

    def accepts_first(self, pieces: Sequence[str]) -> list[bool]:
        """:meth:`accepts` of each of ``pieces`` before anything is consumed, answered together
        (each turn's start asks it of every line-ending token of the vocabulary): a piece is a
        prefix of a target exactly when it is in the set of the targets' prefixes of its length,
        and a target is a proper prefix of it only if that target is shorter than it."""
        if self.consumed:
            return [self.accepts(p) for p in pieces]
        lengths = {len(p) for p in pieces}
        heads = {t[:k] for t in self._sorted for k in lengths if k <= len(t)}
        longest = max(lengths, default=0)
        short = [t for t in self._sorted if 0 < len(t) < longest]
        return [p in heads or any(len(t) < len(p) and p.startswith(t) for t in short) for p in pieces]

    def allowed(self) -> list[int]:
        """The token ids allowed next (empty when no admissible action remains)."""
        s = self.consumed
        ids: set[int] = set()
        rests = {t.text[len(s):] for t in self.targets if t.text.startswith(s)}
        for r in rests:
            ids.update(self.tok.prefixes_of(r))
            ids.update(self.tok.starting_with(r))
        return sorted(ids)

    def advance(self, piece: str) -> None:
        """Consume a generated token's text; a completed target fixes :attr:`chosen`."""
        if self.done:
            return
        self.consumed += piece
        s = self.consumed
        for t in self.targets:
            if s.startswith(t.text):
                self.chosen = t.index
                return
        if not any(t.text.startswith(s) for t in self.targets):
            raise ValueError(f"constrained decoding left the admissible texts: {s!r}")


def choice_texts(admissible: Sequence[Mapping[str, Any]], lead: str = "") -> list[tuple[str, int]]:
    """The texts ``choice`` decoding scores: ``lead`` (the end of the reasoning line), then
    every action's JSON, closed by ``}`` and, for models that write memory notes, followed
    by ``, "memory"`` (an action's score is the better of its forms)."""
    return [(lead + fields + tail, i) for fields, i in action_texts(admissible) for tail in (CLOSE, ', "memory"')]
