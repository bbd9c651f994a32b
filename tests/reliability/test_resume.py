"""Interrupt and resume: SIGKILL / Ctrl-C part way through ``collect`` and ``evaluate``.

Every test runs the real stage as a subprocess in a scratch project (``project`` fixture),
kills it, reruns it, and checks that (1) the rerun plays only the episodes that had not
finished, (2) the final ``episodes.parquet`` / ``turns.parquet`` are byte-identical to an
uninterrupted run, (3) a changed config or input never reuses checkpoints, (4) a kill in
the middle of a write leaves the previous files whole.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from pipeline.core.io import read_parquet
from pipeline.session.rollout import Checkpoints, Task, play, tasks_from_manifest

from .conftest import kill_when

OUTPUTS = ("episodes.parquet", "turns.parquet")


def _train_ids(project) -> set[str]:
    rows = read_parquet(project.root / "data" / "games" / "manifest.parquet").to_pylist()
    return {t.episode_id for t in tasks_from_manifest(rows, split="train", master_seed=0)}


def _outputs(project, folder: str = "data/episodes") -> dict[str, bytes]:
    return {name: project.read(f"{folder}/{name}") for name in OUTPUTS}


def _started(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _no_temp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or ".old-" in p.name]


@pytest.mark.parametrize("how", [pytest.param("external SIGKILL, one episode at a time", marks=pytest.mark.slow),
                                 "SIGKILL inside a batch"])
def test_sigkill_part_way_then_rerun_finishes_the_rest_byte_identical(project, collected_template, tmp_path, how):
    sequential = how.startswith("external")
    if sequential:  # episodes finish one by one (one process): a kill after the first file lands before the second
        project.configure("agent.batched=false", "workers=1")
        project.run("collect")
        reference = _outputs(project)
        shutil.rmtree(project.root / "data" / "episodes")  # what `dvc repro` does before rerunning a stage
    else:  # the default config: the session's uninterrupted collect is the reference
        reference = {name: (collected_template / "data" / "episodes" / name).read_bytes() for name in OUTPUTS}
    all_ids = _train_ids(project)

    if sequential:
        proc = project.start("collect", env={"REL_STEP_DELAY": "0.05"})
        rc, _, err = kill_when(proc, lambda: len(project.checkpoint_files()) >= 1, signal.SIGKILL)
    else:  # all episodes in one batch; the process kills itself right after the first one finishes
        done = project.run("collect", env={"REL_KILL_AFTER_CHECKPOINTS": "1"}, check=False)
        rc, err = done.returncode, done.stderr
    assert rc == -signal.SIGKILL, err[-2000:]
    kept = {p.stem for p in project.checkpoint_files()}
    assert 1 <= len(kept) < len(all_ids), kept
    assert not (project.root / "data" / "episodes" / "episodes.parquet").exists()

    log = tmp_path / "started.txt"
    rerun = project.run("collect", env={"REL_LOG_STARTS": str(log)})
    started = _started(log)
    assert sorted(started) == sorted(all_ids - kept)  # finished episodes are not played again
    assert f"resuming: {len(kept)} of {len(all_ids)} episodes already finished" in rerun.stderr
    assert _outputs(project) == reference
    metrics = json.loads(project.read("metrics/collect.json"))
    assert metrics["resumed_episodes"] == len(kept) and metrics["num_episodes"] == len(all_ids)
    assert not project.checkpoint_files()  # removed once the outputs are written
    assert not _no_temp_files(project.root / "data")


@pytest.mark.parametrize("victim", ["ep_train", "turns.parquet"])
def test_sigkill_in_the_middle_of_a_write_keeps_the_previous_files(collected_project, tmp_path, victim):
    """Killed half-way through a checkpoint file, or through the final turns.parquet (over the outputs of
    an uninterrupted run: :func:`collected_project`)."""
    project = collected_project
    previous = _outputs(project)
    previous_files = sorted(p.name for p in (project.root / "data" / "episodes").iterdir())
    all_ids = _train_ids(project)

    done = project.run("collect", env={"REL_KILL_IN_WRITE": victim}, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    # The previous run's outputs are whole and alone (no half-written file beside them).
    assert _outputs(project) == previous
    assert sorted(p.name for p in (project.root / "data" / "episodes").iterdir()) == previous_files
    kept = {p.stem for p in project.checkpoint_files()}
    if victim == "ep_train":
        assert kept == set()  # the torn checkpoint is a hidden temp file, never a checkpoint
        torn = [p for p in (project.root / ".checkpoints" / "collect").rglob("*.tmp")]
        assert len(torn) == 1 and torn[0].name.startswith(".ep_train")
    else:
        assert kept == all_ids  # every episode finished before the output write

    log = tmp_path / "started.txt"
    project.run("collect", env={"REL_LOG_STARTS": str(log)})
    assert sorted(_started(log)) == sorted(all_ids - kept)
    assert _outputs(project) == previous  # same config, same bytes
    assert not _no_temp_files(project.root / "data")  # the killed writer's temp folder is cleaned up
    assert not (project.root / ".checkpoints" / "collect").exists() or not any(
        (project.root / ".checkpoints" / "collect").rglob("*"))


def test_ctrl_c_stops_cleanly_and_says_what_was_kept(project, tmp_path):
    project.configure("agent.batched=false", "workers=1")  # one process: episodes finish one by one
    all_ids = _train_ids(project)
    proc = project.start("collect", env={"REL_STEP_DELAY": "0.05"})
    rc, _, err = kill_when(proc, lambda: len(project.checkpoint_files()) >= 1, signal.SIGINT)
    assert rc == 130, err[-2000:]
    kept = project.checkpoint_files()
    assert len(kept) == 1
    folder = kept[0].parent
    assert f"interrupted: 1 of {len(all_ids)} finished episodes kept in {folder}; rerun the stage" in err
    assert "Traceback" not in err
    assert not (project.root / "data" / "episodes").exists()  # nothing half-written

    log = tmp_path / "started.txt"
    rerun = project.run("collect", env={"REL_LOG_STARTS": str(log)})
    assert _started(log) == sorted(all_ids - {kept[0].stem})
    assert "resuming: 1 of 2" in rerun.stderr


@pytest.mark.slow
def test_a_changed_config_never_reuses_checkpoints(project, tmp_path):
    done = project.run("collect", env={"REL_KILL_AFTER_CHECKPOINTS": "1"}, check=False)
    assert done.returncode == -signal.SIGKILL
    (stale,) = project.checkpoint_files()
    stale_record = json.loads(stale.read_text())

    # Every step now costs something: a reused checkpoint would carry the old rewards.
    project.configure("env.reward.step_cost=0.01")
    log = tmp_path / "started.txt"
    rerun = project.run("collect", env={"REL_LOG_STARTS": str(log)})
    assert sorted(_started(log)) == sorted(_train_ids(project))
    assert "resuming" not in rerun.stderr
    assert stale.exists()  # the other config's work waits for that config to come back
    episodes = {e["episode_id"]: e for e in read_parquet(project.root / "data/episodes/episodes.parquet").to_pylist()}
    assert episodes[stale.stem]["final_reward"] != stale_record["episode"]["final_reward"]
    fresh = _outputs(project)
    shutil.rmtree(project.root / "data" / "episodes")
    project.run("collect")
    assert _outputs(project) == fresh

    # Back to the first config: its checkpoint is picked up again.
    project.configure()
    log2 = tmp_path / "started2.txt"
    back = project.run("collect", env={"REL_LOG_STARTS": str(log2)})
    assert "resuming: 1 of 2" in back.stderr and stale.stem not in _started(log2)


def test_checkpoint_key_follows_every_input_and_only_those(tiny_cfg, tiny_games, tmp_path):
    """Config keys collect reads, task prompts, manifest, templates, feedback file, code: new key."""
    from omegaconf import OmegaConf

    from pipeline.core.config import validate
    from pipeline.session.collection import checkpoint_dir

    root = tmp_path / "root"
    shutil.copytree(tiny_games.games_dir, root / "data" / "games")
    shutil.copytree(Path(__file__).resolve().parents[2] / "conf" / "templates", root / "conf" / "templates")
    tasks = lambda: tasks_from_manifest(tiny_games.rows, split="train", master_seed=0)  # noqa: E731

    def key(cfg=tiny_cfg, ts=None, name="collect"):
        return checkpoint_dir(cfg, root, ts or tasks(), name).name

    def with_(dotted, value):
        raw = OmegaConf.to_container(tiny_cfg, enum_to_str=True)
        OmegaConf.update(node := OmegaConf.create(raw), dotted, value)
        return validate(node)

    base = key()
    assert key() == base  # deterministic
    for dotted, value in [("seed", 1), ("env.max_steps", 9), ("env.reward.win", 2.0), ("user.noise", 0.2),
                          ("agent.epsilon", 0.1), ("agent.batch_size", 3), ("sampling.temperature", 0.3),
                          ("prompts.strict", False), ("grounding.unknown_type", "reject"), ("model.timeout_s", 5.0)]:
        assert key(with_(dotted, value)) != base, dotted
    for dotted, value in [("memory.topk", 1), ("experiment.bootstrap_samples", 10), ("grounding.save_format", "json"),
                          ("paths.metrics", "m2")]:
        assert key(with_(dotted, value)) == base, f"{dotted} is not read by collect: it must not discard work"

    prompted = tasks()
    prompted[0].system_prompt = "a re-rendered prompt"  # evaluate: the render stage's output changed
    assert key(ts=prompted) != base
    template = root / "conf" / "templates" / "system_compact.txt"
    template.write_text(template.read_text() + "\nOne more rule.\n")
    assert key() != base
    after_template = key()
    manifest = root / "data" / "games" / "manifest.parquet"
    manifest.write_bytes(manifest.read_bytes() + b"\0")
    assert key() != after_template


def test_a_foreign_or_broken_checkpoint_is_replayed_not_trusted(tiny_cfg, tiny_games, tmp_path, capsys):
    from pipeline.session.collection import make_factories

    tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=0)
    make_env, make_agent, make_user = make_factories(tiny_cfg, tiny_games.root, tiny_games.scenes)
    ckpts = Checkpoints(tmp_path / "ckpt")
    reference = play(tasks, make_env=make_env, make_agent=make_agent, make_user=make_user, checkpoints=ckpts)
    a, b = (ckpts.path(t.episode_id) for t in tasks)
    b.write_text(a.read_text())  # another episode's record under b's name
    a.write_text('{"episode": {"episode_id": ')  # torn (not written by our atomic writer, but on disk)
    started = []

    def counting_env(task):
        started.append(task.episode_id)
        return make_env(task)

    again = play(tasks, make_env=counting_env, make_agent=make_agent, make_user=make_user, checkpoints=ckpts)
    assert started == [t.episode_id for t in tasks]
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(reference))
    err = capsys.readouterr().err
    assert f"ignoring checkpoint {a}" in err and f"ignoring checkpoint {b}" in err


@pytest.mark.slow
def test_evaluate_killed_then_resumed_is_byte_identical(rendered_project, tmp_path):
    project, cond = rendered_project, "C2"  # collect + ground + merge + store + render already run
    project.run("evaluate", "--condition", cond)
    folder = f"data/eval/{cond}"
    reference = _outputs(project, folder)
    shutil.rmtree(project.root / folder)

    done = project.run("evaluate", "--condition", cond, env={"REL_KILL_AFTER_CHECKPOINTS": "1"}, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    kept = {p.stem for p in project.checkpoint_files(f"evaluate-{cond}")}
    assert len(kept) == 1
    log = tmp_path / "started.txt"
    rerun = project.run("evaluate", "--condition", cond, env={"REL_LOG_STARTS": str(log)})
    assert "resuming: 1 of 2" in rerun.stderr
    assert kept.isdisjoint(_started(log)) and len(_started(log)) == 1
    assert _outputs(project, folder) == reference
    assert (project.root / "metrics" / "eval" / f"{cond}.json").exists()


def test_a_ctrl_c_during_a_destructor_still_stops_the_loop(capsys):
    """Python prints and swallows an exception raised in ``__del__``: the flag must survive it."""
    import os

    from pipeline.session.collection import sigint_flag

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is handled by something else in this process")

    class Game:  # like jericho's FrotzEnv, which unloads its interpreter in __del__
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(10_000))  # the handler runs here, inside __del__

    with sigint_flag() as interrupted:
        game = Game()
        del game
        assert interrupted.is_set()
        with pytest.raises(KeyboardInterrupt):  # outside a destructor Ctrl-C raises at once
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(10_000))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    assert "Traceback" not in capsys.readouterr().err

    steps = iter([False, True])
    with pytest.raises(KeyboardInterrupt):  # and play() stops at its next step
        play([Task("ep_x", "s", "q", "train", "o", "g.z8", [], [], 0)], make_env=_NoEnv, make_agent=_NoEnv,
             make_user=_NoEnv, should_stop=lambda: next(steps))


class _NoEnv:
    """Stands in for env, agent and user: only ``play``'s stop check is exercised."""

    def __init__(self, task):
        pass

    def reset(self, *a):
        return {}

    def act(self, obs):
        from pipeline.agents.base import AgentStep

        return AgentStep(action={"action": "look", "target": None}, reasoning="", generated_text="")

    def step(self, action):
        return {}, 0.0, False, {"valid": True}

    def step_feedback(self, *a):
        from types import SimpleNamespace

        return SimpleNamespace(lines=[], status="WiP")


def _llm_eval_project(project, model_dir: Path) -> None:
    """A project whose prompts were rendered (``rendered_project``: rule agent, fast), switched to the
    llm agent on a tiny local model."""
    project.configure("agent=llm", "model=local", f"model.name_or_path={model_dir}", "agent.batch_size=2",
                      "sampling.max_new_tokens=12", "env.max_steps=6")


def _every_file(project, folder: str) -> dict[str, bytes]:
    """Every file under ``folder`` (Parquet and tensors), by relative path."""
    base = project.root / folder
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_llm_evaluate_killed_in_a_batch_then_resumed_is_byte_identical_tensors_included(rendered_project,
                                                                                      tiny_model_dir, tmp_path):
    """Issue 32, finding 1: the two eval tasks share one batch; the run is killed after the first
    episode's checkpoint. The rerun replays the batch whole (a turn is computed in the batch of an
    uninterrupted run, from an emptied prompt cache), so every byte matches, tensors included."""
    project, cond = rendered_project, "C1"
    _llm_eval_project(project, tiny_model_dir)
    folder = f"data/eval/{cond}"
    project.run("evaluate", "--condition", cond)
    reference = _every_file(project, folder)
    assert sum(name.startswith("tensors/") for name in reference) == 2
    shutil.rmtree(project.root / folder)

    done = project.run("evaluate", "--condition", cond, env={"REL_KILL_AFTER_CHECKPOINTS": "1"}, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert len(project.checkpoint_files(f"evaluate-{cond}")) == 1
    log = tmp_path / "started.txt"
    rerun = project.run("evaluate", "--condition", cond, env={"REL_LOG_STARTS": str(log)})
    assert "replaying a batch of 2 whole (1 of its episodes were checkpointed)" in rerun.stderr
    assert len(_started(log)) == 2
    assert _every_file(project, folder) == reference


@pytest.mark.slow
def test_llm_evaluate_in_two_worker_processes_gives_the_same_bytes(rendered_project, tiny_model_dir):
    """workers=2 plays the fixed partition's batches side by side (a batch a job of the ordered
    pool): each batch is computed as in one process, so every file matches, tensors included."""
    project, cond = rendered_project, "C1"
    _llm_eval_project(project, tiny_model_dir)
    folder = f"data/eval/{cond}"
    project.configure("agent=llm", "model=local", f"model.name_or_path={tiny_model_dir}", "agent.batch_size=1",
                      "sampling.max_new_tokens=12", "env.max_steps=6", "workers=1")
    proc = project.run("evaluate", "--condition", cond)
    assert "[workers=" not in proc.stderr  # one process
    reference = _every_file(project, folder)
    shutil.rmtree(project.root / folder)
    project.configure("agent=llm", "model=local", f"model.name_or_path={tiny_model_dir}", "agent.batch_size=1",
                      "sampling.max_new_tokens=12", "env.max_steps=6", "workers=2")
    proc = project.run("evaluate", "--condition", cond)
    assert "[workers=2]" in proc.stderr
    assert _every_file(project, folder) == reference


def test_how_a_run_is_played_or_judged_is_not_part_of_its_config_hash(tiny_cfg):
    """workers and agent.max_error_fraction never change what an episode is: checkpoints stay
    valid, and the config hash recorded in every episode (and the store) keeps its bytes."""
    from omegaconf import OmegaConf

    from pipeline.session.collection import collection_hash

    other = OmegaConf.merge(tiny_cfg, {"workers": 3, "agent": {"max_error_fraction": 0.1}})
    assert collection_hash(other) == collection_hash(tiny_cfg)
    assert collection_hash(OmegaConf.merge(tiny_cfg, {"agent": {"batch_size": 3}})) != collection_hash(tiny_cfg)
