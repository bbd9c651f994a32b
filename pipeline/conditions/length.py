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
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pipeline.core.conf_schema import AgentName, Backend, Config
from pipeline.core.config import ConfigError


# The tokenizer classes of transformers that are a `tokenizers` file and nothing more: no text
# processing of their own in Python (model-specific fast classes may add some: a prefix space, legacy
# SentencePiece handling), so counting with the file itself gives the ids transformers gives.
PLAIN_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


class PlainTokenizer:
    """A ``tokenizer.json`` counted with the `tokenizers` library itself: the same ids as
    transformers' generic fast tokenizer, without importing transformers (which imports torch:
    5-6 s in every process that measures a block, the render stage and each curve worker)."""

    def __init__(self, tokenizer: Any, class_name: str) -> None:
        self._tokenizer, self.class_name = tokenizer, class_name

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)


def _plain_tokenizer(model_dir: str) -> Optional[PlainTokenizer]:
    """The directory's tokenizer as a :class:`PlainTokenizer` where transformers would load it as
    one of :data:`PLAIN_TOKENIZER_CLASSES` and add nothing to the file (every token its config
    names is among the file's added tokens); None otherwise (transformers loads it)."""
    folder = Path(model_dir)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("tokenizer_class") not in PLAIN_TOKENIZER_CLASSES:
        return None
    added = {t.get("content") for t in spec.get("added_tokens") or [] if isinstance(t, dict)}
    named = [v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)]
    named += [v for v in config.get("extra_special_tokens") or [] if isinstance(v, str)]
    named += [v.get("content") for v in (config.get("added_tokens_decoder") or {}).values() if isinstance(v, dict)]
    if not set(named) <= added:
        return None
    from tokenizers import Tokenizer  # transformers' own dependency, light (no torch)

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()  # as transformers calls it: no truncation, no padding unless asked
    tok.no_padding()
    return PlainTokenizer(tok, str(config["tokenizer_class"]))


def _load_tokenizer(model_dir: str) -> Any:
    plain = _plain_tokenizer(model_dir)
    if plain is not None:
        return plain
    from transformers import AutoTokenizer  # deferred: heavy optional dependency

    return AutoTokenizer.from_pretrained(model_dir)


_tokenizer = functools.lru_cache(maxsize=None)(_load_tokenizer)  # a process's tokenizer per directory


@functools.lru_cache(maxsize=1 << 16)
def _tokens_in(model_dir: str, text: str) -> int:
    """``text``'s length in the tokens of ``model_dir``'s tokenizer, remembered: the placebo's fit
    measures the same filler clauses for every task (a third of the render stage's time, issue 63)."""
    return len(_tokenizer(model_dir)(text, add_special_tokens=False)["input_ids"])


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
        if not text:
            return 0
        if self.model_dir is not None:  # the tokenizer of the directory (the same object as self.tokenizer)
            return _tokens_in(self.model_dir, text)
        if self.tokenizer is None:
            return len(text)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

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
        tok = _tokenizer(str(path))  # the process's one tokenizer of this directory (measure uses it)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.name_or_path={m.name_or_path!r}: cannot load its tokenizer to measure "
                          f"memory blocks in tokens: {exc}") from exc
    return BlockLength(_token_unit(tok), model_dir=str(path), tokenizer=tok)


def _token_unit(tok: Any) -> str:
    return f"tokens ({getattr(tok, 'class_name', type(tok).__name__)}, {len(tok)} entries)"
