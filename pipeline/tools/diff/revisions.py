"""Read access to the project's files at one revision: a git revision, a DVC experiment or the
working tree (``workspace``), and the ``params.yaml`` and ``paths`` found there.

    rev = open_rev(root, "HEAD~1")           # or a DVC experiment name, or "workspace"
    params = load_params_at(rev)              # {} when the revision has no params.yaml
    rev.find(paths_at(params)["eval"])        # the files under a folder, sorted
    rev.read("metrics/compare.json")          # its bytes; None when the file is not there

Artifacts are read through ``dvc.api.DVCFileSystem`` (DVC-tracked outputs come from the local
cache). A DVC output whose data is not here raises :class:`MissingData`, and the revision
remembers it (:attr:`Rev.missing`) with the commands that bring it back
(:meth:`Rev.restore_commands`). Used by ``python -m pipeline.tools.diff`` and the transcript
viewer's ``--diff`` (:mod:`pipeline.view.revisions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from pipeline.tools import git_revision

WORKSPACE = "workspace"

#: Default artifact locations (``paths.*`` in params.yaml at each revision overrides them).
DEFAULT_PATHS = {"episodes": "data/episodes", "eval": "data/eval", "prompts": "data/prompts",
                 "store": "data/store", "grounding": "data/grounding",
                 "grounding_merged": "data/grounding_merged", "stream": "data/stream", "metrics": "metrics"}


class DiffError(RuntimeError):
    """A revision cannot be resolved or an artifact cannot be read (message names it)."""


class MissingData(DiffError):
    """A DVC output's data is not readable at one revision: not in the local DVC cache (a git
    revision or an experiment) or not in the working tree (``workspace``).

    Attributes:
        output: The DVC output that ``path`` belongs to.
        path: The file that was asked for.
        what: ``output`` when none of it can be read (its files cannot even be listed),
            ``path`` when only that file's data is missing.
    """

    def __init__(self, rev: "Rev", output: str, path: str, *, whole: bool):
        self.rev, self.output, self.path = rev, output, path
        self.what = output if whole else path
        super().__init__(f"{self.what} at {rev.label} is {rev.missing_reason}")


def _dvc_read_errors() -> tuple[type[BaseException], ...]:
    """What DVCFileSystem raises for an output whose data is not in the local cache: a
    directory output whose ``.dir`` object is missing cannot be listed
    (``DataIndexDirError``); a file whose object is missing cannot be opened
    (``FileNotFoundError: No storage files available``)."""
    from dvc_data.index import DataIndexDirError  # deferred: heavy dependency (dvc)

    return (DataIndexDirError, FileNotFoundError)


@dataclass
class Rev:
    """Read access to the project's files at one revision.

    Attributes:
        name: What the user typed (``HEAD~1``, ``my-exp``, ``workspace``).
        sha: The resolved commit (None for the workspace).
        kind: ``workspace`` | ``experiment`` | ``git``.
        at_head: The commit is the one checked out (restoring its data needs no checkout).
        missing: DVC outputs (paths) found unreadable so far, whole or in part (see
            :class:`MissingData`); ``partly`` holds those only some of whose files are missing.
    """

    name: str
    sha: str | None
    kind: str
    root: Path
    fs: Any = None  # DVCFileSystem for git revisions / experiments
    at_head: bool = False
    missing: list[str] = field(default_factory=list)
    partly: set[str] = field(default_factory=set)
    _outputs: list[str] | None = field(default=None, repr=False)
    _probed: set[str] = field(default_factory=set, repr=False)

    @property
    def outputs(self) -> list[str]:
        """The cached DVC outputs declared at this revision (paths relative to the root)."""
        if self._outputs is None:
            self._outputs = self._load_outputs()
        return self._outputs

    def _load_outputs(self) -> list[str]:
        from dvc.exceptions import DvcException  # deferred: heavy dependency (dvc)

        if self.fs is not None:
            repo = self.fs.repo
        else:
            from dvc.repo import Repo  # deferred: heavy dependency (dvc)

            try:
                repo = Repo(str(self.root))
            except DvcException:  # not a DVC project: plain files only
                return []
        try:
            outs = [o for o in repo.index.outs if o.use_cache]
            return sorted(repo.fs.relpath(o.fs_path, repo.root_dir).replace("\\", "/") for o in outs)
        except DvcException:  # dvc.yaml being edited in the working tree: no output checks there
            if self.fs is None:
                return []
            raise
        finally:
            if self.fs is None:
                repo.close()

    def output_of(self, path: str) -> str | None:
        """The DVC output that is ``path`` or contains it."""
        owners = [o for o in self.outputs if path == o or path.startswith(o + "/")]
        return max(owners, key=len) if owners else None

    def missing_output_of(self, path: str) -> str | None:
        """The wholly unreadable output that is ``path`` or contains it (None: not known to be)."""
        owners = [o for o in self.missing if o not in self.partly and (path == o or path.startswith(o + "/"))]
        return max(owners, key=len) if owners else None

    def _mark_missing(self, output: str, *, whole: bool = True) -> None:
        if output not in self.missing:
            self.missing.append(output)
            self.missing.sort()
            if not whole:
                self.partly.add(output)
        elif whole:
            self.partly.discard(output)

    @property
    def missing_reason(self) -> str:
        return "not in the working tree" if self.fs is None else "not in the local DVC cache"

    def present(self, path: str) -> bool:
        """Whether ``path`` is a file at this revision; :class:`MissingData` when it is in a DVC
        output whose data is not here (so whether it exists cannot be told)."""
        missing = self.missing_output_of(path)
        if missing is None and not self.exists(path):
            output = self.output_of(path)
            if output is None or output in self._probed:
                return False
            self._probed.add(output)
            self.find(output)  # marks the output missing when its data is not here
            missing = self.missing_output_of(path)
            if missing is None:
                return False
        if missing is not None:
            raise MissingData(self, missing, path, whole=True)
        return True

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file here, without asking for its DVC output (see :meth:`present`)."""
        if self.fs is None:
            return (self.root / path).is_file()
        return bool(self.fs.exists(path)) and bool(self.fs.isfile(path))

    def read(self, path: str) -> bytes | None:
        """The file's bytes, None when it is not at this revision (see :meth:`present`);
        :class:`MissingData` when its DVC output's data is not here."""
        return self.read_bytes(path) if self.present(path) else None

    def read_bytes(self, path: str) -> bytes:
        """The file's bytes; :class:`MissingData` when its DVC output's data is not here."""
        missing = self.missing_output_of(path)
        if missing is not None:
            raise MissingData(self, missing, path, whole=True)
        if self.fs is None:
            try:
                return (self.root / path).read_bytes()
            except OSError as exc:
                raise DiffError(f"cannot read {path} at {self.label}: {exc}") from exc
        try:
            with self.fs.open(path, "rb") as fh:
                return fh.read()
        except _dvc_read_errors() as exc:
            output = self.output_of(path)
            if output is None:  # a git-tracked file that vanished: not a cache problem
                raise DiffError(f"cannot read {path} at {self.label}: {exc}") from exc
            # A file output, or one file of a directory output that could be listed.
            whole = output == path or not isinstance(exc, FileNotFoundError)
            self._mark_missing(output, whole=whole)
            raise MissingData(self, output, path, whole=whole) from exc
        except OSError as exc:  # permission, I/O error
            raise DiffError(f"cannot read {path} at {self.label}: {exc}") from exc

    def find(self, folder: str) -> list[str]:
        """Files under ``folder`` (posix paths relative to the repo root), sorted.

        DVC outputs in or above ``folder`` whose data is not here are added to
        :attr:`missing` (their files are then not listed).
        """
        if self.fs is None:
            return self._find_workspace(folder)
        found: list[str] = []
        self._walk(folder.strip("/"), found)
        return sorted(found)

    def _find_workspace(self, folder: str) -> list[str]:
        for out in self.outputs:  # declared outputs, in or above `folder`, absent from the working tree
            if (out == folder or out.startswith(folder + "/") or folder.startswith(out + "/")) \
                    and not (self.root / out).exists():
                self._mark_missing(out)
        base = self.root / folder
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())

    def _walk(self, path: str, found: list[str]) -> None:
        dir_error = _dvc_read_errors()[0]
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return
        except dir_error:  # a directory output (or one above `path`) whose .dir object is not cached
            output = self.output_of(path)
            if output is None:
                raise
            self._mark_missing(output)
            return
        for e in entries:
            name = str(e["name"]).strip("/")
            if e["type"] == "directory":
                self._walk(name, found)
            else:
                found.append(name)

    @property
    def label(self) -> str:
        return self.name if self.sha is None else f"{self.name} ({self.sha[:7]})"

    def restore_commands(self, has_remote: bool) -> list[tuple[str, str]]:
        """``(command, what it does)`` pairs that bring this revision's missing outputs back."""
        if self.kind == WORKSPACE:
            return [("dvc checkout", "restore them from the local DVC cache"),
                    ("dvc pull", "download them from the DVC remote" + ("" if has_remote else NO_REMOTE)),
                    ("dvc repro", "rebuild them")]
        if self.kind == "experiment":
            return [(f"dvc exp apply {self.name} && dvc pull",
                     "download them from the DVC remote, if they were pushed" + ("" if has_remote else NO_REMOTE)),
                    (f"dvc exp apply {self.name} && dvc exp run",
                     f"rebuild: rerun {self.name}'s params (saved as a new experiment)")]
        checkout = "" if self.at_head else f"git checkout {self.sha[:7]} && "
        back = "" if self.at_head else " (`git checkout -` to come back)"
        return [(f"{checkout}dvc pull", "download them from the DVC remote" + ("" if has_remote else NO_REMOTE)),
                (f"{checkout}dvc repro", "rebuild them" + back)]


NO_REMOTE = " (no DVC remote is configured here: `dvc remote add`)"


def open_rev(root: str | Path, name: str) -> Rev:
    """Resolve ``name`` (``workspace``, a DVC experiment name or a git revision)."""
    root = Path(root).resolve()
    if name == WORKSPACE:
        return Rev(name=name, sha=None, kind=WORKSPACE, root=root)
    try:
        git_revision(name, "revision")  # never an option to git: `--output=...` would write a file
    except ValueError as exc:
        raise DiffError(str(exc)) from None
    # deferred: heavy dependency (dvc), needed for git revisions and experiments only
    from dvc.api import DVCFileSystem
    from dvc.repo import Repo

    try:
        repo = Repo(str(root))
    except Exception as exc:
        raise DiffError(f"{root} is not a DVC repository: {exc}") from exc
    kind, sha = _resolve(repo, name)
    return Rev(name=name, sha=sha, kind=kind, root=root, fs=DVCFileSystem(str(root), rev=sha),
               at_head=kind == "git" and sha == repo.scm.get_rev())


def _resolve(repo: Any, name: str) -> tuple[str, str]:
    """``(kind, sha)`` of ``name`` in a dvc ``Repo``: a DVC experiment's name first, then a git
    revision; :class:`DiffError` when it is neither."""
    kind, sha = "git", None
    try:
        from dvc.repo.experiments.utils import resolve_name  # deferred: heavy dependency (dvc)

        ref = resolve_name(repo.scm, name).get(name)
        if ref is not None:
            sha, kind = repo.scm.get_ref(str(ref)), "experiment"
    except Exception:  # not an experiment name (or ambiguous): try it as a git revision
        sha = None
    if sha is None:
        try:
            sha = repo.scm.resolve_rev(name)
        except Exception as exc:
            raise DiffError(f"unknown revision {name!r}: not a git revision, a DVC experiment name "
                            f"(see `dvc exp show`) or 'workspace'") from exc
    return kind, sha


def has_dvc_remote(root: str | Path) -> bool:
    """Whether the project configures a DVC remote (``dvc remote list`` is not empty)."""
    from dvc.exceptions import DvcException  # deferred: heavy dependency (dvc)
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            return bool(repo.config.get("remote"))
    except DvcException:
        return False


def load_params_at(rev: Rev) -> dict:
    """The revision's ``params.yaml`` ({} when it has none)."""
    data = rev.read("params.yaml")
    if data is None:
        return {}
    try:
        return yaml.safe_load(data) or {}
    except yaml.YAMLError as exc:
        raise DiffError(f"params.yaml at {rev.label} is not valid YAML: {exc}") from exc


def paths_at(params: Mapping[str, Any]) -> dict[str, str]:
    """The artifact folders of a revision's params (``paths.*``), :data:`DEFAULT_PATHS` for those
    it does not set."""
    paths = dict(DEFAULT_PATHS)
    for k, v in (params.get("paths") or {}).items():
        if isinstance(v, str):
            paths[k] = v.rstrip("/")
    return paths
