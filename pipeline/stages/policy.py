"""``policy`` step of the model pipeline: train the default offline model the ``llm`` agent plays.

    python -m pipeline.stages.policy          # a step of `make model` (models/dvc.yaml), on models/params.yaml

Nothing can be downloaded here, so the project trains its own small causal LM on the
teacher's demonstrations (``policy.teacher``) that the ``demos`` step wrote to ``<paths.demos>``
(:mod:`pipeline.policy.demoset`): a byte-level BPE tokenizer and a small Llama-style model
trained on two CPU cores (:mod:`pipeline.policy.training`), then DAgger rounds and the
probes on held-out generated houses (optionally its own check on the eval quests against the
``react`` and ``rag`` agents: :mod:`pipeline.policy.quality`). Its inputs are the model
pipeline's games, the demonstrations and the recipe (``policy``); it never reads the
experiment's list of conditions. The experiment plays what :mod:`pipeline.policy.checkpoint`
publishes of it (``models/policy``), never this folder.

Writes:

- ``<paths.policy>/model/``: ``save_pretrained`` model (safetensors) + tokenizer;
- ``<paths.policy>/demos.parquet``: every demonstration turn, prompt and answer verbatim;
- ``<paths.policy>/training.json``: data and training summary (no wall-clock times);
- ``<paths.checkpoints>/policy/<key>/``: the phases while it runs (after the demonstrations'
  training, after each DAgger round), so an interrupted run resumes after the last one and
  writes the same bytes (:mod:`pipeline.policy.resume`); removed at the end;
- ``<paths.metrics>/policy.json``: the probes' figures, training summary and wall times;
- ``<paths.metrics>/policy_loss.csv``: the loss of every training step (``dvc plots``);
- ``<paths.metrics>/policy_incontext.csv``: the in-context probe by training step
  (:mod:`pipeline.policy.incontext`: does the model copy a verified plan in a house it
  has never seen? ``dvc plots``).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from pipeline.core.conf_schema import Config
from pipeline.core.io import atomic_write_json, atomic_write_text
from pipeline.core.parallel import stage_workers
from pipeline.llm.backends import BackendError
from pipeline.policy.demoset import load_demo_set
from pipeline.policy.quality import evaluate_policy, summary as quality_summary
from pipeline.policy.dagger import EpisodeProbe, rollout_config, rollout_pool
from pipeline.policy.incontext import InContextProbe
from pipeline.policy.resume import checkpoint_dir
from pipeline.policy.training import INCONTEXT_CSV, LOSS_CSV, MODEL_DIR, build_policy, incontext_csv, loss_csv, model_dir
from pipeline.session.collection import load_games
from pipeline.stages.common import pin_numerics, run_stage

log = logging.getLogger(__name__)


def train_bar(bar: tqdm) -> Callable[[int], Callable[[int, float], None]]:
    """``build_policy``'s ``train_progress`` over a tqdm bar."""
    def start(total: int) -> Callable[[int, float], None]:
        bar.reset(total=total)

        def progress(n: int, loss: float) -> None:
            bar.update(n)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        return progress
    return start


def dagger_bar(bar: tqdm) -> Callable[[str, int, int], None]:
    """``build_policy``'s ``dagger_progress`` over the training bar: a round's episodes, then its steps."""
    shown: str | None = None  # the phase on the bar (tqdm's own desc gains a ": " suffix, so it is no key)

    def progress(what: str, done: int, total: int) -> None:
        nonlocal shown
        if what != shown:
            shown = what
            bar.set_description(f"policy: {what}", refresh=False)
            bar.set_postfix_str("", refresh=False)  # the demonstrations' last loss is no figure of this phase
            bar.reset(total=total)
        bar.update(done - bar.n)  # update, not n =: the bar's rate and ETA follow
    return progress


def summary_line(metrics: dict) -> str:
    """The one line the stage prints."""
    q = metrics.get("quality")
    line = f"policy: trained {metrics['model']['parameters']:,} parameters on {metrics['training']['samples']} " \
           f"turns, final loss {metrics['training']['final_loss']:.3f} -> {metrics['model_dir']}"
    ic = metrics.get("incontext")
    if ic and "oracle_first_step" in ic:
        line += (f"; in-context first step (held-out houses) oracle/plain {ic['oracle_first_step']:.2f}/"
                 f"{ic.get('plain_first_step', float('nan')):.2f}, oracle plan copied "
                 f"{ic.get('oracle_plan_copied', float('nan')):.2f}")
    ep = metrics.get("episode_probe")
    if ep and "plain_success" in ep:
        line += (f"; whole episodes (held-out houses) plain/grounded/oracle {ep['plain_success']:.2f}/"
                 f"{ep.get('grounded_success', float('nan')):.2f}/{ep.get('oracle_success', float('nan')):.2f}")
    if metrics.get("dagger"):
        line += f" after {len(metrics['dagger']['rounds'])} DAgger rounds"
    if q:
        line += (f"; greedy JSON valid {q['greedy_json_valid_rate']:.2f}, success plain/memory "
                 f"{q['greedy_success_plain']:.2f}/{q['greedy_success_memory']:.2f} "
                 f"(react {q['react_success']:.2f}, rag {q['rag_success']:.2f})")
    return line


def rollout_workers(cfg: Config, episode_probe: EpisodeProbe | None) -> int:
    """Processes for the policy's whole episodes (the DAgger rounds', the whole-episode probe's):
    the run's ``workers``, at most one per batch of the largest round; 1 (this process, no worker
    to start) when there are none. The rollouts do not depend on it
    (:func:`pipeline.policy.dagger.play_rollouts`)."""
    pol = cfg.policy
    tasks = max(int(pol.dagger_houses) if int(pol.dagger_rounds) > 0 else 0,
                len(episode_probe.tasks) if episode_probe is not None else 0)
    return stage_workers(cfg, limit=max(1, -(-tasks // max(1, int(cfg.agent.batch_size)))))


def run(cfg: Config, root: Path, numerics: dict | None = None) -> dict:
    """Train on ``data/demos``, write ``data/policy`` and the loss curve, measure; returns the metrics."""
    out_dir = root / cfg.paths.policy
    metrics_dir = root / cfg.paths.metrics
    t0 = time.perf_counter()
    manifest, scenes = load_games(root, cfg)
    demo_set = load_demo_set(root / cfg.paths.demos, tie_seed=cfg.seed)
    load_s = time.perf_counter() - t0
    probe = InContextProbe.build(cfg, manifest, scenes, demo_set.memory, n=cfg.policy.incontext_tasks)
    episode_probe = EpisodeProbe.build(cfg, manifest, scenes, demo_set.memory,
                                       n=cfg.policy.episode_probe_houses) \
        if cfg.policy.episode_probe_houses > 0 else None
    workers = rollout_workers(cfg, episode_probe)
    with rollout_pool(rollout_config(cfg), workers) as pool, \
            tqdm(desc="policy: training", unit="step", file=sys.stderr) as bar:
        built = build_policy(cfg, demo_set, out_dir, train_progress=train_bar(bar), probe=probe,
                             episode_probe=episode_probe, games=(manifest, scenes), dagger_progress=dagger_bar(bar),
                             pool=pool, checkpoints=checkpoint_dir(cfg, root))
    atomic_write_text(metrics_dir / LOSS_CSV, loss_csv(built["curve"]))
    atomic_write_text(metrics_dir / INCONTEXT_CSV, incontext_csv(built["incontext"]))
    metrics: dict[str, Any] = {"trained": True, "model_dir": model_dir(cfg), **built["summary"]}
    if numerics is not None:  # what ran: the pinned numerics and the CPU (never in data/policy)
        metrics["numerics"] = numerics
    if built["resumed"] is not None:  # how it ran (never in data/policy: a resumed run writes the same bytes)
        metrics["resumed_after"] = built["resumed"]
    timings = {"load_demos_s": load_s, **built["timings"], "rollout_workers": workers}
    if cfg.policy.evaluate:
        t = time.perf_counter()
        n_eval = sum(r["split"] == cfg.experiment.eval_split for r in manifest)
        with tqdm(total=n_eval * 6, desc="policy: eval quests", unit="ep", file=sys.stderr) as bar:
            report = evaluate_policy(cfg, root, manifest, scenes, out_dir / MODEL_DIR, memory=built["memory"],
                                     progress=bar.update)
        timings["evaluate_s"] = time.perf_counter() - t
        metrics["quality"] = quality_summary(report)
        metrics["eval"] = report
    timings["total_s"] = time.perf_counter() - t0
    metrics["wall_time_s"] = {k: round(v, 3) for k, v in timings.items()}
    atomic_write_json(metrics_dir / "policy.json", metrics)
    return metrics


def policy(cfg: Config, root: Path, _args: object) -> None:
    """Train and measure the default policy (module docstring)."""
    numerics = pin_numerics(cfg)  # before anything loads torch
    print(summary_line(run(cfg, root, numerics)))


def main(argv: list[str] | None = None) -> int:
    return run_stage("policy", policy, argv, doc=__doc__, expected=(BackendError,), pipelines=("model",))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
