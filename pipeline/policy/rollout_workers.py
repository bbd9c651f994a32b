"""The policy's whole episodes in generated houses (DAgger's rollouts, the whole-episode probe)
in ``workers`` processes, merged in partition order: any worker count, the same rollouts.

:func:`pipeline.policy.dagger.play_houses` plays its tasks ``agent.batch_size`` episodes a
batch, one batched model call a turn. The batches are independent (each episode has its own
env, agent and expert; decoding is greedy), so they are the partition: :class:`RolloutWorkers`
plays each batch as one job, in this process (``workers=1``) or in fresh ``spawn`` processes
(:class:`pipeline.core.parallel.OrderedPool`), and returns the rollouts in task order::

    with RolloutWorkers(rollout_config(cfg), workers=stage_workers(cfg)) as pool:
        rollouts = pool.play(model, tokenizer, tasks, label=True, progress=bar.update)

Every job is computed the same way wherever it runs: one torch thread (a thread count changes
a float reduction's order, so a job's bytes would follow the machine otherwise), a backend of
its own (:func:`pipeline.policy.dagger.model_backend`: no prompt cache shared between
batches), the model in eval mode. The model and tokenizer travel to a worker inside the job,
through multiprocessing's own pickling between this run's processes (never a file): the
default policy is ~3 MB, and a job is a whole batch of episodes.
``tests/test_dagger.py`` checks that 1 and 2 workers give the same rollouts, labels
included, and that both equal :func:`~pipeline.policy.dagger.play_houses` run single-threaded.

Used by the ``policy`` stage (its DAgger rounds and its whole-episode probe, on the run's
``workers``: :func:`pipeline.stages.policy.rollout_workers`) and by the DAgger study
(:mod:`pipeline.policy.study`, ``--workers``). It is a :class:`pipeline.policy.dagger.Players`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from omegaconf import OmegaConf

from pipeline.core.conf_schema import Config
from pipeline.core.parallel import OrderedPool
from pipeline.policy.dagger import HouseTask, Rollout, model_backend, play_houses

THREADS = 1  # every job's torch threads, in this process and in a worker


def _init_worker(cfg: Config) -> Config:
    """A worker's start: the numerics pinned as the caller's, at one thread."""
    from pipeline.core.numerics import pin

    pin(OmegaConf.merge(cfg.numerics, {"threads": THREADS}))
    return cfg


def _play_batch(cfg: Config, job: tuple[Any, Any, list[HouseTask], bool]) -> list[Rollout]:
    """One batch of tasks, played by :func:`play_houses` on one thread with a backend of its own."""
    import torch  # deferred: heavy optional dependency (torch)

    model, tokenizer, tasks, label = job
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        model.eval()
        return play_houses(cfg, model_backend(cfg, model, tokenizer), tasks, label=label)
    finally:
        torch.set_num_threads(threads)


def batches(tasks: Sequence[HouseTask], size: int) -> list[list[HouseTask]]:
    """The partition: ``tasks`` cut every ``size`` (``agent.batch_size``), in order."""
    size = max(1, int(size))
    return [list(tasks[i:i + size]) for i in range(0, len(tasks), size)]


class RolloutWorkers:
    """Play :class:`~pipeline.policy.dagger.HouseTask` s in ``workers`` processes (1: this one).

    Args:
        cfg: the config to play with (:func:`pipeline.policy.dagger.rollout_config`'s: greedy);
            its ``agent.batch_size`` fixes the partition, its ``numerics`` the workers' pin.
        workers: processes (:func:`pipeline.core.parallel.stage_workers`); the rollouts do not
            depend on it. The processes start at the first :meth:`play` and serve every later one.
    """

    def __init__(self, cfg: Config, workers: int = 1):
        self.cfg = cfg
        self.workers = max(1, int(workers))
        self._pool = OrderedPool(self.workers, initializer=_init_worker, initargs=(cfg,), context=cfg)

    def __enter__(self) -> RolloutWorkers:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self._pool.close(cancel=exc_type is not None)

    def play(self, model: Any, tokenizer: Any, tasks: Sequence[HouseTask], *, label: bool,
             progress: Callable[[int], None] | None = None) -> list[Rollout]:
        """Every task's :class:`~pipeline.policy.dagger.Rollout`, in task order; with ``label``
        the expert's answer at every turn. ``progress(n)`` as a batch of ``n`` episodes finishes.
        ``model`` is left in the mode (train/eval) it came in."""
        parts = batches(tasks, self.cfg.agent.batch_size)
        tick = None if progress is None else (lambda rolls: progress(len(rolls)))
        was_training = model.training
        try:
            done = self._pool.map(_play_batch, [(model, tokenizer, part, label) for part in parts], progress=tick)
        finally:
            model.train(was_training)
        return [r for part in done for r in part]
