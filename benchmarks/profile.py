"""Profile the default pipeline stage by stage with pyinstrument (issue 9, part 2).

    python -m benchmarks.profile                    # every stage of the default pipeline
    python -m benchmarks.profile --stages collect evaluate
    python -m benchmarks.profile --out /tmp/prof    # where the reports go

A scratch copy of the project is made under ``$TMPDIR/pipeline_bench/profile`` (as the
benchmarks do, never the working tree); the stages then run in DAG order, each as
``python -m pyinstrument -m pipeline.stages.<stage>`` in its own process, exactly as
``dvc repro`` would run them (matrix stages for the first condition only, plus what
``compare`` needs). For every stage the folder gets ``<stage>.txt`` (pyinstrument's call
tree, time per frame), ``<stage>.html`` (the interactive view) and ``<stage>.pyisession``
(the recording, ``pyinstrument --load``), and the command prints
each stage's wall time and its heaviest frames by self time (the hot spots).

pyinstrument samples every 1 ms, so the figures are statistical: read proportions, not
absolute times, on a loaded machine. Nothing here is a test assertion.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/profile.py`
    sys.path.insert(0, str(ROOT))

from benchmarks.common import make_scratch_repo, venv_env  # noqa: E402

# (stage, args) in DAG order; matrix stages are run per condition as needed.
# The model is the committed checkpoint (models/dvc.yaml builds it): no training stage here.
DAG = ("games", "collect", "ground", "merge", "store", "render", "evaluate", "evaluate_reader", "curve", "compare")
PER_CONDITION = ("evaluate", "evaluate_reader")


def hot_spots(root: Any, top: int = 8) -> list[dict[str, Any]]:
    """The frames with the most *self* time (time in the function's own code, children
    excluded), summed over every place they occur in a pyinstrument call tree."""
    totals: dict[tuple[str, str, int], float] = {}
    stack = [root] if root is not None else []
    while stack:
        frame = stack.pop()
        children = list(frame.children)
        # pyinstrument puts a function's own time in a synthetic "[self]" (or "[await]")
        # child: it counts for the real frame above it.
        owner = frame
        while owner.is_synthetic and owner.parent is not None:
            owner = owner.parent
        self_time = float(frame.time) - sum(float(c.time) for c in children)
        key = (owner.function or "?", owner.file_path_short or owner.file_path or "?", int(owner.line_no or 0))
        totals[key] = totals.get(key, 0.0) + max(0.0, self_time)
        stack += children
    total = float(root.time) if root is not None else 0.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return [{"function": f, "file": p, "line": ln, "self_s": round(t, 3),
             "share": round(t / total, 3) if total else None} for (f, p, ln), t in ranked]


def profile_stage(repo: Path, out: Path, stage: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run one stage under pyinstrument; write its text, HTML and JSON reports."""
    name = stage + ("_" + args[-1] if args else "")
    session_path = out / f"{name}.pyisession"
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "pyinstrument", "--renderer", "pyisession", "--outfile", str(session_path),
           "-m", f"pipeline.stages.{stage}", *args]
    res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise RuntimeError(f"stage {name} failed under the profiler (exit {res.returncode}):\n{res.stderr[-3000:]}")
    # One recorded session, rendered twice (no second run).
    from pyinstrument.renderers import ConsoleRenderer, HTMLRenderer
    from pyinstrument.session import Session

    session = Session.load(str(session_path))
    (out / f"{name}.txt").write_text(ConsoleRenderer(unicode=True, color=False).render(session))
    (out / f"{name}.html").write_text(HTMLRenderer().render(session))
    return {"stage": name, "wall_s": round(wall, 2), "hot_spots": hot_spots(session.root_frame())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", nargs="*", default=None, help=f"stages to profile (default: all of {DAG})")
    ap.add_argument("--out", type=Path, default=None, help="report folder (default: the scratch copy's profiles/)")
    ap.add_argument("--top", type=int, default=8, help="hot spots printed per stage")
    args = ap.parse_args(argv)
    wanted = set(args.stages or DAG)
    unknown = wanted - set(DAG)
    if unknown:
        ap.error(f"unknown stage(s) {sorted(unknown)}; expected some of {list(DAG)}")

    repo = Path(tempfile.gettempdir()) / "pipeline_bench" / "profile"
    make_scratch_repo(repo)
    out = (args.out or repo / "profiles").resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = venv_env({"PYTHONHASHSEED": "0"})
    import yaml

    conditions = list(yaml.safe_load((repo / "params.yaml").read_text())["condition"])
    results = []
    for stage in DAG:
        runs = [[]] if stage not in PER_CONDITION else [["--condition", c] for c in conditions]
        for i, extra in enumerate(runs):
            profiled = stage in wanted and i == 0  # matrix stages: the first condition is profiled
            if profiled:
                r = profile_stage(repo, out, stage, extra, env)
                results.append(r)
                print(f"\n{r['stage']}: {r['wall_s']:.1f} s (under the profiler)")
                for h in r["hot_spots"][: args.top]:
                    share = f"{100 * h['share']:5.1f}%" if h["share"] is not None else "   ? "
                    print(f"  {share}  {h['self_s']:8.2f} s  {h['function']}  ({h['file']}:{h['line']})")
            else:  # still run it: later stages need its outputs
                res = subprocess.run([sys.executable, "-m", f"pipeline.stages.{stage}", *extra], cwd=repo, env=env,
                                     capture_output=True, text=True)
                if res.returncode != 0:
                    raise SystemExit(f"stage {stage} {' '.join(extra)} failed:\n{res.stderr[-3000:]}")
    (out / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nreports: {out}/<stage>.txt|.html|.pyisession, summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
