"""Reading runs for the viewer, and writing ``reports/episodes.html`` (what ``compare`` calls).

    path = write_episodes_html(root, cfg)            # <paths.reports>/episodes.html
    runs, notes = read_runs(reader, ["C1", "C2"], eval_dir="data/eval", prompts_dir="data/prompts")

A *reader* is ``path -> bytes | None`` (None: no such file), so the same code reads the
working tree (:func:`folder_reader`) and a revision through DVC's filesystem
(:mod:`pipeline.view.revisions`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.conf_schema import Config
from pipeline.core.io import ArtifactError, atomic_write_text
from pipeline.view.html import render_html
from pipeline.view.model import PROMPT_COLUMNS, TURN_COLUMNS, Run, View, build_view

Reader = Callable[[str], "bytes | None"]

#: The page's file name in ``paths.reports``.
FILE_NAME = "episodes.html"


def folder_reader(root: str | Path) -> Reader:
    """A reader of files under ``root`` (paths relative to it)."""
    base = Path(root)

    def read(rel: str) -> bytes | None:
        path = base / rel
        return path.read_bytes() if path.is_file() else None

    return read


def parquet_rows(data: bytes, where: str, columns: Sequence[str] | None = None) -> list[dict]:
    """Rows of a Parquet file's bytes (only ``columns`` that it has, when given)."""
    try:
        buf = pa.BufferReader(data)
        names = set(pq.read_schema(buf).names)
        cols = [c for c in columns if c in names] if columns is not None else None
        return pq.read_table(pa.BufferReader(data), columns=cols).to_pylist()
    except (pa.ArrowInvalid, OSError) as exc:
        raise ArtifactError(f"corrupt Parquet file {where}: {exc}") from exc


def read_run(read: Reader, key: str, condition: str, *, eval_dir: str, prompts_dir: str,
             source: str = "") -> Run | None:
    """One condition's eval episodes / turns and prompts (None when its episodes are absent)."""
    base = f"{eval_dir.rstrip('/')}/{condition}"
    episodes = read(f"{base}/episodes.parquet")
    if episodes is None:
        return None
    turns = read(f"{base}/turns.parquet")
    prompts = read(f"{prompts_dir.rstrip('/')}/{condition}.parquet")
    return Run(key=key, condition=condition, source=source or base,
               episodes=parquet_rows(episodes, f"{base}/episodes.parquet"),
               turns=parquet_rows(turns, f"{base}/turns.parquet", TURN_COLUMNS) if turns is not None else [],
               prompts=parquet_rows(prompts, f"{prompts_dir}/{condition}.parquet", PROMPT_COLUMNS)
               if prompts is not None else [])


def read_runs(read: Reader, conditions: Sequence[str], *, eval_dir: str, prompts_dir: str,
              prefix: str = "", source: str = "") -> tuple[list[Run], list[str]]:
    """``(runs, notes)``: the conditions whose eval episodes exist (run key ``prefix + condition``),
    and one note per condition left out."""
    runs, notes = [], []
    for c in conditions:
        run = read_run(read, prefix + c, c, eval_dir=eval_dir, prompts_dir=prompts_dir, source=source)
        if run is None:
            notes.append(f"{prefix}{c}: no {eval_dir}/{c}/episodes.parquet{' at ' + source if source else ''} "
                         f"(run `dvc repro evaluate@{c}`)")
        else:
            runs.append(run)
    return runs, notes


def _comparisons(cfg: Config) -> list[tuple[str, str]]:
    return [(p[0], p[1]) for p in (cfg.experiment.comparisons or []) if len(p) == 2]


def view_of_workspace(root: Path, cfg: Config, *, conditions: Sequence[str] | None = None) -> View:
    """The view of the working tree's eval runs (every configured condition by default).

    Raises:
        ArtifactError: No condition has eval episodes.
    """
    conditions = list(conditions or cfg.condition)
    read = folder_reader(root)
    runs, notes = read_runs(read, conditions, eval_dir=cfg.paths.eval, prompts_dir=cfg.paths.prompts)
    if not runs:
        raise ArtifactError(f"no eval episodes under {root / cfg.paths.eval} for {', '.join(conditions)} "
                            "(run `dvc repro` first)")
    manifest = read(f"{cfg.paths.games}/manifest.parquet")
    rows = parquet_rows(manifest, "manifest.parquet", ["scene_id", "quest_id", "scene_split", "quest_length",
                                                       "objective"]) if manifest is not None else []
    return build_view(runs, pairs=_comparisons(cfg), manifest=rows, notes=notes,
                      max_new_tokens=cfg.sampling.max_new_tokens,
                      title="Episodes: " + " vs ".join(r.key for r in runs),
                      source=f"{cfg.paths.eval}/<condition>, {cfg.paths.prompts}/<condition>.parquet; "
                             + players(runs))


def players(runs: Sequence[Run]) -> str:
    """``agent llm, model data/policy/model`` from the episodes themselves (not the config)."""
    agents = sorted({str(e.get("agent")) for r in runs for e in r.episodes if e.get("agent")})
    models = sorted({str(e.get("model")) for r in runs for e in r.episodes if e.get("model")})
    return ", ".join(part for part in (f"agent {', '.join(agents)}" if agents else "",
                                       f"model {', '.join(models)}" if models else "") if part)


def write_view(view: View, out: str | Path) -> Path:
    """Write ``view``'s page to ``out`` (atomically); returns the path."""
    return atomic_write_text(out, render_html(view))


def write_episodes_html(root: Path, cfg: Config, out: str | Path | None = None) -> Path:
    """``<paths.reports>/episodes.html`` for the configured conditions (the ``compare`` stage's call)."""
    return write_view(view_of_workspace(root, cfg), out or root / cfg.paths.reports / FILE_NAME)


def describe(path: Path, view: View, seconds: float) -> str:
    """``wrote PATH: N tasks, M episodes, X MB in Y s``."""
    n_eps = sum(len(r["res"]) for r in view.index["rows"])
    return (f"wrote {path}: {len(view.index['rows'])} tasks, {n_eps} episodes, "
            f"{path.stat().st_size / 1e6:.2f} MB in {seconds:.2f} s")
