"""``compare`` stage: per-condition metrics, paired comparisons, plots and the report.

    python -m pipeline.stages.compare          # what `dvc repro compare` runs
    dvc metrics show                           # one row per condition (metrics/eval/<C>.json)
    dvc plots show                             # success by condition / scene, turns

Reads, for every condition in ``condition``: ``data/eval/<C>/episodes.parquet`` and
``turns.parquet`` (written by ``evaluate@C``), ``data/prompts/<C>.parquet`` (``render``),
``data/eval_reader/<C>/episodes.parquet`` (``evaluate_reader@C``, with ``experiment.reader``);
``data/curve/outcomes.parquet`` (the ``curve`` stage: the learning curves);
``data/stream/steps.parquet`` (the ``stream`` stage: the streaming protocol, when it streamed);
and ``data/games/manifest.parquet`` for the breakdowns (scene, quest length, scene split).
What is computed (paired comparisons of ``experiment.comparisons``, prompt identity of
``experiment.identical_prompts``) is described in :mod:`pipeline.analysis.compare`.

Writes ``metrics/compare.json`` (headline numbers as dicts so ``dvc metrics show/diff``
list them; details as lists, which DVC's table skips), ``plots/*.json`` for
``dvc plots``, and ``reports/report.md`` (+ PNG figures, ``reports/compare.md`` tables) and
``reports/episodes.html`` (the transcript viewer, :mod:`pipeline.view`: every eval task's
runs side by side; inside the ``${paths.reports}`` output, so dvc.yaml declares nothing new) and,
when the run streamed, ``reports/stream.html`` (:mod:`pipeline.view.stream`: every step of every
stream, what its memory held).
Every interval is seeded from ``seed``: the same inputs give byte-identical outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.analysis.compare import compare, load_condition, load_curves, load_reader, load_stream, write_outputs
from pipeline.analysis.report import headline_lines
from pipeline.core.conf_schema import Config
from pipeline.core.io import atomic_write_text, read_parquet
from pipeline.envs import world_words
from pipeline.stages.common import run_stage
from pipeline.view.load import write_episodes_html
from pipeline.view.stream import stream_html


def compare_stage(cfg: Config, root: Path, _args: object) -> None:
    """Compare every configured condition (module docstring)."""
    data = {c: load_condition(root, cfg, c) for c in cfg.condition}
    manifest = read_parquet(root / cfg.paths.games / "manifest.parquet",
                            columns=["scene_id", "quest_id", "quest_length", "scene_split"]).to_pylist()
    stream = load_stream(root, cfg)
    result = compare(data, manifest, cfg, load_reader(root, cfg), load_curves(root, cfg), stream)
    written = write_outputs(result, root, cfg, world_words(cfg).success)
    written.append(write_episodes_html(root, cfg))  # reports/episodes.html: the transcript viewer
    if stream:  # reports/stream.html: every step of the streams, what the memory held when it was rendered
        written.append(atomic_write_text(root / cfg.paths.reports / "stream.html", stream_html(stream)))
    print("\n".join(headline_lines(result.metrics)))
    print(f"wrote {len(written)} files: {root / cfg.paths.metrics / 'compare.json'}, "
          f"{root / cfg.paths.reports / 'report.md'}, {written[-1]}, plots in {root / cfg.paths.plots}")


def main(argv: list[str] | None = None) -> int:
    return run_stage("compare", compare_stage, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
