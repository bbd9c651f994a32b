"""The ordered pool of ``pipeline.core.parallel`` (the games, demos and curve stages' workers)."""

from __future__ import annotations

import os

import pytest

from pipeline.core.parallel import OrderedPool


def _start(tag: str) -> dict:
    return {"tag": tag, "pid": os.getpid()}


def _job(ctx: dict, n: int) -> tuple:
    if n < 0:
        raise ValueError(f"job {n}")
    return ctx["tag"], n * n, ctx["pid"]


def test_one_worker_runs_every_job_here_with_its_context_and_no_initializer():
    calls: list[str] = []
    ticks: list[tuple] = []
    with OrderedPool(1, initializer=lambda: calls.append("init"), context={"tag": "here", "pid": os.getpid()}) as pool:
        assert pool.map(_job, range(4), progress=ticks.append) == [("here", n * n, os.getpid()) for n in range(4)]
    assert calls == [] and ticks == [("here", n * n, os.getpid()) for n in range(4)]


def test_spawned_workers_return_results_in_job_order_and_raise_a_jobs_error():
    ticks: list[tuple] = []
    with OrderedPool(2, initializer=_start, initargs=("worker",), context={"tag": "here"}) as pool:
        out = pool.map(_job, range(6), progress=ticks.append)
        assert [n for _, n, _ in out] == [n * n for n in range(6)]
        assert {t for t, _, _ in out} == {"worker"} and os.getpid() not in {p for _, _, p in out}
        assert sorted(ticks) == sorted(out)
        assert pool.map(_job, [3])[0][:2] == ("worker", 9)  # a later map: the same pool
        with pytest.raises(ValueError, match="job -1"):
            pool.map(_job, [1, -1, 2])
