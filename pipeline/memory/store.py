"""The episodic store: one :class:`EpisodicMemoryEntryV1_1` per collected episode.

Build entries from the collect stage's tables, keep them as a canonical Parquet (rows
sorted by ``entry_id``) and export the seed's ``episodic_store.jsonl``::

    entries = build_entries(episodes, turns, reader=fact_reader(cfg), config_hash="ab12...")
    store = EpisodicStore.from_entries(entries)
    write_store(store, "data/store")          # parquet + jsonl + store_hash.txt
    store = load_store("data/store", tie_seed=0)

The store's content hash is the sha256 of its canonical JSONL export (one key-sorted
JSON object per line, rows sorted by ``entry_id``): it does not depend on Parquet
encoding details, and ``sha256sum data/store/episodic_store.jsonl`` checks it.

Every entry also carries what its episode saw of the scene
(:func:`pipeline.memory.scene.scene_facts`: where objects and keys were, which containers
are locked and which key opens them, routes between rooms, containers found empty), from
the typed facts its world's reader gives of each turn (``reader``: a
:class:`pipeline.core.facts.FactReader`, :func:`pipeline.envs.fact_reader`), appended to
``case_summary.rationale_summary`` after :data:`~pipeline.memory.scene.SCENE_FACTS_MARKER`
(whole facts, in a fixed order); :func:`~pipeline.memory.scene.split_scene_facts` gives
them back::

    rationale, facts = split_scene_facts(entry["case_summary"]["rationale_summary"])
    # facts == ["Key_1 was in Drawer_0 in the Bedroom", "Chest_2 in the Bedroom is locked (Key_1 unlocks it)",
    #           "Kitchen -> south -> Bathroom", ...]
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import pyarrow as pa

from pipeline.core.facts import FactReader, StepFacts
from pipeline.core.io import ArtifactError, atomic_write_chunks, atomic_write_text, read_parquet, sha256_file, write_parquet
from pipeline.core.schemas import FEEDBACK_TYPES, canonical_json, json_object
from pipeline.memory.schemas import (
    STORE_SCHEMA,
    STORE_SCHEMA_VERSION,
    CaseSummaryV1_1,
    CorrectionV1_1,
    EpisodicMemoryEntryV1_1,
    EvaluationV1_1,
    FeedbackByTypeV1_1,
    ProvenanceV1_1,
    StageSnapshotV1_1,
    entries_to_table,
    table_to_entries,
)
from pipeline.memory.retrieval import RetrievalIndex
from pipeline.memory.scene import MAX_SUMMARY_CHARS, clip, scene_facts, with_scene_facts
from pipeline.memory.signature import SignatureBuilder

STORE_PARQUET = "episodic_store.parquet"
STORE_JSONL = "episodic_store.jsonl"
STORE_HASH = "store_hash.txt"

EPISODE_COLUMNS = ("episode_id", "scene_id", "quest_id", "objective", "won", "final_reward", "num_turns", "num_invalid")
TURN_COLUMNS = ("episode_id", "turn_index", "action", "command", "action_valid", "status")
# What a world's fact reader reads of a turn row (all optional), and where build_entries
# keeps each row's reading instead of the row's (large) observation. ``reward``: a world
# that keeps a score says which commands raised it (ScienceWorld's ``advanced(command)``).
FACT_COLUMNS = ("observation", "env_feedback", "command", "reward")
STEP_FACTS = "step_facts"

MAX_FEEDBACK_PER_TYPE = 5
MAX_FEEDBACK_CHARS = 160
FIRST_ACTIONS = 3


def _redact(text: Optional[str], objective: str) -> Optional[str]:
    # The raw objective is never stored in an entry (seed 001: signatures only).
    if text is None:
        return None
    if objective and objective in text:
        text = text.replace(objective, "<objective>")
    return text


def _action_label(turn: dict[str, Any]) -> str:
    """``verb target`` from the action JSON (falls back to the command)."""
    raw = turn.get("action")
    try:
        action = json.loads(raw) if isinstance(raw, str) else (raw or {})
    except json.JSONDecodeError:
        action = {}
    if isinstance(action, dict) and action.get("action"):
        parts = [str(action["action"])]
        if action.get("target"):
            parts.append(str(action["target"]))
        return " ".join(parts)
    return str(turn.get("command") or "unparsed action")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _feedback(turn: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for ftype in FEEDBACK_TYPES:
        text = turn.get(f"feedback_{ftype}")
        if text and str(text).strip():
            out.append((ftype, str(text).strip()))
    return out


@dataclass
class _FeedbackSummary:
    """An episode's feedback, as an entry records it (texts redacted and clipped)."""

    by_type: dict[str, list[str]]  # distinct texts per type, in order, at most MAX_FEEDBACK_PER_TYPE
    corrective: list[tuple[str, str]]  # (type, text) given on a step that was not a success
    all_items: list[tuple[str, str]]  # every distinct (type, text), in order
    first_correction: Optional[int]  # turn index of the first corrective feedback
    num_lines: int  # raw feedback lines over all turns


def _summarise_feedback(turns: Sequence[dict[str, Any]], objective: str) -> _FeedbackSummary:
    """Distinct feedback texts per type, in turn order, and which of them corrected.

    Corrective = given on a step that was not a success (Failure, or WiP: the user
    redirects an agent that is not progressing); feedback on a successful step only
    confirms (seed 000's "[ Step1 - Success ] : kitchen is green").
    """
    by_type: dict[str, list[str]] = {k: [] for k in FEEDBACK_TYPES}
    corrective: list[tuple[str, str]] = []
    all_items: list[tuple[str, str]] = []
    first_correction = None
    num_lines = 0
    for t in turns:
        num_lines += len(t.get("feedback_lines") or [])
        for ftype, text in _feedback(t):
            text = clip(_redact(text, objective), MAX_FEEDBACK_CHARS)
            if text not in by_type[ftype] and len(by_type[ftype]) < MAX_FEEDBACK_PER_TYPE:
                by_type[ftype].append(text)
            if (ftype, text) not in all_items:
                all_items.append((ftype, text))
            if t.get("status") != "Success":
                if first_correction is None:
                    first_correction = int(t["turn_index"])
                if (ftype, text) not in corrective:
                    corrective.append((ftype, text))
    return _FeedbackSummary(by_type, corrective, all_items, first_correction, num_lines)


def _symptom(turns: Sequence[dict[str, Any]], *, corrected: bool, won: bool, num_turns: int) -> tuple[str, list[str]]:
    """What went wrong in the episode: the symptom text and its risk tags."""
    invalid = [t for t in turns if t.get("action_valid") is False]
    repeated = [t for t in turns if t.get("repeated")]
    failed = [t for t in turns if t.get("status") == "Failure"]
    stalled = [t for t in turns if t.get("status") == "WiP"]
    tags: list[str] = []
    parts: list[str] = []
    if invalid:
        tags.append("invalid_action")
        parts.append(f"{_plural(len(invalid), 'inadmissible action')} (first: {_action_label(invalid[0])})")
    if repeated:
        tags.append("repeated_action")
        if any(_action_label(t).startswith("examine") for t in repeated):
            tags.append("examine_loop")
        parts.append(f"{_plural(len(repeated), 'repeated action')} that changed nothing (first: {_action_label(repeated[0])})")
    if failed:
        tags.append("failed_step")
        parts.append(_plural(len(failed), "failed step"))
    if stalled and corrected:
        tags.append("no_progress")
        parts.append(f"{_plural(len(stalled), 'step')} without progress")
    if not won:
        tags.append("goal_not_reached")
        parts.append(f"goal not reached in {_plural(num_turns, 'turn')}")
    return ("; ".join(parts) if parts else "no mistakes recorded"), tags


def _rationale(feedback: _FeedbackSummary, *, corrected: bool, won: bool, num_turns: int) -> str:
    """What fixed the episode (or did not): the corrective feedback, else all of it."""
    items = feedback.corrective or feedback.all_items
    fb = " | ".join(f"{k}: {v}" for k, v in items[:3])
    if corrected and won:
        return f"feedback applied ({fb}); then the goal was reached in {_plural(num_turns, 'turn')}"
    if corrected:
        return f"feedback applied ({fb}); the goal was still not reached"
    if won:
        rationale = f"a direct plan reached the goal in {_plural(num_turns, 'turn')} without correction"
    else:
        rationale = "no corrective feedback was given and the goal was not reached"
    if fb:
        rationale += f" (feedback: {fb})"
    return rationale


def build_entry(
    episode: dict[str, Any],
    turns: Sequence[dict[str, Any]],
    *,
    reader: Optional[FactReader],
    config_hash: Optional[str] = None,
    signature_builder: Optional[SignatureBuilder] = None,
) -> EpisodicMemoryEntryV1_1:
    """One store entry from an episode row and its turns (any order; sorted here).

    Args:
        episode: A row of ``episodes.parquet`` (``pipeline.core.schemas.EPISODE_SCHEMA``).
        turns: Its rows of ``turns.parquet`` (``observation``, ``env_feedback`` and
            ``changed`` are optional: they give the scene facts).
        reader: The world's reader of a turn's typed facts (:func:`pipeline.envs.fact_reader`).
            ``None`` only when every row already carries its reading under
            :data:`STEP_FACTS` (what :func:`build_entries` does).
        config_hash: Hash of the collect config, used when the episode's metadata has none.
        signature_builder: Builder for the objective's signature.

    Returns:
        The validated entry; the objective text itself is not in it. Its scene facts
        (:func:`pipeline.memory.scene.scene_facts`) end its ``rationale_summary``.

    Raises:
        ValueError: no ``reader`` and a row without its reading.
    """
    builder = signature_builder or SignatureBuilder(getattr(reader, "entity_pattern", None))
    objective = episode.get("objective") or episode.get("question") or ""
    meta = json_object(episode.get("metadata"))
    # Entities are counted by name pattern only, exactly as for the query at render time.
    signature = builder.build(objective)
    turns = sorted(turns, key=lambda t: t["turn_index"])
    won = bool(episode["won"])
    num_turns = int(episode["num_turns"])

    feedback = _summarise_feedback(turns, objective)
    corrected = feedback.first_correction is not None
    symptom, tags = _symptom(turns, corrected=corrected, won=won, num_turns=num_turns)
    tags.extend(f"feedback_{k}" for k in FEEDBACK_TYPES if feedback.by_type[k])
    rationale = _rationale(feedback, corrected=corrected, won=won, num_turns=num_turns)
    facts = [_redact(f, objective) for f in scene_facts([(t, _step_facts(t, reader)) for t in turns])]

    reasoning = next((t.get("reasoning") for t in turns if t.get("reasoning")), None)
    ep_id = str(episode["episode_id"])
    return EpisodicMemoryEntryV1_1(
        entry_id=f"mem_{ep_id}",
        input_signature=signature,
        case_summary=CaseSummaryV1_1(
            symptom=clip(_redact(symptom, objective), MAX_SUMMARY_CHARS),
            rationale_summary=with_scene_facts(_redact(rationale, objective), facts, MAX_SUMMARY_CHARS),
            risk_tags=tags,
        ),
        stage_snapshot=StageSnapshotV1_1(
            first_actions=[clip(_redact(_action_label(t), objective), 80) for t in turns[:FIRST_ACTIONS]],
            first_reasoning=clip(_redact(reasoning, objective), 400) if reasoning else None,
        ),
        correction=CorrectionV1_1(
            corrected=corrected,
            first_correction_turn=feedback.first_correction,
            num_feedback_lines=feedback.num_lines,
            by_type=FeedbackByTypeV1_1(**feedback.by_type),
        ),
        evaluation=EvaluationV1_1(
            won=won,
            is_correct=episode.get("is_correct"),
            final_reward=float(episode["final_reward"]),
            num_turns=num_turns,
            num_invalid=int(episode["num_invalid"]),
            num_repeated=int(episode.get("num_repeated") or 0),
        ),
        provenance=ProvenanceV1_1(
            episode_id=ep_id,
            scene_id=str(episode["scene_id"]),
            quest_id=str(episode["quest_id"]),
            split=episode.get("split"),
            agent=episode.get("agent"),
            model=episode.get("model"),
            seed=episode.get("seed"),
            config_hash=meta.get("config_hash") if isinstance(meta.get("config_hash"), str) else config_hash,
        ),
        scene_facts=facts,
    )


def _step_facts(turn: dict[str, Any], reader: Optional[FactReader]) -> StepFacts:
    step = turn.get(STEP_FACTS)
    if isinstance(step, StepFacts):
        return step
    if reader is None:
        raise ValueError(f"turn {turn.get('turn_index')!r} of {turn.get('episode_id')!r}: no fact reader to read "
                         "its scene facts with (pass reader=pipeline.envs.fact_reader(cfg))")
    return reader.read_turn(turn)


def _require_columns(table: pa.Table, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ArtifactError(f"{what}: missing column(s) {missing} (expected the collect stage's schema)")


def build_entries(
    episodes: pa.Table,
    turns: pa.Table,
    *,
    reader: FactReader,
    splits: Optional[Sequence[str]] = ("train",),
    config_hash: Optional[str] = None,
    episodes_name: str = "episodes table",
    turns_name: str = "turns table",
) -> list[EpisodicMemoryEntryV1_1]:
    """One entry per episode (of the given splits), sorted by ``entry_id``.

    Args:
        episodes: ``episodes.parquet`` contents.
        turns: ``turns.parquet`` contents.
        reader: The world's reader of a turn's typed facts (:func:`pipeline.envs.fact_reader`).
        splits: Episode splits kept (None: all).
        config_hash: Fallback provenance config hash.
        episodes_name: Name used in error messages (the file path).
        turns_name: Name used in error messages (the file path).
    """
    _require_columns(episodes, EPISODE_COLUMNS, episodes_name)
    _require_columns(turns, TURN_COLUMNS, turns_name)
    # env_feedback, changed and observation are optional: they give the scene facts.
    turn_cols = [c for c in turns.column_names if c in (
        *TURN_COLUMNS, "repeated", "reasoning", "feedback_lines", "changed",
        *(f"feedback_{k}" for k in FEEDBACK_TYPES))]
    # Observations are large (every admissible command): each row's typed facts are read
    # in slices and kept instead.
    steps: list[StepFacts] = []
    fact_cols = [c for c in FACT_COLUMNS if c in turns.column_names]
    for start in range(0, turns.num_rows, 8192):
        steps.extend(reader.read_turn(t) for t in turns.select(fact_cols).slice(start, 8192).to_pylist())
    by_episode: dict[str, list[dict]] = {}
    for row, step in zip(turns.select(turn_cols).to_pylist(), steps):
        row[STEP_FACTS] = step
        by_episode.setdefault(row["episode_id"], []).append(row)
    builder = SignatureBuilder(getattr(reader, "entity_pattern", None))  # the world's entity names
    entries = []
    for ep in episodes.to_pylist():
        if splits is not None and "split" in ep and ep["split"] not in splits:
            continue
        ep_turns = by_episode.get(ep["episode_id"], [])
        if not ep_turns and int(ep["num_turns"]) > 0:
            raise ArtifactError(
                f"{turns_name}: no turns for episode {ep['episode_id']!r} (episodes say num_turns={ep['num_turns']})"
            )
        entries.append(build_entry(ep, ep_turns, reader=None, config_hash=config_hash, signature_builder=builder))
    entries.sort(key=lambda e: e.entry_id)
    ids = [e.entry_id for e in entries]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ArtifactError(f"{episodes_name}: duplicate episode_id {dup.removeprefix('mem_')!r}")
    return entries


def export_jsonl(table: pa.Table) -> str:
    """The seed's ``episodic_store.jsonl``: one key-sorted JSON entry per line, UTF-8 kept."""
    return "".join(iter_jsonl(table))


def iter_jsonl(table: pa.Table, batch_rows: int = 8192) -> Iterator[str]:
    """:func:`export_jsonl` in pieces of ``batch_rows`` lines: a 10^6-entry store never
    holds its whole export (GBs of Python objects) in memory at once."""
    for start in range(0, table.num_rows, batch_rows):
        yield "".join(canonical_json(r) + "\n" for r in table_to_entries(table.slice(start, batch_rows)))


def content_hash(jsonl_text: str) -> str:
    """sha256 of the canonical JSONL export: the store's content hash."""
    return hashlib.sha256(jsonl_text.encode("utf-8")).hexdigest()


class EpisodicStore:
    """The store in memory: the Arrow table, its content hash and a lazily built index.

    Args:
        table: Rows with :data:`STORE_SCHEMA` (sorted by ``entry_id`` when written).
        store_hash: Content hash (computed from the table when None).
        tie_seed: Seed of the retriever's tie-breaking order (None: ``entry_id`` order).
    """

    def __init__(self, table: pa.Table, store_hash: Optional[str] = None, tie_seed: Optional[int] = None):
        if table.schema.remove_metadata() != STORE_SCHEMA:
            _require_columns(table, STORE_SCHEMA.names, "episodic store")
            table = table.select(STORE_SCHEMA.names).cast(STORE_SCHEMA)
        self.table = table.replace_schema_metadata(None)
        self._jsonl: Optional[str] = None
        self._store_hash = store_hash or None
        self.tie_seed = tie_seed
        self._index = None

    @property
    def store_hash(self) -> str:
        """sha256 of the canonical JSONL export (computed once, streaming)."""
        if self._store_hash is None:
            h = hashlib.sha256()
            for chunk in self.iter_jsonl():
                h.update(chunk.encode("utf-8"))
            self._store_hash = h.hexdigest()
        return self._store_hash

    @classmethod
    def from_entries(cls, entries: Iterable[EpisodicMemoryEntryV1_1 | dict], tie_seed: Optional[int] = None) -> "EpisodicStore":
        """A store from entries (validated, sorted by ``entry_id``)."""
        table = entries_to_table(entries)
        table = table.sort_by([("entry_id", "ascending")])
        return cls(table, tie_seed=tie_seed)

    def __len__(self) -> int:
        return self.table.num_rows

    def jsonl(self) -> str:
        """The whole JSONL export as one string (kept; use :meth:`iter_jsonl` for large stores)."""
        if self._jsonl is None:
            self._jsonl = export_jsonl(self.table)
        return self._jsonl

    def iter_jsonl(self) -> Iterator[str]:
        """The JSONL export in pieces (the kept string when :meth:`jsonl` already built it)."""
        if self._jsonl is not None:
            yield self._jsonl
        else:
            yield from iter_jsonl(self.table)

    def entries(self) -> list[dict[str, Any]]:
        """All entries as dicts (seed's JSONL shape)."""
        return table_to_entries(self.table)

    def rows(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Entries at the given row positions, in that order."""
        return table_to_entries(self.table.take(pa.array(list(indices), type=pa.int64())))

    @property
    def index(self):
        """The vectorised :class:`pipeline.memory.retrieval.RetrievalIndex` (built once)."""
        if self._index is None:
            self._index = RetrievalIndex.from_table(self.table, tie_seed=self.tie_seed)
        return self._index


def write_store(store: EpisodicStore, out_dir: str | Path) -> str:
    """Write JSONL, Parquet and the hash file, each atomically; returns the store hash.

    The hash file is written last, after the JSONL it hashes: a crash between the writes
    leaves a store that :func:`load_store` refuses (hash mismatch), never one that loads
    with a table its hash does not describe. The ``store`` stage writes into a fresh
    folder swapped in whole (:func:`pipeline.core.io.atomic_dir`).
    """
    out = Path(out_dir)
    h = hashlib.sha256()

    def chunks() -> Iterator[bytes]:  # hashed while written: one pass over the export
        for text in store.iter_jsonl():
            data = text.encode("utf-8")
            h.update(data)
            yield data

    atomic_write_chunks(out / STORE_JSONL, chunks())
    digest = h.hexdigest()
    if store._store_hash is None:
        store._store_hash = digest
    elif store._store_hash != digest:
        raise ArtifactError(f"{out / STORE_JSONL}: the store's content hashes to {digest[:12]}… but it was "
                            f"given the hash {store._store_hash[:12]}…")
    write_parquet(store.table, out / STORE_PARQUET, sort_by=["entry_id"], schema_version=STORE_SCHEMA_VERSION)
    atomic_write_text(out / STORE_HASH, digest + "\n")
    return digest


def load_store(store_dir: str | Path, *, tie_seed: Optional[int] = None, verify: bool = True) -> EpisodicStore:
    """Load the store written by :func:`write_store`, checked against its recorded hash.

    The hash is recomputed from the Parquet table, the data every reader of the store
    uses (retrieval, rendering): a row planted in or removed from the table is refused,
    naming the file, even though it is still valid Parquet. The JSONL export is a
    companion that must exist and hash the same (``sha256sum`` checks it by hand).

    Args:
        store_dir: Folder holding ``episodic_store.parquet``, ``episodic_store.jsonl`` and
            ``store_hash.txt``.
        tie_seed: Retrieval tie-breaking seed (use the config's ``seed``).
        verify: Check the table and the JSONL export against ``store_hash.txt``.

    Raises:
        ArtifactError: a missing file, or a table or export that does not hash to the
            recorded hash (the store was modified outside the store stage).
    """
    d = Path(store_dir)
    table = read_parquet(d / STORE_PARQUET)
    hash_path = d / STORE_HASH
    if not hash_path.exists():
        raise ArtifactError(f"missing {hash_path} (rerun the store stage: `dvc repro store`)")
    recorded = hash_path.read_text(encoding="utf-8").strip()
    store = EpisodicStore(table, tie_seed=tie_seed)
    if not verify:
        store._store_hash = recorded
        return store
    rerun = "the store was modified outside the store stage (rerun `dvc repro store`)"
    if store.store_hash != recorded:  # computed from the table: what retrieval reads
        raise ArtifactError(f"{d / STORE_PARQUET}: its {len(store)} entries hash to {store.store_hash[:12]}… but "
                            f"{hash_path} records {recorded[:12]}…: {rerun}")
    if not (d / STORE_JSONL).is_file():
        raise ArtifactError(f"missing {d / STORE_JSONL}, the store's JSONL export: {rerun}")
    actual = sha256_file(d / STORE_JSONL)
    if actual != recorded:
        raise ArtifactError(f"{d / STORE_JSONL} has sha256 {actual[:12]}… but {hash_path} records {recorded[:12]}…: "
                            f"{rerun}")
    return store
