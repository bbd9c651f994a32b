"""What every generation backend shares: the :class:`Backend` seam, :class:`Generation`, errors, prompts.

A backend takes a batch of chat conversations, one sampling seed per conversation, and
returns one :class:`Generation` per conversation (the JSON action tracked token by token
by ``pipeline.llm.tracker``). Runtime failures come back as a :class:`Generation` with
``error`` set; configuration errors raise :class:`BackendError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

from pipeline.core.config import ConfigError
from pipeline.llm.tracker import TrackedTurn

Messages = list[dict]  # [{"role": "system"|"user"|"assistant", "content": str}, ...]


class BackendError(RuntimeError):
    """A backend that cannot be built or a request that failed (message names the cause)."""


class BackendConfigError(BackendError, ConfigError):
    """A request the server refuses for every conversation: a wrong key (HTTP 401/403), a model
    it does not serve (404). Raised from ``generate`` whatever ``agent.on_backend_error`` says
    (recording every turn as failed would only waste the run); a :class:`ConfigError` too, so a
    stage reports it as the configuration error it is."""


@dataclass
class Generation:
    """One conversation's generated turn, with the tracked JSON action and its accounting."""

    prompt: str  # exact text the model was conditioned on (chat template applied)
    prompt_tokens: int
    generated_tokens: int
    text: str  # generated text (special tokens skipped)
    generated_ids: list[int] | None = None  # None: the server returned no token ids
    action_token_mask: list[bool] | None = None  # one per generated token (None: no token data)
    action_token_start_index: int | None = None
    action_token_end_index: int | None = None  # exclusive
    tracking_method: str = "none"  # stream | fallback | none
    stop_reason: str = "error"  # json_closed | max_new_tokens | eos | error
    action_text: str | None = None  # the JSON action's text, exactly as generated
    logprobs: list[float] | None = None  # per generated token (model distribution)
    error: str | None = None
    # Constrained decodings (``agent.decoding``, pipeline.llm.constrain): the admissible action
    # the constraint fixed (an index into the ``admissible`` list given), and under ``choice``
    # every admissible action's summed log-probability, in that list's order.
    decoding: str = "free"
    chosen_index: int | None = None
    action_scores: list[float] | None = None

    @classmethod
    def from_turn(cls, prompt: str, prompt_tokens: int, turn: TrackedTurn) -> "Generation":
        return cls(
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            generated_tokens=turn.num_tokens,
            text=turn.text,
            generated_ids=turn.generated_ids,
            action_token_mask=turn.action_token_mask,
            action_token_start_index=turn.action_token_start_index,
            action_token_end_index=turn.action_token_end_index,
            tracking_method=turn.tracking_method,
            stop_reason=turn.stop_reason,
            action_text=turn.action_text,
            logprobs=turn.logprobs,
        )

    @classmethod
    def failed(cls, prompt: str, error: str, prompt_tokens: int = 0) -> "Generation":
        return cls(prompt=prompt, prompt_tokens=prompt_tokens, generated_tokens=0, text="", error=error)


class Backend(Protocol):
    """The generation seam the ``llm`` agent (and the ``llm`` grounding generator) talks to.

    Built by :func:`pipeline.llm.backends.make_backend` from ``cfg.model`` and
    ``cfg.sampling``; implemented by
    :class:`~pipeline.llm.backends.transformers.TransformersBackend` and
    :class:`~pipeline.llm.backends.openai.OpenAIBackend`.

    Attributes:
        name: the model's name (directory, hub id or served model name).
    """

    name: str

    def generate(self, batch: Sequence[Messages], seeds: Sequence[int] | None = None, *,
                 max_new_tokens: int | None = None, early_stop: bool | None = None) -> list[Generation]:
        """Generate one turn for every conversation in ``batch``.

        Args:
            batch: conversations (lists of chat messages).
            seeds: one sampling seed per conversation (default ``sampling.seed``); a
                conversation's output depends on its seed, never on the rest of the batch.
            max_new_tokens, early_stop: override ``sampling.*``.

        Returns:
            One :class:`Generation` per conversation, in order; a runtime failure is a
            Generation with ``error`` set and ``stop_reason="error"``.
        """
        ...


class ActionConstrainedBackend(Backend, Protocol):
    """An optional backend capability: the JSON action constrained to the admissible ones.

    A backend with ``constrains_actions`` true takes ``admissible`` in :meth:`generate`: per
    conversation, the admissible action dicts (``{"action", "target", ...}``, as
    :func:`pipeline.agents.base.candidate_actions` gives them) or None (no constraint), and
    ``decoding``, one of its ``decodings`` (``agent.decoding``: ``free`` | ``constrained`` |
    ``choice``, :mod:`pipeline.llm.constrain`). The ``llm`` agent passes them only to such a
    backend, so backends without it keep working. Implemented by
    :class:`~pipeline.llm.backends.transformers.TransformersBackend` (all three decodings,
    token masks in its own decode loop) and by
    :class:`~pipeline.llm.backends.openai.OpenAIBackend` when ``model.structured_output`` is
    not ``none`` (``constrained``: the server enforces the constraint).
    """

    constrains_actions: bool
    decodings: tuple[str, ...]

    def generate(self, batch: Sequence[Messages], seeds: Sequence[int] | None = None, *,
                 max_new_tokens: int | None = None, early_stop: bool | None = None,
                 admissible: Sequence[Sequence[dict] | None] | None = None,
                 decoding: str = "constrained", reasoning_max_tokens: int = 32) -> list[Generation]:
        ...


@dataclass
class ProbeResult:
    """What a server did with one form of ``model.structured_output`` in the start-up probe."""

    form: str  # json_schema | json_object | grammar | choice | guided_choice | regex
    outcome: str  # enforced | ignored (accepted, answer unconstrained) | refused (an error) | failed (no answer)
    detail: str  # the server's own words (its error), or the answer it gave


@dataclass
class ConstraintProbe:
    """How a server constrains the JSON action, settled once at start (``metrics/collect.json``:
    ``structured_output``). ``form`` is what every request carries; ``none`` with a ``fallback``
    when the server enforces no form and ``agent.decoding=auto`` went on free."""

    configured: str  # model.structured_output
    form: str  # the form in use: one of StructuredOutput, none when no form is enforced
    tried: list[ProbeResult]  # in the order probed (empty: nothing probed)
    fallback: str | None = None  # why the run is free although a constraint was configured


@runtime_checkable
class SettlesConstraint(Protocol):
    """An optional backend capability: a server's action constraint, probed once at start.

    The ``llm`` agent calls it before it picks its decoding (``agent.decoding`` ``auto`` or
    ``constrained``); implemented by :class:`~pipeline.llm.backends.openai.OpenAIBackend`."""

    constraint: ConstraintProbe | None  # None until settled

    def settle_constraint(self, required: bool) -> ConstraintProbe:
        """Probe the server (once; later calls return the first answer) and constrain with what it enforces.

        Raises:
            BackendConfigError: ``required`` and the server enforces no form (the message
                quotes the server and names the options).
        """
        ...


@runtime_checkable
class CachesPrompts(Protocol):
    """An optional backend capability: a prompt cache whose reuse the run's metrics report
    (``prompt_cache`` in ``metrics/collect.json``, ``metrics/eval/<C>.json``). Implemented by
    :class:`~pipeline.llm.backends.transformers.TransformersBackend`."""

    def prompt_cache_stats(self) -> dict[str, int]:
        """Prompt tokens reused from the cache and encoded since it was set; entries and bytes held."""
        ...

    def clear_prompt_cache(self) -> None:
        """Drop every cached prompt (the counts stay): what follows is computed from a clean
        state, as after a restart (a collection calls it before every batch)."""
        ...


def plain_prompt(messages: Messages) -> str:
    """The prompt format for tokenizers without a chat template (and for stored API prompts).

    Role-tagged blocks, ending where the assistant's answer starts::

        ### System:
        <system prompt>

        ### User:
        <observation>

        ### Assistant:
    """
    blocks = [f"### {str(m['role']).capitalize()}:\n{m['content']}" for m in messages]
    return "\n\n".join(blocks) + "\n\n### Assistant:\n"


def render_prompt(tokenizer: Any, messages: Messages) -> tuple[str, bool]:
    """Prompt text for ``messages``: the tokenizer's chat template when it has one.

    Returns ``(text, add_special_tokens)``: a chat template already writes BOS and other
    special tokens, so its text is tokenized without adding them again. Templates that
    reject a ``system`` role get the system prompt prepended to the first user message.
    """
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), False
        except Exception:  # e.g. "System role not supported"
            merged = _merge_system(messages)
            return tokenizer.apply_chat_template(merged, tokenize=False, add_generation_prompt=True), False
    return plain_prompt(messages), True


def _merge_system(messages: Messages) -> Messages:
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if system and rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    elif system:
        rest.insert(0, {"role": "user", "content": system})
    return rest


def check_seeds(batch: Sequence[Messages], seeds: Sequence[int] | None, default_seed: int) -> list[int]:
    """One seed per conversation: ``seeds`` as a list, or ``default_seed`` for every one.

    Raises:
        ValueError: ``seeds`` and ``batch`` differ in length.
    """
    out = list(seeds) if seeds is not None else [int(default_seed)] * len(batch)
    if len(out) != len(batch):
        raise ValueError(f"generate: {len(batch)} conversations but {len(out)} seeds")
    return out
