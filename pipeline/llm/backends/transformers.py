"""The ``transformers`` backend: batched generation with a local causal LM.

Any causal LM directory (or hub id) that ``AutoModelForCausalLM`` loads. The batch is
left-padded and decoded in one loop with a KV cache; every row samples from its own
``torch.Generator`` seeded with its seed, so a prompt's output does not depend on what
else is in the batch (batched and sequential collection agree); a row leaves the batch
(its KV cache rows are dropped) when its JSON action closes (``sampling.early_stop``), at
EOS or at ``max_new_tokens``.

torch and transformers are imported inside the functions that use them (heavy optional
dependencies): importing this module stays cheap.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Sequence

from pipeline.core.conf_schema import ModelConfig, SamplingConfig
from pipeline.core.config import project_root
from pipeline.llm.backends.base import BackendError, Generation, Messages, check_seeds, render_prompt
from pipeline.llm.tracker import ActionStream, TrackedTurn

log = logging.getLogger(__name__)

DTYPES = ("float32", "float16", "bfloat16", "auto")


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
        self.want_logprobs = bool(model_cfg.logprobs)
        self.name = str(model_cfg.name_or_path or getattr(model, "name_or_path", "model"))
        device = str(model_cfg.device)
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

    def _load(self, model_cfg: ModelConfig) -> tuple[Any, Any]:
        import torch  # deferred: heavy optional dependency (torch)
        from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: heavy optional dependency

        name = model_cfg.name_or_path
        if not name:
            raise BackendError("model.name_or_path is null: set it to a local model directory "
                               "(e.g. `-S model=local -S model.name_or_path=path/to/model`)")
        dtype_name = str(model_cfg.dtype)
        if dtype_name not in DTYPES:
            raise BackendError(f"model.dtype={dtype_name!r}: expected one of {', '.join(DTYPES)}")
        dtype = dtype_name if dtype_name == "auto" else getattr(torch, dtype_name)
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

    def generate(self, batch: Sequence[Messages], seeds: Sequence[int] | None = None, *,
                 max_new_tokens: int | None = None, early_stop: bool | None = None) -> list[Generation]:
        """Generate one turn for every conversation in ``batch`` in one batched loop.

        Args:
            batch: conversations (lists of chat messages).
            seeds: one sampling seed per conversation (default ``sampling.seed``).
            max_new_tokens, early_stop: override ``sampling.*`` (benchmarks).
        """
        s = self.sampling
        seeds = check_seeds(batch, seeds, int(s.seed))
        max_new = int(max_new_tokens if max_new_tokens is not None else s.max_new_tokens)
        stop_early = bool(s.early_stop if early_stop is None else early_stop)
        prompts = [self.render(m) for m in batch]
        out: list[Generation | None] = [None] * len(batch)
        rows = []
        for i, (text, ids) in enumerate(prompts):
            cap = max_new if self.context is None else min(max_new, self.context - len(ids))
            if cap < 1:
                out[i] = Generation.failed(text, f"prompt has {len(ids)} tokens; the model's context is "
                                                 f"{self.context}", len(ids))
            else:
                rows.append((i, cap))
        if rows:
            try:
                turns = self._decode_loop([prompts[i][1] for i, _ in rows], [seeds[i] for i, _ in rows],
                                          [cap for _, cap in rows], stop_early)
            except (RuntimeError, ValueError, IndexError) as exc:  # a failed forward pass fails the chunk
                turns = [exc] * len(rows)
            for (i, _), turn in zip(rows, turns):
                text, ids = prompts[i]
                if isinstance(turn, Exception):
                    out[i] = Generation.failed(text, f"generation failed: {type(turn).__name__}: {turn}", len(ids))
                else:
                    out[i] = Generation.from_turn(text, len(ids), turn)
        return out  # type: ignore[return-value]

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

    def _decode_loop(self, prompt_ids: list[list[int]], seeds: list[int], caps: list[int],
                     early_stop: bool) -> list[TrackedTurn]:
        import torch  # deferred: heavy optional dependency (torch)
        from transformers import DynamicCache  # deferred: heavy optional dependency

        s = self.sampling
        B = len(prompt_ids)
        dev = self.device
        input_ids, attn, positions = self._left_pad(prompt_ids)
        generators = [torch.Generator(device=dev).manual_seed(int(seed)) for seed in seeds]
        warpers = self._warpers() if s.do_sample else None  # None: greedy
        streams = [ActionStream(self.tokenizer) for _ in range(B)]
        reasons: list[str | None] = [None] * B
        active = list(range(B))  # original row of each batch row still generating
        cache = DynamicCache(config=self.model.config)
        kwargs = {"logits_to_keep": 1} if self._logits_to_keep else {}
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=positions,
                             past_key_values=cache, use_cache=True, **kwargs)
            last_pos = positions[:, -1]
            step = 0
            while True:
                logits = out.logits[:, -1, :].float()  # (B_active, V)
                next_ids = self._choose(logits, warpers, [generators[r] for r in active])
                chosen_lp = None
                if self.want_logprobs:
                    chosen_lp = torch.log_softmax(logits, -1).gather(1, next_ids[:, None])[:, 0].tolist()
                step += 1
                keep = self._push_tokens(streams, reasons, active, next_ids.tolist(), chosen_lp, step, caps,
                                         early_stop)
                if not keep:
                    break
                if len(keep) < len(active):  # finished rows leave the batch and the cache
                    idx = torch.tensor(keep, device=dev)
                    cache.batch_select_indices(idx)
                    attn, last_pos, next_ids = attn[idx], last_pos[idx], next_ids[idx]
                    active = [active[b] for b in keep]
                attn = torch.cat([attn, attn.new_ones((len(active), 1))], dim=1)
                last_pos = last_pos + 1
                out = self.model(input_ids=next_ids[:, None], attention_mask=attn, position_ids=last_pos[:, None],
                                 past_key_values=cache, use_cache=True, **kwargs)
        return [st.finish(reason or "max_new_tokens") for st, reason in zip(streams, reasons)]

    def _push_tokens(self, streams: list[ActionStream], reasons: list[str | None], active: list[int],
                     next_ids: list[int], chosen_lp: list[float] | None, step: int, caps: list[int],
                     early_stop: bool) -> list[int]:
        """Feed each active row its new token; set the stop reason of rows that finish.

        Returns:
            The batch positions (indices into ``active``) of the rows still generating.
        """
        keep = []
        for b, (r, tid) in enumerate(zip(active, next_ids)):
            closed = streams[r].push(tid, logprob=chosen_lp[b] if chosen_lp else None)
            if tid in self.eos_ids:
                reasons[r] = "json_closed" if closed and early_stop else "eos"
            elif closed and early_stop:
                reasons[r] = "json_closed"
            elif step >= caps[r]:
                reasons[r] = "max_new_tokens"
            else:
                keep.append(b)
        return keep

    def _warpers(self) -> list:
        # deferred: heavy optional dependency (transformers)
        from transformers.generation import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        s = self.sampling
        warpers: list = []
        if float(s.temperature) != 1.0:
            warpers.append(TemperatureLogitsWarper(float(s.temperature)))
        if int(s.top_k) > 0:
            warpers.append(TopKLogitsWarper(int(s.top_k)))
        if float(s.top_p) < 1.0:
            warpers.append(TopPLogitsWarper(float(s.top_p)))
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
