"""The ``games`` stage: scenes, quests, splits, objectives, expert plans, compiled games."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from pipeline.envs.household.env import HouseholdEnv, command_to_action
from pipeline.envs.household.games import (compile_quest_game, make_quests, make_scene, parser_aliases, plan_games,
                            scene_world)
from pipeline.envs.household.planner import shortest_plan
from pipeline.envs.household.world import World
from pipeline.policy.expert import expert_episode, read_knowledge
from pipeline.core.io import atomic_write_json, read_json, write_parquet
from pipeline.core.schemas import MANIFEST_SCHEMA, SCHEMA_VERSION, manifest_table

pytestmark = pytest.mark.filterwarnings("ignore:Game .* is not fully supported")

OBJECTIVE_RE = re.compile(
    r"^(Put \w+ in \w+ and (close|lock) it\.|Put \w+ on \w+\.|Bring \w+ to the \w+ and drop it there\.|Pick up \w+\.)$")


def _plan(cfg):
    return plan_games(cfg.env, seed=int(cfg.seed), preferences_per_scene=int(cfg.user.preferences_per_scene),
                      games_dir=str(cfg.paths.games))


def _goals(row):
    return tuple(json.loads(row["metadata"])["goal"])


def test_same_config_gives_byte_identical_manifest_and_scenes(tiny_cfg, tiny_games, tmp_path):
    for i in range(2):
        scenes, rows = _plan(tiny_cfg)
        write_parquet(manifest_table(rows), tmp_path / f"m{i}.parquet", sort_by=["scene_id", "quest_id"],
                      schema_version=SCHEMA_VERSION)
        atomic_write_json(tmp_path / f"s{i}.json", scenes)
    built = tiny_games.games_dir
    assert (tmp_path / "m0.parquet").read_bytes() == (tmp_path / "m1.parquet").read_bytes()
    assert (tmp_path / "m0.parquet").read_bytes() == (built / "manifest.parquet").read_bytes()
    assert (tmp_path / "s0.json").read_bytes() == (built / "scenes.json").read_bytes()


def test_another_seed_gives_other_layouts(tiny_cfg):
    a = make_scene(tiny_cfg.env, 0, 0, 1)
    b = make_scene(tiny_cfg.env, 0, 1, 1)
    assert a == make_scene(tiny_cfg.env, 0, 0, 1)
    assert a != b


def test_manifest_schema_rows_and_files(tiny_cfg, tiny_games):
    table = pq.read_table(tiny_games.games_dir / "manifest.parquet")
    assert table.schema.remove_metadata() == MANIFEST_SCHEMA
    assert pq.read_schema(tiny_games.games_dir / "manifest.parquet").metadata[b"schema_version"] == b"1"
    rows = table.to_pylist()
    assert [(r["scene_id"], r["quest_id"]) for r in rows] == sorted((r["scene_id"], r["quest_id"]) for r in rows)
    assert len(rows) == 4 == tiny_games.metrics["num_games"]
    for r in rows:
        assert r["game_file"] == f"{tiny_cfg.paths.games}/{r['scene_id']}/{r['quest_id']}.z8"
        assert (tiny_games.root / r["game_file"]).is_file()
        assert (tiny_games.root / r["game_file"]).with_suffix(".json").is_file()
        assert r["quest_length"] == len(r["expert_plan"]) >= tiny_cfg.env.min_quest_length
        assert r["preferences"] == [p["id"] for p in tiny_games.scenes[r["scene_id"]]["preferences"]]
    metrics = read_json(tiny_games.root / tiny_cfg.paths.metrics / "games.json")
    assert metrics["num_train"] == 2 and metrics["num_eval"] == 2 and metrics["num_eval_heldout"] == 1
    assert metrics["mean_quest_length"] == pytest.approx(sum(r["quest_length"] for r in rows) / 4, abs=1e-3)


def test_splits_keep_eval_goals_and_heldout_scenes_out_of_train(tiny_cfg, tiny_games):
    rows = tiny_games.rows
    train = {(r["scene_id"], _goals(r)) for r in rows if r["split"] == "train"}
    evals = {(r["scene_id"], _goals(r)) for r in rows if r["split"] == "eval"}
    assert train and evals and not (train & evals)
    heldout = {s for s, spec in tiny_games.scenes.items() if spec["scene_split"] == "heldout"}
    assert heldout == {"scene_01"}  # the last env.heldout_scenes scenes
    for r in rows:
        assert r["scene_split"] == tiny_games.scenes[r["scene_id"]]["scene_split"]
        if r["scene_id"] in heldout:
            assert r["split"] == "eval"
    seen = [r for r in rows if r["scene_id"] not in heldout]
    assert sorted(r["split"] for r in seen) == ["eval", "train", "train"]


def test_eval_quests_do_not_move_when_the_train_count_changes(tiny_cfg):
    more = OmegaConf.merge(tiny_cfg, {"env": {"train_quests_per_scene": 4}})
    evals = lambda rows: [(r["scene_id"], r["objective"]) for r in rows if r["split"] == "eval"]  # noqa: E731
    assert evals(_plan(tiny_cfg)[1]) == evals(_plan(more)[1])


def test_objective_states_the_goal_only(tiny_games):
    import textworld

    for r in tiny_games.rows:
        assert OBJECTIVE_RE.match(r["objective"]), r["objective"]
        game = textworld.Game.load(str(tiny_games.game_path(r).with_suffix(".json")))
        assert game.objective == r["objective"]  # not TextWorld's step-by-step walkthrough text
        assert "walkthrough" not in game.metadata
        for step in r["expert_plan"]:
            assert step not in r["objective"]


def test_expert_plan_replays_to_won_with_preferences(tiny_games):
    for r in tiny_games.rows:
        spec = tiny_games.scenes[r["scene_id"]]
        with HouseholdEnv(tiny_games.game_path(r), objective=r["objective"], preferences=spec["preferences"],
                          max_steps=50) as env:
            obs = env.reset()
            assert env.expert_plan() == r["expert_plan"]
            for i, cmd in enumerate(r["expert_plan"]):
                assert cmd in obs["admissible_commands"]
                obs, reward, done, info = env.step(command_to_action(cmd, env.world.room_exits()))
                assert info["command"] == cmd and info["valid"]
                assert done == (i == len(r["expert_plan"]) - 1)
            assert info["won"] and info["preferences_ok"] and info["expert_plan"] == []


def test_scene_specs_follow_the_contract(tiny_games):
    for sid, spec in tiny_games.scenes.items():
        assert {"scene_id", "rooms", "connections", "containers", "supporters", "objects", "keys",
                "preferences"} <= set(spec)
        assert spec["scene_id"] == sid and "Kitchen" in spec["rooms"] and len(spec["rooms"]) == 2
        names = [c["name"] for c in spec["containers"]]
        assert all(re.match(r"^(Fridge|Cabinet|Drawer|Wardrobe|Chest)_\d$", n) for n in names)
        locked = {c["name"]: c["key"] for c in spec["containers"] if c["locked"]}
        assert len(locked) == 1
        for key in spec["keys"]:
            assert locked[key["opens"]] == key["name"] == f"Key_{key['opens'].split('_')[1]}"
            assert key["location"] not in locked  # reachable without itself
        for a, d, b in spec["connections"]:
            assert a in spec["rooms"] and b in spec["rooms"] and d in ("north", "south", "east", "west")
        for p in spec["preferences"]:
            assert {"id", "text", "kind"} <= set(p)
        world = scene_world(spec)
        assert world.player == spec["start_room"]
        assert {o["name"] for o in spec["objects"]} <= set(world.location)


def test_quests_of_a_scene_share_its_layout(tiny_games):
    import textworld

    by_scene = {}
    for r in tiny_games.rows:
        game = textworld.Game.load(str(tiny_games.game_path(r).with_suffix(".json")))
        facts = sorted(str(f) for f in game.world.facts)
        by_scene.setdefault(r["scene_id"], set()).add(tuple(facts))
    assert all(len(v) == 1 for v in by_scene.values())


def test_too_many_quests_is_a_clear_error(tiny_games):
    spec = tiny_games.scenes["scene_00"]
    with pytest.raises(ValueError, match=r"scene_00: only \d+ distinct solvable quests.*env.train_quests_per_scene"):
        make_quests(spec, 500, 2)


def test_game_files_do_not_depend_on_worker_count(tiny_games, tmp_path):
    # tiny_games compiled in a 2-process pool (other hash seeds); compile one game again
    # here, preferring a goal of several facts (their order once leaked from a set).
    r = max(tiny_games.rows, key=lambda row: len(_goals(row)))
    res = compile_quest_game({"spec": tiny_games.scenes[r["scene_id"]], "row": r, "out": str(tmp_path / "g.z8")})
    assert res["error"] is None
    built = tiny_games.game_path(r)
    assert (tmp_path / "g.z8").read_bytes() == built.read_bytes()
    assert (tmp_path / "g.json").read_bytes() == built.with_suffix(".json").read_bytes()


def _tree(games_dir: Path) -> dict[str, bytes]:
    return {str(f.relative_to(games_dir)): f.read_bytes() for f in sorted(games_dir.rglob("*")) if f.is_file()}


def test_a_cold_build_elsewhere_gives_byte_identical_games(tiny_cfg, tiny_games, tmp_path, monkeypatch):
    # A second build (fresh worker processes) into a deeper root, from another working
    # directory, with a HOME whose ~/Inform holds another version of an extension every
    # game includes (Inform 7 prefers a user's copy, and prints its version in the game):
    # every file under the games folder must have the same bytes.
    from textworld.generator.inform7.world2inform7 import I7_DEFAULT_PATH

    from pipeline.envs.household.build import build_games

    name = Path("Extensions", "Emily Short", "Basic Screen Effects.i7x")
    ext = tmp_path / "home" / "Inform" / name
    ext.parent.mkdir(parents=True)
    text = (Path(I7_DEFAULT_PATH) / "share" / "inform7" / "Internal" / name).read_text(encoding="utf-8")
    ext.write_text(text.replace("Version 7/", "Version 9/", 1), encoding="utf-8")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    other = build_games(tiny_cfg, tmp_path / "another" / "project root", progress=False)
    first, second = _tree(tiny_games.games_dir), _tree(other.games_dir)
    assert len(first) == 2 * len(tiny_games.rows) + 2  # .z8 + .json per game, manifest, scenes
    assert sorted(first) == sorted(second)
    assert [name for name in first if first[name] != second[name]] == []


def test_game_files_hold_no_machine_dependent_bytes(tiny_games):
    import textworld

    # what differs between machines, clones and build folders (and their resolved forms)
    paths = {sys.prefix, str(Path(textworld.__file__).parent), str(tiny_games.root), str(Path.home()),
             str(Path.cwd())}
    needles = {p.encode() for q in paths for p in (q, str(Path(q).resolve())) if len(p) > 4}  # not "/", "/tmp"
    for name, data in _tree(tiny_games.games_dir).items():
        assert not [n for n in needles if n in data], name
        if name.endswith(".json") and name.startswith("scene_"):
            assert json.loads(data)["KB"]["text_grammars_path"] == "textworld/generator/data/text_grammars"
        if name.endswith(".z8"):
            assert data[0x12:0x18] == b"000000", name  # Inform writes the compile date (YYMMDD) there


def test_parser_aliases_are_short_unique_words():
    names = [f"Cabinet_{i}" for i in range(8)] + [f"Nightstand_{i}" for i in range(8)]
    aliases = parser_aliases(names)
    assert len(set(aliases.values())) == len(names)
    # the Z-machine parser reads 9 Z-characters of a word: lower-case letters cost one each
    assert all(re.fullmatch(r"[a-z]{1,9}", a) for a in aliases.values())


def test_stage_refuses_impossible_config_before_compiling(tiny_cfg, tmp_path):
    from pipeline.envs.household.build import build_games

    greedy = OmegaConf.merge(tiny_cfg, {"env": {"train_quests_per_scene": 200}})
    with pytest.raises(ValueError, match="env.train_quests_per_scene"):
        build_games(greedy, tmp_path, progress=False)
    with pytest.raises(ValueError, match="env.min_quest_length=0"):
        build_games(OmegaConf.merge(tiny_cfg, {"env": {"min_quest_length": 0}}), tmp_path, progress=False)
    assert not any(tmp_path.iterdir())  # nothing compiled, nothing written


# ------------------------------------------------------------------ recorded outputs (issue 15)
# tests/data/household_golden.json holds what the household code gave on the tiny games
# before the world model, planner and user were unified (old env.shortest_plan,
# policy.expert, HouseholdEnv): the unified code must give exactly the same.

GOLDEN = json.loads((Path(__file__).parent / "data" / "household_golden.json").read_text(encoding="utf-8"))


def _digest(x) -> str:
    return hashlib.sha256(json.dumps(x, sort_keys=True, default=str).encode()).hexdigest()[:16]


def test_planner_reproduces_the_recorded_plans():
    worlds = {sid: scene_world(spec) for sid, spec in GOLDEN["scenes"].items()}
    for case in GOLDEN["planner"]:
        world = worlds[case["scene"]]
        if case["state"] is not None:
            st = case["state"]
            world = World(**{**vars(world), "player": st["player"],
                             "container_state": {**world.container_state, **st["container_state"]},
                             "location": {**world.location, **{o: tuple(v) for o, v in st["location"].items()}}})
        plan = shortest_plan(world, case["goal"], case["prefs"], opened=case["opened"], unlocked=case["unlocked"])
        assert plan == case["plan"], case


def _recorded_row(tiny_games, rec):
    row = next(r for r in tiny_games.rows if (r["scene_id"], r["quest_id"]) == (rec["scene_id"], rec["quest_id"]))
    assert tiny_games.scenes[row["scene_id"]] == GOLDEN["scenes"][row["scene_id"]], "tiny games changed"
    assert (row["objective"], row["expert_plan"]) == (rec["objective"], rec["expert_plan"])
    return row


def test_env_reproduces_the_recorded_episodes(tiny_games):
    for rec in GOLDEN["env"]:
        row = _recorded_row(tiny_games, rec)
        spec = tiny_games.scenes[row["scene_id"]]
        with HouseholdEnv(tiny_games.game_path(row), objective=row["objective"], max_steps=15,
                          preferences=spec["preferences"]) as env:
            trace = [env.reset()]
            for action in rec["actions"]:
                trace.append(list(env.step(action)))
        assert _digest(trace) == rec["digest"], rec["scene_id"]


def test_expert_reproduces_the_recorded_demonstrations(tiny_games):
    for rec in GOLDEN["expert"]:
        row = next(r for r in tiny_games.rows if (r["scene_id"], r["quest_id"]) == (rec["scene_id"], rec["quest_id"]))
        spec = tiny_games.scenes[row["scene_id"]]
        with HouseholdEnv(tiny_games.game_path(row), objective=row["objective"], max_steps=15,
                          preferences=spec["preferences"]) as env:
            env.reset()
            know = read_knowledge(rec["text"], env.world, spec["preferences"])
            demo = expert_episode(env, know, slip_prob=rec["slip"], rng=np.random.default_rng(rec["seed"]),
                                  explore_cap=rec["cap"])
        assert (len(demo.turns), demo.won, demo.preferences_ok, demo.searched_steps) == (
            rec["turns"], rec["won"], rec["preferences_ok"], rec["searched"])
        assert _digest([vars(t) for t in demo.turns]) == rec["digest"]


def test_our_compile_is_textworld_s_without_the_index(tiny_games, tmp_path, monkeypatch):
    """``compile_story`` runs TextWorld's compilers with its arguments plus ``ni -noindex``: the
    story file is byte-for-byte TextWorld's own ``compile_inform7_game``'s (the Index it skips is
    HTML for Inform's IDE), at a third of ``ni``'s time."""
    from textworld.generator.inform7 import compile_inform7_game

    from pipeline.envs.household.games import _inform_home, build_game, compile_story

    monkeypatch.delenv("TEXTWORLD_I6_DEBUG", raising=False)
    row = tiny_games.rows[0]
    _, source = build_game(tiny_games.scenes[row["scene_id"]], row)
    (tmp_path / "home").mkdir()
    with _inform_home(tmp_path / "home"):
        compile_story(source, tmp_path / "ours.z8")
        compile_inform7_game(source, str(tmp_path / "textworld.z8"))
    ours, theirs = (tmp_path / "ours.z8").read_bytes(), (tmp_path / "textworld.z8").read_bytes()
    assert len(ours) > 10_000
    assert ours[:0x12] + ours[0x18:] == theirs[:0x12] + theirs[0x18:]  # all but the compile date (the serial)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "ours.z8", "textworld.ni", "textworld.z8"]
