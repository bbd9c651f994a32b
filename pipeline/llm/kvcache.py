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

import functools
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


# ---------------------------------------------------------------------------------------------
# The decode loop's batch cache: keys and values that grow in place.
#
# transformers' ``DynamicLayer.update`` concatenates every new token onto the whole cache
# (``torch.cat``), so each decoded token copies every row's keys and values of every layer: on
# the CPU with 56 rows of ~1,500 tokens that copy (and the fresh pages it touches) cost about
# half as much as the attention itself. :func:`growing_cache` keeps each layer in a buffer with
# spare room at the end and hands the model views of its filled part. The values and their
# order are the ones ``torch.cat`` would give, and the CPU's attention reads a view exactly as it
# reads a contiguous copy: ``tests/test_kvcache.py`` compares every step's logits bit for bit, and
# ``tests/test_llm_generation.py`` whole turns (texts, ids, log-probs, choice scores); the default
# run's outputs, and a fresh world's, were the same bytes with it. So nothing but speed depends on
# it (6-9% of an evaluation on 2 CPU cores). The backend uses it on the CPU only: a GPU picks its
# attention kernel by the inputs' layout, and no GPU run checked it. transformers' ``StaticCache``
# is no substitute: it attends over its whole fixed length under a mask, which changes the sums'
# order and so the bytes.

GROWTH_TOKENS = 256
"""Spare room a buffer gets when it grows, in tokens: a turn decodes at most
``sampling.max_new_tokens`` (96 by default), so a turn's buffer is sized once, at its prompt, and
holds 256 tokens more than ``torch.cat``'s would (a fixed amount, not a fraction of the prompt: a
large model's cache on the CPU stays the size it was). A longer generation grows it again every
256 tokens, one copy each."""


@functools.cache
def _growing_cache_class() -> type:
    """``GrowingCache`` (and its ``GrowingLayer``), defined at the first call, once transformers is
    imported (an optional, heavy dependency that this module does not import at load)."""
    import torch  # deferred: heavy optional dependency (torch)
    from transformers import DynamicCache  # deferred: heavy optional dependency
    from transformers.cache_utils import Cache, DynamicLayer  # deferred: heavy optional dependency

    class GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` whose ``keys``/``values`` are views of buffers with room to grow."""

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            super().lazy_initialization(key_states, value_states)
            self._k = self._v = None
            self._n = 0

        def _reserve(self, like: Any, needed: int) -> None:
            cap = 0 if self._k is None else self._k.shape[-2]
            if needed <= cap:
                return
            cap = needed + GROWTH_TOKENS
            shape = (*like.shape[:-2], cap, like.shape[-1])
            k = torch.empty(shape, dtype=like.dtype, device=like.device)
            v = torch.empty(shape, dtype=like.dtype, device=like.device)
            if self._n:
                k[..., :self._n, :] = self._k[..., :self._n, :]
                v[..., :self._n, :] = self._v[..., :self._n, :]
            self._k, self._v = k, v

        def _views(self) -> tuple[Any, Any]:
            self.keys = self._k[..., :self._n, :]
            self.values = self._v[..., :self._n, :]
            return self.keys, self.values

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, new = self._n, key_states.shape[-2]
            self._reserve(key_states, n + new)
            self._k[..., n:n + new, :] = key_states
            self._v[..., n:n + new, :] = value_states
            self._n = n + new
            return self._views()

        def get_seq_length(self) -> int:
            return self._n if self.is_initialized else 0

        def batch_select_indices(self, indices: Any) -> None:
            if self.get_seq_length() > 0:
                self._k, self._v = self._k[indices, ...], self._v[indices, ...]
                self._views()

        def reset(self) -> None:
            self._k = self._v = None
            self._n = 0
            super().reset()

        def crop(self, tokens_to_remove: int) -> None:  # not used by the decode loop: no views to keep
            raise NotImplementedError("GrowingLayer.crop: the decode loop's batch cache is never cropped")

        def batch_repeat_interleave(self, repeats: int) -> None:
            raise NotImplementedError("GrowingLayer.batch_repeat_interleave: not used by the decode loop")

    class GrowingCache(DynamicCache):
        """A ``DynamicCache`` of :class:`GrowingLayer` (only plain per-layer caches: the
        backend's prompt cache is off for other kinds, and so is this)."""

        def __init__(self, num_layers: int, data: Any = None) -> None:
            layers = [GrowingLayer() for _ in range(num_layers)]
            for layer, (k, v) in zip(layers, data or ()):
                layer.update(k, v)
            Cache.__init__(self, layers=layers)

    return GrowingCache


def growing_cache(num_layers: int, data: Sequence[tuple[Any, Any]] | None = None) -> Any:
    """A batch KV cache of ``num_layers`` layers whose buffers grow in place (see above),
    optionally filled with ``data``: per layer ``(keys, values)``, ``(batch, heads, tokens,
    head_dim)``."""
    return _growing_cache_class()(num_layers, data)
