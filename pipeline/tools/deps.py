"""What can change a DVC stage's outputs, and whether ``dvc.yaml`` (and ``models/dvc.yaml``) list it.

**Code.** A stage's code is the closure of its modules' imports inside the ``pipeline``
package (every ``python -m pipeline.<module>`` of its ``cmd``, a list of commands included),
found statically with :mod:`ast`: ``import pipeline.x``, ``from pipeline.x import y`` (``y``
a name or a submodule), relative imports, and imports inside functions all count. Importing
``pipeline.a.b`` also runs ``pipeline/a/__init__.py``: a package's ``__init__.py`` is part of
the closure unless it is trivial (empty or a docstring only). Two refinements, each because
the file cannot change the outputs in any other way:

- the config route (:data:`CONFIG_ROUTE`: the schema and the overrides record) is no code
  dependency of a stage but the params check (``python -m pipeline.core.config``): its
  values reach every stage as ``params.yaml``, which DVC compares key by key, and its checks
  only pass or stop a run, so a docstring or an unrelated section reruns nothing;
- an implementation chosen by a config value (:data:`SELECTED`: the backends of
  ``pipeline.llm.backends.IMPLEMENTATIONS``, imported by name when a run makes one; the worlds'
  packages of ``pipeline.envs.registry.PACKAGES``, imported when a run picks one) is a
  templated dependency, ``pipeline/llm/backends/${model.backend}.py``, ``pipeline/envs/${env.world}``:
  an edit of the one not selected reruns nothing.

Static imports cannot see what is imported by name, so the recorder checks it at run time: it
keeps the ``pipeline`` files each recorded stage loaded, and :func:`load_violations` names any
its deps (templates resolved from the run's params) do not cover.

**Params.** Every config field a stage reads must be among its ``params:`` (a listed key or
a section containing it). :func:`recording_reads` records what a run reads through OmegaConf,
``python -m pipeline.tools.deps record`` runs one stage under it, and
``tests/test_e2e.py`` (the experiment) and ``tests/test_model_pipeline.py`` (the model) run
their DAGs so and fail on a field read but not listed; the params of the stages that play a
collection are written from the list its episodes are labelled by (:data:`GENERATED_PARAMS`). ::

    python -m pipeline.tools.deps            # each stage's closure and a suggested deps: block
    python -m pipeline.tools.deps --check    # exit 1 when a stage's code deps or generated params drift
    python -m pipeline.tools.deps --write    # rewrite each stage's code deps (and generated params)
    python -m pipeline.tools.deps record --out reads.jsonl pipeline.stages.store   # one stage's reads

A file is covered when ``deps`` lists it or a directory containing it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import re
import runpy
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import yaml
from ruamel.yaml import YAML

from pipeline.core.config import project_root
from pipeline.core.io import atomic_write_text
from pipeline.envs.registry import PACKAGES as WORLD_PACKAGES
from pipeline.llm.backends import IMPLEMENTATIONS
from pipeline.session.collection import COLLECTION_PARAMS
from pipeline.session.evaluation import EVALUATE_KEYS, EVALUATE_READER_KEYS

PACKAGE = "pipeline"
DVC_FILE = "dvc.yaml"
# The experiment's pipeline, then the model pipeline (models/dvc.yaml: `make model`).
DVC_FILES = (DVC_FILE, "models/dvc.yaml")
_CMD_MODULE = re.compile(r"python\s+-m\s+(pipeline(?:\.\w+)+)")
# The params check's module: the one command whose code deps include the config route.
CHECK_MODULE = "pipeline.core.config"
# Modules whose content reaches a stage only as params.yaml's values (the schema's defaults and
# types, composed into it) or as a check that passes or stops a run (its ranges; the overrides
# record read by the stale check): no code dependency of a stage but the params check.
CONFIG_ROUTE = ("pipeline/core/conf_schema.py", "pipeline/core/overrides.py")
# A factory module -> (its templated dep: a path with the config key that selects the implementation,
# {name: the implementation's entry module}). An implementation is the template's path with the name
# put in: a module file (a backend) or a package directory (a world, all of it).
SELECTED = {
    "pipeline/llm/backends/__init__.py": ("pipeline/llm/backends/${model.backend}.py",
                                          {str(k): m for k, (m, _) in IMPLEMENTATIONS.items()}),
    "pipeline/envs/registry.py": ("pipeline/envs/${env.world}",
                                  {w: f"pipeline.envs.{w}.descriptor" for w in WORLD_PACKAGES}),
}
_TEMPLATE_KEY = re.compile(r"\$\{([^}]+)\}")
# Stages whose params are written from lists in the code, not by hand: a collection's episodes (and
# checkpoints) are labelled by the hash of CHECKPOINT_KEYS, so every stage that plays one lists them
# (pipeline/session/collection.py), then what it reads besides (pipeline/session/evaluation.py).
GENERATED_PARAMS = {(DVC_FILE, "collect"): COLLECTION_PARAMS,
                    (DVC_FILE, "evaluate"): COLLECTION_PARAMS + EVALUATE_KEYS,
                    (DVC_FILE, "evaluate_reader"): COLLECTION_PARAMS + EVALUATE_READER_KEYS}
# Keys read by a stage that cannot change its outputs, so they are never params: the process count
# (results merged in a fixed partition), paths (DVC deps and outs, not values), and how a run is
# supervised (stall and failure budgets: a run fails or completes, with the same bytes), and env.world (the
# package of env.name's world, which the registry checks it against: a function of a param, and the templated
# code dep pipeline/envs/${env.world} besides).
NEVER_PARAMS = ("workers", "paths", "env.world", "agent.worker_stall_s", "agent.max_error_fraction",
                "env.scienceworld.call_timeout_s", "env.scienceworld.jvm_heap_mb",
                "env.scienceworld.start_timeout_s")


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


def closure(root: Path, module: str, *, skip: Iterable[str] = ()) -> list[str]:
    """Repo-relative paths (sorted) of every ``pipeline/`` file running ``module`` imports,
    without the files in ``skip`` (nor what only they import)."""
    skipped = {root / s for s in skip}
    seen: set[Path] = set()
    todo = list(_with_parents(module))
    while todo:
        path = module_file(root, todo.pop())
        if path is None or path in seen or path in skipped:
            continue
        seen.add(path)
        for dep in imported_modules(root, path):
            todo.extend(_with_parents(dep))
    return sorted(p.relative_to(root).as_posix() for p in seen if not _trivial(p))


def stage_closure(root: Path, modules: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(files, templated)`` a stage running ``modules`` depends on: the union of their closures
    (the config route left out but for the params check's), with each selected implementation
    (:data:`SELECTED`) replaced by its templated path and the rest of every implementation's closure."""
    files: set[str] = set()
    for module in modules:
        files.update(closure(root, module, skip=() if module == CHECK_MODULE else CONFIG_ROUTE))
    templated = []
    for factory, (template, impls) in SELECTED.items():
        if factory not in files:
            continue
        owned = [_TEMPLATE_KEY.sub(name, template) for name in impls]
        templated.append(template)
        for m in impls.values():
            files.update(f for f in closure(root, m, skip=CONFIG_ROUTE) if not covered(f, owned))
    return sorted(files), templated


def _stages(root: Path, dvc_file: str) -> dict[str, Any]:
    path = root / dvc_file
    if not path.is_file():
        return {}
    return yaml.safe_load(path.read_text(encoding="utf-8")).get("stages") or {}


def stage_modules(root: Path, dvc_file: str = DVC_FILE) -> dict[str, list[str]]:
    """``{stage name: [module, ...]}`` of every stage of ``dvc_file`` whose cmd runs ``python -m pipeline...``
    (a cmd list: every such command, in order)."""
    out = {}
    for name, stage in _stages(root, dvc_file).items():
        cmds = stage.get("cmd") or ""
        mods = [m.group(1) for cmd in ([cmds] if isinstance(cmds, str) else cmds) for m in [_CMD_MODULE.search(cmd)]
                if m]
        if mods:
            out[name] = mods
    return out


def stage_deps(root: Path, dvc_file: str = DVC_FILE) -> dict[str, list[str]]:
    """``{stage name: its deps entries}`` as ``dvc_file`` writes them (``${...}`` unresolved)."""
    return {name: [str(d) for d in stage.get("deps") or []] for name, stage in _stages(root, dvc_file).items()}


def stage_params(root: Path, dvc_file: str = DVC_FILE) -> dict[str, list[str]]:
    """``{stage name: the params keys it lists}`` (a ``{file: [keys]}`` entry's keys included)."""
    out = {}
    for name, stage in _stages(root, dvc_file).items():
        keys: list[str] = []
        for p in stage.get("params") or []:
            if isinstance(p, dict):
                for listed in p.values():
                    keys += [str(k) for k in listed or []]
            else:
                keys.append(str(p))
        out[name] = keys
    return out


def covered(path: str, deps: Iterable[str]) -> bool:
    """Whether ``deps`` lists ``path`` or a directory containing it."""
    for dep in deps:
        dep = dep.rstrip("/")
        if path == dep or path.startswith(dep + "/"):
            return True
    return False


def missing(root: Path) -> dict[str, list[str]]:
    """``{stage: closure files (and templated deps) its deps do not list}``, only the stages missing
    some; a stage of ``models/dvc.yaml`` is named ``models/dvc.yaml:<stage>``, as DVC names it."""
    out = {}
    for dvc_file in DVC_FILES:
        deps = stage_deps(root, dvc_file)
        for stage, modules in stage_modules(root, dvc_file).items():
            files, templated = stage_closure(root, modules)
            listed = deps.get(stage, [])
            lost = [p for p in files if not covered(p, listed)] + [t for t in templated if t not in listed]
            if lost:
                out[_label(dvc_file, stage)] = lost
    return out


def _label(dvc_file: str, stage: str) -> str:
    return stage if dvc_file == DVC_FILE else f"{dvc_file}:{stage}"


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


def _is_code(dep: str) -> bool:
    return dep == PACKAGE or dep.startswith(PACKAGE + "/")


def suggested_deps(root: Path, stage: str, modules: Iterable[str], dvc_file: str = DVC_FILE) -> list[str]:
    """The stage's deps with its code part replaced by its closure: data and conf/ entries first."""
    kept = [d for d in stage_deps(root, dvc_file).get(stage, []) if not _is_code(d)]
    files, templated = stage_closure(root, modules)
    return kept + compact(root, files) + templated


def generated_params(dvc_file: str, stage: str) -> list[str] | None:
    """The params a stage's list is written from (:data:`GENERATED_PARAMS`), or None: by hand."""
    keys = GENERATED_PARAMS.get((dvc_file, stage))
    return list(keys) if keys is not None else None


def params_drift(root: Path) -> dict[str, list[str]]:
    """``{stage: [generated params, listed]}`` of every stage whose generated params list differs."""
    out = {}
    for (dvc_file, stage), _ in GENERATED_PARAMS.items():
        want = generated_params(dvc_file, stage)
        have = stage_params(root, dvc_file).get(stage)
        if have != want:
            out[_label(dvc_file, stage)] = [f"want {want}", f"have {have}"]
    return out


def write_deps(root: Path) -> list[str]:
    """Rewrite the code part of every stage's ``deps`` (and its generated ``params``) in each
    pipeline's ``dvc.yaml`` from its closure.

    Data and ``conf/`` entries keep their place and comments (a round-trip YAML edit);
    the ``pipeline/`` entries are replaced by :func:`suggested_deps`. Returns the names of
    the stages whose deps changed. Each file is replaced atomically.
    """
    changed = []
    for dvc_file in DVC_FILES:
        path = root / dvc_file
        if not path.is_file():
            continue
        rt = YAML()  # round trip: comments, order and quoting survive
        rt.indent(mapping=2, sequence=4, offset=2)
        rt.width = 120
        doc = rt.load(path.read_text(encoding="utf-8"))
        touched = False
        for stage, modules in stage_modules(root, dvc_file).items():
            node = doc["stages"][stage]
            deps = node.setdefault("deps", [])
            want = suggested_deps(root, stage, modules, dvc_file)
            if [str(d) for d in deps] != want:
                # In place, from the end: a kept entry keeps its index, so its comment stays with it
                # (a slice assignment would drop every item comment of the round-tripped sequence).
                for i in reversed(range(len(deps))):
                    if _is_code(str(deps[i])):
                        del deps[i]
                deps.extend(d for d in want if d not in [str(k) for k in deps])
                changed.append(_label(dvc_file, stage))
                touched = True
            params = generated_params(dvc_file, stage)
            if params is not None and [str(p) for p in node.get("params") or []] != params:
                node["params"] = params
                touched = True
                if _label(dvc_file, stage) not in changed:
                    changed.append(_label(dvc_file, stage))
        if touched:
            buf = io.StringIO()
            rt.dump(doc, buf)
            atomic_write_text(path, buf.getvalue())
    return changed


# --------------------------------------------------------------------------- params: what a run reads


def _leaf(value: Any) -> bool:
    from omegaconf import DictConfig  # deferred: only the recorder needs it

    return not isinstance(value, DictConfig)


@contextlib.contextmanager
def recording_reads() -> Iterator[set[str]]:
    """Record the full key of every config value read through OmegaConf while inside.

    A read is a value taken from a ``DictConfig`` (attribute, item, ``get``, ``items``: the key
    of every value that is not itself a section; a list is read whole) or a section converted
    whole (``OmegaConf.to_container`` / ``to_object``: its key; ``""`` for the root, which
    reads everything), in a whole config (the params a stage loaded, or a copy of them merged
    with code's values): a section built apart from them (``section(RewardConfig, ...)``,
    a condition typed from a dict) is code's, not a params read, and so is the stage's loading
    of its params (``run_stage``'s ``load_params``: the stale check and validation, which pass
    or stop the run). Reads in spawned worker processes are not seen: record at ``workers=1``.
    """
    from omegaconf import DictConfig
    from omegaconf.basecontainer import BaseContainer

    reads: set[str] = set()
    get_impl, to_content = DictConfig._get_impl, BaseContainer._to_content
    paused = [False]

    def whole(node) -> bool:  # noqa: ANN001 - the node's root is a whole config (seed, paths, ...)
        content = node._get_root().__dict__.get("_content")
        return isinstance(content, dict) and {"seed", "paths", "env"} <= set(content)

    def _get_impl(self, key, default_value, validate_key=True):  # noqa: ANN001 - OmegaConf's signature
        value = get_impl(self, key, default_value, validate_key)
        if _leaf(value) and not paused[0]:
            with contextlib.suppress(Exception):
                if whole(self):
                    reads.add(self._get_full_key(key))
        return value

    def _to_content(conf, *args, **kwargs):  # noqa: ANN001
        with contextlib.suppress(Exception):
            if whole(conf) and not paused[0]:
                reads.add(conf._get_full_key(None) or "")
        return to_content(conf, *args, **kwargs)

    # The stage's own params load (the stale check composes, validation reads every field: they
    # pass or stop the run) is the config route's, not the stage's reads: paused inside them
    # (load_params looks both up in its module when it runs).
    from pipeline.core import config

    route = {name: getattr(config, name) for name in ("check", "validate")}

    def quiet(fn):  # noqa: ANN001, ANN202
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            was, paused[0] = paused[0], True
            try:
                return fn(*args, **kwargs)
            finally:
                paused[0] = was
        return run

    DictConfig._get_impl = _get_impl
    BaseContainer._to_content = staticmethod(_to_content)
    for name, fn in route.items():
        setattr(config, name, quiet(fn))
    try:
        yield reads
    finally:
        DictConfig._get_impl = get_impl
        BaseContainer._to_content = staticmethod(to_content)
        for name, fn in route.items():
            setattr(config, name, fn)


def unlisted_reads(reads: Iterable[str], params: Iterable[str]) -> list[str]:
    """The reads no listed param covers (a read ``a.b.c`` is covered by ``a``, ``a.b`` or ``a.b.c``;
    :data:`NEVER_PARAMS` need none); ``""`` (the whole config read) is never covered."""
    listed = list(params)
    out = []
    for key in sorted(set(reads)):
        if key and (covered(key.replace(".", "/"), [p.replace(".", "/") for p in listed])
                    or covered(key.replace(".", "/"), [n.replace(".", "/") for n in NEVER_PARAMS])):
            continue
        out.append(key or "<the whole config>")
    return out


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records :func:`record` appended to ``path``."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def params_violations(root: Path, records: Iterable[dict[str, Any]], dvc_file: str = DVC_FILE) -> dict[str, list[str]]:
    """``{stage: config keys it read that its params do not list}`` for recorded runs of ``dvc_file``'s
    stages (each record's module mapped to the stage whose cmd runs it; a module no stage runs is an error)."""
    params = stage_params(root, dvc_file)
    return _violations(root, records, dvc_file, lambda stage, rec: unlisted_reads(rec["reads"], params.get(stage, [])))


def _violations(root: Path, records: Iterable[dict[str, Any]], dvc_file: str,
                lost: Callable[[str, dict[str, Any]], Iterable[str]]) -> dict[str, list[str]]:
    """``{stage label: sorted union of lost(stage, record)}`` over the records, each record's module
    mapped to the first stage of ``dvc_file`` whose cmd runs it.

    Raises:
        ValueError: a record's module is run by no stage of ``dvc_file``.
    """
    by_module: dict[str, str] = {}
    for stage, modules in stage_modules(root, dvc_file).items():
        for m in modules:
            by_module.setdefault(m, stage)
    out: dict[str, set[str]] = {}
    for rec in records:
        stage = by_module.get(rec["module"])
        if stage is None:
            raise ValueError(f"{rec['module']}: no stage of {dvc_file} runs it")
        found = list(lost(stage, rec))
        if found:
            out.setdefault(_label(dvc_file, stage), set()).update(found)
    return {k: sorted(v) for k, v in out.items()}


def resolve(dep: str, params: Mapping[str, Any]) -> str:
    """A deps entry with each ``${a.b}`` replaced by the value ``params`` (a params file's dict) holds
    there, as DVC resolves it.

    Raises:
        KeyError: ``params`` has no value at a template's key.
    """
    def value(m: re.Match) -> str:
        node: Any = params
        for part in m.group(1).split("."):
            node = node[part]
        return str(node)

    return _TEMPLATE_KEY.sub(value, dep)


def load_violations(root: Path, records: Iterable[dict[str, Any]], params: Mapping[str, Any],
                    dvc_file: str = DVC_FILE) -> dict[str, list[str]]:
    """``{stage: pipeline files a recorded run loaded that its deps do not cover}``, the deps'
    templates resolved from ``params`` (the params file the runs read). What static imports cannot
    see (a world's package, a backend, imported by name) is checked here. The config route
    (:data:`CONFIG_ROUTE`) is every stage's by params, not by deps."""
    deps = {stage: [resolve(d, params) for d in listed if _is_code(d)]  # a data dep (`${item...}`) covers no code
            for stage, listed in stage_deps(root, dvc_file).items()}
    return _violations(root, records, dvc_file, lambda stage, rec: [
        f for f in rec.get("loaded", []) if f not in CONFIG_ROUTE and not covered(f, deps.get(stage, []))
        and not _trivial(root / f)])


def _loaded_files(root: Path, modules: Iterable[str]) -> list[str]:
    """The repo-relative files of the ``pipeline`` modules among ``modules``."""
    files = {module_file(root, m) for m in modules if m == PACKAGE or m.startswith(PACKAGE + ".")}
    return sorted(f.relative_to(root).as_posix() for f in files if f is not None)


def record(module: str, args: list[str], out: Path) -> int:
    """Run ``python -m module args`` here under :func:`recording_reads`; append ``{module, args,
    reads, loaded}`` to ``out`` (JSON lines; ``loaded``: the ``pipeline`` files the run imported,
    those this tool had imported before it left out); its exit code."""
    code: Any = 0
    argv = sys.argv
    sys.argv = [module, *args]
    before = set(sys.modules)
    with recording_reads() as reads:
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.argv = argv
    kept = out.read_text(encoding="utf-8") if out.is_file() else ""  # one line per run, the file replaced whole
    loaded = _loaded_files(project_root(), set(sys.modules) - before)
    atomic_write_text(out, kept + json.dumps({"module": module, "args": args, "reads": sorted(reads),
                                                "loaded": loaded}) + "\n")
    return code if isinstance(code, int) else (0 if code is None else 1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"]:
        p = argparse.ArgumentParser(prog="python -m pipeline.tools.deps record",
                                    description="run one stage module and append the config keys it read to --out")
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("module")
        p.add_argument("args", nargs=argparse.REMAINDER)
        a = p.parse_args(argv[1:])
        return record(a.module, a.args, a.out)
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.deps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a stage's deps miss a file of its closure, or its generated params drift")
    parser.add_argument("--write", action="store_true",
                        help="rewrite each stage's code deps (and generated params) from its closure (data deps kept)")
    args = parser.parse_args(argv)
    root = project_root()
    if args.write:
        changed = write_deps(root)
        print(f"{', '.join(DVC_FILES)}: code deps rewritten for {', '.join(changed)}" if changed
              else f"{', '.join(DVC_FILES)}: code deps already match the import closures")
        return 0
    for dvc_file in DVC_FILES:
        modules = stage_modules(root, dvc_file)
        for stage, mods in modules.items():
            files, templated = stage_closure(root, mods)
            print(f"{_label(dvc_file, stage)} ({', '.join(mods)}):")
            for path in files + templated:
                print(f"  {path}")
    if not args.check:
        return 0
    lost = missing(root)
    for stage, paths in lost.items():
        print(f"error: stage {stage}: deps miss {', '.join(paths)}", file=sys.stderr)
    drift = params_drift(root)
    for stage, (want, have) in drift.items():
        print(f"error: stage {stage}: params are generated ({want}), dvc.yaml has {have}: run --write",
              file=sys.stderr)
    return 1 if lost or drift else 0


if __name__ == "__main__":
    sys.exit(main())
