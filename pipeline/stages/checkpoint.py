"""``checkpoint`` step of the model pipeline: publish the trained model as the committed checkpoint.

    python -m pipeline.stages.checkpoint      # the last step of `make model` (models/dvc.yaml)

Reads what the ``policy`` step wrote (``<paths.policy>/model``, ``training.json``), the data it
was trained on (``<paths.games>/manifest.parquet``, ``<paths.demos>/turns.parquet``,
``<paths.policy>/demos.parquet``: their sha256 go into the card) and the recipe
(``policy``); publishes the model at ``<paths.model>`` (``models/policy``, committed in git)
with its model card (:func:`pipeline.policy.checkpoint.publish`: nothing is written when the
files are byte-identical to those the card lists), and writes ``<paths.metrics>/checkpoint.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from pipeline.core.conf_schema import TrainConfig
from pipeline.core.cpu import cpu_level
from pipeline.core.io import atomic_write_json, read_json, sha256_file
from pipeline.core.numerics import cpu_model
from pipeline.policy.checkpoint import CheckpointError, built_on, card_meta, publish
from pipeline.policy.demoset import TURNS_FILE
from pipeline.policy.training import DEMOS_FILE, MODEL_DIR, SUMMARY_FILE
from pipeline.stages.common import run_stage

MANIFEST = "manifest.parquet"  # the games' manifest (pipeline.envs.build_games)


def training_data(root: Path, games: Path, demos: Path, policy: Path) -> dict[str, str]:
    """``{file: sha256}`` of what the model was trained on: the games' manifest, the demonstrations,
    every training turn (the demonstrations' and the DAgger rounds' labels); each named by its
    step's folder (``games/manifest.parquet``, ...), wherever a run keeps them."""
    files = {f"games/{MANIFEST}": games / MANIFEST, f"demos/{TURNS_FILE}": demos / TURNS_FILE,
             f"policy/{DEMOS_FILE}": policy / DEMOS_FILE}
    return {name: sha256_file(root / f) for name, f in files.items()}


def checkpoint(cfg: TrainConfig, root: Path, _args: object) -> None:
    """Publish the trained model with its card (module docstring)."""
    t0 = time.perf_counter()
    built = root / cfg.paths.policy / MODEL_DIR
    training = read_json(root / cfg.paths.policy / SUMMARY_FILE)
    e = cfg.env
    world = {"seed": cfg.seed, "env": e.name, "scenes": e.num_scenes, "heldout_scenes": e.heldout_scenes,
             "train_quests_per_scene": e.train_quests_per_scene, "regularity": e.regularity,
             "generated_houses": cfg.policy.generated_houses, "generated_drills": cfg.policy.generated_drills}
    meta = card_meta(recipe=OmegaConf.to_container(cfg.policy, resolve=True, enum_to_str=True), world=world,
                     training=training,
                     data=training_data(root, Path(cfg.paths.games), Path(cfg.paths.demos), Path(cfg.paths.policy)),
                     built=built_on(root, cpu_model(), cpu_level()))
    out = publish(built, root / cfg.paths.model, meta)
    atomic_write_json(root / cfg.paths.metrics / "checkpoint.json",
                      {"published": cfg.paths.model, "identical": out.identical, "files": out.files,
                       "changes": list(out.changes), "wall_time_s": round(time.perf_counter() - t0, 3)})
    if out.identical:
        print(f"checkpoint: {cfg.paths.model} unchanged: the rebuilt model is byte-identical to the files its card lists")
    else:
        print(f"checkpoint: {cfg.paths.model} replaced ({'; '.join(out.changes)}): commit it with models/dvc.lock "
              "to make it the experiment's model")


def main(argv: list[str] | None = None) -> int:
    return run_stage("checkpoint", checkpoint, argv, doc=__doc__, expected=(CheckpointError,), pipelines=("model",))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
