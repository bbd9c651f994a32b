"""An opt-in response cache for the ``openai`` backend (``model.cache_dir``): a request sent
once is never paid for twice (reruns, and conditions whose prompts are identical)::

    cache = ResponseCache("data/llm_cache", base_url="http://gpu-node:8000/v1")
    key = cache.key(body)          # sha256 of base_url + the whole request body
    data = cache.get(key)          # the stored response dict, or None
    cache.put(key, body, data)     # atomic write of <dir>/<key[:2]>/<key>.json

The key covers the endpoint (``base_url``) and the full request body: the model name, the
messages, every sampling parameter (temperature, top_p, max_tokens, the seed), logprobs,
the structured-output constraint and ``model.extra_body``. Nothing else goes into a file:
the API key is a request header, never part of the body, and a response that contains it
(a server echoing headers) is not stored.

One small JSON file per request under a fan-out of 256 folders, written atomically
(:func:`pipeline.core.io.atomic_write_json`): an interrupted run leaves only whole entries,
a file is never rewritten (same key, same content), and the folder can be tracked as it is
(``dvc add data/llm_cache``) or simply kept between runs. Keep it outside every stage's
outputs (``data/llm_cache``, not ``data/episodes/...``): a stage replaces its outputs whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from pipeline.core.io import atomic_write_json

log = logging.getLogger(__name__)

FORMAT = "pipeline.openai_response_cache/1"


class ResponseCache:
    """Responses of an OpenAI-compatible endpoint, one JSON file per distinct request.

    Args:
        root: the cache folder (created on the first write).
        base_url: the endpoint (part of every key: two servers never share entries).
        secret: the API key's value, only to refuse storing a response that contains it.
    """

    def __init__(self, root: str | os.PathLike, *, base_url: str, secret: str | None = None):
        self.root = Path(root)
        self.base_url = str(base_url)
        self._secret = secret or None
        self.hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        return f"ResponseCache(root={str(self.root)!r}, base_url={self.base_url!r})"

    def key(self, body: dict) -> str:
        """sha256 of the endpoint and the canonical JSON of the whole request body."""
        blob = json.dumps({"base_url": self.base_url, "request": body}, sort_keys=True, ensure_ascii=False,
                          separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        """The stored response for ``key``, or None (missing, unreadable or not this format)."""
        p = self.path(key)
        try:
            entry = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError) as exc:  # a damaged entry is asked for again (and rewritten)
            log.warning("response cache: ignoring unreadable %s (%s)", p, exc)
            self.misses += 1
            return None
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key \
                or not isinstance(entry.get("response"), dict):
            log.warning("response cache: ignoring %s (not a %s entry for this key)", p, FORMAT)
            self.misses += 1
            return None
        self.hits += 1
        return entry["response"]

    def put(self, key: str, body: dict, response: dict) -> Path | None:
        """Store ``response`` under ``key`` (atomically); None when it was not stored."""
        entry = {"format": FORMAT, "key": key, "base_url": self.base_url, "request": body, "response": response}
        if self._secret and self._secret in json.dumps(entry, ensure_ascii=False):
            log.warning("response cache: a response contained the API key; not stored")
            return None
        return atomic_write_json(self.path(key), entry)


def cache_root(cache_dir: str | os.PathLike) -> Path:
    """``model.cache_dir`` as a folder: relative paths are under the project root."""
    from pipeline.core.config import project_root  # deferred: keeps this module light

    p = Path(str(cache_dir))
    return p if p.is_absolute() else project_root() / p
