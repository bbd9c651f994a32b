"""Evaluating one condition: the eval quests played with that condition's rendered prompts.

The library behind :mod:`pipeline.stages.evaluate`::

    metrics, stats, out_dir = evaluate_condition(cfg, root, "C2")
    metrics, stats, out_dir = evaluate_condition(cfg, root, "C2", reader=True)   # the reader's ceiling

Paired design: every condition plays the same eval tasks with the same per-task seeds
(:func:`pipeline.core.seeding.task_seed` ignores the condition), so differences between
conditions come from the prompt, not from luck. The system prompt of each task is the
one the ``render`` stage wrote to ``<paths.prompts>/<condition>.parquet``, verbatim.
Memory is frozen during evaluation: the store's content hash is checked against the one
the prompts were rendered with, before and after playing.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from pipeline.analysis.metrics import condition_metrics
from pipeline.core.conf_schema import AgentConfig, AgentName, Config
from pipeline.core.config import ConfigError
from pipeline.core.io import ArtifactError, read_parquet, sha256_text
from pipeline.memory.store import STORE_HASH
from pipeline.session.collection import load_games, run_collection
from pipeline.session.rollout import Task, tasks_from_manifest


def current_store_hash(root: Path, cfg: Config) -> str:
    """The episodic store's content hash (``<paths.store>/store_hash.txt``)."""
    path = root / cfg.paths.store / STORE_HASH
    if not path.exists():
        raise ArtifactError(f"missing {path}: run the store stage first (`dvc repro store`)")
    return path.read_text(encoding="utf-8").strip()


def check_rendered_store(prompt_rows: list[dict], store_hash: str, condition: str, prompts_path: Path) -> None:
    """Raise :class:`ArtifactError` when the prompts were rendered with another store."""
    rendered_with = {r.get("store_hash") for r in prompt_rows if r.get("store_hash")}
    if rendered_with and rendered_with != {store_hash}:
        raise ArtifactError(f"{prompts_path} was rendered with store {sorted(rendered_with)} but the store is now "
                            f"{store_hash}: re-render (`dvc repro render`)")


def attach_prompts(tasks: list[Task], prompt_rows: list[dict], condition: str, prompts_path: Path) -> None:
    """Give each task its rendered system prompt; every task must have exactly one, whose
    text still hashes to the ``prompt_sha256`` ``render`` recorded beside it."""
    by_task = {(r["scene_id"], r["quest_id"]): r for r in prompt_rows}
    for r in prompt_rows:
        if r.get("prompt_sha256") and sha256_text(r["system_prompt"]) != r["prompt_sha256"]:
            raise ArtifactError(f"{prompts_path}: the system prompt of {r['scene_id']}/{r['quest_id']} does not hash "
                                f"to its recorded prompt_sha256 {r['prompt_sha256'][:12]}…: the file was modified "
                                f"outside the render stage (`dvc repro render`)")
    missing = [t.episode_id for t in tasks if (t.scene_id, t.quest_id) not in by_task]
    if missing:
        raise ArtifactError(f"{prompts_path} has no prompt for {len(missing)} eval task(s), e.g. {missing[0]}: "
                            "re-render (`dvc repro render`)")
    for t in tasks:
        row = by_task[(t.scene_id, t.quest_id)]
        t.system_prompt = row["system_prompt"]
        t.metadata = {"gate_ok": bool(row.get("gate_ok", False)), "gate_reason": row.get("gate_reason", ""),
                      "prompt_sha256": row.get("prompt_sha256"), "store_hash": row.get("store_hash")}


# What ``evaluate`` reads beyond the collection's keys (pipeline.session.collection.CHECKPOINT_KEYS):
# its tasks, greedy or not, the metrics' intervals; ``evaluate_reader`` also whether it plays at all.
EVALUATE_KEYS = ("experiment.eval_split", "experiment.eval_greedy", "experiment.bootstrap_samples",
                 "experiment.ci_level")
EVALUATE_READER_KEYS = (*EVALUATE_KEYS, "experiment.reader")


def reader_config(cfg: Config) -> Config:
    """``cfg`` with ``agent=reader`` (every agent key the schema's default): what
    ``evaluate_reader`` plays, whichever agent the experiment evaluates."""
    return OmegaConf.merge(cfg, {"agent": OmegaConf.structured(AgentConfig(name=AgentName.reader))})


def evaluate_condition(cfg: Config, root: Path, condition: str, *, reader: bool = False) -> tuple[dict, dict, Path]:
    """Play the eval quests with ``condition``'s prompts; write its collection.

    Writes ``<paths.eval>/<condition>/{episodes,turns}.parquet`` (+ ``tensors/``); with
    ``reader``, the reader plays the same tasks with the same prompts and seeds
    (:func:`reader_config`) into ``<paths.eval_reader>/<condition>/``.

    Returns:
        ``(metrics, stats, out_dir)``: the condition's metrics (what
        ``metrics/eval/<condition>.json`` holds), the collection's stats and its folder.

    Raises:
        ConfigError: an unknown condition, or no task in ``experiment.eval_split``.
        ArtifactError: prompts missing or rendered with another store, or the store
            changed while playing.
    """
    if condition not in cfg.condition:
        raise ConfigError(f"--condition {condition!r} is not a configured condition ({', '.join(cfg.condition)})")
    if reader:
        cfg = reader_config(cfg)
    if cfg.experiment.eval_greedy:
        cfg = OmegaConf.merge(cfg, {"sampling": {"do_sample": False}})
    manifest, scenes = load_games(root, cfg)
    prompts_path = root / cfg.paths.prompts / f"{condition}.parquet"
    prompt_rows = read_parquet(prompts_path).to_pylist()
    store_before = current_store_hash(root, cfg)
    check_rendered_store(prompt_rows, store_before, condition, prompts_path)
    tasks = tasks_from_manifest(manifest, split=cfg.experiment.eval_split, master_seed=cfg.seed,
                                condition=condition)
    if not tasks:
        raise ConfigError(f"no tasks in split experiment.eval_split={cfg.experiment.eval_split!r}")
    attach_prompts(tasks, prompt_rows, condition, prompts_path)
    stage = "evaluate_reader" if reader else "evaluate"
    out_dir = root / (cfg.paths.eval_reader if reader else cfg.paths.eval) / condition
    records, stats = run_collection(cfg, root, tasks, out_dir, scenes=scenes, ckpt_name=f"{stage}-{condition}",
                                    desc=f"{stage}@{condition} [{cfg.agent.name}]")
    store_after = current_store_hash(root, cfg)
    if store_after != store_before:
        raise ArtifactError(f"the episodic store changed during evaluation ({store_before} -> {store_after}): "
                            "memory must be frozen; rerun after the store stage settles")
    episodes = [r["episode"] for r in records]
    turns = [t for r in records for t in r["turns"]]
    metrics = condition_metrics(episodes, turns, prompt_rows, cfg)
    metrics["store_hash"] = store_before
    metrics["wall_time_s"] = stats["wall_time_s"]
    metrics["s_per_turn"] = round(stats["wall_time_s"] / max(1, len(turns)), 4)
    for key in ("prompt_cache", "structured_output"):
        if key in stats:
            metrics[key] = stats[key]
    return metrics, stats, out_dir
