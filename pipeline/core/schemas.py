"""Records shared by the stages, with their Arrow schemas (one place, validated).

An episode and a turn are typed records (:class:`EpisodeRecord`, :class:`TurnRecord`):
the collection loop builds them field by field, so a renamed field fails where it is
built, and their Arrow schemas (:data:`EPISODE_SCHEMA`, :data:`TURN_SCHEMA`) are derived
from them (:func:`arrow_schema`), never written beside them. As rows (``record.row()``,
what checkpoints keep) they become Arrow tables through :func:`episodes_table` /
:func:`turns_table`, which enforce the schemas: a missing or mistyped field is an error
naming it. Nested values (observation, action, metadata) are stored as canonical JSON
strings so that the schema stays flat and stable; only nullable columns are ever added
when it evolves::

    row = TurnRecord(episode_id=..., turn_index=0, observation=canonical_json(obs), ...).row()
    table = turns_table([row])               # schema TURN_SCHEMA

The memory/advisory models of seed 001 live in :mod:`pipeline.memory.schemas`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Annotated, Any, Iterable, Mapping, Optional, Union, get_args, get_origin, get_type_hints

import pyarrow as pa

SCHEMA_VERSION = "1"


def clean_action(a: Mapping[str, Any]) -> dict:
    """The action dict an agent sends and a backend constrains: verb, target and the
    optional receptacle / key (an admissible action without its other fields)."""
    out = {"action": a.get("action"), "target": a.get("target")}
    for k in ("receptacle", "key"):
        if a.get(k) is not None:
            out[k] = a[k]
    return out

FEEDBACK_TYPES = ("user_preference", "spatial", "procedural", "general")
STATUSES = ("Success", "Failure", "WiP")

MANIFEST_SCHEMA = pa.schema(
    [
        ("scene_id", pa.string()),
        ("quest_id", pa.string()),
        ("split", pa.string()),  # train | eval
        ("scene_split", pa.string()),  # seen | heldout: is the scene also in train?
        ("objective", pa.string()),
        ("quest_length", pa.int32()),  # number of expert commands
        ("expert_plan", pa.list_(pa.string())),  # TextWorld commands of the walkthrough
        ("game_file", pa.string()),  # relative to the project root
        ("scene_seed", pa.int64()),
        ("quest_seed", pa.int64()),
        ("preferences", pa.list_(pa.string())),  # scene-level user preferences (ids)
        ("metadata", pa.string()),  # JSON: entities, goal facts, ...
    ]
)

# Arrow types of record fields whose Python type alone does not say it (plain int is int64).
Int32 = Annotated[int, pa.int32()]
Json = str  # canonical JSON text (:func:`canonical_json`) of a nested value


@dataclass
class EpisodeRecord:
    """One played episode: a row of ``episodes.parquet`` (:data:`EPISODE_SCHEMA` is derived from it)."""

    episode_id: str
    scene_id: str
    quest_id: str
    split: str
    condition: str  # "" in collect; C1 / C2 / ... in evaluate
    objective: str
    question: str  # seed 003 name: same as objective
    choices: list[str]  # admissible commands at the start
    ground_truth: str  # expert plan, commands joined by " ; "
    final_answer: str  # last command taken
    final_reward: float  # sum of rewards
    won: bool  # TextWorld's `won` (never `done`)
    preferences_ok: bool  # scene preferences held at the end
    is_correct: bool  # won (and preferences_ok when configured)
    num_turns: Int32
    num_invalid: Int32
    num_repeated: Int32
    prompt_tokens: int
    generated_tokens: int
    agent: str
    model: str
    seed: int
    metadata: Json

    def row(self) -> dict[str, Any]:
        """The record as a row dict (what checkpoints keep and :func:`episodes_table` takes)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class TurnRecord:
    """One turn of an episode: a row of ``turns.parquet`` (:data:`TURN_SCHEMA` is derived from it).

    Built by the rollout (:mod:`pipeline.session.rollout`) from the observation, the
    agent's :class:`~pipeline.agents.base.AgentStep` (its typed model turn, if any), the
    env's step info and the user's feedback.
    """

    episode_id: str
    turn_index: Int32
    observation: Json  # the observation dict the agent saw
    prompt_hash: Optional[str]  # sha256 of the prompt text (null for rule agents)
    prompt: Optional[str]  # the prompt text (null when stored by hash elsewhere)
    generated_text: str  # raw model / agent output
    reasoning: str  # thought / retrieval summary / model reasoning
    action: Json  # {"action":..., "target":..., ...}
    command: Optional[str]  # TextWorld command executed
    action_valid: bool  # parseable and admissible
    env_feedback: str  # the game's text response
    reward: float
    changed: bool  # did the step change the world state / location?
    repeated: bool  # same command as an earlier one that changed nothing
    done: bool
    won: bool
    status: str  # Success | Failure | WiP (seed 000)
    feedback_lines: list[str]  # raw `feedback : <type>: <text>` lines
    feedback_user_preference: Optional[str]
    feedback_spatial: Optional[str]
    feedback_procedural: Optional[str]
    feedback_general: Optional[str]
    memory: Optional[Json]  # the memory dict after this turn (seed 002), null if none
    # Token tracking (filled by the llm agent; null for rule agents).
    prompt_tokens: Optional[Int32]
    generated_tokens: Optional[Int32]
    generated_ids_length: Optional[Int32]
    action_token_start_index: Optional[Int32]
    action_token_end_index: Optional[Int32]  # exclusive
    tracking_method: Optional[str]  # stream | fallback | none
    stop_reason: Optional[str]  # json_closed | max_new_tokens | eos | error
    decoding: Optional[str]  # free | constrained | choice (agent.decoding; null for rule agents and free)
    action_scores: Optional[Json]  # choice decoding: {command: summed log-prob} of every admissible action

    def row(self) -> dict[str, Any]:
        """The record as a row dict (what checkpoints keep and :func:`turns_table` takes)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def backend_errors(turns: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"backend_error_turns", "backend_error_rate"}``: turns whose model call failed, and their share.

    A failed call is recorded as ``stop_reason == "error"`` (``agent.on_backend_error=record``).
    """
    turns = list(turns)
    n = sum(t.get("stop_reason") == "error" for t in turns)
    return {"backend_error_turns": n, "backend_error_rate": round(n / len(turns), 6) if turns else 0.0}


def arrow_schema(record: type) -> pa.Schema:
    """The Arrow schema of a record dataclass, field by field, every column nullable.

    ``str`` -> string, ``bool`` -> bool, ``float`` -> float64, ``int`` -> int64,
    ``Annotated[int, pa.int32()]`` (:data:`Int32`) -> int32, ``list[str]`` -> list of
    strings; ``Optional[X]`` is ``X`` (Arrow columns are nullable anyway).
    """
    hints = get_type_hints(record, include_extras=True)
    return pa.schema([(f.name, _arrow_type(hints[f.name], f"{record.__name__}.{f.name}")) for f in fields(record)])


_ARROW = {str: pa.string(), bool: pa.bool_(), float: pa.float64(), int: pa.int64()}


def _arrow_type(hint: Any, where: str) -> pa.DataType:
    if get_origin(hint) is Annotated:
        return get_args(hint)[1]
    if get_origin(hint) is Union:  # Optional[X]
        inner = [a for a in get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return _arrow_type(inner[0], where)
    if get_origin(hint) is list:
        return pa.list_(_arrow_type(get_args(hint)[0], where))
    if hint in _ARROW:
        return _ARROW[hint]
    raise TypeError(f"{where}: no Arrow type for {hint!r}")


EPISODE_SCHEMA = arrow_schema(EpisodeRecord)
TURN_SCHEMA = arrow_schema(TurnRecord)


def json_object(raw: Any) -> dict[str, Any]:
    """A JSON column's object as a dict: the dict itself, its parsed JSON text, or ``{}``
    for nothing, text that does not parse and JSON that is not an object (the lenient
    read of an optional column such as ``observation`` or ``metadata``)."""
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    try:
        obj = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def canonical_json(obj: Any) -> str:
    """Compact, key-sorted JSON with UTF-8 kept: the form every JSON column uses."""
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _table(rows: Iterable[dict], schema: pa.Schema, what: str) -> pa.Table:
    rows = list(rows)
    cols = {}
    for f in schema:
        name = f.name
        if not f.nullable:
            missing = next((i for i, r in enumerate(rows) if name not in r), None)
            if missing is not None:
                raise ValueError(f"{what} row {missing}: missing field {name!r}")
        # One comprehension per column (a missing nullable field is None): 3.5x faster on
        # 10^5 turn rows than a per-row loop with explicit checks (benchmarks: parquet).
        values = [r.get(name) for r in rows]
        try:
            cols[name] = pa.array(values, type=f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"{what}: field {name!r} does not fit {f.type}: {exc}") from exc
    names = set(schema.names)
    if not all(r.keys() <= names for r in rows):  # the union only when something is extra
        extra = set().union(*(r.keys() for r in rows)) - names
        raise ValueError(f"{what}: unknown fields {sorted(extra)}")
    return pa.table(cols, schema=schema)


def manifest_table(rows: Iterable[dict]) -> pa.Table:
    return _table(rows, MANIFEST_SCHEMA, "manifest")


def episodes_table(rows: Iterable[dict]) -> pa.Table:
    return _table(rows, EPISODE_SCHEMA, "episodes")


def turns_table(rows: Iterable[dict]) -> pa.Table:
    return _table(rows, TURN_SCHEMA, "turns")
