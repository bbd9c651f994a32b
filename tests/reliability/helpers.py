"""Small builders shared by the reliability tests."""

from __future__ import annotations

import json
import os
import random


def synthetic_store(n: int, seed: int = 0):
    """An :class:`~pipeline.memory.store.EpisodicStore` of ``n`` entries built the real way
    (:func:`~pipeline.memory.store.build_entry` on made-up episode and turn rows)."""
    from pipeline.envs.household.reader import HouseholdFactReader
    from pipeline.memory.store import EpisodicStore, build_entry

    rng = random.Random(seed)
    entries = []
    for i in range(n):
        ep_id = f"ep_train_scene_{i % 5:02d}_q{i:03d}_0"
        turns = []
        for t in range(rng.randint(1, 4)):
            verb = rng.choice(["open", "examine", "take", "go"])
            turns.append({"episode_id": ep_id, "turn_index": t, "command": f"{verb} Cabinet_{rng.randint(0, 3)}",
                          "action": json.dumps({"action": verb, "target": f"Cabinet_{t}"}),
                          "action_valid": rng.random() < 0.8, "status": rng.choice(["Success", "Failure", "WiP"]),
                          "repeated": rng.random() < 0.2, "reasoning": "look around first",
                          "feedback_lines": [f"feedback : spatial: Key_{t} is in Drawer_{i % 3}."]})
        episode = {"episode_id": ep_id, "scene_id": f"scene_{i % 5:02d}", "quest_id": f"q{i:03d}",
                   "objective": f"Put Apple_{i % 4} in Fridge_0 and close it", "won": rng.random() < 0.5,
                   "final_reward": round(rng.random(), 3), "num_turns": len(turns),
                   "num_invalid": sum(not t["action_valid"] for t in turns), "split": "train"}
        entries.append(build_entry(episode, turns, reader=HouseholdFactReader(), config_hash="synthetic"))
    return EpisodicStore.from_entries(entries)


ANSWER = 'I look around first.\n{"action": "look", "target": null}'


class FakeOpenAI:
    """An OpenAI-compatible chat-completions server on 127.0.0.1 with scripted faults.

    ``script(n, body) -> mode`` picks what the n-th request (from 0) gets:

    - ``ok``: a normal completion whose content is ``answer`` (a valid ``look`` action);
    - ``500`` / ``503``: a server error; ``429``: rate limited with ``Retry-After: 0``;
    - ``400``: a client error (not worth retrying);
    - ``hang``: no answer for ``hang_s`` seconds (past the client's timeout);
    - ``stall``: headers and a few body bytes, then silence for ``hang_s`` seconds;
    - ``close``: the connection is closed without any response;
    - ``badjson``: 200 with a truncated JSON body; ``shape``: 200 with JSON lacking ``choices``;
    - ``cut``: 200 whose body stops half-way (the connection drops before Content-Length bytes);
    - ``slow``: a normal completion after ``slow_s`` seconds (concurrency is counted meanwhile);
    - ``401`` / ``403`` / ``404``: auth refused / forbidden / unknown model (OpenAI's bodies);
    - ``context``: 400 with vLLM's "maximum context length" message;
    - ``echo``: 502 whose body echoes the request headers (a misconfigured proxy).

    ``GET /v1/models`` lists ``models``. ``token_items`` (a list of ``logprobs.content``
    entries), when set, goes into every normal completion. ``max_in_flight`` is the most
    requests the server held at once.

    Example:
        with FakeOpenAI(lambda n, body: "500" if n < 2 else "ok") as server:
            cfg.model.base_url = server.url
    """

    def __init__(self, script=None, *, answer: str = ANSWER, hang_s: float = 5.0, slow_s: float = 0.1,
                 models: tuple = ("fake-model",), token_items: list | None = None):
        import threading

        self.script = script or (lambda n, body: "ok")
        self.answer = answer
        self.hang_s = hang_s
        self.slow_s = slow_s
        self.models = list(models)
        self.token_items = token_items
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests: list[tuple[dict, dict]] = []  # (headers, body) of every request
        self.modes: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = None
        self.custom = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "FakeOpenAI":
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                data = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in fake.models]})
                self.send_response(200 if self.path.rstrip("/").endswith("/models") else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                self.json_body = body  # what a dialect's respond() validates
                with fake._lock:
                    n = len(fake.requests)
                    # Header names as written in the HTTP docs (clients send them in any case).
                    fake.requests.append(({k.title(): v for k, v in self.headers.items()}, body))
                    mode = fake.script(n, body)
                    fake.modes.append(mode)
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    fake.respond(self, mode)
                finally:
                    with fake._lock:
                        fake.in_flight -= 1

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def completion(self) -> bytes:
        choice = {"index": 0, "message": {"role": "assistant", "content": self.answer}, "finish_reason": "stop"}
        if self.token_items is not None:
            choice["logprobs"] = {"content": self.token_items}
        return json.dumps({
            "id": "cmpl-1", "object": "chat.completion", "model": "fake", "choices": [choice],
            "usage": {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22},
        }).encode()

    def respond(self, h, mode: str) -> None:
        def send(status: int, data: bytes, headers: dict | None = None) -> None:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
            h.wfile.flush()

        if mode == "ok":
            send(200, self.completion())
        elif mode in ("500", "503", "400"):
            send(int(mode), b'{"error": {"message": "injected failure"}}')
        elif mode == "429":
            send(429, b'{"error": {"message": "slow down"}}', {"Retry-After": "0"})
        elif mode == "hang":
            self._stop.wait(self.hang_s)
            h.close_connection = True
        elif mode == "stall":
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", "100000")
            h.end_headers()
            h.wfile.write(b'{"choices": [')
            h.wfile.flush()
            self._stop.wait(self.hang_s)
            h.close_connection = True
        elif mode == "close":
            h.close_connection = True  # nothing sent: the client sees the connection drop
        elif mode == "badjson":
            send(200, self.completion()[:40])
        elif mode == "cut":
            data = self.completion()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.close_connection = True
        elif mode == "slow":
            self._stop.wait(self.slow_s)
            send(200, self.completion())
        elif mode == "401":
            send(401, json.dumps({"error": {"message": "Incorrect API key provided: sk-rel***key.", "type":
                                            "invalid_request_error", "code": "invalid_api_key"}}).encode())
        elif mode == "403":
            send(403, b'{"error": {"message": "You are not allowed to sample from this model"}}')
        elif mode == "404":
            send(404, b'{"error": {"message": "The model `nope` does not exist.", "code": "model_not_found"}}')
        elif mode == "context":
            send(400, json.dumps({"object": "error", "type": "BadRequestError", "code": 400, "message": (
                "This model's maximum context length is 2048 tokens. However, you requested 2144 tokens (2048 in "
                "the messages, 96 in the completion). Please reduce the length of the messages or completion.")})
                 .encode())
        elif mode == "shape":
            send(200, b'{"object": "error", "detail": "no choices here"}')
        elif mode == "custom":  # a test's own handler: server.custom(handler)
            self.custom(h)
        elif mode == "echo":
            echoed = {"Authorization": h.headers.get("Authorization"), **dict(h.headers)}
            send(502, json.dumps({"error": "bad gateway", "request_headers": echoed}).encode())
        else:
            raise ValueError(f"FakeOpenAI: unknown mode {mode!r}")


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped, counts as alive here: it is the leak)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
