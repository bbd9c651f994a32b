"""Fuzzed inputs (hypothesis): what users, models and disks can hand the pipeline never crashes it.

- any JSON value (and worse) through the memory renderer: always a string;
- any text through the JSON-action tracker and the llm agent's parser: never raises,
  invalid output gives ``action_valid=false``;
- randomly corrupted grounding JSON/TXT files through the merge: good files still merged,
  bad ones named in warnings;
- random feedback lines (and feedback files) through :mod:`pipeline.grounding.feedback`;
- random objectives (Korean, Chinese, emoji, empty, 10^5 characters) through
  ``SignatureBuilder.build`` and into a store entry, which never keeps the text.

Every test counts the cases it ran (``FUZZ_CASES``, printed at the end of the session);
``derandomize=True`` makes CI run the same cases every time.
"""

from __future__ import annotations

import json
import logging
import math
import random
import tempfile
import zlib
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from .conftest import FUZZ_CASES


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


def count(name: str) -> None:
    FUZZ_CASES[name] = FUZZ_CASES.get(name, 0) + 1


# Text that reaches the interesting corners: every script the pipeline meets, JSON punctuation,
# escapes, surrogates-free unicode, control characters.
HANGUL = st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3)
CJK = st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF)
EMOJI = st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF)
ANY_CHAR = st.characters(blacklist_categories=("Cs",))
WORDS = st.sampled_from(["Apple_2", "Fridge_0", "Key_1", "Kitchen", "not", "but", "안", "않", "하지만", "지만",
                         "no longer", "yeah right", "ㅋㅋ", "不要", "但是", " ", "\n", "\t", "feedback", ":", "："])
MIXED_TEXT = st.lists(st.one_of(st.text(ANY_CHAR, max_size=12), st.text(HANGUL, max_size=8),
                                st.text(CJK, max_size=8), st.text(EMOJI, max_size=4), WORDS),
                      max_size=12).map("".join)


# --------------------------------------------------------------------------- memory renderer

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-10**5000, max_value=10**5000)
    | st.floats(allow_nan=True, allow_infinity=True) | MIXED_TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(MIXED_TEXT, inner, max_size=5),
    max_leaves=40,
)


@fuzz(1500)
@given(value=JSON_VALUES, max_depth=st.integers(-1, 10), empty=st.sampled_from(["None", "", "∅"]))
def test_memory_renderer_turns_any_json_value_into_a_string(value, max_depth, empty):
    from pipeline.prompts import render_memory_value

    count("render_memory_value: any JSON value")
    out = render_memory_value(value, empty_value=empty, max_depth=max_depth)
    assert isinstance(out, str)
    assert out == render_memory_value(value, empty_value=empty, max_depth=max_depth)  # deterministic
    if isinstance(value, str):
        assert out == (value or empty)


class _Unprintable:
    def __str__(self):
        raise RuntimeError("no")

    __repr__ = __str__


def _deep(n: int):
    v: list = []
    for _ in range(n):
        v = [v]
    return v


def _cycle():
    a: list = [1]
    a.append(a)
    d: dict = {"self": None}
    d["self"] = d
    return [a, d]


@pytest.mark.parametrize("value", [
    _deep(50_000), {"a": _deep(3000)}, _cycle(), {1: "int key", None: "none key", (1, 2): "tuple key"},
    {_Unprintable(): 1}, [_Unprintable()], {1, 2, 3}, b"\xff\x00bytes", 10**10000, -(10**10000),
    math.nan, -math.inf, range(3), NS(a=1), "x" * 100_000, ["$objective", "${memory_slot}", "$$"],
], ids=lambda v: type(v).__name__)
def test_memory_renderer_survives_hostile_values(value):
    from pipeline.prompts import render_memory_value

    count("render_memory_value: hostile values")
    for max_depth in (0, 1, 8):
        assert isinstance(render_memory_value(value, max_depth=max_depth), str)


# --------------------------------------------------------------------------- tracker and parser

JSONISH = st.lists(st.one_of(
    st.sampled_from(['{', '}', '"', '\\', '\\"', ':', ',', ' ', '\n', '"action"', '"target"', '"memory"',
                     '"open"', '"look"', '"go_to"', '"Fridge_0"', '"Kitchen"', 'null', 'true', '[', ']', '{}',
                     '{"action": "look", "target": null}', '{"action": "open", "target": "Fridge_0"}',
                     '{"action": "go_to", "target": "east"}', '```json', '```', 'I think', '。']),
    st.text(ANY_CHAR, max_size=6)), max_size=30).map("".join)

OBS = {"objective": "Put Apple_2 in Fridge_0", "agent_location": "Kitchen", "agent_inventory": [],
       "visible_entities": ["Fridge_0", "Apple_2"], "available_actions": ["look", "open", "go_to", "pick_up"],
       "description": "A kitchen.", "step": 0, "max_steps": 5,
       "admissible_commands": ["look", "open Fridge_0", "go east", "take Apple_2"],
       "admissible_actions": [{"action": "look", "target": None, "command": "look"},
                              {"action": "open", "target": "Fridge_0", "command": "open Fridge_0"},
                              {"action": "go_to", "target": "Bedroom", "command": "go east"},
                              {"action": "pick_up", "target": "Apple_2", "command": "take Apple_2"}]}


@fuzz(1500)
@given(text=st.one_of(JSONISH, MIXED_TEXT), cuts=st.lists(st.integers(0, 400), max_size=12))
@example(text='{"action": "look"}{"action": "open"', cuts=[3])
@example(text='{ "a": "}" } {"action": "look", "target": null}', cuts=[1, 2, 3])
def test_tracker_finds_only_real_json_objects_in_any_text(text, cuts):
    from pipeline.llm.tracker import JsonActionTracker, action_text_from_text, find_json_object

    count("tracker: any text, any token split")
    pieces, last = [], 0
    for c in sorted(set(min(c, len(text)) for c in cuts)) + [len(text)]:
        pieces.append(text[last:c])
        last = c
    tr = JsonActionTracker()
    for p in pieces:
        tr.feed(p)
    assert tr.text == text and tr.num_tokens == len(pieces)
    if tr.closed:
        obj = json.loads(text[tr.start_char:tr.end_char], strict=False)
        assert isinstance(obj, dict)
        assert 0 <= tr.token_of_char(tr.start_char) <= tr.token_of_char(tr.end_char - 1) < len(pieces)
    found = find_json_object(text)
    if found is not None:
        assert json.loads(text[found[0]:found[1]], strict=False) == found[2]
    action = action_text_from_text(text)
    assert action is None or isinstance(json.loads(action, strict=False), dict)


@pytest.fixture(scope="module")
def tokenizer():
    from pipeline.llm.tiny import train_tokenizer

    return train_tokenizer(['{"action": "open", "target": "Fridge_0"}', "I should look. 냉장고를 열어 不要", "🙂 ok"],
                           vocab_size=300)


@fuzz(400)
@given(data=st.data())
def test_token_stream_never_raises_and_masks_a_contiguous_span(tokenizer, data):
    from pipeline.llm.tracker import track_ids

    count("ActionStream: random token ids")
    ids = data.draw(st.lists(st.integers(0, len(tokenizer) - 1), max_size=60))
    turn = track_ids(tokenizer, ids, early_stop=data.draw(st.booleans()))
    mask = turn.action_token_mask
    assert len(mask) == turn.num_tokens <= len(ids)
    where = [i for i, m in enumerate(mask) if m]
    if turn.action_text is None:
        assert not where and turn.tracking_method == "none"
    else:
        assert where == list(range(turn.action_token_start_index, turn.action_token_end_index))
        assert isinstance(json.loads(turn.action_text, strict=False), dict)


@fuzz(1500)
@given(text=st.one_of(JSONISH, MIXED_TEXT))
@example(text='{"action": "open", "target": "Fridge_0"}')
@example(text='{"action": ["open"], "target": {"x": 1}}')
@example(text='{"action": "open", "target": 5, "receptacle": [], "key": {}}')
def test_parser_never_raises_and_invalid_output_is_action_valid_false(tiny_cfg, text):
    from pipeline.agents.base import candidate_actions
    from pipeline.agents.llm import parse_action
    from pipeline.llm.backends import Generation
    from pipeline.llm.tracker import action_text_from_text
    from pipeline.session.rollout import Task, _turn_row

    count("llm agent parser: any model output")
    action_text = action_text_from_text(text)
    for candidate in (action_text, text):
        action, parsed, error = parse_action(candidate, OBS)
        assert (action is None) == (error is not None)
        if action is not None:
            assert action in [{k: v for k, v in a.items() if k != "command"} for a in candidate_actions(OBS)] \
                or action == {"action": "wait", "target": None}
    agent = _agent(tiny_cfg)
    agent.reset({"episode_id": "ep_fuzz", "objective": OBS["objective"]})
    gen = Generation(prompt="p", prompt_tokens=1, generated_tokens=1, text=text, action_text=action_text,
                     stop_reason="eos")
    step = agent.finish_turn(OBS, gen)
    action, _, error = parse_action(action_text, OBS)
    assert step.model.action_valid is (error is None)
    if error is not None:
        assert step.action == {"action": "look", "target": None}  # the configured fallback
    task = Task("ep_fuzz", "s", "q", "train", OBS["objective"], "g.z8", [], [], 0)
    row, _ = _turn_row(task, 0, OBS, step, {"valid": True, "command": "look"}, 0.0, False, [], "WiP", "keep")
    assert row["action_valid"] is (error is None)  # what turns.parquet records


_AGENTS: dict = {}


def _agent(cfg):
    from pipeline.agents.llm import LLMAgent

    if "a" not in _AGENTS:
        _AGENTS["a"] = LLMAgent(cfg, seed=0, backend=NS())
    return _AGENTS["a"]


# --------------------------------------------------------------------------- grounding merge

CORRUPTIONS_JSON = ["none", "truncate", "flip", "garbage", "not_an_object", "wrong_types", "empty", "missing",
                    "directory", "invalid_utf8", "deep"]
CORRUPTIONS_TXT = ["none", "flip", "empty", "missing", "directory", "invalid_utf8"]
SURELY_BAD = {"truncate", "garbage", "not_an_object", "wrong_types", "empty", "missing", "directory", "invalid_utf8",
              "deep"}


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _good_doc(i: int, marker: str) -> dict:
    from pipeline.grounding import GroundingFileManager

    gfm = GroundingFileManager(f"ep_{i}")
    gfm.append_step_feedback(1, "open Fridge_0", "Failure", [f"feedback : spatial: {marker} is in Drawer_{i}."])
    gfm.save_final_grounding(gfm.generate_final_grounding())
    return gfm.to_dict()


def _corrupt(path: Path, kind: str, rng: random.Random) -> None:
    data = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(data[: rng.randrange(0, data.rindex(b"}"))])
    elif kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        path.write_bytes(bytes(b))
    elif kind == "garbage":
        path.write_bytes(b"\x00{" + bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))))
    elif kind == "not_an_object":
        path.write_text(rng.choice(['[1, 2]', '"text"', "42", "null", "[]"]))
    elif kind == "wrong_types":
        path.write_text(rng.choice(['{"stacked_grounding": 5}', '{"stacked_grounding": {"spatial": [1]}}',
                                    '{"final_grounding": []}',
                                    '{"final_grounding": {"spatial_grounding": {"content": 7}}}', '{"other": 1}']))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "missing":
        path.unlink()
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    elif kind == "deep":  # deeper than the JSON parser's stack
        n = rng.choice([100_000, 300_000])
        path.write_text(rng.choice(["[", '{"a":']) * n)
    elif kind == "invalid_utf8":
        cut = rng.randrange(len(data) + 1)
        path.write_bytes(data[:cut] + b"\xff\xfe\xc3" + data[cut:])


@fuzz(250)
@given(files=st.lists(st.tuples(st.booleans(), st.integers(0, 9)), min_size=1, max_size=6), seed=st.integers(0, 10**6))
def test_merge_keeps_good_grounding_files_and_names_the_bad_ones(files, seed):
    from pipeline.grounding import (
        GroundingError,
        GroundingMergeError,
        merge_grounding_files,
        render_episode_text,
    )
    from pipeline.core.io import atomic_write_json, atomic_write_text

    count("grounding merge: corrupted JSON/TXT files")
    rng = random.Random(seed)
    handler = _Records()
    log = logging.getLogger("pipeline.grounding")
    log.addHandler(handler)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            names, kinds, markers = [], [], []
            for i, (is_json, k) in enumerate(files):
                marker = f"MARK{i}x{rng.randrange(10**6)}"
                doc = _good_doc(i, marker)
                name = f"g/{i}.json" if is_json else f"g/{i}.txt"
                if is_json:
                    atomic_write_json(root / name, doc, sort_keys=False)
                    kind = CORRUPTIONS_JSON[k % len(CORRUPTIONS_JSON)]
                else:
                    atomic_write_text(root / name, render_episode_text(doc) + "\n")
                    kind = CORRUPTIONS_TXT[k % len(CORRUPTIONS_TXT)]
                _corrupt(root / name, kind, rng)
                names.append(name)
                kinds.append(kind)
                markers.append(marker)
            try:
                merged = merge_grounding_files(names, root=root)
            except GroundingMergeError as exc:
                assert all(k != "none" for k in kinds)  # only when no file is usable
                assert all(n in str(exc) for n, k in zip(names, kinds) if k in SURELY_BAD), str(exc)
                return
            except GroundingError as exc:  # any other grounding error would be a defect
                raise AssertionError(f"unexpected {exc!r}") from exc
            used = set(merged.sources)
            skipped = {s["path"]: s["reason"] for s in merged.skipped}
            assert used.isdisjoint(skipped) and used | set(skipped) == set(names)  # every file accounted for
            for name, kind, marker in zip(names, kinds, markers):
                if kind == "none":
                    assert name in used and marker in merged.content, (name, kind)
                elif kind in SURELY_BAD and not (kind == "empty" and name.endswith(".txt")):
                    assert name in skipped and skipped[name]
                    assert any(name in m for m in handler.messages), (name, handler.messages)
                    assert marker not in merged.content
    finally:
        log.removeHandler(handler)


# --------------------------------------------------------------------------- feedback


@fuzz(2000)
@given(line=st.one_of(MIXED_TEXT, st.builds(lambda t, x: f"feedback : {t}: {x}", MIXED_TEXT, MIXED_TEXT),
                      st.builds(lambda t, x: f"Feedback：{t}：{x}", st.sampled_from(
                          ["spatial", "User Preference", "user-preference", "PROCEDURAL", "general", "unknown"]),
                          MIXED_TEXT)),
       unknown=st.sampled_from(["keep", "reject"]))
def test_any_feedback_line_parses_or_is_a_named_format_error(line, unknown):
    from pipeline.grounding.feedback import FeedbackFormatError, classify_feedback_lines, parse_feedback_line
    from pipeline.grounding import feedback_from_lines
    from pipeline.core.schemas import FEEDBACK_TYPES

    count("feedback lines: random lines")
    try:
        ftype, text = parse_feedback_line(line, unknown=unknown, where="fuzz.jsonl:1")
    except FeedbackFormatError as exc:
        assert "fuzz.jsonl:1" in str(exc)
    else:
        assert ftype in FEEDBACK_TYPES and text and text == text.strip()
    try:
        grouped = classify_feedback_lines([line, line], unknown=unknown)
        assert set(grouped) == set(FEEDBACK_TYPES)
    except FeedbackFormatError:
        pass
    if unknown == "keep":
        grouped = feedback_from_lines([line], "keep")  # the grounding side keeps malformed lines
        assert set(grouped) == set(FEEDBACK_TYPES)


@fuzz(1000)
@given(ftype=st.sampled_from(["user_preference", "spatial", "procedural", "general", "User Preference"]),
       text=MIXED_TEXT)
def test_formatted_feedback_round_trips(ftype, text):
    from pipeline.grounding.feedback import format_feedback_line, parse_feedback_line

    assume(text.split())
    count("feedback lines: format -> parse round trip")
    line = format_feedback_line(ftype, text)
    assert "\n" not in line
    assert parse_feedback_line(line) == (ftype.lower().replace(" ", "_"), " ".join(text.split()))


@fuzz(300)
@given(lines=st.lists(st.one_of(
    MIXED_TEXT, st.sampled_from(['{"episode_id": "e", "step_id": 1, "line": "feedback : spatial: x"}',
                                 '{"episode_id": "e", "step_id": 0, "line": "x"}', '[1]', '{"step_id": "end"}',
                                 '{"episode_id": "e", "step_id": "end", "line": 5}', "{" * 50, "[" * 1000]),
    st.builds(lambda ln: json.dumps({"episode_id": "e", "step_id": 1, "line": ln}), MIXED_TEXT)), max_size=6))
def test_a_feedback_file_loads_or_fails_naming_file_and_line(lines):
    from pipeline.grounding.feedback import FeedbackFormatError
    from pipeline.users.file import FileFeedback

    count("feedback file: random JSONL")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "feedback.jsonl"
        path.write_text("\n".join(lines), encoding="utf-8")
        try:
            fb = FileFeedback(path)
        except FeedbackFormatError as exc:
            assert f"{path}:" in str(exc)
        else:
            assert isinstance(fb.records, dict)


@pytest.mark.parametrize("content", [b'{"episode_id": "e", "step_id": 1, "line": "feedback : spatial: \xff"}\n',
                                     b"[" * 100_000], ids=["not UTF-8", "nested too deeply"])
def test_a_feedback_file_that_cannot_be_decoded_is_named(tmp_path, content):
    from pipeline.grounding.feedback import FeedbackFormatError
    from pipeline.users.file import FileFeedback

    path = tmp_path / "feedback.jsonl"
    path.write_bytes(content)
    with pytest.raises(FeedbackFormatError, match="feedback.jsonl"):
        FileFeedback(path)


# --------------------------------------------------------------------------- objectives


def _check_signature(sig, text):
    from pipeline.memory.schemas import LANGUAGES, LENGTH_BUCKETS, STRUCTURES

    assert sig.language in LANGUAGES and sig.length_bucket in LENGTH_BUCKETS
    assert set(sig.detected_structure) <= set(STRUCTURES) and sig.detected_structure
    assert ("none" in sig.detected_structure) == (len(sig.detected_structure) == 1 and
                                                  sig.detected_structure == ["none"])
    assert sig.has_negation == ("negation" in sig.detected_structure)
    assert sig.length_bucket == ("short" if len(text) < 50 else "medium" if len(text) < 200 else "long")
    assert sig.num_aspects >= 0


@fuzz(1000)
@given(text=MIXED_TEXT)
@example(text="")
@example(text="🙂" * 60)
@example(text="냉장고에 사과를 넣지 마세요 하지만 Fridge_0는 닫아")
@example(text="把苹果放进冰箱，但是不要打开柜子")
def test_signature_builder_takes_any_objective(text):
    from pipeline.memory.signature import SignatureBuilder

    count("SignatureBuilder.build: random objectives")
    sig = SignatureBuilder().build(text)
    _check_signature(sig, text)
    assert SignatureBuilder().build(text) == sig
    if sig.contrast_marker is not None:  # the one word a signature keeps (seed 001), bounded
        assert sig.contrast_marker in text.lower() and len(sig.contrast_marker) <= 32
    if len(text) >= 24:
        assert text not in sig.model_dump_json()  # the raw text is never kept


@pytest.mark.parametrize("unit", ["안 열어 ", "不要打开 ", "🙂🍎 ", "Put Apple_2 in Fridge_0 but not ", "a", "\u200b", " "])
def test_signature_builder_on_a_hundred_thousand_characters(unit):
    from pipeline.memory.signature import SignatureBuilder

    count("SignatureBuilder.build: 10^5-character objectives")
    text = (unit * (100_000 // len(unit) + 1))[:100_000]
    sig = SignatureBuilder().build(text)
    _check_signature(sig, text)
    assert sig.length_bucket == "long"


@fuzz(300)
@given(objective=MIXED_TEXT, feedback=MIXED_TEXT)
def test_a_store_entry_never_keeps_the_objective_text(objective, feedback):
    from pipeline.envs.household.reader import HouseholdFactReader
    from pipeline.memory.store import build_entry

    count("store entry: random objectives")
    secret = f"{objective} QZX{zlib.crc32(objective.encode()) % 10**6}"  # a unique tail: found only if copied
    turns = [{"episode_id": "e", "turn_index": 0, "command": "look", "action": '{"action": "look"}',
              "action_valid": True, "status": "Failure",
              "feedback_lines": [f"feedback : general: you were asked to {secret} {feedback}".strip()],
              "feedback_general": f"you were asked to {secret} {feedback}".strip(), "reasoning": secret}]
    entry = build_entry({"episode_id": "e", "scene_id": "s", "quest_id": "q", "objective": secret, "won": False,
                         "final_reward": 0.0, "num_turns": 1, "num_invalid": 0}, turns, reader=HouseholdFactReader())
    assert secret not in entry.model_dump_json()
