"""The policy step's phase checkpoints: an interrupted ``make model`` resumes after its last finished phase.

The step trains for an hour or more on two cores, in phases whose ends are natural
boundaries: the demonstrations' training (with the probes after it), then each DAgger round
(its rollouts, its training, its probes). At each boundary :func:`pipeline.policy.training.build_policy`
saves what the rest of the step reads:

- ``model.safetensors``: the model's parameters (``safetensors``: no pickle, nothing is
  executed on load; tied weights handled by ``save_model`` / ``load_model``);
- ``state.json``: the records so far (the loss curve, the probes' scores, each finished
  round's labelled turns and summary).

Nothing else carries over a boundary: every training call builds its optimizer afresh and
seeds torch itself, the tokenizer is retrained from the same demonstrations (deterministic),
and the rollouts and probes are greedy. So a run resumed from a phase writes the bytes an
uninterrupted run writes (tested: ``tests/test_dagger.py``).

The phases live under ``<paths.checkpoints>/policy/<key>/``, outside every output, where
``key`` hashes the stage's params (not ``workers``, which never changes a byte), the demonstrations,
the games manifest and the ``pipeline`` package's source (:func:`checkpoint_dir`): a changed
recipe, input or code never resumes from a stale phase. The folder is removed once the
step's output is written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pipeline
from pipeline.core.conf_schema import Config
from pipeline.core.config import config_hash, config_subtrees
from pipeline.core.io import atomic_dir, atomic_write_json, file_digest, read_json, tree_digest
from pipeline.policy.demos import RenderedTurn

TRAINED = "trained"
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.json"


def round_phase(r: int) -> str:
    """The phase that ends with DAgger round ``r`` (0-based)."""
    return f"dagger_{r}"


# The model pipeline's params (models/dvc.yaml, stage checkpoint; tests/test_architecture.py keeps
# them equal): what the resume key hashes of the config. ``workers`` and ``paths`` are none of them.
PHASE_KEYS = ("seed", "env", "user", "agent", "model", "sampling", "prompts", "grounding", "memory", "demos",
              "policy", "numerics", "experiment.eval_split")


def checkpoint_dir(cfg: Config, root: Path) -> Path:
    """``<paths.checkpoints>/policy/<key>``: the key hashes everything the step's bytes depend on
    (module docstring): the stage's params (:data:`PHASE_KEYS`), its data and its code."""
    parts = {
        "config": config_hash(config_subtrees(cfg, PHASE_KEYS)),
        "demos": tree_digest(root / cfg.paths.demos),
        "manifest": file_digest(root / cfg.paths.games / "manifest.parquet"),
        "code": tree_digest(Path(pipeline.__file__).parent),
    }
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return root / cfg.paths.checkpoints / "policy" / hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def turns_state(turns: list[RenderedTurn]) -> list[dict]:
    return [asdict(t) for t in turns]


def turns_from_state(rows: list[dict]) -> list[RenderedTurn]:
    return [RenderedTurn(**row) for row in rows]


class PhaseCheckpoints:
    """The saved phases of one policy run (``root``; ``None``: nothing is saved or resumed)."""

    def __init__(self, root: Path | None):
        self.root = root

    def save(self, phase: str, model: Any, state: dict) -> None:
        """Save the model's parameters and ``state`` as ``phase`` (atomically: a phase is whole or absent)."""
        if self.root is None:
            return
        from safetensors.torch import save_model  # deferred: heavy optional dependency (torch)

        with atomic_dir(self.root / phase) as tmp:
            save_model(model, str(tmp / MODEL_FILE))
            atomic_write_json(tmp / STATE_FILE, {"phase": phase, **state})

    def latest(self, phases: list[str]) -> str | None:
        """The last of ``phases`` (in the run's order) that was saved whole, or ``None``."""
        if self.root is None:
            return None
        for phase in reversed(phases):
            folder = self.root / phase
            if (folder / MODEL_FILE).is_file() and (folder / STATE_FILE).is_file():
                return phase
        return None

    def load(self, phase: str, model: Any) -> dict:
        """Load ``phase``'s parameters into ``model`` (in place); returns its state."""
        from safetensors.torch import load_model

        assert self.root is not None
        folder = self.root / phase
        state = read_json(folder / STATE_FILE)
        if not isinstance(state, dict) or state.get("phase") != phase:
            raise ValueError(f"{folder / STATE_FILE}: not the state of phase {phase!r}; delete {self.root} "
                             "and run the step again")
        load_model(model, str(folder / MODEL_FILE), strict=True)
        print(f"policy: resuming after phase {phase!r} (checkpoint {folder})", file=sys.stderr)
        return state

    def clear(self) -> None:
        """Remove every saved phase (the step's output is written)."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
