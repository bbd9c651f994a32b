"""The ``openai`` backend: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, SGLang,
``transformers serve``, llama.cpp, ...) through the official ``openai`` client (``AsyncOpenAI``).

One request per conversation, at most ``model.max_concurrency`` in flight, on one event
loop that lives as long as the backend (one client, one connection pool: connections are
reused from batch to batch)::

    backend = OpenAIBackend(cfg.model, cfg.sampling)
    gens = backend.generate(conversations, seeds=[...])                 # free text
    gens = backend.generate(conversations, seeds=[...], admissible=[...])  # constrained actions

Retries are this module's, not the client's (the client is built with ``max_retries=0``):
every attempt is bounded by ``model.timeout_s`` as a whole (the client's own timeout bounds
each socket read, so a server that trickles bytes would hold an attempt open for ever); a
200 whose body is cut short is retried (the client retries only what fails before a
response); and the backoff is ``model.backoff_s`` doubled per retry, reproducible, with a
server's ``Retry-After`` honoured up to 60 s. Retried: timeouts, dropped connections,
truncated bodies, HTTP 408/409/429/5xx. Not retried: other 4xx.

Errors. A wrong key (401/403) or a model the server does not serve (404) raise
:class:`~pipeline.llm.backends.base.BackendConfigError` from ``generate`` (whatever
``agent.on_backend_error`` says: every turn would fail the same way). Everything else is
per conversation: a :class:`Generation` with ``error`` set (a prompt longer than the
model's context, a malformed response, a request that still fails after the retries).

The API key is read from the environment variable ``model.api_key_env`` (only from it:
the client's own ``OPENAI_API_KEY`` fallback is not used), sent as a header, and never
logged, stored, cached or put in an error message (server-provided text is scrubbed of it).
Credentials in the URL (``http://user:pass@host/v1``; the config refuses them, a backend
built by hand may carry them) are used for the connection only: every URL this module logs,
caches, keys a cache entry by or puts in an error shows ``***@`` instead
(:func:`pipeline.core.config.redact_url`), and so do the request lines the HTTP client logs
(``HTTP Request: POST <url>``, at INFO: a filter on its loggers, installed by the backend).

Token data (``model.logprobs``): asked for as ``logprobs=true, top_logprobs=0`` (OpenAI's
fields; llama-cpp-python's server returns logprobs only when ``top_logprobs`` is set, and
then the unconstrained model's log-probabilities, as the local backend records them); the
returned tokens (their ``bytes``, else their text) are fed to the tracker, so the JSON
action's span, the mask and the logprobs come out as with the local backend; token ids
come with vLLM's ``return_tokens_as_token_ids`` (``model.extra_body``).
A turn whose tokens cannot give the ``.pt`` tensors says why in its ``tracking_method``
(``<method>:<reason>``, tensors skipped):

- ``none:no_logprobs``: logprobs were asked for and the server returned none
  (``transformers serve`` ignores the fields); the action is found in the text only;
- ``stream:no_token_ids`` / ``fallback:no_token_ids``: tokens and logprobs but no ids
  (OpenAI; llama-cpp-python; vLLM without ``return_tokens_as_token_ids``): the span is
  known, not the ids;
- ``none:tokens_mismatch``: the returned tokens do not spell the returned text.

With ``model.logprobs=false`` nothing is asked for and turns say ``none`` (text only).

Constrained actions (``model.structured_output``; the server enforces them): how each server
dialect expresses them, and the start-up probe that finds which one a server enforces, are
:mod:`pipeline.llm.backends.dialects`; this module sends them.

Under a constraint the model writes only the JSON action (no reasoning line, no
``memory`` object).
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import os
import re
import threading
import weakref
from typing import Any, Mapping, Sequence

from omegaconf import OmegaConf

from pipeline.core.conf_schema import ModelConfig, SamplingConfig, StructuredOutput
from pipeline.core.config import redact_url, url_secrets
from pipeline.llm.backends.base import (
    BackendConfigError,
    BackendError,
    ConstraintProbe,
    Generation,
    Messages,
    ProbeResult,
    check_seeds,
    plain_prompt,
)
from pipeline.llm.backends.cache import ResponseCache, cache_root
from pipeline.llm.backends.dialects import (
    PROBE_ACTION,
    PROBE_FORMS,
    PROBE_MAX_TOKENS,
    PROBE_MESSAGES,
    constraint_fields,
    no_constraint_message,
    probe_outcome,
    settled_probe,
)
from pipeline.llm.tracker import ActionStream, TrackedTurn, action_text_from_text

log = logging.getLogger(__name__)

# HTTP statuses worth retrying besides every 5xx: timeouts, conflicts, rate limits.
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 60.0

# Why a turn has no .pt tensors (the suffix of its tracking_method).
NO_LOGPROBS = "no_logprobs"
NO_TOKEN_IDS = "no_token_ids"
TOKENS_MISMATCH = "tokens_mismatch"
NO_TENSOR_REASONS = {
    NO_LOGPROBS: "the server returned no logprobs (it ignores logprobs and top_logprobs): the action is located in "
                 "the text only",
    NO_TOKEN_IDS: "the server returned tokens without ids (for vLLM set "
                  "+model.extra_body.return_tokens_as_token_ids=true)",
    TOKENS_MISMATCH: "the returned tokens do not spell the returned text",
}

# Request fields the client takes as arguments; the others go in its extra_body.
_CLIENT_FIELDS = ("model", "messages", "max_tokens", "seed", "temperature", "top_p", "logprobs", "top_logprobs",
                  "response_format")

# A 400/413/422 that says the prompt does not fit the context (OpenAI, vLLM, SGLang, llama.cpp, TGI).
_CONTEXT_RE = re.compile(r"context[ _-]?(length|window|size)|maximum context|max_model_len|prompt is too long|"
                         r"input is too long|too many (input )?tokens|longer than the model|exceeds? the "
                         r"(model'?s? )?(max|maximum|available) ", re.IGNORECASE)


# Loggers of the client library that write request URLs (httpx2: "HTTP Request: POST <url> ...").
_URL_LOGGERS = ("httpx", "httpx2", "openai._base_client")


class _RedactURLs(logging.Filter):
    """Replace the credentials of any URL in a log record by ``***`` (the record is kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        clean = redact_url(text)
        if clean != text:
            record.msg, record.args = clean, ()
        return True


_REDACT_URLS = _RedactURLs()


def _redact_library_logs() -> None:
    """Install :class:`_RedactURLs` on the client library's loggers (once)."""
    for name in _URL_LOGGERS:
        logger = logging.getLogger(name)
        if _REDACT_URLS not in logger.filters:
            logger.addFilter(_REDACT_URLS)


class _Failed(Exception):
    """One conversation's request failed for good (the message becomes ``Generation.error``;
    ``status``: the HTTP status of the server's last answer, None when none came)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


async def _sleep(seconds: float) -> None:
    """The backoff wait (a module function: tests record it instead of waiting)."""
    await asyncio.sleep(seconds)


def _openai() -> Any:
    import openai  # deferred: the client (and pydantic's models) load only when a backend is used

    return openai


class _LoopThread:
    """An event loop on a daemon thread, for the backend's lifetime (its client and pool live there)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="openai-backend", daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:  # Ctrl-C in the caller: stop the requests too
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.pid != os.getpid() or not self.thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=5)


class OpenAIBackend:
    """Any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, SGLang, ``transformers serve``, ...).

    Args:
        model_cfg: ``cfg.model`` (``base_url``, ``api_model``, ``api_key_env``,
            ``timeout_s``, ``max_retries``, ``backoff_s``, ``max_concurrency``, ``logprobs``,
            ``structured_output``, ``cache_dir``, ``extra_body``).
        sampling_cfg: ``cfg.sampling`` (``top_k`` is not an OpenAI parameter: servers that
            take it, like vLLM, get it through ``model.extra_body``).

    Attributes:
        constrains_actions: a form of ``model.structured_output`` is in use: :meth:`generate`
            takes ``admissible`` (the ``ActionConstrainedBackend`` capability). ``auto``
            constrains only once :meth:`settle_constraint` found a form the server enforces.
        constraint: the start-up probe's :class:`ConstraintProbe` (None before
            :meth:`settle_constraint`; the ``SettlesConstraint`` capability).
        requests_sent: HTTP attempts made so far (cache hits make none).
    """

    def __init__(self, model_cfg: ModelConfig, sampling_cfg: SamplingConfig):
        base_url = model_cfg.base_url
        if not base_url or not str(base_url).startswith(("http://", "https://")):
            shown = "None" if base_url is None else repr(redact_url(base_url))
            raise BackendError(f"model.base_url={shown}: expected the endpoint's URL, e.g. "
                               "http://127.0.0.1:8000/v1")
        self.api_model = model_cfg.api_model or model_cfg.name_or_path
        if not self.api_model:
            raise BackendError("model.api_model is null: name the model the endpoint serves")
        self.name = str(self.api_model)
        # The endpoint as given, for the client only; what is shown, logged and cached has no credentials.
        self._endpoint = str(base_url).rstrip("/")
        self._url_secrets = url_secrets(self._endpoint)
        self.base_url = redact_url(self._endpoint)
        self.url = self.base_url + "/chat/completions"
        _redact_library_logs()
        self.sampling = sampling_cfg
        self.timeout_s = model_cfg.timeout_s
        self.max_retries = model_cfg.max_retries
        self.backoff_s = model_cfg.backoff_s
        self.max_concurrency = model_cfg.max_concurrency
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0 or self.max_concurrency < 1:
            raise BackendError(f"model.timeout_s={self.timeout_s:g} (> 0), model.max_retries={self.max_retries} "
                               f"(>= 0), model.backoff_s={self.backoff_s:g} (>= 0), model.max_concurrency="
                               f"{self.max_concurrency} (>= 1): one is out of range")
        self.want_logprobs = model_cfg.logprobs
        self.extra_body = _plain(model_cfg.extra_body or {})
        self.configured_output = str(model_cfg.structured_output or StructuredOutput.none)
        if self.configured_output not in {m.value for m in StructuredOutput}:  # an untyped model_cfg
            raise BackendError(f"model.structured_output={self.configured_output!r}: expected one of "
                               f"{' | '.join(StructuredOutput)}")
        self.constraint: ConstraintProbe | None = None
        # The form every constrained request carries; `auto` has none until the probe finds one.
        self._use_form(StructuredOutput.none if self.configured_output == StructuredOutput.auto
                       else self.configured_output)
        self.key_env = model_cfg.api_key_env
        key = os.environ.get(self.key_env) or None
        if key is None:
            log.warning("environment variable %s is not set: calling %s without an API key", self.key_env, self.url)
        # The key's value: for the client's header, and to scrub it from server-provided
        # text before anything is logged, recorded or cached (a proxy may echo headers).
        self._secret = key
        cache_dir = getattr(model_cfg, "cache_dir", None)
        self.cache = ResponseCache(cache_root(cache_dir), base_url=self.base_url, secret=key) if cache_dir else None
        self.requests_sent = 0
        self._runner: _LoopThread | None = None
        self._client: Any = None
        self._slots: asyncio.Semaphore | None = None
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIBackend(url={self.url!r}, model={self.api_model!r})"

    def _use_form(self, form: str) -> None:
        self.structured_output = str(form)
        self.constrains_actions = self.structured_output != StructuredOutput.none
        self.decodings = ("free", "constrained") if self.constrains_actions else ("free",)

    # -- public ---------------------------------------------------------------------

    def generate(self, batch: Sequence[Messages], seeds: Sequence[int] | None = None, *,
                 max_new_tokens: int | None = None, early_stop: bool | None = None,
                 admissible: Sequence[Sequence[Mapping[str, Any]] | None] | None = None,
                 decoding: str = "constrained", reasoning_max_tokens: int = 32) -> list[Generation]:
        """One request per conversation, ``model.max_concurrency`` at a time (the server batches them).

        Args:
            batch, seeds, max_new_tokens: as :meth:`Backend.generate` (``early_stop`` is
                not an API parameter: the server generates to EOS or ``max_tokens``).
            admissible: per conversation, the admissible action dicts to constrain the
                JSON action to (``model.structured_output``), or None for no constraint.
            decoding, reasoning_max_tokens: the ``ActionConstrainedBackend`` arguments; the
                server's constraint is ``model.structured_output`` whatever they say
                (``choice`` needs token scores the API does not give: the agent refuses it).

        Raises:
            BackendConfigError: the server refused the key (401/403) or does not serve
                the model (404).
        """
        seeds = check_seeds(batch, seeds, self.sampling.seed)
        if admissible is not None and len(admissible) != len(batch):
            raise ValueError(f"generate: {len(batch)} conversations but {len(admissible)} admissible lists")
        jobs = [(m, self.request_body(m, seed, max_new_tokens, admissible[i] if admissible is not None else None))
                for i, (m, seed) in enumerate(zip(batch, seeds))]
        if not jobs:
            return []
        return self._loop().run(self._generate_all(jobs))

    def settle_constraint(self, required: bool) -> ConstraintProbe:
        """Which form of ``model.structured_output`` the server enforces, asked once at start.

        One tiny request per candidate form (``auto``: every form of :data:`PROBE_FORMS` until
        one is enforced; a configured form: that one, and when it fails the others, to name
        the one that works), each constraining the answer to a single action. The result is
        logged, kept in :attr:`constraint` (the run's metrics) and decides what every later
        request carries: the enforced form, or none. Later calls return the first result.

        Args:
            required: ``agent.decoding=constrained``: a server that enforces no form stops the run.

        Raises:
            BackendConfigError: ``required`` and no form is enforced: the message quotes what
                the server answered to each form and names the options.
        """
        if self.constraint is None:
            self.constraint = self._settle()
        probe = self.constraint
        if required and probe.form == StructuredOutput.none and probe.tried:
            raise BackendConfigError(no_constraint_message(self.base_url, probe))
        return probe

    def _settle(self) -> ConstraintProbe:
        configured = self.configured_output
        if configured == StructuredOutput.none:
            return ConstraintProbe(configured=configured, form=configured, tried=[])
        first = PROBE_FORMS if configured == StructuredOutput.auto else (configured,)
        tried = self._loop().run(self._probe_forms(first))
        if tried[-1].outcome in ("refused", "ignored") and configured != StructuredOutput.auto:
            tried += self._loop().run(self._probe_forms([f for f in PROBE_FORMS if f != configured]))
        probe = settled_probe(configured, tried)
        fallback = probe.fallback
        self._use_form(probe.form)
        for t in tried:
            log.info("%s: structured output %s: %s (%s)", self.url, t.form, t.outcome, t.detail)
        # One line a run always shows (collect and evaluate leave logging at WARNING): which
        # constraint is in force, and what the server did with each form.
        log.warning("%s: %s; probed %s", self.url, fallback or f"actions constrained by model.structured_output="
                    f"{probe.form}", ", ".join(f"{t.form} {t.outcome}" for t in tried))
        return probe

    async def _probe_forms(self, forms: Sequence[str]) -> list[ProbeResult]:
        """Probe ``forms`` in order, up to the first one enforced (or one the server did not answer at all)."""
        self._ensure_client()
        out: list[ProbeResult] = []
        for form in forms:
            out.append(await self._probe(str(form)))
            if out[-1].outcome in ("enforced", "failed"):
                break
        return out

    async def _probe(self, form: str) -> ProbeResult:
        """One request under ``form`` whose constraint admits only :data:`PROBE_ACTION`."""
        body = self.request_body(PROBE_MESSAGES, self.sampling.seed, PROBE_MAX_TOKENS, [PROBE_ACTION], form=form)
        body.update(temperature=0.0, top_p=1.0)  # greedy: an unconstrained model is not lucky by chance
        body.pop("logprobs", None)
        body.pop("top_logprobs", None)
        try:
            # A 500 is the server's answer to the form (llama-cpp-python's validation error), not a hiccup.
            data = await self._request(body, permanent=frozenset({500}))
        except _Failed as exc:  # an HTTP error is the server refusing the form; no answer at all is a failure
            return ProbeResult(form, "refused" if exc.status else "failed", self._scrub(str(exc)))
        gen = parse_chat_response("", data)
        if gen.error:
            return ProbeResult(form, "failed", self._scrub(gen.error))
        outcome, detail = probe_outcome(gen.text)
        return ProbeResult(form, outcome, self._scrub(detail))

    def request_body(self, messages: Messages, seed: int, max_new_tokens: int | None = None,
                     admissible: Sequence[Mapping[str, Any]] | None = None, *, form: str | None = None) -> dict:
        """The request as sent (JSON body): sampling, logprobs, ``model.extra_body``, the constraint
        (``form``, default the one in use)."""
        s = self.sampling
        body: dict[str, Any] = {
            "model": self.api_model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "max_tokens": int(max_new_tokens if max_new_tokens is not None else s.max_new_tokens),
            "seed": int(seed),
        }
        if s.do_sample:
            body.update(temperature=s.temperature, top_p=s.top_p)
        else:
            body.update(temperature=0.0, top_p=1.0)  # greedy
        if self.want_logprobs:  # top_logprobs: llama-cpp-python's server returns none without it
            body.update(logprobs=True, top_logprobs=0)
        body.update(json.loads(json.dumps(self.extra_body)))  # a copy: nested dicts are merged below
        form = self.structured_output if form is None else form
        if admissible is not None and form != StructuredOutput.none:
            for k, v in constraint_fields(form, admissible).items():
                body[k] = {**body[k], **v} if isinstance(body.get(k), dict) and isinstance(v, dict) else v
        return body

    def close(self) -> None:
        """Close the client's connections and stop its event loop (a later call starts new ones)."""
        runner, self._runner = self._runner, None
        if runner is None or runner.pid != os.getpid():
            return
        client, self._client, self._slots = self._client, None, None
        if client is not None:
            try:
                runner.run(client.close())
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        runner.stop()

    def __enter__(self) -> "OpenAIBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the event loop -------------------------------------------------------------

    def _loop(self) -> _LoopThread:
        with self._lock:
            if self._runner is None or self._runner.pid != os.getpid():  # first call, or a forked child
                self._runner, self._client, self._slots = _LoopThread(), None, None
                weakref.finalize(self, self._runner.stop)  # a backend dropped without close(): no idle thread
            return self._runner

    def _ensure_client(self) -> None:
        """The client and its slots, made on the loop's thread on first use."""
        if self._client is None:
            openai = _openai()
            # api_key given explicitly (never the client's OPENAI_API_KEY fallback); without
            # a key the Authorization header is left out of every request (_send).
            self._client = openai.AsyncOpenAI(api_key=self._secret or "unused", base_url=self._endpoint,
                                              max_retries=0, timeout=self.timeout_s)
            self._slots = asyncio.Semaphore(self.max_concurrency)

    async def _generate_all(self, jobs: list[tuple[Messages, dict]]) -> list[Generation]:
        self._ensure_client()
        results = await asyncio.gather(*(self._one(m, body) for m, body in jobs), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    async def _one(self, messages: Messages, body: dict) -> Generation:
        prompt = plain_prompt(messages)
        key = self.cache.key(body) if self.cache is not None else None
        if key is not None:
            cached = self.cache.get(key)  # type: ignore[union-attr]
            if cached is not None:
                gen = parse_chat_response(prompt, cached, logprobs_requested=self.want_logprobs)
                if not gen.error:
                    self._note_tensors(gen)
                    return gen
        try:
            data = await self._request(body)
        except _Failed as exc:
            return Generation.failed(prompt, self._scrub(str(exc)))
        gen = parse_chat_response(prompt, data, logprobs_requested=self.want_logprobs)
        if gen.error:  # server-provided text: scrub the key before it is recorded
            gen.error = self._scrub(gen.error)
            return gen
        self._note_tensors(gen)
        if key is not None:
            self.cache.put(key, body, data)  # type: ignore[union-attr]
        return gen

    def _note_tensors(self, gen: Generation) -> None:
        """Log once per reason why turns come without tensors (the rows record it per turn)."""
        _, _, reason = gen.tracking_method.partition(":")
        if reason and reason not in self._warned:
            self._warned.add(reason)
            log.warning("%s: %s; token tensors are skipped (turns record tracking_method=%r)", self.url,
                        NO_TENSOR_REASONS.get(reason, reason), gen.tracking_method)

    # -- one request, with retries --------------------------------------------------

    async def _send(self, body: dict) -> bytes:
        openai = _openai()
        kwargs = {k: body[k] for k in _CLIENT_FIELDS if k in body}
        extra = {k: v for k, v in body.items() if k not in _CLIENT_FIELDS}
        headers = None if self._secret else {"Authorization": openai.omit}
        raw = await self._client.chat.completions.with_raw_response.create(
            **kwargs, extra_body=extra or None, extra_headers=headers, timeout=self.timeout_s)
        return raw.content

    async def _request(self, body: dict, permanent: frozenset[int] = frozenset()) -> dict:
        """The response JSON of ``body``; transient failures retried with exponential backoff
        (``permanent``: statuses not retried here although they usually are).

        Raises:
            _Failed: a permanent failure, or the retries ran out (the message says which).
            BackendConfigError: HTTP 401/403/404.
        """
        openai = _openai()
        attempts = self.max_retries + 1
        last, last_status = "", None  # the last failure, and its HTTP status when the server answered
        for attempt in range(attempts):
            delay, last_status = self.backoff_s * (2 ** attempt), None
            try:
                async with self._slots:  # type: ignore[union-attr]
                    self.requests_sent += 1
                    raw = await asyncio.wait_for(self._send(body), self.timeout_s)
                try:
                    data = json.loads(raw)
                    if isinstance(data, dict):
                        return data
                    last = self._scrub(f"response is not a JSON object: {raw[:120]!r}")
                except ValueError:
                    last = self._scrub(f"response is not JSON: {raw[:120]!r}")
            except (TimeoutError, openai.APITimeoutError):
                last = f"timed out after {self.timeout_s:g}s"
            except openai.APIStatusError as exc:
                status, detail = exc.status_code, self._detail(exc.response)
                await self._raise_config_error(status, detail)
                if status in (400, 413, 422) and _context_too_long(detail):
                    raise _Failed(f"context too long: POST {self.url}: HTTP {status}: {detail} (shorten the prompt "
                                  f"or lower sampling.max_new_tokens={body.get('max_tokens')})", status) from None
                if status in permanent or (status not in RETRY_STATUS and status < 500):
                    raise _Failed(f"POST {self.url}: HTTP {status}: {detail}", status) from None
                last, last_status = f"HTTP {status}: {detail}", status
                retry_after = _retry_after(exc.response)
                if retry_after is not None:
                    delay = max(delay, min(retry_after, MAX_RETRY_AFTER_S))
            except openai.APIConnectionError as exc:
                cause = exc.__cause__
                why = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
                last = self._scrub(f"connection failed: {why}")
            if attempt + 1 < attempts:
                log.warning("POST %s: %s (attempt %d/%d, retrying in %.2fs)", self.url, last, attempt + 1, attempts,
                            delay)
                await _sleep(delay)
        raise _Failed(f"POST {self.url} failed after {attempts} attempts: {last}", last_status)

    async def _raise_config_error(self, status: int, detail: str) -> None:
        """401/403/404: the same for every request: stop the run with what to fix."""
        if status == 401:  # no server text: an auth error may quote part of the key
            why = (f"the key in the environment variable {self.key_env} was refused" if self._secret else
                   f"the environment variable {self.key_env} (model.api_key_env) is not set")
            raise BackendConfigError(f"authentication failed: POST {self.url}: HTTP 401: {why}")
        if status == 403:
            raise BackendConfigError(f"permission denied: POST {self.url}: HTTP 403: {detail} (the key in "
                                     f"{self.key_env} may not use model {self.api_model!r})")
        if status == 404:
            served = await self._served_models()
            if served is not None and self.api_model not in served:
                raise BackendConfigError(
                    f"unknown model: {self.base_url} does not serve model.api_model={self.api_model!r} "
                    f"(HTTP 404: {detail}); it serves: {', '.join(served[:20]) or 'no model'}")
            raise BackendConfigError(
                f"unknown model or endpoint: POST {self.url}: HTTP 404: {detail} (check model.api_model="
                f"{self.api_model!r} and that model.base_url ends where /chat/completions is served, usually /v1)")

    async def _served_models(self) -> list[str] | None:
        """The ids ``GET {base_url}/models`` lists, or None when it cannot be read."""
        headers = None if self._secret else {"Authorization": _openai().omit}
        try:
            raw = await asyncio.wait_for(self._client.models.with_raw_response.list(extra_headers=headers),
                                         min(self.timeout_s, 10.0))
            data = json.loads(raw.content)
            return [str(m["id"]) for m in data["data"]]
        except Exception:  # noqa: BLE001 - a listing is only a hint for the message
            return None

    def _detail(self, response: Any) -> str:
        """The server's error message (``error.message``, ``message``, ``detail``), scrubbed, short."""
        try:
            text = response.text
        except Exception:  # noqa: BLE001 - a body that cannot be read says nothing
            return ""
        msg: Any = text
        try:
            data = json.loads(text)
            if isinstance(data, dict):
                err = data.get("error")
                msg = (err.get("message") if isinstance(err, dict) else err) or data.get("message") \
                    or data.get("detail") or text
        except ValueError:
            pass
        msg = msg if isinstance(msg, str) else json.dumps(msg)
        return self._scrub(" ".join(msg.split())[:300])

    def _scrub(self, text: str) -> str:
        """Server-provided text with the API key's value and the URL's credentials replaced by ``***``."""
        text = redact_url(text)
        for secret in (self._secret, *self._url_secrets):
            if secret:
                text = text.replace(secret, "***")
        return text


def _context_too_long(detail: str) -> bool:
    return bool(_CONTEXT_RE.search(detail)) or "context_length_exceeded" in detail


def _retry_after(response: Any) -> float | None:
    value = (response.headers.get("retry-after") or "").strip() if response is not None else ""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def _plain(value: Any) -> dict:
    """``model.extra_body`` as a plain dict (request fields)."""
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)  # type: ignore[return-value]
    return dict(value)


# ----------------------------------------------------------------------------- responses


def parse_chat_response(prompt: str, data: dict, *, logprobs_requested: bool = False) -> Generation:
    """A chat-completions response as a :class:`Generation` (tokens tracked when returned).

    With ``logprobs.content`` the returned tokens are fed to the tracker one by one (their
    ``bytes`` decoded incrementally as UTF-8, ids parsed from vLLM's ``token_id:<n>``
    form); without them only the action text is located (``tracking_method="none"``, with
    ``:no_logprobs`` when they were asked for). See the module docstring for the reasons a
    turn carries no tensors.
    """
    try:
        choice = data["choices"][0]
        content = choice["message"].get("content") or ""
        if not isinstance(content, str):
            raise TypeError(type(content).__name__)
    except (KeyError, IndexError, TypeError, AttributeError):
        return Generation.failed(prompt, f"unexpected response shape: {json.dumps(data)[:200]}")
    usage = data.get("usage") or {}
    finish = choice.get("finish_reason")
    stop_reason = "max_new_tokens" if finish == "length" else "eos"
    items = ((choice.get("logprobs") or {}).get("content")) or []
    turn, reason = _track_api_tokens(items, content, stop_reason)
    if turn is None:  # no usable token data: find the action in the text only
        turn = _text_only_turn(items, content, stop_reason)
        if reason is None and logprobs_requested:
            reason = NO_LOGPROBS
    gen = Generation.from_turn(prompt, int(usage.get("prompt_tokens") or 0), turn)
    gen.generated_tokens = int(usage.get("completion_tokens") or turn.num_tokens)
    if reason:
        gen.tracking_method = f"{turn.tracking_method}:{reason}"
    return gen


def _text_only_turn(items: list, content: str, stop_reason: str) -> TrackedTurn:
    """The turn of a response without usable token data: the action located in the text only
    (by the tracker's rules: stream, else fallback search)."""
    return TrackedTurn(generated_ids=None, action_token_mask=None, action_token_start_index=None,  # type: ignore[arg-type]
                       action_token_end_index=None, tracking_method="none", stop_reason=stop_reason,
                       text=content, action_text=action_text_from_text(content),
                       logprobs=[float(it["logprob"]) for it in items] if items else None, num_tokens=0)


def _track_api_tokens(items: list, content: str, stop_reason: str) -> tuple[TrackedTurn | None, str | None]:
    """``(turn, why no tensors)``: the turn tracked over the returned tokens (None when they
    cannot be used) and the reason its tensors cannot be written (None when they can)."""
    if not items:
        return None, None
    stream = ActionStream(None)
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    ids_known = True
    for it in items:
        if not isinstance(it, Mapping):
            return None, TOKENS_MISMATCH
        token = str(it.get("token", ""))
        tid = None
        if token.startswith("token_id:") and token[9:].lstrip("-").isdigit():
            tid = int(token[9:])
        else:
            ids_known = False
        try:
            if it.get("bytes") is not None:
                piece = utf8.decode(bytes(it["bytes"]))
            elif tid is None:
                piece = token
            else:
                return None, TOKENS_MISMATCH  # an id without its text: cannot place the action
            lp = it.get("logprob")
            lp = float(lp) if lp is not None else None
        except (TypeError, ValueError):  # malformed token data: the text alone is trusted
            return None, TOKENS_MISMATCH
        stream.push(tid, piece=piece, logprob=lp)
    tail = utf8.decode(b"", final=True)
    if tail:
        stream.tracker.extend_last(tail)
    if stream.tracker.text != content:  # tokens do not spell the content: do not trust them
        return None, TOKENS_MISMATCH
    turn = stream.finish(stop_reason)
    if not ids_known:
        turn.generated_ids = None  # type: ignore[assignment]
        return turn, NO_TOKEN_IDS
    return turn, None
