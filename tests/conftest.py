"""Session fixtures shared by the test files: the real ``conf/`` shrunk, and its games.

``tiny_cfg`` composes the project's own ``conf/`` exactly as DVC does and shrinks it;
``tiny_games`` compiles that config's games once per session (4 games: each compile
costs about a second, so keep new fixtures from compiling more)::

    def test_something(tiny_cfg, tiny_games):
        row = tiny_games.rows[0]
        env = HouseholdEnv(tiny_games.game_path(row), ...)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # hydra_plugins/ (the schema) is found on sys.path
    sys.path.insert(0, str(ROOT))

# 2 scenes (1 held out), 2 rooms, 2 containers (1 locked), 2 objects; 2 train + 1 eval
# quests per seen scene -> 3 + 1 = 4 games.
TINY_OVERRIDES = [
    "env.num_scenes=2",
    "env.heldout_scenes=1",
    "env.rooms_per_scene=2",
    "env.containers_per_scene=2",
    "env.locked_containers=1",
    "env.supporters_per_scene=1",
    "env.objects_per_scene=2",
    "env.train_quests_per_scene=2",
    "env.eval_quests_per_scene=1",
    "env.max_steps=15",
    "env.regularity=0.0",  # things placed at random: the layouts tests/data/household_golden.json was recorded on
    "workers=2",
    # Rule agent, no model: the default (agent=llm, model=policy) needs the trained policy,
    # which tests that exercise it build themselves (tests/test_policy.py).
    "agent=react",
    "model=none",
]


@pytest.fixture(scope="session")
def tiny_cfg():
    """The real conf/ composed via DVC's compose + overrides, validated (a typed DictConfig)."""
    from pipeline.core.config import compose_text, validate

    return validate(OmegaConf.create(compose_text(ROOT, TINY_OVERRIDES)))


@pytest.fixture(scope="session")
def tiny_games(tiny_cfg, tmp_path_factory):
    """The games of ``tiny_cfg`` built once into a temporary project root.

    Returns a :class:`pipeline.envs.common.GamesResult`: ``root`` (the project root the
    manifest's ``game_file`` paths start from), ``games_dir``, ``rows`` (manifest rows),
    ``scenes`` (``{scene_id: spec}``), ``metrics`` and ``game_path(row)``.
    """
    from pipeline.envs.household.build import build_games

    root = tmp_path_factory.mktemp("tiny_project")
    return build_games(tiny_cfg, root, progress=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A local model directory the ``llm`` agent loads like a user's (``model=local``): a
    randomly initialised 1-layer GPT-2 (untrained: diverse, mostly invalid answers) and a
    byte-level BPE tokenizer trained here on the system template. No download, ~1 s."""
    from pipeline.llm.tiny import CHAT_TEMPLATE, save_model_dir, tiny_gpt2, train_tokenizer

    texts = [(ROOT / "conf" / "templates" / "system_compact.txt").read_text(encoding="utf-8"),
             '{"action": "open", "target": "Fridge_0"} {"action": "go", "target": "north"}'] * 10
    tok = train_tokenizer(texts, vocab_size=400, chat_template=CHAT_TEMPLATE)
    model = tiny_gpt2(tok, n_layer=1, n_embd=32, n_head=2, n_positions=4096, seed=1)
    return save_model_dir(tmp_path_factory.mktemp("tiny_model") / "model", model, tok)
