"""The prompt organizer (seed 000 / seed 002 API): memory dict, grounding, system prompts.

:class:`PromptOrganizer` holds an episode's memory dict and variables and renders
``prompts.system_template`` (or the entropy template) with them; a per-episode "frozen"
prompt keeps the turn slots, which :func:`render_turn_prompt` fills each turn.

:meth:`PromptOrganizer.freeze` is the frozen render as a function of its inputs: it reads
none of the organizer's episode state and changes none, and returns the prompt with the
memory block it shows (what the ``render`` stage stores)::

    org = PromptOrganizer.from_config(cfg, root=root)
    frozen = org.freeze({"objective": task["objective"], "scene": task["scene_id"]},
                        slot.injected_block_text, ["data/grounding_merged/scene_0.md"])
    frozen.text, frozen.memory_block
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from omegaconf import DictConfig

from pipeline.core.conf_schema import Config, PromptsConfig
from pipeline.core.config import project_root, section
from pipeline.grounding import grounding_content, split_grounding_paths
from pipeline.prompts.observation import (
    TURN_VARIABLES,
    memory_from_response,
    memory_slot_text,
    observation_variables,
    plain_data,
    render_memory_slot,
)
from pipeline.prompts.templates import load_template, safe_str, system_prompt_interp


@dataclass(frozen=True)
class FrozenPrompt:
    """A per-episode ("frozen") system prompt and the memory block it shows.

    Attributes:
        text: The prompt with the episode slots filled and the turn slots and
            ``$memory[...]`` kept (fill it per turn with :func:`render_turn_prompt`).
        memory_block: Exactly what ``$memory_slot`` inserted (``""`` when nothing).
    """

    text: str
    memory_block: str


class PromptOrganizer:
    """Holds the memory dict and renders system prompts (seed 000 / seed 002 names).

    Example:
        >>> org = PromptOrganizer({"system_template": "conf/templates/system_compact.txt"})  # doctest: +SKIP
        >>> org.set_variables(objective="Put Apple_2 in Fridge_0", scene="scene_0")  # doctest: +SKIP
        >>> org.update_memory_from_response('{"action": "look", "target": null, '  # doctest: +SKIP
        ...                                 '"memory": {"previous_action": "look"}}')
        >>> text = org.get_system_prompt(observation=obs)  # doctest: +SKIP

    Args:
        prompts_cfg: ``cfg.prompts``; a dict (or None) is merged over the
            :class:`~pipeline.core.conf_schema.PromptsConfig` defaults.
        root: Project root for relative template and grounding paths.
        grounding_file_path: Default grounding files (str / list / None) used when
            ``get_system_prompt`` is called without ``grounding_file_path``.
        slot_name: Context key the advisory bundle is merged under
            (``cfg.memory.io.slot_memory_name``).
    """

    def __init__(
        self,
        prompts_cfg: PromptsConfig | Mapping[str, Any] | None = None,
        *,
        root: str | os.PathLike | None = None,
        grounding_file_path: str | Sequence[str] | None = None,
        slot_name: str = "DEBATE_CONTEXT__MEMORY",
    ) -> None:
        # The composed config's section is used as it is (its interpolations resolve
        # against the whole config); a hand-built dict gets the schema's defaults and checks.
        cfg = prompts_cfg if isinstance(prompts_cfg, DictConfig) else section(PromptsConfig, prompts_cfg)
        self.root = Path(root) if root is not None else None
        self.system_template_path: str = cfg.system_template
        self.entropy_template_path: str = cfg.entropy_template
        self.strict: bool = cfg.strict
        self.missing_memory_value: str = cfg.missing_memory_value
        self.empty_string_value: str = cfg.empty_string_value
        self.max_depth: int = cfg.max_depth
        self.empty_grounding_text: str = cfg.empty_grounding_text
        self.slot_heading: str = cfg.memory_slot_heading
        self.memory_merge_defaults: bool = cfg.memory_merge_defaults
        self.memory_defaults: dict = copy.deepcopy(dict(plain_data(cfg.memory_defaults)))
        self.grounding_file_path = grounding_file_path
        self.slot_name = slot_name
        self.memory_dict: dict = copy.deepcopy(self.memory_defaults)
        self.variables: dict[str, Any] = {}
        self.memory_slot: str = ""
        self._templates: dict[str, str] = {}
        self._grounding_cache: dict[tuple, str] = {}

    @classmethod
    def from_config(cls, cfg: Config, *, root: str | os.PathLike | None = None) -> "PromptOrganizer":
        """Build from the whole composed config (prompts, grounding files, slot name)."""
        files = plain_data(cfg.grounding.files) if cfg.grounding.files else None
        return cls(cfg.prompts, root=root, grounding_file_path=files, slot_name=cfg.memory.io.slot_memory_name)

    # -- memory dict (seed 002 section 1) -------------------------------------------
    def set_memory_dict(self, d: Mapping[str, Any] | None) -> None:
        """Replace the memory dict (None: back to the configured defaults)."""
        if d is None:
            self.memory_dict = copy.deepcopy(self.memory_defaults)
            return
        d = plain_data(d)
        if not isinstance(d, Mapping):
            raise TypeError(f"memory dict must be a mapping, got {type(d).__name__}")
        self.memory_dict = copy.deepcopy(dict(d))

    def reset_memory(self) -> None:
        """Start of an episode: the memory dict becomes ``prompts.memory_defaults``."""
        self.set_memory_dict(None)

    def update_memory_from_response(self, response: Any) -> bool:
        """Take the ``memory`` object of a model response as the next memory dict.

        The whole object becomes the memory dict (seed 002 section 1); with
        ``prompts.memory_merge_defaults`` a top-level key it lacks keeps its default value
        (so a template's ``$memory[notes]`` does not warn every turn the model omits it).

        Args:
            response: The parsed JSON response (dict) or the raw generated text.

        Returns:
            True when the response carried a ``memory`` object (the dict was replaced);
            False otherwise (the memory dict is kept).
        """
        mem = memory_from_response(response)
        if mem is None:
            return False
        if self.memory_merge_defaults:
            mem = {**self.memory_defaults, **mem}
        self.set_memory_dict(mem)
        return True

    def memory_json(self) -> str:
        """The memory dict as canonical JSON (the per-turn ``memory`` column)."""
        return json.dumps(self.memory_dict, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                          default=safe_str)

    # -- per-episode context -----------------------------------------------------------
    def set_variables(self, **variables: Any) -> None:
        """Set episode-level variables (objective, scene, ...)."""
        self.variables.update(variables)

    def set_memory_slot(self, bundle: Any, *, exposed: bool) -> str:
        """Set the advisory slot (seed 001): its JSON goes into ``$memory_slot`` only if exposed."""
        self.memory_slot = render_memory_slot(bundle, slot_name=self.slot_name, exposed=exposed,
                                              heading=self.slot_heading)
        return self.memory_slot

    def set_memory_block(self, block: str) -> str:
        """Set ``$memory_slot`` from an injected block text (``MemorySlot.injected_block_text``)."""
        self.memory_slot = memory_slot_text(block, heading=self.slot_heading)
        return self.memory_slot

    def grounding_content(self, grounding_file_path: str | Sequence[str] | None = None) -> str:
        """``$grounding_content`` for the given files (None: the default files)."""
        src = self.grounding_file_path if grounding_file_path is None else grounding_file_path
        paths = split_grounding_paths(src)
        if not paths:
            return self.empty_grounding_text
        # Cached per (files, mtimes, sizes): a prompt is rendered every turn, the files
        # change only between episodes.
        key = (tuple(paths), tuple(self._stat(p) for p in paths))
        text = self._grounding_cache.get(key)
        if text is None:
            # JSON files merged and rendered as Markdown (H3 -> H4), TXT / Markdown files
            # joined with "\n\n---\n\n"; a corrupt file is skipped with a warning.
            text = grounding_content(paths, root=self._root())
            if len(self._grounding_cache) >= 256:
                self._grounding_cache.clear()
            self._grounding_cache[key] = text
        return text if text.strip() else self.empty_grounding_text

    def _root(self) -> Path:
        return self.root if self.root is not None else project_root()

    def _stat(self, p: str) -> tuple[int, int]:
        try:
            st = os.stat(p if os.path.isabs(p) else os.path.join(self._root(), p))
            return st.st_mtime_ns, st.st_size
        except OSError:
            return -1, -1

    def template(self, path: str) -> str:
        if path not in self._templates:
            self._templates[path] = load_template(path, self._root())
        return self._templates[path]

    # -- system prompts (seed 000 API) ----------------------------------------------
    def _interp(self, template: str, name: str, variables: Mapping[str, Any], **kw: Any) -> str:
        return system_prompt_interp(
            template, variables, self.memory_dict, template_name=name, strict=self.strict,
            missing_memory_value=self.missing_memory_value, empty_string_value=self.empty_string_value,
            max_depth=self.max_depth, **kw)

    def _variables(self, memory_slot: str, episode: Mapping[str, Any], grounding_file_path: Any, observation: Any,
                   extra: Mapping[str, Any]) -> dict:
        # Precedence, lowest first: slot, episode variables, grounding, observation, extra.
        variables = {"memory_slot": memory_slot, **episode}
        variables["grounding_content"] = self.grounding_content(grounding_file_path)
        if observation is not None:
            variables.update(observation_variables(observation))
        variables.update(extra)
        return variables

    def get_system_prompt(self, grounding_file_path: str | Sequence[str] | None = None, *,
                          observation: Mapping[str, Any] | None = None, **variables: Any) -> str:
        """Render ``prompts.system_template`` with grounding, slot, memory and observation.

        Args:
            grounding_file_path: Grounding files (str, comma-separated str, list, or None
                for the organizer's default files), merged into ``$grounding_content``.
            observation: The current observation dict (fills :data:`TURN_VARIABLES`).
            **variables: Further variables (override the episode-level ones).
        """
        path = self.system_template_path
        vs = self._variables(self.memory_slot, self.variables, grounding_file_path, observation, variables)
        return self._interp(self.template(path), path, vs)

    def get_verbalized_entropy_system_prompt(self, grounding_file_path: str | Sequence[str] | None = None, *,
                                             observation: Mapping[str, Any] | None = None,
                                             **variables: Any) -> str:
        """As :meth:`get_system_prompt`, with ``prompts.entropy_template`` (the model states
        a probability for each candidate action; parse with :func:`parse_verbalized_distribution`)."""
        path = self.entropy_template_path
        vs = self._variables(self.memory_slot, self.variables, grounding_file_path, observation, variables)
        return self._interp(self.template(path), path, vs)

    def freeze_system_prompt(self, grounding_file_path: str | Sequence[str] | None = None, *,
                             entropy: bool = False, **variables: Any) -> str:
        """The per-episode prompt: episode slots filled, turn slots and ``$memory[...]`` kept.

        Render it per turn with :meth:`render_turn`; the result equals
        :meth:`get_system_prompt` with the same state. It reads the slot and the variables
        set on the organizer; :meth:`freeze` takes them as arguments instead.
        """
        return self._frozen_text(self.memory_slot, self.variables, grounding_file_path, variables, entropy)

    def freeze(self, variables: Mapping[str, Any], block: str = "",
               grounding_file_path: str | Sequence[str] | None = None, *, entropy: bool = False) -> FrozenPrompt:
        """The per-episode prompt of the given inputs, and the memory block it shows.

        The text :meth:`set_memory_block` (``block``) then :meth:`freeze_system_prompt`
        (``grounding_file_path, **variables``) give on an organizer with no variables set,
        without reading or setting its variables or ``memory_slot``: one organizer freezes
        many tasks' prompts, in any order, and each result depends on its arguments only.

        Args:
            variables: The episode's variables (objective, scene, ...); as the keywords of
                :meth:`freeze_system_prompt`, they override the computed
                ``grounding_content``.
            block: The injected block text (``MemorySlot.injected_block_text``; ``""``: none),
                shown under ``prompts.memory_slot_heading`` (:func:`memory_slot_text`).
            grounding_file_path: Grounding files, as for :meth:`grounding_content` (None:
                the organizer's default files).
            entropy: Freeze ``prompts.entropy_template`` instead of the system template.

        Raises:
            ValueError: ``variables`` sets ``memory_slot`` (the returned ``memory_block``
                would not be what the prompt shows: pass the block as ``block``).
        """
        if "memory_slot" in variables:
            raise ValueError("PromptOrganizer.freeze: pass the memory block as `block`, not as the variable "
                             "memory_slot")
        memory_block = memory_slot_text(block, heading=self.slot_heading)
        return FrozenPrompt(self._frozen_text(memory_block, {}, grounding_file_path, variables, entropy), memory_block)

    def _frozen_text(self, memory_slot: str, episode: Mapping[str, Any], grounding_file_path: Any,
                     extra: Mapping[str, Any], entropy: bool) -> str:
        path = self.entropy_template_path if entropy else self.system_template_path
        vs = self._variables(memory_slot, episode, grounding_file_path, None, extra)
        return self._interp(self.template(path), path, vs, keep=TURN_VARIABLES, keep_memory=True)

    def render_turn(self, frozen_prompt: str, observation: Mapping[str, Any] | None = None, *,
                    template_name: str = "<frozen prompt>") -> str:
        """Fill a frozen prompt's turn slots with the observation and the memory dict."""
        return self._interp(frozen_prompt, template_name, observation_variables(observation))


def render_turn_prompt(frozen_prompt: str, observation: Mapping[str, Any] | None, memory: Mapping[str, Any] | None,
                       *, template_name: str = "<frozen prompt>", **kw: Any) -> str:
    """Fill a frozen (per-episode) prompt with one turn's observation and memory dict."""
    return system_prompt_interp(frozen_prompt, observation_variables(observation), memory,
                                template_name=template_name, **kw)


def task_prompt(organizer: PromptOrganizer, objective: str, scene_id: str, grounding: str | None,
                block: str = "") -> FrozenPrompt:
    """The one assembly of a task's frozen system prompt: objective, grounding text and
    memory block -> :class:`FrozenPrompt` (:meth:`PromptOrganizer.freeze`, pure).

    The ``render`` stage's :class:`~pipeline.conditions.render.Renderer` (every eval
    prompt) and the policy's demonstrations (:func:`pipeline.policy.demos.freeze_prompt`)
    both call it, so a demonstration's prompt is built exactly as an eval prompt is::

        frozen = task_prompt(org, "Put Apple_2 in Fridge_0", "scene_0", grounding_text, block)
        frozen.text, frozen.memory_block

    Args:
        organizer: Its templates and settings are read; its episode state is neither read
            nor changed.
        objective: ``$objective``.
        scene_id: ``$scene``.
        grounding: ``$grounding_content`` as it stands in the prompt; None: the content of
            the organizer's default grounding files (what the ``llm`` agent renders for
            itself when it is given no prompt).
        block: The injected memory block (``MemorySlot.injected_block_text``; ``""``: none).
    """
    variables = {"objective": objective, "scene": scene_id}
    if grounding is not None:
        variables["grounding_content"] = grounding
    return organizer.freeze(variables, block)
