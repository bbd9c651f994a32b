"""The viewer's data: eval artifacts of several runs -> a JSON-ready view (no I/O, no HTML).

A *run* is one condition's eval collection (``data/eval/<C>/{episodes,turns}.parquet``)
with the prompts ``render`` wrote (``data/prompts/<C>.parquet``); with ``--diff`` a run
is a condition at one revision (``A:C1``). Episodes of different runs are paired by
``episode_id`` (the same task played with the same seed, as ``compare`` pairs them)::

    view = build_view([Run("C1", "C1", eps1, turns1, prompts1), Run("C2", ...)],
                      pairs=[("C2", "C1")], title="...")
    view.index       # one row per episode id: task, scene split, each run's outcome / turns / reward
    view.details     # per row: each run's turns, token figures, the marked prompts, divergence

What a researcher reads, and how it is derived:

- *outcome*: ``is_correct`` (success as ``compare`` counts it: TextWorld's ``won`` and, when
  configured, the preferences held), ``won``, turns, reward;
- *divergence*: the first turn index at which two runs of the same episode took a different
  action (the action dict and the executed command), or at which one of them had ended;
  ``None`` when they played the same actions throughout (:func:`first_divergence`);
- *prompt blocks*: each line of a system prompt is ``plain``, ``grounding`` (the ``##
  Grounding`` section of the template, up to the next ``## `` heading) or ``memory`` (the
  exact ``memory_block`` the render stage inserted), and is marked *changed* when it is not
  in the reference run's prompt of the same task (a line diff: :func:`prompt_lines`);
- *tokens*: the episode's prompt / generated tokens, its model turns, the turns stopped when
  their JSON action closed and, when ``max_new_tokens`` is known, the upper bound of what
  early stop saved (``max_new_tokens - generated`` summed over those turns, as
  :func:`pipeline.llm.accounting.token_statistics` counts it).

Size: every string of an episode's detail is stored once in that detail's string table
(``s``) and observations once in its observation table (``o``); turns are arrays of
indices in :data:`TURN_FIELDS` order. Runs of one task repeat most of their text (the same
first observation, a stuck agent's identical turns, shared prompt lines), so this is what
keeps 1,000 episodes in a few megabytes (``docs/viewer.md``).
"""

from __future__ import annotations

import difflib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

#: The order of a turn's fields in the embedded arrays (the page reads them by name).
TURN_FIELDS = ("obs", "reasoning", "text", "action", "command", "valid", "reward", "env", "feedback",
               "status", "memory", "pt", "gt", "stop", "repeated", "won")
#: The order of an observation's fields in a detail's observation table.
OBS_FIELDS = ("location", "inventory", "visible", "description", "commands")
#: Prompt line kinds.
PLAIN, GROUNDING, MEMORY = 0, 1, 2
KINDS = ("plain", "grounding", "memory")
#: Turn columns the viewer reads (``prompt``, the full per-turn prompt text, is left out).
TURN_COLUMNS = ("episode_id", "turn_index", "observation", "reasoning", "generated_text", "action", "command",
                "action_valid", "env_feedback", "reward", "feedback_lines", "status", "memory", "prompt_tokens",
                "generated_tokens", "stop_reason", "tracking_method", "repeated", "won")
#: Prompt columns the viewer reads.
PROMPT_COLUMNS = ("task_id", "scene_id", "quest_id", "scene_split", "objective", "condition", "system_prompt",
                  "memory_block", "injected", "gate_ok", "gate_reason", "grounding_files")
#: Index rows shown per page.
PAGE_SIZE = 100


@dataclass
class Run:
    """One column of the viewer.

    Attributes:
        key: Unique name of the run (``C1``; ``A:C1`` with ``--diff``).
        condition: The condition it played.
        episodes: Rows of ``episodes.parquet`` (dicts).
        turns: Rows of ``turns.parquet`` (dicts; :data:`TURN_COLUMNS` are read).
        prompts: Rows of ``data/prompts/<C>.parquet`` (may be empty).
        source: Where it was read (a folder, or ``A=exp-a (1a2b3c4)``).
        max_new_tokens: ``sampling.max_new_tokens`` it was played with (None: the view's).
    """

    key: str
    condition: str
    episodes: list[dict]
    turns: list[dict]
    prompts: list[dict] = field(default_factory=list)
    source: str = ""
    max_new_tokens: int | None = None


@dataclass
class View:
    """What the page embeds: ``index`` (one JSON block) and one ``details`` block per index row."""

    index: dict
    details: list[dict]


class Strings:
    """A string table: each distinct string is stored once, turns hold its position."""

    def __init__(self) -> None:
        self.table: list[str] = []
        self._pos: dict[str, int] = {}

    def __call__(self, value: Any) -> int:
        """The position of ``value`` (``-1`` for None)."""
        if value is None:
            return -1
        s = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        pos = self._pos.get(s)
        if pos is None:
            pos = self._pos[s] = len(self.table)
            self.table.append(s)
        return pos


# --------------------------------------------------------------------------- turns


def _number(v: Any) -> float | int | None:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return round(v, 6) if isinstance(v, float) else v


def _action_key(turn: Mapping[str, Any]) -> tuple:
    """What a turn did: its action dict (normalised JSON) and the executed command."""
    raw = turn.get("action")
    try:
        action = json.dumps(json.loads(raw), sort_keys=True) if isinstance(raw, str) else raw
    except (TypeError, ValueError):
        action = raw
    return action, turn.get("command")


def first_divergence(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> int | None:
    """The first turn index where two runs of one episode took different actions or one had ended.

    Args:
        a: The turns of one run, in turn order.
        b: The turns of the other.

    Returns:
        The turn index, or None when both played the same actions for the same number of turns.
    """
    for k in range(max(len(a), len(b))):
        if k >= len(a) or k >= len(b) or _action_key(a[k]) != _action_key(b[k]):
            return k
    return None


def compact_observation(raw: Any) -> tuple[str, str, str, str, str] | None:
    """An observation (the JSON the agent saw) as :data:`OBS_FIELDS` display strings."""
    if raw is None or raw == "":
        return None
    try:
        d = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        d = None
    if not isinstance(d, Mapping):  # not the environment's dict: show it as the description
        return "", "", "", str(raw), ""

    def listed(key: str, sep: str = ", ", empty: str = "") -> str:
        v = d.get(key)
        if isinstance(v, (list, tuple)):
            return sep.join(str(x) for x in v) or empty
        return "" if v is None else str(v)

    return (listed("agent_location"), listed("agent_inventory", empty="nothing"), listed("visible_entities"),
            listed("description"), listed("admissible_commands", " | "))


def _feedback_text(lines: Any) -> str | None:
    if lines is None:
        return None
    lines = [str(x) for x in lines]
    return "\n".join(lines) if lines else None


def _bool(v: Any) -> int | None:
    return None if v is None else int(bool(v))


def turn_array(t: Mapping[str, Any], strings: Strings, observations: Strings) -> list:
    """One turn as the :data:`TURN_FIELDS` array (strings as positions in ``strings``)."""
    obs = compact_observation(t.get("observation"))
    reasoning, text = t.get("reasoning"), t.get("generated_text")
    return [
        observations(list(strings(x) for x in obs)) if obs is not None else -1,
        strings(reasoning or None),
        strings(text if text and text != reasoning else None),  # rule agents: the reasoning is the text
        strings(t.get("action")),
        strings(t.get("command")),
        _bool(t.get("action_valid")),
        _number(t.get("reward")),
        strings(t.get("env_feedback") or None),
        strings(_feedback_text(t.get("feedback_lines"))),
        strings(t.get("status")),
        strings(t.get("memory")),
        _number(t.get("prompt_tokens")),
        _number(t.get("generated_tokens")),
        strings(t.get("stop_reason")),
        _bool(t.get("repeated")),
        _bool(t.get("won")),
    ]


def token_figures(episode: Mapping[str, Any], turns: Sequence[Mapping[str, Any]],
                  max_new_tokens: int | None) -> dict[str, Any]:
    """An episode's token figures (module docstring): prompt / generated tokens, model turns,
    JSON-closed turns, the early-stop saving bound, tracking methods."""
    llm = [t for t in turns if t.get("generated_tokens") is not None]
    closed = [t for t in llm if t.get("stop_reason") == "json_closed"]
    saved = None
    if max_new_tokens is not None and llm:
        saved = sum(max(0, int(max_new_tokens) - int(t["generated_tokens"])) for t in closed)
    return {
        "prompt_tokens": _number(episode.get("prompt_tokens")),
        "generated_tokens": _number(episode.get("generated_tokens")),
        "model_turns": len(llm),
        "json_closed": len(closed),
        "saved_max": saved,
        "tracking": dict(sorted(Counter(str(t.get("tracking_method")) for t in llm).items())),
    }


# --------------------------------------------------------------------------- prompts


def prompt_kinds(prompt: str, memory_block: str | None) -> list[tuple[str, int]]:
    """The lines of a system prompt with their kind (:data:`PLAIN`, :data:`GROUNDING`, :data:`MEMORY`).

    The memory block is the exact ``memory_block`` text the render stage inserted; the
    grounding block is the template's ``## Grounding...`` section, up to the next ``## `` heading.
    """
    span = (-1, -1)
    if memory_block:
        start = prompt.find(memory_block)
        if start >= 0:
            span = (start, start + len(memory_block))
    out, offset, in_grounding = [], 0, False
    for line in prompt.splitlines(keepends=True):
        text = line.rstrip("\r\n")
        in_memory = span[0] <= offset < span[1]
        if not in_memory and text.startswith("## "):
            in_grounding = text.startswith("## Grounding")
        out.append((text, MEMORY if in_memory else GROUNDING if in_grounding else PLAIN))
        offset += len(line)
    return out


def prompt_lines(prompt: str, memory_block: str | None, reference: str | None,
                 strings: Strings) -> tuple[list[list[int]], int, int]:
    """``(lines, added, removed)``: each line as ``[string, kind, changed]`` against ``reference``
    (changed: the line is not in the reference prompt, by a line diff), and the counts of
    lines added to / removed from the reference."""
    kinds = prompt_kinds(prompt, memory_block)
    changed = [0] * len(kinds)
    added = removed = 0
    if reference is not None and reference != prompt:
        ref_lines = reference.splitlines()
        matcher = difflib.SequenceMatcher(None, ref_lines, [t for t, _ in kinds], autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op in ("replace", "insert"):
                for j in range(j1, j2):
                    changed[j] = 1
                added += j2 - j1
            if op in ("replace", "delete"):
                removed += i2 - i1
    return [[strings(t), k, c] for (t, k), c in zip(kinds, changed)], added, removed


def reference_runs(keys: Sequence[str], pairs: Sequence[tuple[str, str]]) -> dict[str, str | None]:
    """Which run's prompt each run's prompt is compared with: a treatment's first control;
    every other run the first pair's control (or the first run); that one itself (None)."""
    base = pairs[0][1] if pairs else (keys[0] if keys else None)
    out: dict[str, str | None] = {}
    for k in keys:
        ref = next((c for t, c in pairs if t == k), base)
        out[k] = None if ref == k else ref
    return out


# --------------------------------------------------------------------------- the view


def _by_episode(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for t in rows:
        out.setdefault(str(t["episode_id"]), []).append(t)
    for ts in out.values():
        ts.sort(key=lambda t: int(t.get("turn_index") or 0))
    return out


def _task_of(row: Mapping[str, Any]) -> str:
    return row.get("task_id") or f"{row.get('scene_id')}/{row.get('quest_id')}"


def _summary(run: Run) -> dict[str, Any]:
    eps = run.episodes
    n = len(eps)

    def mean(col: str) -> float | None:
        vals = [float(e[col]) for e in eps if e.get(col) is not None and math.isfinite(float(e[col]))]
        return _number(round(sum(vals) / len(vals), 4)) if vals else None

    return {"key": run.key, "condition": run.condition, "source": run.source, "episodes": n,
            "success": round(sum(bool(e.get("is_correct")) for e in eps) / n, 4) if n else None,
            "won": round(sum(bool(e.get("won")) for e in eps) / n, 4) if n else None,
            "mean_turns": mean("num_turns"), "mean_reward": mean("final_reward"),
            "prompt_tokens": sum(int(e.get("prompt_tokens") or 0) for e in eps),
            "generated_tokens": sum(int(e.get("generated_tokens") or 0) for e in eps)}


def build_view(runs: Sequence[Run], *, pairs: Sequence[Sequence[str]] = (), title: str = "Episodes",
               source: str = "", manifest: Sequence[Mapping[str, Any]] = (),
               max_new_tokens: int | None = None, notes: Sequence[str] = ()) -> View:
    """The whole view (module docstring).

    Args:
        runs: The columns, in display order (unique keys).
        pairs: ``(treatment, control)`` run keys offered by the outcome filter and compared
            first (pairs naming an absent run are dropped); default: the second run against
            the first.
        title: The page title.
        source: Where the runs were read (shown under the title).
        manifest: Games manifest rows (scene split and quest length of each task), optional.
        max_new_tokens: ``sampling.max_new_tokens`` of the runs (the early-stop bound), if known.
        notes: Lines shown under the title (runs left out, ...).
    """
    keys = [r.key for r in runs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"run keys must be unique: {keys}")
    pairs = [(str(t), str(c)) for t, c in pairs if t in keys and c in keys and t != c]
    if not pairs and len(keys) >= 2:
        pairs = [(keys[1], keys[0])]
    refs = reference_runs(keys, pairs)
    info = {(str(m["scene_id"]), str(m["quest_id"])): m for m in manifest}
    episodes = {r.key: {str(e["episode_id"]): e for e in r.episodes} for r in runs}
    turns = {r.key: _by_episode(r.turns) for r in runs}
    budget = {r.key: r.max_new_tokens if r.max_new_tokens is not None else max_new_tokens for r in runs}
    prompts = {r.key: {_task_of(p): p for p in r.prompts} for r in runs}
    order: dict[str, tuple[str, str, str]] = {}
    for k in keys:
        for i, e in episodes[k].items():
            order.setdefault(i, (str(e["scene_id"]), str(e["quest_id"]), i))
    ids = sorted(order, key=order.__getitem__)
    rows, details = [], []
    for n, eid in enumerate(ids):
        present = [k for k in keys if eid in episodes[k]]
        first = episodes[present[0]][eid]
        task = f"{first['scene_id']}/{first['quest_id']}"
        m = info.get((str(first["scene_id"]), str(first["quest_id"])), {})
        prow = next((prompts[k][task] for k in present if task in prompts[k]), {})
        plan = first.get("ground_truth") or ""
        quest_length = m.get("quest_length")
        if quest_length is None and plan:
            quest_length = len([c for c in plan.split(";") if c.strip()])
        row = {
            "i": n, "episode_id": eid, "task_id": task, "scene_id": str(first["scene_id"]),
            "quest_id": str(first["quest_id"]),
            "scene_split": str(m.get("scene_split") or prow.get("scene_split") or ""),
            "objective": str(first.get("objective") or prow.get("objective") or m.get("objective") or ""),
            "quest_length": _number(quest_length),
            "res": {}, "div": {},
        }
        strings, observations = Strings(), Strings()
        detail: dict[str, Any] = {"plan": plan, "runs": {}, "div": {}, "prompts": {}}
        for k in present:
            e = episodes[k][eid]
            ts = turns[k].get(eid, [])
            row["res"][k] = {"ok": bool(e.get("is_correct")), "won": bool(e.get("won")),
                             "turns": _number(e.get("num_turns")), "reward": _number(e.get("final_reward")),
                             "pt": _number(e.get("prompt_tokens")), "gt": _number(e.get("generated_tokens"))}
            detail["runs"][k] = {
                "turns": [turn_array(t, strings, observations) for t in ts],
                "tokens": token_figures(e, ts, budget[k]),
                "preferences_ok": _bool(e.get("preferences_ok")),
                "num_invalid": _number(e.get("num_invalid")),
                "num_repeated": _number(e.get("num_repeated")),
            }
        for a_i, a in enumerate(present):
            for b in present[a_i + 1:]:
                detail["div"][f"{a}|{b}"] = first_divergence(turns[a].get(eid, []), turns[b].get(eid, []))
        for t, c in pairs:
            if t in row["res"] and c in row["res"]:
                lo, hi = sorted((t, c), key=keys.index)
                row["div"][f"{t}|{c}"] = detail["div"][f"{lo}|{hi}"]
        for k in present:
            p = prompts[k].get(task)
            if p is None or p.get("system_prompt") is None:
                continue
            ref_key = refs[k]
            ref_row = prompts.get(ref_key, {}).get(task) if ref_key else None
            ref_text = ref_row.get("system_prompt") if ref_row else None
            lines, added, removed = prompt_lines(p["system_prompt"], p.get("memory_block"), ref_text, strings)
            detail["prompts"][k] = {
                "lines": lines, "ref": ref_key if ref_text is not None else None,
                "identical": ref_text == p["system_prompt"] if ref_text is not None else None,
                "added": added, "removed": removed, "chars": len(p["system_prompt"]),
                "injected": _bool(p.get("injected")), "gate_ok": _bool(p.get("gate_ok")),
                "gate_reason": p.get("gate_reason"), "grounding_files": list(p.get("grounding_files") or []),
            }
        detail["s"] = strings.table
        detail["o"] = [json.loads(o) for o in observations.table]
        rows.append(row)
        details.append(detail)
    index = {
        "title": title, "source": source, "notes": list(notes),
        "runs": [_summary(r) for r in runs], "pairs": [list(p) for p in pairs],
        "default_runs": list(pairs[0][::-1]) if pairs else keys[:2],
        "scenes": sorted({r["scene_id"] for r in rows}),
        "splits": sorted({r["scene_split"] for r in rows if r["scene_split"]}),
        "rows": rows, "turn_fields": list(TURN_FIELDS), "obs_fields": list(OBS_FIELDS), "kinds": list(KINDS),
        "page_size": PAGE_SIZE, "max_new_tokens": max_new_tokens,
    }
    return View(index=index, details=details)
