"""``demos`` step of the model pipeline: the default policy's demonstrations, built from its games.

    python -m pipeline.stages.demos          # a step of `make model` (models/dvc.yaml), on models/params.yaml

A rule agent (``policy.rule_agent``) plays the *train* quests; its feedback becomes
per-scene grounding and an episodic store, from which the prompt variants of
:mod:`pipeline.policy.demos` are built (no grounding / the scene's grounding, times no
advisory / each of ``demos.advisory_variants``); the teacher ``policy.teacher`` names (the
knowledge-limited expert or the reader: :mod:`pipeline.policy.teacher`) plays
``policy.demos_per_quest`` demonstrations per quest and every turn is rendered by
the ``llm`` agent's own code. All of it by the library (:mod:`pipeline.policy.demoset`),
from the games and the policy's own config: the experiment's list of conditions is never
read, so adding a condition does not change the demonstrations or the model the
``policy`` step trains on them.

The rule agent's episodes and the demonstrations are played in ``workers`` processes
(:mod:`pipeline.core.parallel`; :func:`pipeline.policy.demo_workers.demo_pool`): jobs
fixed by the config, each item seeded by its identity, merged in job order, so any count
writes the same bytes.

Writes ``<paths.demos>/`` (``data/model/demos``; :mod:`pipeline.policy.demoset`: ``turns.parquet``,
``grounding.json``, ``store/``, ``summary.json``) and ``<paths.metrics>/demos.json``
(``models/metrics``: the summary, the worker count and wall times: those in the metrics only).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tqdm import tqdm

from pipeline.core.conf_schema import Config
from pipeline.core.io import atomic_dir, atomic_write_json
from pipeline.llm.backends import BackendError
from pipeline.policy.demoset import build_demo_set, write_demo_set
from pipeline.session.collection import load_games
from pipeline.stages.common import pin_numerics, run_stage

METRICS_FILE = "demos.json"


def demos(cfg: Config, root: Path, _args: object) -> None:
    """Build and write the demonstrations (module docstring)."""
    pin_numerics(cfg, runs_model=False)  # rule agent and teacher only: the environment, no torch
    out_dir = root / cfg.paths.demos
    metrics_path = root / cfg.paths.metrics / METRICS_FILE
    t0 = time.perf_counter()
    manifest, scenes = load_games(root, cfg)
    n_train = sum(r["split"] == "train" for r in manifest)
    pol = cfg.policy
    with tqdm(total=n_train, desc=f"demos: {pol.rule_agent} episodes", unit="ep", file=sys.stderr) as bar1, \
            tqdm(desc=f"demos: {cfg.policy.teacher} demos", unit="ep", file=sys.stderr) as bar2, \
            tqdm(total=pol.statement_drills, desc="demos: statement drills", unit="drill", file=sys.stderr,
                 disable=pol.statement_drills == 0) as bar3, \
            tqdm(total=pol.later_drills, desc="demos: later-turn drills", unit="drill", file=sys.stderr,
                 disable=pol.later_drills == 0) as bar4:
        demo_set = build_demo_set(cfg, root, manifest, scenes, memory_progress=bar1.update,
                                  demo_progress=bar2.update, drill_progress=bar3.update,
                                  later_progress=bar4.update)
    with atomic_dir(out_dir) as tmp:
        write_demo_set(demo_set, tmp)
    wall = round(time.perf_counter() - t0, 3)
    # the worker count and wall times go to the metrics only: data/demos is the same bytes on any count
    atomic_write_json(metrics_path, {"built": True, **demo_set.summary, "workers": demo_set.run["workers"],
                                     "wall_time_s": wall, "wall_s": demo_set.run["wall_s"]})
    d = demo_set.summary["demos"]
    print(f"demos: {d['episodes']} demonstrations, {d['turns']} turns ({d['train_turns']} learned) "
          f"-> {cfg.paths.demos} ({wall:.0f} s on {demo_set.run['workers']} workers)")


def main(argv: list[str] | None = None) -> int:
    return run_stage("demos", demos, argv, doc=__doc__, expected=(BackendError,), pipelines=("model",))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
