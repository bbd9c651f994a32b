"""Tiny local language models for tests and benchmarks (no hub download, seconds on a CPU).

A byte-level BPE tokenizer trained with ``tokenizers`` on a few texts, wrapped as a
transformers fast tokenizer, and a small GPT-2 fitted to reproduce given answers for
given prompts, saved with ``save_pretrained`` so that the backend loads it exactly like a
user's model directory::

    tok = train_tokenizer(texts, vocab_size=512)
    model = tiny_gpt2(tok, n_layer=2, n_embd=64)
    fit(model, tok, [(prompt_text, answer_text), ...], steps=200)
    save_model_dir("tmp/model", model, tok)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

EOS = "<|endoftext|>"

# A minimal chat template (ChatML-like) for tests of the chat-template path.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 512, chat_template: str | None = None) -> Any:
    """A byte-level BPE tokenizer (GPT-2 style) trained on ``texts``.

    Every byte is in the vocabulary, so any text (any UTF-8) is encodable; characters
    not seen in training are split into single-byte tokens (partial UTF-8).
    """
    # deferred: heavy optional dependencies (tokenizers, transformers)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = [EOS] + (["<|im_start|>", "<|im_end|>"] if chat_template else [])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    if chat_template:
        fast.chat_template = chat_template
    return fast


def tiny_gpt2(tokenizer: Any, *, n_layer: int = 2, n_embd: int = 64, n_head: int = 2, n_positions: int = 1024,
              seed: int = 0) -> Any:
    """A randomly initialised GPT-2 sized for ``tokenizer`` (seeded)."""
    import torch  # deferred: heavy optional dependency (torch)
    from transformers import GPT2Config, GPT2LMHeadModel  # deferred: heavy optional dependency

    cfg = GPT2Config(vocab_size=len(tokenizer), n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                     n_head=n_head, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg)


def fit(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], *, steps: int = 200, lr: float = 3e-3,
        seed: int = 0) -> list[float]:
    """Teach ``model`` to answer each prompt text with its answer (+ EOS); returns the losses.

    Full-batch AdamW on the answer tokens only (the prompt is context). Enough steps
    make greedy decoding reproduce every answer exactly.
    """
    import torch  # deferred: heavy optional dependency (torch)

    torch.manual_seed(seed)
    seqs, labels = [], []
    for prompt, answer in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + a)
        labels.append([-100] * len(p) + a)
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), tokenizer.eos_token_id, dtype=torch.long)
    lab = torch.full((len(seqs), n), -100, dtype=torch.long)
    att = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, (s, y) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)], lab[i, : len(y)], att[i, : len(s)] = torch.tensor(s), torch.tensor(y), 1
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def save_model_dir(path: str | os.PathLike, model: Any, tokenizer: Any) -> Path:
    """``save_pretrained`` both (safetensors): a directory ``AutoModelForCausalLM`` loads."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(p)
    tokenizer.save_pretrained(p)
    return p
