"""Does the policy read its prompt? An in-context score on houses it has never seen.

Loss on the demonstrations cannot tell memorising from reading. This probe can: it builds
the first turn of quests in *held-out generated houses* (:func:`pipeline.policy.demos.
training_houses` with ``heldout=True``: a seed stream the demonstrations never use, names
drawn per house) and asks the model for its action, greedy, under ``choice`` decoding (every
admissible action scored; the backend the ``evaluate`` stage uses):

- ``oracle_first_step``: under the positive control's advisory (``Verified steps 1-k of n
  that solve this exact task: ...``, built by the memory's own code), the share of
  first actions that are the verified plan's first step: copying what the prompt says;
- ``plain_first_step``: the same houses and quests with no advisory: the share that
  happen to be the plan's first step without being told (the baseline the first figure
  has to beat; what the objective and the observation alone predict);
- ``oracle_plan_copied``: under the same advisory, the share of first turns whose answer,
  generated greedy under ``constrained`` decoding (as the ``evaluate`` stage plays), keeps
  the verified plan's remaining steps in its memory ``plan`` exactly (``"; "``-joined):
  the copy every later turn of the episode follows (the turn-0 copy is what limits the
  positive control: given a right plan in memory the policy plays its first item).

The ``policy`` stage logs both every ``policy.incontext_every`` steps (``metrics/
policy_incontext.csv``, a DVC plot) and at the end (``metrics/policy.json``)::

    probe = InContextProbe.build(cfg, manifest, scenes, memory, n=cfg.policy.incontext_tasks)
    probe.score(model, tokenizer)
    # {"oracle_first_step": 0.81, "oracle_plan_copied": 0.1, "plain_first_step": 0.33, "tasks": 48}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from omegaconf import OmegaConf

from pipeline.agents.llm import LLMAgent
from pipeline.core.conf_schema import ConditionKind, Config
from pipeline.llm.backends.transformers import TransformersBackend
from pipeline.policy.demos import (NoBackend, SceneMemory, advisory_variant_names, freeze_prompt, house_env,
                                   prompt_variants, training_houses)
from pipeline.prompts import PromptOrganizer
from pipeline.prompts.observation import memory_from_response


@dataclass
class ProbeTask:
    """One probe: the chat messages of a first turn, its admissible actions and the answer."""

    kind: str  # oracle | plain
    messages: list[dict]
    admissible: list[dict]
    answer: str  # the plan's first command
    rest: str = ""  # the plan's remaining steps as the memory keeps them ("; "-joined)


@dataclass
class InContextProbe:
    """The probe tasks and the config to score them with (greedy, ``choice``, no caches)."""

    cfg: Any
    tasks: list[ProbeTask]

    @classmethod
    def build(cls, cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
              memory: SceneMemory, *, n: int) -> "InContextProbe":
        organizer = PromptOrganizer.from_config(cfg)
        oracle = advisory_variant_names(cfg, ConditionKind.oracle)
        agent = LLMAgent(cfg, backend=NoBackend())
        tasks: list[ProbeTask] = []
        for house in training_houses(cfg, manifest, scenes, heldout=True).houses(n) if n > 0 else []:
            row = house.row(0)
            env = house_env(cfg, house)
            obs = env.reset()
            env.close()
            variants = {v.source: v for v in prompt_variants(cfg, memory, row, organizer)}
            for kind, source in (("oracle", oracle[0] if oracle else None), ("plain", "")):
                v = variants.get(source)
                if v is None:
                    continue
                prompt = freeze_prompt(organizer, row["objective"], row["scene_id"], v.grounding, v.block) \
                    if not v.bare else None
                agent.reset({"episode_id": f"probe_{house.scene_id}", "scene_id": row["scene_id"],
                             "quest_id": row["quest_id"], "objective": row["objective"], "seed": 0,
                             "system_prompt": prompt})
                tasks.append(ProbeTask(kind, agent.messages(obs), list(obs["admissible_actions"]),
                                       row["expert_plan"][0], "; ".join(row["expert_plan"][1:])))
        probe_cfg = OmegaConf.merge(cfg, {"sampling": {"do_sample": False}, "model": {"prompt_cache_mb": 0,
                                                                                      "cache_dir": None}})
        return cls(probe_cfg, tasks)

    def score(self, model: Any, tokenizer: Any, *, batch_size: int = 16) -> dict[str, Any]:
        """Greedy ``choice`` actions of the model on every probe; the share right per kind."""
        if not self.tasks:
            return {"tasks": 0}
        was_training = model.training
        model.eval()
        try:
            backend = TransformersBackend(self.cfg.model, self.cfg.sampling, model=model, tokenizer=tokenizer)
            right: dict[str, list[bool]] = {}
            for start in range(0, len(self.tasks), batch_size):
                chunk = self.tasks[start:start + batch_size]
                gens = backend.generate([t.messages for t in chunk], seeds=[0] * len(chunk),
                                        admissible=[t.admissible for t in chunk], decoding="choice",
                                        reasoning_max_tokens=int(self.cfg.agent.reasoning_max_tokens))
                for t, g in zip(chunk, gens):
                    chosen = t.admissible[g.chosen_index]["command"] if g.chosen_index is not None else None
                    right.setdefault(f"{t.kind}_first_step", []).append(chosen == t.answer)
            oracle = [t for t in self.tasks if t.kind == "oracle"]
            for start in range(0, len(oracle), batch_size):
                chunk = oracle[start:start + batch_size]
                gens = backend.generate([t.messages for t in chunk], seeds=[0] * len(chunk),
                                        admissible=[t.admissible for t in chunk], decoding="constrained",
                                        reasoning_max_tokens=int(self.cfg.agent.reasoning_max_tokens))
                for t, g in zip(chunk, gens):
                    mem = memory_from_response(g.text) or {}
                    right.setdefault("oracle_plan_copied", []).append(str(mem.get("plan", "")) == t.rest)
        finally:
            model.train(was_training)
        out: dict[str, Any] = {k: round(sum(v) / len(v), 6) for k, v in sorted(right.items())}
        out["tasks"] = len(self.tasks) // max(1, len({t.kind for t in self.tasks}))
        return out
