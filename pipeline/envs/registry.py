"""The worlds ``env.name`` can pick: one :class:`~pipeline.envs.common.WorldDescriptor` each,
registered here, one line per world; everything else looks a world up by name::

    world = lookup("tiny")          # the household's descriptor
    world = world_of(cfg)           # cfg.env.name's; ValueError listing the known names if none

Adding a world: its descriptor in its own package (``pipeline/envs/<name>/descriptor.py``)
and one :func:`register` line below (docs/architecture.md: "Adding a world").
"""

from __future__ import annotations

from typing import Any

from pipeline.envs.common import WorldDescriptor
from pipeline.envs.household.descriptor import WORLD as HOUSEHOLD
from pipeline.envs.scienceworld.descriptor import WORLD as SCIENCEWORLD

# env.name -> its world, in registration order (the order an error lists them in).
WORLDS: dict[str, WorldDescriptor] = {}


def register(world: WorldDescriptor) -> WorldDescriptor:
    """Make ``world`` answer to each of its ``names``.

    Raises:
        ValueError: a name already belongs to another world.
    """
    taken = [n for n in world.names if n in WORLDS and WORLDS[n] is not world]
    if taken:
        raise ValueError(f"env.name={taken[0]!r} is already the world {WORLDS[taken[0]].family!r}")
    for name in world.names:
        WORLDS[name] = world
    return world


def lookup(name: str) -> WorldDescriptor:
    """The world ``env.name=name`` picks.

    Raises:
        ValueError: no world answers to ``name`` (the message lists the known names).
    """
    try:
        return WORLDS[str(name)]
    except KeyError:
        raise ValueError(f"env.name={str(name)!r}: unknown environment, expected one of "
                         f"{', '.join(WORLDS)}") from None


def world_of(cfg: Any) -> WorldDescriptor:
    """The world of a composed config (``cfg.env.name``); see :func:`lookup`."""
    return lookup(cfg.env.name)


register(HOUSEHOLD)
register(SCIENCEWORLD)
