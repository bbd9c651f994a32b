"""The ordered pool of ``pipeline.core.parallel``: every stage's worker processes (games, demos,
collect, evaluate, curve, the policy's rollouts) and the one partition their work is cut by."""

from __future__ import annotations

import os
import time

import pytest
from omegaconf import OmegaConf

from pipeline.core import parallel
from pipeline.core.conf_schema import NumericsConfig
from pipeline.core.parallel import OrderedPool, WorkerStalled, partition, shared, supervised

WARM_S = 600.0  # the bound while workers start (their start-up counts too: seconds under load)


def _job(ctx: dict, n: int) -> tuple:
    if n < 0:
        raise ValueError(f"job {n}")
    return ctx["tag"], n * n, os.getpid()


def _threads(_ctx, _job) -> str | None:
    return os.environ.get("OMP_NUM_THREADS")


def _read(_ctx, handle) -> tuple:
    return shared(handle), os.getpid()


def _work(_ctx, job: tuple[str, float]) -> int:
    """``("beat", s)``: s seconds, a beat every 0.1 s; ``("sleep", s)``: s seconds without one."""
    kind, seconds = job
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if kind == "beat":
            parallel.beat()
        time.sleep(0.1)
    return os.getpid()


def test_partition_cuts_consecutive_runs_of_the_size_in_order():
    assert partition(range(7), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert partition([], 4) == [] and partition("ab", 0) == [["a"], ["b"]]  # a size below 1 counts as 1


def test_one_worker_runs_every_job_here_with_its_context_and_pins_nothing():
    ticks: list[tuple] = []
    before = os.environ.get("OMP_NUM_THREADS")
    numerics = OmegaConf.structured(NumericsConfig(threads=7))
    with OrderedPool(1, context={"tag": "here"}, numerics=numerics, load_torch=False) as pool:
        assert pool.map(_job, range(4), progress=ticks.append) == [("here", n * n, os.getpid()) for n in range(4)]
        handle = pool.share(["an object"])
        assert pool.map(_read, [handle]) == [(["an object"], os.getpid())]  # shared() reads it here too
    assert ticks == [("here", n * n, os.getpid()) for n in range(4)]
    assert os.environ.get("OMP_NUM_THREADS") == before
    with pytest.raises(KeyError):  # released with its pool
        shared(handle)


def test_spawned_workers_get_the_context_and_return_results_in_job_order_and_raise_a_jobs_error():
    ticks: list[tuple] = []
    with OrderedPool(2, context={"tag": "sent"}) as pool:
        out = pool.map(_job, range(6), progress=ticks.append)
        assert [n for _, n, _ in out] == [n * n for n in range(6)]
        assert {t for t, _, _ in out} == {"sent"} and os.getpid() not in {p for _, _, p in out}
        assert sorted(ticks) == sorted(out)
        assert pool.map(_job, [3])[0][:2] == ("sent", 9)  # a later map: the same pool
        with pytest.raises(ValueError, match="job -1"):
            pool.map(_job, [1, -1, 2])


def test_waiting_is_called_while_spawned_workers_run_the_jobs():
    calls: list[float] = []
    with OrderedPool(2, stall_s=0) as pool:  # no watchdog: waiting alone sets the poll
        assert len(set(pool.map(_work, [("sleep", 2.5), ("sleep", 2.5)], waiting=lambda: calls.append(1.0)))) == 2
    assert len(calls) >= 2  # about once a second


def test_each_worker_pins_the_numerics_at_the_pools_threads_before_its_jobs():
    numerics = OmegaConf.structured(NumericsConfig(threads=3))
    assert os.environ.get("OMP_NUM_THREADS") != "5"
    with OrderedPool(2, numerics=numerics, threads=5, load_torch=False) as pool:
        assert set(pool.map(_threads, range(4))) == {"5"}
    with OrderedPool(2, numerics=numerics, load_torch=False) as pool:
        assert set(pool.map(_threads, range(4))) == {"3"}  # the config's own count


def test_a_shared_object_reaches_every_worker_and_a_later_share_restarts_them():
    with OrderedPool(2) as pool:
        first = pool.share({"memory": 1})
        assert pool.share(pool._objects[first.key]) == first  # the same object: the same handle, sent once
        got = pool.map(_read, [first] * 4)
        assert {obj["memory"] for obj, _ in got} == {1}
        second = pool.share("organizer")
        again = pool.map(_read, [first, second, first, second])
        assert [obj for obj, _ in again] == [{"memory": 1}, "organizer", {"memory": 1}, "organizer"]
        assert not {pid for _, pid in again} & {pid for _, pid in got}  # fresh workers, with both objects


@pytest.mark.timeout(120)
def test_with_job_beats_a_job_that_beats_runs_past_the_bound_and_one_that_takes_no_step_is_stopped():
    """``beats="job"`` (a collection's workers): progress is the job's own beat. A beating job
    outlives the bound, a worker idle after its job is not stalled, a silent job is stopped."""
    with OrderedPool(2, beats="job") as pool:
        with supervised(WARM_S):
            pool.map(_work, [("sleep", 0.2), ("sleep", 0.2)])  # both workers up
        with supervised(2.0):
            pids = pool.map(_work, [("beat", 5.0), ("sleep", 0.0)])  # one idles 5 s beside a beating one
            assert len(set(pids)) == 2
            t0 = time.monotonic()
            with pytest.raises(WorkerStalled, match=r"worker process \d+ of workers=2 \(running job 1 of 1\) made "
                                                    r"no progress for \d+ s \(agent.worker_stall_s=2 s: its job took "
                                                    r"no step\)"):
                pool.map(_work, [("sleep", 30.0)])
            assert time.monotonic() - t0 < 20


def test_the_pool_refuses_an_unknown_beat():
    with pytest.raises(ValueError, match="beats='step': expected 'process' or 'job'"):
        OrderedPool(2, beats="step")
