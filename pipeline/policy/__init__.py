"""The default offline policy: a small causal LM the project trains itself (the model pipeline, ``make model``).

Nothing can be downloaded on the machines this project runs on, yet the default run must
exercise the real LLM path (a transformers model sampling text, the JSON action tracked
token by token, tensors stored). So the model pipeline (``models/dvc.yaml``: its own games,
then the steps ``demos``, ``policy``, ``checkpoint``) builds one, from its games and the
recipe (``policy``) only, never from the experiment's conditions, and publishes it as the
committed checkpoint ``models/policy`` that the experiment plays (``model=policy``):

- :mod:`pipeline.policy.expert`: the knowledge-limited expert that plays the demonstrations;
- :mod:`pipeline.policy.demos`: grounding and advisories from a rule agent's train
  episodes, expert episodes per prompt variant, rendered by the ``llm`` agent's own code;
- :mod:`pipeline.policy.demoset`: all of it as the ``demos`` step's product
  (``data/model/demos``: built, written, read back);
- :mod:`pipeline.policy.model`: byte-level BPE tokenizer, small Llama-style model, training;
- :mod:`pipeline.policy.training`: the ``policy`` step's core (tokenize, train,
  ``data/model/policy``);
- :mod:`pipeline.policy.checkpoint`: the published checkpoint and its model card (``models/policy``);
- :mod:`pipeline.policy.quality`: the model against the rule agents on the eval quests.

Modules are imported explicitly (``from pipeline.policy.model import train``); this
package imports nothing heavy.
"""
