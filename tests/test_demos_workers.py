"""The ``demos`` stage on any number of workers writes the same bytes (issue 46).

The demonstrations are built from a fixed partition (train quests, chunks of generated
houses, each item drawing its randomness from its own seed) in ``workers`` processes and
merged in partition order, so ``workers=1`` and ``workers=3`` write byte-identical
``data/demos/`` files, and those are the bytes the single-process code wrote before the
demonstrations were parallelised (``PINNED``, recorded at 6e9581d).

If a deliberate change to the demonstrations (prompts, expert, games, store) changes
``PINNED``, record the new hashes (``workers=1``); the workers=1 vs workers=3 comparison
must hold whatever they are.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import train_config

# Every kind of demonstration: rule-agent memory, quest demos (renamed ones too), plan
# drills, generated houses (some grounded) and generated drills (36 houses: three jobs of houses).
POLICY = {"rule_agent": "react", "rule_epsilon": 0.6, "demos_per_quest": 8, "plan_drills": 2, "slip_prob": 0.2,
          "explore_cap": 12, "generated_houses": 6, "generated_drills": 30, "generated_grounding": 0.5}

# sha256 of each file write_demo_set wrote for workers=1 before the parallel build (6e9581d); turns.parquet
# since the demonstrations' deliberate change of 2026-12-05 (memory.exclude_same_quest for the house's facts).
PINNED = {
    "grounding.json": "9be4c9acff3f0f3cde463c157c873710e7903f8ed869a2175ee239513a341992",
    "store/episodic_store.jsonl": "e3ab71ad19e1a12c432c1a8efd07785d2e9b1c61689c958f33dc647b788632fb",
    "store/episodic_store.parquet": "911f924ee24fe00d11734d677a68fb8eec292638fa5fcdc1815990e41b7332f3",
    "store/store_hash.txt": "40e05af3e50967ac1a6985be86376d406ee645a00afd1876d19434922cd9072d",
    "summary.json": "cb2509e7ef9f6532f864248b812b851454ea64e427a365b173c97f1b5259546d",
    # re-recorded for issue 64's fix: a train quest's C2 block no longer states its own past episode's facts
    "turns.parquet": "b5bdaf75d91cd6a237b3d01d3c60f521e5b7c12e0ca5f68773caa69a79f66093",
}


def _digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def cfg(tiny_cfg):
    return train_config(tiny_cfg, {"agent": {"name": "llm"}, "policy": POLICY})


def _build(cfg, tiny_games, out: Path, workers: int) -> dict[str, str]:
    from pipeline.policy.demoset import build_demo_set, write_demo_set

    ticks: list[int] = []
    demo_set = build_demo_set(OmegaConf.merge(cfg, {"workers": workers}), tiny_games.root, tiny_games.rows,
                              tiny_games.scenes, memory_progress=ticks.append, demo_progress=ticks.append)
    write_demo_set(demo_set, out)
    assert demo_set.run["workers"] == workers  # the build really ran on that many processes
    d = demo_set.summary["demos"]
    # progress reached every rule-agent episode and every demonstration
    assert sum(ticks) == demo_set.summary["rule_agent_episodes"]["episodes"] + d["episodes"] + d["plan_drills"]
    return _digests(out)


def test_demos_are_the_same_bytes_on_one_and_three_workers(cfg, tiny_games, tmp_path):
    one = _build(cfg, tiny_games, tmp_path / "w1", 1)
    three = _build(cfg, tiny_games, tmp_path / "w3", 3)
    assert one == three
    assert one == PINNED, "workers=1 no longer writes the pre-parallel bytes (see the module docstring)"
