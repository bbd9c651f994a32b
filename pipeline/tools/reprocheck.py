"""Did this machine reproduce the committed artifacts? Compares data-output hashes.

    python -m pipeline.tools.reprocheck                 # after `make repro`: workspace vs dvc.lock vs committed
    python -m pipeline.tools.reprocheck --rev HEAD~1    # ... vs another revision's
    python -m pipeline.tools.reprocheck --scratch experiment=tiny --golden .ci/repro_tiny.json
    python -m pipeline.tools.reprocheck --scratch experiment=tiny --golden .ci/repro_tiny.json --update
    python -m pipeline.tools.reprocheck --scratch experiment=scienceworld_adaptation --keep   # run, keep, no check

The first form makes two comparisons and says which: the outputs in the workspace
(hashed as ``dvc status`` hashes them) against the workspace ``dvc.lock``, so a file changed
after the lock was written (a resumed or hand-run stage, an edit) is caught, and that
``dvc.lock`` against the one committed at ``--rev``. It lists every cached output
(``data/...``: DVC-cached, not the ``cache: false`` metrics, plots and stamps, which carry
wall-clock times) whose hash differs in either. ``--scratch`` copies the project's code and config into a temporary git + DVC
repository, composes ``params.yaml`` with the given overrides, runs ``dvc repro`` there
and compares the result with a committed golden file (``--update`` records this machine's
result in it): CI runs it on a small config so every change that moves an artifact byte is seen.

A golden file holds one record per x86-64 level (:func:`pipeline.core.cpu.cpu_level`):
the pinned numerics give the same bytes on CPUs of one level but not across levels (an
AVX-512 and an AVX2-only AMD EPYC train different weights; ``docs/reproducibility.md``)::

    {"overrides": [...], "outputs": {path: md5, ...},            # the same on every level
     "by_cpu_level": {"x86-64-v4": {path: md5, ...}, ...},      # where a level differs
     "recorded_on": {"x86-64-v4": {"cpu": ..., "revision": ...}, ...}}

A machine is compared with its own level's record; a level with none, with the outputs every
recorded level shares (the levels have agreed on every machine but one, whose cause was never
found: ``docs/reproducibility.md``), and it says so and what it could not compare; with no shared
output either, it is an error (exit 2) that says how to record it. ``--update`` replaces this
level's record and keeps the others, unless an output every level agreed on has moved: then the
code changed, the other levels' records are stale, and they are dropped (a warning names them),
so that such machines are compared with the new shared record until one rerecords its own.
A first record of a second level cannot tell a code change from a level difference and keeps the
other level's record; ``--update --drop-other-levels`` says the code changed (the reason a shared
output moved is known) and drops it.

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
from pipeline.core.cpu import cpu_level
from pipeline.core.numerics import cpu_model
from pipeline.core.revision import head_commit
from pipeline.tools import git_revision

# What a scratch project needs to run the DAG (data and caches are never copied; models/: the checkpoint it plays).
SCRATCH_COPY = ("conf", "hydra_plugins", "pipeline", "dvc.yaml", ".dvc/config", "pyproject.toml", "models")


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


def expected_outputs(doc: dict[str, Any], level: str, golden: Path) -> dict[str, str]:
    """The golden ``{output: md5}`` for a machine of ``level``: the outputs every recorded level
    agrees on and the level's own. A file without per-level records (the older form) holds one
    record for every level."""
    by = doc.get("by_cpu_level")
    if by is None or level in by:
        return {**doc["outputs"], **(by or {}).get(level, {})}
    if not doc["outputs"]:
        raise ReproCheckError(
            f"{golden} has no record for this CPU's level {level} (recorded: {', '.join(sorted(by)) or 'none'}) "
            "and no output every recorded level shares: the pinned numerics reproduce bytes within a level, and "
            "across levels on every machine tried but one (docs/reproducibility.md). Record this level with "
            "--update on this machine, from a commit whose other levels' records hold")
    return dict(doc["outputs"])


def unrecorded_level(doc: dict[str, Any], level: str) -> str | None:
    """What a check on a machine of ``level`` says when the golden file has no record of it (None: it has
    one): it is compared with the shared outputs only, and these are the outputs it cannot be."""
    by = doc.get("by_cpu_level")
    if by is None or level in by:
        return None
    own = sorted({k for outs in by.values() for k in outs})
    return (f"note: no record of this CPU's level {level} (recorded: {', '.join(sorted(by))}): compared with the "
            f"{len(doc['outputs'])} output(s) every recorded level shares"
            + (f"; not compared: {', '.join(own)} (each level's own)" if own else "")
            + "; --update on this machine records its level")


def record_outputs(doc: dict[str, Any] | None, level: str, actual: dict[str, str], overrides: list[str],
                   provenance: dict[str, str], *, drop_other_levels: bool = False) -> tuple[dict[str, Any], list[str]]:
    """``doc`` with this level's record replaced by ``actual``; the other levels' kept (dropped when
    ``doc`` was written for other overrides or in the older form, or when they are stale). Also
    returns the outputs that every level agreed on before and that moved here (non-empty: the code
    changed, so the other levels' records are stale and dropped); a first record of a second level
    moves none (what it differs in is its own), unless ``drop_other_levels`` says the code changed
    (``--drop-other-levels``: the person who knows why an output moved says so)."""
    levels: dict[str, dict[str, str]] = {}
    moved: list[str] = []
    if doc and byte_overrides(doc.get("overrides", [])) == overrides and "by_cpu_level" in doc:
        levels = {lv: {**doc["outputs"], **outs} for lv, outs in doc["by_cpu_level"].items()}
        if level in levels or len(levels) > 1 or drop_other_levels:  # a shared output is known shared only then
            moved = sorted(k for k, v in doc["outputs"].items() if actual.get(k) != v)
        if drop_other_levels:
            levels = {}
    recorded = dict(doc.get("recorded_on", {})) if levels else {}
    if moved:  # stale: compared with the new shared record until rerecorded
        levels = {}
    levels[level] = dict(actual)
    recorded[level] = provenance
    common = {k: v for k, v in sorted(actual.items()) if all(outs.get(k) == v for outs in levels.values())}
    by = {lv: {k: v for k, v in sorted(outs.items()) if k not in common} for lv, outs in sorted(levels.items())}
    new = {"overrides": overrides, "outputs": common, "by_cpu_level": by,
           "recorded_on": {lv: recorded.get(lv, {}) for lv in by}}
    return new, moved


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
    parser.add_argument("--drop-other-levels", action="store_true",
                        help="with --update: the code changed, so the other levels' records are stale: drop them "
                             "(a first record of a second level otherwise keeps them and takes what it differs "
                             "in for its level's own)")
    parser.add_argument("--keep", action="store_true", help="with --scratch: keep the scratch repository (without "
                                                             "--golden: only run and keep it, as for results --snapshot)")
    args = parser.parse_args(argv)
    root = project_root()
    try:
        if args.scratch is None:
            results = check_workspace(root, args.rev)
        else:
            if not args.golden and not args.keep:
                raise ReproCheckError("--scratch needs --golden FILE (or --keep: run it and keep the copy, compare nothing)")
            if args.golden:  # read before the run: a wrong golden file is said at once
                golden = Path(args.golden) if Path(args.golden).is_absolute() else root / args.golden
                wanted = byte_overrides(args.scratch)
                level = cpu_level()
                doc = None
                if not args.update or golden.exists():
                    try:
                        doc = json.loads(golden.read_text())
                        overrides = doc["overrides"]
                        expected = expected_outputs(doc, level, golden) if not args.update else {}
                        note = unrecorded_level(doc, level) if not args.update else None
                        if note:
                            print(note, file=sys.stderr)
                    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                        if args.update:  # an unreadable file is replaced by this level's record
                            print(f"warning: {golden} is not a golden file ({exc}): writing a new one", file=sys.stderr)
                            doc, overrides = None, wanted
                        else:
                            raise ReproCheckError(f"{golden}: expected {{\"overrides\": [...], \"outputs\": "
                                                  f"{{path: md5}}, \"by_cpu_level\": {{level: {{path: md5}}}}}} ({exc}); "
                                                  "write it with --update") from exc
                    if byte_overrides(overrides) != wanted and not args.update:
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
            if not args.golden:  # a run to keep (results --snapshot reads its metrics), no comparison
                print(f"kept: {work} (scratch `dvc repro` of {' '.join(args.scratch) or 'the default config'}, "
                      f"{took:.0f} s; compared with nothing: no --golden)")
                return 0
            if args.keep:  # with a golden file: the copy to look into when an output differs
                print(f"kept: {work}")
            if args.update:
                new, moved = record_outputs(doc, level, actual, wanted,
                                            {"cpu": cpu_model(), "revision": head_commit(root)},
                                            drop_other_levels=args.drop_other_levels)
                atomic_write_text(golden, json.dumps(new, indent=2) + "\n")
                kept = [lv for lv in new["by_cpu_level"] if lv != level]
                print(f"wrote {golden}: {len(actual)} outputs for {level} ({took:.0f} s), "
                      f"{len(new['by_cpu_level'][level])} of them this level's own; kept {', '.join(kept) or 'no other level'}")
                if moved:
                    dropped = sorted(set(doc["by_cpu_level"]) - {level})
                    print(f"warning: {len(moved)} output(s) that every level agreed on moved here ({', '.join(moved)}): "
                          f"the code changed, so the records of {', '.join(dropped) or 'no other level'} were stale and "
                          "are dropped; such machines are compared with this record's shared outputs until one "
                          "rerecords its level", file=sys.stderr)
                return 0
            what = (f"scratch `dvc repro` ({' '.join(args.scratch) or 'default config'}, {took:.0f} s) vs "
                    f"{golden.name} ({level})")
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
