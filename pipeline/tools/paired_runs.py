"""Two agents on one world, paired by task: which one a design world says is better.

A recipe is judged on held-out data, never on the eval's quests. The model pipeline's
probe plays generated houses; a *design world* is the default experiment at another seed
(``seed=1000``: other scenes, quests and houses, the eval's distribution), evaluated once with
each checkpoint (two scratch copies, or two ``dvc exp run`` experiments). This module pairs
the two runs' episodes by task (``episode_id``, as the report pairs conditions; each pair's seed
checked) and condition and counts, per condition and pooled, the tasks
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
from pipeline.core.stats import PairingError, mcnemar_exact, mcnemar_table, pair_rows

EPISODES = "episodes.parquet"
# The key the report pairs conditions by (an eval task's episode_id is the same under every checkpoint
# at one seed), the per-task seed that pair_rows checks, the task's names for messages, the outcome.
COLUMNS = ["episode_id", "seed", "scene_id", "quest_id", "is_correct"]


def episodes(eval_dir: Path, condition: str) -> list[dict[str, Any]]:
    """One condition's evaluated episodes (:data:`COLUMNS`)."""
    path = eval_dir / condition / EPISODES
    if not path.is_file():
        raise PairingError(f"{path}: no episodes (expected an evaluate stage's output folder <eval>/<condition>/)")
    return read_parquet(path, columns=COLUMNS).to_pylist()


def conditions_of(eval_dir: Path) -> list[str]:
    if not eval_dir.is_dir():
        raise PairingError(f"{eval_dir}: not a folder (expected an experiment's evaluation outputs, data/eval)")
    return sorted(p.name for p in eval_dir.iterdir() if (p / EPISODES).is_file())


def pair(candidate: Path, control: Path, conditions: Sequence[str] | None = None,
         leave_out: Sequence[str] = ()) -> dict[str, Any]:
    """Per condition and pooled: tasks, each run's success, b / c and the exact McNemar p."""
    if conditions is None:
        theirs = set(conditions_of(control))
        conditions = [c for c in conditions_of(candidate) if c in theirs]
        if not conditions:
            raise PairingError(f"{candidate} and {control} share no evaluated condition")
    rows, b_all, c_all, pooled = [], 0, 0, []
    for cond in conditions:
        a, k = episodes(candidate, cond), episodes(control, cond)
        pairs, only_a, only_k = pair_rows(a, k, where=(f"{candidate / cond}", f"{control / cond}"))
        if only_a or only_k:
            task = next(r for r in (*a, *k) if r["episode_id"] == (only_a or only_k)[0])
            raise PairingError(f"condition {cond}: task {task['scene_id']}/{task['quest_id']} is in one run only "
                               f"({len(a)} tasks in {candidate}, {len(k)} in {control}); the runs must share "
                               "one world and config")
        t = mcnemar_table([bool(x["is_correct"]) for x, _ in pairs], [bool(y["is_correct"]) for _, y in pairs])
        n = len(pairs)
        rows.append({"condition": cond, "tasks": n,
                     "candidate": round((t["both"] + t["b"]) / n, 6) if n else None,
                     "control": round((t["both"] + t["c"]) / n, 6) if n else None, "b": t["b"], "c": t["c"],
                     "p_exact": mcnemar_exact(t["b"], t["c"]), "pooled": cond not in leave_out})
        if cond not in leave_out:
            b_all, c_all = b_all + t["b"], c_all + t["c"]
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
    lines.append(f"| **pooled** ({', '.join(p['conditions'])}) | | | | **{p['b']} / {p['c']}** | "
                 f"**{p['p_exact']:.3g}** |")
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
