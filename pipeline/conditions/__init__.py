"""Experimental conditions: what each one injects into the prompt, and the evidence that it did.

A condition (``conf/condition/<name>.yaml``, schema :class:`~pipeline.core.conf_schema.ConditionConfig`)
says whether the scene's grounding is in the prompt (``grounding``) and which memory block it
shows (``kind``: none, memory, silent, placebo, oracle): the two are orthogonal. Each kind is
one object of :mod:`~pipeline.conditions.sources`, which builds the block and names the render
checks only it has. The standard conditions: C0 (no grounding, no memory), C1 (grounding, no
memory), C2 (grounding, the store's advisories shown), C2_silent (retrieval runs, nothing
shown), C2_placebo (other scenes' advisories, C2's count and length), C2_oracle (the task's
expert plan shown: the positive control).

To add a condition: write ``conf/condition/<name>.yaml`` naming its ``kind``, list it under
``condition`` in ``conf/config.yaml`` (and in ``experiment.comparisons`` to compare it). A new
kind of memory block is one class in :mod:`~pipeline.conditions.sources` and one member of
``ConditionKind``; the evidence checks (:mod:`~pipeline.conditions.evidence`) hold every
condition to what its kind says.

The stored ``system_prompt`` is the per-episode ("frozen") prompt: everything fixed for the
episode is in it verbatim, and the per-turn slots (observation fields, ``$memory[...]``)
are kept for the agent to fill each turn with
``pipeline.prompts.render_turn_prompt(system_prompt, observation, memory_dict)`` (``$`` in
inserted text is escaped as ``$$`` so that fill reproduces it exactly).

Modules:

- :mod:`~pipeline.conditions.sources`: one object per kind of memory block (:func:`source_for`,
  :func:`memory_slot`: one task's block under a condition or an advisory variant);
- :mod:`~pipeline.conditions.placebo` and :mod:`~pipeline.conditions.oracle`: what the placebo
  and the positive control inject (:func:`read_verified_steps`: the oracle's plan read back);
- :mod:`~pipeline.conditions.schema`: the prompts' Parquet contract (:data:`PROMPTS_SCHEMA`,
  :func:`prompts_table`) and the eval tasks it is rendered for (:func:`load_eval_tasks`);
- :mod:`~pipeline.conditions.render`: :class:`Renderer` (one task under one condition: one
  row), :func:`render_conditions` (the ``render`` stage's core: every configured condition rendered
  once, the given ones checked), :func:`render_condition` (one of them) and
  :func:`run_evidence_checks` (the checks that apply to a condition, run with its renderer);
- :mod:`~pipeline.conditions.evidence`: the evidence checks, pure over rows, and :class:`EvidenceError`;
- :mod:`~pipeline.conditions.hints`: whether a prompt's grounding or memory block reveals
  the task's answer (counted per row, not enforced);
- :mod:`~pipeline.conditions.length`: the unit a memory block's length is measured in
  (:func:`block_length_for`: the model's tokens, or characters).

The ``render`` stage (``python -m pipeline.stages.render``) writes the rows of every condition::

    from pipeline.conditions import block_length_for, load_eval_tasks, prompts_table, render_conditions

    rendered = render_conditions(load_eval_tasks(root, cfg), list(cfg.condition), cfg, store, root,
                                 block_length_for(cfg, root))
    rows, report = rendered["C2"]
    write_parquet(prompts_table(rows), out, sort_by=["scene_id", "quest_id"])
"""

from pipeline.conditions.evidence import (
    PLACEBO_UNAVAILABLE,
    EvidenceError,
    check_injected_blocks,
    check_masked_identical,
    check_no_advisory_text,
    check_no_grounding_text,
    check_only_block_differs,
    check_oracle_content,
    check_placebo_matched,
    placebo_unavailable,
)
from pipeline.conditions.hints import label_hint_of, label_hint_totals, task_answer
from pipeline.conditions.length import BlockLength, block_length_for
from pipeline.conditions.oracle import read_verified_steps
from pipeline.conditions.render import (
    PROBE_OBSERVATION,
    Renderer,
    grounding_files_for,
    render_condition,
    render_conditions,
    run_evidence_checks,
)
from pipeline.conditions.sources import MemorySource, SlotRequest, is_exposed, memory_slot, placebo_reference, source_for
from pipeline.conditions.schema import (
    LABEL_HINT_COLUMNS,
    PROMPTS_SCHEMA,
    PROMPTS_SCHEMA_VERSION,
    load_eval_tasks,
    prompts_table,
    task_id,
)
# What render_condition(s) and block_length_for raise for a bad config, named here too as before.
from pipeline.core.config import ConfigError

__all__ = [
    "LABEL_HINT_COLUMNS", "PLACEBO_UNAVAILABLE", "PROBE_OBSERVATION", "PROMPTS_SCHEMA", "PROMPTS_SCHEMA_VERSION",
    "BlockLength", "ConfigError", "EvidenceError", "MemorySource", "Renderer", "SlotRequest", "block_length_for",
    "check_injected_blocks", "memory_slot", "read_verified_steps", "source_for",
    "check_masked_identical", "check_no_advisory_text", "check_no_grounding_text", "check_only_block_differs",
    "check_oracle_content", "check_placebo_matched", "grounding_files_for", "is_exposed", "label_hint_of",
    "label_hint_totals", "load_eval_tasks", "placebo_reference", "placebo_unavailable", "prompts_table",
    "render_condition", "render_conditions", "run_evidence_checks", "task_answer", "task_id",
]
