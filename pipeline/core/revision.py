"""Where a record was made: the git revision of a checkout (the model card's ``commit``, a golden
file's ``revision``, a results snapshot's)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def head_commit(root: Path, *, short: bool = True) -> str:
    """``HEAD``'s commit in ``root`` (abbreviated with ``short``), ``+dirty`` when tracked files
    differ from it; ``unknown`` outside git or without git."""
    try:
        head = subprocess.run(["git", "rev-parse", *(["--short"] if short else []), "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
