"""Per-episode grounding documents from collected turns, and the files the ``ground`` stage writes.

The library behind :mod:`pipeline.stages.ground` (seed 000)::

    docs = ground(episodes, turns, generator="extractive", timestamp=ts)
    check_backend_fallbacks(docs, cfg.grounding.max_error_fraction)   # llm: too many failures stop here
    index = write_ground_outputs(docs, "data/grounding", "both")
    metrics = ground_metrics(docs)

Every episode's steps are replayed into a :class:`pipeline.grounding.GroundingFileManager`
(``step_id = turn_index + 1``, ``instruction`` = the executed command, the turn's
``status`` and typed feedback) and its ``final_grounding`` is made from that episode's
feedback only. The output folder holds::

    episode_<id>/grounding_episode_<id>.json|.txt    per episode (grounding.save_format)
    scenes/<scene_id>/grounding_latest.json|.txt     newest episode of each scene
    grounding_latest.json|.txt                       newest episode overall
    index.json                                       episodes and scenes -> file names

"Newest" is collection order, which is episode-id order.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pipeline.core.conf_schema import Config, GroundingConfig, GroundingGenerator
from pipeline.core.config import ConfigError
from pipeline.core.io import atomic_write_json
from pipeline.core.schemas import FEEDBACK_TYPES
from pipeline.core.seeding import prompt_seed
from pipeline.grounding import (
    FINAL_KEYS,
    SAFE_NAME_RE,
    GroundingError,
    GroundingFileManager,
    feedback_from_lines,
    merge_grounding_docs,
    render_grounding_to_markdown,
    replace_dir,
    write_grounding_files,
    write_latest_files,
)
from pipeline.grounding.generate import FAILURES, AnswerTruncated, GenerationFailed
from pipeline.llm.backends import BackendConfigError, BackendError, make_backend

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
    index: dict[str, Any] = {"save_format": str(save_format),
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


def check_backend_fallbacks(docs: list[dict], max_error_fraction: float) -> None:
    """Stop a grounding run whose model calls failed, or whose answers were unusable (empty, a refusal,
    no grounding JSON, cut off at ``grounding.max_new_tokens``), on more than ``max_error_fraction`` of
    the episodes the model was asked for (``grounding.max_error_fraction``): their grounding would be
    the extractive one under the name of the llm generator. A broken server or model is never a result.

    Raises:
        GroundingError: naming the counts, the limit and the first failure.
    """
    reasons = [(d["expr_info"].get("episode_id"), d["expr_info"].get("fallback_reason") or "")
               for d in docs if d["expr_info"].get("generator") == GroundingGenerator.llm]
    asked = [(e, r) for e, r in reasons if not r or r.startswith(FAILURES)]
    failed = [(e, r) for e, r in asked if r]
    if failed and len(failed) / len(asked) > max_error_fraction:
        episode, reason = failed[0]
        raise GroundingError(
            f"grounding.generator=llm: the model call failed or its answer was unusable on {len(failed)} of "
            f"{len(asked)} episodes it was asked for ({len(failed) / len(asked):.0%}), more than "
            f"grounding.max_error_fraction={max_error_fraction:g}, so nothing was written; the first failure: "
            f"episode {episode}: {reason}. Fix the server or model settings (an answer cut off: "
            "grounding.max_new_tokens) and rerun")


def ground_metrics(docs: list[dict]) -> dict:
    """Counts for ``metrics/ground.json`` (``dvc metrics diff`` across experiments): the generator
    configured (``generator``), the one each episode's grounding actually came from
    (``generator_used``: episodes per generator) and why the others fell back (``fallbacks``)."""
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
    configured = sorted({str(d["expr_info"].get("generator", "extractive")) for d in docs})
    return {
        "generator": configured[0] if len(configured) == 1 else (configured or None),
        "num_episodes": len(docs),
        "num_steps": steps,
        "steps_with_feedback": with_feedback,
        "stacked_entries": {t: entries[t] for t in FEEDBACK_TYPES},
        "final_statements": {t: statements[t] for t in FEEDBACK_TYPES},
        "generator_used": dict(sorted(used.items())),
        "fallbacks": dict(sorted(fallbacks.items())),
    }


def make_generate(cfg: Config) -> Callable[[str], str] | None:
    """The text-generation backend of ``grounding.generator=llm`` (``None`` otherwise): ``prompt -> text``.

    The prompt goes as one user message, free text (no early stop), at most
    ``grounding.max_new_tokens`` tokens (the grounding's own budget: ``sampling.max_new_tokens``
    bounds an agent's turn), seeded from ``sampling.seed`` and the prompt (the same prompt, the
    same text). A call that failed after the backend's retries raises :class:`GenerationFailed`
    and an answer cut off at the budget :class:`AnswerTruncated` (the episode falls back to
    extractive, counted); a :class:`BackendConfigError` (a refused key, an unknown model) and
    anything else pass through and stop the stage."""
    if cfg.grounding.generator != GroundingGenerator.llm:
        return None
    budget = int(cfg.grounding.max_new_tokens)
    try:
        backend = make_backend(cfg.model, cfg.sampling)
    except Exception as exc:  # a missing model directory, bad endpoint, ...: name it, stop
        raise ConfigError(f"grounding.generator=llm: cannot build the text-generation backend "
                          f"(model.backend={cfg.model.backend}, model.name_or_path={cfg.model.name_or_path}): "
                          f"{type(exc).__name__}: {exc}") from exc
    base_seed = cfg.sampling.seed

    def generate(prompt: str) -> str:
        try:
            gen = backend.generate([[{"role": "user", "content": prompt}]], seeds=[prompt_seed(base_seed, prompt)],
                                   max_new_tokens=budget, early_stop=False)[0]
        except BackendConfigError:
            raise
        except BackendError as exc:
            raise GenerationFailed(f"{type(exc).__name__}: {exc}") from exc
        if gen.error:
            raise GenerationFailed(f"BackendError: {gen.error}")
        if gen.stop_reason == "max_new_tokens":
            raise AnswerTruncated(f"cut off after {gen.generated_tokens} tokens (grounding.max_new_tokens={budget})")
        return gen.text

    return generate


def scene_groundings(grounding_cfg: GroundingConfig, episodes: list[dict], turns: list[dict]) -> dict[str, str]:
    """scene_id -> the merged grounding Markdown of its episodes: the ``ground`` stage's documents
    merged per scene as the ``merge`` stage merges them (its ``<scene_id>.md``, stripped), in memory
    (:func:`pipeline.grounding.scenes.merge_groundings` is the stage's, from the files).

    The extractive generator is used whatever ``grounding.generator`` says (the episodes of the
    model pipeline and the studies have no model to ask); merging follows
    ``grounding.dedupe_contents``. ``tests/test_merge.py`` holds it equal to the stages' files.
    """
    docs = ground(episodes, turns, generator="extractive", timestamp=str(grounding_cfg.timestamp),
                  unknown_type=str(grounding_cfg.unknown_type))
    by_scene: dict[str, list[dict]] = {}
    for doc in docs:
        by_scene.setdefault(doc["expr_info"].get("scene_id") or "unknown", []).append(doc)
    return {scene: render_grounding_to_markdown(
        merge_grounding_docs(ds, dedupe_contents=grounding_cfg.dedupe_contents)).strip()
        for scene, ds in sorted(by_scene.items())}
