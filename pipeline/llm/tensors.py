"""Per-episode token tensors: one ``.pt`` file per episode (never one per turn: DVC is slow
on many small files), loaded with ``weights_only=True``::

    save_episode_tensors("data/episodes/tensors/ep_train_s0_q1_0.pt", [
        {"turn_index": 0, "generated_ids": [...], "action_token_mask": [...], "logprobs": [...]},
        ...])
    turn = load_episode_tensors(path, turn_index=0)   # {"turn_index", "generated_ids", ...}
    check_consistency(tokenizer, turn, action_text)    # raises TensorConsistencyError
    check_turn_consistency(tokenizer, turn, generated_text)  # action text re-derived from the text

File layout (a plain dict of tensors and ints, so the restricted unpickler loads it)::

    {"format": "pipeline.episode_tensors/1",
     "turns": [{"turn_index": int, "generated_ids": int64[T], "action_token_mask": bool[T],
                "logprobs": float32[T] (optional)}, ...]}

The bytes depend only on the values: the file is serialised in memory under a fixed
archive name and then written atomically.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipeline.core.io import ArtifactError, atomic_write_bytes
from pipeline.llm.tracker import action_text_from_text, decode_fn

FORMAT = "pipeline.episode_tensors/1"


class TensorConsistencyError(ValueError):
    """A turn's mask does not select exactly the tokens of its JSON action."""


def _turn_tensors(turn: Mapping[str, Any], position: int) -> dict:
    import torch  # deferred: heavy optional dependency (torch)

    if "generated_ids" not in turn or "action_token_mask" not in turn:
        raise ValueError(f"tensor turn {position}: needs generated_ids and action_token_mask, got {sorted(turn)}")
    ids = torch.as_tensor(turn["generated_ids"], dtype=torch.int64).reshape(-1)
    mask = torch.as_tensor(turn["action_token_mask"], dtype=torch.bool).reshape(-1)
    if ids.numel() != mask.numel():
        raise ValueError(f"tensor turn {position}: {ids.numel()} generated_ids but {mask.numel()} mask entries")
    out = {"turn_index": int(turn.get("turn_index", position)), "generated_ids": ids.clone(),
           "action_token_mask": mask.clone()}
    if turn.get("logprobs") is not None:
        lp = torch.as_tensor(turn["logprobs"], dtype=torch.float32).reshape(-1)
        if lp.numel() != ids.numel():
            raise ValueError(f"tensor turn {position}: {lp.numel()} logprobs for {ids.numel()} tokens")
        out["logprobs"] = lp.clone()
    return out


def save_episode_tensors(path: str | os.PathLike, turns: Sequence[Mapping[str, Any]]) -> Path:
    """Write one episode's per-turn tensors to ``path`` atomically (same values, same bytes).

    Args:
        path: the ``.pt`` file (``data/episodes/tensors/<episode_id>.pt``).
        turns: per turn ``generated_ids`` (ints), ``action_token_mask`` (bools, same
            length), optional ``logprobs`` (floats, same length) and ``turn_index``
            (default: the position in the list). Lists or tensors.

    Raises:
        ValueError: a turn misses a field or its lengths disagree (names the turn).
    """
    import torch  # deferred: heavy optional dependency (torch)

    payload = {"format": FORMAT, "turns": [_turn_tensors(t, i) for i, t in enumerate(turns)]}
    buf = io.BytesIO()
    # In memory: torch names the zip archive after the file, and the temp file of an
    # atomic write has a random name, which would make the bytes differ run to run.
    torch.save(payload, buf)
    return atomic_write_bytes(path, buf.getvalue())


def load_episode_tensors(path: str | os.PathLike, turn_index: int | None = None) -> Any:
    """Load an episode's tensors (``weights_only=True``): all turns, or one turn's dict.

    Raises:
        ArtifactError: missing or corrupt file, or not this format.
        KeyError: no turn with that ``turn_index``.
    """
    import torch  # deferred: heavy optional dependency (torch)

    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"missing tensor file {p}")
    try:
        data = torch.load(p, weights_only=True, map_location="cpu")
    except Exception as exc:  # truncated zip, refused pickle, ...
        raise ArtifactError(f"corrupt tensor file {p}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        raise ArtifactError(f"tensor file {p}: expected {{'format': {FORMAT!r}, 'turns': [...]}}")
    if turn_index is None:
        return data
    for turn in data["turns"]:
        if int(turn["turn_index"]) == int(turn_index):
            return turn
    raise KeyError(f"tensor file {p} has no turn {turn_index} (turns: "
                   f"{[int(t['turn_index']) for t in data['turns']]})")


def check_consistency(tokenizer: Any, tensors: Mapping[str, Any], action_text: str | None) -> None:
    """Check that a turn's mask selects exactly the tokens that spell its JSON action.

    Holds when: the mask is one contiguous run; the masked ids decode to a text that
    contains ``action_text``; dropping the first or the last masked token loses part of
    it (the run is minimal). With no action (``action_text`` None) the mask is all False.

    Args:
        tokenizer: the model's tokenizer.
        tensors: one turn's dict (``generated_ids``, ``action_token_mask``).
        action_text: the JSON action text stored for the turn.

    Raises:
        TensorConsistencyError: naming what does not hold.
    """
    import torch  # deferred: heavy optional dependency (torch)

    ids = torch.as_tensor(tensors["generated_ids"]).reshape(-1)
    mask = torch.as_tensor(tensors["action_token_mask"], dtype=torch.bool).reshape(-1)
    if ids.numel() != mask.numel():
        raise TensorConsistencyError(f"{ids.numel()} generated_ids but {mask.numel()} mask entries")
    where = torch.nonzero(mask).reshape(-1).tolist()
    if not action_text:
        if where:
            raise TensorConsistencyError(f"no action text but {len(where)} masked tokens")
        return
    if not where:
        raise TensorConsistencyError(f"action {action_text!r} but the mask is empty")
    start, end = where[0], where[-1] + 1
    if len(where) != end - start:
        raise TensorConsistencyError(f"mask is not contiguous (tokens {where})")
    decode = decode_fn(tokenizer)
    span = ids[start:end].tolist()
    text = decode(span)
    if action_text not in text:
        raise TensorConsistencyError(f"masked tokens decode to {text!r}, which does not contain {action_text!r}")
    if len(span) > 1 and (action_text in decode(span[1:]) or action_text in decode(span[:-1])):
        raise TensorConsistencyError(f"mask is wider than the action: {text!r} for {action_text!r}")


def check_turn_consistency(tokenizer: Any, tensors: Mapping[str, Any], generated_text: str | None) -> None:
    """:func:`check_consistency` with the action text re-derived from the stored ``generated_text``.

    The turns table keeps the generated text, not the action's text; the tracker's rules
    applied to the whole text (:func:`~pipeline.llm.tracker.action_text_from_text`) give it.
    """
    check_consistency(tokenizer, tensors, action_text_from_text(generated_text or ""))
