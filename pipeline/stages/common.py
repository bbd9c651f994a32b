"""What every stage's ``main`` shares: one way to report an expected failure."""

from __future__ import annotations

import sys

from pipeline.core.config import ConfigError
from pipeline.core.io import ArtifactError
from pipeline.llm.backends import BackendError


def stage_error(exc: BaseException) -> int:
    """Exit code 1 with a one-line message for an expected failure of a stage that plays
    the agent (bad config or artifact, or a backend error under
    ``agent.on_backend_error=fail``); re-raise anything else (a bug keeps its traceback).
    Call it from an ``except Exception`` clause."""
    if isinstance(exc, (ConfigError, ArtifactError, FileNotFoundError, ValueError)):
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, BackendError):
        print(f"error: {exc} (agent.on_backend_error=fail)", file=sys.stderr)
        return 1
    raise exc
