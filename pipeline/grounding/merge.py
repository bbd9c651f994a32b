"""Merging grounding files into ``$grounding_content`` (seed 000 "여러 파일 병합 기능").

JSON files are merged by seed 000's rules (:func:`merge_grounding_json_files`) and
rendered as Markdown (:func:`render_grounding_to_markdown`, H3 -> H4); TXT / Markdown
files are joined as they are; :func:`merge_grounding_files` mixes both the way seed
000's ``get_system_prompt`` does. A missing or corrupt file is skipped with a warning
naming it; no usable file at all is a :class:`GroundingMergeError`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pipeline.core.config import project_root
from pipeline.core.io import safe_name
from pipeline.grounding.common import (
    CONFIGURED_NAME,
    CONTENT_JOINER,
    FINAL_KEYS,
    SECTION_TITLES,
    TEXT_JOINER,
    GroundingError,
    GroundingMergeError,
    empty_stacked,
    fact_key,
)

# The package's one logger: its name is what log filters (and tests) select.
log = logging.getLogger("pipeline.grounding")

_HEADER_RE = re.compile(r"^( {0,3}(?:[-*+] +)?)(#{1,6})(?=\s|$)")  # also "- ### x" (list item)
_FENCE_RE = re.compile(r"^ {0,3}(```|~~~)")


def split_grounding_paths(paths: str | os.PathLike | Iterable[str | os.PathLike] | None) -> list[str]:
    """Seed's GROUNDING_FILE_PATH: a comma-separated string or a list -> list of paths.

    Raises:
        GroundingError: an element is not a string/path.
    """
    if paths is None:
        return []
    if isinstance(paths, os.PathLike):
        return [os.fspath(paths)]
    if isinstance(paths, str):
        return [p.strip() for p in paths.split(",") if p.strip()]
    out = []
    try:
        items = list(paths)
    except TypeError as exc:
        raise GroundingError(f"grounding files {paths!r}: expected a comma-separated string or a list of "
                             "paths") from exc
    for p in items:
        if isinstance(p, os.PathLike):
            p = os.fspath(p)
        if not isinstance(p, str):
            raise GroundingError(f"grounding file {p!r}: expected a path string")
        if p.strip():
            out.append(p.strip())
    return out


def escapes_root(path: str | os.PathLike) -> bool:
    """Whether a relative path leaves the folder it is relative to (``../x``, ``a/../../x``).

    Lexical (no symlinks followed): a DVC cache linked from outside the project is fine.
    """
    norm = os.path.normpath(os.fspath(path))
    return norm == os.pardir or norm.startswith(os.pardir + os.sep)


def _resolve(path: str, root: str | os.PathLike | None) -> Path:
    """A grounding path: absolute as given, relative ones under ``root`` (the project root).

    Raises:
        GroundingError: a relative path that climbs out of the root with ``..``; a file
            outside the project is read only when its absolute path is given explicitly.
    """
    p = Path(path)
    if p.is_absolute():
        return p
    if root is None:
        root = project_root()
    if escapes_root(p):
        raise GroundingError(f"grounding file {path!r} climbs out of the project root {root} with '..': "
                             "give its absolute path to read a file outside the project")
    return Path(root) / p


def _check_grounding_doc(doc: Any) -> str | None:
    """Why ``doc`` is not a usable grounding JSON, or ``None`` when it is."""
    if not isinstance(doc, dict):
        return f"expected a JSON object, got {type(doc).__name__}"
    if "stacked_grounding" not in doc and "final_grounding" not in doc:
        return "neither stacked_grounding nor final_grounding"
    stacked = doc.get("stacked_grounding")
    if stacked is not None:
        if not isinstance(stacked, dict):
            return "stacked_grounding is not an object"
        for t, entries in stacked.items():
            if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
                return f"stacked_grounding.{t} is not a list of strings"
    final = doc.get("final_grounding")
    if final is not None:
        if not isinstance(final, dict):
            return "final_grounding is not an object"
        for key in FINAL_KEYS.values():
            item = final.get(key)
            content = item.get("content") if isinstance(item, dict) else item
            if item is not None and not isinstance(content, (str, type(None))):
                return f"final_grounding.{key}.content is not a string"
    return None


def _content(item: Any) -> str:
    content = item.get("content") if isinstance(item, dict) else item
    return content if isinstance(content, str) else ""


def merge_grounding_docs(docs: Sequence[Mapping[str, Any]], *, dedupe_contents: bool = False) -> dict:
    """Merge grounding documents already loaded (seed 000's JSON merge rules).

    - ``stacked_grounding``: lists concatenated per category, duplicates removed (first
      occurrence order kept); categories beyond the four are kept after them.
    - ``final_grounding``: ``generation_timestamp`` excluded; each category's non-empty
      contents joined as ``"- <content>\\n\\n- <content>"``.

    Args:
        dedupe_contents: also drop content lines already given by an earlier document of
            the same category (not in seed 000; off by default).
    """
    stacked: dict[str, list[str]] = empty_stacked()
    seen: dict[str, set[str]] = {}
    for doc in docs:
        for t, entries in (doc.get("stacked_grounding") or {}).items():
            bucket, have = stacked.setdefault(t, []), seen.setdefault(t, set())
            for e in entries:
                if e not in have:
                    have.add(e)
                    bucket.append(e)
    final: dict[str, dict[str, str]] = {}
    for key in FINAL_KEYS.values():
        items: list[str] = []
        seen_lines: set[str] = set()
        for doc in docs:
            content = _content((doc.get("final_grounding") or {}).get(key)).strip()
            if dedupe_contents:
                kept = [ln for ln in content.split("\n") if ln.strip() and fact_key(ln) not in seen_lines]
                seen_lines.update(fact_key(ln) for ln in kept)
                content = "\n".join(kept)
            if content:
                items.append(f"- {content}")
        final[key] = {"content": CONTENT_JOINER.join(items)}
    return {"stacked_grounding": stacked, "final_grounding": final}


def _read_grounding_json(path: str, root: str | os.PathLike | None) -> tuple[dict | None, str | None]:
    full = _resolve(path, root)
    try:
        text = full.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, "missing file"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable ({type(exc).__name__}: {exc})"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"corrupt JSON ({exc})"
    except RecursionError:  # "[[[[..." deeper than the parser's stack
        return None, "corrupt JSON (nested too deeply to parse)"
    reason = _check_grounding_doc(doc)
    return (None, reason) if reason else (doc, None)


def _skip(path: str, reason: str, skipped: list[dict]) -> None:
    log.warning("grounding file %s skipped: %s", path, reason)
    skipped.append({"path": path, "reason": reason})


def _merge_json(names: list[str], root: str | os.PathLike | None,
                dedupe_contents: bool) -> tuple[dict | None, list[dict]]:
    docs, sources, skipped = [], [], []
    for name in names:
        doc, reason = _read_grounding_json(name, root)
        if doc is None:
            _skip(name, reason or "unusable", skipped)
            continue
        docs.append(doc)
        sources.append(name)
    if not docs:
        return None, skipped
    merged = merge_grounding_docs(docs, dedupe_contents=dedupe_contents)
    merged["sources"] = sources
    merged["skipped"] = skipped
    return merged, skipped


def _no_usable(what: str, skipped: list[dict]) -> GroundingMergeError:
    return GroundingMergeError(f"no usable {what} among: "
                               + "; ".join(f"{s['path']} ({s['reason']})" for s in skipped))


def merge_grounding_json_files(paths: str | Iterable[str | os.PathLike], *, root: str | os.PathLike | None = None,
                               dedupe_contents: bool = False) -> dict:
    """Merge grounding JSON files (seed 000); a missing or corrupt file is skipped with a warning.

    Args:
        paths: a comma-separated string or a list; relative paths are resolved against
            ``root`` (default: the project root).
        dedupe_contents: see :func:`merge_grounding_docs`.

    Returns:
        ``{"stacked_grounding", "final_grounding", "sources", "skipped"}``: the merged
        content, the files used (as given) and ``[{"path", "reason"}]`` for those skipped.

    Raises:
        GroundingMergeError: no path given, or not one file usable.
    """
    names = split_grounding_paths(paths)
    if not names:
        raise GroundingMergeError("no grounding JSON file given")
    merged, skipped = _merge_json(names, root, dedupe_contents)
    if merged is None:
        raise _no_usable("grounding JSON file", skipped)
    return merged


def shift_markdown_headers(text: str, by: int = 1) -> str:
    """Every ATX header one level deeper (H3 -> H4, ..., capped at H6); code fences untouched."""
    out, fenced = [], False
    for line in text.split("\n"):
        if _FENCE_RE.match(line):
            fenced = not fenced
        elif not fenced:
            m = _HEADER_RE.match(line)
            if m:
                level = min(6, len(m.group(2)) + by)
                line = m.group(1) + "#" * level + line[m.end():]
        out.append(line)
    return "\n".join(out)


def render_grounding_to_markdown(merged: Mapping[str, Any]) -> str:
    """Markdown of a (merged) grounding's ``final_grounding`` for a system prompt.

    One ``### <Title>`` section per non-empty category in seed 000's order, then every
    header shifted one level (H3 -> H4) because the text is embedded in a system prompt
    under its own headers. No trailing newline; ``""`` when every content is empty.

    >>> render_grounding_to_markdown({"final_grounding": {"spatial_grounding": {"content": "- a\\n\\n- b"}}})
    '#### Spatial Grounding\\n\\n- a\\n\\n- b'
    """
    final = merged.get("final_grounding") or {}
    sections = []
    for key, title in SECTION_TITLES.items():
        content = _content(final.get(key)).strip()
        if content:
            sections.append(f"### {title}\n\n{content}")
    return shift_markdown_headers("\n\n".join(sections), 1)


def render_episode_text(doc: Mapping[str, Any]) -> str:
    """The TXT form of one episode's grounding: what its JSON contributes to a prompt."""
    return render_grounding_to_markdown(merge_grounding_docs([doc]))


@dataclass
class MergedGrounding:
    """Result of merging JSON and TXT grounding files (seed 000 "혼합 파일 처리")."""

    content: str  # JSON Markdown + TXT texts, joined with "\n\n---\n\n": $grounding_content
    merged_json: dict | None  # merge_grounding_json_files() result, None without usable JSON
    text_sources: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)

    @property
    def sources(self) -> list[str]:
        return list((self.merged_json or {}).get("sources", [])) + list(self.text_sources)

    def to_dict(self) -> dict:
        merged = dict(self.merged_json or {})
        merged.pop("sources", None)
        merged.pop("skipped", None)
        return {
            "json_sources": list((self.merged_json or {}).get("sources", [])),
            "text_sources": list(self.text_sources),
            "skipped": list(self.skipped),
            "stacked_grounding": merged.get("stacked_grounding", empty_stacked()),
            "final_grounding": merged.get("final_grounding", {k: {"content": ""} for k in FINAL_KEYS.values()}),
            "content": self.content,
        }


def merge_grounding_files(paths: str | Iterable[str | os.PathLike], *, root: str | os.PathLike | None = None,
                          dedupe_contents: bool = False) -> MergedGrounding:
    """Merge any mix of grounding files the way seed 000's ``get_system_prompt`` does.

    ``.json`` files: :func:`merge_grounding_json_files` then :func:`render_grounding_to_markdown`.
    Other files (``.txt``, ``.md``): their text, joined with ``"\\n\\n---\\n\\n"``. Mixed:
    the JSON Markdown, then the TXT text, joined with ``"\\n\\n---\\n\\n"``. Empty parts are
    left out. An unreadable file is skipped with a warning naming it.

    Raises:
        GroundingMergeError: no path given, or not one file usable.
    """
    names = split_grounding_paths(paths)
    if not names:
        raise GroundingMergeError("no grounding file given")
    json_names = [n for n in names if n.lower().endswith(".json")]
    text_names = [n for n in names if not n.lower().endswith(".json")]
    merged_json, skipped = _merge_json(json_names, root, dedupe_contents) if json_names else (None, [])
    skipped = list(skipped)
    texts, text_sources = [], []
    for name in text_names:
        try:
            text = _resolve(name, root).read_text(encoding="utf-8")
        except FileNotFoundError:
            _skip(name, "missing file", skipped)
            continue
        except (OSError, UnicodeDecodeError) as exc:
            _skip(name, f"unreadable ({type(exc).__name__}: {exc})", skipped)
            continue
        text_sources.append(name)
        if text.strip():
            texts.append(text.strip())
    if merged_json is None and not text_sources:
        order = {n: i for i, n in enumerate(names)}
        skipped.sort(key=lambda s: order.get(s["path"], 0))
        raise _no_usable("grounding file", skipped)
    parts = []
    if merged_json is not None:
        md = render_grounding_to_markdown(merged_json)
        if md:
            parts.append(md)
    if texts:
        parts.append(TEXT_JOINER.join(texts))
    return MergedGrounding(content=TEXT_JOINER.join(parts), merged_json=merged_json,
                           text_sources=text_sources, skipped=skipped)


def grounding_content(paths: str | Iterable[str | os.PathLike] | None, *, root: str | os.PathLike | None = None) -> str:
    """``$grounding_content`` for a system prompt: ``""`` when no file is given."""
    if not split_grounding_paths(paths):
        return ""
    return merge_grounding_files(paths, root=root).content


def scene_grounding_content(merged_dir: str | os.PathLike, scene_id: str | None, *,
                            include_configured: bool = True) -> str:
    """``$grounding_content`` of a task of ``scene_id`` from the ``merge`` stage's folder.

    The scene's merged grounding (``<scene_id>.md``, absent for a scene never played in
    training) and, by default, the merge of ``grounding.files`` (``configured.md``),
    joined with ``"\n\n---\n\n"``; ``""`` when both are empty.
    """
    parts = []
    if scene_id:  # <merged_dir>/<scene_id>.md: an id like "../../README" would read another file
        safe_name(scene_id, f"{os.fspath(merged_dir)}/<scene_id>.md", "scene_id")
    names = ([scene_id] if scene_id else []) + ([CONFIGURED_NAME] if include_configured else [])
    for name in names:
        path = Path(merged_dir) / f"{name}.md"
        if path.exists():
            text = path.read_text(encoding="utf-8").strip()
            if text:
                parts.append(text)
    return TEXT_JOINER.join(parts)
