"""Streaming JSON-action tracking on hand-built token sequences, and the per-episode tensors.

The tokenizer is a byte-level BPE trained here on a few sentences (so ``{"``, ``"}`` and
``}}`` are single tokens, and unseen characters such as ``€`` are split into partial-UTF-8
byte tokens), wrapped as a transformers fast tokenizer and reloaded from disk.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.io import ArtifactError
from pipeline.llm.tensors import (
    TensorConsistencyError,
    check_consistency,
    load_episode_tensors,
    save_episode_tensors,
)
from pipeline.llm.tiny import train_tokenizer
from pipeline.llm.tracker import (
    ActionStream,
    IncrementalDecoder,
    JsonActionTracker,
    decode_fn,
    find_json_object,
    track_ids,
)

CORPUS = [
    'I see a cabinet. {"action": "open", "target": "Cabinet_0"}',
    'Go to the kitchen {"action": "go_to", "target": "Kitchen"}}',
    '{"action": "look", "target": null, "memory": {"plan": ["a", "b"]}}',
    'The "quote" and {braces} in prose {"a": "b\\"}"}',
    "héllo wörld, the apple is in the fridge.",
] * 5


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(CORPUS, vocab_size=400).save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, others above 255."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHARS = _bytes_to_unicode()


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def byte_ids(tok, text: str) -> list[int]:
    """One token per UTF-8 byte (GPT-2's byte-to-unicode alphabet): partial UTF-8 tokens."""
    return [tok.convert_tokens_to_ids(BYTE_CHARS[b]) for b in text.encode("utf-8")]


def masked_text(tok, turn) -> str:
    ids = [i for i, m in zip(turn.generated_ids, turn.action_token_mask) if m]
    return decode_fn(tok)(ids)


def assert_consistent(tok, turn):
    assert len(turn.action_token_mask) == len(turn.generated_ids)
    check_consistency(tok, {"generated_ids": turn.generated_ids, "action_token_mask": turn.action_token_mask},
                      turn.action_text)


# ----------------------------------------------------------------- tokenizer premises


def test_tokenizer_merges_braces_with_other_characters(tok):
    pieces = tok.convert_ids_to_tokens(ids_of(tok, 'go {"action": "x"}} now'))
    assert 'Ġ{"' in pieces and '"}}' in pieces


def test_isolated_decode_breaks_on_partial_utf8_but_incremental_does_not(tok):
    ids = byte_ids(tok, "€")
    assert len(ids) == 3
    assert tok.decode(ids[:1]) == "\ufffd"  # seed 003's per-token decode sees garbage
    dec = IncrementalDecoder(tok)
    pieces = [dec.push(i) for i in ids]
    assert pieces == ["", "", "€"]


# ----------------------------------------------------------------- tracker cases


def test_merged_closing_braces_single_token(tok):
    text = 'I go {"action": "look", "target": null}} and more'
    ids = ids_of(tok, text)
    turn = track_ids(tok, ids, early_stop=True)
    assert turn.tracking_method == "stream" and turn.stop_reason == "json_closed"
    assert turn.action_text == '{"action": "look", "target": null}'
    last = tok.convert_ids_to_tokens([turn.generated_ids[turn.action_token_end_index - 1]])[0]
    assert last == '}}'  # the closing token also carries a stray brace
    assert turn.action_token_end_index == len(turn.generated_ids)  # stopped right there
    assert_consistent(tok, turn)


def test_merged_opening_brace_with_quote(tok):
    text = 'Plan: {"action": "open", "target": "Cabinet_0"}'
    turn = track_ids(tok, ids_of(tok, text))
    first = tok.convert_ids_to_tokens([turn.generated_ids[turn.action_token_start_index]])[0]
    assert first == 'Ġ{"'
    assert masked_text(tok, turn) == ' {"action": "open", "target": "Cabinet_0"}'
    assert_consistent(tok, turn)


def test_braces_inside_strings_do_not_count(tok):
    action = '{"action": "examine", "target": "a {weird}} name{", "memory": {"note": "}}}"}}'
    turn = track_ids(tok, ids_of(tok, "Look: " + action + " trailing } text"), early_stop=True)
    assert turn.action_text == action
    assert_consistent(tok, turn)


@pytest.mark.parametrize("action", [
    '{"action": "say", "target": "he said \\"}\\" ok"}',  # escaped quotes around a brace
    '{"action": "say", "target": "ends with backslash \\\\"}',  # \\ then the closing quote
    '{"action": "say", "target": "\\\\\\"{"}',  # \\ \" { : the brace stays inside the string
])
def test_escaped_quotes(tok, action):
    import json

    json.loads(action)  # the premise: each case is valid JSON
    turn = track_ids(tok, ids_of(tok, "ok " + action + "}} tail"), early_stop=True)
    assert turn.action_text == action
    assert_consistent(tok, turn)


def test_nested_objects(tok):
    action = '{"action": "open", "target": "Fridge_0", "memory": {"plan": ["a", {"b": {"c": 1}}], "x": {}}}'
    turn = track_ids(tok, ids_of(tok, "Reasoning first.\n" + action + "\nafter"))
    assert turn.tracking_method == "stream" and turn.action_text == action
    assert_consistent(tok, turn)


def test_leading_prose_with_stray_braces(tok):
    text = 'I use {braces} and { notes} first, then {"action": "look", "target": null}'
    turn = track_ids(tok, ids_of(tok, text), early_stop=True)
    assert turn.tracking_method == "stream"
    assert turn.action_text == '{"action": "look", "target": null}'
    assert_consistent(tok, turn)


def test_no_json_at_all(tok):
    ids = ids_of(tok, "I do not know what to do, so I will wait.")
    turn = track_ids(tok, ids, "eos", early_stop=True)
    assert turn.tracking_method == "none" and turn.stop_reason == "eos"
    assert turn.action_text is None
    assert turn.action_token_start_index is None and turn.action_token_end_index is None
    assert turn.action_token_mask == [False] * len(ids) and turn.generated_ids == ids
    assert_consistent(tok, turn)


def test_json_cut_off_by_max_new_tokens(tok):
    ids = ids_of(tok, 'Thinking... {"action": "open", "target": "Cab')
    turn = track_ids(tok, ids, "max_new_tokens", early_stop=True)
    assert turn.stop_reason == "max_new_tokens" and turn.tracking_method == "none"
    assert not any(turn.action_token_mask)


def test_fallback_search_when_the_stream_is_derailed(tok):
    # A prose brace followed by a quote opens a candidate that never balances; the
    # string search after generation (seed 003's backup) still finds the action.
    text = 'Note {"unclosed then real {"action": "look", "target": null} end'
    turn = track_ids(tok, ids_of(tok, text), early_stop=True)
    assert turn.tracking_method == "fallback" and turn.stop_reason == "max_new_tokens"
    assert turn.action_text == '{"action": "look", "target": null}'
    assert_consistent(tok, turn)


def test_partial_utf8_tokens_around_the_action(tok):
    text = '€ ok {"action": "put", "target": "Äpfel€", "receptacle": "Fridge_0"}€€'
    ids = byte_ids(tok, "€ ok ") + ids_of(tok, '{"action": "put", "target": "Ä') + byte_ids(tok, "pfel€") \
        + ids_of(tok, '", "receptacle": "Fridge_0"}') + byte_ids(tok, "€€")
    turn = track_ids(tok, ids)
    assert turn.text == text == tok.decode(ids)
    assert turn.action_text == '{"action": "put", "target": "Äpfel€", "receptacle": "Fridge_0"}'
    assert_consistent(tok, turn)


def test_brace_sharing_a_token_with_a_partial_character(tok):
    # "{" then the first byte of "€" in one piece of text: the brace belongs to the token
    # holding its byte, even though the token ends inside a character.
    stream = ActionStream(tok)
    for tid in ids_of(tok, "x ") + byte_ids(tok, '{"a": "€"}'):
        stream.push(tid)
    turn = stream.finish("eos")
    assert turn.action_text == '{"a": "€"}'
    first = turn.generated_ids[turn.action_token_start_index]
    assert tok.convert_ids_to_tokens([first])[0] == "{"
    assert_consistent(tok, turn)


def test_tracker_without_tokenizer_takes_token_texts():
    stream = ActionStream(None)
    for piece in ["Ok ", '{"', "action", '": "', "look", '"}', "}", " bye"]:
        if stream.push(None, piece=piece):
            break
    turn = stream.finish("json_closed")
    assert turn.action_text == '{"action": "look"}' and turn.action_token_mask[1:6] == [True] * 5
    assert turn.num_tokens == 6


def test_find_json_object_and_invalid_candidates():
    assert find_json_object("no json") is None
    assert find_json_object('{bad} {"a": 1} {"b": 2}')[2] == {"a": 1}
    tr = JsonActionTracker()
    assert not tr.feed('{"a": nope}')  # balanced but not JSON: dropped
    assert tr.feed(' {"a": 1}') and tr.text[tr.start_char:tr.end_char] == '{"a": 1}'


ACTIONS = [
    '{"action": "open", "target": "Cabinet_0"}',
    '{"action": "go_to", "target": "Kitchen", "memory": {"plan": ["a", "b"], "n": {"x": "}{"}}}',
    '{"action": "say", "target": "\\"quoted\\" {brace} €"}',
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix=st.text(alphabet=st.sampled_from(list("ab €é.\n\"")), max_size=12),
    action=st.sampled_from(ACTIONS),
    suffix=st.text(alphabet=st.sampled_from(list("}{ x€\"")), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
    byte_mode=st.lists(st.booleans(), min_size=9, max_size=9),
)
def test_any_tokenization_gives_the_same_action(tok, prefix, action, suffix, cuts, byte_mode):
    """Split the text anywhere, tokenize pieces by BPE or byte by byte: same action, consistent mask."""
    text = prefix + action + suffix
    bounds = sorted({0, len(text), *[c % (len(text) + 1) for c in cuts]})
    ids: list[int] = []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        ids += byte_ids(tok, text[a:b]) if byte_mode[k % 9] else ids_of(tok, text[a:b])
    turn = track_ids(tok, ids, early_stop=True)
    # Prose never contains '{' here, so the first object is the action.
    assert turn.action_text == action and turn.tracking_method == "stream"
    assert_consistent(tok, turn)
    assert turn.text == decode_fn(tok)(turn.generated_ids)


# ----------------------------------------------------------------- tensors


def _turns():
    return [
        {"turn_index": 0, "generated_ids": [5, 6, 7, 8], "action_token_mask": [False, True, True, False],
         "logprobs": [-0.1, -0.2, -0.3, -0.4]},
        {"turn_index": 1, "generated_ids": torch.tensor([9, 10]), "action_token_mask": torch.tensor([False, False])},
    ]


def test_episode_tensors_round_trip_and_bytes(tmp_path):
    p = save_episode_tensors(tmp_path / "ep.pt", _turns())
    data = load_episode_tensors(p)
    assert data["format"] == "pipeline.episode_tensors/1" and len(data["turns"]) == 2
    t0 = load_episode_tensors(p, turn_index=0)
    assert t0["generated_ids"].dtype == torch.int64 and t0["action_token_mask"].dtype == torch.bool
    assert t0["generated_ids"].tolist() == [5, 6, 7, 8] and t0["logprobs"].dtype == torch.float32
    assert "logprobs" not in load_episode_tensors(p, turn_index=1)
    # The same values give the same bytes, whatever the file is called.
    q = save_episode_tensors(tmp_path / "other" / "x.pt", _turns())
    assert hashlib.sha256(p.read_bytes()).digest() == hashlib.sha256(q.read_bytes()).digest()
    # The collect stage's own loader (weights_only) reads the same file.
    assert torch.load(p, weights_only=True)["turns"][1]["turn_index"] == 1


def test_episode_tensors_bad_input(tmp_path):
    with pytest.raises(ValueError, match="turn 0: 3 generated_ids but 2 mask"):
        save_episode_tensors(tmp_path / "a.pt", [{"generated_ids": [1, 2, 3], "action_token_mask": [True, False]}])
    with pytest.raises(ValueError, match="turn 0: needs generated_ids"):
        save_episode_tensors(tmp_path / "a.pt", [{"generated_ids": [1]}])
    assert not (tmp_path / "a.pt").exists()
    with pytest.raises(ArtifactError, match="missing tensor file"):
        load_episode_tensors(tmp_path / "nope.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a zip")
    with pytest.raises(ArtifactError, match="corrupt tensor file"):
        load_episode_tensors(tmp_path / "bad.pt")
    p = save_episode_tensors(tmp_path / "ok.pt", _turns())
    with pytest.raises(KeyError, match="no turn 7"):
        load_episode_tensors(p, turn_index=7)


def test_check_consistency_rejects_wrong_masks(tok):
    action = '{"action": "look", "target": null}'
    ids = ids_of(tok, "Hmm. " + action + " bye")
    turn = track_ids(tok, ids)
    good = {"generated_ids": turn.generated_ids, "action_token_mask": turn.action_token_mask}
    check_consistency(tok, good, action)
    s, e = turn.action_token_start_index, turn.action_token_end_index
    wider = [s - 1 <= i < e for i in range(len(ids))]
    with pytest.raises(TensorConsistencyError, match="wider"):
        check_consistency(tok, {**good, "action_token_mask": wider}, action)
    shorter = [s <= i < e - 1 for i in range(len(ids))]
    with pytest.raises(TensorConsistencyError, match="does not contain"):
        check_consistency(tok, {**good, "action_token_mask": shorter}, action)
    holes = list(turn.action_token_mask)
    holes[s + 1] = False
    with pytest.raises(TensorConsistencyError, match="not contiguous"):
        check_consistency(tok, {**good, "action_token_mask": holes}, action)
    with pytest.raises(TensorConsistencyError, match="no action text"):
        check_consistency(tok, good, None)


def test_token_statistics():
    from pipeline.llm.accounting import token_statistics

    rows = [
        {"prompt_tokens": 100, "generated_tokens": 30, "stop_reason": "json_closed", "tracking_method": "stream"},
        {"prompt_tokens": 120, "generated_tokens": 96, "stop_reason": "max_new_tokens", "tracking_method": "none"},
        {"prompt_tokens": None, "generated_tokens": None, "stop_reason": None, "tracking_method": None},  # rule agent
    ]
    s = token_statistics(rows, max_new_tokens=96)
    assert s["llm_turns"] == 2 and s["prompt_tokens"] == 220 and s["generated_tokens"] == 126
    assert s["stop_reasons"] == {"json_closed": 1, "max_new_tokens": 1} and s["json_closed_rate"] == 0.5
    assert s["early_stop_tokens_saved_max"] == 66 and s["action_tracked_rate"] == 0.5
    assert token_statistics(rows[2:], 96) == {"llm_turns": 0}
