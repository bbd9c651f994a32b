"""Merged grounding per scene, plus the merge of the files named in config (seed 000).

The library behind :mod:`pipeline.stages.merge`::

    scenes, configured = merge_groundings(index, "data/grounding", cfg.grounding.files, root=root)
    index = write_merge_outputs(scenes, configured, "data/grounding_merged", "both")

For episodes that never went through the stages' files (the model pipeline's demonstrations,
the studies), :func:`pipeline.grounding.episodes.scene_groundings` gives the same per-scene
texts in memory.

``index`` is the ``ground`` stage's ``index.json``; the output folder holds::

    <scene_id>.md      the scene's episodes merged and rendered: what the render stage puts
                       into ``$grounding_content`` for tasks of that scene
    <scene_id>.json    the merged structure, sources and skipped files (merge_format json|both)
    configured.md      the merge of ``grounding.files`` ("" when the list is empty)
    configured.json    its merged structure (merge_format json|both)
    index.json         scene -> files, sources, skipped files
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.conf_schema import SaveFormat
from pipeline.core.io import atomic_write_json, atomic_write_text, safe_name
from pipeline.grounding import (
    CONFIGURED_NAME,
    GroundingError,
    MergedGrounding,
    merge_grounding_files,
    replace_dir,
    split_grounding_paths,
)
from pipeline.grounding.common import check_choice

CONFIGURED = CONFIGURED_NAME  # configured.md: the merge of grounding.files


def scene_sources(index: dict, grounding_dir: str) -> dict[str, list[str]]:
    """Per scene, its episodes' grounding files (JSON when written, else TXT), in episode order.

    Args:
        index: ``data/grounding/index.json``.
        grounding_dir: the ground stage's folder relative to the project root
            (``cfg.paths.grounding``), prefixed to the index's relative names.
    """
    out: dict[str, list[str]] = {}
    source = f"{grounding_dir.rstrip('/')}/index.json"
    for i, ep in enumerate(index.get("episodes", [])):
        name = ep.get("json") or ep.get("txt")
        if not name:
            raise GroundingError(f"{grounding_dir}/index.json: episode {ep.get('episode_id')!r} has no file")
        # the scene id names <scene_id>.md/.json of the merge: checked before anything is read or written
        scene = safe_name(ep.get("scene_id"), source, f"episodes[{i}].scene_id")
        out.setdefault(scene, []).append(f"{grounding_dir.rstrip('/')}/{name}")
    return out


def merge_groundings(index: dict, grounding_dir: str, files: Any, *, root: str | Path | None = None,
                     dedupe_contents: bool = False) -> tuple[dict[str, MergedGrounding], MergedGrounding | None]:
    """The stage's core: one merge per scene, and the merge of ``files`` (``None`` if empty).

    Raises:
        GroundingError: a scene or the configured files have no usable file (the message
            names every file and why).
    """
    scenes = {}
    for scene, paths in scene_sources(index, grounding_dir).items():
        try:
            scenes[scene] = merge_grounding_files(paths, root=root, dedupe_contents=dedupe_contents)
        except GroundingError as exc:
            raise GroundingError(f"scene {scene}: {exc}") from exc
    configured = None
    if split_grounding_paths(files):
        try:
            configured = merge_grounding_files(files, root=root, dedupe_contents=dedupe_contents)
        except GroundingError as exc:
            raise GroundingError(f"grounding.files: {exc}") from exc
    return scenes, configured


def _write_one(out: Path, name: str, merged: MergedGrounding | None, merge_format: str) -> dict:
    content = merged.content if merged is not None else ""
    atomic_write_text(out / f"{name}.md", content + "\n" if content else "")
    entry: dict[str, Any] = {"md": f"{name}.md", "json": None}
    if merge_format in ("json", "both"):
        data = merged.to_dict() if merged is not None else MergedGrounding("", None).to_dict()
        atomic_write_json(out / f"{name}.json", data, sort_keys=False)
        entry["json"] = f"{name}.json"
    entry["sources"] = merged.sources if merged is not None else []
    entry["skipped"] = merged.skipped if merged is not None else []
    return entry


def write_merge_outputs(scenes: dict[str, MergedGrounding], configured: MergedGrounding | None,
                        out_dir: str | Path, merge_format: str = "both") -> dict:
    """Write ``<scene>.md/.json``, ``configured.md/.json`` and ``index.json``; return the index."""
    merge_format = check_choice(merge_format, SaveFormat, "grounding.merge_format")
    if CONFIGURED in scenes:
        raise GroundingError(f"scene_id={CONFIGURED!r} collides with the merge of grounding.files")
    for scene in scenes:  # every name checked before the folder is replaced
        safe_name(scene, f"{Path(out_dir).as_posix()}/<scene_id>.md", "scene_id")
    index: dict[str, Any] = {"merge_format": merge_format, "scenes": {}, CONFIGURED: None}
    with replace_dir(out_dir) as tmp:
        for scene, merged in sorted(scenes.items()):
            index["scenes"][scene] = _write_one(tmp, scene, merged, merge_format)
        index[CONFIGURED] = _write_one(tmp, CONFIGURED, configured, merge_format)
        atomic_write_json(tmp / "index.json", index)
    return index

