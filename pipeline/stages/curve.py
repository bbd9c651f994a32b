"""``curve`` stage: learning curves, success and turns vs the past episodes memory and grounding hold.

    python -m pipeline.stages.curve            # what `dvc repro curve` runs
    dvc plots show metrics/curve_success.csv   # success vs k, a line per condition (the reader)
    dvc exp run -S 'experiment.curve.ks=[0,1,2,4,6]' -S experiment.curve.model=true

For every ``k`` of ``experiment.curve.ks``: the grounding merged from the first ``k`` collected
episodes of each scene and the episodic store of those episodes only
(:mod:`pipeline.session.experience`); every condition of ``experiment.curve.conditions`` is
rendered from them exactly as the ``render`` stage renders (same evidence checks) and played
by the ``reader`` (and, with ``experiment.curve.model``, by the experiment's agent).
The points ((k, condition) pairs) are played in ``workers`` processes (``auto``: the cores
this process may use); the outputs are the same bytes for any count.

Reads ``data/games``, ``data/episodes``, ``data/grounding`` (index and per-episode files),
``data/store``; writes ``data/curve/outcomes.parquet`` (one row per agent, k, condition and
task) and each ``k``'s merged grounding (``data/curve/grounding/k<k>/``),
``metrics/curve.json`` (per point and per paired comparison at each k: success with exact
McNemar p, turns with the Wilcoxon signed-rank p; the run's ``workers`` and ``wall_time_s``)
and ``metrics/curve_success.csv`` / ``metrics/curve_turns.csv`` for ``dvc plots``. The ``compare``
stage draws them in the report.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pyarrow as pa

from pipeline.agents import plays_with_model, reads_prompt
from pipeline.analysis.curves import ROW_FIELDS, curve_csv, summarise_curves
from pipeline.conditions import block_length_for
from pipeline.core.conf_schema import Config
from pipeline.core.io import atomic_dir, atomic_write_json, atomic_write_text, write_parquet
from pipeline.envs import fact_reader, world_words
from pipeline.llm.backends import BackendError
from pipeline.memory import load_store
from pipeline.session.evaluation import reader_config
from pipeline.session.experience import curve_workers, experience_curve, load_experience
from pipeline.stages.common import pin_numerics, run_stage

CURVE_SCHEMA = pa.schema([("agent", pa.string()), ("k", pa.int32()), ("held", pa.int32()), ("condition", pa.string()),
                          ("scene_id", pa.string()), ("quest_id", pa.string()), ("scene_split", pa.string()),
                          ("success", pa.bool_()), ("turns", pa.int32())])


def learning_curves(cfg: Config, root: Path, _args: object) -> None:
    """Play every k of ``experiment.curve.ks``, write the outcomes and the summaries (module docstring)."""
    curve = cfg.experiment.curve
    # the experiment's agent too, when asked and its actions depend on the prompt the curve changes
    plays_agent = bool(curve.model) and reads_prompt(cfg.agent)
    pin_numerics(cfg, runs_model=plays_agent and plays_with_model(cfg.agent))
    conditions = [c for c in curve.conditions if c in cfg.condition]
    skipped = [c for c in curve.conditions if c not in cfg.condition]
    if skipped:
        print(f"curve: {', '.join(skipped)} not configured (condition: {', '.join(cfg.condition)}): skipped",
              file=sys.stderr)
    episodes, index = load_experience(root, cfg)
    store = load_store(root / cfg.paths.store, tie_seed=cfg.seed)
    t0 = time.perf_counter()
    out = root / cfg.paths.curve
    rows = []
    with atomic_dir(out) as tmp:
        common = dict(ks=list(curve.ks), conditions=conditions, episodes=episodes, grounding_index=index,
                      store=store, work_dir=tmp / "grounding", length=block_length_for(cfg, root),
                      words=world_words(cfg), facts=fact_reader(cfg))
        agents = [("reader", True)] + ([(str(cfg.agent.name), False)] if plays_agent else [])
        num_points = len(curve.ks) * len(conditions)
        workers = {name: curve_workers(reader_config(cfg) if reader else cfg, num_points) for name, reader in agents}
        for name, reader in agents:
            for p in experience_curve(cfg, root, reader=reader, workers=workers[name], **common):
                rows += [{"agent": name, "k": p.k, "held": p.held, "condition": p.condition, "scene_id": o.scene_id,
                          "quest_id": o.quest_id, "scene_split": o.scene_split, "success": o.success,
                          "turns": o.turns} for o in p.outcomes]
        write_parquet(pa.Table.from_pylist(rows, schema=CURVE_SCHEMA), tmp / "outcomes.parquet",
                      sort_by=["agent", "k", "condition", "scene_id", "quest_id"])
    summary = summarise_curves(rows, n_resamples=cfg.experiment.bootstrap_samples, level=cfg.experiment.ci_level,
                               seed=cfg.seed)
    metrics_dir = root / cfg.paths.metrics
    # The run's own measures (never in data/curve/): the process count each agent's points were
    # played in (the outputs are the same bytes for any) and the wall time.
    run = {"workers": workers["reader"], "wall_time_s": round(time.perf_counter() - t0, 3)}
    if plays_agent:
        run["model_workers"] = workers[str(cfg.agent.name)]
    atomic_write_json(metrics_dir / "curve.json", {**summary, "fields": list(ROW_FIELDS), **run})
    for value in ("success", "turns"):
        atomic_write_text(metrics_dir / f"curve_{value}.csv",
                          curve_csv(rows, agent="reader", value=value, conditions=conditions))
    for p in summary["paired"]:
        s = p["success"]
        print(f"curve [{p['agent']}] k={p['k']}: {p['treatment']} - {p['control']} "
              f"{s['diff']['value']:+.2f} (b={s['table']['b']}, c={s['table']['c']}, p={s['p_value']:.3g}); "
              f"turns {p['turns']['diff']:+.2f} (Wilcoxon p={p['turns']['p_value']:.3g})")


def main(argv: list[str] | None = None) -> int:
    return run_stage("curve", learning_curves, argv, doc=__doc__, expected=(BackendError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
