"""The worlds ``env.world`` can pick: one package each under ``pipeline/envs/``, named on one
line here (:data:`PACKAGES`); everything else looks a world up through this module::

    world = world_of(cfg)           # cfg.env.world's package, checked against cfg.env.name
    world = lookup("tiny")          # by env.name: the household's descriptor

A world's package is imported only when a run picks it (``pipeline/envs/<world>/descriptor.py``,
whose ``WORLD`` is its :class:`~pipeline.envs.common.WorldDescriptor`). So a stage's code is the
package it plays and no other: ``pipeline.tools.deps`` lists the templated dependency
``pipeline/envs/${env.world}``, and an edit of ScienceWorld reruns no household stage (nor the
household's model pipeline). ``env.world`` names the package; ``env.name`` the world's size
(``tiny`` is the household made small), one of the descriptor's ``names``.

Adding a world: its package with its descriptor, one name in :data:`PACKAGES`, and ``world:``
in its ``conf/env/<option>.yaml`` (docs/architecture.md: "Adding a world").
"""

from __future__ import annotations

import importlib
from typing import Any

from pipeline.envs.common import WorldDescriptor

# env.world -> the package pipeline/envs/<world>/ (its descriptor module's WORLD), in the order an
# error lists them. A world is one package and this one line.
PACKAGES: tuple[str, ...] = ("household", "scienceworld")

# env.name -> its world, for the worlds loaded so far (a package's names arrive with its descriptor).
WORLDS: dict[str, WorldDescriptor] = {}


def register(world: WorldDescriptor) -> WorldDescriptor:
    """Make ``world`` answer to each of its ``names`` (a package's descriptor is registered when
    it is first loaded; a world defined elsewhere, as a test's, is registered by this call).

    Raises:
        ValueError: a name already belongs to another world.
    """
    taken = [n for n in world.names if n in WORLDS and WORLDS[n] is not world]
    if taken:
        raise ValueError(f"env.name={taken[0]!r} is already the world {WORLDS[taken[0]].family!r}")
    for name in world.names:
        WORLDS[name] = world
    return world


def load(world: str) -> WorldDescriptor:
    """The world ``env.world=world`` picks: a registered world of that family, else its package's
    descriptor, imported and registered now.

    Raises:
        ValueError: no registered world and no package of :data:`PACKAGES` is ``world``.
    """
    world = str(world)
    for known in WORLDS.values():
        if known.family == world:
            return known
    if world not in PACKAGES:
        families = dict.fromkeys([*PACKAGES, *(w.family for w in WORLDS.values())])
        raise ValueError(f"env.world={world!r}: unknown world, expected one of {', '.join(families)}")
    descriptor = importlib.import_module(f"pipeline.envs.{world}.descriptor").WORLD
    if descriptor.family != world:
        raise ValueError(f"pipeline/envs/{world}/descriptor.py: its WORLD's family is {descriptor.family!r}, "
                         f"expected {world!r} (the package's name)")
    return register(descriptor)


def lookup(name: str) -> WorldDescriptor:
    """The world whose ``names`` hold ``env.name=name`` (every package loaded when it is not yet known).

    Raises:
        ValueError: no world answers to ``name`` (the message lists the known names).
    """
    name = str(name)
    if name not in WORLDS:
        for world in PACKAGES:
            load(world)
    try:
        return WORLDS[name]
    except KeyError:
        known = dict.fromkeys([*(n for w in PACKAGES for n in load(w).names), *WORLDS])  # the packages' first
        raise ValueError(f"env.name={name!r}: unknown environment, expected one of {', '.join(known)}") from None


def world_of(cfg: Any) -> WorldDescriptor:
    """The world of a composed config: ``cfg.env.world``'s, which must answer to ``cfg.env.name``
    (a config without ``env.world``: ``env.name``'s).

    Raises:
        ValueError: an unknown ``env.name`` (listing the known names), an unknown ``env.world``, or a
            name of another world than ``env.world`` names (the message says which to set).
    """
    name, world = str(cfg.env.name), getattr(cfg.env, "world", None)  # a DictConfig's missing key is an AttributeError
    if world is None:  # a partial config (no schema): the name alone says
        return lookup(name)
    picked = load(str(world))
    if name in picked.names:
        return picked
    other = lookup(name)  # raises for a name no world answers to
    raise ValueError(f"env.name={name!r} is the world {other.family!r}, but env.world={world!r}: set "
                     f"env.world={other.family} (each conf/env/<option>.yaml sets both)")
