"""What every stage's ``main`` shares: one way to report an expected failure, and the
numerics pin of the stages that train or run a model."""

from __future__ import annotations

import sys
from typing import Any

from pipeline.core.config import ConfigError
from pipeline.core.io import ArtifactError
from pipeline.core.numerics import NumericsError, cpu_model, pin
from pipeline.llm.backends import BackendError


def stage_error(exc: BaseException) -> int:
    """Exit code 1 with a one-line message for an expected failure of a stage that plays
    the agent (bad config or artifact, a backend error under ``agent.on_backend_error=fail``,
    or more failed turns than ``agent.max_error_fraction``; the message says which); re-raise anything else (a bug keeps its traceback).
    Call it from an ``except Exception`` clause."""
    if isinstance(exc, (ConfigError, ArtifactError, NumericsError, FileNotFoundError, ValueError, BackendError)):
        print(f"error: {exc}", file=sys.stderr)
        return 1
    raise exc


def pin_numerics(cfg: Any, *, runs_model: bool = True) -> dict[str, Any]:
    """Pin ``cfg.numerics`` (:func:`pipeline.core.numerics.pin`): first thing in the ``main``
    of a stage that may train or run a model, before anything loads torch. With
    ``runs_model=False`` (a rule agent, an extractive generator) only the environment is
    set and torch is not loaded. Returns what runs, with the CPU's name, for the metrics."""
    return {**pin(cfg.numerics, load_torch=runs_model), "cpu": cpu_model()}
