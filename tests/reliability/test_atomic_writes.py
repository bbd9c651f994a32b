"""Atomic writes: a write that fails part way leaves the previous files whole, and no temp file.

A fault injector (:class:`DiskFull`) sits under :mod:`pipeline.core.io`: the k-th file the
pipeline writes gets half its bytes, then fails like a full disk. Each artifact writer is
run with k = 1, 2, ... up to the number of files it writes; after every failure the folder
must be exactly as before. A static audit checks that nothing in ``pipeline/`` writes an
artifact around :mod:`pipeline.core.io`.
"""

from __future__ import annotations

import ast
import builtins
import errno
import io as _io
import json
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pytest

import pipeline.core.io as pio

ROOT = Path(__file__).resolve().parents[2]


class DiskFull:
    """Counts the files written through :mod:`pipeline.core.io`; the ``fail_at``-th one fails half-way.

    Both low-level writers are wrapped: ``open(..., "wb")`` in ``atomic_write_bytes`` (text,
    JSON, checkpoints, tensors) and ``pq.write_table`` in ``write_parquet``.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int = 0, fail_on: str | None = None):
        self.fail_at = fail_at
        self.fail_on = fail_on  # or: fail the write of the file whose name contains this
        self.calls = 0
        self.failed: str | None = None
        real_write_table = pio.pq.write_table

        def write_table(table, where, *args, **kwargs):
            buf = _io.BytesIO()
            real_write_table(table, buf, *args, **kwargs)
            with self.open(where, "wb") as fh:
                fh.write(buf.getvalue())

        monkeypatch.setattr(pio.pq, "write_table", write_table)
        monkeypatch.setattr(pio, "open", self.open, raising=False)  # shadows the builtin in pipeline.core.io only

    def open(self, path, mode="r", *args, **kwargs):
        fh = builtins.open(path, mode, *args, **kwargs)
        if not any(c in mode for c in "wax"):
            return fh
        self.calls += 1
        hit = self.fail_on in Path(path).name if self.fail_on else self.calls == self.fail_at
        if not hit or self.failed is not None:
            return fh
        self.failed = str(path)
        return _HalfThenFail(fh)


class _HalfThenFail:
    def __init__(self, fh):
        self.fh = fh

    def write(self, data):
        self.fh.write(data[: len(data) // 2])
        self.fh.flush()
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()
        return False


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file and folder under ``folder`` (hidden ones included), with file bytes."""
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def temp_leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or ".old-" in p.name]


def every_failure_keeps_the_previous_state(monkeypatch, folder: Path, write: Callable[[], object]) -> list[str]:
    """Fail ``write``'s 1st, 2nd, ... file write until a run succeeds; each failure must leave
    ``folder`` exactly as it was, with no temp file anywhere beside it.

    Returns:
        The names of the (temp) files whose write failed, in order.
    """
    before = snapshot(folder)
    failed: list[str] = []
    for k in range(1, 200):
        with monkeypatch.context() as m:
            inj = DiskFull(m, fail_at=k)
            try:
                write()
            except (OSError, pio.ArtifactError) as exc:
                assert inj.failed is not None, f"write {k} raised without the injected fault: {exc!r}"
                assert "No space left" in str(exc) + str(exc.__cause__), exc
            else:
                assert inj.failed is None
                return failed
        failed.append(Path(inj.failed).name)
        assert snapshot(folder) == before, f"failed write {k} ({inj.failed}) changed {folder}"
        assert not temp_leftovers(folder.parent), f"failed write {k} left {temp_leftovers(folder.parent)}"
    raise AssertionError("the writer never succeeded")


# --------------------------------------------------------------------------- single files


@pytest.mark.parametrize("writer", ["bytes", "text", "json", "parquet", "checkpoint", "tensors"])
def test_a_write_failing_half_way_keeps_the_previous_file(monkeypatch, tmp_path, writer):
    path = tmp_path / "out" / {"parquet": "t.parquet", "tensors": "e.pt"}.get(writer, "f.json")
    table = pa.table({"x": list(range(1000)), "s": [f"row {i}" for i in range(1000)]})
    writers: dict[str, Callable[[int], object]] = {
        "bytes": lambda v: pio.atomic_write_bytes(path, bytes([v]) * 10000),
        "text": lambda v: pio.atomic_write_text(path, f"version {v} ✓ 한국어\n" * 500),
        "json": lambda v: pio.atomic_write_json(path, {"version": v, "rows": list(range(500))}),
        "parquet": lambda v: pio.write_parquet(table.append_column("v", pa.array([v] * 1000)), path, sort_by=["x"]),
        "checkpoint": lambda v: _checkpoint(tmp_path / "out", v),
        "tensors": lambda v: _tensors(path, v),
    }
    writers[writer](1)
    before = snapshot(tmp_path / "out")
    for v in (2, 3):
        with monkeypatch.context() as m:
            inj = DiskFull(m, fail_at=1)
            with pytest.raises((OSError, pio.ArtifactError), match="No space left"):
                writers[writer](v)
            assert inj.failed and Path(inj.failed).name.endswith(".tmp")  # it was writing a temp file
        assert snapshot(tmp_path / "out") == before  # previous file intact, no temp file beside it
    writers[writer](4)  # and the next healthy write goes through
    assert snapshot(tmp_path / "out") != before
    assert not temp_leftovers(tmp_path)


def _checkpoint(folder: Path, v: int) -> None:
    from pipeline.session.rollout import Checkpoints

    Checkpoints(folder).save("f", {"episode": {"episode_id": "f", "v": v}, "turns": [], "tensors": []})


def _tensors(path: Path, v: int) -> None:
    from pipeline.llm.tensors import save_episode_tensors

    save_episode_tensors(path, [{"turn_index": 0, "generated_ids": [v] * 300, "action_token_mask": [True] * 300}])


# --------------------------------------------------------------------------- stage writers


def _previous(folder: Path) -> None:
    """A previous run's outputs (their content does not matter, only that they survive)."""
    folder.mkdir(parents=True)
    (folder / "episodes.parquet").write_bytes(b"previous episodes")
    (folder / "turns.parquet").write_bytes(b"previous turns")
    (folder / "from_the_previous_run.txt").write_text("stale")


def test_collect_outputs_survive_any_failing_write_then_resume(monkeypatch, tiny_cfg, tiny_games, tmp_path):
    from pipeline.session.rollout import tasks_from_manifest
    from pipeline.session.collection import run_collection

    out = tmp_path / "data" / "episodes"
    _previous(out)
    root = tiny_games.root

    def collect():
        tasks = tasks_from_manifest(tiny_games.rows, split="train", master_seed=0)
        cfg = tiny_cfg.copy()
        cfg.paths.checkpoints = str(tmp_path / "ckpt")  # absolute: beside the outputs
        return run_collection(cfg, root, tasks, out, scenes=tiny_games.scenes, ckpt_name="c", desc="t")

    before = snapshot(out)
    # Each checkpoint, then each output file. Checkpoints written before a failure are
    # kept, so the attempts after them replay nothing.
    for fault in ({"fail_at": 1}, {"fail_at": 2}, {"fail_on": "episodes.parquet"}, {"fail_on": "turns.parquet"}):
        with monkeypatch.context() as m:
            inj = DiskFull(m, **fault)
            with pytest.raises(OSError, match="No space left"):
                collect()
        expected = "ep_train_scene" if "fail_at" in fault else fault["fail_on"]
        assert inj.failed is not None and expected in inj.failed, (fault, inj.failed)
        assert snapshot(out) == before, fault
        assert not temp_leftovers(out.parent)
    _, stats = collect()
    assert stats["resumed_episodes"] == 2 and stats["num_episodes"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["episodes.parquet", "turns.parquet"]  # replaced whole
    assert not any((tmp_path / "ckpt").rglob("*.json"))


def test_store_outputs_survive_any_failing_write(monkeypatch, tmp_path):
    from pipeline.core.io import atomic_dir
    from pipeline.memory.store import load_store, write_store

    from .helpers import synthetic_store

    out = tmp_path / "data" / "store"
    first, second = synthetic_store(20, seed=1), synthetic_store(20, seed=2)

    def store_stage(store):  # what pipeline.stages.store.main does
        with atomic_dir(out) as tmp:
            write_store(store, tmp)

    store_stage(first)
    failed = every_failure_keeps_the_previous_state(monkeypatch, out, lambda: store_stage(second))
    assert [name.split(".")[1] for name in failed] == ["episodic_store", "episodic_store", "store_hash"]
    assert load_store(out).store_hash == second.store_hash


def test_write_store_alone_never_leaves_a_store_that_loads_wrong(monkeypatch, tmp_path):
    """Without the stage's folder swap: any partial write is refused on load, never silently mixed."""
    from pipeline.memory.store import load_store, write_store

    from .helpers import synthetic_store

    out = tmp_path / "store"
    first, second = synthetic_store(20, seed=1), synthetic_store(20, seed=2)
    for k in (1, 2, 3):
        write_store(first, out)
        with monkeypatch.context() as m:
            DiskFull(m, fail_at=k)
            with pytest.raises(OSError, match="No space left"):
                write_store(second, out)
        try:
            loaded = load_store(out)
        except pio.ArtifactError as exc:
            assert "modified outside the store stage" in str(exc)
        else:  # it loads only when table and hash still agree: all of the first store
            assert loaded.store_hash == first.store_hash and loaded.table.equals(first.table)
        assert not temp_leftovers(tmp_path)


def test_ground_and_merge_outputs_survive_any_failing_write(monkeypatch, tmp_path):
    from pipeline.grounding import GroundingFileManager
    from pipeline.grounding.episodes import write_ground_outputs
    from pipeline.grounding.scenes import merge_groundings, write_merge_outputs

    docs = []
    for i in range(3):
        gfm = GroundingFileManager(f"ep_{i}", expr_info={"scene_id": f"scene_{i % 2}"})
        gfm.append_step_feedback(1, "open Fridge_0", "Failure", [f"feedback : spatial: Fridge_{i} is in the Kitchen."])
        gfm.save_final_grounding(gfm.generate_final_grounding())
        docs.append(gfm.to_dict())
    grounding = tmp_path / "data" / "grounding"
    index = write_ground_outputs(docs[:2], grounding)
    failed = every_failure_keeps_the_previous_state(monkeypatch, grounding,
                                                    lambda: write_ground_outputs(docs, grounding))
    assert len(failed) == 3 * 2 + 2 * 2 + 2 + 1  # episodes, latest per scene, latest, index
    index = json.loads((grounding / "index.json").read_text())
    merged = tmp_path / "data" / "grounding_merged"
    scenes, configured = merge_groundings(index, "data/grounding", [], root=tmp_path)
    write_merge_outputs(scenes, configured, merged)
    scenes2, _ = merge_groundings(index, "data/grounding", [], root=tmp_path)
    scenes2 = {k + "_v2": v for k, v in scenes2.items()}
    failed = every_failure_keeps_the_previous_state(monkeypatch, merged,
                                                    lambda: write_merge_outputs(scenes2, None, merged))
    assert len(failed) == 2 * 2 + 2 + 1  # <scene>.md/.json, configured.md/.json, index.json


# --------------------------------------------------------------------------- static audit

# Direct writes that are fine: (file, enclosing function or "*", call or "*") -> why.
ALLOWED = {
    ("pipeline/envs/household/games.py", "compile_quest_game", "*"):
        "compiles into a private temp folder beside the game, then os.replace: atomic",
    ("pipeline/llm/tensors.py", "save_episode_tensors", "torch.save(...)"):
        "torch.save into an in-memory buffer, then pipeline.core.io.atomic_write_bytes",
    ("pipeline/analysis/report.py", "_png", "fig.savefig(...)"):
        "savefig into an in-memory buffer, then pipeline.core.io.atomic_write_bytes",
    ("pipeline/session/collection.py", "merge_shards", "shutil.copy2(...)"):
        "copies shard tensors into pipeline.core.io.atomic_dir's temp folder, swapped in whole",
    ("pipeline/tools/results.py", "snapshot", "shutil.copy2(...)"):
        "copies a finished run's metrics into pipeline.core.io.atomic_dir's temp folder, swapped in whole",
    ("pipeline/tools/results.py", "snapshot", "shutil.copytree(...)"):
        "copies a finished run's metrics folders into pipeline.core.io.atomic_dir's temp folder, swapped in whole",
    ("pipeline/tools/sweep.py", "prepare_job", "*"):
        "sets up a sweep job's scratch workspace (copied code, frozen conf), re-prepared on rerun; not an artifact",
    ("pipeline/tools/sweep.py", "*", "open(..., 'a')"): "appends to a sweep job's log file (a log, not an artifact)",
    ("pipeline/tools/reprocheck.py", "scratch_repro", "*"):
        "sets up a throwaway scratch repository (copied code and config) in a fresh temp folder; not an artifact",
    ("pipeline/llm/backends/serve.py", "_launch", "open(..., 'wb')"):
        "the test server's log file in its own temp folder (a log, not an artifact)",
    ("pipeline/envs/scienceworld/engine.py", "_start_jvm", "open(..., 'w')"):
        "os.devnull, where the JVM's stdout goes once its port is read (as py4j's launch_gateway does); no file",
}


def allowed(rel: str, func: str, call: str) -> bool:
    return any((rel, f, c) in ALLOWED for f in (func, "*") for c in (call, "*"))


WRITE_METHODS = {"write_text", "write_bytes", "to_parquet", "to_csv", "to_json", "savefig", "write_table",
                 "dump", "save", "savez", "copy", "copy2", "copyfile", "copytree", "replace", "rename"}


def direct_writes(path: Path) -> list[tuple[str, int, str]]:
    """(enclosing function, line, call) of every call that writes a file without pipeline.core.io."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node, func):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call):
                f = child.func
                if isinstance(f, ast.Name) and f.id == "open":
                    mode = child.args[1] if len(child.args) > 1 else next(
                        (k.value for k in child.keywords if k.arg == "mode"), None)
                    if isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+"):
                        found.append((func, child.lineno, f"open(..., {mode.value!r})"))
                elif isinstance(f, ast.Attribute) and f.attr in WRITE_METHODS:
                    owner = ast.unparse(f.value)
                    write_like = f.attr not in ("dump", "save", "replace", "rename", "copy") or owner in (
                        "json", "pickle", "torch", "np", "numpy", "os", "shutil", "yaml")
                    if owner not in ("sys.stdout", "sys.stderr", "self.stdout") and write_like and not (
                            f.attr == "replace" and owner != "os"):
                        found.append((func, child.lineno, f"{owner}.{f.attr}(...)"))
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_every_artifact_write_goes_through_pipeline_io():
    offenders = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "pipeline/core/io.py":
            continue
        for func, line, call in direct_writes(path):
            if not allowed(rel, func, call):
                offenders.append(f"{rel}:{line} in {func}: {call}")
    assert not offenders, "write these through pipeline.core.io (atomic_write_* / write_parquet / atomic_dir):\n" + \
        "\n".join(offenders)


def test_the_audit_finds_direct_writes(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import json, torch, shutil\n"
        "def stage(df, obj, p, fig):\n"
        "    open(p, 'w').write('x')\n"
        "    p.write_text('x')\n"
        "    df.to_parquet(p)\n"
        "    torch.save(obj, p)\n"
        "    json.dump(obj, open(p, 'a'))\n"
        "    fig.savefig(p)\n"
        "    shutil.copy(p, p)\n"
        "    open(p).read()\n"          # reading is fine
        "    print(json.dumps(obj))\n"  # so is a string
    )
    found = [call for _, _, call in direct_writes(bad)]
    assert found == ["open(..., 'w')", "p.write_text(...)", "df.to_parquet(...)", "torch.save(...)", "json.dump(...)",
                     "open(..., 'a')", "fig.savefig(...)", "shutil.copy(...)"]


# --------------------------------------------------------------------------- leftovers and modes


def test_a_killed_writers_temp_folder_is_cleaned_up_by_the_next_write(tmp_path):
    import socket
    import subprocess
    import sys

    target = tmp_path / "episodes"
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # a pid that has exited
    leftovers = {
        "dead writer": tmp_path / f".episodes.{host}.{dead}.abc123.tmp",
        "live writer": tmp_path / f".episodes.{host}.1.def456.tmp",  # pid 1 is alive
        "other host": tmp_path / f".episodes.another-host.{dead}.ghi789.tmp",
    }
    for folder in leftovers.values():
        (folder / "tensors").mkdir(parents=True)
        (folder / "turns.parquet").write_bytes(b"half")
    with pio.atomic_dir(target) as tmp:
        (tmp / "episodes.parquet").write_bytes(b"new")
    assert not leftovers["dead writer"].exists()
    assert leftovers["live writer"].exists() and leftovers["other host"].exists()  # never touched
    assert (target / "episodes.parquet").read_bytes() == b"new"


def test_atomic_files_and_folders_get_the_usual_permissions(tmp_path):
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    pio.atomic_write_text(tmp_path / "m.json", "{}")
    with pio.atomic_dir(tmp_path / "d") as tmp:
        (tmp / "x").write_text("x")
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o777 & ~mask  # not mkdtemp's 0700
