"""Household scenes and quests, built offline with TextWorld's ``GameMaker``.

A *scene* is a fixed layout drawn from ``(seed, stream, scene index)``: rooms joined by compass
directions, openable containers (some locked, each with a ``Key_<n>`` placed where it
can be reached), supporters and portable objects, all named as in seed 004 (``Kitchen``,
``Cabinet_0``, ``Drawer_1``, ``Key_1``, ``Apple_2``). Every quest of a scene starts from
that same layout, so what an agent learns about a scene (where things are, which
container is locked and where its key lies) carries over between its quests. Quests are
goal facts (an ``Event``), their objective states the goal only, and their expert plan
is a verified shortest plan (:func:`pipeline.envs.household.planner.shortest_plan`), not TextWorld's own
walkthrough.

Example:
    >>> scenes, rows = plan_games(cfg.env, seed=cfg.seed, preferences_per_scene=1,
    ...                           games_dir="data/games")            # doctest: +SKIP
    >>> compile_quest_game({"spec": scenes[r["scene_id"]], "row": r, "out": "/abs/q00.z8"})  # doctest: +SKIP

The stage that runs all of this is :mod:`pipeline.stages.games` (through
:mod:`pipeline.envs.household.build`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from omegaconf import OmegaConf

from pipeline.core.conf_schema import EnvConfig, WorldStream
from pipeline.core.io import atomic_write_text
from pipeline.core.schemas import canonical_json
from pipeline.core.seeding import derive_seed
from pipeline.envs.household.env import HouseholdEnv, check_game_file, command_to_action
from pipeline.envs.household.planner import shortest_plan
from pipeline.envs.household.text import kind_of, preference_text
from pipeline.envs.household.world import DIRECTIONS, OPPOSITE, World, fact_str, parse_fact, typed_facts

ROOM_NAMES = ("Kitchen", "Bedroom", "Bathroom", "LivingRoom", "DiningRoom", "Office")
# Which containers / supporters a room may hold (a fridge only in the kitchen, ...).
CONTAINER_KINDS = {
    "Kitchen": ("Fridge", "Cabinet", "Drawer"),
    "Bedroom": ("Drawer", "Wardrobe", "Chest"),
    "Bathroom": ("Cabinet", "Drawer"),
    "LivingRoom": ("Cabinet", "Chest", "Drawer"),
    "DiningRoom": ("Cabinet", "Drawer"),
    "Office": ("Drawer", "Cabinet"),
}
SUPPORTER_KINDS = {
    "Kitchen": ("Table", "Counter"),
    "Bedroom": ("Nightstand", "Desk"),
    "Bathroom": ("Shelf",),
    "LivingRoom": ("Table", "Shelf"),
    "DiningRoom": ("Table",),
    "Office": ("Desk", "Shelf"),
}
# No name may start with "P" or "I": TextWorld's grammar treats such names as unnamed
# (its test is re.match("([a-z]_[0-9]+|P|I)", name)) and renames them ("fly larva").
OBJECT_KINDS = ("Apple", "Mug", "Book", "Towel", "Soap", "Cup", "Remote", "Candle", "Bowl", "Spoon",
                "Glass", "Vase")
QUEST_TYPES = ("put_in", "put_on", "bring", "take")
# Where things of a kind usually are kept (``env.regularity``: the share placed so): the
# household regularities a past house can teach another (a memory's kind-level lessons), as
# the knowledge base (conf/knowledge/household_kb.json) states them. Containers only: a
# thing on a supporter is in plain sight, one in a closed container must be searched for.
TYPICAL_HOLDERS = {
    "Apple": ("Fridge",), "Mug": ("Cabinet",), "Cup": ("Cabinet",), "Glass": ("Cabinet",), "Bowl": ("Cabinet",),
    "Spoon": ("Drawer",), "Remote": ("Drawer",), "Candle": ("Drawer",), "Book": ("Chest", "Drawer"),
    "Towel": ("Wardrobe", "Cabinet"), "Soap": ("Cabinet",), "Vase": ("Chest", "Cabinet"), "Key": ("Drawer",),
}
_GRID = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
_SERIAL = b"000000"  # Z-machine serial number (Inform writes the compile date there)
# What a game's .json says for TextWorld's built-in text grammars (TextWorld writes their
# absolute path inside the venv): the folder relative to site-packages. It is read only
# when a Grammar is built from the loaded game's KnowledgeBase, and TextWorld then always
# adds its built-in folder too; loading and playing a game never read it.
_PORTABLE_GRAMMARS_PATH = "textworld/generator/data/text_grammars"


def scene_id(index: int) -> str:
    return f"scene_{index:02d}"


# --------------------------------------------------------------------------- scenes


EXPERIMENT_STREAM = "scene"
"""The experiment's scenes: scene ``i`` of ``seed`` is drawn from ``(seed, "scene", i)``."""
MODEL_STREAM = "model-scene"
"""The model pipeline's own scenes (``policy.world: own``): ``(seed, "model-scene", i)``, a label no
experiment draws from, so its houses are none of any experiment seed's (tests/test_training_world.py)."""


def scene_stream(cfg: Any) -> str:
    """The label the games of ``cfg`` draw their scenes from: the model pipeline's own stream when its
    recipe says ``policy.world: own`` (the default), else the experiment's (the experiment's config has
    no ``policy``)."""
    world = OmegaConf.select(cfg, "policy.world", default=None) if OmegaConf.is_config(cfg) else None
    return MODEL_STREAM if world is not None and WorldStream(world) == WorldStream.own else EXPERIMENT_STREAM


def make_scene(env_cfg: EnvConfig, index: int, seed: int, preferences_per_scene: int,
               stream: str = EXPERIMENT_STREAM) -> dict[str, Any]:
    """The scene spec of scene ``index`` (a JSON dict, see docs/contracts.md "Games").

    Every part is drawn from one ``random.Random`` seeded from ``(seed, stream, index)``
    (:func:`scene_stream`), in this order: rooms, their connections, containers (and which
    are locked), supporters, keys, objects, preferences, the start room.
    """
    sid = scene_id(index)
    scene_seed = derive_seed(seed, stream, index)
    rng = random.Random(scene_seed)
    rooms = ["Kitchen"] + rng.sample(ROOM_NAMES[1:], env_cfg.rooms_per_scene - 1)
    connections = _draw_connections(rng, rooms)
    containers = _draw_containers(rng, rooms, env_cfg.containers_per_scene, env_cfg.locked_containers)
    supporters = []
    for j in range(env_cfg.supporters_per_scene):
        room = rng.choice(rooms)
        supporters.append({"name": f"{rng.choice(SUPPORTER_KINDS[room])}_{j}", "room": room})
    # Keys lie on a floor, a supporter or in an unlocked container: always reachable.
    key_spots = rooms + [s["name"] for s in supporters] + [c["name"] for c in containers if not c["locked"]]
    regularity = float(env_cfg.regularity)
    keys = [{"name": c["key"], "location": _typical_spot(rng, "Key", [x for x in containers if not x["locked"]],
                                                         regularity) or rng.choice(key_spots), "opens": c["name"]}
            for c in containers if c["locked"]]
    objects = _draw_objects(rng, rooms, containers, supporters, env_cfg.objects_per_scene, regularity)
    prefs = _draw_preferences(rng, containers, bool(keys), preferences_per_scene)
    return {
        "scene_id": sid,
        "seed": scene_seed,
        "rooms": rooms,
        "start_room": rng.choice(rooms),
        "connections": connections,
        "containers": containers,
        "supporters": supporters,
        "objects": objects,
        "keys": keys,
        "preferences": prefs,
    }


def _draw_connections(rng: random.Random, rooms: list[str]) -> list[list[str]]:
    """Rooms on a grid, each new one attached to a placed one through a free side, so the
    compass directions are always consistent (no two exits lead to one room)."""
    pos = {rooms[0]: (0, 0)}
    taken = {(0, 0)}
    connections = []
    for room in rooms[1:]:
        options = [(r, d) for r in pos for d in DIRECTIONS
                   if (pos[r][0] + _GRID[d][0], pos[r][1] + _GRID[d][1]) not in taken]
        src, d = rng.choice(options)
        pos[room] = (pos[src][0] + _GRID[d][0], pos[src][1] + _GRID[d][1])
        taken.add(pos[room])
        connections.append([src, d, room])
    return connections


def _draw_containers(rng: random.Random, rooms: list[str], n: int, n_locked: int) -> list[dict[str, Any]]:
    """``Fridge_0`` in the Kitchen, then ``n - 1`` more (one fridge at most); ``n_locked``
    of them locked, container ``i`` opened by ``Key_<i>``."""
    containers = []
    used_fridge = False
    for i in range(n):
        room = "Kitchen" if i == 0 else rng.choice(rooms)
        kinds = [k for k in CONTAINER_KINDS[room] if not (k == "Fridge" and used_fridge)]
        kind = "Fridge" if i == 0 else rng.choice(kinds)
        used_fridge = used_fridge or kind == "Fridge"
        containers.append({"name": f"{kind}_{i}", "room": room, "locked": False, "key": None})
    for i in sorted(rng.sample(range(len(containers)), n_locked)):
        containers[i]["locked"] = True
        containers[i]["key"] = f"Key_{i}"
    return containers


def _typical_spot(rng: random.Random, kind: str, containers: list[dict[str, Any]], regularity: float) -> str | None:
    """A container of a kind things of ``kind`` are usually kept in (:data:`TYPICAL_HOLDERS`),
    with probability ``regularity`` when the scene has one; None otherwise. Draws nothing at
    ``regularity`` 0 (scenes stay what they were before the setting existed)."""
    if regularity <= 0:
        return None
    typical = [c["name"] for c in containers if kind_of(c["name"]) in TYPICAL_HOLDERS.get(kind, ())]
    if rng.random() >= regularity or not typical:
        return None
    return rng.choice(typical)


def _draw_objects(rng: random.Random, rooms: list[str], containers: list[dict[str, Any]],
                  supporters: list[dict[str, Any]], n: int, regularity: float = 0.0) -> list[dict[str, Any]]:
    """``n`` objects of distinct kinds: with probability ``regularity`` in a container of a
    kind they are usually kept in (when there is one); otherwise half in containers, some on
    supporters, the rest on a floor."""
    objects = []
    for j, kind in enumerate(rng.sample(OBJECT_KINDS, n)):
        typical = _typical_spot(rng, kind, containers, regularity)
        if typical is not None:
            objects.append({"name": f"{kind}_{j}", "location": typical})
            continue
        r = rng.random()
        if r < 0.5:
            spot = rng.choice(containers)["name"]
        elif r < 0.8 and supporters:
            spot = rng.choice(supporters)["name"]
        else:
            spot = rng.choice(rooms)
        objects.append({"name": f"{kind}_{j}", "location": spot})
    return objects


def _draw_preferences(rng: random.Random, containers: list[dict[str, Any]], has_keys: bool,
                      n: int) -> list[dict[str, Any]]:
    """``n`` distinct preference kinds (``lock_after_use`` only with a locked container), with targets."""
    kinds = ["close_containers", "keep_closed"] + (["lock_after_use"] if has_keys else [])
    prefs = []
    for kind in sorted(rng.sample(kinds, min(int(n), len(kinds))), key=kinds.index):
        target = None
        if kind == "keep_closed":
            target = rng.choice([c["name"] for c in containers])
        elif kind == "lock_after_use":
            target = rng.choice([c["name"] for c in containers if c["locked"]])
        pid = kind if target is None else f"{kind}:{target}"
        prefs.append({"id": pid, "kind": kind, "target": target, "text": preference_text(kind, target)})
    return prefs


def build_maker(spec: Mapping[str, Any]):
    """A ``textworld.GameMaker`` holding the scene's initial layout.

    Returns:
        ``(maker, entities)`` with ``entities`` mapping every name (plus ``"P"`` for the
        player and ``"I"`` for the inventory) to its ``WorldEntity``.
    """
    import textworld  # deferred: heavy optional dependency (textworld)
    from textworld import GameMaker
    from textworld.generator.data import KnowledgeBase

    options = textworld.GameOptions()
    options.kb = KnowledgeBase.default()  # parsed once at import; a fresh GameOptions re-parses it (0.5 s)
    options.seeds = int(spec["seed"])  # the text grammar: same flavour text for all quests
    M = GameMaker(options)
    ents: dict[str, Any] = {"P": M.player, "I": M.inventory}
    for r in spec["rooms"]:
        ents[r] = M.new_room(r)
    for a, d, b in spec["connections"]:
        M.connect(getattr(ents[a], d), getattr(ents[b], OPPOSITE[d]))
    M.set_player(ents[spec["start_room"]])
    for c in spec["containers"]:
        ents[c["name"]] = e = M.new(type="c", name=c["name"])
        e.add_property("locked" if c["locked"] else "closed")
        ents[c["room"]].add(e)
    for s in spec["supporters"]:
        ents[s["name"]] = e = M.new(type="s", name=s["name"])
        ents[s["room"]].add(e)
    for k in spec["keys"]:
        ents[k["name"]] = e = M.new(type="k", name=k["name"])
        M.add_fact("match", e, ents[k["opens"]])
    for o in spec["objects"]:
        ents[o["name"]] = M.new(type="o", name=o["name"])
    for item in spec["keys"] + spec["objects"]:
        ents[item["location"]].add(ents[item["name"]])
    return M, ents


def scene_world(spec: Mapping[str, Any]) -> World:
    """The scene's initial state as a :class:`World` (from the GameMaker's own facts)."""
    M, ents = build_maker(spec)
    name_of = {e.id: name for name, e in ents.items()}
    return World.from_facts(typed_facts(M.state.facts, name_of))


# --------------------------------------------------------------------------- quests


def quest_candidates(spec: Mapping[str, Any], world: World) -> dict[str, list[dict[str, Any]]]:
    """Every distinct goal of each quest type (unordered, not yet checked for solvability)."""
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in QUEST_TYPES}
    for o in [x["name"] for x in spec["objects"]]:
        where = world.location[o]
        for c in spec["containers"]:
            if where != ("in", c["name"]):
                # A container that starts locked is to be locked again ("close" for the others).
                end, verb = ("locked", "lock") if c["locked"] else ("closed", "close")
                out["put_in"].append({"type": "put_in", "goal": [fact_str("in", [o, c["name"]]),
                                                                 fact_str(end, [c["name"]])],
                                      "objective": f"Put {o} in {c['name']} and {verb} it."})
        for s in spec["supporters"]:
            if where != ("on", s["name"]):
                out["put_on"].append({"type": "put_on", "goal": [fact_str("on", [o, s["name"]])],
                                      "objective": f"Put {o} on {s['name']}."})
        for r in spec["rooms"]:
            if world.room_of(o) != r:
                out["bring"].append({"type": "bring", "goal": [fact_str("at", [o, r])],
                                     "objective": f"Bring {o} to the {r} and drop it there."})
        out["take"].append({"type": "take", "goal": [fact_str("in", [o, "I"])], "objective": f"Pick up {o}."})
    return out


def make_quests(spec: Mapping[str, Any], n_quests: int, min_length: int, *,
                allow_fewer: bool = False) -> list[dict[str, Any]]:
    """Draw ``n_quests`` distinct solvable quests for a scene, quest types interleaved.

    Each quest gets the shortest plan that wins with the scene's preferences held (the
    game ends at the win, so containers must be closed before the last step). The quests
    of a smaller ``n_quests`` are the first ones of a larger.

    Raises:
        ValueError: the scene has fewer solvable quests than asked for (``allow_fewer``:
            those there are are returned).
    """
    world = scene_world(spec)
    rng = random.Random(derive_seed(spec["seed"], "quests"))
    pools = quest_candidates(spec, world)
    for t in QUEST_TYPES:
        rng.shuffle(pools[t])
    order = list(QUEST_TYPES)
    rng.shuffle(order)
    prefs = [p["id"] for p in spec["preferences"]]
    quests: list[dict[str, Any]] = []
    while len(quests) < n_quests and any(pools.values()):
        for t in order:
            if not pools[t] or len(quests) >= n_quests:
                continue
            q = pools[t].pop(0)
            plan = shortest_plan(world, q["goal"], prefs)
            if plan is None or len(plan) < min_length:
                continue
            bare = shortest_plan(world, q["goal"])
            quests.append(dict(q, plan=plan, plan_length_without_preferences=len(bare or [])))
    if len(quests) < n_quests and not allow_fewer:
        raise ValueError(
            f"{spec['scene_id']}: only {len(quests)} distinct solvable quests of length >= {min_length}, "
            f"{n_quests} needed: lower env.train_quests_per_scene / env.eval_quests_per_scene / "
            "env.min_quest_length or raise env.objects_per_scene")
    return quests


def plan_games(env_cfg: EnvConfig, *, seed: int, preferences_per_scene: int, games_dir: str,
               stream: str = EXPERIMENT_STREAM) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """All scenes and the manifest rows of their quests (pure: nothing is compiled).

    The last ``env.heldout_scenes`` scenes get eval quests only (``scene_split=heldout``);
    the others get ``eval_quests_per_scene`` eval quests (drawn first, so changing the
    train count leaves the eval set alone) and ``train_quests_per_scene`` train quests.

    Args:
        env_cfg: ``cfg.env``.
        seed: the master seed (``cfg.seed``).
        preferences_per_scene: ``cfg.user.preferences_per_scene``.
        games_dir: ``cfg.paths.games`` (the manifest's game files are relative to the root).
        stream: the label the scenes are drawn from (:func:`scene_stream`).

    Returns:
        ``(scenes, rows)``: ``{scene_id: spec}`` and MANIFEST_SCHEMA rows sorted by
        (scene_id, quest_id).
    """
    n = env_cfg.num_scenes
    heldout = env_cfg.heldout_scenes
    n_eval, n_train = env_cfg.eval_quests_per_scene, env_cfg.train_quests_per_scene
    scenes, rows = {}, []
    for i in range(n):
        spec = make_scene(env_cfg, i, seed, preferences_per_scene, stream)
        is_heldout = i >= n - heldout
        spec["scene_split"] = "heldout" if is_heldout else "seen"
        scenes[spec["scene_id"]] = spec
        quests = make_quests(spec, n_eval + (0 if is_heldout else n_train), env_cfg.min_quest_length)
        for k, q in enumerate(quests):
            qid = f"q{k:02d}"
            rows.append({
                "scene_id": spec["scene_id"],
                "quest_id": qid,
                "split": "eval" if k < n_eval else "train",
                "scene_split": spec["scene_split"],
                "objective": q["objective"],
                "quest_length": len(q["plan"]),
                "expert_plan": q["plan"],
                "game_file": f"{games_dir.rstrip('/')}/{spec['scene_id']}/{qid}.z8",
                "scene_seed": spec["seed"],
                "quest_seed": derive_seed(spec["seed"], "quest", k),
                "preferences": [p["id"] for p in spec["preferences"]],
                "metadata": canonical_json({
                    "quest_type": q["type"],
                    "goal": q["goal"],
                    "start_room": spec["start_room"],
                    "plan_length_without_preferences": q["plan_length_without_preferences"],
                }),
            })
    rows.sort(key=lambda r: (r["scene_id"], r["quest_id"]))
    return scenes, rows


# --------------------------------------------------------------------------- compiling


def parser_aliases(names) -> dict[str, str]:
    """One short letters-only parser word per entity.

    The Z-machine parser compares only the first 9 Z-characters of a word, and ``_`` and
    digits take two each, so ``Cabinet_0`` and ``Cabinet_1`` read as the same word and
    Inform asks "Which do you mean?". The games understand these aliases too, and
    :class:`pipeline.envs.household.env.HouseholdEnv` sends them in place of the names.
    """
    return {n: "ent" + chr(97 + i // 26) + chr(97 + i % 26) for i, n in enumerate(sorted(names))}


def build_game(spec: Mapping[str, Any], row: Mapping[str, Any], *, inform7: bool = True):
    """The ``textworld.Game`` of one quest, plus its Inform 7 source (with the aliases;
    ``None`` with ``inform7=False``: a game only the logic engine plays)."""
    from textworld.generator.game import Event, Quest  # deferred: heavy optional dependency (textworld)
    from textworld.generator.inform7 import generate_inform7_source

    M, ents = build_maker(spec)
    goal = json.loads(row["metadata"])["goal"]
    conditions = []  # a list, not a set: a set's order varies with PYTHONHASHSEED
    for g in goal:
        pred, args = parse_fact(g)
        conditions.append(M.new_fact(pred, *[ents[a] for a in args]))
    M.quests = [Quest(win_events=[Event(conditions=conditions)])]
    game = M.build()
    game.objective = row["objective"]  # the goal only, never TextWorld's step-by-step text
    named = {info.name: info.id for info in game.infos.values() if info.name and info.type not in ("r", "P", "I")}
    aliases = parser_aliases(named)
    game.metadata.update({"scene_id": row["scene_id"], "quest_id": row["quest_id"], "parser_aliases": aliases})
    if not inform7:
        return game, None
    source = generate_inform7_source(game)
    source += "\n" + "\n".join(f'Understand "{aliases[n]}" as {named[n]}.' for n in sorted(named)) + "\n"
    return game, source


def portable_game_data(data: dict[str, Any]) -> dict[str, Any]:
    """A serialized ``textworld.Game`` made a function of the game alone (edited in place).

    Sorts ``grammar.names_to_exclude`` (a set's order, which varies with PYTHONHASHSEED)
    and replaces the absolute path of TextWorld's built-in text grammars in
    ``KB.text_grammars_path`` with :data:`_PORTABLE_GRAMMARS_PATH`.

    Raises:
        ValueError: the grammars are not TextWorld's built-in ones (an absolute path
            outside the textworld package: the games would depend on that folder).
    """
    import textworld  # deferred: heavy optional dependency (textworld)

    data["grammar"]["names_to_exclude"] = sorted(data["grammar"]["names_to_exclude"], key=str)
    path = data["KB"]["text_grammars_path"]
    if os.path.isabs(path):
        builtin = Path(textworld.__file__).resolve().parent / "generator" / "data" / "text_grammars"
        if Path(path).resolve() != builtin:
            raise ValueError(f"TextWorld's text grammars are read from {path}, not its built-in folder {builtin}")
        data["KB"]["text_grammars_path"] = _PORTABLE_GRAMMARS_PATH
    return data


def compile_story(source: str, out: Path) -> None:
    """Compile an Inform 7 story to the Z-machine file ``out`` (``.z8``) with the compilers TextWorld
    ships, as :func:`textworld.generator.inform7.compile_inform7_game` runs them (the same ``ni``
    and ``inform6`` arguments), plus ``ni``'s ``-noindex``.

    Not TextWorld's function itself: it gives ``ni`` no way to skip the project's Index (the
    HTML pages of Inform's IDE, read by nobody here), which is two thirds of ``ni``'s time; the
    story file is the same bytes without it (``tests/test_games.py`` compiles one game both ways).
    Run inside :func:`_inform_home`.

    Raises:
        CouldNotCompileGameError: a compiler failed (its output is in the message).
    """
    from textworld.generator.inform7.world2inform7 import (  # deferred: heavy optional dependency (textworld)
        I7_DEFAULT_PATH,
        CouldNotCompileGameError,
    )

    inform = Path(os.environ.get("INFORM_HOME", I7_DEFAULT_PATH)) / "share" / "inform7"
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.stem}."))  # ni also writes a .materials beside it
    project = work / "story.inform"
    atomic_write_text(project / "Source" / "story.ni", source)
    atomic_write_text(project / "uuid.txt", "")  # Inform 7 requires one
    steps = (("ni", [str(inform / "Compilers" / "ni"), "--internal", str(inform / "Internal"), "--format=.z8",
                     "--project", str(project), "-noindex"]),
             ("i6", [str(inform / "Compilers" / "inform6"), "-E2wSv8F0", str(project / "Build" / "auto.inf"), str(out)]))
    try:
        for name, cmd in steps:
            try:
                subprocess.check_output(cmd, stderr=subprocess.STDOUT)
            except subprocess.CalledProcessError as exc:
                raise CouldNotCompileGameError(f"\n-= {name} =-\nFAIL: {exc.returncode}\n{exc.output.decode()}"
                                               "========\n*** Usually this means a compilation error.\n") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _inform_home(home: Path):
    """Run Inform 7 with ``HOME=home`` (an empty folder), so no user's ``~/Inform``
    (its Extensions override the built-in ones, its Options.txt is read) reaches a game,
    and its documentation files land in ``home`` instead of the user's home."""
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old


def compile_quest_game(job: Mapping[str, Any]) -> dict[str, Any]:
    """Compile one quest to ``job["out"]`` (``.z8`` + ``.json``) and verify its expert plan.

    Runs in a worker process. The files appear atomically (compiled in a temp folder,
    then renamed); the plan is replayed through :class:`pipeline.envs.household.env.HouseholdEnv` and
    must reach ``won`` with the preferences held.

    Args:
        job: ``{"spec": scene spec, "row": manifest row, "out": absolute .z8 path}``.

    Returns:
        ``{"scene_id", "quest_id", "compile_s", "error"}`` (``error`` None when verified).
    """
    spec, row, out = job["spec"], job["row"], Path(job["out"])
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.stem}."))
    result = {"scene_id": row["scene_id"], "quest_id": row["quest_id"], "compile_s": 0.0, "error": None}
    try:
        game, source = build_game(spec, row)
        (tmp / "game.json").write_text(json.dumps(portable_game_data(game.serialize())), encoding="utf-8")
        (tmp / "home").mkdir()
        with _inform_home(tmp / "home"):
            compile_story(source, tmp / "game.z8")
        data = bytearray((tmp / "game.z8").read_bytes())
        data[0x12:0x18] = _SERIAL  # header only (outside the checksum): same game, same bytes
        (tmp / "game.z8").write_bytes(bytes(data))
        os.replace(tmp / "game.json", out.with_suffix(".json"))
        os.replace(tmp / "game.z8", out)
    except Exception as exc:  # Inform's errors run to many lines; the first one names the problem
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        return dict(result, error=f"compile failed: {type(exc).__name__}: {lines[0] if lines else ''}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["compile_s"] = time.perf_counter() - t0
    result["error"] = verify_game(out, spec, row)
    return result


def verify_game(game_file: str | Path, spec: Mapping[str, Any], row: Mapping[str, Any]) -> str | None:
    """Replay the expert plan in the compiled game; ``None`` if it wins, else why not."""
    check_game_file(game_file)
    with HouseholdEnv(game_file, scene_id=row["scene_id"], quest_id=row["quest_id"], objective=row["objective"],
                      max_steps=len(row["expert_plan"]) + 1, preferences=spec["preferences"],
                      compute_expert_plan=False) as env:
        env.reset()
        planned = scene_world(spec).facts
        if env.world.facts != planned:
            diff = sorted(env.world.facts ^ planned)[:4]
            return f"initial facts differ from the scene spec: {diff}"
        info: dict[str, Any] = {"won": False, "preferences_ok": False}
        for i, cmd in enumerate(row["expert_plan"]):
            if cmd not in env.admissible:
                return f"step {i}: {cmd!r} not admissible ({env.admissible})"
            _, _, _, info = env.step(command_to_action(cmd, env.world.room_exits()))
            if info["command"] != cmd:
                return f"step {i}: action for {cmd!r} ran {info['command']!r}"
        if not info["won"]:
            return f"plan {row['expert_plan']} does not reach won"
        if not info["preferences_ok"]:
            return f"plan wins but breaks the preferences {info['preferences']}"
    return None
