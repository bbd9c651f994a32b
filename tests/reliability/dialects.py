"""Stub servers on 127.0.0.1 that speak the dialects of the servers researchers run.

Each checks a chat-completions request the way the real server does (its request model,
its status code and error body) and answers as a model under the constraint the request
carries: what the "model" wants to say (``answer``) when the constraint allows it, else the
first answer the constraint allows; a request without a constraint it takes gets ``answer``
as it is. Sources of each behaviour:

- ``llama_cpp_python``: llama-cpp-python's server (``llama_cpp/server/types.py``:
  ``CreateChatCompletionRequest``; ``llama_types.py``: ``response_format.type`` is
  ``Literal["text", "json_object"]`` with an optional ``schema``; ``grammar`` a GBNF
  string). A request that fails validation is caught by its ``RouteErrorHandler``
  (``server/errors.py``) and answered HTTP 500 ``{"error": {"message": str(exc), "type":
  "internal_server_error", ...}}``, ``str(exc)`` being FastAPI's ``RequestValidationError``
  text (``1 validation error:`` then each error dict, then the route): the ``literal_error``
  a user sees. Unknown fields are ignored. Logprobs come only with ``top_logprobs`` set
  (``logprobs=top_logprobs if logprobs else None`` in its chat handler), each token's text
  with ``bytes: null``. A grammar that does not parse kills the server process (llama.cpp's
  ``llama_sampler_init_grammar`` returns NULL; 0.3.36): the connection drops, and so does
  every later one. Checked against the real server 0.3.36 by
  ``tests/test_openai_backend.py::test_the_llama_cpp_python_stub_answers_as_the_real_server``.
- ``ollama``: Ollama's OpenAI-compatible ``/v1`` (``openai/openai.go``: ``FromChatRequest``):
  ``response_format`` ``json_schema`` becomes its ``format`` (the schema, enforced),
  ``json_object`` becomes ``format: "json"`` (any JSON: a schema beside it is dropped), any
  other type nothing; unknown fields (``format``, ``grammar``, ``regex``, ...) are ignored by
  Go's JSON decoding; a field of the wrong JSON type is HTTP 400 ``json: cannot unmarshal``.
- ``sglang``: SGLang's ``ChatCompletionRequest`` (``entrypoints/openai/protocol.py``):
  ``response_format.type`` in ``text | json_object | json_schema`` (``json_schema.name``
  required), ``regex`` / ``ebnf`` / ``json_schema`` top-level; a validation error is HTTP
  400 ``{"object": "error", "type": "BadRequest", "code": 400, "message": ...}``; only one of
  regex, json_schema and ebnf at a time.
- ``vllm``: vLLM's OpenAI server as this project uses it: ``response_format`` ``json_schema``
  or ``json_object``, ``structured_outputs={"choice": [...]}`` (>= 0.12; its other keys, such
  as ``backend``, pass) and the older ``guided_choice``; a validation error is HTTP 400
  ``{"object": "error", "type": "BadRequestError", ...}``; unknown fields are ignored.

``server.rejected`` lists ``(status, message)`` of every request refused.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Literal, Optional

from pydantic import BaseModel, Field, ValidationError
from typing_extensions import NotRequired, TypedDict

from .helpers import ANSWER, FakeOpenAI

DIALECTS = ("llama_cpp_python", "ollama", "sglang", "vllm")


# --------------------------------------------------------------------------- request models


class _LlamaResponseFormat(TypedDict):  # llama_cpp/llama_types.py: ChatCompletionRequestResponseFormat
    type: Literal["text", "json_object"]
    schema: NotRequired[Any]


class _LlamaRequest(BaseModel):  # llama_cpp/server/types.py: CreateChatCompletionRequest (fields the backend sends)
    messages: List[Dict[str, Any]] = []
    max_tokens: Optional[int] = None
    logprobs: Optional[bool] = False
    temperature: float = 0.8
    top_p: float = Field(default=0.95, ge=0.0, le=1.0)
    top_logprobs: Optional[int] = Field(default=None, ge=0)
    seed: Optional[int] = None
    response_format: Optional[_LlamaResponseFormat] = None
    model: Optional[str] = None
    grammar: Optional[str] = None


# FastAPI's RequestValidationError text ends with the route it failed in (llama-cpp-python 0.3.36).
_LLAMA_ROUTE = ('\n  File "{site}/llama_cpp/server/app.py", line 376, in create_chat_completion\n'
                '    POST /v1/chat/completions')


class _SglJsonSchema(BaseModel):
    name: str
    description: Optional[str] = None
    schema_: Optional[Dict[str, object]] = Field(alias="schema", default=None)
    strict: Optional[bool] = None


class _SglResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[_SglJsonSchema] = None


class _SglRequest(BaseModel):  # sglang/srt/entrypoints/openai/protocol.py: ChatCompletionRequest (the same fields)
    messages: List[Dict[str, Any]]
    model: str = "default"
    max_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    response_format: Optional[_SglResponseFormat] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    json_schema: Optional[str] = None


class _VllmStructuredOutputs(BaseModel):
    choice: Optional[List[str]] = None
    backend: Optional[str] = None


class _VllmRequest(BaseModel):  # vllm/entrypoints/openai/protocol.py: ChatCompletionRequest (the same fields)
    messages: List[Dict[str, Any]]
    model: Optional[str] = None
    max_tokens: Optional[int] = None
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = 0
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    response_format: Optional[_SglResponseFormat] = None
    structured_outputs: Optional[_VllmStructuredOutputs] = None
    guided_choice: Optional[List[str]] = None


# Go's json.Unmarshal into Ollama's ChatCompletionRequest: the JSON type each field must have.
_OLLAMA_TYPES = {"model": (str,), "messages": (list,), "max_tokens": (int,), "seed": (int,),
                 "temperature": (int, float), "top_p": (int, float), "logprobs": (bool,),
                 "top_logprobs": (int,), "response_format": (dict,)}
_GO_TYPE = {str: "string", list: "array", dict: "object", bool: "bool", int: "number", float: "number"}


# --------------------------------------------------------------------------- constraints


def _json_part(text: str) -> Any:
    """The JSON object a free answer ends with (what a JSON-only format makes the model write)."""
    start = text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        return None


def _under_schema(schema: dict, wanted: Any) -> str:
    """The wanted object where the schema allows it: a root ``enum`` whole, else each property's
    enum; otherwise the enum's first value."""
    if "enum" in schema:
        return json.dumps(wanted if wanted in schema["enum"] else schema["enum"][0])
    wanted = wanted if isinstance(wanted, dict) else {}
    out = {}
    for k, spec in (schema.get("properties") or {}).items():
        enum = spec.get("enum")
        out[k] = wanted.get(k) if enum is None or wanted.get(k) in enum else enum[0]
    return json.dumps(out)


def _gbnf_alternatives(grammar: str) -> list[str] | None:
    """The literals of ``root ::= "..." | "..."`` (None: not a grammar of literals)."""
    lit = r'"((?:[^"\\]|\\.)*)"'
    if not re.fullmatch(rf"root ::= {lit}( \| {lit})*\s*", grammar):
        return None
    return [re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m.group(1), m.group(1)), a)
            for a in re.findall(lit, grammar)]


def _regex_alternatives(regex: str) -> list[str]:
    return [re.sub(r"\\(.)", r"\1", a) for a in re.split(r"(?<!\\)\|", regex)]


def _among(alternatives: list[str], wanted: str) -> str:
    obj = _json_part(wanted)
    text = json.dumps(obj) if obj is not None else wanted
    return text if text in alternatives else alternatives[0]


class DialectServer(FakeOpenAI):
    """A :class:`FakeOpenAI` that checks requests as ``dialect`` does and answers under their constraint.

    Example:
        with DialectServer("llama_cpp_python") as server:
            cfg.model.base_url = server.url
    """

    def __init__(self, dialect: str, *, answer: str = ANSWER, site: str = "/venv/lib/python3.11/site-packages",
                 **kw: Any):
        if dialect not in DIALECTS:
            raise ValueError(f"DialectServer: unknown dialect {dialect!r}")
        super().__init__(answer=answer, **kw)
        self.dialect = dialect
        self.site = site  # where the server's package lies (llama-cpp-python quotes its path in errors)
        self.rejected: list[tuple[int, str]] = []
        self.answers: list[str] = []
        self.crashed: str | None = None  # why the server process "died": every later connection drops

    def respond(self, h, mode: str) -> None:
        if mode != "ok":
            return super().respond(h, mode)
        if self.crashed is None:
            status, payload = getattr(self, f"_{self.dialect}")(h.json_body)
            if status == 0:
                self.crashed = payload
        if self.crashed is not None:
            h.close_connection = True  # nothing sent: the client sees the connection drop
            return
        if status != 200:
            with self._lock:
                self.rejected.append((status, json.dumps(payload)))
            data = json.dumps(payload).encode()
        else:
            text, token_items = payload if isinstance(payload, tuple) else (payload, None)
            with self._lock:
                self.answers.append(text)
            data = self.completion_of(text, token_items)
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def completion_of(self, content: str, token_items: list | None = None) -> bytes:
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        if token_items is not None:
            choice["logprobs"] = {"content": token_items, "refusal": None}
        return json.dumps({
            "id": "cmpl-1", "object": "chat.completion", "model": "fake", "choices": [choice],
            "usage": {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22}}).encode()

    # -- the dialects: (status, answer text | error body) --------------------------------

    def _llama_cpp_python(self, body: dict) -> tuple[int, Any]:
        try:
            req = _LlamaRequest(**body)
        except ValidationError as exc:  # FastAPI's RequestValidationError, caught by RouteErrorHandler
            errors = [{"type": e["type"], "loc": ("body", *e["loc"]), "msg": e["msg"], "input": e["input"],
                       **({"ctx": e["ctx"]} if "ctx" in e else {})} for e in exc.errors()]
            text = f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:\n"
            text += "".join(f"  {e}\n" for e in errors) + _LLAMA_ROUTE.format(site=self.site)
            return 500, {"error": {"message": text, "type": "internal_server_error", "param": None, "code": None}}
        rf = req.response_format
        if rf is not None and rf["type"] == "json_object":  # a grammar from the schema, or any JSON
            text = (_under_schema(rf["schema"], _json_part(self.answer)) if rf.get("schema")
                    else json.dumps(_json_part(self.answer)))
        elif req.grammar is not None:
            alternatives = _gbnf_alternatives(req.grammar)
            if alternatives is None:  # llama.cpp: "failed to parse grammar", then the process is gone
                return 0, f"failed to parse grammar: {req.grammar[:80]!r}"
            text = _among(alternatives, self.answer)
        else:
            text = self.answer
        if not (req.logprobs and req.top_logprobs is not None):
            return 200, text
        tokens = re.findall(r"\w+|\s+|[^\w\s]", text)  # each token's text, bytes null; the top-k lists
        items = [{"token": t, "logprob": -0.5, "bytes": None,  # hold the chosen token (and k more)
                  "top_logprobs": [{"token": t, "logprob": -0.5, "bytes": None}]} for t in tokens]
        return 200, (text, items)

    def _ollama(self, body: dict) -> tuple[int, Any]:
        for k, types in _OLLAMA_TYPES.items():
            v = body.get(k)
            if v is not None and (not isinstance(v, types) or isinstance(v, bool) and bool not in types):
                return 400, {"error": {"message": f"json: cannot unmarshal {_GO_TYPE.get(type(v), 'value')} into Go "
                                                  f"struct field ChatCompletionRequest.{k} of type "
                                                  f"{'openai.ResponseFormat' if k == 'response_format' else 'any'}",
                                       "type": "invalid_request_error", "param": None, "code": None}}
        rf = body.get("response_format") or {}
        kind = str(rf.get("type") or "").strip().lower()
        if kind == "json_schema" and isinstance(rf.get("json_schema"), dict):
            return 200, _under_schema(rf["json_schema"].get("schema") or {}, _json_part(self.answer))
        if kind == "json_object":  # format "json": any JSON, whatever schema came with it
            return 200, json.dumps(_json_part(self.answer))
        return 200, self.answer

    def _sglang(self, body: dict) -> tuple[int, Any]:
        def bad(message: str) -> tuple[int, Any]:
            return 400, {"object": "error", "message": message, "type": "BadRequest", "param": None, "code": 400}

        try:
            req = _SglRequest(**body)
        except ValidationError as exc:
            return bad(f"{exc} {exc.errors(include_url=False)}")
        rf = req.response_format
        schema = rf.json_schema.schema_ if rf is not None and rf.type == "json_schema" and rf.json_schema else None
        if sum(x is not None for x in (req.regex, req.ebnf, req.json_schema, schema)) > 1:
            return bad("Only one of regex, json_schema, or EBNF can be set.")
        if schema is not None:
            return 200, _under_schema(schema, _json_part(self.answer))
        if req.regex is not None:
            try:
                pattern = re.compile(req.regex)
            except re.error as exc:
                return bad(f"Invalid regex: {exc}")
            text = _among(_regex_alternatives(req.regex), self.answer)
            return (200, text) if pattern.fullmatch(text) else bad(f"regex {req.regex!r} is not an alternation")
        if rf is not None and rf.type == "json_object":
            return 200, json.dumps(_json_part(self.answer))
        return 200, self.answer

    def _vllm(self, body: dict) -> tuple[int, Any]:
        try:
            req = _VllmRequest(**body)
        except ValidationError as exc:
            return 400, {"object": "error", "message": str(exc), "type": "BadRequestError", "param": None,
                         "code": 400}
        rf = req.response_format
        if rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
            return 200, _under_schema(rf.json_schema.schema_ or {}, _json_part(self.answer))
        choices = (req.structured_outputs.choice if req.structured_outputs else None) or req.guided_choice
        if choices:
            return 200, _among(choices, self.answer)
        if rf is not None and rf.type == "json_object":
            return 200, json.dumps(_json_part(self.answer))
        return 200, self.answer
