"""Grounding knowledge from typed user feedback (seed 000): capture, generation, files, merging.

One episode's life cycle, as in seed 000 ("Step별 피드백 수집" -> "에피소드 종료 시")::

    >>> gfm = GroundingFileManager(1)
    >>> _ = gfm.append_step_feedback(1, "go east", "Success", {"spatial": "kitchen is green"})
    >>> gfm.get_stacked_grounding()["spatial"]
    ['[ Step1 - Success ] : kitchen is green']
    >>> final = generate_final_grounding(gfm.get_stacked_grounding(), timestamp="2026-01-27T00:00:00+00:00")
    >>> final["spatial_grounding"]
    {'content': 'kitchen is green.'}
    >>> _ = gfm.save_final_grounding(final)   # with out_dir=...: writes the episode files

Merging many files for a system prompt (seed 000 "여러 파일 병합 기능")::

    merged = merge_grounding_json_files("a.json,b.json")        # or ["a.json", "b.json"]
    text = render_grounding_to_markdown(merged)                   # H3 -> H4, "- c1\\n\\n- c2"
    content = merge_grounding_files(["a.json", "notes.txt"]).content   # JSON Markdown + TXT text

File layout written by :func:`write_grounding_files` (no wall-clock time in any name, so
reruns give the same paths and bytes)::

    <out>/episode_<id>/grounding_episode_<id>.json   expr_info, grounding_per_step,
    <out>/episode_<id>/grounding_episode_<id>.txt    stacked_grounding, final_grounding / Markdown
    <out>/grounding_latest.{json,txt}                the newest episode (seed: grounding/grounding_latest.*)
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipeline.core.io import atomic_dir, atomic_write_json, atomic_write_text
from pipeline.core.schemas import FEEDBACK_TYPES, STATUSES

log = logging.getLogger(__name__)

# final_grounding key of each feedback category, in seed 000's order.
FINAL_KEYS: dict[str, str] = {
    "user_preference": "user_preference_grounding",
    "spatial": "spatial_grounding",
    "procedural": "procedural_grounding",
    "general": "general_grounding_rules",
}
# Section titles of the Markdown rendering (H3 before the H3 -> H4 shift).
SECTION_TITLES: dict[str, str] = {
    "user_preference_grounding": "User Preference Grounding",
    "spatial_grounding": "Spatial Grounding",
    "procedural_grounding": "Procedural Grounding",
    "general_grounding_rules": "General Grounding Rules",
}
SAVE_FORMATS = ("json", "txt", "both")
GENERATORS = ("extractive", "llm")
UNKNOWN_POLICIES = ("keep", "reject")
CONTENT_JOINER = "\n\n"  # between "- <content>" items of one category (seed: "- <c>\n\n- <c>")
TEXT_JOINER = "\n\n---\n\n"  # between TXT files, and between JSON Markdown and TXT text
CONFIGURED_NAME = "configured"  # merge stage: <merged dir>/configured.md = merge of grounding.files

# "[ Step12 - Failure ] : " in front of every stacked entry (seed 000).
_STEP_PREFIX_RE = re.compile(r"^\s*\[\s*Step\s*\d+\s*-\s*(?:Success|Failure|WiP)\s*\]\s*:\s*", re.IGNORECASE)
# A statement ends at . ! ? (followed by a space or the end), at a CJK full stop (Chinese
# does not put a space after it), or at a semicolon (how several lines of one type are joined);
# a parenthesis right after a stop belongs to the statement before it ("use. (Fridge_0 ...)").
_SPLIT_RE = re.compile(r"(?<=[.!?])\s+(?![(\[（])|(?<=[。！？])\s*(?![(\[（])|\s*[;；]\s*")
_TERMINAL = ".!?。！？"
_CLOSERS = ")]}\"'）」』”’"
SAFE_NAME_RE = re.compile(r"^(?!\.)[A-Za-z0-9_.\-]+$")  # ids used in file names
_HEADER_RE = re.compile(r"^( {0,3}(?:[-*+] +)?)(#{1,6})(?=\s|$)")  # also "- ### x" (list item)
_FENCE_RE = re.compile(r"^ {0,3}(```|~~~)")


class GroundingError(ValueError):
    """Bad grounding input (status, feedback, config value); the message names it."""


class GroundingMergeError(GroundingError):
    """No usable grounding file among those given (the message names each and why)."""


# --------------------------------------------------------------------------- helpers


def _value(x: Any) -> Any:
    """Plain value of a config enum (``SaveFormat.both`` -> ``"both"``)."""
    return getattr(x, "value", x)


def _choice(value: Any, allowed: Sequence[str], key: str) -> str:
    v = _value(value)
    if v not in allowed:
        raise GroundingError(f"{key}={v!r}: expected one of {' | '.join(allowed)}")
    return v


def empty_stacked() -> dict[str, list[str]]:
    return {t: [] for t in FEEDBACK_TYPES}


def stacked_entry(step_id: int, status: str, text: str) -> str:
    """One ``stacked_grounding`` entry: ``[ Step1 - Success ] : kitchen is green``."""
    return f"[ Step{step_id} - {status} ] : {text}"


def strip_step_prefix(entry: str) -> str:
    """``"[ Step1 - Success ] : kitchen is green"`` -> ``"kitchen is green"``."""
    return _STEP_PREFIX_RE.sub("", entry, count=1)


def grounding_timestamp(config_value: str | None = None) -> str:
    """The ``generation_timestamp``: ``SOURCE_DATE_EPOCH`` when set, else the config value.

    Never the wall clock, so that reruns write identical files (reproducible-builds
    convention: ``SOURCE_DATE_EPOCH`` is seconds since the epoch, UTC).

    Raises:
        GroundingError: ``SOURCE_DATE_EPOCH`` is not an integer, or the config value is
            not an ISO 8601 date-time.
    """
    env = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if env:
        try:
            return datetime.fromtimestamp(int(env), tz=timezone.utc).isoformat()
        except (ValueError, OverflowError, OSError) as exc:
            raise GroundingError(f"SOURCE_DATE_EPOCH={env!r}: expected an integer number of seconds") from exc
    value = "1970-01-01T00:00:00+00:00" if config_value is None else str(config_value)
    try:
        datetime.fromisoformat(value)
    except ValueError as exc:
        raise GroundingError(f"grounding.timestamp={value!r}: expected an ISO 8601 date-time "
                             "such as 2026-01-27T00:00:00+00:00") from exc
    return value


def feedback_from_lines(lines: Iterable[str], unknown: str = "keep", where: str = "") -> dict[str, str | None]:
    """Group ``feedback : <type>: <text>`` lines by type (the parser of :mod:`pipeline.grounding.feedback`).

    Unlike :func:`pipeline.grounding.feedback.classify_feedback_lines`, a *malformed* line is not an
    error under ``unknown="keep"``: it is kept whole under ``general`` with a warning
    naming it (issue 4: never silently dropped); under ``"reject"`` it raises.

    Returns:
        ``{type: text or None}`` for the four types; texts of one type joined with ``"; "``.
    """
    from pipeline.grounding.feedback import FeedbackFormatError, UnknownFeedbackType, parse_feedback_line

    policy = _choice(unknown, UNKNOWN_POLICIES, "grounding.unknown_type")
    grouped: dict[str, list[str]] = {t: [] for t in FEEDBACK_TYPES}
    for line in lines:
        if isinstance(line, str) and not line.strip():
            continue
        try:
            ftype, text = parse_feedback_line(line, unknown=policy, where=where)
        except UnknownFeedbackType:
            raise
        except FeedbackFormatError:
            if policy == "reject" or not isinstance(line, str):
                raise
            at = f"{where}: " if where else ""
            log.warning("%smalformed feedback line %r kept under 'general' (grounding.unknown_type=keep)", at, line)
            ftype, text = "general", " ".join(line.split())
        grouped[ftype].append(text)
    return {t: ("; ".join(v) if v else None) for t, v in grouped.items()}


# --------------------------------------------------------------------------- capture


class GroundingFileManager:
    """Per-episode feedback record and grounding files (seed 000's ``GroundingFileManager``).

    Args:
        episode_id: the episode's id (int as in the seed, or the pipeline's string id);
            it names the episode folder ``episode_<id>`` and files ``grounding_episode_<id>.*``.
        out_dir: where :meth:`save_final_grounding` writes; ``None`` keeps everything in
            memory (the ``ground`` stage writes later, through :func:`write_grounding_files`).
        save_format: ``json`` | ``txt`` | ``both`` (seed's GROUNDING_SAVE_FORMAT).
        unknown_type: ``keep`` (unknown feedback types go under ``general`` with a
            warning) | ``reject`` (a :class:`GroundingError`).
        expr_info: extra ``expr_info`` fields (scene_id, quest_id, ...), after ``episode_id``.
        latest_dirs: folders that also get ``grounding_latest.{json,txt}`` on save.
    """

    def __init__(self, episode_id: int | str, *, out_dir: str | os.PathLike | None = None,
                 save_format: str = "both", unknown_type: str = "keep",
                 expr_info: Mapping[str, Any] | None = None, latest_dirs: Iterable[str | os.PathLike] = ()):
        if isinstance(episode_id, bool) or not isinstance(episode_id, (int, str)) \
                or not SAFE_NAME_RE.match(str(episode_id)):
            raise GroundingError(f"episode_id={episode_id!r}: expected an int or a string of letters, digits, "
                                 "'_', '-', '.'")
        self.episode_id = episode_id
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.save_format = _choice(save_format, SAVE_FORMATS, "grounding.save_format")
        self.unknown_type = _choice(unknown_type, UNKNOWN_POLICIES, "grounding.unknown_type")
        self.latest_dirs = [Path(d) for d in latest_dirs]
        self.expr_info: dict[str, Any] = {"episode_id": episode_id}
        for k, v in (expr_info or {}).items():
            if k != "episode_id":
                self.expr_info[k] = v
        self.grounding_per_step: list[dict] = []
        self.stacked_grounding: dict[str, list[str]] = empty_stacked()
        self.final_grounding: dict | None = None

    def append_step_feedback(self, step_id: int, instruction: str | None, status: str,
                             feedback: Mapping[str, str | None] | Sequence[str] | str | None) -> dict:
        """Record one step's feedback and stack it per type (seed 000).

        Args:
            step_id: the step number (1 for the first step; shown as ``Step1``).
            instruction: what was asked/done at this step (the executed command).
            status: ``"Success"`` | ``"Failure"`` | ``"WiP"``.
            feedback: ``{"user_preference": ..., "spatial": ..., ...}`` (missing keys and
                empty texts are ``None``), or ``feedback : <type>: <text>`` line(s).

        Returns:
            The ``grounding_per_step`` record that was appended.

        Raises:
            GroundingError: bad status, step id, feedback value, or an unknown feedback
                type with ``unknown_type="reject"``.
        """
        if isinstance(step_id, bool) or not isinstance(step_id, int) or step_id < 0:
            raise GroundingError(f"step_id={step_id!r}: expected a non-negative int")
        if status not in STATUSES:
            raise GroundingError(f"step {step_id}: status={status!r}: expected one of {' | '.join(STATUSES)}")
        if instruction is not None and not isinstance(instruction, str):
            raise GroundingError(f"step {step_id}: instruction={instruction!r}: expected a string or None")
        per_type = self._normalise_feedback(step_id, feedback)
        record = {"step_id": step_id, "instruction": instruction, "status": status, "feedback": per_type}
        self.grounding_per_step.append(record)
        for ftype in FEEDBACK_TYPES:
            if per_type[ftype] is not None:
                self.stacked_grounding[ftype].append(stacked_entry(step_id, status, per_type[ftype]))
        return copy.deepcopy(record)

    def _normalise_feedback(self, step_id: int, feedback: Any) -> dict[str, str | None]:
        if feedback is None:
            return {t: None for t in FEEDBACK_TYPES}
        if isinstance(feedback, str):
            feedback = [feedback]
        if isinstance(feedback, Sequence):
            try:
                return feedback_from_lines(feedback, self.unknown_type, where=f"step {step_id}")
            except ValueError as exc:
                raise GroundingError(str(exc)) from exc
        if not isinstance(feedback, Mapping):
            raise GroundingError(f"step {step_id}: feedback={feedback!r}: expected a dict of the four types or lines")
        out: dict[str, str | None] = {t: None for t in FEEDBACK_TYPES}
        extra: list[str] = []
        for key, text in feedback.items():
            if text is not None and not isinstance(text, str):
                raise GroundingError(f"step {step_id}: feedback[{key!r}]={text!r}: expected a string or None")
            text = text.strip() if text else None
            if key in FEEDBACK_TYPES:
                out[key] = text or None
            elif text:
                if self.unknown_type == "reject":
                    raise GroundingError(f"step {step_id}: unknown feedback type {key!r}: expected one of "
                                         f"{' | '.join(FEEDBACK_TYPES)} (grounding.unknown_type=reject)")
                log.warning("step %s: unknown feedback type %r kept under 'general' (grounding.unknown_type=keep)",
                            step_id, key)
                extra.append(f"{key}: {text}")
        if extra:
            out["general"] = "; ".join(([out["general"]] if out["general"] else []) + extra)
        return out

    def get_stacked_grounding(self) -> dict[str, list[str]]:
        """The stacked grounding of this episode: ``{type: ["[ StepN - Status ] : text", ...]}``."""
        return copy.deepcopy(self.stacked_grounding)

    def generate_final_grounding(self, generator: str = "extractive", *, generate: Callable[[str], str] | None = None,
                                 timestamp: str | None = None) -> dict:
        """Seed 000's ``_generate_grounding_from_episode``: this episode's feedback only.

        Records which generator ran (and why the llm one fell back) in ``expr_info``.
        """
        final, info = generate_grounding(self.get_stacked_grounding(), generator, generate=generate,
                                         timestamp=timestamp)
        self.expr_info.update(info)
        return final

    def save_final_grounding(self, final_grounding: Mapping[str, Any]) -> list[Path]:
        """Store ``final_grounding`` and, with ``out_dir``, write the episode and latest files.

        Returns:
            The paths written (empty without ``out_dir``).

        Raises:
            GroundingError: ``final_grounding`` lacks a key or a content is not a string.
        """
        self.final_grounding = validate_final_grounding(final_grounding, "final_grounding")
        if self.out_dir is None:
            return []
        doc = self.to_dict()
        paths = write_grounding_files(doc, self.out_dir, self.save_format)
        for d in self.latest_dirs:
            paths += write_latest_files(doc, d, self.save_format)
        return paths

    def to_dict(self) -> dict:
        """The episode's grounding document, keys in seed 000's order."""
        doc = {
            "expr_info": copy.deepcopy(self.expr_info),
            "grounding_per_step": copy.deepcopy(self.grounding_per_step),
            "stacked_grounding": self.get_stacked_grounding(),
        }
        if self.final_grounding is not None:
            doc["final_grounding"] = copy.deepcopy(self.final_grounding)
        return doc


def validate_final_grounding(final: Any, where: str) -> dict:
    """Check and copy a ``final_grounding`` dict into seed 000's key order."""
    if not isinstance(final, Mapping):
        raise GroundingError(f"{where}: expected a dict, got {type(final).__name__}")
    out: dict[str, Any] = {"generation_timestamp": final.get("generation_timestamp")}
    for key in FINAL_KEYS.values():
        item = final.get(key)
        if not isinstance(item, Mapping) or not isinstance(item.get("content"), str):
            raise GroundingError(f"{where}.{key}: expected {{\"content\": <string>}}, got {item!r}")
        out[key] = {"content": item["content"]}
    return out


# --------------------------------------------------------------------------- generation


def _finish_statement(s: str) -> str:
    core = s.rstrip(_CLOSERS)
    if core and core[-1] in _TERMINAL:  # "done." and "(not as asked.)" are finished
        return s
    # A CJK sentence ends with a full-width stop; everything else (Korean included) with "."
    return s + ("。" if "\u3040" <= s[-1] <= "\u9fff" else ".")


def _fact_key(s: str) -> str:
    return " ".join(s.casefold().split()).rstrip(_TERMINAL + " ")


def extract_statements(entries: Iterable[str]) -> list[str]:
    """Step prefixes stripped, split into statements, duplicates removed (first kept).

    >>> extract_statements(["[ Step1 - Success ] : kitchen is green",
    ...                     "[ Step2 - WiP ] : Kitchen is green.  The fridge is cold"])
    ['kitchen is green.', 'The fridge is cold.']
    """
    seen: set[str] = set()
    out: list[str] = []
    for entry in entries:
        for part in _SPLIT_RE.split(strip_step_prefix(entry)):
            s = " ".join(part.split()).strip(";；")
            if not s.strip(_TERMINAL + " "):
                continue
            key = _fact_key(s)
            if key not in seen:
                seen.add(key)
                out.append(_finish_statement(s))
    return out


def empty_final_grounding(timestamp: str) -> dict:
    return {"generation_timestamp": timestamp, **{k: {"content": ""} for k in FINAL_KEYS.values()}}


def extractive_final_grounding(stacked: Mapping[str, Sequence[str]], timestamp: str) -> dict:
    """Deterministic grounding: one statement per line and fact, grouped per category."""
    final = empty_final_grounding(timestamp)
    for ftype, key in FINAL_KEYS.items():
        final[key]["content"] = "\n".join(extract_statements(stacked.get(ftype, [])))
    return final


def llm_grounding_prompt(stacked: Mapping[str, Sequence[str]]) -> str:
    """The request sent to the text-generation backend (current episode's feedback only)."""
    feedback = json.dumps({t: list(stacked.get(t, [])) for t in FEEDBACK_TYPES}, ensure_ascii=False, indent=2)
    keys = ", ".join(f'"{k}": "..."' for k in FINAL_KEYS.values())
    return (
        "You turn a user's feedback on an agent's steps in a household game into grounding knowledge "
        "for the agent's next episodes.\n"
        "Feedback of this episode by category (each entry: [ Step<N> - <status> ] : <text>):\n"
        f"{feedback}\n"
        "Answer with one JSON object and nothing else, with these keys, each a string of short, clear "
        "statements (one per line and fact, no step numbers, \"\" when there is nothing):\n"
        f"{{{keys}}}\n"
    )


# Accepted spellings of each final_grounding key in a model's answer.
_KEY_ALIASES: dict[str, str] = {}
for _ftype, _key in FINAL_KEYS.items():
    for _alias in (_key, _ftype, f"{_ftype}s", f"{_ftype}_grounding", f"{_ftype}_rules", f"{_ftype}_grounding_rules"):
        _KEY_ALIASES[_alias] = _key


def _json_objects(text: str) -> Iterable[Any]:
    """Every JSON value that starts at a ``{`` of ``text``, in order (prose, fences ignored)."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        yield obj


def parse_llm_grounding(text: str, stacked: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """The four contents from a model's answer, or :class:`GroundingError` with the reason.

    Accepts prose or code fences around the JSON, values as strings, ``{"content": ...}``
    or lists of strings, and short key names (``"spatial"``). A key may be missing only
    when its category had no feedback.
    """
    if not isinstance(text, str) or not text.strip():
        raise GroundingError("the backend returned an empty answer")
    found_object = False
    for obj in _json_objects(text):
        if not isinstance(obj, dict):
            continue
        found_object = True
        contents: dict[str, str] = {}
        for raw_key, value in obj.items():
            key = _KEY_ALIASES.get(re.sub(r"[\s\-]+", "_", str(raw_key).strip().lower()))
            if key is None:
                continue
            if isinstance(value, Mapping):
                value = value.get("content")
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = "\n".join(v.strip() for v in value if v.strip())
            if value is None:
                value = ""
            if not isinstance(value, str):
                raise GroundingError(f"the answer's {raw_key!r} is a {type(value).__name__}, expected a string")
            contents[key] = value.strip()
        if not contents:
            continue
        missing = [k for t, k in FINAL_KEYS.items() if k not in contents and stacked.get(t)]
        if missing:
            raise GroundingError(f"the answer's JSON lacks {', '.join(missing)}")
        return {k: contents.get(k, "") for k in FINAL_KEYS.values()}
    if found_object:
        raise GroundingError("no JSON object in the answer has grounding keys")
    raise GroundingError("no JSON object in the answer")


def generate_grounding(stacked: Mapping[str, Sequence[str]], generator: str = "extractive", *,
                       generate: Callable[[str], str] | None = None,
                       timestamp: str | None = None) -> tuple[dict, dict]:
    """``final_grounding`` from one episode's stacked grounding, and how it was made.

    Args:
        stacked: the episode's ``stacked_grounding`` (earlier groundings never enter).
        generator: ``extractive`` (deterministic) or ``llm`` (asks ``generate``; on any
            failure the extractive result is used and the reason recorded).
        generate: the text-generation backend, ``generate(prompt) -> text`` (llm only).
        timestamp: ``generation_timestamp``; see :func:`grounding_timestamp`.

    Returns:
        ``(final_grounding, info)`` with ``info = {"generator", "generator_used",
        "fallback_reason"}`` (the reason is ``None`` when nothing fell back).
    """
    generator = _choice(generator, GENERATORS, "grounding.generator")
    ts = grounding_timestamp(timestamp)
    info: dict[str, Any] = {"generator": generator, "generator_used": "extractive", "fallback_reason": None}
    extractive = extractive_final_grounding(stacked, ts)
    if generator == "extractive":
        return extractive, info
    if not any(stacked.get(t) for t in FEEDBACK_TYPES):
        info["fallback_reason"] = "no feedback in this episode: the backend was not asked"
        return extractive, info
    if generate is None:
        raise GroundingError("grounding.generator=llm needs a text-generation backend (model.name_or_path or "
                             "model.base_url); none was given")
    try:
        answer = generate(llm_grounding_prompt(stacked))
    except Exception as exc:  # any backend failure falls back; the reason is kept
        info["fallback_reason"] = f"backend error: {type(exc).__name__}: {exc}"
        return extractive, info
    try:
        contents = parse_llm_grounding(answer, stacked)
    except GroundingError as exc:
        info["fallback_reason"] = f"unparseable answer: {exc}"
        return extractive, info
    final = empty_final_grounding(ts)
    for key, content in contents.items():
        final[key]["content"] = content
    info["generator_used"] = "llm"
    return final, info


def generate_final_grounding(stacked: Mapping[str, Sequence[str]], generator: str = "extractive", *,
                             generate: Callable[[str], str] | None = None, timestamp: str | None = None) -> dict:
    """Only the ``final_grounding`` of :func:`generate_grounding`."""
    return generate_grounding(stacked, generator, generate=generate, timestamp=timestamp)[0]


# --------------------------------------------------------------------------- merging


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
        from pipeline.core.config import project_root

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
                kept = [ln for ln in content.split("\n") if ln.strip() and _fact_key(ln) not in seen_lines]
                seen_lines.update(_fact_key(ln) for ln in kept)
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
    names = ([scene_id] if scene_id else []) + ([CONFIGURED_NAME] if include_configured else [])
    for name in names:
        path = Path(merged_dir) / f"{name}.md"
        if path.exists():
            text = path.read_text(encoding="utf-8").strip()
            if text:
                parts.append(text)
    return TEXT_JOINER.join(parts)


# --------------------------------------------------------------------------- files


def episode_dir_name(episode_id: int | str) -> str:
    return f"episode_{episode_id}"


def episode_file_stem(episode_id: int | str) -> str:
    return f"grounding_episode_{episode_id}"


def _write_doc(doc: Mapping[str, Any], stem: Path, save_format: str) -> list[Path]:
    save_format = _choice(save_format, SAVE_FORMATS, "grounding.save_format")
    paths = []
    if save_format in ("json", "both"):
        # Seed 000's key order, not sorted: the file reads like the seed's example.
        paths.append(atomic_write_json(stem.with_name(stem.name + ".json"), doc, sort_keys=False))
    if save_format in ("txt", "both"):
        text = render_episode_text(doc)
        paths.append(atomic_write_text(stem.with_name(stem.name + ".txt"), text + "\n" if text else ""))
    return paths


def write_grounding_files(doc: Mapping[str, Any], out_dir: str | os.PathLike, save_format: str = "both") -> list[Path]:
    """``<out_dir>/episode_<id>/grounding_episode_<id>.{json,txt}`` (atomic writes)."""
    episode_id = doc["expr_info"]["episode_id"]
    if not SAFE_NAME_RE.match(str(episode_id)):
        raise GroundingError(f"episode_id={episode_id!r}: not usable in a file name")
    folder = Path(out_dir) / episode_dir_name(episode_id)
    return _write_doc(doc, folder / episode_file_stem(episode_id), save_format)


def write_latest_files(doc: Mapping[str, Any], out_dir: str | os.PathLike, save_format: str = "both") -> list[Path]:
    """``<out_dir>/grounding_latest.{json,txt}``: the newest episode's grounding."""
    return _write_doc(doc, Path(out_dir) / "grounding_latest", save_format)


# Yield an empty folder beside a stage's output folder; on success it replaces it whole, so
# files of episodes that no longer exist never linger and a failure leaves the previous
# folder untouched (the shared implementation, :func:`pipeline.core.io.atomic_dir`).
replace_dir = atomic_dir
