"""Trust, second round (issue 43): each finding of the fault-injection review, reproduced.

The ScienceWorld ones (an authenticated gateway, a call that cannot hang, a crashed JVM never
back in the pool, the heap limit) need a real JVM and live in ``tests/test_scienceworld.py``;
the grounding generator's in ``tests/test_grounding.py``. Here: the ``ground`` stage against a
server that refuses the key, worker processes that stop answering, option injection into the
git revision of ``reprocheck`` and ``diff``, a local server launcher fooled by another listener,
the scaling study's exit code and partial rows, and credentials in ``model.base_url``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from .helpers import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-pw-43"


# --------------------------------------------------------------------------- grounding: no silent fallback


def _ground_with_llm(project, server) -> subprocess.CompletedProcess:
    """``collect``, then ``ground`` with the llm generator asking ``server``; the ground stage's process."""
    project.configure("grounding.generator=llm", "model=openai", f"model.base_url={server.url}",
                      "model.api_model=fake-model", "model.max_retries=0", "model.logprobs=false",
                      "agent.epsilon=0.5")  # mistakes: the simulated user comments, so the model is asked
    project.run("collect")
    return project.run("ground", check=False)


def test_the_ground_stage_stops_on_a_refused_key_instead_of_writing_extractive_grounding(project):
    """A 401 on every call used to give every episode the extractive grounding, exit 0."""
    with FakeOpenAI(lambda n, body: "401") as server:
        proc = _ground_with_llm(project, server)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "error: authentication failed: POST " in proc.stderr and "HTTP 401" in proc.stderr
    assert not (project.root / "data" / "grounding").exists()  # nothing written
    assert len(server.requests) == 1  # stopped at the first episode


def test_the_ground_stage_stops_when_every_answer_is_a_refusal(project):
    """Issue 66, finding 1: a refusal (or an empty or cut-off answer) on every call used to give every episode the
    extractive grounding, `fallbacks {'unparseable answer': n}`, exit 0: only transport errors counted."""
    with FakeOpenAI(answer="I cannot help with that.") as server:
        proc = _ground_with_llm(project, server)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "its answer was unusable on" in proc.stderr, proc.stderr[-2000:]
    assert "unparseable answer: no JSON object in the answer" in proc.stderr
    assert not (project.root / "data" / "grounding").exists()  # nothing written
    assert server.requests and {body["max_tokens"] for _, body in server.requests} == {512}  # grounding.max_new_tokens


# --------------------------------------------------------------------------- worker processes


@pytest.mark.timeout(180)
def test_a_wedged_worker_process_fails_the_collection_instead_of_hanging_it(tiny_cfg, tiny_games, tmp_path):
    """SIGSTOP on the worker processes (a wedged simulator, a stuck library): the run used to
    join them for ever; now it stops them after agent.worker_stall_s and fails naming them."""
    from pipeline.core.io import ArtifactError
    from pipeline.session.collection import _play_in_workers
    from pipeline.session.rollout import tasks_from_manifest

    cfg = OmegaConf.merge(tiny_cfg, {"workers": 2, "agent": {"batched": False, "worker_stall_s": 3}})
    tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=cfg.seed)
    stopped: list[int] = []

    def stop_workers():
        deadline = time.monotonic() + 60
        while len(stopped) < 2 and time.monotonic() < deadline:
            for p in multiprocessing.active_children():
                if p.pid and p.pid not in stopped:  # the collection's pool workers
                    os.kill(p.pid, signal.SIGSTOP)
                    stopped.append(p.pid)
            time.sleep(0.01)

    watcher = threading.Thread(target=stop_workers, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    with pytest.raises(ArtifactError, match=r"^collect \[react\]: worker process \d+ of workers=2 \(.*\) made no "
                                            r"progress for \d+ s \(agent.worker_stall_s=3 s: .*\) and was stopped "
                                            r"with its siblings; the finished episodes are kept in "):
        _play_in_workers(cfg, tiny_games.root, tasks, tiny_games.scenes, tmp_path / "ckpt", "collect [react]", None)
    assert time.monotonic() - t0 < 60
    assert len(stopped) == 2 and not any(p.pid in stopped for p in multiprocessing.active_children())


def test_the_new_limits_never_change_what_an_episode_is(tiny_cfg):
    """agent.worker_stall_s and the simulator's timeout and heap: checkpoints and recorded hashes stay."""
    from pipeline.session.collection import collection_hash

    other = OmegaConf.merge(tiny_cfg, {"agent": {"worker_stall_s": 5},
                                       "env": {"scienceworld": {"call_timeout_s": 5, "jvm_heap_mb": 512}}})
    assert collection_hash(other) == collection_hash(tiny_cfg)
    sw = OmegaConf.merge(tiny_cfg, {"env": {"name": "scienceworld_tiny", "world": "scienceworld"}})
    assert collection_hash(OmegaConf.merge(sw, {"env": {"scienceworld": {"call_timeout_s": 5}}})) == \
        collection_hash(sw)


@pytest.mark.parametrize("override, message", [
    ("agent.worker_stall_s=-1",
     "agent.worker_stall_s=-1.0: expected 0 (wait for ever) or a finite number of seconds >= 60"),
    ("agent.worker_stall_s=0.001", "agent.worker_stall_s=0.001: expected 0 (wait for ever) or a finite number of "
                                   "seconds >= 60 (a worker's start-up counts against it)"),
    ("env.scienceworld.call_timeout_s=0", "env.scienceworld.call_timeout_s=0.0: expected a finite number > 0"),
    ("env.scienceworld.jvm_heap_mb=16", "env.scienceworld.jvm_heap_mb=16: expected >= 128"),
])
def test_the_new_limits_are_range_checked(tiny_cfg, override, message):
    from pipeline.core.config import ConfigError, validate

    with pytest.raises(ConfigError) as info:
        validate(OmegaConf.merge(tiny_cfg, OmegaConf.from_dotlist([override])))
    assert message in str(info.value)


# --------------------------------------------------------------------------- git revisions


def test_reprocheck_refuses_a_revision_that_git_would_read_as_an_option(tmp_path, capsys):
    """`--rev=--output=<file>` made `git show` write that file and the check go on with an empty lock."""
    from pipeline.tools.reprocheck import ReproCheckError, committed_lock, main

    planted = tmp_path / "planted"
    with pytest.raises(ReproCheckError, match=r"--rev '--output=.*': expected a git revision"):
        committed_lock(ROOT, f"--output={planted}")
    assert main([f"--rev=--output={planted}"]) == 2
    assert "expected a git revision" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no file written by git
    assert "stages:" in committed_lock(ROOT, "HEAD")  # a real revision still reads


def test_reprocheck_scratch_without_a_golden_file_only_runs_and_keeps_with_keep(monkeypatch, capsys):
    """``--scratch OVERRIDES --keep`` without ``--golden``: the run is kept for ``results --snapshot``
    and compared with nothing; without ``--keep`` a golden file is still required."""
    import shutil

    from pipeline.tools import reprocheck

    ran: list = []
    monkeypatch.setattr(reprocheck, "scratch_repro", lambda root, overrides, work: ran.append((overrides, work)) or {})
    assert reprocheck.main(["--scratch", "experiment=tiny"]) == 2
    assert "--scratch needs --golden FILE (or --keep" in capsys.readouterr().err and not ran
    try:
        assert reprocheck.main(["--scratch", "experiment=tiny", "--keep"]) == 0
        assert ran and ran[0][0] == ["experiment=tiny"] and ran[0][1].is_dir()
        assert f"kept: {ran[0][1]} (scratch `dvc repro` of experiment=tiny" in capsys.readouterr().out
        # With --golden too, a differing output is compared and the kept copy named: the place to look.
        golden = ran[0][1] / "golden.json"
        golden.write_text(json.dumps({"overrides": ["experiment=tiny"], "outputs": {"reports": "x.dir"},
                                      "by_cpu_level": {reprocheck.cpu_level(): {}}}))
        assert reprocheck.main(["--scratch", "experiment=tiny", "--keep", "--golden", str(golden)]) == 1
        out = capsys.readouterr().out
        assert f"kept: {ran[1][1]}\n" in out and "reports: not produced (expected md5 x.dir)" in out
    finally:
        for _, work in ran:
            shutil.rmtree(work, ignore_errors=True)


def test_diff_refuses_a_revision_that_git_would_read_as_an_option():
    from pipeline.tools.diff.revisions import DiffError, open_rev

    for name in ("--output=/tmp/x", "-p", ""):
        with pytest.raises(DiffError, match="expected a git revision"):
            open_rev(ROOT, name)


# --------------------------------------------------------------------------- the local server launcher


class _Answering(BaseHTTPRequestHandler):
    """Any GET: 200 (what a health or models probe takes for a server)."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def _listener(port: int = 0):
    server = ThreadingHTTPServer(("127.0.0.1", port), _Answering)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_start_on_a_port_another_process_answers_on_fails(tmp_path):
    """Another listener on the port made start() succeed while the real server died ("address in use")."""
    from pipeline.llm.backends.serve import TransformersServe

    with _listener() as port:
        server = TransformersServe(tmp_path / "model", port=port, startup_s=30)
        try:
            with pytest.raises(RuntimeError, match=f"port {port} on 127.0.0.1 is in use by another process"):
                server.start()
        finally:
            server.stop()


def _sleeper(startup_s: float, *, hijack: bool):
    """A launcher (serve.py's subclass API) whose server prints a line and never listens; with
    ``hijack`` another listener binds its port after the free-port check."""
    from pipeline.llm.backends.serve import _answers, _LocalServer

    class Sleeper(_LocalServer):
        def start(self):
            self._prepare("sleeper", "sleeper_serve_")
            self._launch([sys.executable, "-c", "print('sleeper up', flush=True); import time; time.sleep(60)"],
                         dict(os.environ))
            deadline = time.monotonic() + 30
            while "sleeper up" not in self.log_tail() and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.ExitStack() as stack:
                if hijack:
                    stack.enter_context(_listener(self.port))
                self._wait_until("sleeper", lambda: _answers(f"http://127.0.0.1:{self.port}/v1/models"), startup_s)

    return Sleeper(None)


def test_a_listener_that_is_not_the_started_process_is_refused_and_the_log_kept():
    server = _sleeper(30, hijack=True)
    with pytest.raises(RuntimeError, match=r"another process answers on port \d+, not the one started here "
                                           r"\(pid \d+\) \(its log is kept: .*serve.log\)") as info:
        server.start()
    assert server.proc is None  # stopped
    assert "sleeper up" in str(info.value) and "sleeper up" in server.log_path.read_text()
    shutil.rmtree(server.log_path.parent)


def test_a_start_that_times_out_keeps_and_quotes_its_log(tmp_path):
    """On a start timeout the log used to be deleted before it was quoted."""
    from pipeline.llm.backends.serve import TransformersServe

    server = TransformersServe(tmp_path / "model", startup_s=1.0)
    with pytest.raises(RuntimeError, match=r"not answering after 1s \(its log is kept: .*serve.log\)"):
        server.start()
    assert server.log_path.is_file()
    sleeper = _sleeper(1.0, hijack=False)
    with pytest.raises(RuntimeError) as info:
        sleeper.start()
    assert "sleeper up" in str(info.value) and sleeper.log_path.is_file()
    for kept in (server, sleeper):
        shutil.rmtree(kept.log_path.parent)


# --------------------------------------------------------------------------- the scaling study


def test_scaling_run_exits_nonzero_when_a_point_fails(tmp_path, capsys):
    from pipeline.policy.scaling import main

    (tmp_path / "bundle").mkdir()
    rc = main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "out"), "--grid", "missing"])
    assert rc == 1
    assert "scaling: failed points: missing (exit 1)" in capsys.readouterr().err


def test_scaling_table_marks_partial_points(tmp_path):
    from pipeline.policy.scaling import table

    def record(point, done):
        curve = [{"step": 0, "oracle_plan_copied": 0.1}, {"step": 400, "oracle_plan_copied": 0.5}]
        return {"point": point, "done": done, "parameters": 1000, "steps": 400, "steps_planned": 800,
                "tokens_seen": 10**6, "final": {"oracle_first_step": 0.5, "plain_first_step": 0.2,
                                                "oracle_plan_copied": 0.5},
                "curve": curve, "final_loss": 1.0, "train_s": 10, "device_name": "cpu"}

    for point, done in (("d1", True), ("d2", False)):
        (tmp_path / f"{point}.json").write_text(json.dumps(record(point, done)))
    text = table(tmp_path)
    assert "| d1 | 1,000 |" in text and "| d2 (partial) | 1,000 |" in text
    assert "1 of 2 points are partial" in text


@pytest.mark.timeout(30)  # `run --jobs 0` started no point and waited for ever
@pytest.mark.parametrize("option, value", [("--jobs", "0"), ("--jobs", "-2"), ("--threads", "0"), ("--every", "-1"),
                                           ("--jobs", "two")])
def test_scaling_run_refuses_a_count_that_cannot_work(option, value, tmp_path, capsys):
    from pipeline.policy.scaling import main, run_grid

    (tmp_path / "bundle").mkdir()
    with pytest.raises(SystemExit) as info:
        main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "out"), "--grid", "d1",
              option, value])
    assert info.value.code == 2
    assert f"argument {option}: '{value}': expected an integer >= " in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=r"--jobs 0: expected a number of points trained at a time >= 1"):
        run_grid(tmp_path / "bundle", ["d1"], "cpu", 400, tmp_path / "out", 0, 1)


def _scaling_record(point, done, parameters=1000):
    curve = [{"step": 0, "oracle_plan_copied": 0.1}, {"step": 400, "oracle_plan_copied": 0.5}]
    return {"point": point, "done": done, "parameters": parameters, "steps": 400, "steps_planned": 800,
            "tokens_seen": 10**6,
            "final": {"oracle_first_step": 0.5, "plain_first_step": 0.2, "oracle_plan_copied": 0.5},
            "curve": curve, "final_loss": 1.0, "train_s": 10, "device_name": "cpu"}


def test_scaling_table_shows_the_last_runs_points_not_records_of_earlier_runs(tmp_path, capsys):
    """Issue 66, finding 6: `table` (and the table `run` prints) read every record in the folder: an earlier
    run's points, and an earlier run's final record of a point that now failed before its first probe."""
    from pipeline.policy.scaling import main, table

    out = tmp_path / "out"
    out.mkdir()
    for point in ("d1", "d2"):  # an earlier run's finished points
        (out / f"{point}.json").write_text(json.dumps(_scaling_record(point, True)))
    (tmp_path / "bundle").mkdir()  # no data variant in it: d2 fails before its first probe
    rc = main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(out), "--grid", "d2"])
    assert rc == 1
    printed = capsys.readouterr().out
    assert printed.strip() == table(out)
    assert "| d1 |" not in printed and "| d2 |" not in printed and "| d2 (no record) |" in printed
    assert "1 of 1 points of the run have no record" in printed
    assert f"1 record of earlier runs in {out} is left out (table --all shows them): d1." in printed
    assert not (out / "d2.json").exists()  # the earlier run's figures of d2 are gone
    assert "| d1 (earlier run) | 1,000 |" in table(out, earlier=True)
    main(["table", str(out), "--all"])
    assert "| d1 (earlier run) | 1,000 |" in capsys.readouterr().out
    (out / "d2.json").write_text(json.dumps(_scaling_record("d2", False, 2000)))  # d2's run, at its first probe
    text = table(out)
    assert "| d2 (partial) | 2,000 |" in text and "no record" not in text and "| d1" not in text


# --------------------------------------------------------------------------- credentials in URLs


def test_the_config_refuses_credentials_in_base_url_and_blanks_them_out_of_params(project):
    from pipeline.core.config import ConfigError, check, validate

    url = f"http://alice:{SECRET}@gpu-node:8000/v1"
    with pytest.raises(ConfigError) as info:
        validate(OmegaConf.merge(OmegaConf.load(project.root / "params.yaml"), {"model": {"base_url": url}}))
    assert "model.base_url='http://***@gpu-node:8000/v1': expected a URL without credentials" in str(info.value)
    assert SECRET not in str(info.value) and "alice" not in str(info.value)
    # `dvc exp run -S model.base_url=...` writes params.yaml before any check runs: the check blanks it
    params = project.root / "params.yaml"
    params.write_text(params.read_text().replace("  base_url: null", f"  base_url: {url}"))
    assert SECRET in params.read_text()
    with pytest.raises(ConfigError, match=r"expected a URL without credentials .*replaced by \*\*\* in params.yaml"):
        check(project.root, use_stamp=False)
    assert SECRET not in params.read_text() and "alice" not in params.read_text()


def test_credentials_in_a_url_are_in_no_log_error_or_cache_entry(tiny_cfg, tmp_path, caplog):
    """A backend built with `user:pass@host` (by hand: the config refuses it) connects with them and
    shows them nowhere: not in its logs, the HTTP client's request lines, errors or cache keys."""
    from pipeline.llm.backends import make_backend
    from pipeline.llm.backends.cache import ResponseCache

    def build(url):
        model = {"backend": "openai", "base_url": url, "api_model": "fake-model", "max_retries": 1,
                 "backoff_s": 0.0, "logprobs": False, "cache_dir": str(tmp_path / "cache")}
        return make_backend(OmegaConf.merge(tiny_cfg.model, model), tiny_cfg.sampling)

    caplog.set_level(logging.INFO)
    with FakeOpenAI(lambda n, body: "500" if n == 0 or n >= 2 else "ok") as server:
        url = server.url.replace("http://", f"http://alice:{SECRET}@")
        backend = build(url)
        ok = backend.generate([[{"role": "user", "content": "hi"}]], seeds=[1])[0]
        failed = backend.generate([[{"role": "user", "content": "another"}]], seeds=[1])[0]
        backend.close()
        assert server.requests[1][0].get("Authorization", "").startswith("Basic ")  # the credentials were used
    assert ok.error is None and failed.error and "http://***@127.0.0.1" in failed.error
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "HTTP Request: POST http://***@127.0.0.1" in logged and "retrying" in logged
    for text in (logged, failed.error, repr(backend)):
        assert SECRET not in text and "alice" not in text
    entries = list((tmp_path / "cache").rglob("*.json"))
    assert len(entries) == 1 and SECRET not in entries[0].read_text() and "alice" not in entries[0].read_text()
    plain = ResponseCache(tmp_path / "cache", base_url=server.url.replace("http://", "http://***@"))
    assert entries[0].stem == plain.key(backend.request_body([{"role": "user", "content": "hi"}], 1, None, None))
