"""Where do two CPUs part ways? A numerics fingerprint of this machine, op by op.

    python -m pipeline.policy.fingerprint --out fp.json            # this machine's fingerprint
    python -m pipeline.policy.fingerprint --compare a.json b.json  # the probes that differ, in order

The pinned numerics (``pipeline/core/numerics.py``) gave the same bytes on an AVX2-only and
an AVX-512 AMD EPYC, but not, as measured, on an earlier AVX-512 AMD EPYC
(``docs/reproducibility.md``). This runs, under the default pin and in a fresh process, a
fixed list of probes from the bottom of the stack up and hashes each result:

1. ``libm.*`` and ``numpy.*``: the C maths library and NumPy's SIMD ufuncs (NumPy picks
   AVX-512 code where the CPU has it) on fixed arrays;
2. ``tokenizer``: the policy's tokenizer trained on fixed text (Rust, ``tokenizers``);
3. ``op.*``: torch's ops on exact inputs (dyadic rationals, so generating them is exact):
   matrix products of the policy's shapes (MKL's SGEMM), softmax, normalisation,
   activations, attention forward and backward, cross-entropy, an AdamW step;
4. ``model.*``: the policy model's initial weights, every module's output on one batch,
   the loss, every parameter's gradient, the weights after one step, and after each step of
   ``tests/test_data_parallel.py``'s 36-step run (``model.train.final`` is its hash).

Comparing two fingerprints lists the probes that differ in this order: the first one is
where the machines part ways (an op whose output differs while its inputs agree). The
fingerprints recorded so far are in ``docs/fingerprints/``, one per CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

# The probes' version: a fingerprint compares only with one of the same version.
VERSION = 1


def _digest(*arrays: Any) -> str:
    h = hashlib.sha256()
    for a in arrays:
        if hasattr(a, "detach"):
            a = a.detach().contiguous().cpu().numpy()
        h.update(memoryview(a).tobytes() if not isinstance(a, bytes) else a)
    return h.hexdigest()[:16]


def _weights(model: Any) -> str:
    """The digest of a model's weights, by parameter name."""
    return _digest(*(t for _, t in sorted(model.state_dict().items())))


def train_sha256(model: Any, curve: list[dict]) -> str:
    """sha256 of a trained model's weights (by name) and its loss curve (JSON): the hash
    ``model.train.final`` and ``tests/test_data_parallel.py`` pin."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    h.update(json.dumps(curve, sort_keys=True).encode())
    return h.hexdigest()


def _dyadic(rng: Any, *shape: int, scale: int = 2 ** 12) -> Any:
    """Floats k / 2**12 with |k| < 2**12: exact in float32 whatever the machine."""
    import numpy as np

    return (rng.integers(-scale, scale, size=shape) / scale).astype(np.float32)


def _libm_and_numpy(out: dict[str, str]) -> None:
    import math

    import numpy as np

    xs = [(-1000 + i) / 97.0 for i in range(2001)]
    for name in ("exp", "log1p", "cos", "sin", "tanh", "atan"):
        f = getattr(math, name)
        vals = [f(x) if name != "log1p" else f(abs(x)) for x in xs]
        out[f"libm.{name}"] = _digest(np.array(vals, dtype=np.float64))
    x64 = np.array(xs, dtype=np.float64)
    for dt in (np.float32, np.float64):
        x = x64.astype(dt)
        for name in ("exp", "log", "sin", "cos", "tanh"):
            arg = np.abs(x) + 1 if name == "log" else x / 8
            out[f"numpy.{name}.{np.dtype(dt).name}"] = _digest(getattr(np, name)(arg))
        out[f"numpy.sum.{np.dtype(dt).name}"] = _digest(np.array([x.sum(), (x * x).sum()], dtype=dt))


def tiny_setup(**policy: Any) -> tuple[Any, Any, list[Any]]:
    """A tiny tokenizer, policy config (``policy`` overrides it) and 22 synthetic units, seeded:
    the training of ``model.train.*`` and of ``tests/test_data_parallel.py``."""
    import dataclasses

    import numpy as np

    from pipeline.core.conf_schema import PolicyConfig
    from pipeline.policy.model import Unit, train_tokenizer

    rng = np.random.default_rng(7)
    words = ["alpha", "beta", "gamma", "delta", "Cup_1", "kitchen", "open", "take", "{\"action\": "]
    tok = train_tokenizer([" ".join(rng.choice(words, 12)) for _ in range(40)], vocab_size=300)
    V = len(tok)
    pol = dataclasses.replace(PolicyConfig(), **{**dict(
        vocab_size=300, hidden_size=32, intermediate_size=64, n_layer=2, n_head=2, max_positions=512, epochs=6,
        episodes_per_batch=4, lr=0.005, warmup_steps=3, threads=1), **policy})
    units = []
    for _ in range(22):
        prefix = rng.integers(3, V, int(rng.integers(0, 40))).tolist()
        turns = [(rng.integers(3, V, int(rng.integers(1, 12))).tolist(),
                  rng.integers(3, V, int(rng.integers(1, 8))).tolist()) for _ in range(int(rng.integers(1, 4)))]
        units.append(Unit(prefix, turns))
    return tok, pol, units


def _ops(out: dict[str, str]) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(11)

    def t(*shape: int) -> Any:
        return torch.from_numpy(_dyadic(rng, *shape))

    for m, k, n in ((24, 32, 32), (24, 32, 64), (24, 64, 32), (24, 32, 300), (7, 32, 96), (160, 32, 32)):
        a, b = t(m, k), t(k, n)
        out[f"op.mm.{m}x{k}x{n}"] = _digest(a @ b)
        out[f"op.mm_nt.{m}x{k}x{n}"] = _digest(a @ b.T.contiguous().T)
        out[f"op.mm_tn.{m}x{k}x{n}"] = _digest(a.T.contiguous().T @ b)
    a, b = t(4, 24, 16), t(4, 16, 24)
    out["op.bmm.4x24x16x24"] = _digest(torch.bmm(a, b))
    x = t(24, 300) * 8
    out["op.softmax"] = _digest(torch.softmax(x, -1))
    out["op.log_softmax"] = _digest(torch.log_softmax(x, -1))
    out["op.exp"] = _digest(torch.exp(x))
    out["op.sum"] = _digest(x.sum(-1), x.sum(0), x.sum())
    h = t(24, 32)
    out["op.rsqrt_mean_sq"] = _digest(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))
    out["op.layer_norm"] = _digest(F.layer_norm(h, (32,)))
    out["op.silu"] = _digest(F.silu(h * 4))
    out["op.gelu"] = _digest(F.gelu(h * 4))
    out["op.sigmoid"] = _digest(torch.sigmoid(h * 4))
    ang = torch.arange(64, dtype=torch.float32)[:, None] * (1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16))
    out["op.rope_cos_sin"] = _digest(ang.cos(), ang.sin())
    q, k, v = (t(2, 2, 24, 16).requires_grad_() for _ in range(3))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out["op.sdpa.forward"] = _digest(o)
    o.backward(t(2, 2, 24, 16))
    out["op.sdpa.backward"] = _digest(q.grad, k.grad, v.grad)
    mask = torch.tril(torch.ones(24, 24, dtype=torch.bool))
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o2 = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask)
    out["op.sdpa_mask.forward"] = _digest(o2)
    logits = (t(40, 300) * 8).requires_grad_()
    target = torch.from_numpy(rng.integers(0, 300, 40))
    loss = F.cross_entropy(logits, target)
    loss.backward()
    out["op.cross_entropy"] = _digest(loss, logits.grad)
    emb = torch.nn.Embedding(300, 32)
    with torch.no_grad():
        emb.weight.copy_(t(300, 32))
    idx = torch.from_numpy(rng.integers(0, 300, (6, 24)))
    emb(idx).backward(t(6, 24, 32))
    out["op.embedding.backward"] = _digest(emb.weight.grad)
    p = torch.nn.Parameter(t(64, 32))
    opt = torch.optim.AdamW([p], lr=0.005, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(3):
        p.grad = t(64, 32)
        opt.step()
    out["op.adamw.3_steps"] = _digest(p)


def _model(out: dict[str, str]) -> None:
    import torch

    from pipeline.core.seeding import crc_rng
    from pipeline.policy.model import answer_loss, batches, build_model, collate, train

    tok, pol, units = tiny_setup()
    vocab = json.dumps(tok.get_vocab(), sort_keys=True).encode()
    out["tokenizer"] = _digest(vocab)
    model = build_model(tok, pol, seed=0)
    out["model.init"] = _weights(model)
    pad = int(tok.pad_token_id)
    idx = batches(units, pol.episodes_per_batch, crc_rng(0, ints=(0x501,)))[0]
    batch = collate([units[i] for i in idx], pad)
    outputs: list[tuple[str, Any]] = []

    def hook(name: str) -> Callable[..., None]:
        def record(_module: Any, _inputs: Any, output: Any) -> None:
            first = output[0] if isinstance(output, tuple) else getattr(output, "last_hidden_state", output)
            if hasattr(first, "detach"):
                outputs.append((name, first))
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    model.train()
    torch.manual_seed(0)
    loss = answer_loss(model, batch)
    for h in handles:
        h.remove()
    seen: dict[str, int] = {}
    for name, value in outputs:  # in call order: the prefix pass, then the turns'
        seen[name] = seen.get(name, 0) + 1
        out[f"model.forward.{name}#{seen[name]}"] = _digest(value)
    out["model.loss"] = _digest(loss)
    loss.backward()
    for name, p in model.named_parameters():
        out[f"model.grad.{name}"] = _digest(p.grad)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    out["model.grad.clipped"] = _digest(*(p.grad for p in model.parameters()))

    model = build_model(tok, pol, seed=0)
    step = [0]

    def progress(_n: int, _loss: float) -> None:
        step[0] += 1
        out[f"model.train.step{step[0]:02d}"] = _weights(model)

    curve = train(model, units, pol, seed=0, pad_id=pad, progress=progress)
    out["model.train.final"] = train_sha256(model, curve)


def fingerprint() -> dict[str, Any]:
    """This machine's fingerprint under the default pinned numerics (pins them first)."""
    from pipeline.core.conf_schema import NumericsConfig
    from pipeline.core.numerics import cpu_model, pin

    ran = pin(NumericsConfig())  # before torch loads (a no-op warning if the caller loaded it)
    import platform

    import numpy as np

    from pipeline.core.cpu import cpu_level

    probes: dict[str, str] = {}
    _libm_and_numpy(probes)
    _ops(probes)
    _model(probes)
    return {"version": VERSION, "cpu": cpu_model(), "cpu_level": cpu_level(), "numerics": ran,
            "libc": "-".join(platform.libc_ver()), "numpy": np.__version__, "numpy_simd": _numpy_simd(),
            "probes": probes}


def _numpy_simd() -> list[str]:
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats  # NumPy 2
    except ImportError:  # pragma: no cover - NumPy 1
        from numpy.core._multiarray_umath import __cpu_features__ as feats
    # NumPy 2 dispatches by level (X86_V3, X86_V4), and NPY_DISABLE_CPU_FEATURES turns a level off
    return sorted(k for k, v in feats.items() if v and k.startswith(("X86_V", "AVX512")))


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The probes whose hashes differ between two fingerprints, in probe order."""
    if a.get("version") != b.get("version"):
        raise ValueError(f"fingerprint versions differ ({a.get('version')} vs {b.get('version')}): rerun both")
    pa, pb = a["probes"], b["probes"]
    return [k for k in list(pa) + [k for k in pb if k not in pa] if pa.get(k) != pb.get(k)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.policy.fingerprint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write this machine's fingerprint here (JSON); printed otherwise")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="list the probes two fingerprints differ in")
    args = parser.parse_args(argv)
    if args.compare:
        docs = []
        for path in args.compare:
            try:
                docs.append(json.loads(Path(path).read_text()))
            except (OSError, ValueError) as exc:
                print(f"error: {path}: expected a fingerprint written by --out ({exc})", file=sys.stderr)
                return 2
        try:
            diff = compare(*docs)
        except (ValueError, KeyError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for path, d in zip(args.compare, docs):
            print(f"{path}: {d.get('cpu')} ({d.get('cpu_level')}), numpy SIMD {', '.join(d.get('numpy_simd', []))}")
        if not diff:
            print(f"all {len(docs[0]['probes'])} probes agree")
            return 0
        print(f"{len(diff)} of {len(docs[0]['probes'])} probes differ; the first is where the machines part ways:")
        for k in diff:
            print(f"  {k}: {docs[0]['probes'].get(k)} vs {docs[1]['probes'].get(k)}")
        return 1
    doc = fingerprint()
    text = json.dumps(doc, indent=1) + "\n"
    if args.out:
        from pipeline.core.io import atomic_write_text

        atomic_write_text(Path(args.out), text)
        print(f"wrote {args.out}: {len(doc['probes'])} probes ({doc['cpu']}, {doc['cpu_level']})")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
