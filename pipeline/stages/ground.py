"""``ground`` stage: per-episode grounding files from the collected turns (seed 000).

    python -m pipeline.stages.ground           # what `dvc repro ground` runs
    dvc exp run -S grounding.generator=llm     # ask the model (falls back to extractive)

Reads ``data/episodes/{episodes,turns}.parquet``; for every episode replays its steps
into a :class:`pipeline.grounding.GroundingFileManager` (``step_id = turn_index + 1``,
``instruction`` = the executed command, the turn's ``status`` and typed feedback), makes
its ``final_grounding`` from that episode's feedback only, and writes under
``data/grounding``::

    episode_<id>/grounding_episode_<id>.json|.txt    per episode (grounding.save_format)
    scenes/<scene_id>/grounding_latest.json|.txt     newest episode of each scene
    grounding_latest.json|.txt                       newest episode overall
    index.json                                       episodes and scenes -> file names

"Newest" is collection order, which is episode-id order. Counts go to ``metrics/ground.json``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from omegaconf import DictConfig

from pipeline.core.config import ConfigError, load_params, project_root
from pipeline.grounding import (
    FINAL_KEYS,
    SAFE_NAME_RE,
    GroundingError,
    GroundingFileManager,
    feedback_from_lines,
    replace_dir,
    write_grounding_files,
    write_latest_files,
)
from pipeline.core.io import ArtifactError, atomic_write_json, read_parquet
from pipeline.core.schemas import FEEDBACK_TYPES

log = logging.getLogger(__name__)

INDEX_FILE = "index.json"
SCENES_DIR = "scenes"


def _turn_feedback(turn: Mapping[str, Any], unknown_type: str, where: str) -> dict[str, str | None]:
    """The turn's typed feedback columns; its raw lines only when none is filled."""
    typed = {t: turn.get(f"feedback_{t}") for t in FEEDBACK_TYPES}
    if any(v for v in typed.values()) or not turn.get("feedback_lines"):
        return typed
    return feedback_from_lines(turn["feedback_lines"], unknown_type, where=where)


def _instruction(turn: Mapping[str, Any]) -> str | None:
    if turn.get("command"):
        return turn["command"]
    return turn.get("action")  # an inadmissible action has no command: keep what was tried


def episode_grounding(episode: Mapping[str, Any], turns: Iterable[Mapping[str, Any]], *,
                      generator: str = "extractive", generate: Callable[[str], str] | None = None,
                      timestamp: str | None = None, unknown_type: str = "keep") -> dict:
    """One episode's grounding document (``expr_info`` ... ``final_grounding``).

    Args:
        episode: its ``episodes.parquet`` row (``episode_id``, ``scene_id``, ...).
        turns: its ``turns.parquet`` rows, any order.
        generator, generate, timestamp: see :func:`pipeline.grounding.generate_grounding`.
        unknown_type: ``keep`` | ``reject`` for unknown feedback types.

    Raises:
        GroundingError: a turn has no valid status, or bad feedback under ``reject``.
    """
    eid = episode["episode_id"]
    gfm = GroundingFileManager(eid, unknown_type=unknown_type, expr_info={
        "scene_id": episode.get("scene_id"), "quest_id": episode.get("quest_id"),
        "objective": episode.get("objective")})
    for turn in sorted(turns, key=lambda t: t["turn_index"]):
        where = f"episode {eid} turn {turn['turn_index']}"
        try:
            gfm.append_step_feedback(int(turn["turn_index"]) + 1, _instruction(turn), turn.get("status"),
                                     _turn_feedback(turn, unknown_type, where))
        except ValueError as exc:
            raise GroundingError(f"{where} (turns.parquet): {exc}") from exc
    final = gfm.generate_final_grounding(generator, generate=generate, timestamp=timestamp)
    gfm.save_final_grounding(final)
    return gfm.to_dict()


def ground(episodes: list[Mapping[str, Any]], turns: list[Mapping[str, Any]], *, generator: str = "extractive",
           generate: Callable[[str], str] | None = None, timestamp: str | None = None,
           unknown_type: str = "keep", progress: Callable[[], None] | None = None) -> list[dict]:
    """Grounding documents of all episodes, in episode-id order (the stage's pure core)."""
    by_episode: dict[str, list] = {}
    for t in turns:
        by_episode.setdefault(t["episode_id"], []).append(t)
    docs = []
    for ep in sorted(episodes, key=lambda e: e["episode_id"]):
        docs.append(episode_grounding(ep, by_episode.get(ep["episode_id"], []), generator=generator,
                                      generate=generate, timestamp=timestamp, unknown_type=unknown_type))
        if progress is not None:
            progress()
    return docs


def write_ground_outputs(docs: list[dict], out_dir: str | Path, save_format: str = "both") -> dict:
    """Write every episode's files, the latest files and ``index.json`` into ``out_dir``.

    The folder is built beside ``out_dir`` and swapped in at the end, so files of episodes
    that no longer exist never linger and a crash leaves the previous folder intact.

    Returns:
        The index written to ``index.json``.
    """
    out = Path(out_dir)
    index: dict[str, Any] = {"save_format": _v(save_format),
                             "episodes": [], "scenes": {}}
    with replace_dir(out) as tmp:
        latest_of_scene: dict[str, dict] = {}
        for doc in docs:
            info = doc["expr_info"]
            written = write_grounding_files(doc, tmp, save_format)
            names = {p.suffix.lstrip("."): p.relative_to(tmp).as_posix() for p in written}
            scene = info.get("scene_id") or "unknown"
            index["episodes"].append({"episode_id": info["episode_id"], "scene_id": scene,
                                      "json": names.get("json"), "txt": names.get("txt")})
            index["scenes"].setdefault(scene, []).append(info["episode_id"])
            latest_of_scene[scene] = doc
        for scene, doc in latest_of_scene.items():
            if not SAFE_NAME_RE.match(scene):
                raise GroundingError(f"scene_id={scene!r} of episode {doc['expr_info']['episode_id']!r}: not usable "
                                     "as a folder name (letters, digits, '_', '-', '.')")
            write_latest_files(doc, tmp / SCENES_DIR / scene, save_format)
        if docs:
            write_latest_files(docs[-1], tmp, save_format)
        atomic_write_json(tmp / INDEX_FILE, index)
    return index


def ground_metrics(docs: list[dict]) -> dict:
    """Counts for ``metrics/ground.json`` (``dvc metrics diff`` across experiments)."""
    entries = Counter()
    statements = Counter()
    used = Counter()
    fallbacks = Counter()
    steps = with_feedback = 0
    for doc in docs:
        for t, items in doc["stacked_grounding"].items():
            entries[t] += len(items)
        for step in doc["grounding_per_step"]:
            steps += 1
            with_feedback += any(v for v in step["feedback"].values())
        for t, key in FINAL_KEYS.items():
            content = doc["final_grounding"][key]["content"]
            statements[t] += len([ln for ln in content.split("\n") if ln.strip()])
        info = doc["expr_info"]
        used[info.get("generator_used", "extractive")] += 1
        if info.get("fallback_reason"):
            fallbacks[info["fallback_reason"].split(":")[0]] += 1
    return {
        "num_episodes": len(docs),
        "num_steps": steps,
        "steps_with_feedback": with_feedback,
        "stacked_entries": {t: entries[t] for t in FEEDBACK_TYPES},
        "final_statements": {t: statements[t] for t in FEEDBACK_TYPES},
        "generator_used": dict(sorted(used.items())),
        "fallbacks": dict(sorted(fallbacks.items())),
    }


def _v(x: Any) -> str:
    """Plain string of a config enum value (``SaveFormat.both`` -> ``"both"``)."""
    return str(getattr(x, "value", x))


def make_generate(cfg: DictConfig) -> Callable[[str], str] | None:
    """The text-generation backend of ``grounding.generator=llm`` (``None`` otherwise)."""
    if _v(cfg.grounding.generator) != "llm":
        return None
    from pipeline.llm.backends import make_text_generator

    try:
        return make_text_generator(cfg)
    except Exception as exc:  # a missing model directory, bad endpoint, ...: name it, stop
        raise ConfigError(f"grounding.generator=llm: cannot build the text-generation backend "
                          f"(model.backend={_v(cfg.model.backend)}, model.name_or_path={cfg.model.name_or_path}): "
                          f"{type(exc).__name__}: {exc}") from exc


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_params()
        root = project_root()
        g = cfg.grounding
        episodes_dir = root / cfg.paths.episodes
        episodes = read_parquet(episodes_dir / "episodes.parquet").to_pylist()
        turns = read_parquet(episodes_dir / "turns.parquet").to_pylist()
        t0 = time.perf_counter()
        docs = ground(episodes, turns, generator=_v(g.generator), generate=make_generate(cfg),
                      timestamp=g.timestamp, unknown_type=_v(g.unknown_type))
        out = root / cfg.paths.grounding
        index = write_ground_outputs(docs, out, _v(g.save_format))
        metrics = ground_metrics(docs)
        metrics["wall_time_s"] = round(time.perf_counter() - t0, 3)
        atomic_write_json(root / cfg.paths.metrics / "ground.json", metrics)
        print(f"grounded {len(docs)} episodes of {len(index['scenes'])} scenes -> {out} "
              f"({metrics['steps_with_feedback']} of {metrics['num_steps']} steps with feedback)")
    except (ConfigError, ArtifactError, GroundingError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
