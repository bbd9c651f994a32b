"""Episodic memory (seed 001): signatures, store, retrieval, advisories and injection.

The chain one task's block goes through (one call: :func:`build_memory_slot`; a condition's
block is built by its kind's object, ``pipeline.conditions.sources``, from these primitives)::

    SignatureBuilder.build(objective) -> Retriever.retrieve(store, signature, objective)
      -> AdvisoryBuilder -> InjectionController.build_slot_payload
      -> should_inject_advisory_with_reason -> context[memory.io.slot_memory_name]
"""

from pipeline.core.seeding import task_rng
from pipeline.memory.advisory import (
    AdvisoryBuilder,
    advisory_type_for,
    bundle_label_hints,
    compose_message,
    find_label_hints,
    task_answer,
)
from pipeline.memory.injection import (
    Exposure,
    InjectionController,
    MemorySlot,
    Retrieval,
    build_memory_slot,
    check_exposure,
    finish_slot,
    merge_slot,
    retrieve_for,
    should_inject_advisory_with_reason,
)
from pipeline.memory.retrieval import RetrievalHit, RetrievalIndex, Retriever, retrieve_loop
from pipeline.memory.schemas import (
    STORE_SCHEMA,
    AdvisoryBundleMetaV1_1,
    AdvisoryBundleV1_1,
    AdvisoryConstraintsV1_1,
    AdvisoryV1_1,
    CaseSummaryV1_1,
    CorrectionV1_1,
    EpisodicMemoryEntryV1_1,
    EvaluationV1_1,
    EvidenceV1_1,
    FeedbackByTypeV1_1,
    InputSignatureV1_1,
    ProvenanceV1_1,
    StageSnapshotV1_1,
    entries_to_table,
    table_to_entries,
    tokenize,
)
from pipeline.memory.signature import SignatureBuilder
from pipeline.memory.store import (
    EpisodicStore,
    build_entries,
    build_entry,
    content_hash,
    export_jsonl,
    load_store,
    write_store,
)

__all__ = [
    "AdvisoryBuilder", "AdvisoryBundleMetaV1_1", "AdvisoryBundleV1_1", "AdvisoryConstraintsV1_1", "AdvisoryV1_1",
    "CaseSummaryV1_1", "CorrectionV1_1", "EpisodicMemoryEntryV1_1", "EpisodicStore", "EvaluationV1_1",
    "EvidenceV1_1", "Exposure", "FeedbackByTypeV1_1", "InjectionController", "InputSignatureV1_1", "MemorySlot",
    "ProvenanceV1_1", "Retrieval", "RetrievalHit", "RetrievalIndex", "Retriever", "STORE_SCHEMA", "SignatureBuilder",
    "StageSnapshotV1_1", "advisory_type_for", "build_entries", "build_entry", "build_memory_slot",
    "check_exposure", "compose_message", "content_hash", "entries_to_table", "export_jsonl", "finish_slot",
    "bundle_label_hints", "find_label_hints", "load_store", "merge_slot", "retrieve_for", "retrieve_loop",
    "should_inject_advisory_with_reason", "table_to_entries", "task_answer", "task_rng", "tokenize", "write_store",
]
