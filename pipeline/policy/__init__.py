"""The default offline policy: a small causal LM the pipeline trains itself (stages ``demos``, ``policy``).

Nothing can be downloaded on the machines this project runs on, yet the default run must
exercise the real LLM path (a transformers model sampling text, the JSON action tracked
token by token, tensors stored). So two stages build one, from the games and the
policy's own config (``model.policy``) only, never from the experiment's conditions:

- :mod:`pipeline.policy.expert`: the knowledge-limited expert that plays the demonstrations;
- :mod:`pipeline.policy.demos`: grounding and advisories from a rule agent's train
  episodes, expert episodes per prompt variant, rendered by the ``llm`` agent's own code;
- :mod:`pipeline.policy.demoset`: all of it as the ``demos`` stage's product
  (``data/demos``: built, written, read back);
- :mod:`pipeline.policy.model`: byte-level BPE tokenizer, small Llama-style model, training;
- :mod:`pipeline.policy.training`: the ``policy`` stage's core (skip rule, tokenize, train,
  ``data/policy``);
- :mod:`pipeline.policy.quality`: the model against the rule agents on the eval quests.

Modules are imported explicitly (``from pipeline.policy.model import train``); this
package imports nothing heavy.
"""
