"""The record of how ``params.yaml`` differs from what ``conf/`` composes to.

``dvc repro`` reads ``params.yaml`` only and never recomposes it, so the pipeline checks
that it is not stale against ``conf/``. An experiment's ``params.yaml`` differs from
``conf/`` on purpose: ``dvc exp run -S seed=11`` composes it with overrides, and
``dvc exp apply`` brings that ``params.yaml`` into the workspace. The record
``params.overrides.yaml`` (committed with the experiment: an output of the
``check_params`` stage, ``persist: true``, ``cache: false``) lists those differences as
leaf assignments, so the check can tell "composed with these overrides" from "conf/ was
edited and params.yaml not recomposed"::

    # written by ...
    overrides:
    - {key: seed, value: 11}
    - {key: agent.reasoning_steps, removed: true}

Who writes it: ``python -m pipeline.core.config compose [overrides]`` (the overrides it
was given, as leaves) and ``python -m pipeline.core.config check --record`` inside a
``dvc exp run`` (the check_params stage: DVC composed params.yaml with the experiment's
``-S`` overrides just before).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.io import atomic_write_text

OVERRIDES_FILE = "params.overrides.yaml"
HEADER = (
    "# What the params file beside it was composed with on top of conf/ (pipeline/core/overrides.py): written by\n"
    "# `python -m pipeline.core.config compose [overrides]` and by the check_params stage of a\n"
    "# `dvc exp run`; read by the stale check of `dvc repro`. Empty: params.yaml is conf/ as is.\n"
)


class OverridesError(ValueError):
    """A record that cannot be read or applied (the message names the file)."""


def _leaves(d: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Dotted leaves of a plain mapping; a non-empty mapping is not a leaf, a list is."""
    if isinstance(d, dict) and d:
        out: dict[tuple[str, ...], Any] = {}
        for k, v in d.items():
            out.update(_leaves(v, (*prefix, str(k))))
        return out
    return {prefix: d}


def diff(composed: dict, params: dict) -> list[dict[str, Any]]:
    """The leaf assignments that turn ``composed`` into ``params`` (sorted by key)."""
    a, b = _leaves(composed), _leaves(params)
    out: list[dict[str, Any]] = []
    for path in sorted(set(a) | set(b)):
        if any("." in part for part in path):
            raise OverridesError(f"config key {path!r} contains a dot: it cannot be recorded in {OVERRIDES_FILE}")
        key = ".".join(path)
        if path not in b:
            out.append({"key": key, "removed": True})
        elif path not in a or a[path] != b[path]:
            out.append({"key": key, "value": b[path]})
    return out


def apply(composed: dict, overrides: list[dict[str, Any]]) -> dict:
    """``composed`` with the recorded assignments applied: removals first (a mapping left
    empty by them goes too: an empty mapping that stays is recorded as a value), then sets."""
    out = json.loads(json.dumps(composed))
    for o in overrides:
        if o.get("removed"):
            _remove(out, str(o["key"]).split("."))
    for o in overrides:
        if not o.get("removed"):
            parts = str(o["key"]).split(".")
            node = out
            for part in parts[:-1]:
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            node[parts[-1]] = o["value"]
    return out


def _remove(node: dict, parts: list[str]) -> None:
    head = parts[0]
    if len(parts) == 1:
        node.pop(head, None)
        return
    child = node.get(head)
    if isinstance(child, dict):
        _remove(child, parts[1:])
        if not child:
            node.pop(head)


def describe(overrides: list[dict[str, Any]], limit: int = 6) -> str:
    """``seed=11, agent.x (removed)``: the record in one line."""
    shown = [f"{o['key']} (removed)" if o.get("removed") else f"{o['key']}={json.dumps(o['value'])}"
             for o in overrides[:limit]]
    more = f", ... ({len(overrides)} in all)" if len(overrides) > limit else ""
    return ", ".join(shown) + more


def hydra_overrides(overrides: list[dict[str, Any]]) -> list[str]:
    """The record as Hydra overrides (``++key=<json>``, ``~key``): composing ``conf/`` with
    them gives the recorded params.yaml, formatted as DVC formats it."""
    return [f"~{o['key']}" if o.get("removed") else f"++{o['key']}={json.dumps(o['value'])}" for o in overrides]


def read(root: Path, name: str = OVERRIDES_FILE) -> list[dict[str, Any]]:
    """The recorded overrides of ``root / name`` (none when the file does not exist)."""
    path = root / name
    if not path.exists():
        return []
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise OverridesError(f"{path} is not valid YAML: {exc}") from exc
    items = doc.get("overrides") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not all(isinstance(o, dict) and isinstance(o.get("key"), str)
                                              and ("value" in o or o.get("removed") is True) for o in items):
        raise OverridesError(f"{path}: expected `overrides:` followed by a list of {{key, value}} or "
                             "{key, removed: true} entries; recompose with `python -m pipeline.core.config compose`")
    return items


def text(overrides: list[dict[str, Any]]) -> str:
    body = yaml.safe_dump({"overrides": overrides}, sort_keys=False, default_flow_style=None, allow_unicode=True)
    return HEADER + body


def write(root: Path, overrides: list[dict[str, Any]], name: str = OVERRIDES_FILE) -> Path:
    """Write the record to ``root / name`` atomically; unchanged bytes are not rewritten."""
    path = root / name
    new = text(overrides)
    if path.exists() and path.read_text(encoding="utf-8") == new:
        return path
    return atomic_write_text(path, new)
