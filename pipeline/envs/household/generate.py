"""Generated training houses: thousands of distinct layouts and quests, never an eval one.

The games stage builds a few fixed scenes (``env.num_scenes``), and their train quests are
all a policy could learn from: with 12 distinct tasks a small model learns them by heart
instead of reading its prompt. This module draws *new* houses per index, each its own
layout (2-5 rooms on a grid, 2-6 containers, locks and keys, supporters, 2-6 objects,
a preference), with entity indices drawn per house (``Cup_7``, ``Cabinet_4``), so the
names, places and plans of one house say nothing about another's::

    houses = GeneratedHouses(sizes, seed=cfg.seed, exclude=eval_layouts(scenes),
                             exclude_objectives=eval_objectives)
    house = houses.house(17)          # GeneratedHouse(spec, quests) or None (skipped)
    env = LogicHouseholdEnv(house.game(0), scene_id=..., ...)   # played without compiling

Disjointness from the evaluation is by construction and checked: a house is drawn from its
own seed stream (``(seed, "generated", index)``, never the games stage's ``(seed, "scene",
index)``), a house whose layout equals a scene that has eval quests is skipped
(:func:`layout_key`), and so is a quest whose objective reads like an eval quest's.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from pipeline.core.conf_schema import EnvConfig
from pipeline.core.seeding import derive_seed
from pipeline.envs.household.games import make_quests, make_scene
from pipeline.envs.household.text import preference_text

_NAME = re.compile(r"\b([A-Z][A-Za-z]*)_(\d+)\b")
# What a layout is: everything of a scene spec but its id, seed and split.
_LAYOUT_KEYS = ("rooms", "start_room", "connections", "containers", "supporters", "objects", "keys", "preferences")


@dataclass(frozen=True)
class HouseSizes:
    """Ranges (inclusive) the generated houses are drawn from, and the largest entity index."""

    rooms: tuple[int, int] = (2, 5)
    containers: tuple[int, int] = (2, 6)
    locked: tuple[int, int] = (0, 2)
    supporters: tuple[int, int] = (0, 2)
    objects: tuple[int, int] = (2, 6)
    max_index: int = 9


@dataclass(frozen=True)
class GeneratedHouse:
    """One generated house: its scene spec (the games stage's format) and its quests."""

    spec: dict
    quests: tuple[dict, ...]

    @property
    def scene_id(self) -> str:
        return str(self.spec["scene_id"])

    def row(self, k: int) -> dict[str, Any]:
        """Quest ``k`` as a manifest-like row (what the expert, the memory and the prompts read)."""
        q = self.quests[k]
        return {"scene_id": self.scene_id, "quest_id": f"q{k:02d}", "split": "train", "scene_split": "generated",
                "objective": q["objective"], "quest_length": len(q["plan"]), "expert_plan": list(q["plan"]),
                "game_file": "", "scene_seed": self.spec["seed"], "quest_seed": derive_seed(self.spec["seed"], "quest", k),
                "preferences": [p["id"] for p in self.spec["preferences"]],
                "metadata": json.dumps({"quest_type": q["type"], "goal": q["goal"],
                                        "start_room": self.spec["start_room"]}, sort_keys=True)}

    def game(self, k: int):
        """The ``textworld.Game`` of quest ``k`` (in memory: :class:`LogicHouseholdEnv` plays it)."""
        from pipeline.envs.household.games import build_game

        game, _ = build_game(self.spec, self.row(k), inform7=False)
        return game


def layout_key(spec: Mapping[str, Any]) -> str:
    """A scene's layout as canonical JSON: equal keys, the same house (ids and seeds aside)."""
    return json.dumps({k: spec.get(k) for k in _LAYOUT_KEYS}, sort_keys=True)


def draw_sizes(rng: random.Random, sizes: HouseSizes, base: Any) -> EnvConfig:
    """An ``EnvConfig`` with this house's counts drawn from ``sizes`` and ``base``'s
    (``cfg.env``'s) quest rule."""
    rooms = rng.randint(*sizes.rooms)
    containers = rng.randint(*sizes.containers)
    return EnvConfig(rooms_per_scene=rooms, containers_per_scene=containers,
                     locked_containers=min(rng.randint(*sizes.locked), containers),
                     supporters_per_scene=rng.randint(*sizes.supporters),
                     objects_per_scene=rng.randint(*sizes.objects), min_quest_length=int(base.min_quest_length))


def reindex(spec: dict, rng: random.Random, max_index: int) -> dict:
    """The spec with every ``Kind_<i>`` renamed ``Kind_<j>``, ``j`` drawn per house.

    Indices are drawn without replacement per category (containers and their keys share
    one draw: ``Key_<j>`` opens ``<Kind>_<j>``; objects; supporters), so names stay
    distinct; preference texts are rewritten from their kind and new target.
    """
    def draw(names: Sequence[str]) -> dict[str, str]:
        idx = rng.sample(range(max_index + 1), len(names))
        return {n: f"{n.rsplit('_', 1)[0]}_{j}" for n, j in zip(names, idx)}

    mapping: dict[str, str] = {}
    containers = [c["name"] for c in spec["containers"]]
    cmap = draw(containers)
    mapping.update(cmap)
    for k in spec["keys"]:
        mapping[k["name"]] = "Key_" + cmap[k["opens"]].rsplit("_", 1)[1]
    mapping.update(draw([o["name"] for o in spec["objects"]]))
    mapping.update(draw([s["name"] for s in spec["supporters"]]))
    text = _NAME.sub(lambda m: mapping.get(m.group(0), m.group(0)), json.dumps(spec))
    out = json.loads(text)
    for p in out["preferences"]:
        p["text"] = preference_text(p["kind"], p["target"])
    return out


class GeneratedHouses:
    """The generated training houses of a seed: house ``i`` is a pure function of ``(seed, i)``.

    Args:
        sizes: the ranges the houses are drawn from.
        seed: the master seed (``cfg.seed``).
        base: the env config (its quest rules: ``min_quest_length``).
        quests_per_house: quests drawn per house.
        preferences_per_scene: ``cfg.user.preferences_per_scene``.
        exclude: layouts (:func:`layout_key`) never generated: the scenes with eval quests.
        exclude_objectives: objectives never used (the eval quests').
    """

    def __init__(self, sizes: HouseSizes, *, seed: int, base: EnvConfig, quests_per_house: int = 1,
                 preferences_per_scene: int = 1, exclude: Iterable[str] = (),
                 exclude_objectives: Iterable[str] = ()):
        self.sizes = sizes
        self.seed = int(seed)
        self.base = base
        self.quests_per_house = int(quests_per_house)
        self.preferences_per_scene = int(preferences_per_scene)
        self.exclude = set(exclude)
        self.exclude_objectives = set(exclude_objectives)

    def house(self, index: int) -> GeneratedHouse | None:
        """House ``index``, or None when it is skipped (an excluded layout, or no quest left)."""
        rng = random.Random(derive_seed(self.seed, "generated", index))
        env_cfg = draw_sizes(rng, self.sizes, self.base)
        spec = make_scene(env_cfg, index, derive_seed(self.seed, "generated-layout", index),
                          self.preferences_per_scene)
        spec = reindex(spec, rng, self.sizes.max_index)
        spec["scene_id"] = f"gen_{index:05d}"
        spec["scene_split"] = "generated"
        if layout_key(spec) in self.exclude:
            return None
        # a few spare quests (a small house may have fewer: those there are), for the objectives excluded
        quests = make_quests(spec, self.quests_per_house + 4, env_cfg.min_quest_length, allow_fewer=True)
        quests = [q for q in quests if q["objective"] not in self.exclude_objectives][:self.quests_per_house]
        if not quests:
            return None
        return GeneratedHouse(spec, tuple(quests))

    def houses(self, n: int, start: int = 0) -> list[GeneratedHouse]:
        """The first ``n`` houses that are not skipped, from index ``start`` on."""
        out, i = [], start
        while len(out) < n:
            h = self.house(i)
            if h is not None:
                out.append(h)
            i += 1
            if i - start > 4 * n + 100:
                raise ValueError(f"only {len(out)} of {n} generated houses could be drawn (too many skipped)")
        return out

