"""Atomic, canonical file I/O shared by every stage.

Every artifact is written to a temporary file in the destination folder and then
renamed over the target (``os.replace`` is atomic on POSIX), so a crash mid-write
leaves the previous file intact. Parquet is written with explicit options so that the
same rows give the same bytes::

    write_parquet(table, "data/episodes/turns.parquet", schema_version="1")
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq


class ArtifactError(RuntimeError):
    """A file the pipeline needs is missing, corrupt or unwritable (message names it)."""


# An id read from data that becomes one file or folder name (a scene, quest or episode id):
# no separator, no "..", no leading "." (never a path out of its folder, never hidden).
SAFE_NAME_RE = re.compile(r"^(?!\.)[A-Za-z0-9_.\-]+\Z")  # \Z: "s00\n" is refused too


def safe_name(value: Any, source: str | os.PathLike, key: str) -> str:
    """``value`` as a string, when it can be used as one file or folder name::

        safe_name(row["scene_id"], "data/games/manifest.parquet, row 3", "scene_id")  # -> "s00"
        safe_name("../../README", "data/grounding/index.json", "episodes[0].scene_id")  # ArtifactError

    The one check of every id from data that becomes a path (checkpoints, tensors, merged and
    online grounding), applied before anything is written or read under that name.

    Args:
        value: the id (a string, or an int episode id).
        source: where it was read (the file, and row or record), for the message.
        key: the key it was read under, for the message.

    Raises:
        ArtifactError: anything but letters, digits, ``_``, ``-`` and ``.`` not starting with ``.``
            (``/``, ``..``, a newline, an empty or non-string value); the message names
            ``source``, ``key``, the value and what was expected.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not SAFE_NAME_RE.fullmatch(str(value)):
        raise ArtifactError(f"{os.fspath(source)}: {key}={value!r} cannot be a file name: expected letters, digits, "
                            "'_', '-', '.', not starting with '.'")
    return str(value)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path next to ``path``; rename it over ``path`` only on success.

    Example:
        >>> with atomic_path("out.bin") as tmp:  # doctest: +SKIP
        ...     tmp.write_bytes(b"...")
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix + ".tmp")
    except OSError as exc:
        raise ArtifactError(f"cannot write {target}: {exc.strerror or exc} (is the folder writable?)") from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if tmp.exists():  # mkstemp makes it 0600: give it the mode a plain open() would
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


_UMASK: int | None = None


def _umask() -> int:
    """The process umask (read once: setting it and back at once is the only portable way)."""
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return _UMASK


def _dir_prefix(target: Path) -> str:
    # Host and pid in the name: a later run can tell a dead writer's leftover from a live one.
    return f".{target.name}.{socket.gethostname()}.{os.getpid()}."


def _remove_stale_dirs(target: Path) -> None:
    """Remove temp folders of ``target`` left by a killed writer of this host (SIGKILL skips cleanup)."""
    host = socket.gethostname()
    for cand in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        rest = cand.name[len(target.name) + 2:].split(".")  # host parts..., pid, random, "tmp"
        if len(rest) < 4 or ".".join(rest[:-3]) != host or not rest[-3].isdigit():
            continue
        pid = int(rest[-3])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(cand, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty folder beside ``target``; on success it replaces ``target`` whole.

    For a stage whose outputs are several files that must agree (episodes + turns +
    tensors): they are written into the new folder and appear together. A failure (or a
    SIGKILL) before the swap leaves the previous folder untouched; a folder of a former
    run never keeps stale files. The swap is two renames (``target`` aside, the new
    folder in): a crash between them leaves the previous folder at ``.<name>.old-<pid>``.
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_dirs(target)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=_dir_prefix(target), suffix=".tmp"))
    except OSError as exc:
        raise ArtifactError(f"cannot write {target}: {exc.strerror or exc} (is the folder writable?)") from exc
    tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700: give it the mode a plain mkdir would
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write_chunks(path, (data,))


def atomic_write_chunks(path: str | os.PathLike, chunks: Iterable[bytes]) -> Path:
    """Write ``chunks`` one after the other to ``path`` atomically (large files, streamed)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            for data in chunks:
                fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def dumps_json(obj: Any) -> str:
    """Canonical JSON text: sorted keys, UTF-8 kept (no \\u escapes), trailing newline."""
    return json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n"


def atomic_write_json(path: str | os.PathLike, obj: Any, *, sort_keys: bool = True) -> Path:
    text = json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=sort_keys) + "\n"
    return atomic_write_text(path, text)


def read_json(path: str | os.PathLike) -> Any:
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ArtifactError(f"missing file {p}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"corrupt JSON in {p}: {exc}") from exc
    except RecursionError as exc:  # "[[[[..." deeper than the parser's stack
        raise ArtifactError(f"corrupt JSON in {p}: nested too deeply to parse") from exc


# Parquet options fixed here so every writer produces the same bytes for the same rows.
PARQUET_OPTIONS = dict(
    version="2.6",
    compression="zstd",
    compression_level=3,
    use_dictionary=True,
    write_statistics=True,
    data_page_version="1.0",
)
ROW_GROUP_SIZE = 65536


def canonical_table(table: pa.Table, *, sort_by: list[str] | None = None, schema_version: str = "1") -> pa.Table:
    """Sort rows, drop pandas metadata, stamp ``schema_version`` in the schema metadata."""
    if sort_by:
        table = table.sort_by([(k, "ascending") for k in sort_by])
    meta = {b"schema_version": schema_version.encode()}
    return table.replace_schema_metadata(meta)


def write_parquet(
    table: pa.Table,
    path: str | os.PathLike,
    *,
    sort_by: list[str] | None = None,
    schema_version: str = "1",
) -> Path:
    """Write ``table`` canonically and atomically (same rows -> same bytes)."""
    table = canonical_table(table, sort_by=sort_by, schema_version=schema_version)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP_SIZE, **PARQUET_OPTIONS)
    return Path(path)


def read_parquet(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table:
    """Read a Parquet file, turning a missing or corrupt file into a one-line error."""
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"missing Parquet file {p} (run the stage that writes it: `dvc repro`)")
    try:
        return pq.read_table(p, columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ArtifactError(f"corrupt Parquet file {p}: {exc}") from exc


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def file_digest(path: Path) -> str | None:
    """sha256 of a file's bytes (``None`` when it does not exist)."""
    return sha256_file(path) if path.is_file() else None


def tree_digest(folder: Path, *, contents: bool = True) -> list:
    """(relative name, sha256 or size+mtime) of every file under ``folder``, sorted; what a
    resume key hashes of an input folder (``__pycache__`` left out)."""
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(q for q in folder.rglob("*") if q.is_file() and "__pycache__" not in q.parts):
        st = p.stat()
        out.append([p.relative_to(folder).as_posix(), sha256_file(p) if contents else [st.st_size, st.st_mtime_ns]])
    return out


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
