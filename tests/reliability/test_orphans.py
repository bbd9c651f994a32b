"""Trust, third round (issue 66, findings 2 and 3): worker processes that stop, and parents that die.

Every process a stage starts, through the one mechanism of :mod:`pipeline.core.parallel`:
:class:`~pipeline.core.parallel.OrderedPool`'s workers (``games``, ``demos``, ``curve``, the
policy's rollouts), a collection's workers (``evaluate``) and the policy's data-parallel
training helpers. A stopped worker (SIGSTOP) used to hang the pool's stages and the training
for ever; now it fails them within ``agent.worker_stall_s``, naming it and the bound. A killed
parent (SIGKILL, or SIGTERM: ``timeout``, an OOM killer, ``dvc queue kill``) used to leave the
workers (and the resource tracker) running under PID 1, a collection's still playing into the
checkpoints a rerun plays; now they stop within seconds, and a stage takes SIGTERM as Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from .conftest import kill_when, subprocess_env
from .helpers import pid_alive

ROOT = Path(__file__).resolve().parents[2]
GONE_S = 20.0  # a killed parent's workers are gone within this: die_with_parent's poll + grace, with margin
WARM_S = 600.0  # the bound while workers start (their start-up counts too: seconds under load), before the test's


def _sleep(_ctx, seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _session(sid: int) -> list[str]:
    """The processes of session ``sid`` but its leader: a started stage's workers and resource tracker."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == sid:
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(f"{d} {cmd[:120]}")
    return out


def _wait_gone(sid: int, timeout: float = GONE_S) -> list[str]:
    end = time.monotonic() + timeout
    while (left := _session(sid)) and time.monotonic() < end:
        time.sleep(0.1)
    return left


def _kill_session(sid: int) -> None:
    for line in _session(sid):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


# --------------------------------------------------------------------------- finding 2: a stopped worker


@pytest.mark.timeout(120)
def test_a_stopped_pool_worker_fails_the_map_naming_it_its_job_and_the_bound():
    """SIGSTOP on a worker of the pool (games, demos, curve and rollouts run their jobs in it):
    map used to wait for ever; now it stops every worker and raises within the bound."""
    from pipeline.core.parallel import OrderedPool, WorkerStalled, supervised

    with OrderedPool(2) as pool:
        with supervised(WARM_S):
            pids = set(pool.map(_sleep, [0.2, 0.2, 0.2, 0.2]))  # the workers are up
        victim = min(pids)
        threading.Timer(0.5, os.kill, (victim, signal.SIGSTOP)).start()
        t0 = time.monotonic()
        with supervised(2.0, stage="curve"), \
                pytest.raises(WorkerStalled, match=rf"^curve: worker process {victim} of workers=2 \(running job "
                                                   rf"[12] of 2\) made no progress for \d+ s \(agent.worker_stall_s=2 s"):
            pool.map(_sleep, [30, 30])
        assert time.monotonic() - t0 < 20
    assert not any(pid_alive(pid) for pid in pids)  # the stopped one and its sibling: stopped, reaped


def test_the_pool_bound_is_the_schemas_default_outside_a_stage():
    from pipeline.core import parallel
    from pipeline.core.conf_schema import AgentConfig

    assert parallel.supervision().stall_s == parallel.DEFAULT_STALL_S == AgentConfig().worker_stall_s == 1800.0
    with parallel.supervised(0):
        assert parallel.OrderedPool(2).stall_s == 0  # 0: wait for ever, as for a collection's workers
    assert parallel.OrderedPool(2).stall_s == 1800.0


@pytest.mark.timeout(120)
def test_a_stopped_worker_fails_its_stage_with_exit_1_under_the_configs_bound(tiny_cfg, monkeypatch, capsys):
    """Through a stage's runner and a real user of the pool (the demos' workers): the config's
    ``agent.worker_stall_s`` is the bound, and the stage exits 1 with one line naming it."""
    from pipeline.core.parallel import supervised
    from pipeline.policy.demo_workers import demo_pool
    from pipeline.stages import common

    cfg = OmegaConf.merge(tiny_cfg, {"agent": {"worker_stall_s": 2}})
    monkeypatch.setattr(common, "load_params", lambda **_: cfg)
    seen: set[int] = set()

    def body(cfg, root, args):
        with demo_pool(cfg, root, [], {}, workers=2) as pool:
            with supervised(WARM_S, stage="demos"):
                seen.update(pool.map(_sleep, [0.2, 0.2, 0.2, 0.2]))
            threading.Timer(0.5, os.kill, (min(seen), signal.SIGSTOP)).start()
            pool.map(_sleep, [30, 30])

    assert common.run_stage("demos", body, [], pipelines=("model",)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: demos: worker process {min(seen)} of workers=2 (running job "), err
    assert "agent.worker_stall_s=2 s" in err and len(err.strip().splitlines()) == 1
    assert not any(pid_alive(pid) for pid in seen)


HELPER_SCRIPT = r'''
import contextlib, json, multiprocessing, os, signal
from pipeline.core.parallel import WorkerStalled, supervised
from pipeline.policy.fingerprint import tiny_setup
from pipeline.policy.model import build_model, train


def main():
    tok, pol, units = tiny_setup(micro_batches=3)
    model = build_model(tok, pol, seed=0)

    bound = contextlib.ExitStack()

    def progress(n, loss):  # after step 0: every helper stops (a wedge, SIGSTOP), under a bound of 2 s
        for child in multiprocessing.active_children():
            if child.name.startswith("policy-train-helper"):
                os.kill(child.pid, signal.SIGSTOP)
        bound.enter_context(supervised(2.0, stage="policy"))

    try:
        with supervised(600.0), bound:  # while the helper starts (spawn, torch: seconds under load), which counts too
            train(model, units, pol, seed=0, pad_id=int(tok.pad_token_id), progress=progress, processes=2)
        error = None
    except WorkerStalled as exc:
        error = str(exc)
    print("RESULT " + json.dumps({"error": error, "children": len(multiprocessing.active_children())}))


if __name__ == "__main__":  # the helpers are spawned: they import this file as __mp_main__
    main()
'''


@pytest.mark.timeout(300)
def test_a_stopped_training_helper_fails_the_step_instead_of_hanging_it(tmp_path):
    """SIGSTOP on the data-parallel training's helper: the step's barrier used to wait for ever."""
    script = tmp_path / "train_stalled.py"
    script.write_text(HELPER_SCRIPT)
    p = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=240)
    finally:
        _kill_session(p.pid)
        p.kill()
    assert p.returncode == 0, out[-2000:] + err[-3000:]
    result = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    assert result["error"] is not None and result["error"].startswith(
        "policy: policy training: helper process 1 (policy-train-helper-1, pid "), result
    assert ") at step 1 made no progress for " in result["error"] and "agent.worker_stall_s=2 s" in result["error"]
    assert result["children"] == 0


# --------------------------------------------------------------------------- finding 3: orphans

STAGE_SCRIPT = r'''
import os, sys, time
from pathlib import Path
from omegaconf import OmegaConf
from pipeline.core.parallel import OrderedPool
from pipeline.stages import common


def job(_ctx, seconds):
    time.sleep(seconds)
    return os.getpid()


def body(cfg, root, args):
    try:
        with OrderedPool(2) as pool:
            pool.map(job, [0.3, 0.3, 0.3, 0.3])
            print("playing", flush=True)
            pool.map(job, [120, 120])  # a long job in each worker
    finally:
        print("cleanup ran", flush=True)


if __name__ == "__main__":
    common.load_params = lambda **_: OmegaConf.create({"agent": {"worker_stall_s": 1800}})
    common.project_root = lambda: Path(".")
    sys.exit(common.run_stage("curve", body, []))
'''


def _start(argv: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    """A process in a session of its own, its output in files (a pipe would wait for every orphan holding it)."""
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(argv, cwd=cwd, env=subprocess_env(), stdout=out, stderr=err, start_new_session=True)


def _until(cond, p: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert p.poll() is None and time.monotonic() < end, "the process ended or never got there"
        time.sleep(0.1)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_stage_leaves_no_worker_or_resource_tracker_running(tmp_path, sig):
    """The pool's workers and the resource tracker used to live on under PID 1 (a 120 s job each
    here); now SIGTERM takes the stage's Ctrl-C path (its cleanup runs, exit non-zero) and
    after SIGKILL the workers see their parent gone: nothing of the session is left."""
    script = tmp_path / "stage.py"
    script.write_text(STAGE_SCRIPT)
    log = tmp_path / "stage.log"
    p = _start([sys.executable, str(script)], tmp_path, log)
    try:
        _until(lambda: "playing" in log.with_suffix(".out").read_text(), p)
        time.sleep(0.5)
        assert len(_session(p.pid)) >= 3  # two workers and the resource tracker
        p.send_signal(sig)
        p.wait(timeout=60)
        left = _wait_gone(p.pid)
    finally:
        _kill_session(p.pid)
        p.kill()
    assert not left, f"still running {GONE_S} s after the stage ended: {left}"
    assert p.returncode != 0
    if sig == signal.SIGTERM:
        assert "cleanup ran" in log.with_suffix(".out").read_text(), log.with_suffix(".err").read_text()[-3000:]


COLLECTION_SCRIPT = r'''
import json, sys, time
from pathlib import Path

from pipeline.envs.household.env import HouseholdEnv

_step = HouseholdEnv.step


def _slow_step(self, *a, **k):
    time.sleep(5.0)
    return _step(self, *a, **k)


HouseholdEnv.step = _slow_step  # at module level: the spawned workers run this file as __mp_main__ too


def main():
    from omegaconf import OmegaConf
    from pipeline.core.config import validate
    from pipeline.session.collection import _play_in_workers
    from pipeline.session.rollout import tasks_from_manifest

    spec = json.loads(Path(sys.argv[1]).read_text())
    cfg = validate(OmegaConf.create(spec["cfg"]))
    tasks = tasks_from_manifest(spec["rows"], split="train", master_seed=cfg.seed)
    _play_in_workers(cfg, Path(spec["root"]), tasks, spec["scenes"], Path(spec["ckpt"]), "collect [react]", None)


if __name__ == "__main__":
    main()
'''


@pytest.mark.timeout(180)
def test_a_killed_collections_workers_stop_playing_into_its_checkpoints(tiny_cfg, tiny_games, tmp_path):
    """A collection's workers (raw spawned processes, not daemons) used to play on after their
    parent was SIGKILLed, racing a rerun on the same checkpoints; now they stop within seconds
    (a step takes 5 s here: killed before any episode ends, none is ever checkpointed)."""
    cfg = OmegaConf.merge(tiny_cfg, {"workers": 2, "agent": {"batched": False}})
    ckpt = tmp_path / "ckpt"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cfg": OmegaConf.to_container(cfg, resolve=True), "rows": tiny_games.rows,
                                "scenes": tiny_games.scenes, "root": str(tiny_games.root), "ckpt": str(ckpt)}))
    script = tmp_path / "collect.py"
    script.write_text(COLLECTION_SCRIPT)
    p = _start([sys.executable, str(script), str(spec)], ROOT, tmp_path / "collect.log")
    try:
        _until(lambda: len(_session(p.pid)) >= 3, p)  # both workers started (and the resource tracker)
        time.sleep(3)  # playing their first steps
        p.kill()
        p.wait(timeout=60)
        left = _wait_gone(p.pid)
    finally:
        _kill_session(p.pid)
    assert not left, f"still running {GONE_S} s after their parent was killed: {left}"
    assert not list(ckpt.rglob("*.json"))  # nothing played on into the checkpoints


def test_sigterm_stops_a_stage_as_ctrl_c_does_and_says_what_was_kept(project):
    """``timeout``, ``dvc queue kill`` and a container's stop send SIGTERM: it used to kill the
    stage where it stood (exit -15, no word of its checkpoints); now it is the Ctrl-C path."""
    project.configure("agent.batched=false", "workers=1")  # one process: episodes finish one by one
    proc = project.start("collect", env={"REL_STEP_DELAY": "0.05"})
    rc, _, err = kill_when(proc, lambda: len(project.checkpoint_files()) >= 1, signal.SIGTERM)
    assert rc == 130, err[-2000:]
    assert "interrupted: " in err and " finished episodes kept in " in err and "Traceback" not in err
    assert not (project.root / "data" / "episodes").exists()  # nothing half-written
