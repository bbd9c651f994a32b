"""Run a stage's ``main()`` with test-only fault injection, chosen by environment variables.

    python tests/reliability/stage_runner.py collect
    python tests/reliability/stage_runner.py evaluate --condition C1
    python tests/reliability/stage_runner.py ground + merge + store + render --condition C1

Used by the reliability tests as the process they kill. Nothing here changes what the
stage computes; it only slows it down, records which episodes it starts, or kills the
process (SIGKILL: no cleanup runs, exactly like ``kill -9`` or the OOM killer) at a
chosen point:

- ``REL_STEP_DELAY=<seconds>``: sleep before every environment step (widens the window
  in which a test's external kill lands between two finished episodes);
- ``REL_LOG_STARTS=<file>``: append the id of every episode the stage starts playing;
- ``REL_KILL_AFTER_CHECKPOINTS=<k>``: SIGKILL right after the k-th checkpoint is saved;
- ``REL_KILL_IN_WRITE=<name>``: SIGKILL half-way through writing the artifact whose file
  name contains ``<name>`` (the temp file exists, half written, not yet renamed).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    delay = float(os.environ.get("REL_STEP_DELAY") or 0)
    if delay:
        from pipeline.envs.household.env import HouseholdEnv

        step = HouseholdEnv.step

        def slow_step(self, *a, **k):
            time.sleep(delay)
            return step(self, *a, **k)

        HouseholdEnv.step = slow_step

    log = os.environ.get("REL_LOG_STARTS")
    if log:
        import pipeline.session.collection as collect

        factories = collect.make_factories

        def logging_factories(*a, **k):
            make_env, make_agent, make_user = factories(*a, **k)

            def make_env_logged(task):
                with open(log, "a", encoding="utf-8") as fh:
                    fh.write(task.episode_id + "\n")
                return make_env(task)

            return make_env_logged, make_agent, make_user

        collect.make_factories = logging_factories

    kill_after = int(os.environ.get("REL_KILL_AFTER_CHECKPOINTS") or 0)
    if kill_after:
        from pipeline.session.rollout import Checkpoints

        save = Checkpoints.save
        saved = []

        def save_then_maybe_die(self, episode_id, record):
            save(self, episode_id, record)
            saved.append(episode_id)
            if len(saved) >= kill_after:
                _die()

        Checkpoints.save = save_then_maybe_die

    in_write = os.environ.get("REL_KILL_IN_WRITE")
    if in_write:
        import pipeline.core.io as io

        write_bytes, write_table = io.atomic_write_bytes, io.pq.write_table

        def half_then_die(path, data: bytes) -> None:
            with open(path, "wb") as fh:
                fh.write(data[: max(1, len(data) // 2)])
                fh.flush()
                os.fsync(fh.fileno())
            _die()

        def table_then_maybe_die(table, where, *a, **k):
            if in_write in Path(where).name:
                import io as _io

                buf = _io.BytesIO()
                write_table(table, buf, *a, **k)
                half_then_die(where, buf.getvalue())
            return write_table(table, where, *a, **k)

        def bytes_then_maybe_die(path, data):
            if in_write in Path(path).name:
                with io.atomic_path(path) as tmp:
                    half_then_die(tmp, data)
            return write_bytes(path, data)

        io.pq.write_table = table_then_maybe_die
        io.atomic_write_bytes = bytes_then_maybe_die


STAGES = ("games", "collect", "ground", "merge", "store", "render", "evaluate", "evaluate_reader", "curve")


def main(argv: list[str]) -> int:
    """Run one stage, or several in a row separated by ``+`` (``ground + merge + store``)."""
    install()
    import importlib
    import inspect

    commands: list[list[str]] = [[]]
    for arg in argv:
        if arg == "+":
            commands.append([])
        else:
            commands[-1].append(arg)
    for stage, *args in commands:
        if stage not in STAGES:
            raise SystemExit(f"stage_runner: unknown stage {stage!r} ({' | '.join(STAGES)})")
        stage_main = importlib.import_module(f"pipeline.stages.{stage}").main
        # A stage that takes argv gets exactly its own (never this runner's sys.argv).
        rc = stage_main(args) if inspect.signature(stage_main).parameters else stage_main()
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
