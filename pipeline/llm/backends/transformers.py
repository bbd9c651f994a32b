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
from pipeline.llm.constrain import CLOSE, DECODINGS, ActionConstraint, TokenTexts, action_texts, choice_texts
from pipeline.llm.kvcache import PromptKVCache
from pipeline.llm.tracker import ActionStream, TrackedTurn

log = logging.getLogger(__name__)

GENERATION_CACHE_FORMAT = "pipeline.transformers_generation/1"  # part of every key: bump when results change
SCORE_ROWS = 64  # candidate rows per scoring forward (choice decoding): bounds the cache copies

# ``model.prompt_cache_mb=auto`` (the default): the prompt cache's budget per device type, by
# measurement (issue 34; ``python -m benchmarks --only engines --variants cache [--device cuda]``,
# README, Performance). cpu: on; cache on ran 1.01-1.58x the turns/s of cache off in 27 of 28
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
        out: list[Generation | None] = [None] * len(batch)
        keys = [None] * len(batch)
        if self.generation_cache is not None:
            for i, (text, _) in enumerate(prompts):
                acts = admissible[i] if admissible is not None else None
                body = self._cache_body(text, seeds[i], acts, decoding, max_new, stop_early, int(reasoning_max_tokens))
                keys[i] = (self.generation_cache.key(body), body)
                hit = self.generation_cache.get(keys[i][0])
                if hit is not None:
                    out[i] = Generation(**hit)
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
            modes = []
            for i, _ in rows:
                acts = admissible[i] if admissible is not None else None
                modes.append((decoding, list(acts)) if decoding != "free" and acts and action_texts(acts)
                             else ("free", None))
            try:
                turns = self._decode_loop([prompts[i][1] for i, _ in rows], [seeds[i] for i, _ in rows],
                                          [cap for _, cap in rows], stop_early, modes, int(reasoning_max_tokens),
                                          [None if self.context is None else self.context - len(prompts[i][1])
                                           for i, _ in rows])
            except (RuntimeError, ValueError, IndexError) as exc:  # a failed forward pass fails the chunk
                turns = [exc] * len(rows)
            mode_of = {i: m for (i, _), (m, _) in zip(rows, modes)}
            for (i, _), turn in zip(rows, turns):
                text, ids = prompts[i]
                if isinstance(turn, Exception):
                    out[i] = Generation.failed(text, f"generation failed: {type(turn).__name__}: {turn}", len(ids))
                else:
                    tracked, chosen, scores = turn
                    gen = Generation.from_turn(text, len(ids), tracked)
                    gen.chosen_index, gen.action_scores, gen.decoding = chosen, scores, mode_of[i]
                    out[i] = gen
                    if keys[i] is not None:
                        self.generation_cache.put(keys[i][0], keys[i][1], dataclasses.asdict(gen))
        return out  # type: ignore[return-value]

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
        from transformers import DynamicCache  # deferred: heavy optional dependency
        from transformers.cache_utils import DynamicLayer  # deferred: heavy optional dependency

        plain = all(type(layer) is DynamicLayer for layer in DynamicCache(config=self.model.config).layers)
        if max_mb > 0 and not plain:
            log.info("prompt cache off: %s has sliding-window or hybrid cache layers", self.name)
        self.prompt_cache = PromptKVCache(int(max_mb * (1 << 20))) if max_mb > 0 and plain else None

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
        from transformers import DynamicCache  # deferred: heavy optional dependency

        pc = self.prompt_cache
        if pc is None:
            return (*self._left_pad(prompt_ids), DynamicCache(config=self.model.config), None)
        hits = [pc.lookup(p) for p in prompt_ids]
        width = max(n for _, n in hits)
        if width == 0:
            return (*self._left_pad(prompt_ids), DynamicCache(config=self.model.config), hits)
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
        cache = DynamicCache(ddp_cache_data=[(kv[layer, 0], kv[layer, 1]) for layer in range(L)])
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

        Rows under ``constrained``/``choice`` first write their reasoning line (no ``{``, no
        EOS, ends at a newline or ``reasoning_max`` tokens). ``constrained`` rows then
        decode under their :class:`ActionConstraint`'s mask (the token that ends the line
        may already start the JSON, if the constraint accepts it); ``choice`` rows are
        parked before the token that would end the line (fed padding that attention
        ignores, so their cache keeps prompt + reasoning) and scored after the loop
        (:meth:`_score_choices`), every candidate starting with that line end.
        """
        import torch  # deferred: heavy optional dependency (torch)

        s = self.sampling
        B = len(prompt_ids)
        modes = modes or [("free", None)] * B
        dev = self.device
        input_ids, attn, positions, cache, hits = self._prefill_inputs(prompt_ids)
        generators = [torch.Generator(device=dev).manual_seed(int(seed)) for seed in seeds]
        warpers = self._warpers() if s.do_sample else None  # None: greedy
        streams = [ActionStream(self.tokenizer) for _ in range(B)]
        reasons: list[str | None] = [None] * B
        # Per row: "free" | "reason" | "json" (under its constraint) | "park" (choice: wait for scoring)
        phase = ["free" if m == "free" else "reason" for m, _ in modes]
        constraints: list[ActionConstraint | None] = [None] * B
        reason_tokens = [0] * B
        leads: dict[int, str] = {}  # choice rows: the reasoning line's end the candidates start with
        first_lp: dict[int, Any] = {}  # choice rows: log-probs of the first token after the reasoning
        texts = self.token_texts() if any(p != "free" for p in phase) else None
        # Per original row, the tokens allowed in its reasoning line (free rows: all), built on
        # the host and moved once: (B, V) bool.
        line_masks = None
        if texts is not None:
            inside, enders = texts.line_tokens()
            base = torch.tensor(inside, dtype=torch.bool)
            rows = []
            for r, (mode, acts) in enumerate(modes):
                if mode == "free":
                    rows.append(torch.ones_like(base))
                    continue
                mask = base.clone()
                if mode == "constrained":
                    constraints[r] = ActionConstraint(texts, acts)  # type: ignore[arg-type]
                    ok = [i for i, after in enders if constraints[r].accepts(after)]  # type: ignore[union-attr]
                else:  # choice: the line ends at any newline; the candidates are scored from there
                    ok = [i for i, _ in enders]
                if ok:
                    mask[torch.tensor(ok)] = True
                rows.append(mask)
            line_masks = torch.stack(rows).to(dev)
        active = list(range(B))  # original row of each batch row still generating (or parked)
        kwargs = {"logits_to_keep": 1} if self._logits_to_keep else {}
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=positions,
                             past_key_values=cache, use_cache=True, **kwargs)
            if hits is not None:
                self._remember_prompts(prompt_ids, hits, cache)
            last_pos = positions[:, -1]
            step = 0
            # What the loop reads back from the device: one transfer a step (the chosen ids, with
            # their log-probs), plus the argmax when a greedy row is inside its JSON action. The
            # masks of the active rows stay on the device and change only when a row leaves the
            # batch or a row's phase changes.
            act_masks = line_masks
            reason_flags, reason_sent = None, None
            while True:
                raw = out.logits[:, -1, :].float()  # (B_active, V)
                V = raw.shape[1]
                logits = raw.clone()
                reason_now = [phase[r] == "reason" for r in active]
                if any(reason_now):
                    if reason_now != reason_sent:
                        reason_flags, reason_sent = torch.tensor(reason_now, device=dev), reason_now
                    logits.masked_fill_(reason_flags[:, None] & ~act_masks[:, :V], float("-inf"))
                json_rows = [b for b, r in enumerate(active) if phase[r] == "json"]
                if json_rows:
                    # greedy: the model's own choice, when the constraint accepts it, is the masked
                    # argmax; no mask needed for that row
                    tops = logits.argmax(-1).tolist() if warpers is None else None
                    need: list[tuple[int, list[int]]] = []
                    for b in json_rows:
                        c = constraints[active[b]]
                        if tops is not None and texts.texts[tops[b]] and c.accepts(texts.texts[tops[b]]):  # type: ignore
                            continue
                        allowed = c.allowed()  # type: ignore[union-attr]
                        if not allowed:
                            raise ValueError("constrained decoding: no admissible continuation")
                        need.append((b, allowed))
                    if need:
                        keep_ok = torch.ones_like(logits, dtype=torch.bool)
                        keep_ok[torch.tensor([b for b, _ in need], device=dev)] = False
                        where = torch.tensor([[b, i] for b, allowed in need for i in allowed], device=dev)
                        keep_ok[where[:, 0], where[:, 1]] = True
                        logits.masked_fill_(~keep_ok, float("-inf"))
                next_ids = self._choose(logits, warpers, [generators[r] for r in active])
                chosen_lp = None
                if self.want_logprobs:  # ids and log-probs come back in one transfer (float64: both exact)
                    lp = torch.log_softmax(raw, -1).gather(1, next_ids[:, None])[:, 0]
                    back = torch.stack([next_ids.to(torch.float64), lp.to(torch.float64)]).tolist()
                    ids_list, chosen_lp = [int(i) for i in back[0]], back[1]
                else:
                    ids_list = next_ids.tolist()
                # A choice row whose line ends here (a newline chosen, or the bound reached) is parked
                # before that token: every candidate is scored from this position.
                for b, r in enumerate(active):
                    if modes[r][0] == "choice" and phase[r] == "reason":
                        piece = texts.texts[ids_list[b]]  # type: ignore[union-attr]
                        if "\n" in piece or reason_tokens[r] >= reasoning_max:
                            phase[r] = "park"
                            leads[r] = piece.split("\n", 1)[0] + "\n" if "\n" in piece else "\n"
                            first_lp[r] = torch.log_softmax(raw[b], -1)
                parked = [phase[r] == "park" for r in active]
                step += 1
                # A JSON action under its constraint is finished whatever max_new_tokens says (it is at
                # most the longest admissible text), unless the context ends.
                held = [phase[r] in ("park", "json") for r in active]
                keep = self._push_tokens(streams, reasons, active, ids_list, chosen_lp, step, caps, early_stop,
                                         parked=parked, held=held, hard_caps=hard_caps)
                for b, r in enumerate(active):
                    if phase[r] not in ("reason", "json") or reasons[r] is not None:
                        continue
                    piece = texts.texts[ids_list[b]]  # type: ignore[union-attr]
                    c = constraints[r]
                    if phase[r] == "reason":
                        reason_tokens[r] += 1
                        if modes[r][0] == "choice":
                            continue  # parked at its next step, before the token that ends the line
                        if "\n" in piece:
                            phase[r] = "json"
                            c.advance(piece.split("\n", 1)[1])  # type: ignore[union-attr]
                        elif reason_tokens[r] >= reasoning_max:  # cut off: the JSON goes on a new line
                            phase[r] = "json"
                            constraints[r] = c = ActionConstraint(texts, modes[r][1], "\n")  # type: ignore[arg-type]
                    else:
                        c.advance(piece)  # type: ignore[union-attr]
                    if phase[r] == "json" and c.done:  # type: ignore[union-attr]
                        phase[r] = "free"  # the memory notes (or nothing: the object closed)
                if not keep or all(phase[active[b]] == "park" for b in keep):
                    break
                if len(keep) < len(active):  # finished rows leave the batch and the cache
                    idx = torch.tensor(keep, device=dev)
                    cache.batch_select_indices(idx)
                    attn, last_pos, next_ids = attn[idx], last_pos[idx], next_ids[idx]
                    if act_masks is not None:
                        act_masks = act_masks[idx]
                    active = [active[b] for b in keep]
                    reason_sent = None
                # A parked row's new column is padding its attention ignores; its position stays.
                if any(phase[r] == "park" for r in active):
                    live = torch.tensor([0 if phase[r] == "park" else 1 for r in active], device=dev,
                                        dtype=attn.dtype)
                    next_ids = torch.where(live.bool(), next_ids, torch.full_like(next_ids, self.pad_id))
                    attn = torch.cat([attn, live[:, None]], dim=1)
                    last_pos = last_pos + live
                else:  # every row live: nothing to send to the device
                    attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
                    last_pos = last_pos + 1
                out = self.model(input_ids=next_ids[:, None], attention_mask=attn, position_ids=last_pos[:, None],
                                 past_key_values=cache, use_cache=True, **kwargs)
            results: list[tuple[TrackedTurn, int | None, list[float] | None]] = []
            parked_rows = [(b, r) for b, r in enumerate(active) if phase[r] == "park"]
            scored = (self._score_choices(cache, attn, last_pos, parked_rows, first_lp, modes, streams, leads)
                      if parked_rows else {})
        for r in range(B):
            if r in scored:
                chosen, scores, reason = scored[r]
                results.append((streams[r].finish(reason), chosen, scores))
                continue
            c = constraints[r]
            results.append((streams[r].finish(reasons[r] or "max_new_tokens"), c.chosen if c else None, None))
        return results

    def _score_choices(self, cache: Any, attn: Any, last_pos: Any, parked: list[tuple[int, int]],
                       first_lp: dict[int, Any], modes: list, streams: list[ActionStream],
                       leads: dict[int, str]) -> dict:
        """Score every parked row's admissible actions; push the best one's tokens to its stream.

        For each row, each action's texts (:func:`choice_texts`) are tokenized and run in
        batched forwards over a copy of the row's cache (prompt + reasoning), at most
        ``SCORE_ROWS`` candidate rows per forward. An action's score is its best text's
        summed token log-probability.

        Returns:
            ``{row: (chosen index, per-action scores, stop reason)}``.
        """
        import torch  # deferred: heavy optional dependency (torch)
        from transformers import DynamicCache  # deferred: heavy optional dependency

        dev = self.device
        jobs = []  # (row, batch position, admissible index, token ids, closed form?)
        for b, r in parked:
            for text, i in choice_texts(modes[r][1], leads[r]):
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                jobs.append((r, b, i, ids, text.endswith(CLOSE)))
        totals: dict[int, dict[int, float]] = {r: {} for _, r in parked}
        best_ids: dict[tuple[int, int], tuple[float, list[int], list[float]]] = {}
        kwargs = {"logits_to_keep": 0} if self._logits_to_keep else {}
        for k in range(0, len(jobs), SCORE_ROWS):
            chunk = jobs[k:k + SCORE_ROWS]
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
            firsts = torch.stack([first_lp[r][ids[0]] for r, _, _, ids, _ in chunk]).tolist()
            nexts = lps[:, :-1].gather(2, inp[:, 1:, None])[..., 0].tolist() if L > 1 else [[] for _ in chunk]
            for j, (r, _, i, ids, closes) in enumerate(chunk):
                toks = [firsts[j]] + nexts[j][:len(ids) - 1]
                total = sum(toks)
                if total > totals[r].get(i, float("-inf")):
                    totals[r][i] = total
                if closes:  # the closed form is what the turn records as its JSON action
                    best_ids[(r, i)] = (total, ids, toks)
        result = {}
        for _, r in parked:
            acts = modes[r][1]
            scores = [round(totals[r].get(i, float("-inf")), 6) for i in range(len(acts))]
            chosen = max(totals[r], key=lambda i: (totals[r][i], -i))
            _, ids, toks = best_ids[(r, chosen)]
            for t, lp in zip(ids, toks):
                streams[r].push(t, logprob=lp if self.want_logprobs else None)
            result[r] = (chosen, scores, "json_closed" if streams[r].closed else "max_new_tokens")
        return result

    def _push_tokens(self, streams: list[ActionStream], reasons: list[str | None], active: list[int],
                     next_ids: list[int], chosen_lp: list[float] | None, step: int, caps: list[int],
                     early_stop: bool, parked: list[bool] | None = None, held: list[bool] | None = None,
                     hard_caps: list[int | None] | None = None) -> list[int]:
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
            closed = streams[r].push(tid, logprob=chosen_lp[b] if chosen_lp else None)
            if tid in self.eos_ids:
                reasons[r] = "json_closed" if closed and early_stop else "eos"
            elif closed and early_stop:
                reasons[r] = "json_closed"
            elif step >= caps[r] and not (held and held[b] and not (hard_caps and hard_caps[r] is not None
                                                                    and step >= hard_caps[r])):
                reasons[r] = "max_new_tokens"
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
