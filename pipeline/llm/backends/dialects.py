"""The structured-output dialects of OpenAI-compatible servers, and the probe that finds one.

Constrained actions (``model.structured_output``; the server enforces them), one form per
server dialect:

- ``json_schema``: ``response_format={"type": "json_schema", "json_schema": {"schema": ...}}``
  whose ``action``, ``target`` (and ``receptacle`` / ``key`` where an admissible action has
  one) are enums of the admissible values (OpenAI, vLLM, SGLang, Ollama's ``/v1``, which
  turns it into its ``format``, and llama.cpp's C++ ``llama-server``). Per field: a verb can
  meet a target it is not admissible with (the turn is then an inadmissible action);
- ``json_object``: ``response_format={"type": "json_object", "schema": ...}``, llama.cpp's
  dialect (llama-cpp-python's server takes ``type`` only as ``text`` or ``json_object``;
  ``llama-server`` takes both), with a schema that admits exactly the admissible actions
  (an ``enum`` of their objects: no verb meets a target it is not admissible with);
- ``grammar``: a GBNF ``grammar`` whose root is an alternation of the exact JSON text of each
  admissible action (llama-cpp-python's server, ``llama-server``);
- ``choice``: vLLM >= 0.12 ``structured_outputs={"choice": [...]}``, those exact texts;
  ``guided_choice``: the same for vLLM < 0.12 (``guided_choice``);
- ``regex``: SGLang's ``regex``, an alternation of those exact texts;
- ``auto``: the first form the server enforces, those that admit exactly the admissible
  actions first (:data:`PROBE_FORMS`), found by :meth:`OpenAIBackend.settle_constraint
  <pipeline.llm.backends.openai.OpenAIBackend.settle_constraint>`.

Whether a server takes a form is asked, not assumed: the ``llm`` agent calls
:meth:`OpenAIBackend.settle_constraint` once at start (``agent.decoding`` ``auto`` or
``constrained``), which sends one tiny request per candidate form whose constraint admits
exactly one answer. A form is *enforced* when the answer is that one; *refused* when the
server answers an error (llama-cpp-python: HTTP 500 ``literal_error``), *ignored* when it
answers something else (``transformers serve``; Ollama's ``/v1`` for fields it does not
know). With no enforced form ``agent.decoding=constrained`` stops the run there, quoting the
server; ``auto`` goes on free and says so (``structured_output`` in the run's metrics).

Request fields::

    constraint_fields("grammar", admissible)  # {"grammar": 'root ::= "{\\"action\\": ..." | ...'}

The client (:mod:`pipeline.llm.backends.openai`) sends the probe's requests; this module
says what they carry (:func:`constraint_fields` over :data:`PROBE_ACTION`), what an answer
means (:func:`probe_outcome`) and which form is then in force (:func:`settled_probe`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from pipeline.core.conf_schema import StructuredOutput
from pipeline.core.schemas import clean_action
from pipeline.llm.backends.base import BackendError, ConstraintProbe, ProbeResult

# The start-up probe (settle_constraint): forms in the order `auto` tries them, those that
# admit exactly the admissible actions first (llama.cpp's json_object and grammar, vLLM's
# choice lists, SGLang's regex), then json_schema's per-field enums (OpenAI, Ollama); and
# one request whose constraint admits a single answer that no unconstrained model would write.
PROBE_FORMS = (StructuredOutput.json_object, StructuredOutput.grammar, StructuredOutput.choice,
               StructuredOutput.guided_choice, StructuredOutput.regex, StructuredOutput.json_schema)
PROBE_ACTION = {"action": "probe", "target": "Probe_0"}
PROBE_MESSAGES = [{"role": "user", "content": 'Answer with one JSON action, {"action": ..., "target": ...}.'}]
PROBE_MAX_TOKENS = 48


def action_choices(admissible: Sequence[Mapping[str, Any]]) -> list[str]:
    """The exact JSON text of each admissible action, as the agent's prompt shows the format
    (``{"action": "open", "target": "Fridge_0"}``), in the given order, without repeats."""
    out: list[str] = []
    for a in admissible:
        if not a.get("action"):
            continue
        text = json.dumps(clean_action(a), ensure_ascii=False)
        if text not in out:
            out.append(text)
    return out


def action_schema(admissible: Sequence[Mapping[str, Any]]) -> dict:
    """A JSON schema whose ``action``, ``target`` (and ``receptacle`` / ``key`` where one is
    used) are enums of the admissible values; every field required (null where an action
    has none), nothing else allowed: what OpenAI's strict mode accepts."""
    acts = [clean_action(a) for a in admissible if a.get("action")]
    props: dict[str, Any] = {"action": {"type": "string", "enum": _unique(str(a["action"]) for a in acts)}}
    for k in ("target", "receptacle", "key"):
        if k != "target" and not any(a.get(k) is not None for a in acts):
            continue
        values = _unique(str(a[k]) for a in acts if a.get(k) is not None)
        nullable = any(a.get(k) is None for a in acts)
        if values and nullable:
            props[k] = {"type": ["string", "null"], "enum": [*values, None]}
        elif values:
            props[k] = {"type": "string", "enum": values}
        else:
            props[k] = {"type": "null"}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def action_enum_schema(admissible: Sequence[Mapping[str, Any]]) -> dict:
    """A JSON schema that admits exactly the admissible actions: an ``enum`` of their objects
    (llama.cpp's grammar converter writes each as a literal). Not for OpenAI's strict mode,
    whose root must be an object with properties: :func:`action_schema` is for that."""
    return {"enum": [json.loads(c) for c in action_choices(admissible)]}


def action_grammar(admissible: Sequence[Mapping[str, Any]]) -> str:
    """A GBNF grammar (llama.cpp's) whose ``root`` is an alternation of :func:`action_choices`."""
    return "root ::= " + " | ".join(_gbnf_literal(c) for c in action_choices(admissible))


def _regex_literal(text: str) -> str:
    """``text`` as a regex matching itself, escaping only regex syntax (``re.escape`` also escapes
    spaces, an escape not every server's regex engine takes)."""
    return re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\1", text)


def _gbnf_literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def constraint_fields(mode: str, admissible: Sequence[Mapping[str, Any]]) -> dict:
    """The request fields that constrain the answer to ``admissible`` (``model.structured_output``)."""
    if mode == "none" or not any(a.get("action") for a in admissible):
        return {}
    if mode == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": "household_action", "strict": True, "schema": action_schema(admissible)}}}
    if mode == "json_object":
        return {"response_format": {"type": "json_object", "schema": action_enum_schema(admissible)}}
    if mode == "grammar":
        return {"grammar": action_grammar(admissible)}
    choices = action_choices(admissible)
    if mode == "choice":
        return {"structured_outputs": {"choice": choices}}
    if mode == "guided_choice":
        return {"guided_choice": choices}
    if mode == "regex":
        return {"regex": "|".join(_regex_literal(c) for c in choices)}
    raise BackendError(f"model.structured_output={mode!r}: expected one of {' | '.join(StructuredOutput)}")


def _unique(values: Any) -> list:
    return list(dict.fromkeys(values))


def no_constraint_message(base_url: str, probe: ConstraintProbe) -> str:
    """Why ``agent.decoding=constrained`` cannot run against this server, in its own words, and what can."""
    answers = "; ".join(f"{t.form}: {t.outcome}: {t.detail}" for t in probe.tried)
    enforced = [t.form for t in probe.tried if t.outcome == "enforced"]
    options = [f"model.structured_output={enforced[0]} (this server enforces it)"] if enforced else []
    options += ["agent.decoding=free (or auto: free here, said in the metrics)",
                "a server that constrains (docs/serving.md: constrained actions by server)"]
    what = ("enforces no form of model.structured_output=auto" if probe.configured == StructuredOutput.auto
            else f"does not enforce model.structured_output={probe.configured}")
    return f"agent.decoding=constrained: {base_url} {what} ({answers}). Options: {'; '.join(options)}"


# ----------------------------------------------------------------------------- the probe


def probe_outcome(text: str) -> tuple[str, str]:
    """What a probe's answer ``text`` says of its form: ``("enforced" | "ignored", detail)``
    (enforced: the answer is :data:`PROBE_ACTION`, the only one its constraint admits)."""
    answer = " ".join(text.split())[:160]
    try:
        ok = json.loads(text) == PROBE_ACTION
    except ValueError:
        ok = False
    return "enforced" if ok else "ignored", f"answered {answer!r}"


def settled_probe(configured: str, tried: list[ProbeResult]) -> ConstraintProbe:
    """The form in force after probing ``tried`` for ``model.structured_output=configured``:
    the configured form when enforced, under ``auto`` the first enforced, else none (free,
    with the reason in ``fallback``)."""
    enforced = [t.form for t in tried if t.outcome == "enforced"]
    if configured in enforced:
        form = configured
    elif configured == StructuredOutput.auto and enforced:
        form = enforced[0]
    else:
        form = StructuredOutput.none
    fallback = None
    if form == StructuredOutput.none:
        fallback = (f"the server does not enforce model.structured_output={configured}"
                    + (f" (it enforces {', '.join(enforced)})" if enforced else "") + ": actions are free")
    return ConstraintProbe(configured=configured, form=str(form), tried=tried, fallback=fallback)
