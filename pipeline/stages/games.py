"""Stage ``games``: build the household scenes and compile every quest to a TextWorld game.

Run it (DVC runs exactly this)::

    python -m pipeline.stages.games

Reads ``seed``, ``env.*``, ``user.preferences_per_scene`` and ``paths.games`` /
``paths.metrics`` from params.yaml; writes ``<paths.games>/<scene_id>/<quest_id>.z8``
(+ ``.json``), ``<paths.games>/scenes.json``, ``<paths.games>/manifest.parquet``
(MANIFEST_SCHEMA, sorted by scene_id, quest_id) and ``<paths.metrics>/games.json``.
Games compile in ``env.compile_workers`` processes; the outputs do not depend on it.
The library doing the work is :func:`pipeline.envs.build_games` (for the household world
:mod:`pipeline.envs.household.build`).
"""

from __future__ import annotations

import logging
import sys

from pipeline.core.config import ConfigError, load_params, project_root
from pipeline.envs import build_games


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_params()
        build_games(cfg, project_root(), progress=True)
    except (ConfigError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
