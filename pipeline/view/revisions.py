"""The viewer for two experiments: each condition's episodes at revision A beside B's.

    python -m pipeline.view --diff HEAD~1 HEAD
    python -m pipeline.view --diff exp-a exp-b --condition C2

A and B are what :mod:`pipeline.tools.diff` accepts (git revisions, DVC experiment names,
``workspace``), opened by its :func:`~pipeline.tools.diff.revisions.open_rev`: artifacts are read at
each revision through DVC's filesystem (local cache), with that revision's ``paths`` and
``condition`` from its ``params.yaml`` (:func:`~pipeline.tools.diff.revisions.load_params_at`,
:func:`~pipeline.tools.diff.revisions.paths_at`). Runs are ``A:<C>`` and ``B:<C>`` for every
condition found at both (or ``--condition``); episodes are paired by ``episode_id`` (the
same task and seed), so the page shows an episode from A beside the same task in B, where
the two first took different actions, and each prompt against the other revision's.

When a revision's eval data is not in the local cache, :class:`~pipeline.tools.diff.revisions.DiffError`
names the output and the commands that bring it back (as ``pipeline.tools.diff`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from pipeline.tools.diff.revisions import (
    DiffError,
    MissingData,
    Rev,
    has_dvc_remote,
    load_params_at,
    open_rev,
    paths_at,
)
from pipeline.view.load import players, read_run
from pipeline.view.model import Run, View, build_view


def conditions_at(rev: Rev, params: dict, eval_dir: str) -> list[str]:
    """The conditions of ``params.yaml`` at ``rev`` (its order), then any other folder of
    ``<eval_dir>`` holding an ``episodes.parquet``."""
    declared = params.get("condition") or []
    names = [str(c) for c in (declared if isinstance(declared, (list, tuple)) else list(declared))]
    base = eval_dir.rstrip("/") + "/"
    for path in rev.find(eval_dir):
        rel = path[len(base):] if path.startswith(base) else ""
        parts = rel.split("/")
        if len(parts) == 2 and parts[1] == "episodes.parquet" and parts[0] not in names:
            names.append(parts[0])
    return names


def _budget(params: dict) -> int | None:
    value = (params.get("sampling") or {}).get("max_new_tokens")
    return int(value) if isinstance(value, int) else None


def _restore_hint(root: Path, rev: Rev) -> str:
    cmds = rev.restore_commands(has_dvc_remote(root))
    return "; ".join(f"`{cmd}` ({what})" for cmd, what in cmds)


def view_of_revisions(root: str | Path, rev_a: str, rev_b: str, *,
                      conditions: Sequence[str] | None = None) -> View:
    """The view of ``A:<C>`` beside ``B:<C>`` for the conditions found at both revisions.

    Raises:
        DiffError: An unknown revision, no condition with eval episodes at both, or eval
            data not in the local cache (the message says how to get it back).
    """
    root = Path(root).resolve()
    revs = {"A": open_rev(root, rev_a), "B": open_rev(root, rev_b)}
    params: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Run]] = {"A": {}, "B": {}}
    notes: list[str] = []
    wanted = list(conditions or [])
    try:
        for side, rev in revs.items():
            params[side] = load_params_at(rev)
            paths = paths_at(params[side])
            found = conditions_at(rev, params[side], paths["eval"])
            for c in (wanted or found):
                run = read_run(rev.read, f"{side}:{c}", c, eval_dir=paths["eval"], prompts_dir=paths["prompts"],
                               source=f"{side} = {rev.label}")
                if run is None:
                    notes.append(f"{side}:{c}: no {paths['eval']}/{c}/episodes.parquet at {rev.label}")
                    continue
                run.max_new_tokens = _budget(params[side])
                runs[side][c] = run
    except MissingData as exc:
        raise DiffError(f"{exc}: to get it back, {_restore_hint(root, exc.rev)}") from exc
    both = [c for c in runs["A"] if c in runs["B"]]
    for side, other in (("A", "B"), ("B", "A")):
        notes += [f"{side}:{c} has no counterpart at {other} (left out)" for c in runs[side] if c not in both]
    if not both:
        raise DiffError(f"no condition has eval episodes at both {revs['A'].label} and {revs['B'].label}"
                        + (f" ({'; '.join(notes)})" if notes else ""))
    ordered = [r for c in both for r in (runs["A"][c], runs["B"][c])]
    a, b = revs["A"], revs["B"]
    return build_view(ordered, pairs=[(f"B:{c}", f"A:{c}") for c in both], notes=notes,
                      title=f"Episodes: {a.name} vs {b.name}",
                      source=f"A = {a.label} ({a.kind}), B = {b.label} ({b.kind}); " + players(ordered))

