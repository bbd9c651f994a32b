"""``policy`` stage: train the default offline policy model the ``llm`` agent runs with.

    python -m pipeline.stages.policy          # what `dvc repro policy` runs
    dvc exp run -S model=local -S model.name_or_path=/path/to/model   # your own model: stage skipped

Nothing can be downloaded here, so the pipeline trains its own small causal LM on expert
demonstrations of the *train* quests (:mod:`pipeline.policy`): grounding and advisories
from a rule agent's episodes, a knowledge-limited expert replayed in ``HouseholdEnv``,
prompts rendered by the ``llm`` agent's own code, a byte-level BPE tokenizer and a small
Llama-style model trained on two CPU cores. Then it measures the model on the eval quests
against the ``react`` and ``rag`` agents.

Writes:

- ``data/policy/model/``: ``save_pretrained`` model (safetensors) + tokenizer, the
  directory ``model.name_or_path`` points at (``conf/model/policy.yaml``);
- ``data/policy/demos.parquet``: every demonstration turn, prompt and answer verbatim;
- ``data/policy/training.json``: data and training summary (no wall-clock times);
- ``metrics/policy.json``: the quality figures, training summary and wall times;
- ``metrics/policy_loss.csv``: the loss of every training step (``dvc plots``).

Skipped (a marker ``data/policy/SKIPPED.json``, metrics saying why, an empty loss curve)
when ``model.train_policy`` is false, or when nothing runs a language model
(``agent.name`` and ``grounding.generator`` not ``llm``), or for the ``openai`` backend.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from pipeline.core.config import ConfigError, load_params, project_root
from pipeline.core.io import ArtifactError, atomic_dir, atomic_write_json, atomic_write_text, write_parquet

log = logging.getLogger(__name__)

MODEL_DIR = "model"
DEMOS_FILE = "demos.parquet"
SUMMARY_FILE = "training.json"
SKIPPED_FILE = "SKIPPED.json"
LOSS_CSV = "policy_loss.csv"
LOSS_COLUMNS = ("step", "epoch", "loss", "lr", "tokens")

DEMOS_SCHEMA = pa.schema([
    ("demo_id", pa.string()),
    ("turn_index", pa.int32()),
    ("variant", pa.string()),  # prompt variant: plain | grounded, +<condition> when an advisory block is in
    ("prompt", pa.string()),  # the exact text the model is conditioned on (chat template applied)
    ("response", pa.string()),  # the expert's answer (reasoning line + JSON action)
    ("train", pa.bool_()),  # False: a slip the expert recovers from (not learned)
])


def _v(x: Any) -> str:
    return str(getattr(x, "value", x))


def skip_reason(cfg: Any) -> str | None:
    """Why the stage trains nothing (None: it trains).

    Raises:
        ConfigError: ``model.train_policy`` is true but ``model.name_or_path`` is not the
            directory this stage writes (the trained model would never be used).
    """
    m = cfg.model
    if not bool(m.train_policy):
        return f"model.train_policy is false (the llm agent uses model.name_or_path={m.name_or_path!r})"
    if _v(m.backend) != "transformers":
        return f"model.backend={_v(m.backend)}: a remote model needs no local policy"
    if _v(cfg.agent.name) != "llm" and _v(cfg.grounding.generator) != "llm":
        return (f"no stage runs a language model (agent.name={_v(cfg.agent.name)}, "
                f"grounding.generator={_v(cfg.grounding.generator)})")
    expected = f"{str(cfg.paths.policy).rstrip('/')}/{MODEL_DIR}"
    if str(m.name_or_path or "").rstrip("/") != expected:
        raise ConfigError(f"model.train_policy=true but model.name_or_path={m.name_or_path!r}: expected {expected!r} "
                          "(the directory the policy stage writes), or set model.train_policy=false to use your model")
    return None


def loss_csv(curve: list[dict]) -> str:
    lines = [",".join(LOSS_COLUMNS)]
    lines += [",".join(str(rec[c]) for c in LOSS_COLUMNS) for rec in curve]
    return "\n".join(lines) + "\n"


def build_policy(cfg: Any, root: Path, manifest: list[dict], scenes: dict, out_dir: Path) -> dict:
    """The stage's core: demonstrations -> tokenizer -> model -> training, saved into ``out_dir``.

    Returns:
        ``{"memory", "summary", "curve", "timings"}``: the scene memory (for the quality
        evaluation), the deterministic summary, the loss curve and wall times.
    """
    from pipeline.llm.backends import TransformersBackend
    from pipeline.policy.demos import build_scene_memory, demo_rows, demo_stats, play_demos, render_demos
    from pipeline.policy.model import (IM_END, Sample, build_model, count_parameters, make_unit, save_policy,
                                       train, train_tokenizer)

    pol = cfg.model.policy
    seed = int(cfg.seed)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    train_rows = [r for r in manifest if r["split"] == "train"]
    if not train_rows:
        raise ConfigError("the games manifest has no train quests to demonstrate (env.train_quests_per_scene=0?)")
    with tqdm(total=len(train_rows), desc=f"policy: {pol.rule_agent} episodes", unit="ep", file=sys.stderr) as bar:
        memory = build_scene_memory(cfg, root, manifest, scenes, progress=bar.update)
    with tqdm(desc="policy: expert demos", unit="ep", file=sys.stderr) as bar:
        demos = play_demos(cfg, root, manifest, scenes, memory, progress=bar.update)
    turns = render_demos(cfg, demos)
    timings["demos_s"] = time.perf_counter() - t

    t = time.perf_counter()
    texts = [m["content"] for tr in turns for m in tr.messages] + [tr.response for tr in turns]
    tokenizer = train_tokenizer(texts, vocab_size=int(pol.vocab_size))
    model = build_model(tokenizer, pol, seed=seed)
    # Prompts go through the backend's own rendering (chat template, special tokens):
    # the token ids the model is trained on are the ids it will be given.
    backend = TransformersBackend(cfg.model, cfg.sampling, model=model, tokenizer=tokenizer)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    prompts, by_demo = [], {}
    for tr in turns:
        text, ids = backend.render(tr.messages)
        prompts.append(text)
        if tr.train:
            answer = list(tokenizer(tr.response, add_special_tokens=False)["input_ids"]) + [eos]
            by_demo.setdefault(tr.demo_id, []).append(Sample(list(ids), answer))
    units = [make_unit(v) for _, v in sorted(by_demo.items())]
    timings["tokenize_s"] = time.perf_counter() - t

    t = time.perf_counter()
    n_steps = int(pol.epochs) * -(-len(units) // int(pol.episodes_per_batch))
    with tqdm(total=n_steps, desc="policy: training", unit="step", file=sys.stderr) as bar:
        def progress(n: int, loss: float) -> None:
            bar.update(n)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

        curve = train(model, units, pol, seed=seed, pad_id=int(tokenizer.pad_token_id), progress=progress)
    timings["train_s"] = time.perf_counter() - t

    last = curve[-min(10, len(curve)):]
    summary = {
        "demos": demo_stats(demos, turns),
        "rule_agent_episodes": {"agent": str(pol.rule_agent), "episodes": len(memory.episodes),
                                "success_rate": round(sum(e["is_correct"] for e in memory.episodes)
                                                      / max(1, len(memory.episodes)), 6)},
        "tokenizer": {"vocab_size": len(tokenizer)},
        "model": {"architecture": "LlamaForCausalLM", "parameters": count_parameters(model),
                  "hidden_size": int(pol.hidden_size), "n_layer": int(pol.n_layer), "n_head": int(pol.n_head)},
        "training": {
            "episodes": len(units), "samples": sum(len(u.turns) for u in units), "steps": len(curve),
            "epochs": int(pol.epochs), "tokens_per_epoch": sum(u.tokens for u in units),
            "full_prompt_tokens_per_epoch": sum(len(s.prompt_ids) + len(s.answer_ids)
                                                for v in by_demo.values() for s in v),
            "answer_tokens_per_epoch": sum(len(a) for u in units for _, a in u.turns),
            "first_loss": curve[0]["loss"], "final_loss": round(sum(r["loss"] for r in last) / len(last), 6),
            "mean_prompt_tokens": round(sum(len(s.prompt_ids) for v in by_demo.values() for s in v)
                                        / max(1, sum(len(v) for v in by_demo.values())), 3),
        },
    }
    rows = demo_rows(turns, prompts)
    table = pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in DEMOS_SCHEMA},
                     schema=DEMOS_SCHEMA)
    with atomic_dir(out_dir) as tmp:
        save_policy(tmp / MODEL_DIR, model, tokenizer)
        write_parquet(table, tmp / DEMOS_FILE, sort_by=["demo_id", "turn_index"], schema_version="1")
        atomic_write_json(tmp / SUMMARY_FILE, summary)
    return {"memory": memory, "summary": summary, "curve": curve, "timings": timings}


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_params()
        root = project_root()
        out_dir = root / cfg.paths.policy
        metrics_dir = root / cfg.paths.metrics
        reason = skip_reason(cfg)
        if reason is not None:
            with atomic_dir(out_dir) as tmp:
                atomic_write_json(tmp / SKIPPED_FILE, {"trained": False, "reason": reason})
            atomic_write_json(metrics_dir / "policy.json", {"trained": False, "reason": reason})
            atomic_write_text(metrics_dir / LOSS_CSV, loss_csv([]))
            print(f"policy: skipped ({reason})")
            return 0

        import torch

        from pipeline.policy.quality import evaluate_policy, summary as quality_summary
        from pipeline.session.collection import load_games

        torch.set_num_threads(int(cfg.model.policy.threads))
        t0 = time.perf_counter()
        manifest, scenes = load_games(root, cfg)
        built = build_policy(cfg, root, manifest, scenes, out_dir)
        atomic_write_text(metrics_dir / LOSS_CSV, loss_csv(built["curve"]))
        metrics: dict[str, Any] = {"trained": True, "model_dir": f"{str(cfg.paths.policy).rstrip('/')}/{MODEL_DIR}",
                                   **built["summary"]}
        timings = built["timings"]
        if bool(cfg.model.policy.evaluate):
            t = time.perf_counter()
            n_eval = sum(r["split"] == str(cfg.experiment.eval_split) for r in manifest)
            with tqdm(total=n_eval * 6, desc="policy: eval quests", unit="ep", file=sys.stderr) as bar:
                report = evaluate_policy(cfg, root, manifest, scenes, out_dir / MODEL_DIR, memory=built["memory"],
                                         progress=bar.update)
            timings["evaluate_s"] = time.perf_counter() - t
            metrics["quality"] = quality_summary(report)
            metrics["eval"] = report
        timings["total_s"] = time.perf_counter() - t0
        metrics["wall_time_s"] = {k: round(v, 3) for k, v in timings.items()}
        atomic_write_json(metrics_dir / "policy.json", metrics)
        q = metrics.get("quality")
        line = f"policy: trained {metrics['model']['parameters']:,} parameters on {metrics['training']['samples']} " \
               f"turns, final loss {metrics['training']['final_loss']:.3f} -> {metrics['model_dir']}"
        if q:
            line += (f"; greedy JSON valid {q['greedy_json_valid_rate']:.2f}, success plain/memory "
                     f"{q['greedy_success_plain']:.2f}/{q['greedy_success_memory']:.2f} "
                     f"(react {q['react_success']:.2f}, rag {q['rag_success']:.2f})")
        print(line)
    except (ConfigError, ArtifactError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
