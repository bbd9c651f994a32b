"""Artifact diff between two experiments: params, metrics, and the rows of every artifact.

    python -m pipeline.tools.diff HEAD~1 HEAD                 # two git revisions
    python -m pipeline.tools.diff main my-exp                 # a branch and a DVC experiment name
    python -m pipeline.tools.diff HEAD workspace              # the last commit and the working tree
    python -m pipeline.tools.diff exp-a exp-b --artifact turns --limit 3
    python -m pipeline.tools.diff exp-a exp-b --json > diff.json

A and B are git revisions (commit, branch, tag, ``HEAD~2``), DVC experiment names (as
``dvc exp show`` lists them) or ``workspace``. Artifacts are read at each revision through
``dvc.api.DVCFileSystem`` (DVC-tracked outputs come from the local cache, so experiments
run here with ``dvc exp run`` / ``dvc queue start`` are readable; pull first otherwise).

What is shown:

- params: every ``params.yaml`` key whose value differs;
- metrics: every number under ``paths.metrics`` (``metrics/**/*.json``) that differs, with
  its delta;
- artifacts (``--artifact`` picks some): ``episodes`` (collect + evaluate episodes),
  ``turns``, ``prompts``, ``store`` (Parquet, rows matched by key: ``entry_id``;
  ``episode_id`` + ``turn_index``; task + ``condition``) with rows added / removed /
  changed, per-column change counts and the first ``--limit`` changed rows side by side
  (prompt, generated text, action, feedback first); ``grounding`` (per-episode JSON/TXT
  files and the merged Markdown/JSON) with files added / removed / changed, changed JSON
  keys and the first differing lines of text files.

Missing data: when a DVC output's data is not in the local cache at a revision (a
``dvc.lock`` built on another machine, an experiment whose data ``dvc gc`` removed) or not
in the working tree (``workspace``), its files are listed as "not compared" with the
reason, and a "missing data" block names the revision, the outputs and the commands that
bring them back (``dvc pull``, ``dvc repro``, ``dvc exp apply NAME``, ``dvc checkout``).
Params and metrics (in git) are still diffed. The exit status is 1 only when missing data
left nothing at all to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.core.config import project_root
from pipeline.tools.diff.core import ARTIFACTS, diff_revisions, nothing_compared
from pipeline.tools.diff.format import format_diff, format_missing
from pipeline.tools.diff.revisions import DiffError


def main(argv: list[str] | None = None) -> int:
    """The command: 0 when the diff is printed, 1 on an error or when nothing could be compared (2: a
    bad flag, from argparse)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.diff", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="git revision, DVC experiment name or 'workspace'")
    parser.add_argument("b", help="git revision, DVC experiment name or 'workspace'")
    parser.add_argument("--artifact", action="append", choices=list(ARTIFACTS),
                        help="artifact to diff (repeatable; default: all)")
    parser.add_argument("--limit", type=int, default=5, help="changed rows/keys shown per file (default 5)")
    parser.add_argument("--width", type=int, default=100, help="characters shown per value (default 100)")
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")
    parser.add_argument("--repo", default=".", help="repository root (default: the current folder)")
    args = parser.parse_args(argv)
    if args.limit < 0:
        parser.error("--limit must be >= 0")
    try:
        root = project_root(Path(args.repo))
        d = diff_revisions(root, args.a, args.b, artifacts=args.artifact, limit=args.limit, width=args.width)
    except DiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(d, ensure_ascii=False, indent=2, sort_keys=True, default=str) + "\n")
        if d["missing_data"]:  # stdout is JSON (often redirected): say it where it is seen
            sys.stderr.write("\n".join(format_missing(d)) + "\n")
    else:
        sys.stdout.write(format_diff(d, limit=args.limit))
    if nothing_compared(d):
        print("error: nothing could be compared: the outputs' data is missing (see 'missing data' above) "
              "and there are no params or metrics", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
