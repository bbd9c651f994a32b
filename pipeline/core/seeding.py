"""Every seed the pipeline derives, in one place.

A seed is always a function of the config's seeds and the *identity* of what it is for
(a task, a turn, a scene, a label), never of processing order, so that batching,
sharding or resuming cannot change a random draw. Python's ``hash`` is salted per
process and is never used.

All derivations hash with sha256 (:func:`digest_int`), except the two that hash
their parts with crc32 inside a NumPy seed sequence (:func:`crc_rng`). The encodings of
the parts differ by family (JSON list, ``/``-joined text, ``|``-joined text); they are
kept exactly as they were when each artifact was first produced, because changing one
changes every downstream byte of the committed ``dvc.lock``.

    >>> task_seed(0, "scene_00", "q1") == task_seed(0, "scene_00", "q1")
    True
    >>> 0 <= derive_seed("scene", 3) < 2**31
    True
"""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any

import numpy as np


def digest_int(blob: bytes | str, nbytes: int = 8, byteorder: str = "big") -> int:
    """The first ``nbytes`` of ``sha256(blob)`` as an unsigned integer."""
    data = blob.encode("utf-8") if isinstance(blob, str) else blob
    return int.from_bytes(hashlib.sha256(data).digest()[:nbytes], byteorder)  # type: ignore[arg-type]


def task_seed(master_seed: int, *parts: Any) -> int:
    """A 63-bit seed of one task from the master seed and the task identity (not its order)."""
    return digest_int(json.dumps([master_seed, *parts], ensure_ascii=False)) >> 1


def turn_seed(*parts: Any) -> int:
    """A 63-bit sampling seed from the identity of a turn (never from batch order)."""
    return digest_int(json.dumps([str(p) for p in parts])) >> 1


def prompt_seed(base_seed: int, prompt: str) -> int:
    """A 63-bit sampling seed for a free-text prompt (same prompt, same text)."""
    return digest_int(f"{base_seed}\n{prompt}") >> 1


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts, ``/``-joined (games, scenes and quests)."""
    return digest_int("/".join(map(str, parts)), 4) & 0x7FFFFFFF


def label_int(label: str) -> int:
    """A stable 32-bit integer for a text label."""
    return digest_int(label, 4)


def labelled_rng(seed: int, *labels: str) -> np.random.Generator:
    """A Generator from the config seed and labels naming what it is used for (statistics)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *(label_int(s) for s in labels)]))


def task_rng(seed: int, task: Any, purpose: str = "placebo") -> np.random.Generator:
    """A Generator for one eval task (``scene_id``, ``quest_id``) and purpose."""
    key = f"{int(seed)}|{purpose}|{task.get('scene_id')}|{task.get('quest_id')}"
    return np.random.default_rng(digest_int(key, 8, "little"))


def crc_rng(seed: int, *parts: Any, ints: tuple[int, ...] = ()) -> np.random.Generator:
    """A Generator from a seed, integer parts and text parts (crc32 each).

    ``crc_rng(seed, "a", "b")`` seeds with ``[seed, crc32("a"), crc32("b")]``;
    ``ints`` go between the seed and the hashed parts.
    """
    key = [int(seed), *map(int, ints)] + [zlib.crc32(str(p).encode("utf-8")) for p in parts]
    return np.random.default_rng(key)
