"""The ``transformers`` backend: batched generation with a local causal LM.

Any causal LM directory (or hub id) that ``AutoModelForCausalLM`` loads. The batch is
left-padded and decoded in one loop with a KV cache; every row samples from its own
``torch.Generator`` seeded with its seed, so a prompt's output does not depend on what
else is in the batch (batched and sequential collection agree); a row leaves the batch
(its KV cache rows are dropped) when its JSON action closes (``sampling.early_stop``), at
EOS or at ``max_new_tokens``.

Prompts already encoded are kept across turns (``model.prompt_cache_mb``,
:mod:`pipeline.llm.kvcache`): a turn encodes only what its prompt does not share with one
seen before. Why this loop, and not transformers' continuous-batching engine
(``init_continuous_batching``: paged cache, prefix sharing) or plain ``model.generate``:
measured on the same greedy turns (``python -m benchmarks --only engines``, 2026-11-24,
2 cores, identical token ids in all three), this loop with its prompt cache ran 1.53x
naive per-turn ``generate`` on SmolLM2-135M and 1.86x on the default policy, the
continuous-batching engine 1.08x and 0.27x; and only this loop has the constrained and
choice decodings, per-row seeded sampling and the tracked JSON action.

torch and transformers are imported inside the functions that use them (heavy optional
dependencies): importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
from pathlib import Path
from typing import Any, Sequence

from pipeline.core.conf_schema import Dtype, ModelConfig, SamplingConfig
from pipeline.core.config import project_root
from pipeline.llm.backends.cache import ResponseCache, cache_root
from pipeline.llm.backends.base import BackendError, Generation, Messages, check_seeds, render_prompt
from pipeline.llm.backends.decoding import Row
from pipeline.llm.constrain import CLOSE, DECODINGS, TokenTexts, action_texts, choice_texts
from pipeline.llm.kvcache import PromptKVCache, growing_cache
from pipeline.llm.tracker import ActionStream, TrackedTurn

log = logging.getLogger(__name__)

GENERATION_CACHE_FORMAT = "pipeline.transformers_generation/1"  # part of every key: bump when results change
SCORE_ROWS = 64  # candidate rows per scoring forward (choice decoding): bounds the cache copies

# ``model.prompt_cache_mb=auto`` (the default): the prompt cache's budget per device type, by
# measurement (issue 34; ``python -m benchmarks --only engines --variants cache [--device cuda]``,
# docs/performance.md). cpu: on; cache on ran 1.01-1.58x the turns/s of cache off in 27 of 28
# rows (batch 1-56, C1/C2 prompts, free/constrained), the other 0.92x in a best-of-2 run and
# 1.05x in the best-of-4 rerun. cuda: off; on an H200 (2026-11-26, the rebuilt one-tensor-per-
# entry cache) cache on ran 0.66-0.94x of cache off in 6 of 9 rows at 8/64/256 conversations
# (1.01-1.23x in the other 3). Any other device: not measured, off. A number always wins.
AUTO_PROMPT_CACHE_MB = {"cpu": 1024.0}


def prompt_cache_budget(setting: Any, device: Any) -> float:
    """MiB of prompt cache for ``model.prompt_cache_mb`` (a number, or ``auto``) on ``device``.

    Raises:
        BackendError: neither ``auto`` nor a finite number >= 0.
    """
    if isinstance(setting, str) and setting.strip().lower() == "auto":
        return AUTO_PROMPT_CACHE_MB.get(str(getattr(device, "type", device)).split(":")[0], 0.0)
    try:
        mb = float(setting)
    except (TypeError, ValueError):
        mb = float("nan")
    if isinstance(setting, bool) or not mb >= 0 or mb == float("inf"):
        raise BackendError(f"model.prompt_cache_mb={setting!r}: expected auto or a number >= 0 (MiB of cached "
                           "prompt keys and values; 0 turns the prompt cache off)")
    return mb


@dataclasses.dataclass
class _Batch:
    """The device side of the decode loop: what shrinks when rows leave the batch."""

    cache: Any
    """The KV cache of the active rows (:meth:`TransformersBackend._batch_cache`)."""
    attn: Any
    """(B_active, T) attention mask."""
    last_pos: Any
    """(B_active,) position of each row's last token."""
    masks: Any
    """(B_active, V) bool: the tokens each row's reasoning line allows (None: every row free)."""
    active: list[int]
    """The original row of each batch row still generating (or parked)."""
    reason_flags: Any = None
    """(B_active,) bool on the device: the rows in their reasoning line, as last sent."""
    reason_sent: list[bool] | None = None
    """The host copy of ``reason_flags`` (None: send again)."""


class TransformersBackend:
    """Batched generation with a local causal LM, per-row tracking and early stop.

    Args:
        model_cfg: ``cfg.model`` (``name_or_path``, ``dtype``, ``device``, ``logprobs``).
        sampling_cfg: ``cfg.sampling``.
        model, tokenizer: already loaded objects (tests, or a stage that just trained
            them); when given, ``model_cfg.name_or_path`` is not read.
    """

    def __init__(self, model_cfg: ModelConfig, sampling_cfg: SamplingConfig, *, model: Any = None,
                 tokenizer: Any = None):
        import torch  # deferred: heavy optional dependency (torch)

        self.sampling = sampling_cfg
        self.want_logprobs = model_cfg.logprobs
        self.name = str(model_cfg.name_or_path or getattr(model, "name_or_path", "model"))
        device = model_cfg.device
        try:
            self.device = torch.device(device)
        except RuntimeError as exc:
            raise BackendError(f"model.device={device!r}: {exc}") from exc
        if model is None or tokenizer is None:
            model, tokenizer = self._load(model_cfg)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.eos_ids = self._eos_ids()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0  # masked out anyway
        cfg = self.model.config
        self.context = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        self._logits_to_keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._token_texts: TokenTexts | None = None
        self._plain: int | None = None  # layers, when plain (_plain_layers)
        self.prompt_cache: PromptKVCache | None = None
        cache_dir = getattr(model_cfg, "cache_dir", None)
        # Opt-in (model.cache_dir): a turn already generated with the same model, prompt,
        # sampling, seed and constraint is read back instead of generated again.
        self.generation_cache = ResponseCache(cache_root(cache_dir), base_url="transformers") if cache_dir else None
        self._model_sha256: str | None = None
        self.set_prompt_cache(prompt_cache_budget(model_cfg.prompt_cache_mb, self.device))

    def _load(self, model_cfg: ModelConfig) -> tuple[Any, Any]:
        import torch  # deferred: heavy optional dependency (torch)
        from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: heavy optional dependency

        name = model_cfg.name_or_path
        if not name:
            raise BackendError("model.name_or_path is null: set it to a local model directory "
                               "(e.g. `-S model=local -S model.name_or_path=path/to/model`)")
        dtype_name = str(model_cfg.dtype)  # torch's attribute name, or transformers' "auto"
        if dtype_name not in {m.value for m in Dtype}:  # an untyped model_cfg
            raise BackendError(f"model.dtype={dtype_name!r}: expected one of {', '.join(Dtype)}")
        dtype = dtype_name if dtype_name == Dtype.auto else getattr(torch, dtype_name)
        path = _model_path(name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BackendError(f"model.name_or_path={name!r}: cannot load a causal LM and tokenizer: {first}") from exc
        log.info("loaded model %s (%s, %s)", path, dtype_name, self.device)
        return model, tokenizer

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if src is None:
                continue
            ids.update(int(i) for i in (src if isinstance(src, (list, tuple)) else [src]))
        return ids

    def render(self, messages: Messages) -> tuple[str, list[int]]:
        """Prompt text and its token ids."""
        text, special = render_prompt(self.tokenizer, messages)
        return text, list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    constrains_actions = True
    """This backend takes ``admissible`` and ``decoding`` (``ActionConstrainedBackend``)."""
    decodings = DECODINGS

    def generate(self, batch: Sequence[Messages], seeds: Sequence[int] | None = None, *,
                 max_new_tokens: int | None = None, early_stop: bool | None = None,
                 admissible: Sequence[Sequence[dict] | None] | None = None,
                 decoding: str = "free", reasoning_max_tokens: int = 32) -> list[Generation]:
        """Generate one turn for every conversation in ``batch`` in one batched loop.

        Args:
            batch: conversations (lists of chat messages).
            seeds: one sampling seed per conversation (default ``sampling.seed``).
            max_new_tokens, early_stop: override ``sampling.*`` (benchmarks).
            admissible: per conversation, the admissible action dicts (or None: free).
            decoding: ``free`` | ``constrained`` | ``choice`` (``pipeline.llm.constrain``);
                ignored for a conversation whose ``admissible`` is None or empty.
            reasoning_max_tokens: the reasoning line's bound under ``constrained``/``choice``.
        """
        if decoding not in DECODINGS:
            raise BackendError(f"agent.decoding={decoding!r}: expected one of {', '.join(DECODINGS)}")
        if admissible is not None and len(admissible) != len(batch):
            raise ValueError(f"generate: {len(batch)} conversations but {len(admissible)} admissible lists")
        s = self.sampling
        seeds = check_seeds(batch, seeds, s.seed)
        max_new = int(max_new_tokens if max_new_tokens is not None else s.max_new_tokens)
        stop_early = bool(s.early_stop if early_stop is None else early_stop)
        prompts = [self.render(m) for m in batch]
        acts_of = [admissible[i] if admissible is not None else None for i in range(len(batch))]
        out, keys = self._cached(prompts, seeds, acts_of, decoding, max_new, stop_early, int(reasoning_max_tokens))
        rows = []
        for i, (text, ids) in enumerate(prompts):
            if out[i] is not None:  # from the generation cache
                continue
            cap = max_new if self.context is None else min(max_new, self.context - len(ids))
            if cap < 1:
                out[i] = Generation.failed(text, f"prompt has {len(ids)} tokens; the model's context is "
                                                 f"{self.context}", len(ids))
            else:
                rows.append((i, cap))
        if rows:
            self._generate_rows(rows, prompts, seeds, acts_of, decoding, stop_early, int(reasoning_max_tokens),
                                out, keys)
        return out  # type: ignore[return-value]

    def _cached(self, prompts: list[tuple[str, list[int]]], seeds: list[int], acts_of: list, decoding: str,
                max_new: int, stop_early: bool, reasoning_max: int) -> tuple[list[Generation | None], list]:
        """Per conversation, its turn read back from the generation cache (or None) and its
        ``(key, body)`` there (None: no cache)."""
        out: list[Generation | None] = [None] * len(prompts)
        keys: list = [None] * len(prompts)
        if self.generation_cache is not None:
            for i, (text, _) in enumerate(prompts):
                body = self._cache_body(text, seeds[i], acts_of[i], decoding, max_new, stop_early, reasoning_max)
                keys[i] = (self.generation_cache.key(body), body)
                hit = self.generation_cache.get(keys[i][0])
                if hit is not None:
                    out[i] = Generation(**hit)
        return out, keys

    def _generate_rows(self, rows: list[tuple[int, int]], prompts: list[tuple[str, list[int]]], seeds: list[int],
                       acts_of: list, decoding: str, stop_early: bool, reasoning_max: int,
                       out: list[Generation | None], keys: list) -> None:
        """Decode the conversations ``rows`` (``(index, cap)``) in one loop; fill ``out`` (and
        the generation cache) with their turns."""
        modes = []
        for i, _ in rows:
            acts = acts_of[i]
            modes.append((decoding, list(acts)) if decoding != "free" and acts and action_texts(acts)
                         else ("free", None))
        try:
            turns = self._decode_loop([prompts[i][1] for i, _ in rows], [seeds[i] for i, _ in rows],
                                      [cap for _, cap in rows], stop_early, modes, reasoning_max,
                                      [None if self.context is None else self.context - len(prompts[i][1])
                                       for i, _ in rows])
        except (RuntimeError, ValueError, IndexError) as exc:  # a failed forward pass fails the chunk
            turns = [exc] * len(rows)
        for (i, _), (mode, _), turn in zip(rows, modes, turns):
            text, ids = prompts[i]
            if isinstance(turn, Exception):
                out[i] = Generation.failed(text, f"generation failed: {type(turn).__name__}: {turn}", len(ids))
                continue
            tracked, chosen, scores = turn
            gen = Generation.from_turn(text, len(ids), tracked)
            gen.chosen_index, gen.action_scores, gen.decoding = chosen, scores, mode
            out[i] = gen
            if keys[i] is not None:
                self.generation_cache.put(keys[i][0], keys[i][1], dataclasses.asdict(gen))

    # -- generation cache (model.cache_dir) ------------------------------------------------

    def _cache_body(self, prompt: str, seed: int, admissible: Sequence[dict] | None, decoding: str, max_new: int,
                    early_stop: bool, reasoning_max: int) -> dict:
        """Everything a turn's result depends on: the model's and tokenizer's content
        hashes, the prompt text, every sampling parameter, the seed, the decoding, the
        admissible actions and the caps."""
        s = self.sampling
        return {"format": GENERATION_CACHE_FORMAT, "model_sha256": self.model_sha256(), "prompt": prompt,
                "sampling": {"do_sample": s.do_sample, "temperature": s.temperature, "top_p": s.top_p,
                             "top_k": s.top_k},
                "seed": int(seed), "max_new_tokens": max_new, "early_stop": early_stop,
                "decoding": decoding if admissible else "free", "admissible": list(admissible or []),
                "reasoning_max_tokens": reasoning_max if admissible and decoding != "free" else None,
                "logprobs": self.want_logprobs, "dtype": str(next(self.model.parameters()).dtype)}

    def model_sha256(self) -> str:
        """sha256 of the model's config, every parameter and buffer (names, shapes, bytes)
        and the tokenizer (computed once)."""
        if self._model_sha256 is None:
            import torch  # deferred: heavy optional dependency (torch)

            h = hashlib.sha256(self.model.config.to_json_string(use_diff=False).encode("utf-8"))
            for name, t in sorted({**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}.items()):
                t = t.detach().to("cpu").contiguous()
                h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode("utf-8"))
                h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            backend_tok = getattr(self.tokenizer, "backend_tokenizer", None)
            tok = backend_tok.to_str() if backend_tok is not None else repr(sorted(self.tokenizer.get_vocab().items()))
            h.update(tok.encode("utf-8"))
            h.update(str(getattr(self.tokenizer, "chat_template", "")).encode("utf-8"))
            self._model_sha256 = h.hexdigest()
        return self._model_sha256

    def token_texts(self) -> TokenTexts:
        """The tokenizer's :class:`TokenTexts` (built once, on first constrained use)."""
        if self._token_texts is None:
            vocab = int(getattr(self.model.config, "vocab_size", 0) or len(self.tokenizer))
            self._token_texts = TokenTexts(self.tokenizer, max(vocab, len(self.tokenizer)))
        return self._token_texts

    def _left_pad(self, prompt_ids: list[list[int]]) -> tuple[Any, Any, Any]:
        """``(input_ids, attention_mask, position_ids)`` of the left-padded batch, on the device.

        Left padding: every row's last prompt token sits in the last column, so one new
        column per step serves the whole batch. Positions count real tokens only.
        """
        import torch  # deferred: heavy optional dependency (torch)

        B, L = len(prompt_ids), max(len(p) for p in prompt_ids)
        input_ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for r, ids in enumerate(prompt_ids):
            input_ids[r, L - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attn[r, L - len(ids):] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        return input_ids, attn, positions

    # -- prompt caching across turns (pipeline.llm.kvcache) ------------------------------

    def set_prompt_cache(self, max_mb: float) -> None:
        """Keep encoded prompts' keys and values (at most ``max_mb`` MiB) so a later turn
        encodes only what its prompt does not share with one seen before; ``0`` turns it
        off. Models whose cache is not plain per-layer keys and values (sliding-window or
        hybrid layers) are never cached."""
        plain = self._plain_layers()
        if max_mb > 0 and not plain:
            log.info("prompt cache off: %s has sliding-window or hybrid cache layers", self.name)
        self.prompt_cache = PromptKVCache(int(max_mb * (1 << 20))) if max_mb > 0 and plain else None

    def _plain_layers(self) -> int:
        """The model's layer count when its cache is plain per-layer keys and values (no
        sliding-window or hybrid layers), else 0."""
        if self._plain is None:
            from transformers import DynamicCache  # deferred: heavy optional dependency
            from transformers.cache_utils import DynamicLayer  # deferred: heavy optional dependency

            layers = DynamicCache(config=self.model.config).layers
            self._plain = len(layers) if all(type(layer) is DynamicLayer for layer in layers) else 0
        return self._plain

    def _batch_cache(self, data: list | None = None) -> Any:
        """A new batch KV cache, optionally filled with per-layer ``(keys, values)``: one that
        grows in place (:func:`pipeline.llm.kvcache.growing_cache`) for a plain model on the CPU,
        where it was measured (6-9% of an evaluation's time, the same bytes), else transformers'
        ``DynamicCache`` (a GPU picks its attention kernel by the inputs' layout, and no GPU run
        checked that a view gets the kernel a contiguous copy gets)."""
        from transformers import DynamicCache  # deferred: heavy optional dependency

        if self._plain_layers() and self.device.type == "cpu":
            return growing_cache(self._plain_layers(), data)
        return DynamicCache(ddp_cache_data=data) if data is not None else DynamicCache(config=self.model.config)

    def clear_prompt_cache(self) -> None:
        """Drop every cached prompt, keeping the counts (:class:`~pipeline.llm.backends.base.CachesPrompts`)."""
        if self.prompt_cache is not None:
            self.prompt_cache.clear()

    def prompt_cache_stats(self) -> dict[str, int]:
        """Prompt tokens reused from the cache and encoded by the model since the cache was
        set (zeros when it is off); entries and bytes held."""
        return (self.prompt_cache or PromptKVCache(0)).stats()

    def _prefill_inputs(self, prompt_ids: list[list[int]]) -> tuple[Any, Any, Any, Any, list | None]:
        """``(input_ids, attention_mask, position_ids, cache, hits)`` of the first forward.

        Without a prompt cache: the left-padded prompts and an empty cache. With one: each
        prompt's longest cached prefix (``hits``: per row ``(entry, n)``) goes into the
        cache, right-aligned over the widest one (padding on its left, masked), and only
        the rest of each prompt is fed, left-padded after it. Positions count real tokens,
        so a row sees exactly the sequence it would see uncached.

        The batch cache of every layer is one zeroed ``(layers, 2, B, heads, width,
        head_dim)`` tensor filled with one copy per row that hits (the entry holds all its
        layers in one tensor); masks and positions are built on the host and moved once.
        """
        import torch  # deferred: heavy optional dependency (torch)

        pc = self.prompt_cache
        if pc is None:
            return (*self._left_pad(prompt_ids), self._batch_cache(), None)
        hits = [pc.lookup(p) for p in prompt_ids]
        width = max(n for _, n in hits)
        if width == 0:
            return (*self._left_pad(prompt_ids), self._batch_cache(), hits)
        dev = self.device
        input_ids, s_attn, _ = self._left_pad([p[n:] for p, (_, n) in zip(prompt_ids, hits)])
        B = len(prompt_ids)
        shared = torch.tensor([n for _, n in hits], dtype=torch.long)
        c_attn = (torch.arange(width)[None, :] >= (width - shared)[:, None]).to(dev, s_attn.dtype)
        kv0 = next(e for e, n in hits if n).kv  # (layers, 2, heads, tokens, head_dim)
        L, _, H, _, D = kv0.shape
        kv = torch.zeros((L, 2, B, H, width, D), dtype=kv0.dtype, device=dev)
        for b, (entry, n) in enumerate(hits):
            if n:
                kv[:, :, b, :, width - n:] = entry.kv[:, :, :, :n]
        positions = (shared.to(dev)[:, None] + s_attn.cumsum(-1) - 1).clamp(min=0)
        cache = self._batch_cache([(kv[layer, 0], kv[layer, 1]) for layer in range(L)])
        return input_ids, torch.cat([c_attn, s_attn], dim=1), positions, cache, hits

    def _remember_prompts(self, prompt_ids: list[list[int]], hits: list, cache: Any) -> None:
        """After the first forward: give the prompt cache each prompt (its keys and values,
        copied out of the batch cache, where it keeps the prompt whole).

        Row ``b``'s tokens sit in two known column ranges of the batch cache (its cached
        prefix right-aligned before column ``width``, the rest at the right end): no mask
        is read back from the device, and each stored prompt is one stacked copy per range.
        """
        import torch  # deferred: heavy optional dependency (torch)

        pc = self.prompt_cache
        width = max(n for _, n in hits)
        layers = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        L, total = len(cache.layers), layers[0].shape[-2]
        for b, ids in enumerate(prompt_ids):
            entry, n = hits[b]
            kv = None
            if pc.wants(entry, n):
                rest = len(ids) - n  # the tokens this turn encoded, at the right end
                parts = [torch.stack([t[b, :, total - rest:] for t in layers])]
                if n:
                    parts.insert(0, torch.stack([t[b, :, width - n:width] for t in layers]))
                kv = torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]
                kv = kv.view(L, 2, *kv.shape[1:])
            pc.remember(ids, kv, hit=entry, shared=n)

    def _decode_loop(self, prompt_ids: list[list[int]], seeds: list[int], caps: list[int], early_stop: bool,
                     modes: list[tuple[str, list | None]] | None = None, reasoning_max: int = 32,
                     hard_caps: list[int | None] | None = None) -> list[tuple[TrackedTurn, int | None, list[float] | None]]:
        """The batched decode loop; per row ``(turn, chosen admissible index, choice scores)``.

        Each row decodes under its strategy (:mod:`pipeline.llm.backends.decoding`): rows
        under ``constrained``/``choice`` first write their reasoning line (no ``{``, no
        EOS, ends at a newline or ``reasoning_max`` tokens); ``constrained`` rows then
        decode under their :class:`~pipeline.llm.constrain.ActionConstraint`'s mask; ``choice`` rows are parked
        before the token that would end the line and scored after the loop
        (:meth:`_score_choices`).
        """
        import torch  # deferred: heavy optional dependency (torch)

        B = len(prompt_ids)
        dev = self.device
        input_ids, attn, positions, cache, hits = self._prefill_inputs(prompt_ids)
        generators = [torch.Generator(device=dev).manual_seed(int(seed)) for seed in seeds]
        warpers = self._warpers() if self.sampling.do_sample else None  # None: greedy
        rows = [Row(mode, acts, ActionStream(self.tokenizer)) for mode, acts in modes or [("free", None)] * B]
        texts = self.token_texts() if any(row.mode != "free" for row in rows) else None
        batch = _Batch(cache, attn, None, self._line_masks(rows, texts), list(range(B)))
        kwargs = {"logits_to_keep": 1} if self._logits_to_keep else {}
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=positions,
                             past_key_values=cache, use_cache=True, **kwargs)
            if hits is not None:
                self._remember_prompts(prompt_ids, hits, cache)
            batch.last_pos = positions[:, -1]
            step = 0
            while True:
                step += 1
                raw = out.logits[:, -1, :].float()  # (B_active, V)
                next_ids, ids_list, chosen_lp = self._next_tokens(raw, batch, rows, texts, warpers, generators)
                keep = self._step_rows(raw, batch.active, rows, texts, ids_list, chosen_lp, step, caps, early_stop,
                                       reasoning_max, hard_caps)
                if not keep or all(rows[batch.active[b]].phase == "park" for b in keep):
                    break
                next_ids = self._next_inputs(batch, rows, keep, next_ids)
                out = self.model(input_ids=next_ids[:, None], attention_mask=batch.attn,
                                 position_ids=batch.last_pos[:, None], past_key_values=batch.cache, use_cache=True,
                                 **kwargs)
            parked = [(b, r) for b, r in enumerate(batch.active) if rows[r].phase == "park"]
            scored = self._score_choices(batch.cache, batch.attn, batch.last_pos, parked, rows) if parked else {}
        results: list[tuple[TrackedTurn, int | None, list[float] | None]] = []
        for r, row in enumerate(rows):
            if r in scored:
                chosen, scores, reason = scored[r]
                results.append((row.stream.finish(reason), chosen, scores))
            else:
                c = row.constraint
                results.append((row.stream.finish(row.reason or "max_new_tokens"), c.chosen if c else None, None))
        return results

    def _line_masks(self, rows: list[Row], texts: TokenTexts | None) -> Any:
        """Per row, the tokens allowed in its reasoning line (free rows: all), built on the
        host and moved once: (B, V) bool; None when every row is free. Sets each row's
        first phase (its strategy's ``start``)."""
        import torch  # deferred: heavy optional dependency (torch)

        if texts is None:
            return None
        inside, enders = texts.line_tokens()
        base = torch.tensor(inside, dtype=torch.bool)
        masks = []
        for row in rows:
            ok = row.strategy.start(row, texts, enders)
            if ok is None:
                masks.append(torch.ones_like(base))
                continue
            mask = base.clone()
            if ok:
                mask[torch.tensor(ok)] = True
            masks.append(mask)
        return torch.stack(masks).to(self.device)

    def _next_tokens(self, raw: Any, batch: _Batch, rows: list[Row], texts: TokenTexts | None,
                     warpers: list | None, generators: list) -> tuple[Any, list[int], list[float] | None]:
        """Mask each active row's logits by its phase and choose its next token.

        What the loop reads back from the device: one transfer a step (the chosen ids, with
        their log-probs), plus the argmax when a greedy row is inside its JSON action. The
        masks of the active rows stay on the device and change only when a row leaves the
        batch or a row's phase changes.

        Returns:
            ``(next_ids on the device, the same as a list, their log-probs or None)``.
        """
        import torch  # deferred: heavy optional dependency (torch)

        V = raw.shape[1]
        logits = raw.clone()
        reason_now = [rows[r].phase == "reason" for r in batch.active]
        if any(reason_now):
            if reason_now != batch.reason_sent:
                batch.reason_flags, batch.reason_sent = torch.tensor(reason_now, device=self.device), reason_now
            logits.masked_fill_(batch.reason_flags[:, None] & ~batch.masks[:, :V], float("-inf"))
        json_rows = [b for b, r in enumerate(batch.active) if rows[r].phase == "json"]
        if json_rows:
            self._mask_json(logits, json_rows, batch.active, rows, texts, warpers)
        next_ids = self._choose(logits, warpers, [generators[r] for r in batch.active])
        if not self.want_logprobs:
            return next_ids, next_ids.tolist(), None
        # ids and log-probs come back in one transfer (float64: both exact)
        lp = torch.log_softmax(raw, -1).gather(1, next_ids[:, None])[:, 0]
        back = torch.stack([next_ids.to(torch.float64), lp.to(torch.float64)]).tolist()
        return next_ids, [int(i) for i in back[0]], back[1]

    def _mask_json(self, logits: Any, json_rows: list[int], active: list[int], rows: list[Row], texts: Any,
                   warpers: list | None) -> None:
        """Mask, in place, the logits of the rows inside their JSON action to what their
        constraint allows. Greedy: the model's own choice, when the constraint accepts it,
        is the masked argmax; no mask needed for that row."""
        import torch  # deferred: heavy optional dependency (torch)

        tops = logits.argmax(-1).tolist() if warpers is None else None
        need: list[tuple[int, list[int]]] = []
        for b in json_rows:
            row = rows[active[b]]
            allowed = row.strategy.allowed(row, texts.texts[tops[b]] if tops is not None else None)
            if allowed is not None:
                need.append((b, allowed))
        if need:
            dev = self.device
            keep_ok = torch.ones_like(logits, dtype=torch.bool)
            keep_ok[torch.tensor([b for b, _ in need], device=dev)] = False
            where = torch.tensor([[b, i] for b, allowed in need for i in allowed], device=dev)
            keep_ok[where[:, 0], where[:, 1]] = True
            logits.masked_fill_(~keep_ok, float("-inf"))

    def _step_rows(self, raw: Any, active: list[int], rows: list[Row], texts: TokenTexts | None,
                   ids_list: list[int], chosen_lp: list[float] | None, step: int, caps: list[int],
                   early_stop: bool, reasoning_max: int, hard_caps: list[int | None] | None) -> list[int]:
        """Give every active row its token: park it (choice), push it, move its strategy on.

        Returns:
            The batch positions of the rows still generating (or parked).
        """
        import torch  # deferred: heavy optional dependency (torch)

        # A choice row whose line ends here (a newline chosen, or the bound reached) is parked
        # before that token: every candidate is scored from this position.
        for b, r in enumerate(active):
            row = rows[r]
            if row.phase == "reason" and row.strategy.parks(row, texts.texts[ids_list[b]], reasoning_max):  # type: ignore[union-attr]
                row.first_lp = torch.log_softmax(raw[b], -1)
        parked = [rows[r].phase == "park" for r in active]
        # A JSON action under its constraint is finished whatever max_new_tokens says (it is at
        # most the longest admissible text), unless the context ends.
        held = [rows[r].phase in ("park", "json") for r in active]
        keep = self._push_tokens(rows, active, ids_list, chosen_lp, step, caps, early_stop,
                                 parked=parked, held=held, hard_caps=hard_caps)
        for b, r in enumerate(active):
            row = rows[r]
            if row.phase in ("reason", "json") and row.reason is None:
                row.strategy.advance(row, texts.texts[ids_list[b]], texts, reasoning_max)  # type: ignore[union-attr]
        return keep

    def _next_inputs(self, batch: _Batch, rows: list[Row], keep: list[int], next_ids: Any) -> Any:
        """Drop finished rows from the batch and its cache; the next column of ids (a parked
        row's new column is padding its attention ignores; its position stays)."""
        import torch  # deferred: heavy optional dependency (torch)

        if len(keep) < len(batch.active):  # finished rows leave the batch and the cache
            idx = torch.tensor(keep, device=self.device)
            batch.cache.batch_select_indices(idx)
            batch.attn, batch.last_pos, next_ids = batch.attn[idx], batch.last_pos[idx], next_ids[idx]
            if batch.masks is not None:
                batch.masks = batch.masks[idx]
            batch.active = [batch.active[b] for b in keep]
            batch.reason_sent = None
        attn = batch.attn
        if any(rows[r].phase == "park" for r in batch.active):
            live = torch.tensor([0 if rows[r].phase == "park" else 1 for r in batch.active], device=self.device,
                                dtype=attn.dtype)
            next_ids = torch.where(live.bool(), next_ids, torch.full_like(next_ids, self.pad_id))
            batch.attn = torch.cat([attn, live[:, None]], dim=1)
            batch.last_pos = batch.last_pos + live
        else:  # every row live: nothing to send to the device
            batch.attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
            batch.last_pos = batch.last_pos + 1
        return next_ids

    def _score_choices(self, cache: Any, attn: Any, last_pos: Any, parked: list[tuple[int, int]],
                       rows: list[Row]) -> dict:
        """Score every parked row's admissible actions; push the best one's tokens to its stream.

        For each row, each action's texts (:func:`choice_texts`) are tokenized and run in
        batched forwards over a copy of the row's cache (prompt + reasoning), at most
        ``SCORE_ROWS`` candidate rows per forward. An action's score is its best text's
        summed token log-probability.

        Returns:
            ``{row: (chosen index, per-action scores, stop reason)}``.
        """
        jobs = []  # (row, batch position, admissible index, token ids, closed form?)
        for b, r in parked:
            for text, i in choice_texts(rows[r].acts, rows[r].lead):  # type: ignore[arg-type]
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                jobs.append((r, b, i, ids, text.endswith(CLOSE)))
        totals: dict[int, dict[int, float]] = {r: {} for _, r in parked}
        best_ids: dict[tuple[int, int], tuple[float, list[int], list[float]]] = {}
        for k in range(0, len(jobs), SCORE_ROWS):
            chunk = jobs[k:k + SCORE_ROWS]
            for (r, _, i, ids, closes), toks in zip(chunk, self._candidate_logprobs(cache, attn, last_pos, chunk,
                                                                                   rows)):
                total = sum(toks)
                if total > totals[r].get(i, float("-inf")):
                    totals[r][i] = total
                if closes:  # the closed form is what the turn records as its JSON action
                    best_ids[(r, i)] = (total, ids, toks)
        result = {}
        for _, r in parked:
            stream = rows[r].stream
            scores = [round(totals[r].get(i, float("-inf")), 6) for i in range(len(rows[r].acts))]  # type: ignore[arg-type]
            chosen = max(totals[r], key=lambda i: (totals[r][i], -i))
            _, ids, toks = best_ids[(r, chosen)]
            for t, lp in zip(ids, toks):
                stream.push(t, logprob=lp if self.want_logprobs else None)
            result[r] = (chosen, scores, "json_closed" if stream.closed else "max_new_tokens")
        return result

    def _candidate_logprobs(self, cache: Any, attn: Any, last_pos: Any, chunk: list, rows: list[Row]) -> list:
        """One batched forward of a chunk of candidates ``(row, batch position, index, ids,
        closes)`` over copies of their rows' caches; per candidate, its tokens' log-probs."""
        import torch  # deferred: heavy optional dependency (torch)
        from transformers import DynamicCache  # deferred: heavy optional dependency

        dev = self.device
        kwargs = {"logits_to_keep": 0} if self._logits_to_keep else {}
        sel = torch.tensor([job[1] for job in chunk], device=dev)
        sub = DynamicCache(ddp_cache_data=[(layer.keys[sel], layer.values[sel]) for layer in cache.layers])
        L = max(len(job[3]) for job in chunk)
        inp = torch.full((len(chunk), L), self.pad_id, dtype=torch.long)  # built on the host, moved once
        for j, (_, _, _, ids, _) in enumerate(chunk):
            inp[j, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        inp = inp.to(dev)
        a = torch.cat([attn[sel], torch.ones((len(chunk), L), dtype=attn.dtype, device=dev)], dim=1)
        pos = last_pos[sel][:, None] + 1 + torch.arange(L, device=dev)[None, :]
        out = self.model(input_ids=inp, attention_mask=a, position_ids=pos, past_key_values=sub,
                         use_cache=True, **kwargs)
        lps = torch.log_softmax(out.logits.float(), -1)
        # Each candidate token's log-prob, read back in one transfer: the first from the row's
        # log-probs after its reasoning, token t from the forward's position t - 1.
        firsts = torch.stack([rows[r].first_lp[ids[0]] for r, _, _, ids, _ in chunk]).tolist()
        nexts = lps[:, :-1].gather(2, inp[:, 1:, None])[..., 0].tolist() if L > 1 else [[] for _ in chunk]
        return [[firsts[j]] + nexts[j][:len(ids) - 1] for j, (_, _, _, ids, _) in enumerate(chunk)]

    def _push_tokens(self, rows: list[Row], active: list[int], next_ids: list[int], chosen_lp: list[float] | None,
                     step: int, caps: list[int], early_stop: bool, parked: list[bool] | None = None,
                     held: list[bool] | None = None, hard_caps: list[int | None] | None = None) -> list[int]:
        """Feed each active row its new token; set the stop reason of rows that finish.

        Rows marked ``parked`` (choice decoding, waiting to be scored) get no token and stay;
        rows marked ``held`` (a JSON action under its constraint) pass ``caps`` and stop only
        at ``hard_caps`` (the model's context).

        Returns:
            The batch positions (indices into ``active``) of the rows still generating.
        """
        keep = []
        for b, (r, tid) in enumerate(zip(active, next_ids)):
            if parked and parked[b]:
                keep.append(b)
                continue
            row = rows[r]
            closed = row.stream.push(tid, logprob=chosen_lp[b] if chosen_lp else None)
            if tid in self.eos_ids:
                row.reason = "json_closed" if closed and early_stop else "eos"
            elif closed and early_stop:
                row.reason = "json_closed"
            elif step >= caps[r] and not (held and held[b] and not (hard_caps and hard_caps[r] is not None
                                                                    and step >= hard_caps[r])):
                row.reason = "max_new_tokens"
            else:
                keep.append(b)
        return keep

    def _warpers(self) -> list:
        # deferred: heavy optional dependency (transformers)
        from transformers.generation import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        s = self.sampling
        warpers: list = []
        if s.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(s.temperature))
        if s.top_k > 0:
            warpers.append(TopKLogitsWarper(s.top_k))
        if s.top_p < 1.0:
            warpers.append(TopPLogitsWarper(s.top_p))
        return warpers

    @staticmethod
    def _choose(logits: Any, warpers: list | None, generators: list) -> Any:
        """Next token per row: argmax when greedy (``warpers`` None), else a draw from the row's generator."""
        import torch  # deferred: heavy optional dependency (torch)

        if warpers is None:
            return logits.argmax(-1)
        scores = logits
        for w in warpers:
            scores = w(None, scores)
        probs = torch.softmax(scores, dim=-1)
        return torch.cat([torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(generators)])


def _model_path(name: str) -> Path:
    """Where ``model.name_or_path`` points: a relative path is tried under the project root first.

    Raises:
        BackendError: ``name`` looks like a path (not a hub id) and no such directory exists.
    """
    path = Path(name)
    if not path.is_absolute():
        rooted = project_root() / path
        path = rooted if rooted.exists() else path
    if not path.exists() and (str(name).startswith((".", "/")) or len(Path(name).parts) > 2):
        raise BackendError(f"model.name_or_path={name!r}: no such model directory")
    return path
