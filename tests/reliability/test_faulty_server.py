"""A faulty OpenAI-compatible server: bounded retries with backoff, then a recorded failed turn
or a clear stage failure (``agent.on_backend_error``), never a hang, never a lost episode.

The server (:class:`~tests.reliability.helpers.FakeOpenAI`) runs on 127.0.0.1 in this
process; the backend is the real :class:`pipeline.llm.backends.openai.OpenAIBackend`, and the
stage tests run the real ``collect`` stage against it in a subprocess.
"""

from __future__ import annotations

import json
import time as _time

import pytest
from omegaconf import DictConfig

import pipeline.llm.backends.openai as openai_backend
from pipeline.core.conf_schema import ModelConfig, SamplingConfig
from pipeline.core.config import section
from pipeline.core.io import read_parquet
from pipeline.llm.backends.openai import OpenAIBackend

from .helpers import ANSWER, FakeOpenAI

pytestmark = pytest.mark.timeout(120)  # the hang guard: every test here ends in seconds

MESSAGES = [{"role": "system", "content": "You are a household agent."}, {"role": "user", "content": "Next?"}]
TIMEOUT_S, RETRIES, BACKOFF_S = 0.4, 2, 0.01
# A fault the server answers at once (an HTTP error, a closed or cut connection, bad JSON) is
# given a timeout no answer on a loaded machine reaches: with 0.4 s, an attempt could time out
# before the server's thread had read it (2 of 3 attempts recorded, or a 500 storm's last retry
# timed out, on a loaded 2-core machine). So `model_cfg` gives every client that one; the tests
# about the timeout itself (a hang, a stall, a trickle) ask for the short one.
ANSWERED_TIMEOUT_S = 10.0


def model_cfg(url: str, **kw) -> DictConfig:
    return section(ModelConfig, dict(backend="openai", base_url=url, api_model="fake-model", name_or_path=None,
                                     timeout_s=ANSWERED_TIMEOUT_S, max_retries=RETRIES, backoff_s=BACKOFF_S,
                                     logprobs=False, extra_body={}, api_key_env="REL_UNSET_KEY") | kw)


SAMPLING = section(SamplingConfig, dict(seed=0, do_sample=False, temperature=0.7, top_p=0.9, top_k=0,
                                        max_new_tokens=32, early_stop=True))


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The backoff delays the backend asks for (recorded, not slept: nothing here times anything)."""
    delays: list[float] = []

    async def record(s):
        delays.append(round(s, 6))

    monkeypatch.setattr(openai_backend, "_sleep", record)
    return delays


@pytest.mark.parametrize("mode", ["500", "503", "429", "hang", "stall", "close", "badjson", "cut"])
def test_a_transient_fault_is_retried_with_backoff_then_a_failed_generation(mode, sleeps):
    timeout = TIMEOUT_S if mode in ("hang", "stall") else ANSWERED_TIMEOUT_S
    with FakeOpenAI(lambda n, body: mode, hang_s=3 * TIMEOUT_S) as server:
        gen = OpenAIBackend(model_cfg(server.url, timeout_s=timeout), SAMPLING).generate([MESSAGES], seeds=[7])[0]
    attempts = RETRIES + 1
    assert len(server.requests) == attempts  # bounded retries
    assert sleeps == [BACKOFF_S * 2 ** i for i in range(RETRIES)]  # exponential backoff, none after the last
    assert gen.error and gen.stop_reason == "error" and gen.text == "" and gen.action_text is None
    assert f"failed after {attempts} attempts" in gen.error
    expected = {"500": "HTTP 500", "503": "HTTP 503", "429": "HTTP 429", "hang": "timed out",
                "stall": "timed out", "close": "connection failed", "badjson": "not JSON",
                "cut": "connection failed"}[mode]
    assert expected in gen.error, gen.error


@pytest.mark.parametrize("mode, expected", [("400", "HTTP 400"), ("shape", "unexpected response shape")])
def test_a_permanent_fault_is_not_retried(mode, expected, sleeps):
    with FakeOpenAI(lambda n, body: mode) as server:
        gen = OpenAIBackend(model_cfg(server.url), SAMPLING).generate([MESSAGES], seeds=[7])[0]
    assert len(server.requests) == 1 and sleeps == []
    assert gen.error and expected in gen.error


def test_a_server_that_recovers_gives_the_real_answer(sleeps):
    faults = ["500", "close"]
    with FakeOpenAI(lambda n, body: faults[n] if n < len(faults) else "ok") as server:
        gen = OpenAIBackend(model_cfg(server.url), SAMPLING).generate([MESSAGES], seeds=[7])[0]
    assert gen.error is None and gen.text == ANSWER and json.loads(gen.action_text) == {"action": "look",
                                                                                          "target": None}
    assert server.modes == ["500", "close", "ok"] and sleeps == [BACKOFF_S, 2 * BACKOFF_S]


def test_rate_limited_then_served(sleeps):
    """429 (Retry-After: 0) twice, then the answer: exponential backoff, the real answer."""
    with FakeOpenAI(lambda n, body: "429" if n < 2 else "ok") as server:
        gen = OpenAIBackend(model_cfg(server.url), SAMPLING).generate([MESSAGES], seeds=[7])[0]
    assert gen.error is None and gen.text == ANSWER and server.modes == ["429", "429", "ok"]
    assert sleeps == [BACKOFF_S, 2 * BACKOFF_S]


def test_a_500_storm_on_a_bounded_batch_still_answers_every_conversation(sleeps):
    """Every conversation's first two attempts fail (a 500 storm): 16 conversations, 4 in
    flight at most, each answered on its last retry."""
    seen: dict[str, int] = {}

    def script(n, body):
        conv = body["messages"][1]["content"]
        seen[conv] = seen.get(conv, 0) + 1
        return "500" if seen[conv] <= RETRIES else "ok"

    batch = [[MESSAGES[0], {"role": "user", "content": f"conv {i}"}] for i in range(16)]
    with FakeOpenAI(script) as server:
        gens = OpenAIBackend(model_cfg(server.url, max_concurrency=4), SAMPLING).generate(batch, seeds=list(range(16)))
    assert all(g.error is None and g.text == ANSWER for g in gens)
    assert len(server.requests) == 16 * (RETRIES + 1) and server.max_in_flight <= 4


def test_a_batch_keeps_each_conversation_apart(sleeps):
    """Concurrent requests: the ones that fail for good fail alone, in their own place."""
    def script(n, body):
        conv = body["messages"][1]["content"]
        return "500" if conv in ("conv 1", "conv 3") else "ok"

    batch = [[MESSAGES[0], {"role": "user", "content": f"conv {i}"}] for i in range(5)]
    with FakeOpenAI(script) as server:
        gens = OpenAIBackend(model_cfg(server.url), SAMPLING).generate(batch, seeds=list(range(5)))
    assert [g.error is not None for g in gens] == [False, True, False, True, False]
    assert all(g.text == ANSWER for i, g in enumerate(gens) if i not in (1, 3))
    assert len(server.requests) == 3 * 1 + 2 * (RETRIES + 1)


def test_the_agent_records_or_raises_per_on_backend_error(tiny_cfg, sleeps):
    from omegaconf import OmegaConf

    from pipeline.agents.llm import LLMAgent
    from pipeline.llm.backends import BackendError

    obs = {"objective": "Put Apple_0 in Fridge_0", "agent_location": "Kitchen", "agent_inventory": [],
           "visible_entities": ["Fridge_0"], "available_actions": ["look", "open"], "description": "A kitchen.",
           "admissible_commands": ["look", "open Fridge_0"], "step": 0, "max_steps": 5,
           "admissible_actions": [{"action": "look", "target": None, "command": "look"},
                                  {"action": "open", "target": "Fridge_0", "command": "open Fridge_0"}]}
    for policy in ("record", "fail"):
        cfg = OmegaConf.merge(tiny_cfg, {"agent": {"on_backend_error": policy}})
        with FakeOpenAI(lambda n, body: "500") as server:
            agent = LLMAgent(cfg, seed=1, backend=OpenAIBackend(model_cfg(server.url), SAMPLING))
            agent.reset({"episode_id": "ep_x", "objective": obs["objective"]})
            if policy == "fail":
                with pytest.raises(BackendError, match=r"ep_x turn 0: POST .* failed after 3 attempts: HTTP 500"):
                    agent.act(obs)
            else:
                step = agent.act(obs)
                assert step.model.action_valid is False and step.model.generation.stop_reason == "error"
                assert "backend error" in step.model.parse_error
                assert step.action == {"action": "look", "target": None}  # agent.fallback_action


# --------------------------------------------------------------------------- the collect stage


# The collect stage's client timeout where its faults mix hangs with faults answered at once: long enough
# that every attempt is read and answered before the client gives up on a loaded 2-core machine (with
# 0.4 s, a failed turn's request count came out other than 2 under `make test` in a clean clone), short
# enough that a hang costs little.
COLLECT_TIMEOUT_S = 2.0


def _llm_project(project, server, *extra: str, timeout_s: float = TIMEOUT_S) -> None:
    project.configure("agent=llm", "model=openai", f"model.base_url={server.url}", "model.api_model=fake-model",
                      f"model.timeout_s={timeout_s}", "model.max_retries=1", f"model.backoff_s={BACKOFF_S}",
                      "model.logprobs=false", *extra)


def _turn_key(body: dict) -> int:
    return int(body["seed"])  # the turn's own seed: the same on every retry of that turn


def test_collect_records_failed_turns_and_loses_no_episode(project):
    """500s, hangs, dropped connections and broken JSON on some turns: every episode is kept."""
    faults = ["500", "hang", "close", "badjson"]
    hung: list[int] = []

    def script(n, body):  # 1 turn in 3 fails for good (same fault on its retry)
        k = _turn_key(body)
        if k % 3:
            return "ok"
        mode = faults[(k // 3) % len(faults)]
        if mode == "hang":  # one turn hangs, on both attempts: each hang costs the client's whole timeout,
            if not hung:  # so the others that would hang get a 500 (5 hung turns were ~20 s of this test)
                hung.append(k)
            mode = "hang" if hung[0] == k else "500"
        return mode

    with FakeOpenAI(script, hang_s=3 * COLLECT_TIMEOUT_S) as server:
        _llm_project(project, server, "agent.batch_size=2", timeout_s=COLLECT_TIMEOUT_S)
        proc = project.run("collect", env={"OPENAI_API_KEY": "unused"})
    turns = read_parquet(project.root / "data/episodes/turns.parquet").to_pylist()
    episodes = read_parquet(project.root / "data/episodes/episodes.parquet").to_pylist()
    assert len(episodes) == 2  # never a lost episode
    failed_turns = {_turn_key(body) for (_, body), mode in zip(server.requests, server.modes) if mode != "ok"}
    errors = [t for t in turns if t["stop_reason"] == "error"]
    assert failed_turns and len(errors) == len(failed_turns)  # each failed turn recorded once
    assert hung and server.modes.count("hang") == 2  # the hung turn: its attempt and its retry
    assert all(not t["action_valid"] and t["generated_text"] == "" and json.loads(t["action"])["action"] == "look"
               for t in errors)
    assert all(t["action_valid"] for t in turns if t["stop_reason"] != "error")
    per_turn = {}
    for _, body in server.requests:
        per_turn[_turn_key(body)] = per_turn.get(_turn_key(body), 0) + 1
    assert all(per_turn[k] == 2 for k in failed_turns)  # first attempt + model.max_retries=1
    assert "Traceback" not in proc.stderr


def test_collect_stops_clearly_when_the_key_is_revoked_and_keeps_what_it_played(project):
    """A 401 in the middle of a run (default agent.on_backend_error=record): the stage stops at
    once with the auth message (not a failed turn per request), the finished episode kept."""
    manifest = read_parquet(project.root / "data/games/manifest.parquet").to_pylist()
    second = sorted(r["objective"] for r in manifest if r["split"] == "train" and r["quest_id"].endswith("2"))

    def script(n, body):
        return "401" if any(obj in body["messages"][0]["content"] for obj in second) else "ok"

    with FakeOpenAI(script) as server:
        _llm_project(project, server, "agent.batched=false", "model.api_key_env=REL_TEST_KEY")
        proc = project.run("collect", env={"REL_TEST_KEY": "sk-revoked-123"}, check=False)
    err = proc.stderr
    assert proc.returncode == 1 and "Traceback" not in err and "sk-revoked-123" not in err + proc.stdout
    assert (f"error: authentication failed: POST {server.url}/chat/completions: HTTP 401: the key in the "
            "environment variable REL_TEST_KEY was refused") in err
    assert "agent.on_backend_error" not in err  # not a per-turn failure
    assert "stopped: 1 of 2 finished episodes kept in" in err and len(project.checkpoint_files()) == 1
    assert server.modes.count("401") == 1  # no retry, no further request
    assert not (project.root / "data" / "episodes").exists()


def test_collect_fails_clearly_with_on_backend_error_fail_then_resumes(project, tmp_path):
    manifest = read_parquet(project.root / "data/games/manifest.parquet").to_pylist()
    second = sorted(r["objective"] for r in manifest if r["split"] == "train" and r["quest_id"].endswith("2"))
    state = {"down": True}

    def script(n, body):  # the server dies while the second episode plays
        system = body["messages"][0]["content"]
        return "503" if state["down"] and any(obj in system for obj in second) else "ok"

    with FakeOpenAI(script) as server:
        _llm_project(project, server, "agent.on_backend_error=fail", "agent.batched=false")
        proc = project.run("collect", env={"OPENAI_API_KEY": "unused"}, check=False)
        assert proc.returncode == 1
        err = proc.stderr
        assert "Traceback" not in err
        assert "error: episode ep_train_" in err and "failed after 2 attempts: HTTP 503" in err
        assert "(agent.on_backend_error=fail)" in err
        assert "stopped: 1 of 2 finished episodes kept in" in err
        assert not (project.root / "data" / "episodes").exists()
        assert len(project.checkpoint_files()) == 1

        state["down"] = False  # the server is back: the rerun finishes the rest
        log = tmp_path / "started.txt"
        rerun = project.run("collect", env={"OPENAI_API_KEY": "unused", "REL_LOG_STARTS": str(log)})
    assert "resuming: 1 of 2" in rerun.stderr and len(log.read_text().split()) == 1
    assert read_parquet(project.root / "data/episodes/episodes.parquet").num_rows == 2


def test_a_server_that_trickles_bytes_is_cut_off_at_the_timeout():
    sent = []

    def drip(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", "20")
        handler.end_headers()
        try:
            for _ in range(20):  # 20 bytes, one every 0.1 s: 2 s in all, five times the timeout
                handler.wfile.write(b" ")
                handler.wfile.flush()
                sent.append(1)
                _time.sleep(0.1)
        except OSError:  # the client hung up: what a deadline would do
            pass

    with FakeOpenAI(lambda n, body: "custom") as server:
        server.custom = drip
        cfg = model_cfg(server.url, timeout_s=TIMEOUT_S)
        cfg.max_retries = 0
        gen = OpenAIBackend(cfg, SAMPLING).generate([MESSAGES], seeds=[7])[0]
    assert gen.error
    # With a deadline of timeout_s (0.4 s) for the attempt, it reads about 4 bytes.
    assert len(sent) < 20, f"the client read all {len(sent)} trickled bytes"


# --------------------------------------------------------------------------- a broken backend fails loudly


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unreachable_project(project, *extra: str) -> None:
    project.configure("agent=llm", "model=openai", f"model.base_url=http://127.0.0.1:{_closed_port()}/v1",
                      "model.api_model=fake-model", f"model.timeout_s={TIMEOUT_S}", "model.max_retries=0",
                      "model.logprobs=false", *extra)


def test_an_unreachable_server_stops_the_stage_with_the_cause(project):
    """Every model call fails (connection refused) under the default on_backend_error=record:
    exit 1 naming the counts, the limit and the first failure; nothing written, no checkpoint kept."""
    _unreachable_project(project)
    proc = project.run("collect", env={"OPENAI_API_KEY": "unused"}, check=False)
    err = proc.stderr
    assert proc.returncode == 1, err[-2000:]
    assert "Traceback" not in err
    assert "the model call failed on 30 of 30 turns (100%), more than agent.max_error_fraction=0.5" in err
    assert "the first failure: episode ep_train_" in err and "turn 0" in err
    assert "(agent.on_backend_error=fail)" not in err  # the setting was `record`: not blamed
    assert not (project.root / "data" / "episodes").exists()
    assert project.checkpoint_files() == []  # a rerun with the server fixed replays every episode


def test_backend_errors_are_counted_in_the_metrics_below_the_limit(rendered_project):
    """With the limit raised the run completes, and the metrics say how many turns failed."""
    project = rendered_project  # C1's prompts rendered from the rule agent's episodes
    _unreachable_project(project, "agent.max_error_fraction=1.0")
    project.run("collect", env={"OPENAI_API_KEY": "unused"})
    collect = json.loads((project.root / "metrics" / "collect.json").read_text())
    assert collect["backend_error_turns"] == collect["num_turns"] == 30 and collect["backend_error_rate"] == 1.0
    project.run("evaluate", "--condition", "C1", env={"OPENAI_API_KEY": "unused"})
    ev = json.loads((project.root / "metrics" / "eval" / "C1.json").read_text())
    assert ev["backend_error_turns"] == ev["num_turns"] > 0 and ev["backend_error_rate"] == 1.0
