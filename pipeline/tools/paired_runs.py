"""Two agents on one world, paired by task: which one a design world says is better.

A recipe is judged on held-out data, never on the eval's quests. The model pipeline's
probe plays generated houses; a *design world* is the default experiment at another seed
(``seed=1000``: other scenes, quests and houses, the eval's distribution), evaluated once with
each checkpoint (two scratch copies, or two ``dvc exp run`` experiments). This module pairs
the two runs' episodes by task and condition and counts, per condition and pooled, the tasks
only the candidate won (b) and only the control won (c), with the exact McNemar p::

    python -m pipeline.tools.paired_runs CANDIDATE/data/eval CONTROL/data/eval \\
        --leave-out C2_silent --json design.json

``--leave-out`` drops a condition from the pooled count (C2_silent's prompts are C1's: pooling
both would count C1's tasks twice); its row is still shown. Success is ``is_correct``, as in
the report. The two runs must hold the same tasks per condition: a task in one and not the
other is an error that names it (the runs were made with different worlds or configs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from pipeline.core.io import atomic_write_json, read_parquet
from pipeline.core.stats import mcnemar_exact

EPISODES = "episodes.parquet"
TASK = ("scene_id", "quest_id")


class PairingError(ValueError):
    """The two runs cannot be paired (the message names the folder, condition or task)."""


def outcomes(eval_dir: Path, condition: str) -> dict[tuple[str, str], bool]:
    """``{(scene_id, quest_id): is_correct}`` of one condition's evaluated episodes."""
    path = eval_dir / condition / EPISODES
    if not path.is_file():
        raise PairingError(f"{path}: no episodes (expected an evaluate stage's output folder <eval>/<condition>/)")
    rows = read_parquet(path, columns=[*TASK, "is_correct"]).to_pylist()
    out: dict[tuple[str, str], bool] = {}
    for r in rows:
        key = (str(r["scene_id"]), str(r["quest_id"]))
        if key in out:
            raise PairingError(f"{path}: task {key[0]}/{key[1]} appears twice; expected one episode per task")
        out[key] = bool(r["is_correct"])
    return out


def conditions_of(eval_dir: Path) -> list[str]:
    if not eval_dir.is_dir():
        raise PairingError(f"{eval_dir}: not a folder (expected an experiment's evaluation outputs, data/eval)")
    return sorted(p.name for p in eval_dir.iterdir() if (p / EPISODES).is_file())


def pair(candidate: Path, control: Path, conditions: Sequence[str] | None = None,
         leave_out: Sequence[str] = ()) -> dict[str, Any]:
    """Per condition and pooled: tasks, each run's success, b / c and the exact McNemar p."""
    if conditions is None:
        conditions = [c for c in conditions_of(candidate) if c in set(conditions_of(control))]
        if not conditions:
            raise PairingError(f"{candidate} and {control} share no evaluated condition")
    rows, b_all, c_all, pooled = [], 0, 0, []
    for cond in conditions:
        a, k = outcomes(candidate, cond), outcomes(control, cond)
        if a.keys() != k.keys():
            only = sorted(a.keys() ^ k.keys())[0]
            raise PairingError(f"condition {cond}: task {only[0]}/{only[1]} is in one run only "
                               f"({len(a)} tasks in {candidate}, {len(k)} in {control}); the runs must share "
                               "one world and config")
        b = sum(a[t] and not k[t] for t in a)
        c = sum(k[t] and not a[t] for t in a)
        n = len(a)
        rows.append({"condition": cond, "tasks": n, "candidate": round(sum(a.values()) / n, 6) if n else None,
                     "control": round(sum(k.values()) / n, 6) if n else None, "b": b, "c": c,
                     "p_exact": mcnemar_exact(b, c), "pooled": cond not in leave_out})
        if cond not in leave_out:
            b_all, c_all = b_all + b, c_all + c
            pooled.append(cond)
    return {"conditions": rows, "pooled": {"conditions": pooled, "b": b_all, "c": c_all,
                                           "p_exact": mcnemar_exact(b_all, c_all)},
            "candidate": str(candidate), "control": str(control), "success": "is_correct"}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| condition | tasks | candidate | control | b / c | exact p |", "|---|---|---|---|---|---|"]
    for r in result["conditions"]:
        note = "" if r["pooled"] else " (not pooled)"
        lines.append(f"| {r['condition']}{note} | {r['tasks']} | {r['candidate']:.2f} | {r['control']:.2f} | "
                     f"{r['b']} / {r['c']} | {r['p_exact']:.3g} |")
    p = result["pooled"]
    lines.append(f"| **pooled** ({', '.join(p['conditions'])}) | | | | **{p['b']} / {p['c']}** | **{p['p_exact']:.3g}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.tools.paired_runs",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("candidate", type=Path, help="the candidate's evaluation outputs (data/eval of its run)")
    ap.add_argument("control", type=Path, help="the control's, on the same world and config")
    ap.add_argument("--conditions", help="comma-separated (default: every condition both runs evaluated)")
    ap.add_argument("--leave-out", default="", help="comma-separated conditions shown but not pooled")
    ap.add_argument("--json", type=Path, help="also write the result here (atomically)")
    args = ap.parse_args(argv)
    split = lambda s: [x for x in (s or "").split(",") if x]  # noqa: E731
    try:
        result = pair(args.candidate, args.control, split(args.conditions) or None, split(args.leave_out))
    except PairingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(result))
    if args.json:
        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
