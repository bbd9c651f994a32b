"""Tokenizer, model and training loop of the default policy (CPU, minutes, seeded).

- **Tokenizer**: byte-level BPE trained with ``tokenizers`` on the demonstrations. The
  pre-tokenizer splits only before newlines and around entity names (``Cup`` | ``_3``),
  room names and numbers, so the fixed phrases of the prompt template and of the JSON
  answer (``{"action": "pick_up", "target": "``) become single tokens while names stay
  composable: a prompt of ~4,000 characters is a few hundred tokens, which is what makes
  training on two CPU cores possible. Every byte is in the vocabulary, so any text
  encodes. Wrapped as a :class:`transformers.PreTrainedTokenizerFast` with a ChatML-style
  chat template (``<|im_start|>role ... <|im_end|>``), so the ``transformers`` backend
  takes its chat-template path.
- **Model**: a small Llama-style causal LM from a ``transformers`` config (tied
  embeddings, SDPA attention), saved with ``save_pretrained`` (safetensors) beside the
  tokenizer: a model directory any user could have made.
- **Training**: next-token loss on the answer tokens only (the prompt is context), AdamW
  with warm-up and cosine decay, a seeded batch order, a fixed number of steps. The turns
  of an episode share their prompt prefix (objective, grounding, advisory block): it is
  computed once per step and its keys/values reused by every turn (:class:`Unit`), which
  gives the same gradients as full prompts at a fraction of the cost.

    tok = train_tokenizer(texts, vocab_size=2048)
    model = build_model(tok, cfg.model.policy, seed=cfg.seed)
    units = [make_unit([Sample(prompt_ids, answer_ids), ...]), ...]   # one per episode
    curve = train(model, units, cfg.model.policy, seed=cfg.seed, progress=bar)
    save_policy("data/policy/model", model, tok)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from pipeline.core.conf_schema import PolicyConfig
from pipeline.core.seeding import crc_rng
from pipeline.envs.household.games import ROOM_NAMES

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of a turn; the model's EOS

CHAT_TEMPLATE = (
    "{% for m in messages %}" + IM_START + "{{ m['role'] }}\n{{ m['content'] }}" + IM_END + "\n{% endfor %}"
    "{% if add_generation_prompt %}" + IM_START + "assistant\n{% endif %}"
)


def split_pattern() -> str:
    """Regex of the pieces the pre-tokenizer isolates: entity kinds before ``_<n>``,
    ``_<n>``, numbers and room names. Names are built from shared parts (``Cup`` +
    ``_3``), so every kind and index is learned from many names (one token per whole
    name learned worse in a trial); phrases around names still merge."""
    rooms = "|".join(sorted(ROOM_NAMES, key=len, reverse=True))
    return r"[A-Z][A-Za-z]*(?=_\d)|_\d+|\d+|\b(?:" + rooms + r")\b"


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 2048) -> Any:
    """A byte-level BPE tokenizer trained on ``texts`` (deterministic for the same texts)."""
    # deferred: heavy optional dependencies (tokenizers, transformers)
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        # A newline starts the next piece ("\n    \"memory_on\": true," is one token)...
        pre_tokenizers.Split(Regex(r"\n"), behavior="merged_with_next"),
        # ... and names / numbers stand alone, so they compose instead of fusing with phrases.
        pre_tokenizers.Split(Regex(split_pattern()), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), special_tokens=[PAD, IM_START, IM_END],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD,
                                   additional_special_tokens=[IM_START])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer: Any, policy_cfg: PolicyConfig, *, seed: int = 0) -> Any:
    """A randomly initialised Llama-style causal LM sized by ``model.policy`` (seeded)."""
    # deferred: heavy optional dependencies (torch, transformers)
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=policy_cfg.hidden_size,
        intermediate_size=policy_cfg.intermediate_size, num_hidden_layers=policy_cfg.n_layer,
        num_attention_heads=policy_cfg.n_head, num_key_value_heads=policy_cfg.n_head,
        max_position_embeddings=policy_cfg.max_positions, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=eos, pad_token_id=pad, attn_implementation="sdpa")
    torch.manual_seed(int(seed))
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=None)
    return model


@dataclass
class Sample:
    """One training example: the prompt's token ids and the answer's (EOS included)."""

    prompt_ids: list[int]
    answer_ids: list[int]


@dataclass
class Unit:
    """The train turns of one demonstration episode, sharing their prompt prefix.

    Every turn of an episode starts with the same tokens (chat header, objective,
    grounding, advisory block); only the memory and observation lines differ. The prefix
    is run once per step and its keys/values are reused by every turn (exactly the same
    logits and gradients as running each prompt in full; see :func:`answer_loss`).

    Attributes:
        prefix: token ids shared by every turn's prompt (never a whole prompt).
        turns: per turn, ``(rest of the prompt, answer ids)``.
    """

    prefix: list[int]
    turns: list[tuple[list[int], list[int]]]

    @property
    def tokens(self) -> int:
        return len(self.prefix) + sum(len(p) + len(a) for p, a in self.turns)


def make_unit(samples: Sequence[Sample]) -> Unit:
    """Split an episode's samples into their longest common prompt prefix and the rest."""
    prompts = [s.prompt_ids for s in samples]
    n = min(len(p) for p in prompts) - 1  # each turn keeps at least its last prompt token
    k = 0
    while k < n and all(p[k] == prompts[0][k] for p in prompts):
        k += 1
    return Unit(list(prompts[0][:k]), [(list(s.prompt_ids[k:]), list(s.answer_ids)) for s in samples])


def batches(units: Sequence[Unit], per_batch: int, rng: np.random.Generator, bucket: int = 8) -> list[list[int]]:
    """One epoch of batches (unit indices): shuffled, then bucketed by prefix length so a
    batch pads little, then the batch order shuffled again (all from ``rng``)."""
    order = rng.permutation(len(units))
    out: list[list[int]] = []
    span = per_batch * bucket
    for i in range(0, len(order), span):
        chunk = sorted(order[i:i + span].tolist(), key=lambda j: (len(units[j].prefix), units[j].tokens, j))
        out += [chunk[k:k + per_batch] for k in range(0, len(chunk), per_batch)]
    return [out[i] for i in rng.permutation(len(out))]


def collate(units: Sequence[Unit], pad_id: int) -> dict:
    """Tensors of a batch: left-padded prefixes (one row per unit), right-padded turn
    rows (prompt rest + answer), each row's unit, positions, and the answer targets."""
    import torch  # deferred: heavy optional dependency (torch)

    P = max(len(u.prefix) for u in units)
    rows = [(e, p, a) for e, u in enumerate(units) for p, a in u.turns]
    S = max(len(p) + len(a) for _, p, a in rows)
    prefix = torch.full((len(units), P), pad_id, dtype=torch.long)
    prefix_mask = torch.zeros((len(units), P), dtype=torch.long)
    for e, u in enumerate(units):
        if u.prefix:
            prefix[e, P - len(u.prefix):] = torch.tensor(u.prefix, dtype=torch.long)
            prefix_mask[e, P - len(u.prefix):] = 1
    ids = torch.full((len(rows), S), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), S), dtype=torch.long)
    pos = torch.zeros((len(rows), S), dtype=torch.long)
    where_r, where_c, targets = [], [], []
    for r, (e, p, a) in enumerate(rows):
        seq = p + a
        ids[r, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[r, :len(seq)] = 1
        pos[r] = len(units[e].prefix) + torch.arange(S)  # positions continue the unpadded prefix
        where_r += [r] * len(a)
        where_c += list(range(len(p) - 1, len(p) - 1 + len(a)))  # position t predicts token t + 1
        targets += a
    return {"prefix": prefix, "prefix_mask": prefix_mask, "owner": torch.tensor([e for e, _, _ in rows]),
            "ids": ids, "mask": mask, "pos": pos, "where": (torch.tensor(where_r), torch.tensor(where_c)),
            "targets": torch.tensor(targets, dtype=torch.long)}


def answer_loss(model: Any, batch: dict) -> Any:
    """Mean cross-entropy of the answer tokens of a collated batch.

    The prefixes run first (left-padded, positions from 0) into a KV cache; its rows are
    repeated for the turns of each unit (differentiable indexing) and the turns run on
    top of it with their positions continuing the prefix, so every turn sees exactly
    the prompt the agent sends. The LM head runs on the answer positions only.
    """
    # deferred: heavy optional dependencies (torch, transformers)
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    pmask = batch["prefix_mask"]
    if pmask.shape[1]:
        ppos = (pmask.cumsum(-1) - 1).clamp(min=0)
        model.model(input_ids=batch["prefix"], attention_mask=pmask, position_ids=ppos, past_key_values=cache,
                    use_cache=True)
        cache.batch_select_indices(batch["owner"])
        att = torch.cat([pmask[batch["owner"]], batch["mask"]], dim=1)
    else:
        att = batch["mask"]
    hidden = model.model(input_ids=batch["ids"], attention_mask=att, position_ids=batch["pos"],
                         past_key_values=cache, use_cache=True).last_hidden_state  # (rows, S, C)
    where = batch["where"]
    logits = model.lm_head(hidden[where[0], where[1]])  # (answer tokens, V)
    return torch.nn.functional.cross_entropy(logits.float(), batch["targets"])


def lr_at(step: int, total: int, lr: float, warmup: int, final_frac: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to ``final_frac * lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return lr * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(model: Any, units: Sequence[Unit], policy_cfg: PolicyConfig, *, seed: int = 0, pad_id: int = 0,
          progress: Callable[[int, float], None] | None = None) -> list[dict]:
    """Train ``model`` in place for ``policy.epochs`` epochs; returns one record per step.

    Deterministic for the same units, config, seed and thread count: torch is seeded,
    the batch order comes from ``crc_rng(seed, ints=(0x501,))``.

    Returns:
        ``[{"step", "epoch", "loss", "lr", "tokens"}, ...]`` (loss of the batch before the
        update, ``tokens`` the answer tokens it averaged over).
    """
    import torch  # deferred: heavy optional dependency (torch)

    if not units:
        raise ValueError("no training samples: the demonstrations are empty")
    torch.manual_seed(int(seed))
    rng = crc_rng(int(seed), ints=(0x501,))
    per_batch = policy_cfg.episodes_per_batch
    epochs = [batches(units, per_batch, rng) for _ in range(policy_cfg.epochs)]
    total = sum(len(e) for e in epochs)
    lr = policy_cfg.lr
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": policy_cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    model.train()
    dev = next(model.parameters()).device
    curve, step = [], 0
    for epoch, epoch_batches in enumerate(epochs):
        for idx in epoch_batches:
            batch = collate([units[i] for i in idx], pad_id)
            if dev.type != "cpu":  # a study on an accelerator (pipeline.policy.scaling); the stage trains on the CPU
                batch = {k: tuple(t.to(dev) for t in v) if isinstance(v, tuple) else v.to(dev)
                         for k, v in batch.items()}
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, lr, policy_cfg.warmup_steps)
            loss = answer_loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            value = float(loss.detach())
            curve.append({"step": step, "epoch": epoch, "loss": round(value, 6),
                          "lr": round(opt.param_groups[0]["lr"], 8), "tokens": int(batch["targets"].numel())})
            step += 1
            if progress is not None:
                progress(1, value)
    model.eval()
    return curve


def save_policy(path: str | os.PathLike, model: Any, tokenizer: Any) -> Path:
    """``save_pretrained`` model (safetensors) and tokenizer into ``path``."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(p, safe_serialization=True)
    tokenizer.save_pretrained(p)
    for f in p.iterdir():  # safetensors writes 0600; the directory is shared like any artifact
        if f.is_file():
            f.chmod(0o644)
    return p


def count_parameters(model: Any) -> int:
    return int(sum(t.numel() for t in model.parameters()))

