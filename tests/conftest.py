"""Session fixtures shared by the test files: the real ``conf/`` shrunk, and its games.

``tiny_cfg`` composes the project's own ``conf/`` exactly as DVC does and shrinks it;
``tiny_games`` compiles that config's games once per session (4 games: each compile
costs about a second, so keep new fixtures from compiling more)::

    def test_something(tiny_cfg, tiny_games):
        row = tiny_games.rows[0]
        env = HouseholdEnv(tiny_games.game_path(row), ...)
"""

from __future__ import annotations

import os
import shutil
import subprocess
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
    # Rule agent, no model: tests that play the default (agent=llm, model=policy: the committed
    # checkpoint) or train a policy (tests/test_policy.py) say so themselves.
    "agent=react",
    "model=none",
]


# A barely trained policy's free decoding never closes its JSON action, so every turn runs to
# sampling.max_new_tokens: tests of what is played, labelled and hashed (not of the actions' quality)
# cap a turn at a third of the default 96.
SHORT_TURN_TOKENS = 32
# A policy trained in seconds on top of a tiny world: the model pipeline's overrides (tests/test_numerics.py,
# tests/test_model_pipeline.py); it plays in seconds with sampling.max_new_tokens=SHORT_TURN_TOKENS.
SMALL_POLICY_OVERRIDES = [
    "policy.hidden_size=48", "policy.intermediate_size=96", "policy.n_head=2",
    "policy.epochs=1", "policy.generated_houses=4", "policy.generated_drills=4",
    "policy.statement_drills=8",
    "policy.incontext_tasks=2", "policy.dagger_houses=2", "policy.episode_probe_houses=1",
    "policy.utilisation_houses=1", "policy.utilisation_quests=3",
    f"sampling.max_new_tokens={SHORT_TURN_TOKENS}",
]


# The test files that take longest, longest first (seconds of one file on one worker). `make test` and
# `make test-e2e` each hand whole files to two xdist workers (--dist loadfile) in
# collection order (--no-loadscope-reorder: xdist's own order puts the files with fewest tests last, which
# left test_e2e.py's one 4-minute test running alone at the end). Longest first is the classic greedy
# schedule. It orders only: a stale list costs minutes, never a result (tests/test_suite_order.py checks
# that every name still exists).
LONGEST_FIRST = (  # the summed --durations of the whole suite, 2026-12-07, the 2-core AVX2 EPYC, the extras installed
    "tests/reliability/test_resume.py",       # 139 s
    "tests/test_numerics.py",                 # 128 s (e2e, 2026-12-02)
    "tests/test_e2e.py",                      # 108 s (e2e, 2026-12-02)
    "tests/test_scienceworld.py",             # 88 s
    "tests/reliability/test_faulty_server.py",  # 84 s
    "tests/test_smollm2.py",                  # 61 s
    "tests/test_dagger.py",                   # 54 s
    "tests/test_model_pipeline.py",           # 47 s (e2e, 2026-12-02)
    "tests/reliability/test_orphans.py",      # 45 s
    "tests/test_statement_drills.py",         # 44 s
    "tests/test_scienceworld_memory.py",      # 38 s
    "tests/test_policy.py",                   # 35 s
    "tests/reliability/test_fuzz.py",         # 32 s
    "tests/test_exp_workflow.py",             # 31 s (e2e, 2026-12-02)
    "tests/test_data_parallel.py",            # 30 s
    "tests/reliability/test_trust.py",        # 25 s
    "tests/test_doc_links.py",                # 23 s
    "tests/test_policy_independence.py",      # 22 s
)


def pytest_collection_modifyitems(config, items):
    """Collect the files of :data:`LONGEST_FIRST` first, in its order (a stable sort: the other files and
    the tests within a file keep pytest's order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def scratch_repo(dest: Path, names: tuple[str, ...]) -> dict[str, str]:
    """A git + DVC repository at ``dest`` holding the project's ``names`` (files or folders), as
    DVC's end-to-end tests run it; returns the environment to run its commands in (the venv first
    on PATH, no experiment in flight)."""
    for name in names:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dest / name)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.pop("DVC_EXP_BASELINE_REV", None)
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q", "-f"]):
        done = subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    # the project's DVC settings, not `dvc init`'s: its remote and cache (.dvc/config), and what
    # DVC ignores (.dvcignore: the bytecode caches a stage's imports write inside directory deps
    # such as pipeline/memory; with init's empty one, a later stage's first import of a module
    # changes an earlier stage's dep and the second `dvc repro` is no no-op)
    for name in (".dvc/config", ".dvcignore"):
        shutil.copy(ROOT / name, dest / name)
    return env


@pytest.fixture(scope="session")
def tiny_cfg():
    """The real conf/ composed via DVC's compose + overrides, validated (a typed DictConfig)."""
    from pipeline.core.config import compose_text, validate

    return validate(OmegaConf.create(compose_text(ROOT, TINY_OVERRIDES)))


def train_config(cfg, overrides: dict):
    """The model pipeline's typed config (``TrainConfig``: the experiment's sections + ``demos`` and
    ``policy``) from an experiment config and overrides, for tests that build demonstrations or train:
    every experiment value kept (the tiny world, its paths), the recipe from ``overrides["policy"]``."""
    from pipeline.core.config import validate
    from pipeline.core.conf_schema import TrainConfig

    plain = OmegaConf.to_container(cfg) if OmegaConf.is_config(cfg) else cfg  # a Config section is no TrainConfig's
    return validate(OmegaConf.merge(OmegaConf.structured(TrainConfig), plain, overrides), schema=TrainConfig)


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
