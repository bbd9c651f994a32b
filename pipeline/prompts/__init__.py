"""System prompt templates and the memory renderer (seed 002; seed 000's prompt API).

Templates are plain text files (``conf/templates/*.txt``) with four kinds of slots, all
*substituted, never evaluated*::

    $name  ${name}             a variable (objective, grounding_content, memory_slot, ...)
    $memory[key][sub]...       a value of the memory dict, any depth, keys [a-zA-Z0-9_-]+
    $$                         a literal dollar sign

Example:
    >>> system_prompt_interp("Goal: $objective\\nPlan: $memory[plan]",
    ...                      {"objective": "Put Apple_2 in Fridge_0"},
    ...                      memory={"plan": ["open Fridge_0", "put Apple_2"]})
    'Goal: Put Apple_2 in Fridge_0\\nPlan: - open Fridge_0\\n- put Apple_2'

A missing plain variable is an error naming it and the template (strict by default). A
missing ``$memory[...]`` key at any level renders as ``"None"`` (configurable), prints a
strong warning on stderr and logs ``logging.warning`` with the template and the key path.

Values are inserted once: text coming from a variable or the memory dict is never
scanned for slots again, so user feedback or model output containing ``$x`` cannot
inject anything.

Per-episode and per-turn rendering. The ``render`` stage renders, per task, everything
that is fixed for an episode (objective, grounding, the advisory slot) and *keeps* the
per-turn slots (the observation fields in :data:`TURN_VARIABLES` and ``$memory[...]``)
as they are, escaping any ``$`` in the inserted text. That "frozen" prompt is what the
parquet stores; at each turn the agent calls :func:`render_turn_prompt` (or
``PromptOrganizer.render_turn``) with the observation and the memory dict, which gives
exactly the text a one-pass render of the template would give.

Modules: :mod:`~pipeline.prompts.templates` (substitution, memory renderer, template
files), :mod:`~pipeline.prompts.observation` (turn variables, advisory slot, memory
from a response), :mod:`~pipeline.prompts.entropy` (verbalized distributions) and
:mod:`~pipeline.prompts.organizer` (:class:`PromptOrganizer`; its pure ``freeze`` gives a
:class:`FrozenPrompt`; :func:`task_prompt`, the one assembly of a task's frozen prompt from
its objective, grounding text and memory block, used by the ``render`` stage and the policy's
demonstrations alike). ``$grounding_content`` comes from :mod:`pipeline.grounding`.
"""

from pipeline.grounding import split_grounding_paths
from pipeline.prompts.entropy import parse_verbalized_distribution
from pipeline.prompts.observation import (
    DEFAULT_SLOT_HEADING,
    TURN_VARIABLES,
    extract_json_object,
    memory_from_response,
    memory_slot_text,
    observation_variables,
    render_memory_slot,
)
from pipeline.prompts.organizer import FrozenPrompt, PromptOrganizer, render_turn_prompt, task_prompt
from pipeline.prompts.templates import (
    DEPTH_CAP_PLACEHOLDER,
    PromptTemplateError,
    load_template,
    render_memory_value,
    system_prompt_interp,
    template_slots,
)

__all__ = [
    "DEFAULT_SLOT_HEADING", "DEPTH_CAP_PLACEHOLDER", "FrozenPrompt", "PromptOrganizer", "PromptTemplateError",
    "TURN_VARIABLES", "extract_json_object", "load_template", "memory_from_response", "memory_slot_text", "observation_variables",
    "parse_verbalized_distribution", "render_memory_slot", "render_memory_value", "render_turn_prompt",
    "split_grounding_paths", "system_prompt_interp", "task_prompt", "template_slots",
]
