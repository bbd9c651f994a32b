"""Which ``pipeline/`` files each DVC stage runs, and whether ``dvc.yaml`` lists them.

A stage's code is the closure of its module's imports inside the ``pipeline`` package,
found statically with :mod:`ast`: ``import pipeline.x``, ``from pipeline.x import y``
(``y`` a name or a submodule), relative imports, and imports inside functions all count.
Importing ``pipeline.a.b`` also runs ``pipeline/a/__init__.py``: a package's
``__init__.py`` is part of the closure unless it is trivial (empty or a docstring only).
The stage's module is read from its ``cmd`` (``python -m pipeline.stages.<name>``)::

    python -m pipeline.tools.deps            # each stage's closure and a suggested deps: block
    python -m pipeline.tools.deps --check    # exit 1 when a closure file is not in the stage's deps
    python -m pipeline.tools.deps --write    # rewrite each stage's code deps in dvc.yaml from its closure

A file is covered when ``deps`` lists it or a directory containing it.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import yaml
from ruamel.yaml import YAML

from pipeline.core.config import project_root
from pipeline.core.io import atomic_write_text

PACKAGE = "pipeline"
DVC_FILE = "dvc.yaml"
_CMD_MODULE = re.compile(r"python\s+-m\s+(pipeline(?:\.\w+)+)")


@lru_cache(maxsize=None)
def module_file(root: Path, module: str) -> Path | None:
    """``pipeline.a.b`` -> ``pipeline/a/b.py`` or ``pipeline/a/b/__init__.py`` (None: not in the package)."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = root.joinpath(*parts)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def module_name(root: Path, path: Path) -> str:
    """``pipeline/a/b.py`` -> ``pipeline.a.b``; ``pipeline/a/__init__.py`` -> ``pipeline.a``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module of ``from <level dots><name> import ...`` inside ``module``."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


@lru_cache(maxsize=None)
def imported_modules(root: Path, path: Path) -> set[str]:
    """Every ``pipeline.*`` module ``path`` imports, anywhere in the file (functions too).

    ``from pipeline.x import y`` yields ``pipeline.x`` and, when ``y`` is a submodule,
    ``pipeline.x.y``. Modules outside the package are left out.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = module_name(root, path)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (_resolve_relative(module, is_package, node.level, node.module) if node.level
                    else node.module or "")
            found.add(base)
            for alias in node.names:
                if alias.name != "*" and module_file(root, f"{base}.{alias.name}") is not None:
                    found.add(f"{base}.{alias.name}")
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def _with_parents(module: str) -> list[str]:
    """``pipeline.a.b`` -> ``[pipeline, pipeline.a, pipeline.a.b]`` (importing it runs each)."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


@lru_cache(maxsize=None)
def _trivial(path: Path) -> bool:
    """An ``__init__.py`` that is empty or holds only a docstring (running it does nothing)."""
    if path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def closure(root: Path, module: str) -> list[str]:
    """Repo-relative paths (sorted) of every ``pipeline/`` file running ``module`` imports."""
    seen: set[Path] = set()
    todo = list(_with_parents(module))
    while todo:
        path = module_file(root, todo.pop())
        if path is None or path in seen:
            continue
        seen.add(path)
        for dep in imported_modules(root, path):
            todo.extend(_with_parents(dep))
    return sorted(p.relative_to(root).as_posix() for p in seen if not _trivial(p))


def stage_modules(root: Path) -> dict[str, str]:
    """``{stage name: module}`` for every ``dvc.yaml`` stage whose cmd is ``python -m pipeline...``."""
    stages = yaml.safe_load((root / DVC_FILE).read_text(encoding="utf-8")).get("stages") or {}
    out = {}
    for name, stage in stages.items():
        cmds = stage.get("cmd") or ""
        for cmd in [cmds] if isinstance(cmds, str) else cmds:
            match = _CMD_MODULE.search(cmd)
            if match:
                out[name] = match.group(1)
                break
    return out


def stage_deps(root: Path) -> dict[str, list[str]]:
    """``{stage name: its deps entries}`` as ``dvc.yaml`` writes them (``${...}`` unresolved)."""
    stages = yaml.safe_load((root / DVC_FILE).read_text(encoding="utf-8")).get("stages") or {}
    return {name: [str(d) for d in stage.get("deps") or []] for name, stage in stages.items()}


def covered(path: str, deps: Iterable[str]) -> bool:
    """Whether ``deps`` lists ``path`` or a directory containing it."""
    for dep in deps:
        dep = dep.rstrip("/")
        if path == dep or path.startswith(dep + "/"):
            return True
    return False


def missing(root: Path) -> dict[str, list[str]]:
    """``{stage: closure files its deps do not cover}``, only the stages missing some."""
    deps = stage_deps(root)
    out = {}
    for stage, module in stage_modules(root).items():
        lost = [p for p in closure(root, module) if not covered(p, deps.get(stage, []))]
        if lost:
            out[stage] = lost
    return out


def compact(root: Path, files: Iterable[str]) -> list[str]:
    """``files`` with each directory whose every file is among them written as the directory."""
    wanted = set(files)

    def all_in(folder: Path) -> bool:
        inside = [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        return bool(inside) and all(p.relative_to(root).as_posix() in wanted or _trivial(p) for p in inside)

    out: set[str] = set()
    for rel in wanted:
        entry = rel
        folder = (root / rel).parent
        while folder != root and folder != root / PACKAGE and all_in(folder):
            entry = folder.relative_to(root).as_posix()
            folder = folder.parent
        out.add(entry)
    return sorted(out)


def suggested_deps(root: Path, stage: str, module: str) -> list[str]:
    """The stage's deps with its code part replaced by its closure: data and conf/ entries first."""
    kept = [d for d in stage_deps(root).get(stage, []) if not d.startswith(PACKAGE + "/") and d != PACKAGE]
    return kept + compact(root, closure(root, module))


def write_deps(root: Path) -> list[str]:
    """Rewrite the code part of every stage's ``deps`` in ``dvc.yaml`` to its closure.

    Data and ``conf/`` entries keep their place and comments (a round-trip YAML edit);
    the ``pipeline/`` entries are replaced by :func:`suggested_deps`. Returns the names of
    the stages whose deps changed. The file is replaced atomically.
    """
    path = root / DVC_FILE
    rt = YAML()  # round trip: comments, order and quoting survive
    rt.indent(mapping=2, sequence=4, offset=2)
    rt.width = 120
    doc = rt.load(path.read_text(encoding="utf-8"))
    changed = []
    for stage, module in stage_modules(root).items():
        deps = doc["stages"][stage].setdefault("deps", [])
        want = suggested_deps(root, stage, module)
        if [str(d) for d in deps] == want:
            continue
        # In place, from the end: a kept entry keeps its index, so its comment stays with it
        # (a slice assignment would drop every item comment of the round-tripped sequence).
        for i in reversed(range(len(deps))):
            if str(deps[i]).startswith(PACKAGE + "/") or str(deps[i]) == PACKAGE:
                del deps[i]
        deps.extend(d for d in want if d not in [str(k) for k in deps])
        changed.append(stage)
    if changed:
        buf = io.StringIO()
        rt.dump(doc, buf)
        atomic_write_text(path, buf.getvalue())
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.deps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a stage's deps in dvc.yaml miss a file of its closure")
    parser.add_argument("--write", action="store_true",
                        help="rewrite each stage's code deps in dvc.yaml to its closure (data deps kept)")
    args = parser.parse_args(argv)
    root = project_root()
    if args.write:
        changed = write_deps(root)
        print(f"{DVC_FILE}: code deps rewritten for {', '.join(changed)}" if changed
              else f"{DVC_FILE}: code deps already match the import closures")
        return 0
    modules = stage_modules(root)
    for stage, module in modules.items():
        print(f"{stage} ({module}):")
        for path in closure(root, module):
            print(f"  {path}")
    print("\n# suggested deps (dvc.yaml):")
    for stage, module in modules.items():
        print(f"  {stage}:\n    deps:")
        for dep in suggested_deps(root, stage, module):
            print(f"      - {dep}")
    if not args.check:
        return 0
    lost = missing(root)
    for stage, paths in lost.items():
        print(f"error: stage {stage}: deps in {DVC_FILE} miss {', '.join(paths)}", file=sys.stderr)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
