"""Write the transcript viewer: eval episodes of the conditions (or of two experiments) side by side.

    python -m pipeline.view                          # reports/episodes.html (what the compare stage writes)
    python -m pipeline.view --condition C1 --condition C2 --out /tmp/c1_c2.html
    python -m pipeline.view --diff HEAD~1 HEAD       # outputs/episodes_diff.html: A:<C> beside B:<C>
    python -m pipeline.view --diff exp-a exp-b --condition C2

Reads ``<paths.eval>/<C>/{episodes,turns}.parquet`` and ``<paths.prompts>/<C>.parquet`` of
every condition in ``params.yaml`` (``--condition`` picks some) and writes one
self-contained HTML file: no network, open it from a file URL (``xdg-open``, or drag it
into a browser). With ``--diff A B`` the same files are read at two revisions or DVC
experiments through :mod:`pipeline.tools.diff` (DVC's local cache), and every condition
found at both is shown as ``A:<C>`` beside ``B:<C>``. What the page shows: ``docs/viewer.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipeline.core.config import ConfigError, load_params, project_root
from pipeline.core.io import ArtifactError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.view", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--diff", nargs=2, metavar=("A", "B"),
                        help="two git revisions / DVC experiment names / 'workspace' to put side by side")
    parser.add_argument("--condition", action="append", help="condition to show (repeatable; default: all)")
    parser.add_argument("--out", type=Path, help="the HTML file (default: <paths.reports>/episodes.html; "
                                                 "with --diff: outputs/episodes_diff.html)")
    parser.add_argument("--repo", default=".", help="project root (default: the current folder)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        root = project_root(Path(args.repo))
        if args.diff:
            from pipeline.tools.diff.revisions import DiffError
            from pipeline.view.revisions import view_of_revisions

            try:
                view = view_of_revisions(root, args.diff[0], args.diff[1], conditions=args.condition)
            except DiffError as exc:
                raise ArtifactError(str(exc)) from exc
            out = args.out or root / "outputs" / "episodes_diff.html"
        else:
            from pipeline.view.load import FILE_NAME, view_of_workspace

            cfg = load_params(root, check_stale=False)  # read-only: a stale params.yaml still names the folders
            view = view_of_workspace(root, cfg, conditions=args.condition)
            out = args.out or root / cfg.paths.reports / FILE_NAME
        from pipeline.view.load import describe, write_view

        path = write_view(view, out)
    except (ConfigError, ArtifactError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(describe(path, view, time.perf_counter() - t0))
    for note in view.index.get("notes", []):
        print(f"note: {note}")
    print(f"open it: file://{path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
