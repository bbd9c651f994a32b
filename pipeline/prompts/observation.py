"""What a prompt shows besides the template: observation fields, the advisory slot, and
the memory object read back from a model's answer (seed 002 section 1, seed 001 2.1).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline.core.jsonscan import first_json_object
from pipeline.prompts.templates import safe_str

#: Observation fields a template may show; they change every turn, so a frozen
#: (per-episode) prompt keeps them as slots. See :func:`observation_variables`.
TURN_VARIABLES: tuple[str, ...] = (
    "step",
    "max_steps",
    "agent_location",
    "agent_inventory",
    "visible_entities",
    "available_actions",
    "admissible_commands",
    "description",
)

DEFAULT_SLOT_HEADING = "## Episodic Memory (advisories from similar past episodes)"


def _join(items: Any, empty: str = "nothing") -> str:
    if items is None:
        return empty
    if isinstance(items, str):
        return items or empty
    items = [safe_str(i) for i in items]
    return ", ".join(items) if items else empty


def observation_variables(observation: Mapping[str, Any] | None) -> dict[str, str]:
    """The :data:`TURN_VARIABLES` of an observation dict (contracts' observation shape).

    Lists are written comma-separated (``Cabinet_0, Drawer_1``), an empty one as
    ``nothing``; a missing field as ``unknown``, so a template always renders.
    """
    obs = observation or {}
    return {
        "step": safe_str(obs.get("step", "unknown")),
        "max_steps": safe_str(obs.get("max_steps", "unknown")),
        "agent_location": safe_str(obs.get("agent_location") or "unknown"),
        "agent_inventory": _join(obs.get("agent_inventory")),
        "visible_entities": _join(obs.get("visible_entities")),
        "available_actions": _join(obs.get("available_actions")),
        "admissible_commands": _join(obs.get("admissible_commands")),
        "description": safe_str(obs.get("description") or "unknown"),
    }


def plain_data(obj: Any) -> Any:
    """A pydantic model / OmegaConf node / dataclass as plain JSON-able Python."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, (DictConfig, ListConfig)):
        return OmegaConf.to_container(obj, resolve=True, enum_to_str=True)
    return obj


def render_memory_slot(
    bundle: Any,
    *,
    slot_name: str = "DEBATE_CONTEXT__MEMORY",
    exposed: bool,
    heading: str = DEFAULT_SLOT_HEADING,
) -> str:
    """The advisory block put into ``$memory_slot`` (seed 001 section 2.1).

    The bundle (``AdvisoryBundleV1_1`` or its dict) is merged into the context under
    ``slot_name`` as JSON only when it is exposed (C2 with the gate passed); otherwise the
    block is empty, so the model sees nothing of it (C1, C2_silent, a refused gate). The
    JSON is written as :func:`pipeline.memory.injection.block_text` writes it (indented,
    key-sorted, UTF-8 kept), so the placebo's length matching holds for the prompt text.

    Returns:
        ``"<heading>\\n{"<slot_name>": {...}}\\n\\n"`` or ``""`` (templates put
        ``${memory_slot}`` at the start of the line after a blank one).
    """
    if not exposed or bundle is None:
        return ""
    block = json.dumps({slot_name: plain_data(bundle)}, ensure_ascii=False, indent=2, sort_keys=True)
    return memory_slot_text(block, heading=heading)


def memory_slot_text(block: str, *, heading: str = DEFAULT_SLOT_HEADING) -> str:
    """``$memory_slot`` for an injected block (the context JSON); ``""`` for no block."""
    if not block:
        return ""
    return f"{heading}\n{block}\n\n" if heading else f"{block}\n\n"


def extract_json_object(text: str) -> dict | None:
    """The first JSON object (a dict) in a model's output, or None.

    A ``{`` that is never closed ends the search (a truncated answer gives None, not an
    object nested inside it); a balanced span that does not parse is skipped.
    """
    hit = first_json_object(text, stop_at_unclosed=True)
    return hit[2] if hit is not None else None


def memory_from_response(response: Any) -> dict | None:
    """The ``memory`` object of a model response (parsed dict or raw text), else None."""
    if isinstance(response, str):
        response = extract_json_object(response)
    if isinstance(response, Mapping):
        mem = response.get("memory")
        if isinstance(mem, Mapping):
            return dict(mem)
    return None
