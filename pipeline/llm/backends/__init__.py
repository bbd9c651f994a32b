"""Generation backends for the ``llm`` agent: local ``transformers`` models and OpenAI-compatible APIs.

Both take a batch of chat conversations and return one :class:`Generation` per
conversation, with the JSON action tracked token by token (``pipeline.llm.tracker``)::

    backend = make_backend(cfg.model, cfg.sampling)        # picks by cfg.model.backend
    gens = backend.generate([messages_a, messages_b], seeds=[11, 12])
    gens[0].action_text, gens[0].action_token_mask, gens[0].stop_reason

- :mod:`~pipeline.llm.backends.base`: the :class:`Backend` protocol (and the optional
  :class:`ActionConstrainedBackend` capability: ``agent.decoding``), :class:`Generation`,
  :class:`BackendError` and the prompt rendering both backends share.
- :mod:`~pipeline.llm.backends.transformers` (``model.backend=transformers``): any causal
  LM directory (or hub id) that ``AutoModelForCausalLM`` loads, batched with a KV cache,
  one seeded ``torch.Generator`` per row, rows leaving the batch when their JSON action
  closes (``sampling.early_stop``), at EOS or at ``max_new_tokens``.
- :mod:`~pipeline.llm.backends.openai` (``model.backend=openai``): ``POST
  {model.base_url}/chat/completions`` (OpenAI, vLLM, SGLang, ``transformers serve``, ...)
  through the official ``openai`` client, one request per conversation,
  ``model.max_concurrency`` in flight, key from the environment variable
  ``model.api_key_env`` (never logged or stored), retries with exponential backoff on
  connection errors, timeouts, truncated bodies, 408/409/429/5xx; the action constrained
  to the admissible ones by the server (``model.structured_output``, probed once at start:
  ``SettlesConstraint``); an opt-in response
  cache (``model.cache_dir``, :mod:`~pipeline.llm.backends.cache`).

Runtime failures (a request that still fails after the retries, a failed forward pass)
come back as a :class:`Generation` with ``error`` set and ``stop_reason="error"``: the
agent decides whether that is a recorded failed turn or a stage failure
(``agent.on_backend_error``). Configuration errors raise :class:`BackendError`.

:func:`make_backend` and :func:`is_local` are the only places that look at
``model.backend``. The implementation a run uses is imported when it is made, by its name in
:data:`IMPLEMENTATIONS` (one door per backend): a stage whose closure reaches only this
factory depends on ``pipeline/llm/backends/${model.backend}.py``, the selected one, so an edit
of the other reruns nothing (``python -m pipeline.tools.deps`` writes that templated dep).
Code that needs a class itself imports it from its module
(``from pipeline.llm.backends.transformers import TransformersBackend``).
"""

from __future__ import annotations

import importlib
from typing import Callable

from pipeline.core.conf_schema import Backend as BackendName
from pipeline.core.conf_schema import Config, ModelConfig, SamplingConfig
from pipeline.core.seeding import prompt_seed
from pipeline.llm.backends.base import (
    ActionConstrainedBackend,
    Backend,
    BackendConfigError,
    BackendError,
    CachesPrompts,
    ConstraintProbe,
    Generation,
    Messages,
    ProbeResult,
    SettlesConstraint,
    plain_prompt,
    render_prompt,
)

# model.backend -> (module, class): the backends, each imported only when a run makes it.
IMPLEMENTATIONS = {BackendName.transformers: ("pipeline.llm.backends.transformers", "TransformersBackend"),
                   BackendName.openai: ("pipeline.llm.backends.openai", "OpenAIBackend")}

__all__ = [
    "IMPLEMENTATIONS",
    "ActionConstrainedBackend",
    "Backend",
    "BackendConfigError",
    "BackendError",
    "CachesPrompts",
    "ConstraintProbe",
    "Generation",
    "Messages",
    "ProbeResult",
    "SettlesConstraint",
    "is_local",
    "make_backend",
    "make_text_generator",
    "plain_prompt",
    "render_prompt",
]


def make_backend(model_cfg: ModelConfig, sampling_cfg: SamplingConfig) -> Backend:
    """The backend named by ``model.backend`` (its module imported now: :data:`IMPLEMENTATIONS`)."""
    name = str(model_cfg.backend)
    if name not in IMPLEMENTATIONS:
        raise BackendError(f"model.backend={name!r}: expected {' | '.join(IMPLEMENTATIONS)}")
    module, cls = IMPLEMENTATIONS[BackendName(name)]
    return getattr(importlib.import_module(module), cls)(model_cfg, sampling_cfg)


def is_local(model_cfg: ModelConfig) -> bool:
    """True when the backend runs the model inside this process (``model.backend=transformers``):
    its weights are files, its threads are ours, and the ``policy`` stage can train it."""
    return model_cfg.backend == BackendName.transformers


def make_text_generator(cfg: Config, *, backend: Backend | None = None,
                        max_new_tokens: int | None = None) -> Callable[[str], str]:
    """A ``prompt -> text`` function over the configured backend (free text, no early stop).

    For callers that want plain text (the ``llm`` grounding generator): the prompt is
    sent as one user message; the sampling seed is derived from ``sampling.seed`` and the
    prompt, so the same prompt gives the same text. A failed call raises
    :class:`BackendError`.
    """
    backend = backend if backend is not None else make_backend(cfg.model, cfg.sampling)
    base_seed = cfg.sampling.seed

    def generate(prompt: str) -> str:
        gen = backend.generate([[{"role": "user", "content": prompt}]], seeds=[prompt_seed(base_seed, prompt)],
                               max_new_tokens=max_new_tokens, early_stop=False)[0]
        if gen.error:
            raise BackendError(gen.error)
        return gen.text

    return generate
