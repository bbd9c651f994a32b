"""The transformers backend's decoding strategies: free, constrained and choice.

Every row of the batched loop (:meth:`TransformersBackend._decode_loop
<pipeline.llm.backends.transformers.TransformersBackend._decode_loop>`) carries a
:class:`Row`: its stream, its phase, its constraint. Each step the loop asks the row's
strategy (``STRATEGIES[row.mode]``) which tokens its reasoning line may use (once, at the
start), which tokens its JSON action may take next, whether it parks, and how its state
moves on with the token it got::

    row = Row("constrained", acts, ActionStream(tokenizer))
    ok = STRATEGIES[row.mode].start(row, texts, enders)  # line-ending tokens allowed

Phases: ``free`` (no mask), ``reason`` (the reasoning line: no ``{``, no EOS),
``json`` (under the row's :class:`ActionConstraint`), ``park`` (choice: waiting before
the token that ends its line, to be scored after the loop).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.llm.constrain import ActionConstraint, TokenTexts
from pipeline.llm.tracker import ActionStream


@dataclasses.dataclass
class Row:
    """One conversation's decoding state in the batched loop."""

    mode: str
    """``free`` | ``constrained`` | ``choice``."""
    acts: list[dict] | None
    """The admissible action dicts (None under ``free``)."""
    stream: ActionStream
    """The tokens so far, tracked (the JSON action, the stop)."""
    phase: str = "free"
    """``free`` | ``reason`` | ``json`` | ``park`` (module docstring)."""
    constraint: ActionConstraint | None = None
    """Constrained rows: the JSON action's constraint."""
    reason: str | None = None
    """The stop reason once the row has finished."""
    reason_tokens: int = 0
    """Tokens of the reasoning line so far."""
    lead: str = "\n"
    """Choice rows: the reasoning line's end every candidate starts with."""
    first_lp: Any = None
    """Choice rows: log-probs (V,) of the first token after the reasoning line."""

    @property
    def strategy(self) -> Free:
        return STRATEGIES[self.mode]


class Free:
    """No constraint: the row stays in phase ``free``; every hook is a no-op."""

    def start(self, row: Row, texts: TokenTexts, enders: list[tuple[int, str]]) -> list[int] | None:
        """Set the row's first phase; the line-ending token ids allowed in its reasoning line
        (None: no reasoning line, every token allowed)."""
        return None

    def parks(self, row: Row, piece: str, reasoning_max: int) -> bool:
        """Before ``piece`` (the token just chosen, in phase ``reason``) is pushed:
        whether the row parks instead (choice)."""
        return False

    def advance(self, row: Row, piece: str, texts: TokenTexts, reasoning_max: int) -> None:
        """After ``piece`` was pushed to a row in phase ``reason`` or ``json``."""

    def allowed(self, row: Row, top: str | None) -> list[int] | None:
        """Phase ``json``: the token ids allowed next, or None when the greedy choice
        ``top`` (None when sampling) is accepted as it is."""
        return None


class Constrained(Free):
    """A reasoning line, then the JSON action under an :class:`ActionConstraint`'s mask
    (the token that ends the line may already start the JSON, if the constraint accepts it)."""

    def start(self, row: Row, texts: TokenTexts, enders: list[tuple[int, str]]) -> list[int]:
        row.phase = "reason"
        row.constraint = ActionConstraint(texts, row.acts)  # type: ignore[arg-type]
        ok = row.constraint.accepts_first([after for _, after in enders])
        return [i for (i, _), yes in zip(enders, ok) if yes]

    def advance(self, row: Row, piece: str, texts: TokenTexts, reasoning_max: int) -> None:
        c = row.constraint
        if row.phase == "reason":
            row.reason_tokens += 1
            if "\n" in piece:
                row.phase = "json"
                c.advance(piece.split("\n", 1)[1])  # type: ignore[union-attr]
            elif row.reason_tokens >= reasoning_max:  # cut off: the JSON goes on a new line
                row.phase = "json"
                row.constraint = c = ActionConstraint(texts, row.acts, "\n")  # type: ignore[arg-type]
        else:
            c.advance(piece)  # type: ignore[union-attr]
        if row.phase == "json" and c.done:  # type: ignore[union-attr]
            row.phase = "free"  # the memory notes (or nothing: the object closed)

    def allowed(self, row: Row, top: str | None) -> list[int] | None:
        c = row.constraint
        if top and c.accepts(top):  # type: ignore[union-attr]
            return None
        allowed = c.allowed()  # type: ignore[union-attr]
        if not allowed:
            raise ValueError("constrained decoding: no admissible continuation")
        return allowed


class Choice(Free):
    """A reasoning line, then parked before the token that would end it (fed padding that
    attention ignores) and scored after the loop, every candidate starting with that line end."""

    def start(self, row: Row, texts: TokenTexts, enders: list[tuple[int, str]]) -> list[int]:
        row.phase = "reason"
        return [i for i, _ in enders]  # the line ends at any newline

    def parks(self, row: Row, piece: str, reasoning_max: int) -> bool:
        if "\n" in piece or row.reason_tokens >= reasoning_max:
            row.phase = "park"
            row.lead = piece.split("\n", 1)[0] + "\n" if "\n" in piece else "\n"
            return True
        return False

    def advance(self, row: Row, piece: str, texts: TokenTexts, reasoning_max: int) -> None:
        row.reason_tokens += 1  # parked at its next step, before the token that ends the line


STRATEGIES: dict[str, Free] = {"free": Free(), "constrained": Constrained(), "choice": Choice()}
