"""Writing one episode's grounding files (seed 000's layout, atomic writes).

::

    <out>/episode_<id>/grounding_episode_<id>.json   expr_info, grounding_per_step,
    <out>/episode_<id>/grounding_episode_<id>.txt    stacked_grounding, final_grounding / Markdown
    <out>/grounding_latest.{json,txt}                the newest episode (seed: grounding/grounding_latest.*)

No wall-clock time in any name, so reruns give the same paths and bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pipeline.core.io import atomic_dir, atomic_write_json, atomic_write_text
from pipeline.core.conf_schema import SaveFormat
from pipeline.grounding.common import SAFE_NAME_RE, GroundingError, check_choice
from pipeline.grounding.merge import render_episode_text


def episode_dir_name(episode_id: int | str) -> str:
    return f"episode_{episode_id}"


def episode_file_stem(episode_id: int | str) -> str:
    return f"grounding_episode_{episode_id}"


def _write_doc(doc: Mapping[str, Any], stem: Path, save_format: str) -> list[Path]:
    save_format = check_choice(save_format, SaveFormat, "grounding.save_format")
    paths = []
    if save_format in ("json", "both"):
        # Seed 000's key order, not sorted: the file reads like the seed's example.
        paths.append(atomic_write_json(stem.with_name(stem.name + ".json"), doc, sort_keys=False))
    if save_format in ("txt", "both"):
        text = render_episode_text(doc)
        paths.append(atomic_write_text(stem.with_name(stem.name + ".txt"), text + "\n" if text else ""))
    return paths


def write_grounding_files(doc: Mapping[str, Any], out_dir: str | os.PathLike, save_format: str = "both") -> list[Path]:
    """``<out_dir>/episode_<id>/grounding_episode_<id>.{json,txt}`` (atomic writes)."""
    episode_id = doc["expr_info"]["episode_id"]
    if not SAFE_NAME_RE.match(str(episode_id)):
        raise GroundingError(f"episode_id={episode_id!r}: not usable in a file name")
    folder = Path(out_dir) / episode_dir_name(episode_id)
    return _write_doc(doc, folder / episode_file_stem(episode_id), save_format)


def write_latest_files(doc: Mapping[str, Any], out_dir: str | os.PathLike, save_format: str = "both") -> list[Path]:
    """``<out_dir>/grounding_latest.{json,txt}``: the newest episode's grounding."""
    return _write_doc(doc, Path(out_dir) / "grounding_latest", save_format)


# Yield an empty folder beside a stage's output folder; on success it replaces it whole, so
# files of episodes that no longer exist never linger and a failure leaves the previous
# folder untouched (the shared implementation, :func:`pipeline.core.io.atomic_dir`).
replace_dir = atomic_dir
