"""Commands people run by hand (``python -m pipeline.tools.<name>``), and the check each one that
takes a git revision runs on it first (:func:`git_revision`)."""

from __future__ import annotations


def git_revision(rev: str, option: str) -> str:
    """``rev``, refused when git would take it for an option (``--output=<file>``: ``git show``
    writes that file) or it is empty; ``option`` names where it came from in the message.

    Raises:
        ValueError: ``rev`` starts with ``-`` or is empty.
    """
    if not rev or str(rev).startswith("-"):
        raise ValueError(f"{option} {rev!r}: expected a git revision (a commit, branch, tag or HEAD~1), not "
                         f"{'an empty string' if not rev else 'a word starting with -, which git reads as an option'}")
    return str(rev)
