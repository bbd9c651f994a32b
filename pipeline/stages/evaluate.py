"""``evaluate`` stage: the agent plays the eval quests with one condition's system prompts.

    python -m pipeline.stages.evaluate --condition C2   # what `dvc repro evaluate@C2` runs

Paired design: every condition plays the same eval tasks with the same per-task seeds
(:func:`pipeline.session.rollout.task_seed` ignores the condition), so differences between
conditions come from the prompt, not from luck. The system prompt of each task is the
one the ``render`` stage wrote to ``data/prompts/<condition>.parquet``, verbatim.
Memory is frozen during evaluation: the store's content hash is checked against the one
the prompts were rendered with, before and after playing.

Writes ``data/eval/<condition>/{episodes,turns}.parquet`` (+ ``tensors/``) and
``metrics/eval/<condition>.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.core.config import ConfigError, load_params, project_root
from pipeline.core.io import ArtifactError, atomic_write_json, read_parquet
from pipeline.session.rollout import tasks_from_manifest
from pipeline.session.collection import load_games, run_collection
from pipeline.stages.common import stage_error


def current_store_hash(root: Path, cfg) -> str:
    from pipeline.memory.store import STORE_HASH

    path = root / cfg.paths.store / STORE_HASH
    if not path.exists():
        raise ArtifactError(f"missing {path}: run the store stage first (`dvc repro store`)")
    return path.read_text(encoding="utf-8").strip()


def attach_prompts(tasks, prompt_rows: list[dict], condition: str, prompts_path: Path) -> None:
    """Give each task its rendered system prompt; every task must have exactly one."""
    by_task = {(r["scene_id"], r["quest_id"]): r for r in prompt_rows}
    missing = [t.episode_id for t in tasks if (t.scene_id, t.quest_id) not in by_task]
    if missing:
        raise ArtifactError(f"{prompts_path} has no prompt for {len(missing)} eval task(s), e.g. {missing[0]}: "
                            "re-render (`dvc repro render@" + condition + "`)")
    for t in tasks:
        row = by_task[(t.scene_id, t.quest_id)]
        t.system_prompt = row["system_prompt"]
        t.metadata = {"gate_ok": bool(row.get("gate_ok", False)), "gate_reason": row.get("gate_reason", ""),
                      "prompt_sha256": row.get("prompt_sha256"), "store_hash": row.get("store_hash")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--condition", required=True, help="condition name (a key of `condition` in params.yaml)")
    args = parser.parse_args(argv)
    try:
        cfg = load_params()
        root = project_root()
        cond = args.condition
        if cond not in cfg.condition:
            raise ConfigError(f"--condition {cond!r} is not a configured condition ({', '.join(cfg.condition)})")
        manifest, scenes = load_games(root, cfg)
        prompts_path = root / cfg.paths.prompts / f"{cond}.parquet"
        prompt_rows = read_parquet(prompts_path).to_pylist()
        store_before = current_store_hash(root, cfg)
        rendered_with = {r.get("store_hash") for r in prompt_rows if r.get("store_hash")}
        if rendered_with and rendered_with != {store_before}:
            raise ArtifactError(f"{prompts_path} was rendered with store {sorted(rendered_with)} but the store is now "
                                f"{store_before}: re-render (`dvc repro render@{cond}`)")
        tasks = tasks_from_manifest(manifest, split=str(cfg.experiment.eval_split), master_seed=cfg.seed,
                                    condition=cond)
        if not tasks:
            raise ConfigError(f"no tasks in split experiment.eval_split={cfg.experiment.eval_split!r}")
        attach_prompts(tasks, prompt_rows, cond, prompts_path)
        out_dir = root / cfg.paths.eval / cond
        records, stats = run_collection(cfg, root, tasks, out_dir, scenes=scenes, ckpt_name=f"evaluate-{cond}",
                                        desc=f"evaluate@{cond} [{cfg.agent.name}]")
        store_after = current_store_hash(root, cfg)
        if store_after != store_before:
            raise ArtifactError(f"the episodic store changed during evaluation ({store_before} -> {store_after}): "
                                "memory must be frozen; rerun after the store stage settles")
        from pipeline.analysis.metrics import condition_metrics

        episodes = [r["episode"] for r in records]
        turns = [t for r in records for t in r["turns"]]
        metrics = condition_metrics(episodes, turns, prompt_rows, cfg)
        metrics["store_hash"] = store_before
        metrics["wall_time_s"] = stats["wall_time_s"]
        atomic_write_json(root / cfg.paths.metrics / "eval" / f"{cond}.json", metrics)
        print(f"evaluate@{cond}: {stats['num_episodes']} episodes, success {stats['success_rate']:.2f} -> {out_dir}")
    except Exception as exc:  # noqa: BLE001 - stage_error re-raises what is not expected
        return stage_error(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
