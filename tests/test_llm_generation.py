"""Generation backends and the ``llm`` agent on a tiny local model.

A byte-level BPE tokenizer and a 2-layer GPT-2 are built here and fitted for a few seconds
to answer five observations with a reasoning line, a JSON action and a tail of extra words
(so early stop has something to save); the directory is saved with ``save_pretrained`` and
loaded through the backend like a user's model. The OpenAI-compatible backend is tested
against a real HTTP server on 127.0.0.1 that serves the same model.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from pipeline.agents.base import AgentStep
from pipeline.agents.llm import SharedBackend
from pipeline.core.conf_schema import SamplingConfig
from pipeline.core.config import section
from pipeline.llm.backends import (
    BackendError,
    Generation,
    make_backend,
    make_text_generator,
    plain_prompt,
    render_prompt,
)
from pipeline.llm.backends.openai import OpenAIBackend
from pipeline.llm.backends.transformers import TransformersBackend
from pipeline.llm.tensors import (
    check_consistency,
    check_turn_consistency,
    load_episode_tensors,
    save_episode_tensors,
)
from pipeline.llm.tiny import CHAT_TEMPLATE, fit, save_model_dir, tiny_gpt2, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = "Goal: $objective\nAt: $agent_location\nNotes: $memory[notes]\n"
TAIL = " and then more."


def _obs(room: str, objective: str, actions: list[tuple[str, str | None, str]]) -> dict:
    adm = [{"action": a, "target": t, "command": c} for a, t, c in actions]
    return {
        "scene": "s0", "agent_location": room, "agent_inventory": [], "objective": objective,
        "visible_entities": sorted({t for _, t, _ in actions if t and "_" in t}),
        "available_actions": sorted({a for a, _, _ in actions} | {"wait"}),
        "description": f"You are in the {room}.", "admissible_commands": [c for _, _, c in actions],
        "admissible_actions": adm, "step": 0, "max_steps": 10,
    }


KITCHEN = [("pick_up", "Apple_2", "take Apple_2"), ("open", "Fridge_0", "open Fridge_0"),
           ("go_to", "Bedroom", "go east"), ("look", None, "look")]
BEDROOM = [("open", "Drawer_1", "open Drawer_1"), ("go_to", "Kitchen", "go west"), ("look", None, "look")]

# (episode id, observation, the answer the tiny model learns)
EPISODES = [
    ("ep_a", _obs("Kitchen", "Take Apple_2.", KITCHEN),
     'Take Apple_2.\n{"action": "pick_up", "target": "Apple_2", "memory": {"notes": "got Apple_2"}}' + TAIL),
    ("ep_b", _obs("Bedroom", "Open Drawer_1.", BEDROOM),
     'Open Drawer_1.\n{"action": "open", "target": "Drawer_1"}' + TAIL),
    ("ep_c", _obs("Bedroom", "Go to the Kitchen.", BEDROOM),
     'Go west.\n{"action": "go_to", "target": "west"}' + TAIL),
    ("ep_d", _obs("Kitchen", "Open Fridge_9.", KITCHEN),
     'Open Fridge_9.\n{"action": "open", "target": "Fridge_9"}' + TAIL),
    ("ep_e", _obs("LivingRoom", "Do something.", [("look", None, "look")]),
     "I do not know what to do here" + TAIL),
]


def _meta(eid: str, obs: dict) -> dict:
    return {"episode_id": eid, "objective": obs["objective"], "scene_id": "s0", "seed": 7}


@pytest.fixture(scope="module")
def base_cfg(tmp_path_factory):
    """The real conf/ composed with agent=llm, model=local, sampling=greedy and a tiny template."""
    from pipeline.core.config import compose_text, validate

    cfg = validate(OmegaConf.create(compose_text(ROOT, ["agent=llm", "model=local", "sampling=greedy", "agent.decoding=free"])))
    tpl = tmp_path_factory.mktemp("tpl") / "tiny.txt"
    tpl.write_text(TEMPLATE, encoding="utf-8")
    cfg.prompts.system_template = str(tpl)
    cfg.sampling.max_new_tokens = 48
    return cfg


@pytest.fixture(scope="module")
def lm(base_cfg, tmp_path_factory):
    """A fitted tiny model directory + the config pointing at it."""
    from pipeline.agents.llm import LLMAgent

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is faster and steadier on busy cores
    try:
        stub = NS(generate=None)
        prompts = []
        for eid, obs, _ in EPISODES:
            agent = LLMAgent(base_cfg, seed=1, backend=stub)
            agent.reset(_meta(eid, obs))
            prompts.append(plain_prompt(agent.messages(obs)))
        answers = [a for _, _, a in EPISODES]
        tok = train_tokenizer(prompts + answers, vocab_size=500)
        model = tiny_gpt2(tok, n_layer=2, n_embd=64, n_positions=256)
        losses = fit(model, tok, list(zip(prompts, answers)), steps=150, lr=5e-3)
        assert losses[-1] < losses[0] / 20, losses[-1]
        path = save_model_dir(tmp_path_factory.mktemp("lm") / "model", model, tok)
        cfg = copy.deepcopy(base_cfg)
        cfg.model.name_or_path = str(path)
        backend = make_backend(cfg.model, cfg.sampling)
        yield NS(path=path, cfg=cfg, backend=backend, tok=backend.tokenizer, prompts=prompts, answers=answers)
    finally:
        torch.set_num_threads(threads)


def _agent(lm, eid="ep_a", **kw):
    from pipeline.agents.llm import LLMAgent

    agent = LLMAgent(kw.pop("cfg", lm.cfg), seed=1, backend=kw.pop("backend", lm.backend), **kw)
    for e, o, _ in EPISODES:
        if e == eid:
            agent.reset(_meta(e, o))
    return agent


def _messages(lm):
    out = []
    for eid, obs, _ in EPISODES:
        out.append(_agent(lm, eid).messages(obs))
    return out


# ----------------------------------------------------------------- transformers backend


def test_model_directory_loads_and_reproduces_answers(lm):
    assert isinstance(lm.backend, TransformersBackend)
    assert lm.backend.tokenizer.chat_template is None  # plain prompt path
    gens = lm.backend.generate(_messages(lm), early_stop=False)
    for gen, prompt, answer in zip(gens, lm.prompts, lm.answers):
        assert gen.prompt == prompt and gen.text == answer and gen.stop_reason == "eos"
        assert gen.prompt_tokens == len(lm.tok(prompt)["input_ids"])
        assert gen.generated_tokens == len(gen.generated_ids) == len(gen.action_token_mask) == len(gen.logprobs)
        assert gen.generated_ids[-1] == lm.tok.eos_token_id
        assert all(lp <= 0 for lp in gen.logprobs)


def test_early_stop_generates_fewer_tokens(lm):
    msgs = _messages(lm)
    early = lm.backend.generate(msgs, early_stop=True)
    full = lm.backend.generate(msgs, early_stop=False)
    for e, f in zip(early[:4], full[:4]):
        assert e.stop_reason == "json_closed" and e.tracking_method == "stream"
        assert e.generated_tokens < f.generated_tokens <= lm.cfg.sampling.max_new_tokens
        assert f.generated_ids[: e.generated_tokens] == e.generated_ids  # a prefix: same decoding
        assert e.action_token_end_index == e.generated_tokens  # stopped at the closing token
        assert e.action_text == f.action_text and e.text.endswith(e.action_text)
        check_consistency(lm.tok, {"generated_ids": e.generated_ids, "action_token_mask": e.action_token_mask},
                          e.action_text)
    # No JSON: generation runs to EOS, nothing is masked.
    assert early[4].stop_reason == "eos" and early[4].tracking_method == "none" and not any(early[4].action_token_mask)


def test_json_cut_off_by_max_new_tokens(lm):
    gen = lm.backend.generate(_messages(lm)[:1], max_new_tokens=12)[0]
    assert gen.stop_reason == "max_new_tokens" and gen.generated_tokens == 12
    assert gen.tracking_method == "none" and gen.action_text is None and not any(gen.action_token_mask)


def test_stopping_criteria_with_model_generate(lm):
    from pipeline.llm.stopping import JsonActionStoppingCriteria

    tok, model = lm.tok, lm.backend.model
    texts = lm.prompts[:2]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True)
    crit = JsonActionStoppingCriteria(tok, prompt_length=enc["input_ids"].shape[1], batch_size=2,
                                      eos_token_ids=[tok.eos_token_id])
    out = model.generate(**enc, stopping_criteria=[crit], max_new_tokens=48, do_sample=False,
                         pad_token_id=tok.eos_token_id)
    free = model.generate(**enc, max_new_tokens=48, do_sample=False, pad_token_id=tok.eos_token_id)
    assert out.shape[1] < free.shape[1]  # generate stopped once both actions closed
    turns = crit.finish()
    for turn, answer in zip(turns, lm.answers[:2]):
        assert turn.stop_reason == "json_closed" and turn.action_text in answer
        assert answer.startswith(turn.text)


def test_same_seed_same_output_and_batch_independence(lm):
    """Sampling: each row draws from its own seeded generator, so a prompt's output does not
    depend on the batch it is in (ragged prompts, rows finishing at different steps)."""
    tok = lm.tok
    model = tiny_gpt2(tok, n_layer=2, n_embd=64, n_positions=256, seed=3)  # untrained: diverse outputs
    sampling = section(SamplingConfig, {"do_sample": True, "temperature": 1.3, "top_p": 0.95, "top_k": 40,
                                        "max_new_tokens": 20, "seed": 0, "early_stop": True})
    backend = TransformersBackend(lm.cfg.model, sampling, model=model, tokenizer=tok)
    msgs = _messages(lm)
    seeds = [11, 12, 13, 14, 15]
    batched = backend.generate(msgs, seeds=seeds)
    again = backend.generate(msgs, seeds=seeds)
    alone = [backend.generate([m], seeds=[s])[0] for m, s in zip(msgs, seeds)]
    assert [g.generated_ids for g in batched] == [g.generated_ids for g in again]
    assert [g.generated_ids for g in batched] == [g.generated_ids for g in alone]
    other = backend.generate(msgs, seeds=[s + 100 for s in seeds])
    assert [g.generated_ids for g in other] != [g.generated_ids for g in batched]
    greedy = TransformersBackend(lm.cfg.model, OmegaConf.merge(sampling, {"do_sample": False}), model=model,
                                 tokenizer=tok)
    g1 = greedy.generate(msgs, seeds=seeds)
    g2 = [greedy.generate([m], seeds=[99])[0] for m in msgs]  # greedy ignores the seed
    assert [g.generated_ids for g in g1] == [g.generated_ids for g in g2]


def test_chat_template_path(lm, tmp_path):
    tok = train_tokenizer(lm.prompts + lm.answers, vocab_size=400, chat_template=CHAT_TEMPLATE)
    save_model_dir(tmp_path / "chat", tiny_gpt2(tok, n_positions=256), tok)
    cfg = copy.deepcopy(lm.cfg)
    cfg.model.name_or_path = str(tmp_path / "chat")
    backend = make_backend(cfg.model, cfg.sampling)
    msgs = _messages(lm)[0]
    text, add_special = render_prompt(backend.tokenizer, msgs)
    assert not add_special and text.startswith("<|im_start|>system\nGoal: Take Apple_2.")
    assert text.endswith("<|im_start|>assistant\n")
    gen = backend.generate([msgs], max_new_tokens=5)[0]
    assert gen.prompt == text and gen.generated_tokens == 5 and gen.error is None


def test_bad_model_config_is_a_clear_error(lm, tmp_path):
    cfg = copy.deepcopy(lm.cfg)
    cfg.model.name_or_path = None
    with pytest.raises(BackendError, match="model.name_or_path is null"):
        make_backend(cfg.model, cfg.sampling)
    cfg.model.name_or_path = str(tmp_path / "missing")
    with pytest.raises(BackendError, match="no such model directory"):
        make_backend(cfg.model, cfg.sampling)
    (tmp_path / "empty").mkdir()
    cfg.model.name_or_path = str(tmp_path / "empty")
    with pytest.raises(BackendError, match="cannot load a causal LM"):
        make_backend(cfg.model, cfg.sampling)
    cfg.model.name_or_path = str(lm.path)
    with pytest.raises(ValidationError, match="full_key: model.dtype"):  # a closed set: refused by the schema
        cfg.model.dtype = "float8"
    untyped = OmegaConf.create(OmegaConf.to_container(cfg.model))  # the backend still names it in a plain one
    untyped.dtype = "float8"
    with pytest.raises(BackendError, match="model.dtype='float8'"):
        make_backend(untyped, cfg.sampling)


def test_prompt_longer_than_context_is_a_failed_generation(lm):
    long = [{"role": "user", "content": "Goal " * 400}]
    gens = lm.backend.generate([long, _messages(lm)[1]])
    assert gens[0].error and "context is 256" in gens[0].error and gens[0].stop_reason == "error"
    assert gens[1].error is None and gens[1].stop_reason == "json_closed"


def test_text_generator_for_grounding(lm):
    generate = make_text_generator(lm.cfg, backend=lm.backend)
    assert generate(lm.prompts[1]) == generate(lm.prompts[1])


# ----------------------------------------------------------------- the llm agent


def test_agent_valid_action_with_tracking_extras(lm):
    agent = _agent(lm, "ep_a")
    obs = EPISODES[0][1]
    step = agent.act(obs)
    assert isinstance(step, AgentStep)
    assert step.action == {"action": "pick_up", "target": "Apple_2"}
    assert step.reasoning == "Take Apple_2." and step.generated_text.startswith("Take Apple_2.\n{")
    turn, x = step.model, step.model.generation
    assert turn.action_valid and turn.parse_error is None
    assert x.tracking_method == "stream" and x.stop_reason == "json_closed"
    assert x.prompt.startswith("### System:\nGoal: Take Apple_2.\nAt: Kitchen\nNotes: None")
    assert x.prompt_tokens > 0 and x.generated_tokens == len(x.generated_ids) == len(x.action_token_mask)
    assert x.action_token_end_index == len(x.generated_ids)
    check_consistency(lm.tok, dataclasses.asdict(x), x.action_text)
    # The memory object becomes the memory dict of the next prompt (seed 002).
    assert turn.memory["notes"] == "got Apple_2"
    nxt = agent.messages({**obs, "step": 1})
    assert "Notes: got Apple_2" in nxt[0]["content"]


def test_agent_maps_a_direction_to_the_admissible_room(lm):
    step = _agent(lm, "ep_c").act(EPISODES[2][1])
    assert step.action == {"action": "go_to", "target": "Kitchen"} and step.model.action_valid


def test_agent_inadmissible_and_unparseable_output_take_the_fallback(lm):
    step = _agent(lm, "ep_d").act(EPISODES[3][1])
    assert step.action == {"action": "look", "target": None}  # agent.fallback_action
    assert step.model.action_valid is False and "inadmissible" in step.model.parse_error
    assert '"Fridge_9"' in step.generated_text
    step = _agent(lm, "ep_e").act(EPISODES[4][1])
    assert step.action == {"action": "look", "target": None} and step.model.action_valid is False
    assert step.model.parse_error == "no complete JSON object in the output"
    assert step.generated_text == "I do not know what to do here" + TAIL
    assert step.model.generation.stop_reason == "eos" and step.model.generation.tracking_method == "none"


class ScriptedBackend:
    """A backend stub that returns given outputs (to reach cases the tiny model never writes)."""

    name = "scripted"

    def __init__(self, texts):
        self.texts = list(texts)

    def generate(self, batch, seeds=None, **kw):
        from pipeline.llm.tracker import ActionStream

        out = []
        for _ in batch:
            text = self.texts.pop(0)
            if text is None:
                out.append(Generation.failed("p", "POST http://x failed after 4 attempts: HTTP 503"))
                continue
            stream = ActionStream(None)
            for ch in text:
                stream.push(None, piece=ch)
            out.append(Generation.from_turn("p", 3, stream.finish("max_new_tokens")))
        return out


@pytest.mark.parametrize("text, error", [
    ('Hmm {"target": "Apple_2"}', 'no "action" string'),
    ('Hmm {"action": "open", "target": "Fri', "cut off at max_new_tokens"),
    ('{"action": 3}', 'no "action" string'),
    ("", "no complete JSON object"),
    ('{"action": "fly", "target": "Kitchen"}', "inadmissible"),
])
def test_agent_invalid_outputs_never_crash(lm, text, error):
    agent = _agent(lm, "ep_a", backend=ScriptedBackend([text]))
    step = agent.act(EPISODES[0][1])
    assert step.action == {"action": "look", "target": None}
    assert step.model.action_valid is False and error in step.model.parse_error
    assert step.generated_text == text


def test_agent_wait_and_unique_completion(lm):
    agent = _agent(lm, "ep_a", backend=ScriptedBackend(['{"action": "wait", "target": null}',
                                                        '{"action": "pick up", "target": "apple_2"}']))
    assert agent.act(EPISODES[0][1]).action == {"action": "wait", "target": None}
    assert agent.act(EPISODES[0][1]).action == {"action": "pick_up", "target": "Apple_2"}


def test_agent_backend_error_record_or_fail(lm):
    agent = _agent(lm, "ep_a", backend=ScriptedBackend([None]))
    step = agent.act(EPISODES[0][1])
    assert step.model.generation.stop_reason == "error" and step.model.action_valid is False
    assert step.model.parse_error.startswith("backend error: POST") and step.action["action"] == "look"
    cfg = copy.deepcopy(lm.cfg)
    cfg.agent.on_backend_error = "fail"
    agent = _agent(lm, "ep_a", cfg=cfg, backend=ScriptedBackend([None]))
    with pytest.raises(BackendError, match="episode ep_a turn 0"):
        agent.act(EPISODES[0][1])


def test_batched_and_sequential_agents_agree(lm):
    from pipeline.agents.llm import LLMAgent

    batch = [_agent(lm, eid) for eid, _, _ in EPISODES]
    obs = [o for _, o, _ in EPISODES]
    steps = LLMAgent.act_many(batch, obs)
    seq = [_agent(lm, eid).act(o) for eid, o, _ in EPISODES]
    assert [s.action for s in steps] == [s.action for s in seq]
    assert [s.model.generation.generated_ids for s in steps] == [s.model.generation.generated_ids for s in seq]
    assert [s.model.seed for s in steps] == [s.model.seed for s in seq]
    assert [s.action["action"] for s in steps] == ["pick_up", "open", "go_to", "look", "look"]


def test_make_agent_shares_one_backend(lm):
    from pipeline.agents import make_agent
    from pipeline.agents.llm import LLMAgent

    shared = SharedBackend()
    a = make_agent(lm.cfg, seed=1, shared=shared)
    b = make_agent(lm.cfg, seed=2, shared=shared)
    assert isinstance(a, LLMAgent) and a.backend is b.backend is shared.backend
    # the run reads the loaded backend's prompt-cache statistics through it (none before one is loaded)
    assert SharedBackend().prompt_cache_stats() is None
    assert set(shared.prompt_cache_stats()) == set(lm.backend.prompt_cache_stats()) >= {"reused_tokens"}


# ----------------------------------------------------------------- OpenAI-compatible backend

def _byte_decoder() -> dict[str, int]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class FakeOpenAI:
    """A chat-completions server on 127.0.0.1 that serves the tiny model (greedy)."""

    def __init__(self, lm):
        self.backend = TransformersBackend(lm.cfg.model,
                                           section(SamplingConfig, {"do_sample": False, "temperature": 1.0,
                                                                    "top_p": 1.0, "top_k": 0, "max_new_tokens": 48,
                                                                    "seed": 0, "early_stop": False}),
                                           model=lm.backend.model, tokenizer=lm.tok)
        self.tok = lm.tok
        self.bytes_of = _byte_decoder()
        self.requests: list[dict] = []
        self.fail_with: list[int] = []  # statuses returned (in order) before answering
        self.delay = threading.Event()  # set: answer at once; clear: hang until released
        self.delay.set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                if not server.delay.is_set():
                    server.delay.wait(10)
                    return
                if server.fail_with:
                    code = server.fail_with.pop(0)
                    self._send(code, {"error": {"message": f"status {code}"}})
                    return
                self._send(200, server.answer(body))

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, body):
        gen = self.backend.generate([body["messages"]], seeds=[body.get("seed", 0)],
                                    max_new_tokens=body.get("max_tokens"))[0]
        ids, lps = gen.generated_ids, gen.logprobs
        finish = "stop" if ids and ids[-1] == self.tok.eos_token_id else "length"
        if finish == "stop":  # the stop token is not part of the returned content
            ids, lps = ids[:-1], lps[:-1]
        choice = {"index": 0, "message": {"role": "assistant", "content": gen.text}, "finish_reason": finish}
        if body.get("logprobs"):
            as_ids = body.get("return_tokens_as_token_ids")
            choice["logprobs"] = {"content": [
                {"token": f"token_id:{t}" if as_ids else self.tok.decode([t]), "logprob": lp,
                 "bytes": [self.bytes_of[c] for c in self.tok.convert_ids_to_tokens([t])[0]]}
                for t, lp in zip(ids, lps)]}
        return {"id": "x", "object": "chat.completion", "model": body["model"], "choices": [choice],
                "usage": {"prompt_tokens": gen.prompt_tokens, "completion_tokens": len(ids)}}

    def close(self):
        self.delay.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(lm, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    srv = FakeOpenAI(lm)
    yield srv
    srv.close()


def _openai_cfg(lm, server, **model):
    cfg = copy.deepcopy(lm.cfg)
    cfg.model.backend = "openai"
    cfg.model.base_url = server.base_url
    cfg.model.api_model = "tiny"
    cfg.model.api_key_env = "TINY_TEST_KEY"
    cfg.model.timeout_s = 5.0
    cfg.model.backoff_s = 0.01
    for k, v in model.items():
        cfg.model[k] = v
    return cfg


def test_openai_backend_matches_the_local_model(lm, server, monkeypatch, caplog):
    monkeypatch.setenv("TINY_TEST_KEY", "sk-secret-123")
    cfg = _openai_cfg(lm, server, extra_body={"return_tokens_as_token_ids": True})
    backend = make_backend(cfg.model, cfg.sampling)
    assert isinstance(backend, OpenAIBackend) and "sk-secret" not in repr(backend)
    msgs = _messages(lm)
    with caplog.at_level(logging.DEBUG):
        gens = backend.generate(msgs, seeds=[1, 2, 3, 4, 5])
    local = lm.backend.generate(msgs, early_stop=False)
    for gen, ref in zip(gens, local):
        assert gen.error is None and gen.text == ref.text and gen.stop_reason == "eos"
        assert gen.generated_ids == ref.generated_ids[:-1]  # the server drops the stop token
        assert gen.action_token_mask == ref.action_token_mask[:-1]
        assert gen.action_text == ref.action_text and gen.tracking_method == ref.tracking_method
        assert gen.prompt_tokens == ref.prompt_tokens and gen.generated_tokens == ref.generated_tokens - 1
        assert gen.logprobs == pytest.approx(ref.logprobs[:-1], abs=1e-5)
    first = server.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["auth"] == "Bearer sk-secret-123"
    assert first["body"]["temperature"] == 0.0 and first["body"]["logprobs"] is True
    assert first["body"]["seed"] in (1, 2, 3, 4, 5) and first["body"]["max_tokens"] == 48
    assert "sk-secret" not in caplog.text


def test_openai_backend_without_token_data(lm, server):
    cfg = _openai_cfg(lm, server, logprobs=False)
    gen = make_backend(cfg.model, cfg.sampling).generate(_messages(lm)[1:2])[0]
    assert gen.error is None and gen.tracking_method == "none"
    assert gen.generated_ids is None and gen.action_token_mask is None
    assert gen.action_text == '{"action": "open", "target": "Drawer_1"}'
    step_backend = make_backend(cfg.model, cfg.sampling)
    step = _agent(lm, "ep_b", backend=step_backend).act(EPISODES[1][1])
    assert step.action == {"action": "open", "target": "Drawer_1"} and step.model.action_valid


def test_openai_backend_retries_after_a_server_error(lm, server):
    server.fail_with = [500, 503]
    cfg = _openai_cfg(lm, server)
    gen = make_backend(cfg.model, cfg.sampling).generate(_messages(lm)[:1])[0]
    assert gen.error is None and gen.action_text is not None
    assert len(server.requests) == 3


def test_openai_backend_does_not_retry_a_client_error(lm, server):
    server.fail_with = [400]
    cfg = _openai_cfg(lm, server)
    gen = make_backend(cfg.model, cfg.sampling).generate(_messages(lm)[:1])[0]
    assert gen.stop_reason == "error" and "HTTP 400" in gen.error and len(server.requests) == 1


def test_openai_backend_timeout_is_bounded(lm, server):
    server.delay.clear()  # the server hangs
    cfg = _openai_cfg(lm, server, timeout_s=0.2, max_retries=1)
    gen = make_backend(cfg.model, cfg.sampling).generate(_messages(lm)[:1])[0]
    assert gen.stop_reason == "error" and "failed after 2 attempts: timed out after 0.2s" in gen.error
    # The client gave up on both attempts; the server's handler threads may log them late.
    for _ in range(100):
        if len(server.requests) >= 2:
            break
        threading.Event().wait(0.05)
    assert len(server.requests) == 2


def test_openai_backend_config_errors(lm):
    cfg = copy.deepcopy(lm.cfg)
    cfg.model.backend = "openai"
    cfg.model.base_url = None
    with pytest.raises(BackendError, match="model.base_url=None"):
        make_backend(cfg.model, cfg.sampling)
    cfg.model.base_url = "http://127.0.0.1:9/v1"
    cfg.model.api_model = None
    cfg.model.name_or_path = None
    with pytest.raises(BackendError, match="model.api_model is null"):
        make_backend(cfg.model, cfg.sampling)


# ----------------------------------------------------------------- real games, rollout, tensors


def _play_tiny_games(lm, tiny_cfg, tiny_games, *, max_steps: int, decoding: str | None = None) -> list[dict]:
    """The collect loop with the llm agent on the first two train quests of the tiny games, batched by 2."""
    from pipeline.agents import make_agent
    from pipeline.envs.household.env import HouseholdEnv
    from pipeline.envs.household.user import SimulatedUser
    from pipeline.session.rollout import play, tasks_from_manifest

    cfg = copy.deepcopy(lm.cfg)
    cfg.env = tiny_cfg.env
    cfg.env.max_steps = max_steps
    cfg.agent.batch_size = 2
    if decoding is not None:
        cfg.agent.decoding = decoding
    tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=0)[:2]
    shared = SharedBackend(lm.backend)
    return play(
        tasks,
        make_env=lambda t: HouseholdEnv(str(tiny_games.root / t.game_file), scene_id=t.scene_id,
                                        quest_id=t.quest_id, objective=t.objective, max_steps=max_steps,
                                        reward=cfg.env.reward),
        make_agent=lambda t: make_agent(cfg, seed=t.seed, shared=shared),
        make_user=lambda t: SimulatedUser(cfg.user, tiny_games.scenes[t.scene_id],
                                          {"quest_id": t.quest_id, "objective": t.objective,
                                           "expert_plan": t.expert_plan, "preferences": t.preferences}, t.seed),
        batch_size=2,
    )


def test_llm_agent_plays_real_games_and_tensors_check(lm, tiny_cfg, tiny_games, tmp_path):
    """The collect loop with the llm agent: token columns filled, .pt files consistent."""
    records = _play_tiny_games(lm, tiny_cfg, tiny_games, max_steps=3)
    checked = 0
    for rec in records:
        assert rec["episode"]["generated_tokens"] > 0 and rec["episode"]["prompt_tokens"] > 0
        path = save_episode_tensors(tmp_path / f"{rec['episode']['episode_id']}.pt", rec["tensors"])
        for row in rec["turns"]:
            assert row["tracking_method"] in ("stream", "fallback", "none") and row["prompt"]
            assert row["generated_ids_length"] == row["generated_tokens"] > 0
            tens = load_episode_tensors(path, turn_index=row["turn_index"])
            assert tens["generated_ids"].numel() == row["generated_ids_length"]
            check_turn_consistency(lm.tok, tens, row["generated_text"])
            checked += row["action_token_start_index"] is not None
    assert checked > 0


# ----------------------------------------------------------------- constrained decodings

PREFIX_ACTIONS = [  # one action's text is a prefix of another's; Apple_1 / Apple_12 share a prefix
    {"action": "take", "target": "Apple_1", "command": "take Apple_1"},
    {"action": "take", "target": "Apple_1", "receptacle": "Table_0", "command": "take Apple_1 from Table_0"},
    {"action": "take", "target": "Apple_12", "command": "take Apple_12"},
    {"action": "go_to", "target": "Kitchen", "command": "go west"},
]


def test_constraint_walks_end_in_exactly_one_admissible_action(lm):
    """Random walks over the allowed tokens: every walk spells one admissible action's text
    (whatever the token split of a name), and every action (prefix ones included) is reachable."""
    import random

    from pipeline.llm.constrain import ActionConstraint, TokenTexts, action_texts

    texts = TokenTexts(lm.tok)
    names = [t for t in ("Apple_12", "Table_0", "Kitchen") if len(lm.tok(t, add_special_tokens=False)["input_ids"]) > 1]
    assert names, "the tiny tokenizer should split at least one entity name into several tokens"
    fields = dict((t, i) for t, i in action_texts(PREFIX_ACTIONS))
    assert '{"action": "go_to", "target": "west"' in fields and fields['{"action": "go_to", "target": "west"'] == 3
    rng = random.Random(0)
    reached = set()
    for _ in range(200):
        c = ActionConstraint(texts, PREFIX_ACTIONS)
        while not c.done:
            allowed = c.allowed()
            assert allowed, c.consumed
            c.advance(texts.texts[rng.choice(allowed)])
        full = [t for t, i in action_texts(PREFIX_ACTIONS) if i == c.chosen]
        assert any(c.consumed.startswith(f + tail) for f in full for tail in ("}", ', "memory": '))
        reached.add(c.chosen)
    assert reached == {0, 1, 2, 3}
    c = ActionConstraint(texts, PREFIX_ACTIONS)
    with pytest.raises(ValueError, match="left the admissible texts"):
        c.advance('{"action": "drop"')


def test_accepts_first_answers_as_accepts_does(lm):
    """A turn's start asks the constraint about every line-ending token at once
    (:meth:`ActionConstraint.accepts_first`): its answers are :meth:`accepts`' one by one, for
    every token text, each target, each target's prefixes and each target extended, with and
    without the cut-off reasoning line's lead, and after something was consumed."""
    from pipeline.llm.constrain import ActionConstraint, TokenTexts

    texts = TokenTexts(lm.tok)
    for lead in ("", "\n"):
        c = ActionConstraint(texts, PREFIX_ACTIONS, lead)
        targets = sorted({t.text for t in c.targets})
        pieces = list(texts.texts) + [""]
        pieces += [t[:k] for t in targets for k in (1, 5, len(t) - 1, len(t))]
        pieces += [t + tail for t in targets for tail in ("x", " ", "}\n")] + ['{"action": "drop"', "zz"]
        want = [c.accepts(p) for p in pieces]
        assert c.accepts_first(pieces) == want
        assert any(want) and not all(want)  # both answers occur
        assert sum(want[len(texts.texts) + 1:]) > len(targets)  # prefixes, targets and past-the-end ones
        c.advance(targets[0][:3])
        assert c.accepts_first(pieces) == [c.accepts(p) for p in pieces]  # the one-by-one path


@pytest.mark.parametrize("decoding", ["constrained", "choice"])
def test_constrained_decodings_choose_only_admissible_actions(lm, decoding):
    """The model wants Fridge_9 (not admissible): free decoding fails the turn, constrained and
    choice take an admissible action; the tracked JSON text names it; choice stores every score."""
    cfg = copy.deepcopy(lm.cfg)
    eid, obs, _ = EPISODES[3]
    assert not _agent(lm, eid).act(obs).model.action_valid  # free: inadmissible
    cfg.agent.decoding = decoding
    for eid, obs, _ in EPISODES[:4] + [("ep_p", _obs("Kitchen", "Take Apple_12.", [
            (a["action"], a["target"], a["command"]) for a in PREFIX_ACTIONS]), "")]:
        if eid == "ep_p":
            obs["admissible_actions"] = [dict(a) for a in PREFIX_ACTIONS]
        agent = _agent(lm, "ep_a", cfg=cfg)
        agent.reset(_meta(eid, obs))
        step = agent.act(obs)
        assert step.model.action_valid, step.model.parse_error
        assert step.model.generation.decoding == decoding
        adm = [{k: v for k, v in a.items() if k != "command"} for a in obs["admissible_actions"]]
        assert step.action in adm
        parsed = json.loads(step.model.generation.action_text)
        again = {k: parsed.get(k) for k in step.action}
        if step.action["action"] == "go_to":  # the JSON may name the direction of the command
            assert again["target"] in (step.action["target"], "west", "east")
        else:
            assert again == step.action
        ids, mask = step.model.generation.generated_ids, step.model.generation.action_token_mask
        assert step.model.generation.action_text in lm.tok.decode([i for i, m in zip(ids, mask) if m])
        if decoding == "choice":
            assert step.model.action_scores is not None, eid
            scores = step.model.action_scores
            assert set(scores) == {a["command"] for a in obs["admissible_actions"]}
            best = max(scores, key=lambda k: scores[k])
            assert next(a for a in obs["admissible_actions"] if a["command"] == best)["target"] == step.action["target"]
        else:
            assert step.model.action_scores is None


def test_constrained_batched_equals_sequential_and_needs_a_capable_backend(lm):
    cfg = copy.deepcopy(lm.cfg)
    cfg.agent.decoding = "constrained"
    from pipeline.agents.llm import LLMAgent
    from pipeline.core.config import ConfigError

    obs_list = [o for _, o, _ in EPISODES[:4]]
    agents = [_agent(lm, e, cfg=cfg) for e, _, _ in EPISODES[:4]]
    batched = LLMAgent.act_many(agents, obs_list)
    seq = [_agent(lm, e, cfg=cfg).act(o) for (e, _, _), o in zip(EPISODES[:4], obs_list)]
    assert [s.generated_text for s in batched] == [s.generated_text for s in seq]
    with pytest.raises(ConfigError, match="agent.decoding='constrained'"):
        LLMAgent(cfg, seed=1, backend=NS(generate=None, name="x", decodings=("free",)))
    cfg.agent.decoding = "auto"  # the strongest the backend offers
    assert LLMAgent(cfg, seed=1, backend=NS(generate=None, name="x", decodings=("free",))).decoding == "free"
    assert LLMAgent(cfg, seed=1, backend=lm.backend).decoding == "constrained"


@pytest.mark.parametrize("decoding", ["constrained", "choice"])
def test_constrained_decodings_on_a_real_game(lm, tiny_cfg, tiny_games, decoding):
    """A real TextWorld game: every turn's action is admissible; the turns record the decoding."""
    records = _play_tiny_games(lm, tiny_cfg, tiny_games, max_steps=4, decoding=decoding)
    turns = [row for rec in records for row in rec["turns"]]
    assert turns and all(row["action_valid"] for row in turns)
    assert {row["decoding"] for row in turns} == {decoding}
    scored = [json.loads(row["action_scores"]) for row in turns if row["action_scores"]]
    assert (len(scored) == len(turns)) if decoding == "choice" else not scored


# --------------------------------------------------------------------------- prompt cache (issue 18)


def _twin_backends(lm):
    """Two backends over the same model and tokenizer: prompt cache on and off."""
    on = TransformersBackend(lm.cfg.model, lm.cfg.sampling, model=lm.backend.model, tokenizer=lm.tok)
    off = TransformersBackend(lm.cfg.model, lm.cfg.sampling, model=lm.backend.model, tokenizer=lm.tok)
    on.set_prompt_cache(64)
    off.set_prompt_cache(0)
    return on, off


def _turn_obs(obs: dict, step: int) -> dict:
    """The observation of a later turn of the same episode (what changes: step, description)."""
    return {**obs, "step": step, "description": obs["description"] + f" Step {step}."}


def test_cached_prompts_give_the_same_logits_as_encoding_them_whole(lm):
    on, off = _twin_backends(lm)
    agents = [_agent(lm, e) for e, _, _ in EPISODES[:3]]

    def last_logits(backend, ids):
        inp, attn, pos, cache, hits = backend._prefill_inputs(ids)
        with torch.inference_mode():
            out = backend.model(input_ids=inp, attention_mask=attn, position_ids=pos, past_key_values=cache,
                                use_cache=True)
        if hits is not None:
            backend._remember_prompts(ids, hits, cache)
        return out.logits[:, -1].float()

    for step in range(3):
        # One episode starts late: its first turn is a miss in a batch of hits.
        batch = [(a, _turn_obs(o, step)) for a, (_, o, _) in zip(agents, EPISODES[:3]) if step or a is not agents[2]]
        ids = [on.render(a.messages(o))[1] for a, o in batch]
        torch.testing.assert_close(last_logits(on, ids), last_logits(off, ids), atol=1e-4, rtol=1e-4)
    stats = on.prompt_cache_stats()
    assert stats["reused_tokens"] > stats["encoded_tokens"] > 0 and stats["entries"] >= 3
    assert off.prompt_cache_stats()["reused_tokens"] == 0


@pytest.mark.parametrize("decoding", ["free", "constrained", "choice"])
def test_cached_turns_give_the_same_greedy_actions(lm, decoding):
    """Three turns of four episodes, batched: with the cache each later turn encodes only its
    new tokens, and every answer (text, tokens, log-probs, choice scores) matches."""
    on, off = _twin_backends(lm)
    cfg = copy.deepcopy(lm.cfg)
    cfg.agent.decoding = decoding
    from pipeline.agents.llm import LLMAgent

    results = {}
    for name, backend in (("on", on), ("off", off)):
        agents = [_agent(lm, e, cfg=cfg, backend=backend) for e, _, _ in EPISODES[:4]]
        steps = []
        for step in range(3):
            steps += LLMAgent.act_many(agents, [_turn_obs(o, step) for _, o, _ in EPISODES[:4]])
        results[name] = steps
    for a, b in zip(results["on"], results["off"]):
        assert a.generated_text == b.generated_text and a.action == b.action
        assert a.model.generation.generated_ids == b.model.generation.generated_ids
        torch.testing.assert_close(torch.tensor(a.model.generation.logprobs), torch.tensor(b.model.generation.logprobs),
                                   atol=1e-4, rtol=1e-4)
        if decoding == "choice":
            sa, sb = a.model.action_scores, b.model.action_scores
            assert sa.keys() == sb.keys() and all(abs(sa[k] - sb[k]) < 1e-3 for k in sa)
    stats = on.prompt_cache_stats()
    assert stats["reused_tokens"] > stats["encoded_tokens"] > 0, stats  # turns 2-3 encode only what changed


@pytest.mark.parametrize("decoding", ["free", "constrained", "choice"])
def test_the_growing_batch_cache_changes_no_byte_of_a_turn(lm, decoding):
    """The decode loop's batch cache grows in place on the CPU (:func:`pipeline.llm.kvcache.growing_cache`);
    transformers' ``DynamicCache`` (what the backend uses elsewhere) gives the very same turns:
    texts, token ids, log-probs and choice scores equal, not close."""
    from pipeline.agents.llm import LLMAgent
    from pipeline.llm.kvcache import _growing_cache_class

    grown, plain = _twin_backends(lm)
    plain.set_prompt_cache(64)  # both with the prompt cache, as on the CPU by default
    plain._plain = 0  # as for a model whose cache is not plain keys and values
    assert type(grown._batch_cache()) is _growing_cache_class() and type(plain._batch_cache()).__name__ == "DynamicCache"
    cfg = copy.deepcopy(lm.cfg)
    cfg.agent.decoding = decoding
    results = {}
    for name, backend in (("grown", grown), ("plain", plain)):
        agents = [_agent(lm, e, cfg=cfg, backend=backend) for e, _, _ in EPISODES[:4]]
        results[name] = [s for step in range(3)
                         for s in LLMAgent.act_many(agents, [_turn_obs(o, step) for _, o, _ in EPISODES[:4]])]
    for a, b in zip(results["grown"], results["plain"], strict=True):
        ga, gb = a.model.generation, b.model.generation
        assert (a.generated_text, a.action, ga.generated_ids) == (b.generated_text, b.action, gb.generated_ids)
        assert ga.logprobs == gb.logprobs and a.model.action_scores == b.model.action_scores


def test_prompt_cache_keeps_the_shared_part_within_its_budget(lm):
    from pipeline.llm.kvcache import PromptKVCache

    pc = PromptKVCache(max_bytes=1 << 20)
    layer = torch.zeros(1, 2, 2, 10, 4)  # (layers, keys/values, heads, tokens, head_dim)
    pc.remember(list(range(10)), layer, hit=None, shared=0)
    entry, n = pc.lookup(list(range(6)) + [99, 98, 97])
    assert entry is pc.entries[0] and n == 6
    pc.remember(list(range(6)) + [99, 98, 97], None, hit=entry, shared=n)  # cut to what turns share
    assert len(pc.entries) == 1 and len(entry.ids) == 6 and entry.kv.shape == (1, 2, 2, 6, 4)
    assert pc.lookup(list(range(6)))[1] == 5  # the last token is always encoded
    small = PromptKVCache(max_bytes=2 * 10 * 4 * 4 * 2)  # room for one 10-token entry
    small.remember(list(range(10)), layer, hit=None, shared=0)
    small.remember(list(range(50, 60)), layer, hit=None, shared=0)
    assert [int(e.ids[0]) for e in small.entries] == [50] and small.nbytes <= small.max_bytes
    with pytest.raises(BackendError, match="model.prompt_cache_mb=-1"):
        TransformersBackend(OmegaConf.merge(lm.cfg.model, {"prompt_cache_mb": -1}), lm.cfg.sampling,
                            model=lm.backend.model, tokenizer=lm.tok)


def test_prompt_cache_auto_is_on_for_the_cpu_and_off_on_a_gpu(lm):
    """``model.prompt_cache_mb=auto`` (the default) follows the recorded per-device rule; a number wins."""
    from pipeline.llm.backends.transformers import AUTO_PROMPT_CACHE_MB, prompt_cache_budget

    assert prompt_cache_budget("auto", torch.device("cpu")) == AUTO_PROMPT_CACHE_MB["cpu"] > 0
    assert prompt_cache_budget("auto", torch.device("cuda")) == 0  # measured slower there (issue 34)
    assert prompt_cache_budget("auto", torch.device("mps")) == 0  # not measured
    assert prompt_cache_budget(0, torch.device("cpu")) == 0 and prompt_cache_budget(512, torch.device("cuda")) == 512
    auto = TransformersBackend(OmegaConf.merge(lm.cfg.model, {"prompt_cache_mb": "auto"}), lm.cfg.sampling,
                               model=lm.backend.model, tokenizer=lm.tok)
    assert auto.prompt_cache is not None and auto.prompt_cache.max_bytes == int(AUTO_PROMPT_CACHE_MB["cpu"]) << 20
    with pytest.raises(BackendError, match="model.prompt_cache_mb='lots'"):
        prompt_cache_budget("lots", torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device here: the CUDA path (model.device=cuda) is tested only where one is present")
@pytest.mark.parametrize("decoding", ["free", "constrained", "choice"])
def test_cuda_turns_equal_the_cpu_turns(lm, decoding):
    """On a GPU the backend plays every decoding, prompt cache off (``auto``) and on, with the
    CPU's greedy tokens, actions and choice (float32 both: the tiny model's margins are wide)."""
    msgs = [_agent(lm, e).messages(o) for e, o, _ in EPISODES[:4]]
    adm = [o["admissible_actions"] for _, o, _ in EPISODES[:4]]

    def play(device: str, cache) -> list:
        cfg = OmegaConf.merge(lm.cfg.model, {"device": device, "prompt_cache_mb": cache})
        backend = TransformersBackend(cfg, lm.cfg.sampling, model=copy.deepcopy(lm.backend.model), tokenizer=lm.tok)
        assert (backend.prompt_cache is None) == (cache == "auto" and device == "cuda")
        gens = []
        for _ in range(2):  # the second pass reads the prompt cache, where it is on
            gens = backend.generate(msgs, seeds=[1, 2, 3, 4], admissible=adm, decoding=decoding)
        assert all(g.error is None for g in gens), [g.error for g in gens]
        return gens

    want = play("cpu", 0)
    for cache in ("auto", 64):
        got = play("cuda", cache)
        for a, b in zip(got, want):
            assert a.generated_ids == b.generated_ids and a.chosen_index == b.chosen_index
            if b.logprobs is not None:
                torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-3, rtol=1e-3)
            if decoding == "choice":
                assert a.action_scores is not None and len(a.action_scores) == len(b.action_scores)


def test_generation_cache_returns_what_the_model_returns_and_any_change_misses(lm, tmp_path):
    """Opt-in ``model.cache_dir``: a rerun reads every turn back (what a fresh run produces);
    a different model, prompt, seed, sampling parameter or decoding is a miss."""
    import dataclasses

    cfg = OmegaConf.merge(lm.cfg.model, {"cache_dir": str(tmp_path / "gen")})
    msgs = [_agent(lm, e).messages(o) for e, o, _ in EPISODES[:3]]
    adm = [o["admissible_actions"] for _, o, _ in EPISODES[:3]]

    def backend(sampling=lm.cfg.sampling, model=lm.backend.model):
        return TransformersBackend(cfg, sampling, model=model, tokenizer=lm.tok)

    fresh = TransformersBackend(lm.cfg.model, lm.cfg.sampling, model=lm.backend.model, tokenizer=lm.tok)
    want = [dataclasses.asdict(g) for g in fresh.generate(msgs, seeds=[1, 2, 3], admissible=adm, decoding="choice")]
    first = backend()
    got = [dataclasses.asdict(g) for g in first.generate(msgs, seeds=[1, 2, 3], admissible=adm, decoding="choice")]
    assert got == want and first.generation_cache.misses == 3 and first.generation_cache.hits == 0
    again = backend()
    read = [dataclasses.asdict(g) for g in again.generate(msgs, seeds=[1, 2, 3], admissible=adm, decoding="choice")]
    assert read == want and again.generation_cache.hits == 3

    def misses(b, **kw):
        args = {"seeds": [1, 2, 3], "admissible": adm, "decoding": "choice", **kw}
        b.generate(kw.pop("batch", msgs), **{k: v for k, v in args.items() if k != "batch"})
        return b.generation_cache.misses

    assert misses(backend(), seeds=[1, 2, 4]) == 1  # the seed
    assert misses(backend(), decoding="constrained") == 3
    assert misses(backend(), admissible=[adm[0][:1], adm[1], adm[2]]) == 1
    assert misses(backend(), batch=[msgs[0], msgs[1], msgs[2][:1] + [{"role": "user", "content": "other"}]]) == 1
    hot = OmegaConf.merge(lm.cfg.sampling, {"do_sample": True, "temperature": 0.9})
    assert misses(backend(sampling=hot)) == 3
    other = copy.deepcopy(lm.backend.model)
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)
    assert misses(backend(model=other)) == 3


def test_action_constraint_accepts_exactly_the_prefixes_and_the_texts_past_a_target():
    """``ActionConstraint.accepts`` (a bisection and per-prefix look-ups) says what a scan of every
    target says: ``piece`` after what was consumed is a prefix of a target, or runs past one."""
    import random

    from pipeline.llm.constrain import ActionConstraint

    acts = [{"action": "go", "target": "north"}, {"action": "open", "target": "Fridge_0"},
            {"action": "take", "target": "Apple_2"}, {"action": "look", "target": None}]
    c = ActionConstraint(None, acts)  # accepts reads the targets only, never the token texts
    texts = [t.text for t in c.targets]
    alphabet = sorted(set("".join(texts))) + ["}", "x"]
    rng = random.Random(0)
    pieces = [t[:k] for t in texts for k in range(len(t) + 1)] + [t + "}x" for t in texts]
    pieces += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(2000)]
    for consumed in ("", texts[0][:5], texts[1][:9]):
        c.consumed = consumed
        for p in pieces:
            s = consumed + p
            want = any(t.startswith(s) or s.startswith(t) for t in texts)
            assert c.accepts(p) == want, (consumed, p)
