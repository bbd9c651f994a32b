"""``compare`` stage: per-condition metrics, paired comparisons, plots and the report.

    python -m pipeline.stages.compare          # what `dvc repro compare` runs
    dvc metrics show                           # one row per condition (metrics/eval/<C>.json)
    dvc plots show                             # success by condition / scene, turns

Reads, for every condition in ``condition``: ``data/eval/<C>/episodes.parquet`` and
``turns.parquet`` (written by ``evaluate@C``), ``data/prompts/<C>.parquet`` (``render@C``),
``data/eval_reader/<C>/episodes.parquet`` (``evaluate_reader@C``, with ``experiment.reader``);
``data/curve/outcomes.parquet`` (the ``curve`` stage: the learning curves);
and ``data/games/manifest.parquet`` for the breakdowns (scene, quest length, scene split).
What is computed (paired comparisons of ``experiment.comparisons``, prompt identity of
``experiment.identical_prompts``) is described in :mod:`pipeline.analysis.compare`.

Writes ``metrics/compare.json`` (headline numbers as dicts so ``dvc metrics show/diff``
list them; details as lists, which DVC's table skips), ``plots/*.json`` for
``dvc plots``, and ``reports/report.md`` (+ PNG figures, ``reports/compare.md`` tables) and
``reports/episodes.html`` (the transcript viewer, :mod:`pipeline.view`: every eval task's
runs side by side; inside the ``${paths.reports}`` output, so dvc.yaml declares nothing new).
Every interval is seeded from ``seed``: the same inputs give byte-identical outputs.
"""

from __future__ import annotations

import sys

from pipeline.analysis.compare import compare, load_condition, load_curves, load_reader, write_outputs
from pipeline.analysis.report import headline_lines
from pipeline.core.config import ConfigError, load_params, project_root
from pipeline.core.io import ArtifactError, read_parquet
from pipeline.core.stats import PairingError
from pipeline.envs import world_words
from pipeline.view.load import write_episodes_html


def main() -> int:
    """Compare every configured condition (module docstring); 0 on success, 1 with a message on error."""
    try:
        cfg = load_params()
        root = project_root()
        data = {c: load_condition(root, cfg, c) for c in cfg.condition}
        manifest = read_parquet(root / cfg.paths.games / "manifest.parquet",
                                columns=["scene_id", "quest_id", "quest_length", "scene_split"]).to_pylist()
        result = compare(data, manifest, cfg, load_reader(root, cfg), load_curves(root, cfg))
        written = write_outputs(result, root, cfg, world_words(cfg).success)
        written.append(write_episodes_html(root, cfg))  # reports/episodes.html: the transcript viewer
        print("\n".join(headline_lines(result.metrics)))
        print(f"wrote {len(written)} files: {root / cfg.paths.metrics / 'compare.json'}, "
              f"{root / cfg.paths.reports / 'report.md'}, {written[-1]}, plots in {root / cfg.paths.plots}")
    except (ConfigError, ArtifactError, PairingError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
