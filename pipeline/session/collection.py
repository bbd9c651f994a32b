"""Playing a collection of episodes: factories, checkpoints, resume, shards.

The library behind the ``collect`` and ``evaluate`` stages (and the policy's demos and
quality figures): :func:`run_collection` plays a list of tasks with an agent, a user and
per-episode checkpoints, and writes episodes, turns and tensors atomically.

    records, stats = run_collection(cfg, root, tasks, out_dir, scenes=scenes,
                                    ckpt_name="collect", desc="collect [llm]")

Finished episodes are checkpointed under ``.checkpoints/<name>/<config hash>-<inputs hash>/``
(outside the DVC outs, keyed so that a changed config or input never reuses them) so an
interrupted run (SIGKILL, Ctrl-C, a failed model call) resumes where it stopped and
writes the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import shutil
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import pipeline
from pipeline.agents import Agent, make_agent, plays_with_model, reads_prompt
from pipeline.agents.llm import SharedBackend
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError, config_hash, config_subtrees
from pipeline.core.io import (
    ArtifactError,
    atomic_dir,
    atomic_write_json,
    file_digest,
    read_json,
    read_parquet,
    tree_digest,
)
from pipeline.core.parallel import OrderedPool, WorkerStalled, beat, partition, stage_workers
from pipeline.core.schemas import backend_errors
from pipeline.envs import Env, make_env, unread_env_keys
from pipeline.llm.accounting import token_statistics
from pipeline.llm.backends import BackendError, is_local
from pipeline.llm.backends.transformers import prompt_cache_budget
from pipeline.llm.tensors import save_episode_tensors
from pipeline.session.episodes import TENSORS_DIR, statistics, write_episodes
from pipeline.session.online import play_online
from pipeline.session.rollout import Checkpoints, Task, play
from pipeline.users import FileFeedback, User, make_user

# Config subtrees whose change invalidates checkpointed episodes: everything a collection reads
# that can change what its episodes are (the online loop's grounding: files, timestamp, whether the
# prompt shows it; the memory slot's name in the agent's memory). The hash over them labels every
# episode (metadata.config_hash), so they are also the DVC params of every stage that plays a
# collection (collect, evaluate, evaluate_reader): `python -m pipeline.tools.deps --write` writes
# those from this list, and tests/test_e2e.py checks that these stages read nothing else.
CHECKPOINT_KEYS = ("seed", "env", "user", "agent", "model", "sampling", "prompts", "grounding.unknown_type",
                   "grounding.online", "grounding.files", "grounding.timestamp", "grounding.use_in_prompt",
                   "memory.io.slot_memory_name", "numerics")
# With the online loop's memory (grounding.online_memory: a condition's name), what its blocks are
# decides what an episode is too: these subtrees are hashed then, and only then (null leaves every
# hash as it was); they are DVC params of the stages that play a collection all the same (DVC
# cannot make a dependency conditional, so the stage reruns on a memory edit with the same bytes).
ONLINE_MEMORY_KEYS = ("grounding.online_memory", "memory", "condition")
# The DVC params of a stage that plays a collection: both lists, a key inside a listed subtree left
# to it (memory.io.slot_memory_name is in memory).
COLLECTION_PARAMS = tuple(k for k in CHECKPOINT_KEYS + ONLINE_MEMORY_KEYS
                          if not any(k.startswith(f"{o}.") for o in ONLINE_MEMORY_KEYS))
# Keys of those subtrees that decide how a run is played or judged, never what an episode is:
# left out, so changing them reuses checkpoints and keeps every recorded config hash. (The
# model's weights are an input, :func:`inputs_hash`: the model directory; the process count,
# the top-level ``workers``, is in no hashed subtree at all.)
CHECKPOINT_IGNORED = ("agent.worker_stall_s", "agent.max_error_fraction",
                      "env.scienceworld.call_timeout_s", "env.scienceworld.jvm_heap_mb",
                      "env.scienceworld.start_timeout_s")
# Keys that are functions of others (``env.world``: the package of ``env.name``'s world, checked where the
# world is looked up): no hash reads them, so naming them changes no episode's label.
DERIVED_KEYS = ("env.world",)
# A worker's time to stop as Ctrl-C stops it (its finished episodes are checkpointed already;
# a simulator is reaped) before it is killed.
WORKER_GRACE_S = 30.0


def collection_hash(cfg: Config) -> str:
    """The config hash a collection's episodes and checkpoints are keyed and labelled by.

    ``model.prompt_cache_mb`` enters as the budget it gives on ``model.device`` (a float;
    ``auto``: the per-device rule), so ``auto`` and the number it stands for there are one
    config: the same episodes, checkpoints and recorded hash. The ``env`` keys its world never
    reads are left out (:func:`pipeline.envs.unread_env_keys`).
    """
    keys = CHECKPOINT_KEYS + (ONLINE_MEMORY_KEYS if _online_memory(cfg) else ())
    plain = config_subtrees(cfg, keys) if isinstance(cfg, DictConfig) else copy.deepcopy(cfg)
    model = plain.get("model")
    if isinstance(model, dict) and "prompt_cache_mb" in model:
        model["prompt_cache_mb"] = prompt_cache_budget(model["prompt_cache_mb"], model.get("device") or "cpu")
    return config_hash(plain, *keys, ignore=CHECKPOINT_IGNORED + DERIVED_KEYS + unread_env_keys(cfg))


def _online_memory(cfg: Config | dict) -> bool:
    """Whether the online loop's prompts carry a memory block (``grounding.online_memory``)."""
    return bool((cfg.get("grounding") or {}).get("online_memory"))


@contextlib.contextmanager
def inference_threads(cfg: Config) -> Iterator[None]:
    """Run a local transformers model on ``numerics.threads`` threads; restore after.

    A fixed count keeps the sampled tokens (float reduction order) independent of the
    machine's core count (:mod:`pipeline.core.numerics`); one thread also cannot
    oversubscribe cores that DVC, the simulated user or other jobs share. Its cost with
    the default model on an idle 2-core machine: 0.90x the agent steps/s of 2 threads
    (`python -m benchmarks --only collect_memory`).
    """
    if not plays_with_model(cfg.agent) or not is_local(cfg.model):
        yield
        return
    import torch  # deferred: heavy optional dependency (torch)

    before = torch.get_num_threads()
    torch.set_num_threads(cfg.numerics.threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def load_games(root: Path, cfg: Config) -> tuple[list[dict], dict]:
    games = root / cfg.paths.games
    manifest = read_parquet(games / "manifest.parquet").to_pylist()
    scenes = read_json(games / "scenes.json")
    return manifest, scenes


def make_factories(cfg: Config, root: Path, scenes: dict, *, feedback_source: FileFeedback | None = None,
                   shared: SharedBackend | None = None) -> tuple[Callable[[Task], Env], Callable[[Task], Agent],
                                                                 Callable[[Task], User]]:
    """Environment, agent and user constructors for one task each.

    The agents share one loaded model (``shared``: pass one to read its statistics after
    the run); ``feedback_source``, when given, answers for every episode instead of the
    simulated user.
    """
    shared = shared if shared is not None else SharedBackend()

    def env_for(task: Task) -> Env:
        return make_env(cfg, task, root, scenes)

    def agent_for(task: Task) -> Agent:
        return make_agent(cfg, seed=task.seed, shared=shared)

    def user_for(task: Task) -> User:
        return make_user(cfg, scenes, task, feedback_source)

    return env_for, agent_for, user_for


def inputs_hash(cfg: Config, root: Path, tasks: list[Task], feedback_source: Any = None) -> str:
    """Hash of everything besides the config that decides what a collection's episodes are.

    The stage's DVC deps as files: the games manifest, the tasks themselves (seeds, and the
    rendered system prompts ``evaluate`` attaches), the feedback file, the templates and
    knowledge base, the model directory (sizes and mtimes: weights can be large) and the
    ``pipeline`` package's source. A change in any of them gives a fresh checkpoint
    folder, so an interrupted run is never resumed with stale episodes.
    """
    parts: dict[str, Any] = {
        "manifest": file_digest(root / cfg.paths.games / "manifest.parquet"),
        "tasks": [asdict(t) for t in tasks],
        "code": tree_digest(Path(pipeline.__file__).parent),
        "conf": [tree_digest(root / "conf" / "templates"), tree_digest(root / "conf" / "knowledge")],
    }
    files = [cfg.prompts.system_template, cfg.prompts.entropy_template, cfg.agent.knowledge_base]
    if feedback_source is not None or cfg.user.source == "file":
        files.append(cfg.user.feedback_file)
    parts["files"] = [[str(f), file_digest(root / str(f))] for f in files if f]
    if plays_with_model(cfg.agent) and cfg.model.name_or_path:
        model_dir = root / str(cfg.model.name_or_path)
        parts["model"] = tree_digest(model_dir, contents=False)
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def checkpoint_dir(cfg: Config, root: Path, tasks: list[Task], ckpt_name: str, feedback_source: Any = None) -> Path:
    """``<paths.checkpoints>/<ckpt_name>/<config hash>-<inputs hash>``: outside every DVC out.

    DVC deletes a stage's outs before rerunning it, so checkpoints live beside them, keyed
    so that a changed config or input never reuses them (:func:`inputs_hash`).
    """
    key = f"{collection_hash(cfg)}-{inputs_hash(cfg, root, tasks, feedback_source)}"
    return root / cfg.paths.checkpoints / ckpt_name / key


@contextlib.contextmanager
def sigint_flag() -> Iterator[threading.Event]:
    """Remember a Ctrl-C in an event, besides raising ``KeyboardInterrupt`` as usual.

    A ``KeyboardInterrupt`` raised while a destructor runs (TextWorld's game interpreter
    unloads its library in ``__del__``) would be printed and swallowed by Python: there
    only the event is set, and the collection loop stops at its next step. Only installed
    over Python's default handler, in the main thread; restored on exit.
    """
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield flag
        return

    def on_sigint(signum, frame):
        flag.set()
        while frame is not None:
            if frame.f_code.co_name == "__del__":  # raising here would be swallowed and printed
                return  # the loop stops at its next step
            frame = frame.f_back
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_collection(cfg: Config, root: Path, tasks: list[Task], out_dir: Path, *, scenes: dict,
                   ckpt_name: str, desc: str, feedback_source: Any = None,
                   online: bool = False) -> tuple[list[dict], dict]:
    """Play ``tasks`` with checkpoints, write the collection to ``out_dir``; return (records, stats).

    ``online=True`` (the ``collect`` stage, with :func:`online_loop`) plays seed 000's online
    loop: a scene's k-th episode is prompted with the grounding of its k-1 earlier ones.
    Evaluation never does: every eval task is played with the prompt ``render`` wrote for
    it, verbatim (:func:`pipeline.session.online.play_online` refuses tasks that carry one).

    Finished episodes are checkpointed one file each as they complete; a rerun after a
    crash, SIGKILL or Ctrl-C replays only the others and writes the same bytes as an
    uninterrupted run. ``out_dir`` (episodes, turns, tensors) is replaced whole at the end,
    so it never mixes files of two runs. The checkpoints are removed once it is written.
    """
    for t in tasks:  # provenance: which config produced the episode (the store records it)
        t.metadata.setdefault("config_hash", collection_hash(cfg))
    ckpt_root = checkpoint_dir(cfg, root, tasks, ckpt_name, feedback_source)
    ckpts = Checkpoints(ckpt_root)
    resumed = sum(ckpts.load(t.episode_id) is not None for t in tasks)
    if resumed:
        print(f"resuming: {resumed} of {len(tasks)} episodes already finished (checkpoints in {ckpt_root})",
              file=sys.stderr)
    shared = SharedBackend()
    factories = make_factories(cfg, root, scenes, feedback_source=feedback_source, shared=shared)
    t0 = time.perf_counter()
    if worker_count(cfg, tasks) > 1 and not online:  # the batches side by side; then every record from its checkpoint
        _play_in_workers(cfg, root, tasks, scenes, ckpt_root, desc, feedback_source)
    records = _play_checkpointed(cfg, tasks, factories, ckpts, desc, shared,
                                 online=(root, ckpt_root) if online and root is not None else None)
    wall = time.perf_counter() - t0
    try:
        check_backend_errors(cfg, [t for r in records for t in r["turns"]], desc, first_error=shared.first_error)
    except BackendError:
        # replayed, not resumed, once the server is fixed: a checkpointed failed turn is no result
        shutil.rmtree(ckpt_root, ignore_errors=True)
        raise
    episodes, turns = write_collection(out_dir, records)
    stats = collection_stats(cfg, episodes, turns, wall=wall, resumed=resumed)
    cache = shared.prompt_cache_stats()
    if cache is not None:  # prompt tokens reused across turns vs encoded (this run's)
        stats["prompt_cache"] = cache
    probe = shared.constraint_probe()
    if probe is not None:  # the form the server enforced, what it said to each, and a fallback to free
        stats["structured_output"] = asdict(probe)
    shutil.rmtree(ckpt_root, ignore_errors=True)
    return records, stats


def check_backend_errors(cfg: Config, turns: list[dict], desc: str, *, first_error: str | None = None) -> None:
    """Stop a run whose model calls failed on more than ``agent.max_error_fraction`` of its turns.

    ``agent.on_backend_error=record`` keeps a single failed call as a failed turn; a run
    where most calls failed (an unreachable server, a refused request, a storm of 500s)
    measured the server, not the agent, and must not be read as a result.

    Raises:
        BackendError: naming the counts, the limit and the first failure (``first_error``,
            when this process saw it; else the first failed turn).
    """
    counts = backend_errors(turns)
    limit = cfg.agent.max_error_fraction
    if counts["backend_error_turns"] and counts["backend_error_rate"] > limit:
        if first_error is None:
            t = next(t for t in turns if t.get("stop_reason") == "error")
            first_error = f"episode {t['episode_id']} turn {t['turn_index']}"
        raise BackendError(
            f"{desc}: the model call failed on {counts['backend_error_turns']} of {len(turns)} turns "
            f"({counts['backend_error_rate']:.0%}), more than agent.max_error_fraction={limit:g}, so nothing was "
            f"written; the first failure: {first_error}. Fix the server or model settings and rerun")


def online_loop(cfg: Config) -> bool:
    """Whether collection runs seed 000's online loop (:mod:`pipeline.session.online`): on
    with ``grounding.online``, for an agent that reads its prompt."""
    return cfg.grounding.online and reads_prompt(cfg.agent)


def _play_checkpointed(cfg: Config, tasks: list[Task], factories: tuple, ckpts: Checkpoints, desc: str,
                       shared: SharedBackend, online: tuple[Path, Path] | None = None,
                       heartbeat: Callable[[], None] | None = None, quiet: bool = False) -> list[dict]:
    """:func:`pipeline.session.rollout.play` under a progress bar, Ctrl-C flag and thread cap.

    ``online=(root, work_dir)`` plays seed 000's online loop (:func:`pipeline.session.online.play_online`).
    ``heartbeat`` runs before every step (a worker's sign of progress to its pool).
    On Ctrl-C (exit 130) or a failure, says how many finished episodes the checkpoints keep;
    ``quiet`` (a worker's batch: its pool's caller has the bar and says it): no bar, no word.
    """
    make_env, make_agent_for, make_user = factories
    model_name = str(cfg.model.name_or_path or "") if plays_with_model(cfg.agent) else ""

    def kept() -> str:
        n = sum(ckpts.path(t.episode_id).exists() for t in tasks)
        return f"{n} of {len(tasks)} finished episodes kept in {ckpts.root}; rerun the stage to finish the rest"

    try:
        with tqdm(total=len(tasks), desc=desc, unit="ep", file=sys.stderr, disable=quiet) as bar, \
                sigint_flag() as interrupted, \
                inference_threads(cfg):
            def should_stop() -> bool:
                if heartbeat is not None:
                    heartbeat()
                return interrupted.is_set()

            def play_some(some: list[Task]) -> list[dict]:
                return play(some, make_env=make_env, make_agent=make_agent_for, make_user=make_user,
                            batch_size=cfg.agent.batch_size if cfg.agent.batched else 1, checkpoints=ckpts,
                            agent_name=str(cfg.agent.name), model_name=model_name,
                            preference_in_success=cfg.user.preference_in_success,
                            unknown_feedback=str(cfg.grounding.unknown_type), progress=bar,
                            should_stop=should_stop, whole_batches=plays_with_model(cfg.agent),
                            on_batch_start=shared.start_batch)

            if online is None:
                records = play_some(tasks)
            else:
                records = play_online(cfg, online[0], tasks, play_some, online[1])
    except KeyboardInterrupt:
        if not quiet:
            print(f"\ninterrupted: {kept()}", file=sys.stderr)
        raise SystemExit(130)
    except Exception:
        if not quiet:
            print(f"\nstopped: {kept()}", file=sys.stderr)
        raise
    return records


@dataclass
class _Playing:
    """What a collection's worker plays its batches with (the pool's context, sent to each worker
    once): the run's inputs, and the factories over one loaded model, made at its first batch."""

    cfg: Config
    root: Path
    scenes: dict
    ckpt_root: Path
    feedback_source: Any
    made: tuple | None = field(default=None, repr=False)  # (SharedBackend, factories) of this process

    def factories(self) -> tuple:
        if self.made is None:
            shared = SharedBackend()
            self.made = (shared, make_factories(self.cfg, self.root, self.scenes,
                                                feedback_source=self.feedback_source, shared=shared))
        return self.made


def _play_batch(ctx: _Playing, batch: list[Task]) -> int:
    """One batch into the shared checkpoints, beating before every step; its number of tasks."""
    shared, factories = ctx.factories()
    _play_checkpointed(ctx.cfg, batch, factories, Checkpoints(ctx.ckpt_root), "", shared, heartbeat=beat, quiet=True)
    return len(batch)


def worker_count(cfg: Config, tasks: list[Task]) -> int:
    """Processes the tasks' batches are played in: ``workers`` (:mod:`pipeline.core.parallel`), at most one per batch, and
    one (this process) for a model behind a server: its throughput is the server's
    (``model.max_concurrency``), and the start-up probe of what it can constrain, like its
    error counts, belongs to the one backend of the run."""
    if plays_with_model(cfg.agent) and not is_local(cfg.model):
        return 1
    size = cfg.agent.batch_size if cfg.agent.batched else 1
    return stage_workers(cfg, limit=len(partition(tasks, size)))


def _play_in_workers(cfg: Config, root: Path, tasks: list[Task], scenes: dict, ckpt_root: Path, desc: str,
                     feedback_source: Any) -> None:
    """Play the tasks' batches in ``workers`` processes (:class:`~pipeline.core.parallel.OrderedPool`,
    a batch a job, to whichever worker is free), each writing its finished episodes to the
    checkpoints the caller then assembles; a batch already checkpointed whole is not played again.

    Each batch is computed exactly as in one process (the same batch, the prompt cache
    emptied before it, the numerics pinned, ``numerics.threads`` threads), so the outputs are
    the same bytes. Workers are started fresh (``spawn``): torch and the model load in each. A
    worker whose batch starts no step for ``agent.worker_stall_s`` seconds is stopped with its
    siblings (the pool's job beats: :func:`~pipeline.core.parallel.beat` before every step).

    Raises:
        ArtifactError: a worker stalled. A batch's own error is raised as it was raised; either
            way the finished episodes are kept for a rerun, and this says so.
    """
    size = cfg.agent.batch_size if cfg.agent.batched else 1
    n = worker_count(cfg, tasks)
    ckpts = Checkpoints(ckpt_root)
    todo = [b for b in partition(tasks, size) if not all(ckpts.path(t.episode_id).exists() for t in b)]
    kept = f"the finished episodes are kept in {ckpt_root}: rerun the stage to finish the rest"
    context = _Playing(cfg, root, scenes, ckpt_root, feedback_source)
    bar = tqdm(total=len(tasks), initial=len(tasks) - sum(map(len, todo)), desc=f"{desc} [workers={n}]", unit="ep",
               file=sys.stderr)

    def count(_: Any = None) -> None:  # the episodes checkpointed so far, every worker's, about once a second
        bar.update(max(0, sum(ckpts.path(t.episode_id).exists() for t in tasks) - bar.n))

    try:
        with OrderedPool(n, context=context, numerics=cfg.numerics,
                         load_torch=plays_with_model(cfg.agent) and is_local(cfg.model),
                         stall_s=cfg.agent.worker_stall_s, beats="job", grace_s=WORKER_GRACE_S) as pool:
            pool.map(_play_batch, todo, progress=count, waiting=count)
    except WorkerStalled as exc:
        raise ArtifactError(f"{desc}: {exc}; {kept}") from None
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C here, or a worker's (SystemExit 130)
        if isinstance(exc, SystemExit) and exc.code != 130:
            raise
        print(f"\ninterrupted: {kept}", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception:
        print(f"\nstopped: {kept}", file=sys.stderr)
        raise
    finally:
        bar.close()


def write_collection(out_dir: Path, records: list[dict]) -> tuple[list[dict], list[dict]]:
    """Replace ``out_dir`` with the records' episodes, turns and tensors; return (episodes, turns)."""
    episodes = [r["episode"] for r in records]
    turns = [t for r in records for t in r["turns"]]
    with atomic_dir(out_dir) as tmp:
        write_episodes(tmp, episodes, turns)
        for r in records:
            if r["tensors"]:
                save_episode_tensors(tmp / TENSORS_DIR / f"{r['episode']['episode_id']}.pt", r["tensors"])
    return episodes, turns


def collection_stats(cfg: Config, episodes: list[dict], turns: list[dict], *, wall: float,
                     resumed: int = 0) -> dict:
    """``metrics/collect.json`` of a collection: outcomes, token accounting, speed."""
    stats = statistics(episodes, turns)
    stats.update(token_statistics(turns, cfg.sampling.max_new_tokens))
    stats["resumed_episodes"] = resumed
    stats["wall_time_s"] = round(wall, 3)
    stats["steps_per_s"] = round(len(turns) / wall, 3) if wall > 0 else 0.0
    return stats


# ----------------------------------------------------------------------------- shards
# Collection past one machine: `--shard K/N` plays every N-th train task (K-th of them)
# into a shard folder, on any machine with the same checkout and params; `--merge DIR...`
# checks that the shards are the N pieces of this very config and writes the union to
# <paths.episodes> in the canonical order (what `ground` and `store` read). Tasks are
# seeded one by one (task_seed), so a merged collection holds the same episodes as one
# run; with a rule agent or agent.batched=false it is byte-identical (batched generation
# pads other prompts beside a task's, which may move a sampled token).

SHARD_FILE = "shard.json"


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)`` with ``0 <= K < N``.

    Raises:
        ConfigError: anything else, naming the value.
    """
    k, sep, n = str(text).partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit() or not 0 <= int(k) < int(n):
        raise ConfigError(f"--shard {text!r}: expected K/N with 0 <= K < N (e.g. 0/4)")
    return int(k), int(n)


def shard_tasks(tasks: list[Task], k: int, n: int) -> list[Task]:
    """The K-th of N interleaved shards of ``tasks`` (every task in exactly one shard)."""
    return [t for i, t in enumerate(tasks) if i % n == k]


def collect_shard(cfg: Config, root: Path, tasks: list[Task], k: int, n: int, out_dir: Path, *, scenes: dict,
                  feedback_source: Any = None) -> dict:
    """Play shard ``k`` of ``n`` of ``tasks`` into ``out_dir`` (+ its ``shard.json``); the stats."""
    part = shard_tasks(tasks, k, n)
    if not part:
        raise ConfigError(f"--shard {k}/{n}: no train task falls in this shard ({len(tasks)} tasks)")
    _, stats = run_collection(cfg, root, part, out_dir, scenes=scenes, ckpt_name=f"collect_shard_{k}of{n}",
                              desc=f"collect [{cfg.agent.name}] shard {k}/{n}", feedback_source=feedback_source,
                              online=online_loop(cfg))
    atomic_write_json(out_dir / SHARD_FILE, {
        "shard": k, "num_shards": n, "config_hash": collection_hash(cfg),
        "episode_ids": sorted(t.episode_id for t in part), "wall_time_s": stats["wall_time_s"]})
    return stats


def merge_shards(cfg: Config, tasks: list[Task], shard_dirs: list[Path], out_dir: Path) -> dict:
    """Union of shard folders into ``out_dir`` (episodes, turns, tensors); returns the stats.

    Raises:
        ArtifactError: a shard folder without its ``shard.json``, shards of another config
            or another split into N, a missing or repeated shard or episode.
    """
    want_hash = collection_hash(cfg)
    want_ids = [t.episode_id for t in tasks]
    seen: dict[int, Path] = {}
    episodes: list[dict] = []
    turns: list[dict] = []
    tensors: list[Path] = []
    wall = 0.0
    num = None
    for d in shard_dirs:
        meta = read_json(d / SHARD_FILE)
        if not isinstance(meta, dict) or not {"shard", "num_shards", "config_hash", "episode_ids"} <= set(meta):
            raise ArtifactError(f"{d / SHARD_FILE}: expected shard, num_shards, config_hash and episode_ids")
        if meta["config_hash"] != want_hash:
            raise ArtifactError(f"{d}: collected under another config (config_hash {meta['config_hash']}, "
                                f"this params.yaml gives {want_hash}); rerun that shard with this config")
        if num is not None and meta["num_shards"] != num:
            raise ArtifactError(f"{d}: shard {meta['shard']}/{meta['num_shards']}, the others are of {num}")
        num = int(meta["num_shards"])
        if meta["shard"] in seen:
            raise ArtifactError(f"shard {meta['shard']}/{num} given twice: {seen[meta['shard']]} and {d}")
        seen[int(meta["shard"])] = d
        expected = [t.episode_id for t in shard_tasks(tasks, int(meta["shard"]), num)]
        if sorted(meta["episode_ids"]) != sorted(expected):
            raise ArtifactError(f"{d}: its episodes are not shard {meta['shard']}/{num} of this config's train tasks")
        episodes += read_parquet(d / "episodes.parquet").to_pylist()
        turns += read_parquet(d / "turns.parquet").to_pylist()
        tensors += sorted((d / TENSORS_DIR).glob("*.pt")) if (d / TENSORS_DIR).is_dir() else []
        wall += float(meta.get("wall_time_s") or 0.0)
    missing = sorted(set(range(num or 0)) - set(seen))
    if num is None or missing:
        raise ArtifactError(f"shards missing: {missing or 'all'} of {num}; collect them with --shard K/{num}")
    got = sorted(e["episode_id"] for e in episodes)
    if got != sorted(want_ids):
        raise ArtifactError(f"the shards hold {len(got)} episodes, expected the {len(want_ids)} train tasks once each")
    with atomic_dir(out_dir) as tmp:
        write_episodes(tmp, episodes, turns)
        if tensors:
            (tmp / TENSORS_DIR).mkdir(parents=True, exist_ok=True)
            for f in tensors:
                shutil.copy2(f, tmp / TENSORS_DIR / f.name)
    stats = collection_stats(cfg, episodes, turns, wall=wall)  # wall: the shards' own, summed
    stats["shards"] = num
    return stats
