"""The JSON-action tracker as a ``transformers`` ``StoppingCriteria`` for ``model.generate``.

The transformers backend runs its own decoding loop with the same
:class:`~pipeline.llm.tracker.ActionStream` (so that finished rows leave the batch and
each row samples from its own seeded generator); this adapter gives the same per-row
tracking and early stop to code that calls ``model.generate`` directly::

    crit = JsonActionStoppingCriteria(tokenizer, prompt_length=ids.shape[1], batch_size=len(ids),
                                      eos_token_ids=[tokenizer.eos_token_id])
    out = model.generate(ids, attention_mask=mask, stopping_criteria=[crit], max_new_tokens=64)
    turns = crit.finish()   # one TrackedTurn per row
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import StoppingCriteria

from pipeline.llm.tracker import ActionStream, TrackedTurn


class JsonActionStoppingCriteria(StoppingCriteria):
    """Stops each row of a ``generate`` call when its first JSON object closes."""

    def __init__(self, tokenizer: Any, prompt_length: int, batch_size: int, *,
                 eos_token_ids: Sequence[int] = (), require_valid: bool = True):
        self.streams = [ActionStream(tokenizer, require_valid=require_valid) for _ in range(batch_size)]
        self.eos = {int(e) for e in eos_token_ids}
        self._ended = [False] * batch_size  # EOS seen: what follows is padding
        self._seen = prompt_length  # columns of input_ids already fed

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        new = input_ids[:, self._seen :].tolist()
        self._seen = input_ids.shape[1]
        done = []
        for row, tokens in enumerate(new):
            stream = self.streams[row]
            for tid in tokens:
                if stream.closed or self._ended[row]:
                    break
                stream.push(tid)
                self._ended[row] = tid in self.eos
            done.append(stream.closed)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def finish(self) -> list[TrackedTurn]:
        """One :class:`TrackedTurn` per row."""
        out = []
        for stream, ended in zip(self.streams, self._ended):
            reason = "json_closed" if stream.closed else ("eos" if ended else "max_new_tokens")
            out.append(stream.finish(reason))
        return out
