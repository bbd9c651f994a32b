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
  with warm-up and cosine decay, a seeded batch order, a fixed number of steps. With
  ``policy.memory_weight`` < 1 the tokens of the memory dict the answer writes count that
  much in a weighted mean, and with ``policy.notes_weight`` < 1 its notes count that much
  less again (:func:`answer_sample`); at 1 the loss is the plain mean, byte for byte. The turns
  of an episode share their prompt prefix (objective, grounding, advisory block): it is
  computed once per step and its keys/values reused by every turn (:class:`Unit`), which
  gives the same gradients as full prompts at a fraction of the cost.
- **Data parallel** (``policy.micro_batches`` > 1): a step's units are cut into that
  many contiguous micro-batches, each loss weighted by its share of the step's answer
  tokens; ``min(micro_batches, workers // threads)`` processes compute them (helpers
  spawned once per run, their parameters the parent's, in shared memory) into one gradient
  slot each, summed in micro-batch order: any process count gives the same bytes
  (:func:`train`; ``tests/test_data_parallel.py``). A script that trains this way must
  guard its entry point (``if __name__ == "__main__":``): the helpers are spawned.

    tok = train_tokenizer(texts, vocab_size=2048)
    model = build_model(tok, cfg.policy, seed=cfg.seed)
    units = [make_unit([Sample(prompt_ids, answer_ids), ...]), ...]   # one per episode
    curve = train(model, units, cfg.policy, seed=cfg.seed, progress=bar)
    save_policy("data/model/policy/model", model, tok)
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from pipeline.core.conf_schema import PolicyConfig
from pipeline.core.parallel import WorkerStalled, die_with_parent, stall_message, stop_processes, supervision
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
    """A randomly initialised Llama-style causal LM sized by ``policy`` (seeded)."""
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
    """One training example: the prompt's token ids and the answer's (EOS included), and
    optionally a loss weight per answer token (None: every token counts 1)."""

    prompt_ids: list[int]
    answer_ids: list[int]
    weights: list[float] | None = None


#: Where the answer's memory dict starts: ``{"action": ..., "target": ..., "memory": {...}}``.
MEMORY_KEY = '"memory":'
NOTES_KEY = '"notes":'


def answer_sample(tokenizer: Any, prompt_ids: Sequence[int], response: str, eos: int,
                  memory_weight: float = 1.0, notes_weight: float = 1.0) -> Sample:
    """The training sample of one answer: its tokens and EOS, and with a weight below 1 a
    weight per token (``policy.memory_weight``, ``policy.notes_weight``):

    - ``memory_weight`` for every token that starts at or after the memory dict's key, to the
      end of the JSON (the memory the model writes itself, 67% of the answers' characters:
      docs/policy.md);
    - of those, the tokens from the dict's ``"notes":`` key on (the rooms visited and the
      containers searched, a third of the dict; the plan comes before them) weigh
      ``memory_weight * notes_weight``;
    - 1 for the reasoning line, the command and EOS.

    At 1 and 1 the sample carries no weights, so the loss is the plain mean it always was."""
    if memory_weight == 1.0 and notes_weight == 1.0:
        return Sample(list(prompt_ids), list(tokenizer(response, add_special_tokens=False)["input_ids"]) + [eos])
    enc = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)
    at = response.rfind(MEMORY_KEY)
    notes = response.find(NOTES_KEY, at) if at >= 0 else -1
    plan_w, notes_w = float(memory_weight), float(memory_weight) * float(notes_weight)
    # A token that starts before a key keeps the weight before it: the tokenizer may merge the command's
    # end with the key (``", "target": "north", "memory": {"plan": "`` can be one token).
    weights = [notes_w if 0 <= notes <= start else plan_w if 0 <= at <= start else 1.0
               for start, _ in enc["offset_mapping"]]
    return Sample(list(prompt_ids), list(enc["input_ids"]) + [eos], weights + [1.0])


def loss_weights(policy_cfg: Any) -> dict[str, float]:
    """The recipe's answer-token weights, as :func:`answer_sample`'s keyword arguments (read once, not per turn)."""
    return {"memory_weight": float(policy_cfg.memory_weight), "notes_weight": float(policy_cfg.notes_weight)}


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
    weights: list[list[float]] | None = None
    """Per turn, a loss weight per answer token (None: all 1; :func:`answer_sample`)."""

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
    weights = None if all(s.weights is None for s in samples) else \
        [list(s.weights) if s.weights is not None else [1.0] * len(s.answer_ids) for s in samples]
    return Unit(list(prompts[0][:k]), [(list(s.prompt_ids[k:]), list(s.answer_ids)) for s in samples], weights)


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
    rows (prompt rest + answer), each row's unit, positions, and the answer targets (and
    ``target_weights`` where a unit carries weights: :func:`answer_sample`)."""
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
    out = {"prefix": prefix, "prefix_mask": prefix_mask, "owner": torch.tensor([e for e, _, _ in rows]),
           "ids": ids, "mask": mask, "pos": pos, "where": (torch.tensor(where_r), torch.tensor(where_c)),
           "targets": torch.tensor(targets, dtype=torch.long)}
    if any(u.weights is not None for u in units):
        out["target_weights"] = torch.tensor(
            [w for u in units for t, (_, a) in enumerate(u.turns)
             for w in (u.weights[t] if u.weights is not None else [1.0] * len(a))], dtype=torch.float32)
    return out


def answer_loss(model: Any, batch: dict) -> Any:
    """Mean cross-entropy of the answer tokens of a collated batch (the weighted mean where
    the batch has ``target_weights``).

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
    if "target_weights" in batch:
        w = batch["target_weights"]
        ce = torch.nn.functional.cross_entropy(logits.float(), batch["targets"], reduction="none")
        return (ce * w).sum() / w.sum()
    return torch.nn.functional.cross_entropy(logits.float(), batch["targets"])


def lr_at(step: int, total: int, lr: float, warmup: int, final_frac: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to ``final_frac * lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return lr * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train_processes(workers: Any, policy_cfg: PolicyConfig) -> int:
    """Processes the data-parallel training uses: ``min(micro_batches, workers // threads)``, at least 1.

    ``workers`` is the top-level config key (``auto`` or a number, :mod:`pipeline.core.parallel`);
    each process computes its micro-batches on ``policy.threads`` torch threads. The count
    changes the wall time only, never a byte (:func:`train`)."""
    from pipeline.core.parallel import resolve_workers

    return min(int(policy_cfg.micro_batches), max(1, resolve_workers(workers) // int(policy_cfg.threads)))


def micro_batch_split(idx: Sequence[int], parts: int) -> list[list[int]]:
    """A step's unit indices cut into ``min(parts, len(idx))`` contiguous chunks, the first ones one
    unit longer where the count does not divide (a function of the step and the config only)."""
    k = max(1, min(int(parts), len(idx)))
    q, r = divmod(len(idx), k)
    out, at = [], 0
    for i in range(k):
        n = q + (i < r)
        out.append(list(idx[at:at + n]))
        at += n
    return out


def _answer_tokens(unit: Unit) -> int:
    return sum(len(a) for _, a in unit.turns)


def _answer_mass(unit: Unit) -> float:
    """What a unit's answers weigh in a step's loss: its tokens, or their weights' sum."""
    return _answer_tokens(unit) if unit.weights is None else sum(sum(w) for w in unit.weights)


def _to_device(batch: dict, dev: Any) -> dict:
    return {k: tuple(t.to(dev) for t in v) if isinstance(v, tuple) else v.to(dev) for k, v in batch.items()}


def _micro_batch_grad(model: Any, params: Sequence[Any], units: Sequence[Unit], idx: Sequence[int], pad_id: int,
                      weight: float | None, seed: int, slot: Any) -> float:
    """One micro-batch: its weighted loss's gradient written into ``slot`` (flat, in ``params``
    order; zeros for a parameter it does not reach); returns its unweighted mean loss.

    The same function runs in the parent and in every helper process, so a micro-batch gives
    the same bytes wherever it is computed. torch is seeded per (step, micro-batch) (the
    policy model draws nothing while it trains: no dropout; a model that does stays
    deterministic)."""
    import torch  # deferred: heavy optional dependency (torch)

    torch.manual_seed(seed)
    for p in params:
        p.grad = None
    batch = collate([units[i] for i in idx], pad_id)
    dev = params[0].device
    if dev.type != "cpu":
        batch = _to_device(batch, dev)
    loss = answer_loss(model, batch)
    (loss if weight is None else loss * weight).backward()
    at = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            if p.grad is None:
                slot[at:at + n].zero_()
            else:
                slot[at:at + n].copy_(p.grad.reshape(-1))
            at += n
    for p in params:
        p.grad = None
    return float(loss.detach())


def _micro_seed(seed: int, step: int, i: int) -> int:
    from pipeline.core.seeding import task_seed

    return task_seed(int(seed), "train-micro-batch", int(step), int(i)) % (2**63 - 1)


@dataclass
class _HelperSpec:
    """What a helper process needs, sent once (the parameters are the parent's shared tensors)."""

    model_cls: Any
    config: Any
    names: list[str]
    params: list[Any]
    buffers: dict[str, Any]
    units: Sequence[Unit]
    pad_id: int
    seed: int
    threads: int
    deterministic: bool
    slots: Any


def _helper_main(rank: int, conn: Any, spec: _HelperSpec, parent_pid: int | None = None, beat: Any = None) -> None:
    """A helper process of :func:`train`: a model whose parameters ARE the parent's shared
    tensors; per step it computes the micro-batches it is sent into their slots and replies.
    It exits on ``None``, on the parent's end of the pipe closing, or after reporting an error;
    and within seconds of ``parent_pid`` being killed (:func:`~pipeline.core.parallel.die_with_parent`,
    whose thread also writes ``time.monotonic()`` into ``beat``, a shared double: the parent's
    proof that this process runs)."""
    import signal
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    if parent_pid is not None:
        def tick() -> None:
            if beat is not None:
                beat.value = time.monotonic()

        die_with_parent(parent_pid, beat=tick)
    try:
        import torch  # deferred: heavy optional dependency (torch)

        torch.set_num_threads(int(spec.threads))
        if spec.deterministic:
            torch.use_deterministic_algorithms(True)
        model = spec.model_cls(spec.config)
        names = [n for n, _ in model.named_parameters()]
        if names != spec.names:
            raise RuntimeError("the helper's model has other parameters than the parent's")
        for p, shared in zip(model.parameters(), spec.params):
            p.data = shared
        for name, b in model.named_buffers():
            if name in spec.buffers:
                b.data = spec.buffers[name]
        model.train()
        params = list(model.parameters())
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the parent is gone
                return
            if msg is None:
                return
            step, work = msg
            losses = [(i, _micro_batch_grad(model, params, spec.units, idx, spec.pad_id, w, seed, spec.slots[i]))
                      for i, idx, w, seed in work]
            conn.send(("done", step, losses))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the stage
        try:
            conn.send(("error", rank, traceback.format_exc()))
        except Exception:  # noqa: BLE001
            pass


class _Helpers:
    """The helper processes of one training run (spawned once; stopped on exit, error or Ctrl-C).
    Supervised as a pool's workers are (:func:`pipeline.core.parallel.supervised`): a helper whose
    process does not run for ``agent.worker_stall_s`` (its start-up included) fails the step
    (:class:`WorkerStalled`)."""

    def __init__(self, model: Any, params: list[Any], units: Sequence[Unit], pad_id: int, seed: int, threads: int,
                 slots: Any, n: int) -> None:
        import torch  # deferred: heavy optional dependency (torch)
        import torch.multiprocessing as tmp

        for p in params:
            p.share_memory_()  # in place: the optimizer keeps its references
        names = [name for name, _ in model.named_parameters()]
        buffers = {name: b.detach().clone().share_memory_() for name, b in model.named_buffers()}
        spec = _HelperSpec(type(model), model.config, names, params, buffers, units, pad_id, seed, threads,
                           torch.are_deterministic_algorithms_enabled(), slots)
        ctx = tmp.get_context("spawn")
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.beats = [ctx.Value("d", time.monotonic(), lock=False) for _ in range(1, n)]
        try:
            for rank in range(1, n):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=_helper_main, args=(rank, theirs, spec, os.getpid(), self.beats[rank - 1]),
                                   daemon=True, name=f"policy-train-helper-{rank}")
                proc.start()
                theirs.close()
                self.procs.append(proc)
                self.conns.append(mine)
        except BaseException:
            self.stop()
            raise

    def send(self, step: int, work: list[list[tuple]]) -> None:
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send((step, work[rank]))
            except (BrokenPipeError, EOFError, OSError) as exc:
                raise self._died(rank, step) from exc

    def collect(self, step: int) -> list[tuple[int, float]]:
        """Wait until every helper has filled its slots for ``step`` (the barrier); their losses."""
        from multiprocessing.connection import wait

        pending = dict(enumerate(self.conns, start=1))
        out: list[tuple[int, float]] = []
        stall_s = supervision().stall_s
        poll = None if stall_s <= 0 else min(1.0, stall_s / 4)
        while pending:
            ready = wait([*pending.values(), *(self.procs[r - 1].sentinel for r in pending)], timeout=poll)
            if not ready:
                self._check_stall(pending, step, supervision().stall_s)
                continue
            for rank in list(pending):
                conn = pending[rank]
                if conn in ready or conn.poll():
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError) as exc:
                        raise self._died(rank, step) from exc
                    if msg[0] == "error":
                        raise RuntimeError(f"policy training: helper process {rank} "
                                           f"({self.procs[rank - 1].name}) failed at step {step}:\n{msg[2]}")
                    out += msg[2]
                    del pending[rank]
                elif self.procs[rank - 1].sentinel in ready:
                    raise self._died(rank, step)
        return out

    def _check_stall(self, pending: dict[int, Any], step: int, stall_s: float) -> None:
        now = time.monotonic()
        for rank in pending:
            age = now - self.beats[rank - 1].value
            if stall_s > 0 and age > stall_s:
                proc = self.procs[rank - 1]
                raise WorkerStalled(stall_message(f"policy training: helper process {rank} ({proc.name}, pid "
                                                  f"{proc.pid}) at step {step}", age, stall_s))

    def _died(self, rank: int, step: int) -> RuntimeError:
        proc = self.procs[rank - 1]
        proc.join(1.0)
        return RuntimeError(f"policy training: helper process {rank} ({proc.name}, pid {proc.pid}) died at step "
                            f"{step} (exit code {proc.exitcode})")

    def stop(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except Exception:  # noqa: BLE001 - already gone
                pass
        stop_processes(self.procs, grace_s=2.0, wait_s=5.0)  # they ignore SIGINT: 5 s for None, then SIGKILL
        for conn in self.conns:
            conn.close()


def train(model: Any, units: Sequence[Unit], policy_cfg: PolicyConfig, *, seed: int = 0, pad_id: int = 0,
          progress: Callable[[int, float], None] | None = None, processes: int = 1) -> list[dict]:
    """Train ``model`` in place for ``policy.epochs`` epochs; returns one record per step.

    Deterministic for the same units, config, seed and thread count: torch is seeded,
    the batch order comes from ``crc_rng(seed, ints=(0x501,))``.

    Data parallel (``policy.micro_batches`` > 1): a step's units are cut into that many
    contiguous micro-batches (:func:`micro_batch_split`), each loss weighted by its share of
    the step's answer tokens; micro-batch ``i`` is computed on ``policy.threads`` threads by
    process ``i mod processes`` (this one is process 0; the others are spawned once per run,
    their parameters this model's, in shared memory) into gradient slot ``i``; once every
    slot is filled the slots are summed in micro-batch order (slot 0 + slot 1 + ..., whatever
    ``processes``), then clipped and applied as before. So any ``processes`` gives the same
    bytes; it only changes the wall time. With ``micro_batches`` 1 the step is exactly the
    single-batch step (no weight, no slot, the caller's thread count).

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
    parts = int(getattr(policy_cfg, "micro_batches", 1))
    if parts > 1:
        return _train_micro_batches(model, units, policy_cfg, epochs, opt, seed=int(seed), pad_id=pad_id,
                                    progress=progress, processes=processes if dev.type == "cpu" else 1)
    curve, step = [], 0
    for epoch, epoch_batches in enumerate(epochs):
        for idx in epoch_batches:
            batch = collate([units[i] for i in idx], pad_id)
            if dev.type != "cpu":  # a study on an accelerator (pipeline.policy.scaling); the stage trains on the CPU
                batch = _to_device(batch, dev)
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


def _train_micro_batches(model: Any, units: Sequence[Unit], policy_cfg: PolicyConfig, epochs: list[list[list[int]]],
                         opt: Any, *, seed: int, pad_id: int, progress: Callable[[int, float], None] | None,
                         processes: int) -> list[dict]:
    """:func:`train`'s data-parallel loop (``micro_batches`` > 1; see there)."""
    import torch  # deferred: heavy optional dependency (torch)

    parts, threads = int(policy_cfg.micro_batches), int(policy_cfg.threads)
    n = max(1, min(int(processes), parts))
    total, lr = sum(len(e) for e in epochs), policy_cfg.lr
    params = list(model.parameters())
    size = sum(p.numel() for p in params)
    dev = params[0].device
    slots = torch.zeros((parts, size), dtype=params[0].dtype, device=dev)
    grad = torch.empty(size, dtype=params[0].dtype, device=dev)
    views, at = [], 0
    for p in params:
        views.append(grad[at:at + p.numel()].view_as(p))
        at += p.numel()
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # every micro-batch on policy.threads, wherever it runs
    helpers = None
    try:
        if n > 1:
            slots.share_memory_()
            helpers = _Helpers(model, params, units, pad_id, seed, threads, slots, n)
        curve, step = [], 0
        for epoch, epoch_batches in enumerate(epochs):
            for idx in epoch_batches:
                chunks = micro_batch_split(idx, parts)
                mass = [sum(_answer_mass(units[j]) for j in c) for c in chunks]  # a share of the loss each
                whole = sum(mass)
                weights = [None] if len(chunks) == 1 else [m / whole for m in mass]
                step_tokens = sum(_answer_tokens(units[j]) for j in idx)
                work: list[list[tuple]] = [[] for _ in range(n)]
                for i, c in enumerate(chunks):
                    work[i % n].append((i, c, weights[i], _micro_seed(seed, step, i)))
                if helpers is not None:
                    helpers.send(step, work)
                losses = {i: _micro_batch_grad(model, params, units, c, pad_id, w, s, slots[i])
                          for i, c, w, s in work[0]}
                if helpers is not None:
                    losses.update(helpers.collect(step))
                # The reduction: slot 0 + slot 1 + ... in micro-batch order, whatever n.
                grad.copy_(slots[0])
                for i in range(1, len(chunks)):
                    grad.add_(slots[i])
                for p, v in zip(params, views):
                    p.grad = v
                for group in opt.param_groups:
                    group["lr"] = lr_at(step, total, lr, policy_cfg.warmup_steps)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                for p in params:
                    p.grad = None
                value = losses[0] if weights[0] is None else sum(losses[i] * weights[i] for i in range(len(chunks)))
                curve.append({"step": step, "epoch": epoch, "loss": round(value, 6),
                              "lr": round(opt.param_groups[0]["lr"], 8), "tokens": int(step_tokens)})
                step += 1
                if progress is not None:
                    progress(1, value)
    finally:
        if helpers is not None:
            helpers.stop()
        torch.set_num_threads(caller_threads)
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

