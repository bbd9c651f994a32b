"""The ``policy`` stage's core: the demonstrations of ``data/demos`` -> tokenizer -> model -> training.

The library behind :mod:`pipeline.stages.policy` (the demonstrations come from
:mod:`pipeline.policy.demoset`, stage ``demos``)::

    demo_set = load_demo_set(demo_dir, tie_seed=cfg.seed)
    built = build_policy(cfg, demo_set, out_dir)      # writes model/, demos.parquet, training.json
    csv = loss_csv(built["curve"])

Written into ``out_dir`` (``paths.policy``):

- ``model/``: ``save_pretrained`` model (safetensors) + tokenizer, what
  :mod:`pipeline.policy.checkpoint` publishes as the committed checkpoint;
- ``demos.parquet``: every demonstration turn, prompt (chat template applied) and answer
  verbatim;
- ``training.json``: data and training summary (no wall-clock times).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow as pa

from pipeline.core.conf_schema import Config, PolicyConfig
from pipeline.core.io import atomic_dir, atomic_write_json, write_parquet
from pipeline.policy.dagger import DaggerResult, run_rounds, turn_samples
from pipeline.policy.demos import RenderedTurn, demo_rows
from pipeline.policy.demoset import DemoSet
from pipeline.policy.model import (
    Sample,
    Unit,
    build_model,
    count_parameters,
    make_unit,
    save_policy,
    train,
    train_processes,
    train_tokenizer,
)
from pipeline.policy.resume import TRAINED, PhaseCheckpoints, round_phase, turns_from_state, turns_state

MODEL_DIR = "model"
DEMOS_FILE = "demos.parquet"
SUMMARY_FILE = "training.json"
LOSS_CSV = "policy_loss.csv"
LOSS_COLUMNS = ("step", "epoch", "loss", "lr", "tokens")

DEMOS_SCHEMA = pa.schema([
    ("demo_id", pa.string()),
    ("turn_index", pa.int32()),
    ("variant", pa.string()),  # prompt variant: plain | grounded, +<advisory variant> when an advisory block is in
    ("prompt", pa.string()),  # the exact text the model is conditioned on (chat template applied)
    ("response", pa.string()),  # the expert's answer (reasoning line + JSON action)
    ("train", pa.bool_()),  # False: a slip the expert recovers from (not learned)
])


def model_dir(cfg: Config) -> str:
    """``<paths.policy>/model``: where the ``policy`` step saves the model (before it is published)."""
    return f"{cfg.paths.policy.rstrip('/')}/{MODEL_DIR}"


def loss_csv(curve: list[dict]) -> str:
    """``metrics/policy_loss.csv``: one line per training step (:data:`LOSS_COLUMNS`)."""
    lines = [",".join(LOSS_COLUMNS)]
    lines += [",".join(str(rec[c]) for c in LOSS_COLUMNS) for rec in curve]
    return "\n".join(lines) + "\n"


@dataclass
class Tokenized:
    """The demonstrations as the model sees them.

    Attributes:
        tokenizer, model: the trained tokenizer and the freshly initialised model.
        prompts: every turn's prompt text (chat template applied), in turn order.
        by_demo: training unit (a demo_id, or a quest's plan drills) -> its train turns' samples.
        units: one training unit per demonstration (a quest's plan drills: one), in key order.
    """

    tokenizer: Any
    model: Any
    prompts: list[str]
    by_demo: dict[str, list[Sample]]
    units: list[Unit]


def tokenize_demos(cfg: Config, turns: Sequence[RenderedTurn]) -> Tokenized:
    """Train the tokenizer on the turns, build the model, and turn every train turn into ids."""
    pol = cfg.policy
    texts = [m["content"] for tr in turns for m in tr.messages] + [tr.response for tr in turns]
    tokenizer = train_tokenizer(texts, vocab_size=pol.vocab_size)
    model = build_model(tokenizer, pol, seed=cfg.seed)
    by_demo, prompts = turn_samples(cfg, model, tokenizer, turns)
    units = [make_unit(v) for _, v in sorted(by_demo.items())]
    return Tokenized(tokenizer, model, prompts, by_demo, units)


def training_summary(policy_cfg: PolicyConfig, demo_summary: dict, tok: Tokenized, curve: list[dict]) -> dict:
    """``training.json``: the demonstrations, tokenizer, model and training figures (no wall times)."""
    units, samples = tok.units, [s for v in tok.by_demo.values() for s in v]
    last = curve[-min(10, len(curve)):]
    return {
        **demo_summary,  # "demos", "rule_agent_episodes"
        "tokenizer": {"vocab_size": len(tok.tokenizer)},
        "model": {"architecture": "LlamaForCausalLM", "parameters": count_parameters(tok.model),
                  "hidden_size": policy_cfg.hidden_size, "n_layer": policy_cfg.n_layer,
                  "n_head": policy_cfg.n_head},
        "training": {
            "episodes": len(units), "samples": sum(len(u.turns) for u in units), "steps": len(curve),
            "epochs": policy_cfg.epochs, "tokens_per_epoch": sum(u.tokens for u in units),
            "full_prompt_tokens_per_epoch": sum(len(s.prompt_ids) + len(s.answer_ids) for s in samples),
            "answer_tokens_per_epoch": sum(len(a) for u in units for _, a in u.turns),
            "first_loss": curve[0]["loss"], "final_loss": round(sum(r["loss"] for r in last) / len(last), 6),
            "mean_prompt_tokens": round(sum(len(s.prompt_ids) for s in samples) / max(1, len(samples)), 3),
        },
    }


def demos_table(turns: Sequence[RenderedTurn], prompts: Sequence[str]) -> pa.Table:
    """``demos.parquet``'s table (:data:`DEMOS_SCHEMA`)."""
    rows = demo_rows(turns, prompts)
    return pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in DEMOS_SCHEMA},
                    schema=DEMOS_SCHEMA)


def _episode_probe(episode_probe: Any, tok: Tokenized, timings: dict[str, float], pool: Any) -> dict | None:
    """The whole-episode probe's figures now (None without one); its time joins ``timings``."""
    if episode_probe is None:
        return None
    t = time.perf_counter()
    out = episode_probe.score(tok.model, tok.tokenizer, pool=pool)
    timings["episode_probe_s"] = timings.get("episode_probe_s", 0.0) + time.perf_counter() - t
    return out


INCONTEXT_CSV = "policy_incontext.csv"
INCONTEXT_COLUMNS = ("step", "oracle_first_step", "oracle_plan_copied", "plain_first_step")


def incontext_csv(curve: list[dict]) -> str:
    """``metrics/policy_incontext.csv``: the in-context probe's scores by training step."""
    lines = [",".join(INCONTEXT_COLUMNS)]
    lines += [",".join(str(rec.get(c, "")) for c in INCONTEXT_COLUMNS) for rec in curve]
    return "\n".join(lines) + "\n"


def build_policy(cfg: Config, demo_set: DemoSet, out_dir: Path, *,
                 train_progress: Callable[[int], Callable[[int, float], None]] | None = None,
                 probe: Any = None, episode_probe: Any = None, games: tuple[Sequence[Any], Any] | None = None,
                 dagger_progress: Callable[[str, int, int], None] | None = None, pool: Any = None,
                 checkpoints: Path | None = None) -> dict:
    """Tokenizer -> model -> training on ``demo_set``, saved into ``out_dir`` (swapped in whole).

    Args:
        cfg: the composed config (``policy`` sizes and trains the model).
        demo_set: the demonstrations (:func:`pipeline.policy.demoset.load_demo_set`).
        out_dir: ``paths.policy``.
        train_progress: called with the number of training steps; returns the per-step
            callback ``(n, loss)`` given to :func:`pipeline.policy.model.train`.
        probe: an :class:`pipeline.policy.incontext.InContextProbe`, scored before training,
            every ``policy.incontext_every`` steps and after the last one (and after each DAgger round).
        episode_probe: a :class:`pipeline.policy.dagger.EpisodeProbe`, played after the
            demonstrations and after each DAgger round.
        games: ``(manifest, scenes)``, needed by ``policy.dagger_rounds`` > 0 (the rounds'
            houses avoid the eval scenes' layouts and objectives).
        dagger_progress: ``(what, done, total)`` of the DAgger rounds' episodes and steps.
        pool: where the whole episodes are played (the episode probe's, DAgger's rollouts):
            :func:`pipeline.policy.dagger.rollout_pool`, such as the stage's; default this process.
        checkpoints: where the phases are saved and resumed from
            (:func:`pipeline.policy.resume.checkpoint_dir`; ``None``: neither). A run resumed
            after its demonstrations' training or a DAgger round writes the bytes an
            uninterrupted run writes; the folder is removed once ``out_dir`` is written.

    Returns:
        ``{"memory", "summary", "curve", "incontext", "timings", "resumed"}``: the scene memory (for
        the quality evaluation), the deterministic summary (with ``episode_probe`` and
        ``dagger``: the whole-episode probe's figures and each round's), the loss curve (the
        rounds' steps numbered on), the probe's scores by step (``[]`` without a probe), wall times (with ``train_processes``,
        the processes the data-parallel training used: :func:`pipeline.policy.model.train_processes`)
        and the phase the run resumed after (``None``: it ran whole).
    """
    pol = cfg.policy
    timings: dict[str, float] = {}
    t = time.perf_counter()
    tok = tokenize_demos(cfg, demo_set.turns)
    timings["tokenize_s"] = time.perf_counter() - t

    t = time.perf_counter()
    n_steps = pol.epochs * -(-len(tok.units) // pol.episodes_per_batch)
    progress: Callable[[int, float], None] | None = None
    incontext: list[dict] = []
    probe_s = 0.0

    def measure(step: int) -> None:
        nonlocal probe_s
        t_probe = time.perf_counter()
        incontext.append({"step": step, **probe.score(tok.model, tok.tokenizer)})
        probe_s += time.perf_counter() - t_probe

    done = 0

    def on_step(n: int, loss: float) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(n, loss)
        if probe is not None and pol.incontext_every > 0 and done % pol.incontext_every == 0 and done < n_steps:
            measure(done)

    import torch  # deferred: heavy optional dependency (torch), pinned by the stage before it loads

    processes = train_processes(cfg.workers, pol)  # the machine's: wall time only, never a byte
    stage_threads = torch.get_num_threads()
    torch.set_num_threads(int(pol.threads))  # the training's own fixed thread count (policy.threads)
    phases = PhaseCheckpoints(checkpoints)
    resumed = phases.latest([TRAINED] + [round_phase(r) for r in range(int(pol.dagger_rounds))])
    done_rounds: DaggerResult | None = None
    try:
        if resumed is None:
            if train_progress is not None:
                progress = train_progress(n_steps)
            if probe is not None:
                measure(0)
            curve = train(tok.model, tok.units, pol, seed=cfg.seed, pad_id=int(tok.tokenizer.pad_token_id),
                          progress=on_step, processes=processes)
            if probe is not None:
                measure(len(curve))
            timings["train_s"] = time.perf_counter() - t - probe_s
            episodes = _episode_probe(episode_probe, tok, timings, pool)
            phases.save(TRAINED, tok.model, {"curve": curve, "incontext": incontext, "episodes": episodes})
        else:
            state = phases.load(resumed, tok.model)
            curve, episodes = state["curve"], state["episodes"]
            incontext[:] = state["incontext"]
            if "dagger" in state:
                d = state["dagger"]
                done_rounds = DaggerResult(turns_from_state(d["turns"]), [], d["curve"], d["rounds"])
        dagger = None
        if pol.dagger_rounds > 0:
            if games is None:
                raise ValueError("policy.dagger_rounds > 0 needs games=(manifest, scenes)")
            t = time.perf_counter()
            probe_before = probe_s + timings.get("episode_probe_s", 0.0)

            def after_round(r: int, step: int) -> dict:
                out = {}
                if probe is not None:
                    measure(step)
                    out["incontext"] = {k: v for k, v in incontext[-1].items() if k != "step"}
                if episode_probe is not None:
                    out["episode_probe"] = _episode_probe(episode_probe, tok, timings, pool)
                return out

            def saved(result: DaggerResult) -> None:
                phases.save(round_phase(len(result.rounds) - 1), tok.model,
                            {"curve": curve, "incontext": incontext, "episodes": episodes,
                             "dagger": {"turns": turns_state(result.turns), "curve": result.curve,
                                        "rounds": result.rounds}})

            dagger = run_rounds(cfg, tok.model, tok.tokenizer, tok.units, demo_set.memory, games[0], games[1],
                                start_step=len(curve), processes=processes, after_round=after_round,
                                progress=dagger_progress, pool=pool, resume=done_rounds, on_round=saved)
            curve = curve + dagger.curve
            timings["dagger_s"] = time.perf_counter() - t - (probe_s + timings.get("episode_probe_s", 0.0)
                                                                - probe_before)
    finally:
        torch.set_num_threads(stage_threads)
    timings["incontext_s"] = probe_s
    timings["train_processes"] = processes  # metrics only (never training.json): the bytes do not depend on it

    summary = training_summary(pol, demo_set.summary, tok, curve)
    if incontext:
        summary["incontext"] = {**{k: v for k, v in incontext[-1].items() if k != "step"},
                                "before_training": {k: v for k, v in incontext[0].items() if k != "step"}}
    if episodes is not None:
        last = dagger.rounds[-1].get("episode_probe", episodes) if dagger is not None and dagger.rounds else episodes
        summary["episode_probe"] = {**last, "after_demonstrations": episodes}
    turns, prompts = list(demo_set.turns), list(tok.prompts)
    if dagger is not None:
        summary["dagger"] = {"rounds": dagger.rounds, "steps": len(dagger.curve),
                             "labelled_turns": len(dagger.turns)}
        turns += dagger.turns
        prompts += dagger.prompts
    with atomic_dir(out_dir) as tmp:
        save_policy(tmp / MODEL_DIR, tok.model, tok.tokenizer)
        write_parquet(demos_table(turns, prompts), tmp / DEMOS_FILE, sort_by=["demo_id", "turn_index"],
                      schema_version="1")
        atomic_write_json(tmp / SUMMARY_FILE, summary)
    phases.clear()
    return {"memory": demo_set.memory, "summary": summary, "curve": curve, "incontext": incontext,
            "timings": timings, "resumed": resumed}
