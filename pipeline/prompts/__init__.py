"""System prompt templates and the memory renderer (seed 002; seed 000's prompt API).

Templates are plain text files (``conf/templates/*.txt``) with four kinds of slots, all
*substituted, never evaluated*::

    $name  ${name}             a variable (objective, grounding_content, memory_slot, ...)
    $memory[key][sub]...       a value of the memory dict, any depth, keys [a-zA-Z0-9_-]+
    $$                         a literal dollar sign

Example:
    >>> system_prompt_interp("Goal: $objective\\nPlan: $memory[plan]",
    ...                      {"objective": "Put Apple_2 in Fridge_0"},
    ...                      memory={"plan": ["open Fridge_0", "put Apple_2"]})
    'Goal: Put Apple_2 in Fridge_0\\nPlan: - open Fridge_0\\n- put Apple_2'

A missing plain variable is an error naming it and the template (strict by default). A
missing ``$memory[...]`` key at any level renders as ``"None"`` (configurable), prints a
strong warning on stderr and logs ``logging.warning`` with the template and the key path.

Values are inserted once: text coming from a variable or the memory dict is never
scanned for slots again, so user feedback or model output containing ``$x`` cannot
inject anything.

Per-episode and per-turn rendering. The ``render`` stage renders, per task, everything
that is fixed for an episode (objective, grounding, the advisory slot) and *keeps* the
per-turn slots (the observation fields in :data:`TURN_VARIABLES` and ``$memory[...]``)
as they are, escaping any ``$`` in the inserted text. That "frozen" prompt is what the
parquet stores; at each turn the agent calls :func:`render_turn_prompt` (or
``PromptOrganizer.render_turn``) with the observation and the memory dict, which gives
exactly the text a one-pass render of the template would give.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

logger = logging.getLogger(__name__)

#: Observation fields a template may show; they change every turn, so a frozen
#: (per-episode) prompt keeps them as slots. See :func:`observation_variables`.
TURN_VARIABLES: tuple[str, ...] = (
    "step",
    "max_steps",
    "agent_location",
    "agent_inventory",
    "visible_entities",
    "available_actions",
    "admissible_commands",
    "description",
)

#: What the renderer writes for a container nested deeper than ``max_depth`` when even
#: its compact JSON cannot be produced (a reference cycle, an unserialisable key).
DEPTH_CAP_PLACEHOLDER = "..."

DEFAULT_SLOT_HEADING = "## Episodic Memory (advisories from similar past episodes)"


class PromptTemplateError(ValueError):
    """A template that cannot be rendered (missing variable, malformed slot, bad file)."""


# --------------------------------------------------------------------------------------
# Memory renderer (seed 002 section 3)
# --------------------------------------------------------------------------------------


def render_memory_value(
    value: Any,
    *,
    empty_value: str = "None",
    none_value: str = "None",
    max_depth: int = 8,
    _depth: int = 0,
) -> str:
    """Render a memory value as readable text, by seed 002 section 3's rules.

    - ``str``: as is; ``""`` -> ``empty_value``.
    - ``list`` / ``tuple``: one ``- item`` line per item; an item that renders to several
      lines (a dict, a nested list, a multi-line string) keeps its first line after
      ``- `` and indents its other lines by two spaces. An empty list -> ``empty_value``.
    - ``dict``: ``key: value`` lines, values rendered recursively; a multi-line value
      follows ``key: `` directly (seed 002 4.2's ``subgoals: - subgoal_id: 1``). An empty
      dict -> ``empty_value``.
    - ``bool`` / numbers: ``str(value)`` (``True``, ``3``, ``0.5``); ``None`` -> ``none_value``.
    - A list or dict nested ``max_depth`` levels deep (the top value is level 0) is
      written as compact JSON instead of being expanded; if even that fails (reference
      cycle), as :data:`DEPTH_CAP_PLACEHOLDER`.

    Never raises, whatever the value.

    Example:
        >>> print(render_memory_value({"status": "ok", "steps": ["a", {"id": 1, "t": "b"}]}))
        status: ok
        steps: - a
        - id: 1
          t: b
    """
    return _render_value(value, empty_value, none_value, max_depth, _depth)


def _render_value(value: Any, empty: str, none: str, max_depth: int, depth: int) -> str:
    # Positional recursion (no kwargs dicts): this runs for every memory slot every turn.
    if type(value) is str:
        return value if value else empty
    if value is None:
        return none
    if isinstance(value, str):
        return str.__str__(value) or empty
    if isinstance(value, (bool, int, float)):
        return _safe_str(value)  # str() of an int over 4300 digits raises ValueError
    if isinstance(value, (list, tuple, dict)):
        if depth >= max_depth:
            return _compact_json(value)
        if not value:
            return empty
        depth += 1
        if isinstance(value, dict):
            return "\n".join(f"{k if type(k) is str else _safe_str(k)}: {_render_value(v, empty, none, max_depth, depth)}"
                             for k, v in value.items())
        return "\n".join("- " + _render_value(item, empty, none, max_depth, depth).replace("\n", "\n  ")
                         for item in value)
    return _safe_str(value)


def _compact_json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_safe_str)
    except (ValueError, TypeError, RecursionError):
        return DEPTH_CAP_PLACEHOLDER


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:  # a foreign object whose __str__ fails must not break a prompt
        return f"<unrenderable {type(value).__name__}>"


# --------------------------------------------------------------------------------------
# Template substitution (seed 002 section 2)
# --------------------------------------------------------------------------------------

# One scanner for every slot. Order matters: `$$` first; `$memory[...]` before a plain
# `$memory...` name; a `$memory[` that is not a well-formed chain of [key] is reported
# rather than half-substituted; anything else after `$` is an invalid slot.
_SLOT = re.compile(
    r"""\$(?:
        (?P<esc>\$)
      | memory(?P<mem>(?:\[[A-Za-z0-9_-]+\])+)(?!\[)
      | (?P<badmem>memory\[)
      | \{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}
      | (?P<named>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<invalid>\{[^}\n]{0,60}\}?|)
    )""",
    re.VERBOSE,
)
_MEM_KEY = re.compile(r"\[([A-Za-z0-9_-]+)\]")

# Segment kinds of a compiled template.
_LIT, _VAR, _MEM, _ESC, _BAD = range(5)


@dataclass(frozen=True)
class _Segment:
    kind: int
    value: Any  # literal text | variable name | tuple of memory keys | error message
    raw: str  # the slot exactly as written in the template
    line: int  # 1-based line of the slot in the template


@functools.lru_cache(maxsize=512)
def _compile(template: str) -> tuple[_Segment, ...]:
    """Split a template into literal text and slots (cached: templates are few)."""
    segments: list[_Segment] = []
    pos = 0
    for m in _SLOT.finditer(template):
        if m.start() > pos:
            segments.append(_Segment(_LIT, template[pos : m.start()], "", 0))
        line = template.count("\n", 0, m.start()) + 1
        raw = m.group(0)
        if m.group("esc") is not None:
            segments.append(_Segment(_ESC, "$", raw, line))
        elif m.group("mem") is not None:
            segments.append(_Segment(_MEM, tuple(_MEM_KEY.findall(m.group("mem"))), raw, line))
        elif m.group("badmem") is not None:
            shown = template[m.start() : m.start() + 40].split("\n")[0]
            segments.append(_Segment(_BAD, f"malformed memory slot {shown!r}: expected "
                                           "$memory[key][sub]... with keys of [a-zA-Z0-9_-]", raw, line))
        elif m.group("braced") is not None:
            segments.append(_Segment(_VAR, m.group("braced"), raw, line))
        elif m.group("named") is not None:
            segments.append(_Segment(_VAR, m.group("named"), raw, line))
        else:
            shown = template[m.start() : m.start() + 30].split("\n")[0]
            segments.append(_Segment(_BAD, f"invalid slot {shown!r}: expected $name, ${{name}}, "
                                           "$memory[key]... or $$ for a literal dollar", raw, line))
        pos = m.end()
    if pos < len(template):
        segments.append(_Segment(_LIT, template[pos:], "", 0))
    return tuple(segments)


def template_slots(template: str) -> tuple[set[str], set[tuple[str, ...]]]:
    """The variable names and memory key paths a template refers to."""
    names, paths = set(), set()
    for seg in _compile(template):
        if seg.kind == _VAR:
            names.add(seg.value)
        elif seg.kind == _MEM:
            paths.add(seg.value)
    return names, paths


_MISSING = object()


def _lookup(memory: Any, keys: tuple[str, ...]) -> tuple[Any, int]:
    """Follow ``keys`` into the memory dict; returns (value, -1) or (_MISSING, level)."""
    cur = memory
    for level, key in enumerate(keys):
        if isinstance(cur, Mapping) and key in cur:
            cur = cur[key]
        elif isinstance(cur, (list, tuple)) and key.isdigit() and int(key) < len(cur):
            cur = cur[int(key)]  # $memory[subgoals][0]: a digit key indexes a list
        else:
            return _MISSING, level
    return cur, -1


def _warn_missing_memory(template_name: str, seg: _Segment, level: int, rendered_as: str) -> None:
    keys = seg.value
    parent = "$memory" + "".join(f"[{k}]" for k in keys[:level])
    msg = (f"missing memory key {seg.raw} in template {template_name} line {seg.line}: "
           f"no key {keys[level]!r} under {parent}; rendered as {rendered_as!r}")
    # The strong terminal warning the seed asks for, besides the log record: a prompt
    # silently carrying "None" is the kind of bug that wastes a whole run.
    bold = sys.stderr.isatty() and not os.environ.get("NO_COLOR")
    banner = f"\033[1;31m!!! PROMPT MEMORY WARNING: {msg}\033[0m" if bold else f"!!! PROMPT MEMORY WARNING: {msg}"
    print(banner, file=sys.stderr)
    logger.warning("%s", msg, extra={"template": template_name, "memory_key_path": list(keys)})


def _format_variable(value: Any, empty_value: str, max_depth: int) -> str:
    if isinstance(value, str):
        return value  # an empty variable stays empty (an unexposed memory slot is "")
    return render_memory_value(value, empty_value=empty_value, max_depth=max_depth)


def system_prompt_interp(
    template: str,
    variables: Mapping[str, Any] | None = None,
    memory: Mapping[str, Any] | None = None,
    *,
    template_name: str = "<template>",
    strict: bool = True,
    missing_memory_value: str = "None",
    empty_string_value: str = "None",
    max_depth: int = 8,
    keep: Iterable[str] = (),
    keep_memory: bool = False,
) -> str:
    """Substitute ``$name``, ``${name}``, ``$memory[...]`` and ``$$`` in a template.

    Args:
        template: The template text.
        variables: Values of the plain variables; a non-string value is rendered with
            :func:`render_memory_value` (lists as bullets, dicts as ``key: value``).
        memory: The memory dict that ``$memory[key][sub]...`` reads (None: empty).
        template_name: Shown in errors and warnings (the template's file path).
        strict: A missing variable or an invalid slot raises :class:`PromptTemplateError`;
            when False they are left in the text as written, with a warning.
        missing_memory_value: What a missing memory key renders as.
        empty_string_value: What an empty string inside the memory renders as.
        max_depth: Recursion cap of the memory renderer.
        keep: Variable names to leave as slots (a per-episode "frozen" render).
        keep_memory: Leave ``$memory[...]`` slots as they are (frozen render).

    Returns:
        The rendered text. With ``keep``/``keep_memory``, a text that is itself a
        template: inserted values have ``$`` escaped as ``$$`` and ``$$`` stays ``$$``,
        so rendering it again with the kept values gives the one-pass result.

    Raises:
        PromptTemplateError: strict mode, a variable missing from ``variables`` or a
            malformed slot; the message names the slot, the line and the template.
    """
    variables = variables if variables is not None else {}
    memory = memory if memory is not None else {}
    keep = frozenset(keep)
    frozen = bool(keep) or keep_memory
    out: list[str] = []
    append = out.append
    for seg in _compile(template):
        kind = seg.kind
        if kind == _LIT:
            append(seg.value)
        elif kind == _VAR:
            name = seg.value
            if name in keep:
                append(seg.raw)
                continue
            value = variables.get(name, _MISSING)
            if value is _MISSING:
                if strict:
                    given = ", ".join(sorted(variables)) or "none"
                    raise PromptTemplateError(
                        f"template {template_name} line {seg.line}: missing variable {seg.raw} "
                        f"(variables given: {given})")
                logger.warning("template %s line %d: missing variable %s left as is", template_name, seg.line, seg.raw)
                append(seg.raw.replace("$", "$$") if frozen else seg.raw)
                continue
            text = _format_variable(value, empty_string_value, max_depth)
            append(text.replace("$", "$$") if frozen else text)
        elif kind == _MEM:
            if keep_memory:
                append(seg.raw)
                continue
            value, level = _lookup(memory, seg.value)
            if value is _MISSING:
                _warn_missing_memory(template_name, seg, level, missing_memory_value)
                text = missing_memory_value
            else:
                text = render_memory_value(value, empty_value=empty_string_value, max_depth=max_depth)
            append(text.replace("$", "$$") if frozen else text)
        elif kind == _ESC:
            append("$$" if frozen else "$")
        else:  # _BAD
            if strict:
                raise PromptTemplateError(f"template {template_name} line {seg.line}: {seg.value}")
            logger.warning("template %s line %d: %s; left as is", template_name, seg.line, seg.value)
            append(seg.raw.replace("$", "$$") if frozen else seg.raw)
    return "".join(out)


def load_template(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """Read a template file (relative paths are taken from the project root).

    Raises:
        PromptTemplateError: missing or unreadable file, or a relative path that climbs
            out of the project root with ``..`` (a template outside the project is read
            only when its absolute path is given explicitly).
    """
    p = Path(path)
    if not p.is_absolute():
        base = Path(root or _project_root())
        norm = os.path.normpath(p)
        if norm == os.pardir or norm.startswith(os.pardir + os.sep):
            raise PromptTemplateError(f"template path {os.fspath(path)!r} climbs out of the project root {base} "
                                      "with '..': give its absolute path to use a template outside the project")
        p = base / p
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PromptTemplateError(f"template file {p} does not exist (set prompts.system_template / "
                                  "prompts.entropy_template to a file under conf/templates/)") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptTemplateError(f"cannot read template file {p}: {exc}") from exc


def _project_root() -> Path:
    from pipeline.core.config import project_root

    return project_root()


# --------------------------------------------------------------------------------------
# Observation fields, memory slot, model responses
# --------------------------------------------------------------------------------------


def _join(items: Any, empty: str = "nothing") -> str:
    if items is None:
        return empty
    if isinstance(items, str):
        return items or empty
    items = [_safe_str(i) for i in items]
    return ", ".join(items) if items else empty


def observation_variables(observation: Mapping[str, Any] | None) -> dict[str, str]:
    """The :data:`TURN_VARIABLES` of an observation dict (contracts' observation shape).

    Lists are written comma-separated (``Cabinet_0, Drawer_1``), an empty one as
    ``nothing``; a missing field as ``unknown``, so a template always renders.
    """
    obs = observation or {}
    return {
        "step": _safe_str(obs.get("step", "unknown")),
        "max_steps": _safe_str(obs.get("max_steps", "unknown")),
        "agent_location": _safe_str(obs.get("agent_location") or "unknown"),
        "agent_inventory": _join(obs.get("agent_inventory")),
        "visible_entities": _join(obs.get("visible_entities")),
        "available_actions": _join(obs.get("available_actions")),
        "admissible_commands": _join(obs.get("admissible_commands")),
        "description": _safe_str(obs.get("description") or "unknown"),
    }


def _plain(obj: Any) -> Any:
    """A pydantic model / OmegaConf node / dataclass as plain JSON-able Python."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return OmegaConf.to_container(obj, resolve=True, enum_to_str=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return obj


def render_memory_slot(
    bundle: Any,
    *,
    slot_name: str = "DEBATE_CONTEXT__MEMORY",
    exposed: bool,
    heading: str = DEFAULT_SLOT_HEADING,
) -> str:
    """The advisory block put into ``$memory_slot`` (seed 001 section 2.1).

    The bundle (``AdvisoryBundleV1_1`` or its dict) is merged into the context under
    ``slot_name`` as JSON only when it is exposed (C2 with the gate passed); otherwise the
    block is empty, so the model sees nothing of it (C1, C2_silent, a refused gate). The
    JSON is written as :func:`pipeline.memory.injection.block_text` writes it (indented,
    key-sorted, UTF-8 kept), so the placebo's length matching holds for the prompt text.

    Returns:
        ``"<heading>\\n{"<slot_name>": {...}}\\n\\n"`` or ``""`` (templates put
        ``${memory_slot}`` at the start of the line after a blank one).
    """
    if not exposed or bundle is None:
        return ""
    block = json.dumps({slot_name: _plain(bundle)}, ensure_ascii=False, indent=2, sort_keys=True)
    return memory_slot_text(block, heading=heading)


def memory_slot_text(block: str, *, heading: str = DEFAULT_SLOT_HEADING) -> str:
    """``$memory_slot`` for an injected block (the context JSON); ``""`` for no block."""
    if not block:
        return ""
    return f"{heading}\n{block}\n\n" if heading else f"{block}\n\n"


def iter_json_objects(text: str) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(start, end, obj)`` for each top-level JSON object in free text.

    Braces are counted outside JSON strings (escape-aware); a balanced span that does not
    parse is skipped and scanning resumes after its opening brace.
    """
    i, n = 0, len(text)
    while True:
        start = text.find("{", i)
        if start < 0:
            return
        depth, in_str, esc, j = 0, False, False, start
        end = -1
        while j < n:
            c = text[j]
            if in_str:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    end = j + 1
                    break
            j += 1
        if end < 0:
            return  # unbalanced: the rest of the text holds no complete object
        try:
            obj = json.loads(text[start:end])
        except (json.JSONDecodeError, RecursionError):
            i = start + 1
            continue
        yield start, end, obj
        i = end


def extract_json_object(text: str) -> dict | None:
    """The first JSON object (a dict) in a model's output, or None."""
    for _, _, obj in iter_json_objects(text):
        if isinstance(obj, dict):
            return obj
    return None


def memory_from_response(response: Any) -> dict | None:
    """The ``memory`` object of a model response (parsed dict or raw text), else None."""
    if isinstance(response, str):
        response = extract_json_object(response)
    if isinstance(response, Mapping):
        mem = response.get("memory")
        if isinstance(mem, Mapping):
            return dict(mem)
    return None


# --------------------------------------------------------------------------------------
# Verbalized entropy (seed 000's get_verbalized_entropy_system_prompt)
# --------------------------------------------------------------------------------------

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
    return " ".join(_safe_str(c).split())


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
    for _, _, obj in iter_json_objects(text or ""):
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


# --------------------------------------------------------------------------------------
# Grounding content ($grounding_content, seed 000)
# --------------------------------------------------------------------------------------


def split_grounding_paths(grounding_file_path: str | Sequence[str] | None) -> list[str]:
    """Seed 000's GROUNDING_FILE_PATH (a comma-separated string, a list, or None) as a list."""
    from pipeline import grounding

    return grounding.split_grounding_paths(grounding_file_path)


def merge_grounding_content(paths: str | Sequence[str] | None, *, root: str | os.PathLike | None = None) -> str:
    """Merge grounding files into the ``$grounding_content`` text (seed 000's merge).

    Delegates to :func:`pipeline.grounding.grounding_content`: JSON files through
    ``merge_grounding_json_files`` + ``render_grounding_to_markdown`` (H3 -> H4), TXT /
    Markdown files joined with ``"\\n\\n---\\n\\n"``, mixed inputs joined the same way; a
    corrupt file is skipped with a warning, all files unusable is an error.
    """
    from pipeline import grounding

    return grounding.grounding_content(paths, root=root)


# --------------------------------------------------------------------------------------
# PromptOrganizer (seed 000 / seed 002 API)
# --------------------------------------------------------------------------------------


def _cfg_get(cfg: Any, key: str, default: Any) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    try:
        value = getattr(cfg, key)
    except AttributeError:
        return default
    return default if value is None and default is not None else value


class PromptOrganizer:
    """Holds the memory dict and renders system prompts (seed 000 / seed 002 names).

    Example:
        >>> org = PromptOrganizer({"system_template": "conf/templates/system_compact.txt"})  # doctest: +SKIP
        >>> org.set_variables(objective="Put Apple_2 in Fridge_0", scene="scene_0")  # doctest: +SKIP
        >>> org.update_memory_from_response('{"action": "look", "target": null, '  # doctest: +SKIP
        ...                                 '"memory": {"previous_action": "look"}}')
        >>> text = org.get_system_prompt(observation=obs)  # doctest: +SKIP

    Args:
        prompts_cfg: ``cfg.prompts`` (typed config, dict or None for the defaults).
        root: Project root for relative template and grounding paths.
        grounding_file_path: Default grounding files (str / list / None) used when
            ``get_system_prompt`` is called without ``grounding_file_path``.
        slot_name: Context key the advisory bundle is merged under
            (``cfg.memory.io.slot_memory_name``).
    """

    def __init__(
        self,
        prompts_cfg: Any = None,
        *,
        root: str | os.PathLike | None = None,
        grounding_file_path: str | Sequence[str] | None = None,
        slot_name: str = "DEBATE_CONTEXT__MEMORY",
    ) -> None:
        self.root = Path(root) if root is not None else None
        self.system_template_path = str(_cfg_get(prompts_cfg, "system_template", "conf/templates/system_compact.txt"))
        self.entropy_template_path = str(
            _cfg_get(prompts_cfg, "entropy_template", "conf/templates/system_verbalized_entropy.txt"))
        self.strict = bool(_cfg_get(prompts_cfg, "strict", True))
        self.missing_memory_value = str(_cfg_get(prompts_cfg, "missing_memory_value", "None"))
        self.empty_string_value = str(_cfg_get(prompts_cfg, "empty_string_value", "None"))
        self.max_depth = int(_cfg_get(prompts_cfg, "max_depth", 8))
        self.empty_grounding_text = str(_cfg_get(prompts_cfg, "empty_grounding_text", "None"))
        self.slot_heading = str(_cfg_get(prompts_cfg, "memory_slot_heading", DEFAULT_SLOT_HEADING))
        self.memory_merge_defaults = bool(_cfg_get(prompts_cfg, "memory_merge_defaults", True))
        defaults = _plain(_cfg_get(prompts_cfg, "memory_defaults", {})) or {}
        if not isinstance(defaults, Mapping):
            raise PromptTemplateError(f"prompts.memory_defaults={defaults!r}: expected a mapping")
        self.memory_defaults: dict = copy.deepcopy(dict(defaults))
        self.grounding_file_path = grounding_file_path
        self.slot_name = slot_name
        self.memory_dict: dict = copy.deepcopy(self.memory_defaults)
        self.variables: dict[str, Any] = {}
        self.memory_slot: str = ""
        self._templates: dict[str, str] = {}
        self._grounding_cache: dict[tuple, str] = {}

    @classmethod
    def from_config(cls, cfg: Any, *, root: str | os.PathLike | None = None) -> "PromptOrganizer":
        """Build from the whole composed config (prompts, grounding files, slot name)."""
        files = _plain(cfg.grounding.files) if cfg.grounding.files else None
        return cls(cfg.prompts, root=root, grounding_file_path=files, slot_name=cfg.memory.io.slot_memory_name)

    # -- memory dict (seed 002 section 1) -------------------------------------------
    def set_memory_dict(self, d: Mapping[str, Any] | None) -> None:
        """Replace the memory dict (None: back to the configured defaults)."""
        if d is None:
            self.memory_dict = copy.deepcopy(self.memory_defaults)
            return
        d = _plain(d)
        if not isinstance(d, Mapping):
            raise TypeError(f"memory dict must be a mapping, got {type(d).__name__}")
        self.memory_dict = copy.deepcopy(dict(d))

    def reset_memory(self) -> None:
        """Start of an episode: the memory dict becomes ``prompts.memory_defaults``."""
        self.set_memory_dict(None)

    def update_memory_from_response(self, response: Any) -> bool:
        """Take the ``memory`` object of a model response as the next memory dict.

        The whole object becomes the memory dict (seed 002 section 1); with
        ``prompts.memory_merge_defaults`` a top-level key it lacks keeps its default value
        (so a template's ``$memory[notes]`` does not warn every turn the model omits it).

        Args:
            response: The parsed JSON response (dict) or the raw generated text.

        Returns:
            True when the response carried a ``memory`` object (the dict was replaced);
            False otherwise (the memory dict is kept).
        """
        mem = memory_from_response(response)
        if mem is None:
            return False
        if self.memory_merge_defaults:
            mem = {**self.memory_defaults, **mem}
        self.set_memory_dict(mem)
        return True

    def memory_json(self) -> str:
        """The memory dict as canonical JSON (the per-turn ``memory`` column)."""
        return json.dumps(self.memory_dict, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                          default=_safe_str)

    # -- per-episode context -----------------------------------------------------------
    def set_variables(self, **variables: Any) -> None:
        """Set episode-level variables (objective, scene, ...)."""
        self.variables.update(variables)

    def set_memory_slot(self, bundle: Any, *, exposed: bool) -> str:
        """Set the advisory slot (seed 001): its JSON goes into ``$memory_slot`` only if exposed."""
        self.memory_slot = render_memory_slot(bundle, slot_name=self.slot_name, exposed=exposed,
                                              heading=self.slot_heading)
        return self.memory_slot

    def set_memory_block(self, block: str) -> str:
        """Set ``$memory_slot`` from an injected block text (``MemorySlot.injected_block_text``)."""
        self.memory_slot = memory_slot_text(block, heading=self.slot_heading)
        return self.memory_slot

    def grounding_content(self, grounding_file_path: str | Sequence[str] | None = None) -> str:
        """``$grounding_content`` for the given files (None: the default files)."""
        src = self.grounding_file_path if grounding_file_path is None else grounding_file_path
        paths = split_grounding_paths(src)
        if not paths:
            return self.empty_grounding_text
        # Cached per (files, mtimes, sizes): a prompt is rendered every turn, the files
        # change only between episodes.
        key = (tuple(paths), tuple(self._stat(p) for p in paths))
        text = self._grounding_cache.get(key)
        if text is None:
            text = merge_grounding_content(paths, root=self._root())
            if len(self._grounding_cache) >= 256:
                self._grounding_cache.clear()
            self._grounding_cache[key] = text
        return text if text.strip() else self.empty_grounding_text

    def _root(self) -> Path:
        return self.root if self.root is not None else _project_root()

    def _stat(self, p: str) -> tuple[int, int]:
        try:
            st = os.stat(p if os.path.isabs(p) else os.path.join(self._root(), p))
            return st.st_mtime_ns, st.st_size
        except OSError:
            return -1, -1

    def template(self, path: str) -> str:
        if path not in self._templates:
            self._templates[path] = load_template(path, self._root())
        return self._templates[path]

    # -- system prompts (seed 000 API) ----------------------------------------------
    def _interp(self, template: str, name: str, variables: Mapping[str, Any], **kw: Any) -> str:
        return system_prompt_interp(
            template, variables, self.memory_dict, template_name=name, strict=self.strict,
            missing_memory_value=self.missing_memory_value, empty_string_value=self.empty_string_value,
            max_depth=self.max_depth, **kw)

    def _variables(self, grounding_file_path: Any, observation: Any, extra: Mapping[str, Any]) -> dict:
        variables = {"memory_slot": self.memory_slot, **self.variables}
        variables["grounding_content"] = self.grounding_content(grounding_file_path)
        if observation is not None:
            variables.update(observation_variables(observation))
        variables.update(extra)
        return variables

    def get_system_prompt(self, grounding_file_path: str | Sequence[str] | None = None, *,
                          observation: Mapping[str, Any] | None = None, **variables: Any) -> str:
        """Render ``prompts.system_template`` with grounding, slot, memory and observation.

        Args:
            grounding_file_path: Grounding files (str, comma-separated str, list, or None
                for the organizer's default files), merged into ``$grounding_content``.
            observation: The current observation dict (fills :data:`TURN_VARIABLES`).
            **variables: Further variables (override the episode-level ones).
        """
        path = self.system_template_path
        return self._interp(self.template(path), path, self._variables(grounding_file_path, observation, variables))

    def get_verbalized_entropy_system_prompt(self, grounding_file_path: str | Sequence[str] | None = None, *,
                                             observation: Mapping[str, Any] | None = None,
                                             **variables: Any) -> str:
        """As :meth:`get_system_prompt`, with ``prompts.entropy_template`` (the model states
        a probability for each candidate action; parse with :func:`parse_verbalized_distribution`)."""
        path = self.entropy_template_path
        return self._interp(self.template(path), path, self._variables(grounding_file_path, observation, variables))

    def freeze_system_prompt(self, grounding_file_path: str | Sequence[str] | None = None, *,
                             entropy: bool = False, **variables: Any) -> str:
        """The per-episode prompt: episode slots filled, turn slots and ``$memory[...]`` kept.

        Render it per turn with :meth:`render_turn`; the result equals
        :meth:`get_system_prompt` with the same state.
        """
        path = self.entropy_template_path if entropy else self.system_template_path
        vs = self._variables(grounding_file_path, None, variables)
        return self._interp(self.template(path), path, vs, keep=TURN_VARIABLES, keep_memory=True)

    def render_turn(self, frozen_prompt: str, observation: Mapping[str, Any] | None = None, *,
                    template_name: str = "<frozen prompt>") -> str:
        """Fill a frozen prompt's turn slots with the observation and the memory dict."""
        return self._interp(frozen_prompt, template_name, observation_variables(observation))


def render_turn_prompt(frozen_prompt: str, observation: Mapping[str, Any] | None, memory: Mapping[str, Any] | None,
                       *, template_name: str = "<frozen prompt>", **kw: Any) -> str:
    """Fill a frozen (per-episode) prompt with one turn's observation and memory dict."""
    return system_prompt_interp(frozen_prompt, observation_variables(observation), memory,
                                template_name=template_name, **kw)

