"""The world registry (pipeline/envs/registry.py): a world is one descriptor and one line (its
package in ``PACKAGES``; a world defined outside ``pipeline/envs``, as this file's, one ``register``
call). A made-up world of two rooms, written in a few lines here, is registered with that one call
and played through the public dispatchers only (``build_games``, ``make_env``, ``make_user``,
``fact_reader``, ``world_words``, the session's rollout and the memory's store): nothing else needs
editing. A world's package is imported only when a run picks it (``env.world``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest
from omegaconf import OmegaConf

from pipeline.core.facts import Fact, StepFacts, WorldWords, fact
from pipeline.core.schemas import json_object
from pipeline.envs import build_games, env_family, fact_reader, make_env, registry, unread_env_keys, world_words
from pipeline.envs.common import (UNHELPFUL, EnvLifecycle, GamesResult, StepFeedback, WorldDescriptor, speak,
                                  step_status)
from pipeline.grounding.feedback import format_feedback_line
from pipeline.memory import build_entry
from pipeline.session.collection import make_factories
from pipeline.session.rollout import play, tasks_from_manifest
from pipeline.users import make_user

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- the world: two rooms

EXITS = {"Hall": ("east", "Garden"), "Garden": ("west", "Hall")}


class TwoRoomsEnv(EnvLifecycle):
    """Start in the Hall; the quest is won in the Garden."""

    def __init__(self, objective: str, max_steps: int):
        self.objective, self.max_steps = objective, max_steps
        self.admissible: list[str] = []

    def reset(self) -> dict[str, Any]:
        self.room, self.steps, self.won = "Hall", 0, False
        return self.observation()

    def facts(self) -> tuple[Fact, ...]:
        direction, to = EXITS[self.room]
        return fact("here", self.room), fact("exit", self.room, direction, to)

    def observation(self) -> dict[str, Any]:
        direction, to = EXITS[self.room]
        self.admissible = [f"go {direction}"]
        return {"scene": "s0", "agent_location": self.room, "agent_inventory": [], "visible_entities": [],
                "available_actions": ["go_to"], "description": f"You are in the {self.room}.",
                "objective": self.objective, "admissible_commands": list(self.admissible),
                "admissible_actions": [{"action": "go_to", "target": to, "command": f"go {direction}"}],
                "step": self.steps, "max_steps": self.max_steps}

    def step(self, action: Mapping[str, Any]):
        self.steps += 1
        direction, to = EXITS[self.room]
        valid = action.get("action") == "go_to" and action.get("target") in (to, direction)
        if valid:
            self.room = to
            self.won = self.room == "Garden"
        done = self.won or self.steps >= self.max_steps
        info = {"command": f"go {direction}" if valid else None, "valid": valid, "won": self.won, "lost": False,
                "expert_plan": [] if self.won else ["go east"], "solvable": True, "repeated": False,
                "env_feedback": f"You are in the {self.room}.", "changed": valid,
                "reward_parts": {"win": float(self.won)}, "step": self.steps, "truncated": False}
        return self.observation(), float(self.won), done, info

    def close(self) -> None:
        self.closed = True


class TwoRoomsUser:
    """Says where the Garden is until the agent is there."""

    def __init__(self, user_cfg, scene_spec, quest_row, seed):
        self.cfg, self.rng, self.plan_len = user_cfg, np.random.default_rng(seed), len(quest_row["expert_plan"])

    def step_feedback(self, step_id, obs, action, info) -> StepFeedback:
        lines = [] if info["won"] else [format_feedback_line("spatial", "The Garden is east of the Hall.")]
        status = step_status(info, self.plan_len)
        self.plan_len = len(info["expert_plan"])
        return speak(self.rng, self.cfg.feedback_prob, self.cfg.noise, lines, status,
                     lambda: format_feedback_line("general", UNHELPFUL[0]))

    def end_feedback(self, final):
        return True, []


class TwoRoomsReader:
    entity_pattern = r"Hall|Garden"

    def read_turn(self, turn) -> StepFacts:
        obs = json_object(turn.get("observation"))
        went = (fact("went", turn["command"].split()[-1]),) if (turn.get("command") or "").startswith("go ") else ()
        return StepFacts(seen=(fact("here", obs.get("agent_location") or "Hall"),), did=went)

    def read_text(self, text):
        return ()

    def kind(self, name):
        return None

    def sentence(self, f):
        return None

    def free_command(self, command):
        return None


def build_two_rooms(cfg, root: Path, *, progress: bool = True) -> GamesResult:
    games_dir = root / "data" / "two_rooms"
    games_dir.mkdir(parents=True, exist_ok=True)
    (games_dir / "q0.json").write_text(json.dumps({"start": "Hall"}))
    scenes = {"s0": {"scene_id": "s0", "rooms": list(EXITS), "preferences": []}}
    rows = [{"scene_id": "s0", "quest_id": "q0", "split": "train", "objective": "Go to the Garden.",
             "game_file": "data/two_rooms/q0.json", "expert_plan": ["go east"], "preferences": []}]
    return GamesResult(root=root, games_dir=games_dir, scenes=scenes, rows=rows, metrics={"games": 1})


TWO_ROOMS = WorldDescriptor(
    names=("two_rooms",), family="two_rooms",
    make_env=lambda cfg, task, root, scenes: TwoRoomsEnv(task.objective, cfg.env.max_steps),
    build_games=build_two_rooms, fact_reader=TwoRoomsReader,
    words=WorldWords(success="reaching the Garden"), make_user=TwoRoomsUser,
    unread_env_keys=("env.scienceworld",),
)


# --------------------------------------------------------------------------- tests


@pytest.fixture
def registered(monkeypatch):
    """The registry with the two-room world added by its one line (undone after the test)."""
    monkeypatch.setattr(registry, "WORLDS", dict(registry.WORLDS))
    registry.register(TWO_ROOMS)


def test_a_world_registered_once_plays_through_the_public_dispatchers(registered, tiny_cfg, tmp_path):
    cfg = OmegaConf.merge(tiny_cfg, {"env": {"name": "two_rooms", "world": "two_rooms"}, "agent": {"name": "react"}})
    games = build_games(cfg, tmp_path, progress=False)
    assert env_family(cfg) == "two_rooms" and world_words(cfg).success == "reaching the Garden"
    assert unread_env_keys(cfg) == ("env.scienceworld",) and isinstance(fact_reader(cfg), TwoRoomsReader)
    (task,) = tasks_from_manifest(games.rows, split="train", master_seed=0)

    with make_env(cfg, task, games.root, games.scenes) as env:  # the shared lifecycle closes it
        assert env.reset()["agent_location"] == "Hall" and env.facts()[0] == fact("here", "Hall")
    assert env.closed
    user = make_user(cfg, games.scenes, task)
    assert isinstance(user, TwoRoomsUser)

    env_for, agent_for, user_for = make_factories(cfg, games.root, games.scenes)
    (record,) = play([task], make_env=env_for, make_agent=agent_for, make_user=user_for)
    assert record["episode"]["won"] and record["episode"]["num_turns"] == 1
    assert record["turns"][0]["command"] == "go east"

    entry = build_entry(record["episode"], record["turns"], reader=fact_reader(cfg))
    assert entry.input_signature.num_aspects == 1  # "Garden", by the world's own entity pattern


def test_an_unknown_world_fails_listing_the_known_ones(registered):
    with pytest.raises(ValueError, match="env.name='forest': unknown environment, expected one of household, tiny, "
                                         "scienceworld, scienceworld_tiny, two_rooms"):
        registry.lookup("forest")
    with pytest.raises(ValueError, match="already the world 'household'"):
        registry.register(WorldDescriptor(**{**TWO_ROOMS.__dict__, "names": ("tiny",), "family": "copy"}))


def test_env_world_must_be_the_names_world_and_a_known_package(tiny_cfg):
    with pytest.raises(ValueError, match="env.name='scienceworld_tiny' is the world 'scienceworld', but "
                                         "env.world='household': set env.world=scienceworld"):
        registry.world_of(OmegaConf.merge(tiny_cfg, {"env": {"name": "scienceworld_tiny"}}))
    with pytest.raises(ValueError, match="env.world='forest': unknown world, expected one of household, scienceworld"):
        registry.world_of(OmegaConf.merge(tiny_cfg, {"env": {"world": "forest"}}))
    assert registry.world_of(OmegaConf.merge(tiny_cfg, {"env": {"name": "scienceworld_tiny",
                                                                "world": "scienceworld"}})).family == "scienceworld"


def test_a_run_imports_only_the_world_it_plays():
    """Importing the dispatchers (and the session, the agents) loads no world's package; looking up
    the household loads its package and not ScienceWorld's (a fresh interpreter: this one has both)."""
    import subprocess
    import sys

    code = ("import sys; import pipeline.envs, pipeline.users, pipeline.agents, pipeline.session.collection\n"
            "pkgs = lambda: sorted({m.split('.')[2] for m in sys.modules if m.startswith('pipeline.envs.') and "
            "m.count('.') >= 3})\n"
            "print(pkgs()); from pipeline.envs import registry; registry.load('household'); print(pkgs())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "['household']"]


def test_every_env_option_of_conf_names_a_registered_world():
    """Each ``conf/env/<option>.yaml`` selects a world the registry knows (its ``name``, or the
    schema's default ``household`` where the option does not set one)."""
    for path in sorted((ROOT / "conf" / "env").glob("*.yaml")):
        option = OmegaConf.load(path)
        base = OmegaConf.load(path.parent / f"{option.defaults[0]}.yaml") if "defaults" in option else {}
        name, world = (option.get(k, base.get(k, "household")) for k in ("name", "world"))
        assert registry.lookup(name).family == world and world in registry.PACKAGES, path.name


def test_each_world_names_its_things_for_the_memory_signature():
    """The household keeps the seeds' ``Apple_2`` (the signature bytes of its store); ScienceWorld
    supplies its own names (answer boxes, rooms), which the seeds' pattern does not see."""
    from pipeline.memory.signature import SignatureBuilder

    house, science = registry.lookup("household"), registry.lookup("scienceworld")
    assert house.entity_pattern == r"[A-Za-z]+_\d+" and TWO_ROOMS.entity_pattern == r"Hall|Garden"
    objective = "Put Apple_2 in Fridge_0 but do not open Cabinet_0"
    assert SignatureBuilder(house.entity_pattern).build(objective) == SignatureBuilder().build(objective)
    sw = ("Your task is to find a(n) non-living thing. First, focus on the thing. Then, move it to the "
          "red box in the kitchen.")
    assert SignatureBuilder(science.entity_pattern).build(sw).num_aspects == 2
    assert SignatureBuilder().build(sw).num_aspects == 0
