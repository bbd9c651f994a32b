"""Prompt caching across turns (issue 18): the keys and values of prompts already encoded,
so a turn encodes only the tokens its prompt does not share with one seen before.

An agent's turn prompt is its episode's system prompt with the turn's memory and
observation filled in: the objective, the grounding and the memory block (most of the
tokens) come first and are the same at every turn. :class:`PromptKVCache` keeps, per
entry, a prompt's token ids and its per-layer keys and values; :meth:`PromptKVCache.lookup`
finds the entry sharing the longest prefix with a new prompt, and the decode loop
(:meth:`pipeline.llm.backends.transformers.TransformersBackend._decode_loop`) encodes only
the rest, with the cached part in front of it in the batch cache::

    cache = PromptKVCache(max_bytes=1 << 30)
    entry, n = cache.lookup(ids)          # n tokens of ids are cached in entry (0: none)
    ...encode ids[n:] after entry.kv[..., :n, :]...
    cache.remember(ids, kv, hit=entry, shared=n)

An entry's keys and values of every layer are one tensor, ``(layers, 2, heads, tokens,
head_dim)``, on the model's device: a turn's batch cache is assembled with one copy per
row and an entry is stored with one per row (issue 34: per-layer copies were thousands of
small kernels a turn on a GPU).

What is kept: a prompt that hit an entry with at least half of that entry shared is not
stored again; the entry is cut to the shared part instead (what the next turn will share
too: the part before the first per-turn slot). Anything else is stored whole. Entries are
evicted least recently used first once their keys and values exceed ``max_bytes``.
Nothing depends on which prompts were cached but speed: the cached keys and values are the
ones the same model computed for the same tokens at the same positions (tests compare
logits and greedy actions with and without the cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np


@dataclass(eq=False)  # identity: entries hold tensors
class CachedPrompt:
    """One cached prompt: token ids and the keys and values of every layer, ``kv`` of shape
    ``(layers, 2, heads, tokens, head_dim)`` (``kv[l, 0]``: layer ``l``'s keys; no batch
    dimension)."""

    ids: np.ndarray
    kv: Any
    nbytes: int = 0
    last_used: int = 0

    def __post_init__(self) -> None:
        self.nbytes = int(self.kv.numel() * self.kv.element_size())

    def cut(self, n: int) -> None:
        """Keep the first ``n`` tokens (a copy, so the rest is freed)."""
        self.ids = self.ids[:n].copy()
        self.kv = self.kv[..., :n, :].clone()
        self.__post_init__()


@dataclass
class PromptKVCache:
    """Prompts' keys and values, looked up by longest shared token prefix (module docstring).

    Args:
        max_bytes: Budget for all entries' keys and values; least recently used entries go
            first when it is exceeded. ``0`` keeps nothing.
    """

    max_bytes: int
    entries: list[CachedPrompt] = field(default_factory=list)
    clock: int = 0
    reused_tokens: int = 0
    encoded_tokens: int = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def lookup(self, ids: Sequence[int]) -> tuple[CachedPrompt | None, int]:
        """The entry sharing the longest prefix with ``ids`` and the shared length, at most
        ``len(ids) - 1`` (the last token is always encoded: its logits start the turn)."""
        if not self.entries or len(ids) < 2:
            return None, 0
        query = np.asarray(ids, dtype=np.int64)
        best, best_n = None, 0
        for entry in self.entries:
            m = min(len(entry.ids), len(query))
            same = entry.ids[:m] == query[:m]
            n = m if same.all() else int(np.argmin(same))
            if n > best_n:
                best, best_n = entry, n
        if best is None:
            return None, 0
        self.clock += 1
        best.last_used = self.clock
        return best, min(best_n, len(ids) - 1)

    def remember(self, ids: Sequence[int], kv: Any, *, hit: CachedPrompt | None, shared: int) -> None:
        """Record an encoded prompt. ``hit``/``shared``: what :meth:`lookup` gave for it.
        ``kv`` (the keys and values of all of ``ids``, ``(layers, 2, heads, tokens,
        head_dim)``) is needed only when the prompt is stored whole (:meth:`wants`)."""
        self.reused_tokens += shared
        self.encoded_tokens += len(ids) - shared
        if self.max_bytes <= 0:
            return
        if not self.wants(hit, shared):
            if hit is not None and shared < len(hit.ids) and hit in self.entries:
                hit.cut(shared)  # the part every turn shares; the rest was the previous turn's
            return
        if kv is None:
            raise ValueError("PromptKVCache.remember: a prompt stored whole needs its keys and values")
        if kv.shape[-2] != len(ids):
            raise ValueError(f"PromptKVCache.remember: {len(ids)} ids but keys and values of {kv.shape[-2]} tokens")
        self.clock += 1
        self.entries.append(CachedPrompt(np.asarray(ids, dtype=np.int64), kv, last_used=self.clock))
        self._evict()

    @staticmethod
    def wants(hit: CachedPrompt | None, shared: int) -> bool:
        """Whether a prompt with this lookup result is stored whole (else its hit is cut)."""
        return hit is None or 2 * shared < len(hit.ids)

    def _evict(self) -> None:
        total = self.nbytes
        if total <= self.max_bytes:
            return
        for entry in sorted(self.entries, key=lambda e: e.last_used):
            if total <= self.max_bytes:
                break
            self.entries.remove(entry)
            total -= entry.nbytes

    def clear(self) -> None:
        """Forget every entry (the reuse counts stay)."""
        self.entries.clear()

    def stats(self) -> dict[str, int]:
        """``reused_tokens`` / ``encoded_tokens`` (prompt tokens taken from the cache /
        run through the model), ``entries``, ``bytes``."""
        return {"reused_tokens": self.reused_tokens, "encoded_tokens": self.encoded_tokens,
                "entries": len(self.entries), "bytes": self.nbytes}
