"""Stage ``games``: build the household scenes and compile every quest to a TextWorld game.

Run it (DVC runs exactly this)::

    python -m pipeline.stages.games                   # the experiment's (dvc.yaml, params.yaml)
    python -m pipeline.stages.games --pipeline model  # the model pipeline's own world (models/dvc.yaml)

Reads ``seed``, ``env.*``, ``user.preferences_per_scene`` and ``paths.games`` /
``paths.metrics`` from params.yaml; writes ``<paths.games>/<scene_id>/<quest_id>.z8``
(+ ``.json``), ``<paths.games>/scenes.json``, ``<paths.games>/manifest.parquet``
(MANIFEST_SCHEMA, sorted by scene_id, quest_id) and ``<paths.metrics>/games.json``.
Games compile in ``workers`` processes (``auto``: the machine's cores); the outputs do not depend on it.
The library doing the work is :func:`pipeline.envs.build_games` (for the household world
:mod:`pipeline.envs.household.build`).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from pipeline.core.conf_schema import Config
from pipeline.envs import build_games
from pipeline.stages.common import run_stage


def games(cfg: Config, root: Path, _args: object) -> None:
    build_games(cfg, root, progress=True)


def main(argv: list[str] | None = None) -> int:
    # RuntimeError: a game that does not compile or verify, a world's engine that is missing or fails
    return run_stage("games", games, argv, doc=__doc__, log_level=logging.INFO, expected=(RuntimeError,),
                     pipelines=("experiment", "model"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
