"""``merge`` stage: merged grounding per scene, plus the files named in config (seed 000).

    python -m pipeline.stages.merge            # what `dvc repro merge` runs
    dvc exp run -S 'grounding.files=[data/grounding/grounding_latest.json,notes/kitchen.txt]'

Reads ``data/grounding/index.json`` (written by the ``ground`` stage) and the files listed
in ``grounding.files`` (a list or a comma-separated string, relative to the project root);
writes under ``data/grounding_merged``::

    <scene_id>.md      the scene's episodes merged and rendered: what the render stage puts
                       into ``$grounding_content`` for tasks of that scene
    <scene_id>.json    the merged structure, sources and skipped files (merge_format json|both)
    configured.md      the merge of ``grounding.files`` ("" when the list is empty)
    configured.json    its merged structure (merge_format json|both)
    index.json         scene -> files, sources, skipped files

Only ``grounding.files``, ``grounding.merge_format`` and ``grounding.dedupe_contents`` are
read here, so changing them re-runs this stage alone. The library doing the work is
:mod:`pipeline.grounding.scenes`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from pipeline.core.conf_schema import Config
from pipeline.core.io import read_json
from pipeline.grounding import split_grounding_paths
from pipeline.grounding.scenes import CONFIGURED, merge_groundings, write_merge_outputs
from pipeline.stages.common import run_stage


def merge(cfg: Config, root: Path, _args: object) -> None:
    """Merge each scene's grounding and the configured files (module docstring)."""
    g = cfg.grounding
    index = read_json(root / cfg.paths.grounding / "index.json")
    files = g.files if isinstance(g.files, str) else list(g.files or [])
    scenes, configured = merge_groundings(index, cfg.paths.grounding, files, root=root,
                                          dedupe_contents=g.dedupe_contents)
    out = root / cfg.paths.grounding_merged
    written = write_merge_outputs(scenes, configured, out, g.merge_format)
    skipped = sum(len(e["skipped"]) for e in written["scenes"].values()) + len(written[CONFIGURED]["skipped"])
    print(f"merged grounding of {len(scenes)} scenes and {len(split_grounding_paths(files))} configured "
          f"files -> {out}" + (f" ({skipped} files skipped, see warnings)" if skipped else ""))


def main(argv: list[str] | None = None) -> int:
    return run_stage("merge", merge, argv, doc=__doc__, log_level=logging.INFO)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
