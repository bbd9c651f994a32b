"""Generation backends for the ``llm`` agent: local ``transformers`` models and OpenAI-compatible APIs.

Both take a batch of chat conversations and return one :class:`Generation` per
conversation, with the JSON action tracked token by token (``pipeline.llm.tracker``)::

    backend = make_backend(cfg.model, cfg.sampling)        # picks by cfg.model.backend
    gens = backend.generate([messages_a, messages_b], seeds=[11, 12])
    gens[0].action_text, gens[0].action_token_mask, gens[0].stop_reason

- ``transformers``: any causal LM directory (or hub id) that ``AutoModelForCausalLM``
  loads. The batch is left-padded and decoded in one loop with a KV cache; every row
  samples from its own ``torch.Generator`` seeded with its seed, so a prompt's output does
  not depend on what else is in the batch (batched and sequential collection agree); a row
  leaves the batch (its KV cache rows are dropped) when its JSON action closes
  (``sampling.early_stop``), at EOS or at ``max_new_tokens``.
- ``openai``: ``POST {model.base_url}/chat/completions`` (OpenAI, vLLM, ...), one request
  per conversation run concurrently; key read from the environment variable named by
  ``model.api_key_env`` (never logged or stored); retries with exponential backoff on
  connection errors, timeouts, 408/409/429/5xx. Token ids and logprobs are stored when
  the server returns them (``logprobs: true``; token ids with vLLM's
  ``return_tokens_as_token_ids`` in ``model.extra_body``).

Runtime failures (a request that still fails after the retries, a failed forward pass)
come back as a :class:`Generation` with ``error`` set and ``stop_reason="error"``: the
agent decides whether that is a recorded failed turn or a stage failure
(``agent.on_backend_error``). Configuration errors raise :class:`BackendError`.
"""

from __future__ import annotations

import codecs
import hashlib
import http.client
import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pipeline.llm.tracker import ActionStream, JsonActionTracker, TrackedTurn, find_json_object

log = logging.getLogger(__name__)

Messages = list[dict]  # [{"role": "system"|"user"|"assistant", "content": str}, ...]

# HTTP statuses worth retrying: timeouts, conflicts, rate limits, server errors.
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
DTYPES = ("float32", "float16", "bfloat16", "auto")


class BackendError(RuntimeError):
    """A backend that cannot be built or a request that failed (message names the cause)."""


@dataclass
class Generation:
    """One conversation's generated turn, with the tracked JSON action and its accounting."""

    prompt: str  # exact text the model was conditioned on (chat template applied)
    prompt_tokens: int
    generated_tokens: int
    text: str  # generated text (special tokens skipped)
    generated_ids: list[int] | None = None  # None: the server returned no token ids
    action_token_mask: list[bool] | None = None  # one per generated token (None: no token data)
    action_token_start_index: int | None = None
    action_token_end_index: int | None = None  # exclusive
    tracking_method: str = "none"  # stream | fallback | none
    stop_reason: str = "error"  # json_closed | max_new_tokens | eos | error
    action_text: str | None = None  # the JSON action's text, exactly as generated
    logprobs: list[float] | None = None  # per generated token (model distribution)
    error: str | None = None

    @classmethod
    def from_turn(cls, prompt: str, prompt_tokens: int, turn: TrackedTurn) -> "Generation":
        return cls(
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            generated_tokens=turn.num_tokens,
            text=turn.text,
            generated_ids=turn.generated_ids,
            action_token_mask=turn.action_token_mask,
            action_token_start_index=turn.action_token_start_index,
            action_token_end_index=turn.action_token_end_index,
            tracking_method=turn.tracking_method,
            stop_reason=turn.stop_reason,
            action_text=turn.action_text,
            logprobs=turn.logprobs,
        )

    @classmethod
    def failed(cls, prompt: str, error: str, prompt_tokens: int = 0) -> "Generation":
        return cls(prompt=prompt, prompt_tokens=prompt_tokens, generated_tokens=0, text="", error=error)


def _value(v: Any) -> Any:
    """Plain value of a config enum (``Backend.openai`` -> ``"openai"``)."""
    return getattr(v, "value", v)


def plain_prompt(messages: Messages) -> str:
    """The prompt format for tokenizers without a chat template (and for stored API prompts).

    Role-tagged blocks, ending where the assistant's answer starts::

        ### System:
        <system prompt>

        ### User:
        <observation>

        ### Assistant:
    """
    blocks = [f"### {str(m['role']).capitalize()}:\n{m['content']}" for m in messages]
    return "\n\n".join(blocks) + "\n\n### Assistant:\n"


def render_prompt(tokenizer: Any, messages: Messages) -> tuple[str, bool]:
    """Prompt text for ``messages``: the tokenizer's chat template when it has one.

    Returns ``(text, add_special_tokens)``: a chat template already writes BOS and other
    special tokens, so its text is tokenized without adding them again. Templates that
    reject a ``system`` role get the system prompt prepended to the first user message.
    """
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), False
        except Exception:  # e.g. "System role not supported"
            merged = _merge_system(messages)
            return tokenizer.apply_chat_template(merged, tokenize=False, add_generation_prompt=True), False
    return plain_prompt(messages), True


def _merge_system(messages: Messages) -> Messages:
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if system and rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    elif system:
        rest.insert(0, {"role": "user", "content": system})
    return rest


def make_backend(model_cfg: Any, sampling_cfg: Any) -> "TransformersBackend | OpenAIBackend":
    """The backend named by ``model.backend``."""
    name = _value(model_cfg.backend)
    if name == "transformers":
        return TransformersBackend(model_cfg, sampling_cfg)
    if name == "openai":
        return OpenAIBackend(model_cfg, sampling_cfg)
    raise BackendError(f"model.backend={name!r}: expected transformers | openai")


def is_local(model_cfg: Any) -> bool:
    """True when the backend runs the model inside this process (``model.backend=transformers``):
    its weights are files, its threads are ours, and the ``policy`` stage can train it."""
    return _value(model_cfg.backend) == "transformers"


def make_text_generator(cfg: Any, *, backend: Any = None, max_new_tokens: int | None = None) -> Callable[[str], str]:
    """A ``prompt -> text`` function over the configured backend (free text, no early stop).

    For callers that want plain text (the ``llm`` grounding generator): the prompt is
    sent as one user message; the sampling seed is derived from ``sampling.seed`` and the
    prompt, so the same prompt gives the same text. A failed call raises
    :class:`BackendError`.
    """
    backend = backend if backend is not None else make_backend(cfg.model, cfg.sampling)
    base_seed = int(cfg.sampling.seed)

    def generate(prompt: str) -> str:
        digest = hashlib.sha256(f"{base_seed}\n{prompt}".encode("utf-8")).digest()
        seed = int.from_bytes(digest[:8], "big") >> 1
        gen = backend.generate([[{"role": "user", "content": prompt}]], seeds=[seed],
                               max_new_tokens=max_new_tokens, early_stop=False)[0]
        if gen.error:
            raise BackendError(gen.error)
        return gen.text

    return generate


class TransformersBackend:
    """Batched generation with a local causal LM, per-row tracking and early stop.

    Args:
        model_cfg: ``cfg.model`` (``name_or_path``, ``dtype``, ``device``, ``logprobs``).
        sampling_cfg: ``cfg.sampling``.
        model, tokenizer: already loaded objects (tests, or a stage that just trained
            them); when given, ``model_cfg.name_or_path`` is not read.
    """

    def __init__(self, model_cfg: Any, sampling_cfg: Any, *, model: Any = None, tokenizer: Any = None):
        import torch

        self.sampling = sampling_cfg
        self.want_logprobs = bool(getattr(model_cfg, "logprobs", True))
        self.name = str(getattr(model_cfg, "name_or_path", None) or getattr(model, "name_or_path", "model"))
        device = str(getattr(model_cfg, "device", "cpu"))
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
        import inspect

        self._logits_to_keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def _load(self, model_cfg: Any) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        name = getattr(model_cfg, "name_or_path", None)
        if not name:
            raise BackendError("model.name_or_path is null: set it to a local model directory "
                               "(e.g. `-S model=local -S model.name_or_path=path/to/model`)")
        dtype_name = str(getattr(model_cfg, "dtype", "float32"))
        if dtype_name not in DTYPES:
            raise BackendError(f"model.dtype={dtype_name!r}: expected one of {', '.join(DTYPES)}")
        dtype = dtype_name if dtype_name == "auto" else getattr(torch, dtype_name)
        path = Path(name)
        if not path.is_absolute():
            from pipeline.core.config import project_root

            rooted = project_root() / path
            path = rooted if rooted.exists() else path
        if not path.exists() and (str(name).startswith((".", "/")) or len(Path(name).parts) > 2):
            raise BackendError(f"model.name_or_path={name!r}: no such model directory")
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
        seeds = list(seeds) if seeds is not None else [int(s.seed)] * len(batch)
        if len(seeds) != len(batch):
            raise ValueError(f"generate: {len(batch)} conversations but {len(seeds)} seeds")
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

    def _decode_loop(self, prompt_ids: list[list[int]], seeds: list[int], caps: list[int],
                     early_stop: bool) -> list[TrackedTurn]:
        import torch
        from transformers import DynamicCache

        s = self.sampling
        B, L = len(prompt_ids), max(len(p) for p in prompt_ids)
        dev = self.device
        # Left padding: every row's last prompt token sits in column L-1, so one new
        # column per step serves the whole batch. Positions count real tokens only.
        input_ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for r, ids in enumerate(prompt_ids):
            input_ids[r, L - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attn[r, L - len(ids):] = 1
        input_ids, attn = input_ids.to(dev), attn.to(dev)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
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
                keep = []
                for b, (r, tid) in enumerate(zip(active, next_ids.tolist())):
                    closed = streams[r].push(tid, logprob=chosen_lp[b] if chosen_lp else None)
                    if tid in self.eos_ids:
                        reasons[r] = "json_closed" if closed and early_stop else "eos"
                    elif closed and early_stop:
                        reasons[r] = "json_closed"
                    elif step >= caps[r]:
                        reasons[r] = "max_new_tokens"
                    else:
                        keep.append(b)
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

    def _warpers(self) -> list:
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
        import torch

        if warpers is None:
            return logits.argmax(-1)
        scores = logits
        for w in warpers:
            scores = w(None, scores)
        probs = torch.softmax(scores, dim=-1)
        return torch.cat([torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(generators)])


class OpenAIBackend:
    """Any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp server, ...).

    Args:
        model_cfg: ``cfg.model`` (``base_url``, ``api_model``, ``api_key_env``,
            ``timeout_s``, ``max_retries``, ``backoff_s``, ``logprobs``, ``extra_body``).
        sampling_cfg: ``cfg.sampling`` (``top_k`` is not an OpenAI parameter: servers that
            take it, like vLLM, get it through ``model.extra_body``).
    """

    def __init__(self, model_cfg: Any, sampling_cfg: Any):
        base_url = getattr(model_cfg, "base_url", None)
        if not base_url or not str(base_url).startswith(("http://", "https://")):
            raise BackendError(f"model.base_url={base_url!r}: expected the endpoint's URL, e.g. http://127.0.0.1:8000/v1")
        self.api_model = getattr(model_cfg, "api_model", None) or getattr(model_cfg, "name_or_path", None)
        if not self.api_model:
            raise BackendError("model.api_model is null: name the model the endpoint serves")
        self.name = str(self.api_model)
        self.url = str(base_url).rstrip("/") + "/chat/completions"
        self.sampling = sampling_cfg
        self.timeout_s = float(getattr(model_cfg, "timeout_s", 60.0))
        self.max_retries = int(getattr(model_cfg, "max_retries", 3))
        self.backoff_s = float(getattr(model_cfg, "backoff_s", 0.5))
        self.want_logprobs = bool(getattr(model_cfg, "logprobs", True))
        extra = getattr(model_cfg, "extra_body", None) or {}
        self.extra_body = _plain(extra)
        key_env = str(getattr(model_cfg, "api_key_env", "OPENAI_API_KEY"))
        key = os.environ.get(key_env)
        self._headers = {"Content-Type": "application/json"}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        else:
            log.warning("environment variable %s is not set: calling %s without an API key", key_env, self.url)
        # The key's value, only to scrub it from server-provided text before it is logged
        # or recorded (a proxy may echo request headers in an error page).
        self._secret = key if key else None

    def __repr__(self) -> str:  # never shows the headers (the key)
        return f"OpenAIBackend(url={self.url!r}, model={self.api_model!r})"

    def generate(self, batch: Sequence[Messages], seeds: Sequence[int] | None = None, *,
                 max_new_tokens: int | None = None, early_stop: bool | None = None) -> list[Generation]:
        """One request per conversation, sent concurrently (the server batches them)."""
        seeds = list(seeds) if seeds is not None else [int(self.sampling.seed)] * len(batch)
        if len(seeds) != len(batch):
            raise ValueError(f"generate: {len(batch)} conversations but {len(seeds)} seeds")
        jobs = list(zip(batch, seeds))
        if len(jobs) == 1:
            return [self._one(jobs[0][0], jobs[0][1], max_new_tokens)]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            return list(pool.map(lambda job: self._one(job[0], job[1], max_new_tokens), jobs))

    def request_body(self, messages: Messages, seed: int, max_new_tokens: int | None = None) -> dict:
        s = self.sampling
        body: dict[str, Any] = {
            "model": self.api_model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "max_tokens": int(max_new_tokens if max_new_tokens is not None else s.max_new_tokens),
            "seed": int(seed),
        }
        if s.do_sample:
            body.update(temperature=float(s.temperature), top_p=float(s.top_p))
        else:
            body.update(temperature=0.0, top_p=1.0)  # greedy
        if self.want_logprobs:
            body["logprobs"] = True
        body.update(self.extra_body)
        return body

    def _one(self, messages: Messages, seed: int, max_new_tokens: int | None) -> Generation:
        prompt = plain_prompt(messages)
        try:
            data = self.post(self.request_body(messages, seed, max_new_tokens))
            gen = parse_chat_response(prompt, data)
            if gen.error:  # server-provided text: scrub the key before it is recorded
                gen.error = self._scrub(gen.error)
            return gen
        except BackendError as exc:
            return Generation.failed(prompt, str(exc))

    def post(self, body: dict) -> dict:
        """POST the body; retry transient failures with exponential backoff."""
        payload = json.dumps(body).encode("utf-8")
        attempts = self.max_retries + 1
        last = ""
        for attempt in range(attempts):
            delay = self.backoff_s * (2 ** attempt)
            try:
                req = urllib.request.Request(self.url, data=payload, headers=self._headers, method="POST")
                deadline = time.monotonic() + self.timeout_s
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    raw = _read_until(resp, deadline)
                try:
                    return json.loads(raw)
                except ValueError:
                    last = self._scrub(f"response is not JSON: {raw[:120]!r}")
            except urllib.error.HTTPError as exc:
                detail = self._scrub(exc.read()[:200].decode("utf-8", "replace").strip())
                if exc.code not in RETRY_STATUS:
                    raise BackendError(f"POST {self.url}: HTTP {exc.code}: {detail}") from None
                last = f"HTTP {exc.code}: {detail}"
                retry_after = exc.headers.get("Retry-After") if exc.headers else None
                if retry_after and retry_after.strip().isdigit():
                    delay = max(delay, min(float(retry_after), 60.0))
            except (TimeoutError, socket.timeout):
                last = f"timed out after {self.timeout_s:g}s"
            except urllib.error.URLError as exc:
                reason = exc.reason
                last = (f"timed out after {self.timeout_s:g}s" if isinstance(reason, (TimeoutError, socket.timeout))
                        else f"connection failed: {reason}")
            except (ConnectionError, http.client.HTTPException) as exc:
                last = f"connection failed: {type(exc).__name__}: {exc}"
            if attempt + 1 < attempts:
                log.warning("POST %s: %s (attempt %d/%d, retrying in %.2fs)", self.url, last, attempt + 1,
                            attempts, delay)
                time.sleep(delay)
        raise BackendError(f"POST {self.url} failed after {attempts} attempts: {last}")

    def _scrub(self, text: str) -> str:
        """Server-provided text with the API key's value replaced by ``***``."""
        return text.replace(self._secret, "***") if self._secret else text


def _read_until(resp: Any, deadline: float, chunk: int = 65536) -> bytes:
    """Read a response body, failing once ``deadline`` passes.

    ``urlopen``'s timeout bounds each socket read, not the request: a server that trickles
    bytes would hold an attempt open indefinitely. Each read gets the time left.
    """
    parts = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("response body not complete before the deadline")
        sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
        if sock is not None:
            sock.settimeout(max(left, 0.001))
        data = resp.read1(chunk) if hasattr(resp, "read1") else resp.read(chunk)
        if not data:
            return b"".join(parts)
        parts.append(data)


def _plain(value: Any) -> Any:
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return dict(value)


def parse_chat_response(prompt: str, data: dict) -> Generation:
    """A chat-completions response as a :class:`Generation` (tokens tracked when returned).

    With ``logprobs.content`` the returned tokens are fed to the tracker one by one (their
    ``bytes`` decoded incrementally as UTF-8, ids parsed from vLLM's ``token_id:<n>``
    form); without them only the action text is located (``tracking_method="none"``).
    """
    try:
        choice = data["choices"][0]
        content = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        return Generation.failed(prompt, f"unexpected response shape: {json.dumps(data)[:200]}")
    usage = data.get("usage") or {}
    finish = choice.get("finish_reason")
    stop_reason = "max_new_tokens" if finish == "length" else "eos"
    items = ((choice.get("logprobs") or {}).get("content")) or []
    turn = _track_api_tokens(items, content, stop_reason)
    if turn is None:  # no usable token data: find the action in the text only
        tracker = JsonActionTracker()
        tracker.feed(content)
        if tracker.closed:
            action_text = content[tracker.start_char:tracker.end_char]
        else:
            found = find_json_object(content)
            action_text = content[found[0]:found[1]] if found else None
        turn = TrackedTurn(generated_ids=None, action_token_mask=None, action_token_start_index=None,  # type: ignore[arg-type]
                           action_token_end_index=None, tracking_method="none", stop_reason=stop_reason,
                           text=content, action_text=action_text,
                           logprobs=[float(it["logprob"]) for it in items] if items else None, num_tokens=0)
    gen = Generation.from_turn(prompt, int(usage.get("prompt_tokens") or 0), turn)
    gen.generated_tokens = int(usage.get("completion_tokens") or turn.num_tokens)
    return gen


def _track_api_tokens(items: list, content: str, stop_reason: str) -> TrackedTurn | None:
    if not items:
        return None
    stream = ActionStream(None)
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    ids_known = True
    for it in items:
        token = str(it.get("token", ""))
        tid = None
        if token.startswith("token_id:") and token[9:].lstrip("-").isdigit():
            tid = int(token[9:])
        else:
            ids_known = False
        if it.get("bytes") is not None:
            piece = utf8.decode(bytes(it["bytes"]))
        elif tid is None:
            piece = token
        else:
            return None  # an id without its text: cannot place the action
        lp = it.get("logprob")
        stream.push(tid, piece=piece, logprob=float(lp) if lp is not None else None)
    tail = utf8.decode(b"", final=True)
    if tail:
        stream.tracker.extend_last(tail)
    if stream.tracker.text != content:  # tokens do not spell the content: do not trust them
        return None
    turn = stream.finish(stop_reason)
    if not ids_known:
        turn.generated_ids = None  # type: ignore[assignment]
    return turn
