"""Seed 001 records: signatures, store entries, advisories and the injected bundle.

Every model forbids unknown fields (so a raw text can never ride along in a signature or
an entry) and carries the seed's bounds, so a bad value is a ``pydantic.ValidationError``
whose location names the field::

    >>> AdvisoryBundleMetaV1_1(memory_mode="on", topk=4, masked_injection=False,
    ...                        retrieval_executed=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    pydantic_core._pydantic_core.ValidationError: 1 validation error for AdvisoryBundleMetaV1_1
    topk
    ...

The store's Arrow schema (:data:`STORE_SCHEMA`) mirrors :class:`EpisodicMemoryEntryV1_1`
field for field (nested models become struct columns) plus one derived column,
``lexical_tokens``, that the retriever indexes; :func:`entries_to_table` and
:func:`table_to_entries` convert between the two.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Iterable, Literal, Optional

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = "1.1"
STORE_SCHEMA_VERSION = "1.1"

LANGUAGES = ("ko", "en", "other")
STRUCTURES = ("negation", "contrast", "irony", "none")
LENGTH_BUCKETS = ("short", "medium", "long")
ADVISORY_TYPES = ("successful_override", "failed_override_warning", "consistency_anchor")
STRENGTHS = ("weak", "moderate", "strong")
# Reasons returned by the injection gate (`should_inject_advisory_with_reason`).
GATE_REASONS = ("ok", "memory_off", "masked", "nothing_retrieved", "below_relevance_threshold", "label_hint")

MAX_MESSAGE_CHARS = 800
MAX_RETRIEVED = 3
MAX_WARNINGS = 5
# Signature fields compared by the retriever's first score component.
SIGNATURE_FIELDS = ("language", "detected_structure", "has_negation", "num_aspects", "length_bucket")

Language = Literal["ko", "en", "other"]
Structure = Literal["negation", "contrast", "irony", "none"]
LengthBucket = Literal["short", "medium", "long"]
AdvisoryType = Literal["successful_override", "failed_override_warning", "consistency_anchor"]
Strength = Literal["weak", "moderate", "strong"]
MemoryMode = Literal["off", "on", "silent"]
GateReason = Literal["ok", "memory_off", "masked", "nothing_retrieved", "below_relevance_threshold", "label_hint"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- query


class InputSignatureV1_1(_Model):
    """Coarse signature of a query or stored case (seed 001 section 1.2); never the raw text."""

    language: Language
    """``ko`` | ``en`` | ``other``."""
    detected_structure: Annotated[list[Structure], Field(min_length=1, max_length=4)]
    """Structures found by pattern (negation, contrast, irony), or ``["none"]``."""
    contrast_marker: Optional[Annotated[str, Field(max_length=32)]] = None
    """The first contrast marker found (``but``, ``하지만``, ...), if any."""
    has_negation: Optional[bool] = None
    """Whether a negation pattern was found."""
    num_aspects: Annotated[int, Field(ge=0)]
    """Number of distinct game entities the text names (seed: Stage1 ATE aspect count)."""
    length_bucket: LengthBucket
    """``short`` (< 50 characters) | ``medium`` (< 200) | ``long``."""

    @model_validator(mode="after")
    def _structure_consistent(self) -> "InputSignatureV1_1":
        ds = self.detected_structure
        if len(set(ds)) != len(ds):
            raise ValueError(f"detected_structure has duplicates: {ds}")
        if "none" in ds and len(ds) > 1:
            raise ValueError(f"detected_structure: 'none' cannot be combined with {ds}")
        return self


# --------------------------------------------------------------------------- store entry


class CaseSummaryV1_1(_Model):
    """What went wrong and what fixed it, in words (no raw objective, no walkthrough)."""

    symptom: Annotated[str, Field(max_length=600)]
    """What went wrong in the episode."""
    rationale_summary: Annotated[str, Field(max_length=600)]
    """What fixed it (the feedback that was applied and the outcome)."""
    risk_tags: Annotated[list[str], Field(max_length=12)] = []
    """Kinds of failure seen: invalid_action, repeated_action, examine_loop, failed_step, goal_not_reached,
    no_progress, feedback_<type>."""


class StageSnapshotV1_1(_Model):
    """The agent's first plan and actions."""

    first_actions: Annotated[list[str], Field(max_length=5)] = []
    """First actions as ``verb target`` (from the action JSON)."""
    first_reasoning: Optional[Annotated[str, Field(max_length=400)]] = None
    """The agent's first reasoning text, objective redacted, truncated."""


class FeedbackByTypeV1_1(_Model):
    """Distinct feedback texts of an episode, per seed-000 type, in order of first appearance."""

    user_preference: Annotated[list[str], Field(max_length=5)] = []
    spatial: Annotated[list[str], Field(max_length=5)] = []
    procedural: Annotated[list[str], Field(max_length=5)] = []
    general: Annotated[list[str], Field(max_length=5)] = []


class CorrectionV1_1(_Model):
    """The feedback that was applied to the agent during the episode."""

    corrected: bool
    """True when feedback was given on a step that was not a success (Failure or WiP)."""
    first_correction_turn: Optional[Annotated[int, Field(ge=0)]] = None
    """Turn index of the first corrective feedback."""
    num_feedback_lines: Annotated[int, Field(ge=0)] = 0
    """All feedback lines received."""
    by_type: FeedbackByTypeV1_1 = FeedbackByTypeV1_1()
    """Feedback texts per type."""


class EvaluationV1_1(_Model):
    """Outcome of the episode (success is TextWorld's ``won``)."""

    won: bool
    is_correct: Optional[bool] = None
    final_reward: float
    num_turns: Annotated[int, Field(ge=0)]
    num_invalid: Annotated[int, Field(ge=0)]
    num_repeated: Annotated[int, Field(ge=0)] = 0


class ProvenanceV1_1(_Model):
    """Where the entry comes from."""

    episode_id: str
    scene_id: str
    quest_id: str
    split: Optional[str] = None
    agent: Optional[str] = None
    model: Optional[str] = None
    seed: Optional[int] = None
    config_hash: Optional[str] = None


class EpisodicMemoryEntryV1_1(_Model):
    """One stored case (seed 001 section 3, "저장 형식"): one per collected episode."""

    schema_version: Literal["1.1"] = "1.1"
    entry_id: Annotated[str, Field(min_length=1)]
    input_signature: InputSignatureV1_1
    case_summary: CaseSummaryV1_1
    stage_snapshot: StageSnapshotV1_1
    correction: CorrectionV1_1
    evaluation: EvaluationV1_1
    provenance: ProvenanceV1_1
    scene_facts: Annotated[list[Annotated[str, Field(max_length=300)]], Field(max_length=400)] = []
    """Not part of the seed's entry: every scene fact the episode saw (:func:`pipeline.memory.scene.scene_facts`;
    ``rationale_summary`` keeps as many as its 600 characters hold), what a house's memory over its visits and the
    lessons across houses are built from (:mod:`pipeline.memory.knowledge`)."""


# --------------------------------------------------------------------------- advisories


class EvidenceV1_1(_Model):
    """Where an advisory comes from; never a label or an answer."""

    source_episode_ids: Annotated[list[str], Field(min_length=1, max_length=3)]
    risk_tags: Annotated[list[str], Field(max_length=12)] = []
    principle_id: Annotated[str, Field(min_length=1, max_length=64)]


class AdvisoryConstraintsV1_1(_Model):
    """Constraints the advisory obeys; always true (seed 001 section 2.3)."""

    no_label_hint: Literal[True] = True
    no_forcing: Literal[True] = True
    no_confidence_boost: Literal[True] = True


class AdvisoryV1_1(_Model):
    """One retrieved advisory (seed 001 section 2.3)."""

    schema_version: Literal["1.1"] = "1.1"
    advisory_id: Annotated[str, Field(pattern=r"^adv_\d{6}$")]
    advisory_type: AdvisoryType
    message: Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_CHARS)]
    strength: Strength
    relevance_score: Annotated[float, Field(ge=0.0, le=1.0)]
    evidence: EvidenceV1_1
    constraints: AdvisoryConstraintsV1_1 = AdvisoryConstraintsV1_1()


class AdvisoryBundleMetaV1_1(_Model):
    """Bundle metadata (seed 001 section 2.2) plus the gate's reason and the store hash."""

    memory_mode: MemoryMode
    topk: Annotated[int, Field(ge=0, le=MAX_RETRIEVED)]
    masked_injection: bool
    """True: ``retrieved`` is emptied before injection (content never shown)."""
    retrieval_executed: bool
    gate_reason: Optional[GateReason] = None
    """Reason returned by the injection gate (set once the gate ran)."""
    store_hash: Optional[str] = None
    """sha256 of the store the retrieval used (None when retrieval did not run)."""


class AdvisoryBundleV1_1(_Model):
    """The slot body merged into the agent's context (seed 001 section 2.2)."""

    schema_version: Literal["1.1"] = "1.1"
    memory_on: bool
    retrieved: Annotated[list[AdvisoryV1_1], Field(max_length=MAX_RETRIEVED)] = []
    warnings: Annotated[list[str], Field(max_length=MAX_WARNINGS)] = []
    meta: AdvisoryBundleMetaV1_1

    @model_validator(mode="after")
    def _consistent(self) -> "AdvisoryBundleV1_1":
        m = self.meta
        expected_on = m.memory_mode == "on" and not m.masked_injection
        if self.memory_on != expected_on:
            raise ValueError(
                f"memory_on={self.memory_on} but meta.memory_mode={m.memory_mode!r}, "
                f"meta.masked_injection={m.masked_injection} (memory_on is true only for mode 'on', unmasked)"
            )
        if self.retrieved and not self.memory_on:
            raise ValueError("retrieved must be empty when memory is off or masked")
        if len(self.retrieved) > m.topk:
            raise ValueError(f"retrieved has {len(self.retrieved)} advisories, more than meta.topk={m.topk}")
        return self


# --------------------------------------------------------------------------- Arrow (de)serialisation

_STR_LIST = pa.list_(pa.string())

STORE_SCHEMA = pa.schema(
    [
        ("entry_id", pa.string()),
        ("schema_version", pa.string()),
        (
            "input_signature",
            pa.struct(
                [
                    ("language", pa.string()),
                    ("detected_structure", _STR_LIST),
                    ("contrast_marker", pa.string()),
                    ("has_negation", pa.bool_()),
                    ("num_aspects", pa.int32()),
                    ("length_bucket", pa.string()),
                ]
            ),
        ),
        (
            "case_summary",
            pa.struct([("symptom", pa.string()), ("rationale_summary", pa.string()), ("risk_tags", _STR_LIST)]),
        ),
        ("stage_snapshot", pa.struct([("first_actions", _STR_LIST), ("first_reasoning", pa.string())])),
        (
            "correction",
            pa.struct(
                [
                    ("corrected", pa.bool_()),
                    ("first_correction_turn", pa.int32()),
                    ("num_feedback_lines", pa.int32()),
                    (
                        "by_type",
                        pa.struct(
                            [
                                ("user_preference", _STR_LIST),
                                ("spatial", _STR_LIST),
                                ("procedural", _STR_LIST),
                                ("general", _STR_LIST),
                            ]
                        ),
                    ),
                ]
            ),
        ),
        (
            "evaluation",
            pa.struct(
                [
                    ("won", pa.bool_()),
                    ("is_correct", pa.bool_()),
                    ("final_reward", pa.float64()),
                    ("num_turns", pa.int32()),
                    ("num_invalid", pa.int32()),
                    ("num_repeated", pa.int32()),
                ]
            ),
        ),
        (
            "provenance",
            pa.struct(
                [
                    ("episode_id", pa.string()),
                    ("scene_id", pa.string()),
                    ("quest_id", pa.string()),
                    ("split", pa.string()),
                    ("agent", pa.string()),
                    ("model", pa.string()),
                    ("seed", pa.int64()),
                    ("config_hash", pa.string()),
                ]
            ),
        ),
        ("scene_facts", _STR_LIST),
        # Derived (not part of the seed's entry): sorted distinct tokens of the symptom and
        # rationale summary, so the retriever can index 10^6 entries without re-tokenising.
        ("lexical_tokens", _STR_LIST),
    ]
)

ENTRY_COLUMNS = [n for n in STORE_SCHEMA.names if n != "lexical_tokens"]

_TOKEN_RE = re.compile(r"[0-9a-z_]+|[\uac00-\ud7a3]+")
# Function words that would make every entry overlap with every query.
STOPWORDS = frozenset(
    "a an the and or of to in on at into from for with by is are was were be been it its this that "
    "then than as after before while your you agent step steps turn turns".split()
)


def tokenize(text: str | None) -> list[str]:
    """Lower-cased word tokens (Latin words with digits/underscores, Hangul runs), stopwords dropped.

    Entity names stay whole (``Apple_2`` -> ``apple_2``). Used for both the query's
    ``query_lexical`` and the entries' ``lexical_tokens`` so the two always agree.
    """
    if not text:
        return []
    return [t for t in _TOKEN_RE.findall(text.lower()) if len(t) > 1 and t not in STOPWORDS]


def entry_lexical_tokens(entry: EpisodicMemoryEntryV1_1) -> list[str]:
    """Sorted distinct tokens of the entry's ``symptom`` and ``rationale_summary``."""
    cs = entry.case_summary
    return sorted(set(tokenize(cs.symptom)) | set(tokenize(cs.rationale_summary)))


def entries_to_table(entries: Iterable[EpisodicMemoryEntryV1_1 | dict[str, Any]]) -> pa.Table:
    """Validate entries and build the store table (rows in the given order)."""
    rows = []
    for i, e in enumerate(entries):
        model = e if isinstance(e, EpisodicMemoryEntryV1_1) else EpisodicMemoryEntryV1_1.model_validate(e)
        row = model.model_dump(mode="python")
        row["lexical_tokens"] = entry_lexical_tokens(model)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=STORE_SCHEMA)


def table_to_entries(table: pa.Table, validate: bool = False) -> list[dict[str, Any]]:
    """Store rows as entry dicts (the seed's ``episodic_store.jsonl`` shape)."""
    rows = table.select(ENTRY_COLUMNS).to_pylist()
    if validate:
        return [EpisodicMemoryEntryV1_1.model_validate(r).model_dump(mode="json") for r in rows]
    return rows
