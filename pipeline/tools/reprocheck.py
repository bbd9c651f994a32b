"""Did this machine reproduce the committed artifacts? Compares data-output hashes.

    python -m pipeline.tools.reprocheck                 # after `make repro`: workspace vs dvc.lock vs committed
    python -m pipeline.tools.reprocheck --rev HEAD~1    # ... vs another revision's
    python -m pipeline.tools.reprocheck --scratch experiment=tiny --golden .ci/repro_tiny.json
    python -m pipeline.tools.reprocheck --scratch experiment=tiny --golden .ci/repro_tiny.json --update

The first form makes two comparisons and says which: the outputs in the workspace
(hashed as ``dvc status`` hashes them) against the workspace ``dvc.lock``, so a file changed
after the lock was written (a resumed or hand-run stage, an edit) is caught, and that
``dvc.lock`` against the one committed at ``--rev``. It lists every cached output
(``data/...``: DVC-cached, not the ``cache: false`` metrics, plots and stamps, which carry
wall-clock times) whose hash differs in either. ``--scratch`` copies the project's code and config into a temporary git + DVC
repository, composes ``params.yaml`` with the given overrides, runs ``dvc repro`` there
and compares the result with a committed golden file (``--update`` rewrites it): CI runs
it on a small config so every change that moves an artifact byte is seen.

Exit code 0: every output reproduced; 1: some differ (listed); 2: could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

import yaml

from pipeline.core.config import project_root
from pipeline.core.io import atomic_write_text
from pipeline.tools import git_revision

# What a scratch project needs to run the DAG (data and caches are never copied).
SCRATCH_COPY = ("conf", "hydra_plugins", "pipeline", "dvc.yaml", ".dvc/config", "pyproject.toml")


class ReproCheckError(RuntimeError):
    """Cannot compare (no lock, a failed repro, a bad golden file): the message says why."""


def cached_outputs(root: Path) -> set[str]:
    """Paths of the DVC-cached outputs of ``root``'s pipeline (``cache: false`` ones left out)."""
    from dvc.repo import Repo  # deferred: heavy (DVC)

    with Repo(str(root)) as repo:
        return {str(out.def_path) for stage in repo.index.stages for out in stage.outs if out.use_cache}


def workspace_hashes(root: Path, keep: set[str] | None = None) -> dict[str, str]:
    """``{output path: md5}`` of the cached outputs as they are in ``root``'s workspace now
    (DVC's own hashing: a directory's is its ``.dir`` md5); a missing output is left out."""
    from dvc.repo import Repo  # deferred: heavy (DVC)

    out: dict[str, str] = {}
    with Repo(str(root)) as repo:
        for stage in repo.index.stages:
            for o in stage.outs:
                path = str(o.def_path)
                if o.use_cache and (keep is None or path in keep) and o.exists:
                    out[path] = str(o.get_hash().value)
    return dict(sorted(out.items()))


def lock_hashes(lock_text: str, keep: set[str] | None = None) -> dict[str, str]:
    """``{output path: md5}`` from a ``dvc.lock`` text (only ``keep``'s paths when given)."""
    doc = yaml.safe_load(lock_text) or {}
    out: dict[str, str] = {}
    for stage in (doc.get("stages") or {}).values():
        for o in stage.get("outs") or []:
            if keep is None or o["path"] in keep:
                out[o["path"]] = str(o.get("md5"))
    return dict(sorted(out.items()))


def compare(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """One line per output that differs, is missing, or is new."""
    lines = []
    for path in sorted(set(expected) | set(actual)):
        a, b = expected.get(path), actual.get(path)
        if a is None:
            lines.append(f"{path}: new output (md5 {b})")
        elif b is None:
            lines.append(f"{path}: not produced (expected md5 {a})")
        elif a != b:
            lines.append(f"{path}: md5 {b}, expected {a}")
    return lines


def committed_lock(root: Path, rev: str) -> str:
    """``dvc.lock`` as committed at ``rev`` (never an option: :func:`pipeline.tools.git_revision`)."""
    try:
        rev = git_revision(rev, "--rev")
    except ValueError as exc:
        raise ReproCheckError(str(exc)) from None
    p = subprocess.run(["git", "show", "--end-of-options", f"{rev}:dvc.lock"], cwd=root, capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise ReproCheckError(f"cannot read dvc.lock at {rev}: {p.stderr.strip()}")
    return p.stdout


def check_workspace(root: Path, rev: str) -> dict[str, list[str]]:
    """``{what was compared: lines that differ}``: the workspace's outputs vs its ``dvc.lock``,
    then that lock vs the one committed at ``rev``."""
    lock = root / "dvc.lock"
    if not lock.exists():
        raise ReproCheckError(f"{lock} does not exist: run `make repro` (or `dvc repro`) first")
    committed = committed_lock(root, rev)  # first: a bad revision stops before any hashing
    keep = cached_outputs(root)
    locked = lock_hashes(lock.read_text(), keep)
    return {"workspace outputs vs dvc.lock": compare(locked, workspace_hashes(root, keep)),
            f"dvc.lock vs {rev}'s": compare(lock_hashes(committed, keep), locked)}


def byte_overrides(overrides: Iterable[str]) -> list[str]:
    """The overrides that may change a byte: all but ``workers=N`` (the process count, which
    by contract never does, so one golden file serves every count: ``make reprocheck`` runs
    the tiny DAG at 1 and at 3)."""
    return [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "workers"]


def scratch_repro(src: Path, overrides: list[str], work: Path) -> dict[str, str]:
    """Copy the project to ``work``, compose with ``overrides``, ``dvc repro``; the cached outputs' md5s."""
    for name in SCRATCH_COPY:
        s = src / name
        if s.is_dir():
            shutil.copytree(s, work / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        elif s.exists():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, work / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "GIT_DIR", "GIT_WORK_TREE"))}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(work)  # the copy's code, not an installed one

    def run(*cmd: str) -> None:
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-25:])
            raise ReproCheckError(f"`{' '.join(cmd)}` failed in {work}:\n{tail}")

    config = (work / ".dvc" / "config").read_bytes()
    run("git", "init", "-q")
    run(sys.executable, "-m", "dvc", "init", "-q", "-f")
    (work / ".dvc" / "config").write_bytes(config)
    run(sys.executable, "-m", "pipeline.core.config", "compose", *overrides)
    run(sys.executable, "-m", "dvc", "repro")
    return lock_hashes((work / "dvc.lock").read_text(), cached_outputs(work))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.reprocheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default="HEAD", help="revision whose dvc.lock is the reference (default HEAD)")
    parser.add_argument("--scratch", nargs="*", metavar="OVERRIDE", default=None,
                        help="run the DAG in a scratch copy composed with these Hydra overrides")
    parser.add_argument("--golden", help="with --scratch: the committed {output: md5} file to compare with")
    parser.add_argument("--update", action="store_true", help="with --scratch: rewrite the golden file")
    parser.add_argument("--keep", action="store_true", help="with --scratch: keep the scratch repository")
    args = parser.parse_args(argv)
    root = project_root()
    try:
        if args.scratch is None:
            results = check_workspace(root, args.rev)
        else:
            if not args.golden:
                raise ReproCheckError("--scratch needs --golden FILE")
            golden = Path(args.golden) if Path(args.golden).is_absolute() else root / args.golden
            wanted = byte_overrides(args.scratch)
            if not args.update:  # before the run: a wrong golden file is said at once
                try:
                    doc = json.loads(golden.read_text())
                    expected, overrides = doc["outputs"], doc["overrides"]
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    raise ReproCheckError(f"{golden}: expected {{\"overrides\": [...], \"outputs\": "
                                          f"{{path: md5}}}} ({exc}); write it with --update") from exc
                if byte_overrides(overrides) != wanted:
                    raise ReproCheckError(f"{golden} was written for overrides {overrides}, not {wanted} "
                                          f"(a workers=N override aside)")
            work = Path(tempfile.mkdtemp(prefix="reprocheck_"))
            t0 = time.perf_counter()
            try:
                actual = scratch_repro(root, list(args.scratch), work)
            finally:
                if not args.keep:
                    shutil.rmtree(work, ignore_errors=True)
            took = time.perf_counter() - t0
            if args.update:
                doc: dict[str, Any] = {"overrides": wanted, "outputs": actual}
                atomic_write_text(golden, json.dumps(doc, indent=2) + "\n")
                print(f"wrote {golden}: {len(actual)} outputs ({took:.0f} s)")
                return 0
            what = f"scratch `dvc repro` ({' '.join(args.scratch) or 'default config'}, {took:.0f} s) vs {golden.name}"
            results = {what: compare(expected, actual)}
    except ReproCheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for what, diffs in results.items():
        if diffs:
            print(f"{what}: {len(diffs)} output(s) differ:")
            for line in diffs:
                print(f"  {line}")
        else:
            print(f"{what}: every cached output reproduced")
    if any(results.values()):
        print("Same code and config should give the same bytes: see docs/reproducibility.md. If the change is "
              "intended, commit the new dvc.lock (or rerun with --update for a golden file); a workspace that "
              "differs from its dvc.lock: `dvc status` names the stage, `dvc repro` reruns it.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
