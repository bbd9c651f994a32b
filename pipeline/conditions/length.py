"""The unit a memory block's length is measured in: the model's tokens, or characters.

The placebo (C2_placebo) is matched to C2's block in what the model reads: its tokens when
a local model plays, characters otherwise. The render stage picks the unit once::

    length = block_length_for(cfg, root)       # BlockLength(measure, unit)
    length.measure(row["memory_block"]), length.unit
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pipeline.core.conf_schema import AgentName, Backend, Config
from pipeline.core.config import ConfigError


@dataclass(frozen=True)
class BlockLength:
    """The unit a memory block's length is measured in: ``measure(text)`` and its name.

    Characters by default; :func:`block_length_for` gives the model's tokens when a local
    model plays (the placebo is matched to C2 in what the model reads)."""

    measure: Callable[[str], int] = len
    unit: str = "characters"


def block_length_for(cfg: Config, root: Path, tokenizer: Optional[Any] = None) -> BlockLength:
    """The model's tokens when the eval agent runs a local transformers model whose
    tokenizer is on disk (``model.name_or_path``) or given; characters otherwise (a remote
    endpoint's tokenizer is unknown here; a non-LLM agent reads no tokens).

    Raises:
        ConfigError: the model directory exists but its tokenizer cannot be loaded.
    """
    m = cfg.model
    if tokenizer is None:
        if str(cfg.agent.name) != AgentName.llm or str(m.backend) != Backend.transformers or not m.name_or_path:
            return BlockLength()
        path = Path(str(m.name_or_path))
        path = path if path.is_absolute() else root / path
        if not path.is_dir():
            return BlockLength()
        from transformers import AutoTokenizer  # deferred: heavy optional dependency

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.name_or_path={m.name_or_path!r}: cannot load its tokenizer to measure "
                              f"memory blocks in tokens: {exc}") from exc
    tok = tokenizer

    def measure(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"]) if text else 0

    return BlockLength(measure, f"tokens ({type(tok).__name__}, {len(tok)} entries)")
