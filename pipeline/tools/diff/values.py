"""Values as the diff compares and shows them: nested keys flattened, cells normalised, long
texts shortened or windowed around their first difference."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys -> leaf values (lists are leaves: compared whole)."""
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k in obj:
            key = f"{prefix}.{k}" if prefix else str(k)
            out.update(flatten(obj[k], key))
        if not obj and prefix:
            out[prefix] = {}
        return out
    return {prefix: obj}


def norm(v: Any) -> Any:
    """A hashable, comparable form of a cell (lists/structs as canonical JSON; NaN == NaN)."""
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    return v


def short(v: Any, width: int) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
    s = s.replace("\n", "\\n")
    return s if len(s) <= width else s[: width - 1] + "…"


def window(a: Any, b: Any, width: int) -> tuple[str, str]:
    """Both values around their first difference (long prompts differ deep inside)."""
    sa = a if isinstance(a, str) else json.dumps(a, ensure_ascii=False, default=str)
    sb = b if isinstance(b, str) else json.dumps(b, ensure_ascii=False, default=str)
    if len(sa) <= width and len(sb) <= width:
        return short(sa, width), short(sb, width)
    i = next((k for k, (x, y) in enumerate(zip(sa, sb)) if x != y), min(len(sa), len(sb)))
    start = max(0, i - width // 3)
    pre = f"…[@{start}]" if start else ""
    return pre + short(sa[start:], width - len(pre)), pre + short(sb[start:], width - len(pre))
