"""Episode storage API: write, iterate and load collected episodes (seed 003's collector).

Layout (one folder per collection, e.g. ``data/episodes`` or ``data/eval/C2``)::

    episodes.parquet          one row per episode  (pipeline.core.schemas.EPISODE_SCHEMA)
    turns.parquet             one row per turn     (pipeline.core.schemas.TURN_SCHEMA)
    tensors/<episode_id>.pt   per-episode token tensors (llm agent only)

Example:
    >>> store = EpisodeStore("data/episodes")          # doctest: +SKIP
    >>> for ep in store.iter_episodes():                # doctest: +SKIP
    ...     turns = store.load_turns(ep["episode_id"])
    ...     tensors = store.load_tensors(ep["episode_id"], turn_index=0)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.io import ArtifactError, read_parquet, safe_name, write_parquet
from pipeline.core.schemas import SCHEMA_VERSION, backend_errors, episodes_table, turns_table

EPISODES_FILE = "episodes.parquet"
TURNS_FILE = "turns.parquet"
TENSORS_DIR = "tensors"


def write_episodes(out_dir: str | Path, episodes: list[dict], turns: list[dict]) -> None:
    """Write episodes and turns canonically (sorted, fixed Parquet options, atomic)."""
    out = Path(out_dir)
    write_parquet(episodes_table(episodes), out / EPISODES_FILE, sort_by=["episode_id"], schema_version=SCHEMA_VERSION)
    write_parquet(turns_table(turns), out / TURNS_FILE, sort_by=["episode_id", "turn_index"],
                  schema_version=SCHEMA_VERSION)


class EpisodeStore:
    """Read access to one collection folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._episodes: pa.Table | None = None
        self._turns: pa.Table | None = None

    @property
    def episodes(self) -> pa.Table:
        if self._episodes is None:
            self._episodes = read_parquet(self.root / EPISODES_FILE)
        return self._episodes

    @property
    def turns(self) -> pa.Table:
        if self._turns is None:
            self._turns = read_parquet(self.root / TURNS_FILE)
        return self._turns

    def iter_episodes(self) -> Iterator[dict]:
        """Yield one dict per episode, in episode_id order."""
        yield from self.episodes.to_pylist()

    def load_turns(self, episode_id: str) -> list[dict]:
        """All turns of one episode, in turn order."""
        mask = pc.equal(self.turns["episode_id"], episode_id)
        rows = self.turns.filter(mask).to_pylist()
        if not rows and episode_id not in set(self.episodes["episode_id"].to_pylist()):
            raise KeyError(f"no episode {episode_id!r} in {self.root}")
        return rows

    def tensor_path(self, episode_id: str) -> Path:
        return self.root / TENSORS_DIR / f"{safe_name(episode_id, self.root / EPISODES_FILE, 'episode_id')}.pt"

    def load_tensors(self, episode_id: str, turn_index: int | None = None) -> Any:
        """Token tensors of an episode (or of one turn), loaded with ``weights_only=True``."""
        import torch  # deferred: heavy optional dependency (torch)

        path = self.tensor_path(episode_id)
        if not path.exists():
            raise ArtifactError(f"no tensors for episode {episode_id!r}: {path} is missing (rule agents store none)")
        try:
            data = torch.load(path, weights_only=True)
        except Exception as exc:  # corrupt file or a refused (unsafe) pickle
            raise ArtifactError(f"cannot load tensors {path}: {exc}") from exc
        if turn_index is None:
            return data
        for turn in data["turns"]:
            if int(turn["turn_index"]) == turn_index:
                return turn
        raise KeyError(f"episode {episode_id!r} has no tensors for turn {turn_index}")


def _rate(num: float, den: float) -> float:
    return float(num) / float(den) if den else 0.0


def statistics(episodes: list[dict], turns: list[dict]) -> dict:
    """Summary statistics of a collection (seed 003's get_statistics, extended)."""
    n = len(episodes)
    n_turns = len(turns)
    won = [bool(e["won"]) for e in episodes]
    correct = [bool(e["is_correct"]) for e in episodes]
    gen_tokens = [t.get("generated_tokens") for t in turns if t.get("generated_tokens") is not None]
    return {
        "num_episodes": n,
        "num_turns": n_turns,
        "success_rate": _rate(sum(correct), n),
        "won_rate": _rate(sum(won), n),
        "mean_reward": float(np.mean([e["final_reward"] for e in episodes])) if n else 0.0,
        "mean_turns": _rate(n_turns, n),
        "invalid_action_rate": _rate(sum(not t["action_valid"] for t in turns), n_turns),
        "repeated_action_rate": _rate(sum(bool(t["repeated"]) for t in turns), n_turns),
        "feedback_lines_per_turn": _rate(sum(len(t["feedback_lines"] or []) for t in turns), n_turns),
        "generated_tokens_per_turn": _rate(sum(gen_tokens), len(gen_tokens)) if gen_tokens else 0.0,
        **backend_errors(turns),
    }


def loads_json_column(value: str | None) -> Any:
    return None if value is None else json.loads(value)
