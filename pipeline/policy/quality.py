"""How good the trained policy is, measured on the eval quests by the ``policy`` stage.

The model directory is loaded by the ``transformers`` backend exactly as ``collect`` and
``evaluate`` load it, and the ``llm`` agent plays every quest of
``experiment.eval_split`` through :func:`pipeline.session.rollout.play` (same environment, same
simulated user, same per-task seeds as the ``evaluate`` stage), under:

- ``greedy`` decoding (``do_sample=false``) and the configured ``sampling`` (the default
  temperature the pipeline runs at);
- two prompt kinds: ``plain`` (the prompt the agent renders for itself, as in
  ``collect``: no grounding, no advisory) and ``memory`` (grounding and the advisory block
  of the first exposed, non-placebo ``demos.advisory_variants`` entry, both built from a
  rule agent's train episodes by :func:`pipeline.policy.demos.build_scene_memory` and
  read from ``data/demos``: a stand-in for what the real run's ``ground``/``store``
  stages will provide).

The rule agents ``react`` and ``rag`` play the same quests for reference. Per run:
success (won and preferences kept, as the ``evaluate`` stage counts it), won, turns, the
share of turns whose output holds a JSON action object (``json_valid_rate``), the share
whose action was admissible (``action_valid_rate``) and the share of steps the simulated
user did not mark as progress (``no_progress_rate``: what feedback has to work on)::

    report = evaluate_policy(cfg, root, manifest, scenes, model_dir, memory=memory)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from omegaconf import OmegaConf

from pipeline.agents.llm import LLMAgent
from pipeline.conditions import memory_slot, source_for
from pipeline.core.conf_schema import AdvisoryVariantConfig, Config, ConditionKind, DemosConfig
from pipeline.envs import fact_reader, world_words
from pipeline.llm.backends.transformers import TransformersBackend
from pipeline.policy.demos import SceneMemory, _Progress, freeze_prompt, grounding_text
from pipeline.prompts import PromptOrganizer, extract_json_object
from pipeline.session.collection import make_factories
from pipeline.session.rollout import play, tasks_from_manifest

# The memory prompts' advisories when no advisory variant shows real ones.
LITERAL_MEMORY = OmegaConf.structured(AdvisoryVariantConfig(name="memory", kind=ConditionKind.memory))


def run_metrics(records: Sequence[Mapping[str, Any]]) -> dict:
    """Success and turn-level rates of one run (records of :func:`pipeline.session.rollout.play`)."""
    episodes = [r["episode"] for r in records]
    turns = [t for r in records for t in r["turns"]]
    n, k = len(episodes), len(turns)

    def rate(num: float, den: int) -> float:
        return round(float(num) / den, 6) if den else 0.0

    llm_turns = [t for t in turns if t.get("generated_tokens") is not None]
    json_ok = 0
    for t in llm_turns:
        obj = extract_json_object(t.get("generated_text") or "")
        json_ok += bool(obj) and isinstance(obj.get("action"), str)
    out = {
        "episodes": n,
        "success_rate": rate(sum(e["is_correct"] for e in episodes), n),
        "won_rate": rate(sum(e["won"] for e in episodes), n),
        "mean_turns": rate(k, n),
        "action_valid_rate": rate(sum(bool(t["action_valid"]) for t in turns), k),
        "no_progress_rate": rate(sum(t["status"] != "Success" for t in turns), k),
        "repeated_rate": rate(sum(bool(t["repeated"]) for t in turns), k),
        "feedback_lines_per_turn": rate(sum(len(t["feedback_lines"] or []) for t in turns), k),
    }
    if llm_turns:
        out["json_valid_rate"] = rate(json_ok, len(llm_turns))
        out["generated_tokens_per_turn"] = rate(sum(t["generated_tokens"] for t in llm_turns), len(llm_turns))
        out["prompt_tokens_per_turn"] = rate(sum(t["prompt_tokens"] or 0 for t in llm_turns), len(llm_turns))
    out["per_task"] = {e["episode_id"]: bool(e["is_correct"]) for e in episodes}
    return out


def exposed_variant(demos_cfg: DemosConfig) -> tuple[str, Any]:
    """The first of ``demos.advisory_variants`` that shows real advisories (C2), or a literal one.

    The policy's own list, never the experiment's conditions: the evaluation does not
    change when the experiment's list of conditions does.
    """
    for v in demos_cfg.advisory_variants:
        if source_for(v, str(v.name)).real:
            return v.name, v
    return LITERAL_MEMORY.name, LITERAL_MEMORY


def memory_prompts(cfg: Config, rows: Mapping[tuple[str, str], Mapping[str, Any]], memory: SceneMemory,
                   variant_name: str, variant: Any) -> dict[tuple[str, str], str]:
    """(scene_id, quest_id) -> the frozen ``memory`` prompt: scene grounding and the variant's block."""
    organizer = PromptOrganizer.from_config(cfg)
    out = {}
    for key, row in rows.items():
        slot = memory_slot(memory.store, dict(row), variant, cfg.memory, rng=cfg.seed, name=variant_name,
                           words=world_words(cfg), facts=fact_reader(cfg))
        out[key] = freeze_prompt(organizer, row["objective"], row["scene_id"],
                                 grounding_text(cfg.grounding, memory, row["scene_id"], organizer),
                                 slot.injected_block_text)
    return out


def evaluate_policy(cfg: Config, root: Path, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
                    model_dir: Path, *, memory: SceneMemory, progress: Callable[[int], None] | None = None) -> dict:
    """Play the eval quests with the saved policy and with the rule agents (module docstring).

    Args:
        cfg: the composed config.
        root: project root (game files).
        manifest, scenes: the games.
        model_dir: the saved model directory (loaded like any user's).
        memory: the :class:`pipeline.policy.demos.SceneMemory` the ``memory`` prompts use.
        progress: called with 1 per finished episode.
    """
    split = cfg.experiment.eval_split
    manifest = measured_rows(manifest, split, cfg.policy.evaluate_tasks)
    rows = {(r["scene_id"], r["quest_id"]): r for r in manifest if r["split"] == split}
    llm_cfg = OmegaConf.merge(cfg, {"agent": {"name": "llm"}, "model": {"name_or_path": str(model_dir)}})
    make_env, _, make_user = make_factories(llm_cfg, root, dict(scenes))
    common = dict(make_env=make_env, make_user=make_user, preference_in_success=cfg.user.preference_in_success,
                  unknown_feedback=cfg.grounding.unknown_type, progress=_Progress(progress))

    name, variant = exposed_variant(cfg.demos)
    prompts_by_task = memory_prompts(cfg, rows, memory, name, variant)
    report: dict[str, Any] = {"split": split, "tasks": len(rows), "memory_condition": name,
                              "llm": llm_runs(cfg, llm_cfg, manifest, model_dir, prompts_by_task, common)}
    for agent_name in ("react", "rag"):
        report[agent_name] = rule_run(cfg, root, manifest, scenes, agent_name, common)
    return report


def measured_rows(manifest: Sequence[Mapping[str, Any]], split: str, limit: int) -> list[Mapping[str, Any]]:
    """The manifest with ``split`` cut to ``limit`` evenly spaced tasks (sorted by scene, quest;
    0 or more than there are: all of them); other splits' rows are kept."""
    tasks = sorted((r for r in manifest if r["split"] == split), key=lambda r: (r["scene_id"], r["quest_id"]))
    if 0 < limit < len(tasks):
        keep = {(tasks[i * len(tasks) // limit]["scene_id"], tasks[i * len(tasks) // limit]["quest_id"])
                for i in range(limit)}
        tasks = [r for r in tasks if (r["scene_id"], r["quest_id"]) in keep]
    return [r for r in manifest if r["split"] != split] + tasks


def llm_runs(cfg: Config, llm_cfg: Config, manifest: Sequence[Mapping[str, Any]], model_dir: Path,
             prompts_by_task: Mapping[tuple[str, str], str], common: Mapping[str, Any]) -> dict:
    """``{greedy|sampled: {plain|memory: run_metrics}}`` of the saved model (loaded once)."""
    split = cfg.experiment.eval_split
    samplings = {"greedy": OmegaConf.merge(cfg.sampling, {"do_sample": False}), "sampled": cfg.sampling}
    out: dict[str, Any] = {}
    backend = None
    for decoding, sampling in samplings.items():
        if backend is None:
            backend = TransformersBackend(llm_cfg.model, sampling)  # loads model_dir like collect does
        else:
            backend = TransformersBackend(llm_cfg.model, sampling, model=backend.model, tokenizer=backend.tokenizer)
        out[decoding] = {}
        for prompts in ("plain", "memory"):
            tasks = tasks_from_manifest(manifest, split=split, master_seed=cfg.seed)
            if prompts == "memory":
                for t in tasks:
                    t.system_prompt = prompts_by_task[(t.scene_id, t.quest_id)]
            records = play(tasks, make_agent=lambda t, b=backend: LLMAgent(llm_cfg, seed=t.seed, backend=b),
                           batch_size=max(1, len(tasks)), agent_name="llm", model_name=str(model_dir), **common)
            out[decoding][prompts] = run_metrics(records)
    return out


def rule_run(cfg: Config, root: Path, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
             agent_name: str, common: Mapping[str, Any]) -> dict:
    """``run_metrics`` of a rule agent (no random actions) on the eval quests."""
    rule_cfg = OmegaConf.merge(cfg, {"agent": {"name": agent_name, "epsilon": 0.0}})
    _, make_rule, _ = make_factories(rule_cfg, root, dict(scenes))
    tasks = tasks_from_manifest(manifest, split=cfg.experiment.eval_split, master_seed=cfg.seed)
    records = play(tasks, make_agent=make_rule, batch_size=1, agent_name=agent_name, **common)
    return run_metrics(records)


def summary(report: Mapping[str, Any]) -> dict:
    """The headline figures and whether the issue's targets are met."""
    g, s = report["llm"]["greedy"], report["llm"]["sampled"]
    rule_best = max(report["react"]["success_rate"], report["rag"]["success_rate"])
    best_llm = max(g["plain"]["success_rate"], g["memory"]["success_rate"])
    return {
        "greedy_json_valid_rate": min(g["plain"].get("json_valid_rate", 0.0), g["memory"].get("json_valid_rate", 0.0)),
        "greedy_success_plain": g["plain"]["success_rate"],
        "greedy_success_memory": g["memory"]["success_rate"],
        "sampled_success_plain": s["plain"]["success_rate"],
        "sampled_success_memory": s["memory"]["success_rate"],
        "sampled_no_progress_rate": round((s["plain"]["no_progress_rate"] + s["memory"]["no_progress_rate"]) / 2, 6),
        "react_success": report["react"]["success_rate"],
        "rag_success": report["rag"]["success_rate"],
        "target_json_valid_0.95": min(g["plain"].get("json_valid_rate", 0.0),
                                      g["memory"].get("json_valid_rate", 0.0)) >= 0.95,
        "target_success_above_rule_agents": best_llm > rule_best,
        "target_sampled_makes_mistakes": s["plain"]["success_rate"] < 1.0 or s["memory"]["success_rate"] < 1.0,
    }
