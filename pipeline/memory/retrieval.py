"""``Retriever.retrieve``: seed 001 section 1.3, vectorised over the whole store.

Filters (each switchable): ``require_same_language`` (entry language == query language),
``require_structure_overlap`` (entry and query share a detected structure, or the entry's
structure is ``none``); entries of the query's own quest are excluded (no leakage of a
task's own solution), optionally its whole scene. With ``same_scene_first`` the entries of
the query's scene (the house the agent is in: it knows where it is) rank before all others.
Score, best first:

1. number of matching signature fields (language, detected_structure, has_negation,
   num_aspects, length_bucket), 0..5;
2. lexical overlap: share of the distinct query tokens found among the entry's
   ``symptom`` + ``rationale_summary`` tokens (0 when ``query_lexical`` is None, as in the seed).

Ties are broken by a fixed order of the entries: ``entry_id`` order, or a permutation
of it seeded by ``tie_seed``; so the result does not depend on the row order.

The index keeps one NumPy column per signature field and an inverted index of tokens
(CSR postings), so a query costs a handful of array passes plus the postings of its
tokens, never a Python loop per entry::

    retriever = Retriever(tie_seed=0)
    hits = retriever.retrieve_scored(store, signature, query_lexical=objective,
                                     query_scene_id="s0", query_quest_id="q3", topk=3)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.conf_schema import MemoryConfig
from pipeline.memory.schemas import (
    LANGUAGES,
    LENGTH_BUCKETS,
    SIGNATURE_FIELDS,
    STORE_SCHEMA,
    STRUCTURES,
    EpisodicMemoryEntryV1_1,
    InputSignatureV1_1,
    entries_to_table,
    table_to_entries,
    tokenize,
)

STRUCT_BITS = {s: 1 << i for i, s in enumerate(STRUCTURES)}
NONE_BIT = STRUCT_BITS["none"]
TIE_BITS = 40  # composite key = score << 40 | inverted tie rank (stores up to 2^40 entries)
NUM_SIGNATURE_FIELDS = len(SIGNATURE_FIELDS)


@dataclass(frozen=True)
class RetrievalHit:
    """One retrieved entry with its score.

    Attributes:
        row: Row of the entry in the store table.
        entry: The entry (``EpisodicMemoryEntryV1_1`` as a dict).
        signature_matches: Matching signature fields, 0..5.
        lexical_overlap: Share of query tokens found in the entry, 0..1.
        relevance: Score in 0..1: mean of ``signature_matches / 5`` and ``lexical_overlap``
            when a lexical query was given, else ``signature_matches / 5``.
    """

    row: int
    entry: dict[str, Any]
    signature_matches: int
    lexical_overlap: float
    relevance: float


def tie_ranks(entry_ids: Sequence[str] | pa.Array, tie_seed: Optional[int]) -> np.ndarray:
    """Tie-break rank of every entry (lower wins): ``entry_id`` order, seeded permutation of it."""
    arr = entry_ids if isinstance(entry_ids, (pa.Array, pa.ChunkedArray)) else pa.array(list(entry_ids), pa.string())
    order = pc.sort_indices(arr).to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    if tie_seed is None:
        return rank
    perm = np.random.default_rng(int(tie_seed)).permutation(len(order)).astype(np.int64)
    return perm[rank]


def _codes(values: pa.Array, vocabulary: Sequence[str], null_code: int = -1) -> np.ndarray:
    idx = pc.index_in(values, value_set=pa.array(list(vocabulary), pa.string()))
    return pc.fill_null(idx, null_code).to_numpy(zero_copy_only=False).astype(np.int8)


def _encode(values: pa.Array) -> tuple[np.ndarray, dict[str, int]]:
    enc = pc.dictionary_encode(values)
    codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int32)
    return codes, {v: i for i, v in enumerate(enc.dictionary.to_pylist())}


def signature_mask(structures: Iterable[str]) -> int:
    m = 0
    for s in structures:
        m |= STRUCT_BITS[s]
    return m


class RetrievalIndex:
    """Column-wise index of a store table (see the module docstring)."""

    def __init__(self, table: pa.Table, tie_seed: Optional[int] = None):
        table = table.combine_chunks()
        self.table = table
        self.n = n = table.num_rows
        if n >= 1 << TIE_BITS:
            raise ValueError(f"store has {n} entries; the index supports fewer than 2^{TIE_BITS}")
        sig = table.column("input_signature").chunk(0) if n else pa.array([], STORE_SCHEMA.field("input_signature").type)
        self.lang = _codes(sig.field("language"), LANGUAGES)
        self.bucket = _codes(sig.field("length_bucket"), LENGTH_BUCKETS)
        neg = sig.field("has_negation")
        self.neg = pc.fill_null(pc.cast(neg, pa.int8()), -1).to_numpy(zero_copy_only=False).astype(np.int8)
        self.asp = pc.fill_null(sig.field("num_aspects"), -1).to_numpy(zero_copy_only=False).astype(np.int32)
        ds = sig.field("detected_structure")
        flat_codes = _codes(pc.list_flatten(ds), STRUCTURES)
        parents = pc.list_parent_indices(ds).to_numpy(zero_copy_only=False)
        struct = np.zeros(n, dtype=np.uint8)
        for code, bit in enumerate(STRUCT_BITS.values()):
            sel = parents[flat_codes == code]
            struct[sel] |= np.uint8(bit)
        self.struct = struct
        # Distinct signatures ("combos"): a store of 10^6 entries has a few thousand at most,
        # so filters and signature matches are computed per combo and gathered per entry.
        packed = ((self.asp.astype(np.int64) + 1) << 10) | (self.lang.astype(np.int64) + 1) << 8 \
            | self.struct.astype(np.int64) << 4 | (self.neg.astype(np.int64) + 1) << 2 | (self.bucket.astype(np.int64) + 1)
        combos, inverse = np.unique(packed, return_inverse=True)
        self.combo_id = inverse.astype(np.int32).reshape(-1)
        self.c_lang = ((combos >> 8) & 3) - 1
        self.c_struct = (combos >> 4) & 15
        self.c_neg = ((combos >> 2) & 3) - 1
        self.c_bucket = (combos & 3) - 1
        self.c_asp = (combos >> 10) - 1
        prov = table.column("provenance").chunk(0) if n else pa.array([], STORE_SCHEMA.field("provenance").type)
        self.scene_code, self.scene_ids = _encode(prov.field("scene_id"))
        self.quest_code, self.quest_ids = _encode(prov.field("quest_id"))
        self.tie = tie_ranks(table.column("entry_id"), tie_seed) if n else np.zeros(0, np.int64)
        self.inv_tie = (1 << TIE_BITS) - 1 - self.tie  # larger wins, always > 0
        self._scratch()
        self.tie_seed = tie_seed
        # Inverted index: postings of token t are post_rows[indptr[t]:indptr[t+1]] (distinct rows).
        toks = table.column("lexical_tokens").chunk(0) if n else pa.array([], STORE_SCHEMA.field("lexical_tokens").type)
        tok_parents = pc.list_parent_indices(toks).to_numpy(zero_copy_only=False).astype(np.int32)
        tok_ids, self.vocab = _encode(pc.list_flatten(toks))
        order = np.argsort(tok_ids, kind="stable")
        self.post_rows = tok_parents[order]
        counts = np.bincount(tok_ids, minlength=len(self.vocab))
        self.indptr = np.zeros(len(self.vocab) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.indptr[1:])

    #: Per-process state a copy rebuilds instead of carrying: the lock and the work buffers.
    _SCRATCH = ("_lock", "_tmp", "_tmp2", "_hits", "_key")

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a spawned worker's copy) without the query lock and work buffers: a lock
        cannot be pickled, and the buffers are scratch; :meth:`__setstate__` makes fresh ones."""
        return {k: v for k, v in self.__dict__.items() if k not in self._SCRATCH}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._scratch()

    def _scratch(self) -> None:
        """Work buffers reused by every query (guarded by a lock: one query at a time)."""
        n = self.n
        self._lock = threading.Lock()
        self._tmp, self._tmp2 = np.empty(n, dtype=bool), np.empty(n, dtype=bool)
        self._hits = np.empty(n, dtype=np.int8)
        self._key = np.empty(n, dtype=np.int64)

    @classmethod
    def from_table(cls, table: pa.Table, tie_seed: Optional[int] = None) -> "RetrievalIndex":
        return cls(table, tie_seed=tie_seed)

    @classmethod
    def from_entries(cls, entries: Iterable[EpisodicMemoryEntryV1_1 | dict], tie_seed: Optional[int] = None) -> "RetrievalIndex":
        return cls(entries_to_table(entries), tie_seed=tie_seed)

    def rows(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return table_to_entries(self.table.take(pa.array(list(indices), type=pa.int64())))

    def search(
        self,
        signature: InputSignatureV1_1,
        query_tokens: Optional[Sequence[str]],
        topk: int,
        *,
        require_same_language: bool = True,
        require_structure_overlap: bool = True,
        exclude_scene_id: Optional[str] = None,
        exclude_quest: Optional[tuple[Optional[str], str]] = None,
        prefer_scene_id: Optional[str] = None,
    ) -> list[tuple[int, int, int, int]]:
        """Top rows as ``(row, signature_matches, lexical_hits, num_query_tokens)``, best first;
        entries of ``prefer_scene_id`` rank before every other (same order among themselves)."""
        n = self.n
        if n == 0:
            return []
        qtok = sorted(set(query_tokens or ()))
        nq = len(qtok)
        bonus = (NUM_SIGNATURE_FIELDS + 1) * (nq + 1)  # above any signature + lexical score
        c_sig = self._combo_scores(signature, nq, require_same_language=require_same_language,
                                   require_structure_overlap=require_structure_overlap)

        # Per entry, into preallocated buffers (fresh 8 MB arrays per query cost more in page
        # faults than the arithmetic): one int64 composite key,
        # key = (signature_matches * (nq + 1) + lexical_hits) << 40 | inverted tie rank,
        # negative for filtered or excluded entries (a kept entry's key is always > 0).
        with self._lock:
            key = self._key
            np.take(c_sig, self.combo_id, out=key, mode="clip")  # mode="raise" would buffer `out`
            if nq:
                key += self._lexical_hits(qtok)
            qs = self.scene_ids.get(prefer_scene_id) if prefer_scene_id is not None else None
            if qs is not None:
                same = np.flatnonzero(self.scene_code == qs)
                key[same] += np.where(key[same] >= 0, bonus, 0)  # a filtered entry stays filtered
            np.left_shift(key, TIE_BITS, out=key)
            key |= self.inv_tie
            self._exclude(key, exclude_scene_id=exclude_scene_id, exclude_quest=exclude_quest)
            return _take_top(key, min(topk, n), nq, bonus)

    def _combo_scores(self, signature: InputSignatureV1_1, nq: int, *, require_same_language: bool,
                      require_structure_overlap: bool) -> np.ndarray:
        """Per combo (tiny arrays): the filters and the number of matching signature fields,
        as ``signature_matches * (nq + 1)``; a filtered combo is negative whatever the
        lexical hits and tie bits added later."""
        ql = LANGUAGES.index(signature.language)
        qmask = signature_mask(signature.detected_structure)
        qneg = -1 if signature.has_negation is None else int(signature.has_negation)
        qb = LENGTH_BUCKETS.index(signature.length_bucket)
        c_eq_lang = self.c_lang == ql
        c_ok = c_eq_lang.copy() if require_same_language else np.ones(len(self.c_lang), dtype=bool)
        if require_structure_overlap:
            # Shared structure, or the entry's own structure is `none` (seed 001).
            c_ok &= (self.c_struct & (qmask | NONE_BIT)) != 0
        c_sig = (c_eq_lang.astype(np.int64) + (self.c_struct == qmask) + (self.c_neg == qneg)
                 + (self.c_asp == signature.num_aspects) + (self.c_bucket == qb))
        c_sig *= nq + 1
        c_sig[~c_ok] = -(1 << 20)  # filtered: stays negative whatever the lexical hits and tie bits
        return c_sig

    def _lexical_hits(self, qtok: Sequence[str]) -> np.ndarray:
        """How many of the (distinct) query tokens each entry has (caller holds the lock)."""
        hits = self._hits
        if len(qtok) < 127:
            hits.fill(0)
        else:  # an int8 counter would overflow (very long objectives)
            hits = np.zeros(self.n, dtype=np.int32)
        for t in qtok:  # one pass over each query token's postings (distinct rows)
            tid = self.vocab.get(t)
            if tid is not None:
                hits[self.post_rows[self.indptr[tid]:self.indptr[tid + 1]]] += 1
        return hits

    def _exclude(self, key: np.ndarray, *, exclude_scene_id: Optional[str],
                 exclude_quest: Optional[tuple[Optional[str], str]]) -> None:
        """Mark the excluded entries' keys -1 (caller holds the lock). Exclusions touch few
        rows (a quest's or a scene's entries): set them by index."""
        tmp, tmp2 = self._tmp, self._tmp2
        if exclude_quest is not None:
            q_scene, q_quest = exclude_quest
            qq = self.quest_ids.get(q_quest)
            if qq is not None:
                np.equal(self.quest_code, qq, out=tmp)
                if q_scene is not None:
                    qs = self.scene_ids.get(q_scene)
                    np.equal(self.scene_code, qs if qs is not None else -2, out=tmp2)
                    tmp &= tmp2
                key[np.flatnonzero(tmp)] = -1
        if exclude_scene_id is not None:
            qs = self.scene_ids.get(exclude_scene_id)
            if qs is not None:
                np.equal(self.scene_code, qs, out=tmp)
                key[np.flatnonzero(tmp)] = -1


def _take_top(key: np.ndarray, k: int, nq: int, bonus: int = 0) -> list[tuple[int, int, int, int]]:
    """The ``k`` largest positive keys, best first, decoded (``key`` is consumed: each
    taken entry is set to -1); a score of at least ``bonus`` carries the same-scene bonus."""
    out = []
    for _ in range(k):
        i = int(np.argmax(key))
        if key[i] <= 0:
            break
        s = int(key[i]) >> TIE_BITS
        if bonus and s >= bonus:
            s -= bonus
        out.append((i, s // (nq + 1), s % (nq + 1), nq))
        key[i] = -1
    return out


def _as_signature(sig: InputSignatureV1_1 | dict) -> InputSignatureV1_1:
    return sig if isinstance(sig, InputSignatureV1_1) else InputSignatureV1_1.model_validate(sig)


def query_tokens(query_lexical: Optional[str | Sequence[str]]) -> Optional[list[str]]:
    """Distinct query tokens from a text or a token list (lower-cased, stopwords dropped)."""
    if query_lexical is None:
        return None
    if isinstance(query_lexical, str):
        return sorted(set(tokenize(query_lexical)))
    return sorted(set(t for tok in query_lexical for t in tokenize(str(tok))))


def relevance_of(signature_matches: int, lexical_overlap: float, lexical_used: bool) -> float:
    """Score tuple -> 0..1 (see :class:`RetrievalHit`)."""
    sig = signature_matches / NUM_SIGNATURE_FIELDS
    return round((sig + lexical_overlap) / 2 if lexical_used else sig, 6)


class Retriever:
    """Seed 001's retriever.

    Args:
        require_same_language: Keep only entries in the query's language.
        require_structure_overlap: Keep only entries sharing a structure (or ``none``).
        exclude_same_quest: Drop entries of the query's quest (scene + quest id).
        exclude_same_scene: Also drop entries of the query's scene.
        same_scene_first: Entries of the query's scene (the house the agent is in) rank
            before all others; among themselves, and the others among themselves, by score.
        tie_seed: Seed of the tie-breaking order (None: ``entry_id`` order). A store
            passed as :class:`~pipeline.memory.store.EpisodicStore` uses its own index's seed.
    """

    def __init__(
        self,
        require_same_language: bool = True,
        require_structure_overlap: bool = True,
        exclude_same_quest: bool = True,
        exclude_same_scene: bool = False,
        tie_seed: Optional[int] = None,
        same_scene_first: bool = False,
    ):
        self.require_same_language = require_same_language
        self.require_structure_overlap = require_structure_overlap
        self.exclude_same_quest = exclude_same_quest
        self.exclude_same_scene = exclude_same_scene
        self.same_scene_first = same_scene_first
        self.tie_seed = tie_seed

    @classmethod
    def from_config(cls, memory_cfg: MemoryConfig, tie_seed: Optional[int] = None) -> "Retriever":
        """From the ``memory`` config group."""
        return cls(
            require_same_language=memory_cfg.require_same_language,
            require_structure_overlap=memory_cfg.require_structure_overlap,
            exclude_same_quest=memory_cfg.exclude_same_quest,
            exclude_same_scene=memory_cfg.exclude_same_scene,
            tie_seed=tie_seed,
            same_scene_first=memory_cfg.same_scene_first,
        )

    def _index(self, store_entries: Any) -> RetrievalIndex:
        if isinstance(store_entries, RetrievalIndex):
            return store_entries
        index = getattr(store_entries, "index", None)  # EpisodicStore (cached index)
        if isinstance(index, RetrievalIndex):
            return index
        if isinstance(store_entries, pa.Table):
            return RetrievalIndex.from_table(store_entries, tie_seed=self.tie_seed)
        return RetrievalIndex.from_entries(list(store_entries), tie_seed=self.tie_seed)

    def retrieve_scored(
        self,
        store_entries: Any,
        query_signature: InputSignatureV1_1 | dict,
        query_lexical: Optional[str | Sequence[str]] = None,
        topk: int = 3,
        *,
        query_scene_id: Optional[str] = None,
        query_quest_id: Optional[str] = None,
    ) -> list[RetrievalHit]:
        """Like :meth:`retrieve`, with each entry's score."""
        if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)) or not 1 <= topk <= 3:
            raise ValueError(f"Retriever.retrieve: topk={topk!r}, expected an int in 1..3")
        index = self._index(store_entries)
        sig = _as_signature(query_signature)
        toks = query_tokens(query_lexical)
        found = index.search(
            sig,
            toks,
            int(topk),
            require_same_language=self.require_same_language,
            require_structure_overlap=self.require_structure_overlap,
            exclude_quest=(query_scene_id, query_quest_id) if self.exclude_same_quest and query_quest_id is not None else None,
            exclude_scene_id=query_scene_id if self.exclude_same_scene else None,
            prefer_scene_id=query_scene_id if self.same_scene_first else None,
        )
        entries = index.rows([r for r, *_ in found])
        hits = []
        for (row, matches, lex_hits, nq), entry in zip(found, entries):
            lex = lex_hits / nq if nq else 0.0
            hits.append(RetrievalHit(row, entry, matches, lex, relevance_of(matches, lex, toks is not None)))
        return hits

    def retrieve(
        self,
        store_entries: Any,
        query_signature: InputSignatureV1_1 | dict,
        query_lexical: Optional[str | Sequence[str]] = None,
        topk: int = 3,
        *,
        query_scene_id: Optional[str] = None,
        query_quest_id: Optional[str] = None,
    ) -> list[dict[str, Any]]:
        """Top ``topk`` (1..3) store entries for the query, best first (seed 001 section 1.3).

        Args:
            store_entries: An ``EpisodicStore``, a ``RetrievalIndex``, a store Arrow table,
                or a list of entries (models or the JSONL dicts).
            query_signature: ``InputSignatureV1_1`` or its dict.
            query_lexical: Query text or tokens; None gives a lexical score of 0 (seed).
            topk: 1..3.
            query_scene_id: The query task's scene (for the exclusions).
            query_quest_id: The query task's quest (entries of it are excluded).

        Returns:
            Entry dicts (``EpisodicMemoryEntryV1_1`` shape), at most ``topk``.
        """
        hits = self.retrieve_scored(store_entries, query_signature, query_lexical, topk,
                                    query_scene_id=query_scene_id, query_quest_id=query_quest_id)
        return [h.entry for h in hits]


def retrieve_loop(
    entries: Sequence[dict[str, Any]],
    query_signature: InputSignatureV1_1 | dict,
    query_lexical: Optional[str | Sequence[str]] = None,
    topk: int = 3,
    *,
    require_same_language: bool = True,
    require_structure_overlap: bool = True,
    query_scene_id: Optional[str] = None,
    query_quest_id: Optional[str] = None,
    exclude_same_scene: bool = False,
    tie_seed: Optional[int] = None,
    ties: Optional[np.ndarray] = None,
    same_scene_first: bool = False,
) -> list[tuple[str, int, float]]:
    """The same retrieval as a plain per-entry Python loop: the reference semantics.

    Used by the tests (the vectorised index must agree with it) and as the benchmark's
    baseline. Returns ``(entry_id, signature_matches, lexical_overlap)`` best first.
    """
    q = _as_signature(query_signature)
    qset = set(q.detected_structure)
    toks = query_tokens(query_lexical)
    qtok = set(toks or ())
    if ties is None:
        ties = tie_ranks([e["entry_id"] for e in entries], tie_seed)
    scored = []
    for i, e in enumerate(entries):
        s = e["input_signature"]
        p = e["provenance"]
        if query_quest_id is not None and p["quest_id"] == query_quest_id and (
            query_scene_id is None or p["scene_id"] == query_scene_id
        ):
            continue
        if exclude_same_scene and query_scene_id is not None and p["scene_id"] == query_scene_id:
            continue
        if require_same_language and s["language"] != q.language:
            continue
        est = set(s["detected_structure"])
        if require_structure_overlap and not (est & qset or "none" in est):
            continue
        matches = (
            (s["language"] == q.language)
            + (est == qset)
            + (s["has_negation"] == q.has_negation)
            + (s["num_aspects"] == q.num_aspects)
            + (s["length_bucket"] == q.length_bucket)
        )
        if qtok:
            cs = e["case_summary"]
            etok = set(tokenize(cs["symptom"])) | set(tokenize(cs["rationale_summary"]))
            lex = len(qtok & etok) / len(qtok)
        else:
            lex = 0.0
        same = same_scene_first and query_scene_id is not None and p["scene_id"] == query_scene_id
        scored.append((-int(same), -matches, -lex, int(ties[i]), e["entry_id"], matches, lex))
    scored.sort()
    return [(eid, m, lex) for *_, eid, m, lex in scored[:topk]]
