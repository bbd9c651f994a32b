"""Language-model plumbing for the ``llm`` agent.

- :mod:`pipeline.llm.tracker`: streaming tracking of the JSON action, token by token,
  during generation (seed 003's "real-time" tracking, byte-level BPE safe), with early stop.
- :mod:`pipeline.llm.backends`: the :class:`~pipeline.llm.backends.Backend` seam and its
  factory ``make_backend``; the ``transformers`` backend (``backends/transformers.py``:
  batched generation with a KV cache, finished sequences dropping out) and the ``openai``
  backend (``backends/openai.py``: any OpenAI-compatible chat-completions endpoint).
- :mod:`pipeline.llm.stopping`: the same tracking as a ``transformers`` ``StoppingCriteria``
  for code that calls ``model.generate``.
- :mod:`pipeline.llm.tensors`: one ``.pt`` file per episode with the per-turn
  ``generated_ids`` / ``action_token_mask`` (/ ``logprobs``) and its consistency check.
- :mod:`pipeline.llm.accounting`: prompt / generated token totals and early-stop savings
  for ``metrics/collect.json``.
- :mod:`pipeline.llm.tiny`: tiny local tokenizers and models for tests and benchmarks.

Nothing is imported here: torch and transformers load only when a submodule is used.
"""
