"""The unit a memory block's length is measured in: the model's tokens, or characters.

The placebo (C2_placebo) is matched to C2's block in what the model reads: its tokens when
a local model plays, characters otherwise. The render stage picks the unit once::

    length = block_length_for(cfg, root)       # BlockLength(unit, model_dir)
    length.measure(row["memory_block"]), length.unit

A :class:`BlockLength` pickles (a spawned worker receives it): it travels as its model
directory, and a process that unpickled it loads that tokenizer at its first measure, once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pipeline.core.conf_schema import AgentName, Backend, Config
from pipeline.core.config import ConfigError


def _load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer  # deferred: heavy optional dependency

    return AutoTokenizer.from_pretrained(model_dir)


_tokenizer = functools.lru_cache(maxsize=None)(_load_tokenizer)  # a process's tokenizer per directory


@dataclass(frozen=True)
class BlockLength:
    """The unit a memory block's length is measured in: :meth:`measure` and its name.

    Characters by default; :func:`block_length_for` gives the model's tokens when a local
    model plays (the placebo is matched to C2 in what the model reads): those of
    ``tokenizer``, or (``tokenizer`` None, as after unpickling) of the tokenizer saved in
    ``model_dir``, loaded at the first :meth:`measure`."""

    unit: str = "characters"
    model_dir: Optional[str] = None
    tokenizer: Any = field(default=None, compare=False, repr=False)

    def measure(self, text: str) -> int:
        """``text``'s length in :attr:`unit`."""
        tok = self.tokenizer if self.tokenizer is not None else (
            _tokenizer(self.model_dir) if self.model_dir is not None else None)
        if tok is None:
            return len(text)
        return len(tok(text, add_special_tokens=False)["input_ids"]) if text else 0

    def __getstate__(self) -> dict:
        """Pickled as its directory when it has one (the receiving process loads that tokenizer)."""
        return {**self.__dict__, "tokenizer": None} if self.model_dir is not None else dict(self.__dict__)


def block_length_for(cfg: Config, root: Path, tokenizer: Optional[Any] = None) -> BlockLength:
    """The model's tokens when the eval agent runs a local transformers model whose
    tokenizer is on disk (``model.name_or_path``) or given; characters otherwise (a remote
    endpoint's tokenizer is unknown here; a non-LLM agent reads no tokens).

    Raises:
        ConfigError: the model directory exists but its tokenizer cannot be loaded.
    """
    m = cfg.model
    if tokenizer is not None:
        return BlockLength(_token_unit(tokenizer), tokenizer=tokenizer)
    if str(cfg.agent.name) != AgentName.llm or str(m.backend) != Backend.transformers or not m.name_or_path:
        return BlockLength()
    path = Path(str(m.name_or_path))
    path = path if path.is_absolute() else root / path
    if not path.is_dir():
        return BlockLength()
    try:
        tok = _load_tokenizer(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.name_or_path={m.name_or_path!r}: cannot load its tokenizer to measure "
                          f"memory blocks in tokens: {exc}") from exc
    return BlockLength(_token_unit(tok), model_dir=str(path), tokenizer=tok)


def _token_unit(tok: Any) -> str:
    return f"tokens ({type(tok).__name__}, {len(tok)} entries)"
