"""Token accounting of a collection (for ``metrics/collect.json``)::

    stats.update(token_statistics(turn_rows, max_new_tokens=cfg.sampling.max_new_tokens))

Rows are turn dicts with the ``TURN_SCHEMA`` token columns; rows of rule agents (token
columns null) are ignored.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping


def token_statistics(turns: Iterable[Mapping[str, Any]], max_new_tokens: int) -> dict:
    """Prompt / generated token totals and rates, stop reasons, tracking methods, early-stop savings.

    ``early_stop_tokens_saved_max`` is an upper bound of what early stop saved: for each
    turn stopped when its JSON closed, the tokens left before ``max_new_tokens`` (the model
    might have ended earlier at EOS; measuring it exactly means generating them, which
    ``benchmarks/bench_collect_llm.py`` does).
    """
    rows = [t for t in turns if t.get("generated_tokens") is not None]
    n = len(rows)
    if not n:
        return {"llm_turns": 0}
    prompt = sum(int(t.get("prompt_tokens") or 0) for t in rows)
    gen = sum(int(t["generated_tokens"]) for t in rows)
    stops = Counter(str(t.get("stop_reason")) for t in rows)
    methods = Counter(str(t.get("tracking_method")) for t in rows)
    saved = sum(max(0, int(max_new_tokens) - int(t["generated_tokens"])) for t in rows
                if t.get("stop_reason") == "json_closed")
    return {
        "llm_turns": n,
        "prompt_tokens": prompt,
        "generated_tokens": gen,
        "prompt_tokens_per_turn": prompt / n,
        "generated_tokens_per_turn": gen / n,
        "stop_reasons": dict(sorted(stops.items())),
        "tracking_methods": dict(sorted(methods.items())),
        "json_closed_rate": stops.get("json_closed", 0) / n,
        "action_tracked_rate": (methods.get("stream", 0) + methods.get("fallback", 0)) / n,
        "early_stop_tokens_saved_max": saved,
        "early_stop_tokens_saved_max_fraction": saved / (saved + gen) if saved + gen else 0.0,
    }
