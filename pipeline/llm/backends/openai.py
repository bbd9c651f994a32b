"""The ``openai`` backend: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, ...).

``POST {model.base_url}/chat/completions``, one request per conversation run
concurrently; key read from the environment variable named by ``model.api_key_env``
(never logged or stored); retries with exponential backoff on connection errors,
timeouts, 408/409/429/5xx. Token ids and logprobs are stored when the server returns
them (``logprobs: true``; token ids with vLLM's ``return_tokens_as_token_ids`` in
``model.extra_body``).
"""

from __future__ import annotations

import codecs
import http.client
import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from omegaconf import OmegaConf

from pipeline.core.conf_schema import ModelConfig, SamplingConfig
from pipeline.llm.backends.base import BackendError, Generation, Messages, check_seeds, plain_prompt
from pipeline.llm.tracker import ActionStream, TrackedTurn, action_text_from_text

log = logging.getLogger(__name__)

# HTTP statuses worth retrying: timeouts, conflicts, rate limits, server errors.
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class OpenAIBackend:
    """Any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp server, ...).

    Args:
        model_cfg: ``cfg.model`` (``base_url``, ``api_model``, ``api_key_env``,
            ``timeout_s``, ``max_retries``, ``backoff_s``, ``logprobs``, ``extra_body``).
        sampling_cfg: ``cfg.sampling`` (``top_k`` is not an OpenAI parameter: servers that
            take it, like vLLM, get it through ``model.extra_body``).
    """

    def __init__(self, model_cfg: ModelConfig, sampling_cfg: SamplingConfig):
        base_url = model_cfg.base_url
        if not base_url or not str(base_url).startswith(("http://", "https://")):
            raise BackendError(f"model.base_url={base_url!r}: expected the endpoint's URL, e.g. http://127.0.0.1:8000/v1")
        self.api_model = model_cfg.api_model or model_cfg.name_or_path
        if not self.api_model:
            raise BackendError("model.api_model is null: name the model the endpoint serves")
        self.name = str(self.api_model)
        self.url = str(base_url).rstrip("/") + "/chat/completions"
        self.sampling = sampling_cfg
        self.timeout_s = float(model_cfg.timeout_s)
        self.max_retries = int(model_cfg.max_retries)
        self.backoff_s = float(model_cfg.backoff_s)
        self.want_logprobs = bool(model_cfg.logprobs)
        self.extra_body = _plain(model_cfg.extra_body or {})
        key_env = str(model_cfg.api_key_env)
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
        seeds = check_seeds(batch, seeds, int(self.sampling.seed))
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


def _plain(value: Any) -> dict:
    """``model.extra_body`` as a plain dict (request fields)."""
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)  # type: ignore[return-value]
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
        turn = _text_only_turn(items, content, stop_reason)
    gen = Generation.from_turn(prompt, int(usage.get("prompt_tokens") or 0), turn)
    gen.generated_tokens = int(usage.get("completion_tokens") or turn.num_tokens)
    return gen


def _text_only_turn(items: list, content: str, stop_reason: str) -> TrackedTurn:
    """The turn of a response without usable token data: the action located in the text only
    (by the tracker's rules: stream, else fallback search)."""
    return TrackedTurn(generated_ids=None, action_token_mask=None, action_token_start_index=None,  # type: ignore[arg-type]
                       action_token_end_index=None, tracking_method="none", stop_reason=stop_reason,
                       text=content, action_text=action_text_from_text(content),
                       logprobs=[float(it["logprob"]) for it in items] if items else None, num_tokens=0)


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
