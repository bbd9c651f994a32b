"""Parsing the action distribution a model states under the verbalized-entropy prompt
(seed 000's ``get_verbalized_entropy_system_prompt``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

from pipeline.core.jsonscan import iter_json_objects
from pipeline.prompts.templates import safe_str

_PROB_LINE = re.compile(
    r"^[ \t]*(?:[-*][ \t]*)?P[ \t]*\((?P<cand>[^()\n]+)\)[ \t]*[:=][ \t]*"
    r"(?P<num>\d+(?:\.\d*)?|\.\d+)[ \t]*(?P<pct>%)?",
    re.MULTILINE | re.IGNORECASE,
)
_DIST_KEYS = ("probabilities", "distribution", "candidates")


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        f = float(v)
    elif isinstance(v, str):
        s = v.strip()
        pct = s.endswith("%")
        try:
            f = float(s.rstrip("%").strip())
        except ValueError:
            return None
        f = f / 100.0 if pct else f
    else:
        return None
    return f if math.isfinite(f) and f >= 0 else None


def _candidate_key(c: Any) -> str:
    if isinstance(c, Mapping):
        return json.dumps(c, ensure_ascii=False, sort_keys=True)
    return " ".join(safe_str(c).split())


def parse_verbalized_distribution(text: str, *, base: float = math.e) -> tuple[dict[str, float], float | None]:
    """Parse the action distribution a model states under the verbalized-entropy prompt.

    Accepted forms (the first that yields candidates wins):

    - a JSON object with ``"probabilities"`` / ``"distribution"`` / ``"candidates"``: a
      mapping ``{candidate: p}`` or a list of ``{"action"|"command"|"candidate": c,
      "p"|"prob"|"probability": p}``;
    - lines ``P(<candidate>) = <p>`` (or ``:``), ``p`` a number or a percentage.

    Probabilities are normalised to sum to 1 (so ``60``/``40`` and ``0.6``/``0.4`` are the
    same); a repeated candidate's mass is added; negative or non-numeric values are
    ignored.

    Returns:
        ``(dist, entropy)``: candidates in first-mention order with their probability,
        and the Shannon entropy in units of ``log(base)`` (nats by default). ``({}, None)``
        when no distribution is found or its mass is zero.

    Example:
        >>> parse_verbalized_distribution("P(open Fridge_0) = 0.5\\nP(look) = 0.5")
        ({'open Fridge_0': 0.5, 'look': 0.5}, 0.6931471805599453)
    """
    pairs: list[tuple[str, float]] = []
    for _, _, obj in iter_json_objects(text or "", stop_at_unclosed=True):
        if not isinstance(obj, dict):
            continue
        body = next((obj[k] for k in _DIST_KEYS if k in obj), None)
        if isinstance(body, Mapping):
            pairs = [(_candidate_key(k), p) for k, v in body.items() if (p := _num(v)) is not None]
        elif isinstance(body, list):
            for item in body:
                if not isinstance(item, Mapping):
                    continue
                cand = next((item[k] for k in ("action", "command", "candidate") if k in item), None)
                prob = next((item[k] for k in ("p", "prob", "probability") if k in item), None)
                p = _num(prob)
                if cand is not None and p is not None:
                    pairs.append((_candidate_key(cand), p))
        if pairs:
            break
    if not pairs:
        for m in _PROB_LINE.finditer(text or ""):
            p = float(m.group("num")) / (100.0 if m.group("pct") else 1.0)
            pairs.append((_candidate_key(m.group("cand")), p))
    dist: dict[str, float] = {}
    for cand, p in pairs:
        if cand:
            dist[cand] = dist.get(cand, 0.0) + p
    total = sum(dist.values())
    if not dist or total <= 0:
        return {}, None
    dist = {c: p / total for c, p in dist.items()}
    entropy = -sum(p * math.log(p) for p in dist.values() if p > 0) / math.log(base)
    return dist, entropy + 0.0  # + 0.0 turns -0.0 (a one-candidate distribution) into 0.0
