"""Grounding capture, episode-end generation and the ``ground`` stage (seed 000)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from pipeline import grounding as G
from pipeline.grounding.feedback import classify_feedback_lines
from pipeline.core.io import read_parquet, write_parquet
from pipeline.core.schemas import episodes_table, turns_table
from pipeline.grounding import episodes as S
from pipeline.llm.backends import BackendConfigError

TS = "2026-01-27T00:00:00+00:00"


@pytest.fixture(autouse=True)
def _no_source_date_epoch(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)


# --------------------------------------------------------------------------- capture


def test_append_step_feedback_fills_per_step_and_stacked_exactly_as_the_seed():
    gfm = G.GroundingFileManager(1)
    rec = gfm.append_step_feedback(1, "go to kitchen", "Success", {"spatial": "kitchen is green"})
    assert rec == {"step_id": 1, "instruction": "go to kitchen", "status": "Success",
                   "feedback": {"user_preference": None, "spatial": "kitchen is green",
                                "procedural": None, "general": None}}
    gfm.append_step_feedback(2, "open Fridge_0", "Failure",
                             {"user_preference": "close the fridge", "procedural": "unlock it first"})
    assert gfm.get_stacked_grounding() == {
        "user_preference": ["[ Step2 - Failure ] : close the fridge"],
        "spatial": ["[ Step1 - Success ] : kitchen is green"],
        "procedural": ["[ Step2 - Failure ] : unlock it first"],
        "general": [],
    }
    assert list(gfm.to_dict()) == ["expr_info", "grounding_per_step", "stacked_grounding"]
    assert gfm.to_dict()["expr_info"] == {"episode_id": 1}


def test_stacked_grounding_is_a_copy():
    gfm = G.GroundingFileManager(1)
    gfm.append_step_feedback(1, "look", "WiP", {"general": "keep going"})
    gfm.get_stacked_grounding()["general"].append("tampered")
    assert gfm.get_stacked_grounding()["general"] == ["[ Step1 - WiP ] : keep going"]


@pytest.mark.parametrize("status", ["Done", "success", "", None, "FAILURE"])
def test_bad_status_is_a_clear_error(status):
    gfm = G.GroundingFileManager(1)
    with pytest.raises(G.GroundingError, match=r"step 3: status=.*: expected one of Success \| Failure \| WiP"):
        gfm.append_step_feedback(3, "look", status, {"spatial": "x"})
    assert gfm.grounding_per_step == []


def test_bad_step_id_and_feedback_values_are_clear_errors():
    gfm = G.GroundingFileManager(1)
    with pytest.raises(G.GroundingError, match=r"step_id='1': expected a non-negative int"):
        gfm.append_step_feedback("1", "look", "WiP", None)
    with pytest.raises(G.GroundingError, match=r"step 1: feedback\['spatial'\]=3: expected a string or None"):
        gfm.append_step_feedback(1, "look", "WiP", {"spatial": 3})


def test_feedback_lines_are_parsed_into_the_four_types():
    gfm = G.GroundingFileManager(1)
    rec = gfm.append_step_feedback(1, "open Cabinet_0", "Failure", [
        "feedback : procedural: unlock Cabinet_0 with Key_1 first",
        "Feedback : Spatial: Key_1 is on Table_0",
        "feedback : spatial: Table_0 is in the Kitchen",
        "",
    ])
    assert rec["feedback"] == {"user_preference": None, "spatial": "Key_1 is on Table_0; Table_0 is in the Kitchen",
                               "procedural": "unlock Cabinet_0 with Key_1 first", "general": None}
    assert gfm.get_stacked_grounding()["spatial"] == [
        "[ Step1 - Failure ] : Key_1 is on Table_0; Table_0 is in the Kitchen"]


def test_unknown_type_and_malformed_line_kept_under_general_with_a_warning(caplog):
    gfm = G.GroundingFileManager(1, unknown_type="keep")
    with caplog.at_level(logging.WARNING):
        rec = gfm.append_step_feedback(1, "look", "WiP", ["feedback : colour: the kitchen is green",
                                                          "the bedroom is blue"])
    assert rec["feedback"]["general"] == "colour: the kitchen is green; the bedroom is blue"
    text = caplog.text
    assert "'feedback : colour: the kitchen is green'" in text and "'the bedroom is blue'" in text


def test_unknown_type_and_malformed_line_rejected_by_config():
    gfm = G.GroundingFileManager(1, unknown_type="reject")
    with pytest.raises(G.GroundingError, match=r"unknown type 'colour'"):
        gfm.append_step_feedback(1, "look", "WiP", ["feedback : colour: green"])
    with pytest.raises(G.GroundingError, match=r"malformed feedback line 'the bedroom is blue'"):
        gfm.append_step_feedback(1, "look", "WiP", "the bedroom is blue")
    with pytest.raises(G.GroundingError, match=r"unknown feedback type 'colour'"):
        gfm.append_step_feedback(1, "look", "WiP", {"colour": "green"})
    assert gfm.grounding_per_step == []


def test_unknown_key_of_a_feedback_dict_is_kept_under_general(caplog):
    gfm = G.GroundingFileManager(1)
    with caplog.at_level(logging.WARNING):
        rec = gfm.append_step_feedback(4, "look", "WiP", {"general": "slow down", "colour": "green"})
    assert rec["feedback"]["general"] == "slow down; colour: green"
    assert "unknown feedback type 'colour'" in caplog.text


def test_bad_config_values_name_the_key():
    with pytest.raises(G.GroundingError, match=r"grounding.save_format='xml': expected one of json \| txt \| both"):
        G.GroundingFileManager(1, save_format="xml")
    with pytest.raises(G.GroundingError, match=r"grounding.generator='gpt': expected one of extractive \| llm"):
        G.generate_grounding(G.empty_stacked(), "gpt", timestamp=TS)
    with pytest.raises(G.GroundingError, match=r"episode_id='a/b'"):
        G.GroundingFileManager("a/b")


SEED_JSON = """{
  "expr_info": {
    "episode_id": 1
  },
  "grounding_per_step": [
    {
      "step_id": 1,
      "instruction": "go to Kitchen",
      "status": "Success",
      "feedback": {
        "user_preference": null,
        "spatial": "kitchen is green",
        "procedural": null,
        "general": null
      }
    }
  ],
  "stacked_grounding": {
    "user_preference": [],
    "spatial": [
      "[ Step1 - Success ] : kitchen is green"
    ],
    "procedural": [],
    "general": []
  },
  "final_grounding": {
    "generation_timestamp": "2026-01-27T00:00:00+00:00",
    "user_preference_grounding": {
      "content": ""
    },
    "spatial_grounding": {
      "content": "The green room is the kitchen."
    },
    "procedural_grounding": {
      "content": ""
    },
    "general_grounding_rules": {
      "content": ""
    }
  }
}
"""


def test_save_final_grounding_writes_the_seed_layout_to_the_character(tmp_path):
    gfm = G.GroundingFileManager(1, out_dir=tmp_path, latest_dirs=[tmp_path / "grounding"])
    gfm.append_step_feedback(1, "go to Kitchen", "Success", {"spatial": "kitchen is green"})
    final = G.empty_final_grounding(TS)
    final["spatial_grounding"]["content"] = "The green room is the kitchen."
    paths = gfm.save_final_grounding(final)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [
        "episode_1/grounding_episode_1.json", "episode_1/grounding_episode_1.txt",
        "grounding/grounding_latest.json", "grounding/grounding_latest.txt"]
    assert (tmp_path / "episode_1" / "grounding_episode_1.json").read_text(encoding="utf-8") == SEED_JSON
    txt = "#### Spatial Grounding\n\n- The green room is the kitchen.\n"
    assert (tmp_path / "episode_1" / "grounding_episode_1.txt").read_text(encoding="utf-8") == txt
    assert (tmp_path / "grounding" / "grounding_latest.json").read_text(encoding="utf-8") == SEED_JSON
    assert (tmp_path / "grounding" / "grounding_latest.txt").read_text(encoding="utf-8") == txt


@pytest.mark.parametrize("fmt, suffixes", [("json", [".json"]), ("txt", [".txt"]), ("both", [".json", ".txt"])])
def test_save_format(tmp_path, fmt, suffixes):
    gfm = G.GroundingFileManager("ep_a", out_dir=tmp_path, save_format=fmt)
    gfm.append_step_feedback(1, "look", "WiP", None)
    paths = gfm.save_final_grounding(G.generate_final_grounding(gfm.get_stacked_grounding(), timestamp=TS))
    assert [p.suffix for p in paths] == suffixes
    assert sorted(p.name for p in (tmp_path / "episode_ep_a").iterdir()) == [
        f"grounding_episode_ep_a{s}" for s in suffixes]


def test_save_final_grounding_rejects_a_bad_structure():
    gfm = G.GroundingFileManager(1)
    bad = G.empty_final_grounding(TS)
    del bad["procedural_grounding"]
    with pytest.raises(G.GroundingError, match=r"final_grounding.procedural_grounding: expected \{\"content\""):
        gfm.save_final_grounding(bad)
    bad = G.empty_final_grounding(TS)
    bad["spatial_grounding"] = {"content": 3}
    with pytest.raises(G.GroundingError, match=r"final_grounding.spatial_grounding"):
        gfm.save_final_grounding(bad)


# --------------------------------------------------------------------------- generation


def test_extractive_strips_prefixes_dedups_one_statement_per_fact():
    stacked = {
        "user_preference": ["[ Step4 - Failure ] : Close containers after use",
                            "[ Step9 - Failure ] : Close containers after use. (Fridge_0 not as asked.)"],
        "spatial": [
            "[ Step1 - Success ] : Key_1 is on Table_0 in the Kitchen.",
            "[ Step2 - WiP ] : Apple_2 is in Fridge_0.  The Bedroom is east of the Kitchen",
            "[ Step3 - Failure ] : key_1 is on table_0 in the kitchen; Apple_2 is in Fridge_0!",
        ],
        "procedural": ["[ Step2 - Failure ] : Cabinet_0 is locked: unlock it with Key_1 first."],
        "general": [],
    }
    final = G.extractive_final_grounding(stacked, TS)
    assert final == {
        "generation_timestamp": TS,
        "user_preference_grounding": {"content": "Close containers after use.\n"
                                                 "Close containers after use. (Fridge_0 not as asked.)"},
        "spatial_grounding": {"content": "Key_1 is on Table_0 in the Kitchen.\nApple_2 is in Fridge_0.\n"
                                         "The Bedroom is east of the Kitchen."},
        "procedural_grounding": {"content": "Cabinet_0 is locked: unlock it with Key_1 first."},
        "general_grounding_rules": {"content": ""},
    }
    assert list(final) == ["generation_timestamp", "user_preference_grounding", "spatial_grounding",
                           "procedural_grounding", "general_grounding_rules"]


def test_extractive_keeps_korean_and_chinese_text():
    stacked = {"spatial": ["[ Step1 - Success ] : 부엌은 초록색이다", "[ Step2 - WiP ] : 厨房是绿色的。冰箱在厨房里",
                           "[ Step3 - WiP ] : 부엌은 초록색이다."],
               "general": ["[ Step1 - Success ] : 천천히 하세요!"]}
    final = G.extractive_final_grounding(stacked, TS)
    assert final["spatial_grounding"]["content"] == "부엌은 초록색이다.\n厨房是绿色的。\n冰箱在厨房里。"
    assert final["general_grounding_rules"]["content"] == "천천히 하세요!"


def test_timestamp_from_source_date_epoch_or_config(monkeypatch):
    assert G.grounding_timestamp(TS) == TS
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1769472000")
    assert G.grounding_timestamp("1970-01-01T00:00:00+00:00") == "2026-01-27T00:00:00+00:00"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(G.GroundingError, match=r"SOURCE_DATE_EPOCH='yesterday': expected an integer"):
        G.grounding_timestamp(TS)
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    with pytest.raises(G.GroundingError, match=r"grounding.timestamp='now': expected an ISO 8601"):
        G.grounding_timestamp("now")


STACKED = {"user_preference": [], "spatial": ["[ Step1 - Success ] : kitchen is green"],
           "procedural": ["[ Step2 - Failure ] : open Fridge_0 before taking from it"], "general": []}


def test_llm_answer_with_prose_fences_and_braces_in_strings_is_parsed():
    prompts = []

    def generate(prompt):
        prompts.append(prompt)
        return ('Sure! Here is {the} grounding:\n```json\n{"spatial": "The green room {kitchen} is the kitchen.", '
                '"procedural_grounding": {"content": "Open Fridge_0 before taking from it."}, '
                '"general_grounding_rules": ["Do not repeat actions.", "Look first."], '
                '"user_preference_grounding": null}\n```\nDone.')

    final, info = G.generate_grounding(STACKED, "llm", generate=generate, timestamp=TS)
    assert info == {"generator": "llm", "generator_used": "llm", "fallback_reason": None}
    assert final == {
        "generation_timestamp": TS,
        "user_preference_grounding": {"content": ""},
        "spatial_grounding": {"content": "The green room {kitchen} is the kitchen."},
        "procedural_grounding": {"content": "Open Fridge_0 before taking from it."},
        "general_grounding_rules": {"content": "Do not repeat actions.\nLook first."},
    }
    assert len(prompts) == 1 and "[ Step1 - Success ] : kitchen is green" in prompts[0]
    assert '"spatial_grounding": "..."' in prompts[0]


@pytest.mark.parametrize("answer, reason", [
    ("", "unparseable answer: the backend returned an empty answer"),
    ("I cannot help with that.", "unparseable answer: no JSON object in the answer"),
    ('{"spatial_grounding": "x"', "unparseable answer: no JSON object in the answer"),
    ('{"foo": 1} [1, 2]', "unparseable answer: no JSON object in the answer has grounding keys"),
    ('{"spatial_grounding": "kitchen is green"}', "unparseable answer: the answer's JSON lacks procedural_grounding"),
    ('{"spatial_grounding": 3, "procedural_grounding": "x"}',
     "unparseable answer: the answer's 'spatial_grounding' is a int, expected a string"),
])
def test_llm_unparseable_answer_falls_back_to_extractive_with_the_reason(answer, reason):
    final, info = G.generate_grounding(STACKED, "llm", generate=lambda p: answer, timestamp=TS)
    assert info == {"generator": "llm", "generator_used": "extractive", "fallback_reason": reason}
    assert final == G.extractive_final_grounding(STACKED, TS)


def test_llm_backend_error_falls_back_and_empty_episode_skips_the_backend():
    from pipeline.grounding.generate import GenerationFailed

    def boom(prompt):
        raise GenerationFailed("BackendError: connection refused")

    final, info = G.generate_grounding(STACKED, "llm", generate=boom, timestamp=TS)
    assert info["fallback_reason"] == "backend error: BackendError: connection refused"
    assert final == G.extractive_final_grounding(STACKED, TS)
    final, info = G.generate_grounding(G.empty_stacked(), "llm", generate=boom, timestamp=TS)
    assert info["fallback_reason"] == "no feedback in this episode: the backend was not asked"
    with pytest.raises(G.GroundingError, match="grounding.generator=llm needs a text-generation backend"):
        G.generate_grounding(STACKED, "llm", generate=None, timestamp=TS)


@pytest.fixture(scope="module")
def tiny_lm():
    """A randomly initialised 2-layer GPT-2 and a BPE tokenizer trained here (no downloads)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    corpus = [json.dumps(STACKED), G.llm_grounding_prompt(STACKED), "The green room is the kitchen. {\"a\": \"b\"}"] * 4
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=1024, n_embd=32, n_layer=2,
                                       n_head=2, eos_token_id=tokenizer.eos_token_id))
    model.eval()

    def generate(prompt: str) -> str:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)
        return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

    generate.model, generate.tokenizer = model, tokenizer
    return generate


def test_llm_generator_against_a_tiny_local_model_falls_back_and_records_why(tiny_lm):
    answers = []

    def generate(prompt):
        answers.append(tiny_lm(prompt))
        return answers[-1]

    final, info = G.generate_grounding(STACKED, "llm", generate=generate, timestamp=TS)
    assert len(answers) == 1 and isinstance(answers[0], str) and answers[0]
    assert info["generator_used"] == "extractive"
    assert info["fallback_reason"].startswith("unparseable answer: ")
    assert final == G.extractive_final_grounding(STACKED, TS)
    assert tiny_lm(G.llm_grounding_prompt(STACKED)) == answers[0]  # greedy: same answer twice


def test_manager_records_the_generator_and_uses_only_this_episode():
    first = G.GroundingFileManager(1)
    first.append_step_feedback(1, "look", "WiP", {"spatial": "kitchen is green"})
    first.save_final_grounding(first.generate_final_grounding(timestamp=TS))
    second = G.GroundingFileManager(2)
    second.append_step_feedback(1, "look", "WiP", {"spatial": "bedroom is blue"})
    second.save_final_grounding(second.generate_final_grounding("llm", generate=lambda p: "no", timestamp=TS))
    doc = second.to_dict()
    assert doc["final_grounding"]["spatial_grounding"]["content"] == "bedroom is blue."
    assert doc["expr_info"] == {"episode_id": 2, "generator": "llm", "generator_used": "extractive",
                                "fallback_reason": "unparseable answer: no JSON object in the answer"}


# --------------------------------------------------------------------------- ground stage


def _turn(eid, i, lines, status="WiP", command="look"):
    return {"episode_id": eid, "turn_index": i, "observation": "{}", "action": '{"action":"look","target":null}',
            "command": command, "action_valid": command is not None, "env_feedback": "", "reward": 0.0,
            "changed": True, "repeated": False, "done": False, "won": False, "status": status,
            "feedback_lines": lines, **{f"feedback_{t}": v for t, v in classify_feedback_lines(lines).items()}}


def _episode(eid, scene, quest):
    return {"episode_id": eid, "scene_id": scene, "quest_id": quest, "split": "train", "condition": "",
            "objective": f"Put Apple_2 in Fridge_0 ({quest})"}


@pytest.fixture()
def collected(tmp_path):
    """A tiny episodes/turns pair round-tripped through the real Parquet schemas."""
    turns = [
        _turn("ep_train_s0_q0_0", 0, ["feedback : spatial: 부엌은 초록색이다"], "WiP", "go east"),
        _turn("ep_train_s0_q0_0", 1, ["feedback : procedural: open Fridge_0 first",
                                      "feedback : general: 不要重复同样的动作"], "Failure", None),
        _turn("ep_train_s0_q0_0", 2, [], "Success", "take Apple_2 from Fridge_0"),
        _turn("ep_train_s0_q1_0", 0, ["feedback : spatial: Apple_2 is in Fridge_0"], "WiP"),
        _turn("ep_train_s1_q0_0", 0, ["feedback : user_preference: Close containers after use."], "Success"),
    ]
    episodes = [_episode("ep_train_s1_q0_0", "s1", "q0"), _episode("ep_train_s0_q0_0", "s0", "q0"),
                _episode("ep_train_s0_q1_0", "s0", "q1")]
    write_parquet(turns_table(turns), tmp_path / "turns.parquet", sort_by=["episode_id", "turn_index"])
    write_parquet(episodes_table(episodes), tmp_path / "episodes.parquet", sort_by=["episode_id"])
    return (read_parquet(tmp_path / "episodes.parquet").to_pylist(),
            read_parquet(tmp_path / "turns.parquet").to_pylist())


def test_ground_core_builds_one_document_per_episode(collected):
    episodes, turns = collected
    docs = S.ground(episodes, turns, timestamp=TS)
    assert [d["expr_info"]["episode_id"] for d in docs] == ["ep_train_s0_q0_0", "ep_train_s0_q1_0",
                                                            "ep_train_s1_q0_0"]
    doc = docs[0]
    assert doc["expr_info"] == {"episode_id": "ep_train_s0_q0_0", "scene_id": "s0", "quest_id": "q0",
                                "objective": "Put Apple_2 in Fridge_0 (q0)", "generator": "extractive",
                                "generator_used": "extractive", "fallback_reason": None}
    assert [(s["step_id"], s["instruction"], s["status"]) for s in doc["grounding_per_step"]] == [
        (1, "go east", "WiP"), (2, '{"action":"look","target":null}', "Failure"),
        (3, "take Apple_2 from Fridge_0", "Success")]
    assert doc["stacked_grounding"] == {
        "user_preference": [], "spatial": ["[ Step1 - WiP ] : 부엌은 초록색이다"],
        "procedural": ["[ Step2 - Failure ] : open Fridge_0 first"],
        "general": ["[ Step2 - Failure ] : 不要重复同样的动作"]}
    assert doc["final_grounding"]["spatial_grounding"] == {"content": "부엌은 초록색이다."}
    assert doc["final_grounding"]["general_grounding_rules"] == {"content": "不要重复同样的动作。"}
    # Only this episode's feedback: the other s0 episode's fact is not in it.
    assert "Apple_2 is in Fridge_0" not in json.dumps(doc["final_grounding"])


def test_ground_uses_raw_lines_when_typed_columns_are_empty(collected):
    episodes, turns = collected
    for t in turns:
        for k in ("user_preference", "spatial", "procedural", "general"):
            t[f"feedback_{k}"] = None
    assert S.ground(episodes, turns, timestamp=TS) == S.ground(*collected, timestamp=TS)


def test_turn_without_status_is_a_clear_error(collected):
    episodes, turns = collected
    turns[1]["status"] = None
    with pytest.raises(G.GroundingError, match=r"episode ep_train_s0_q0_0 turn 1 \(turns.parquet\): step 2: "
                                               r"status=None: expected one of Success \| Failure \| WiP"):
        S.ground(episodes, turns, timestamp=TS)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_ground_outputs_layout_utf8_and_byte_identical_reruns(collected, tmp_path):
    out = tmp_path / "grounding"
    index = S.write_ground_outputs(S.ground(*collected, timestamp=TS), out, "both")
    files = _tree(out)
    assert sorted(files) == [
        "episode_ep_train_s0_q0_0/grounding_episode_ep_train_s0_q0_0.json",
        "episode_ep_train_s0_q0_0/grounding_episode_ep_train_s0_q0_0.txt",
        "episode_ep_train_s0_q1_0/grounding_episode_ep_train_s0_q1_0.json",
        "episode_ep_train_s0_q1_0/grounding_episode_ep_train_s0_q1_0.txt",
        "episode_ep_train_s1_q0_0/grounding_episode_ep_train_s1_q0_0.json",
        "episode_ep_train_s1_q0_0/grounding_episode_ep_train_s1_q0_0.txt",
        "grounding_latest.json", "grounding_latest.txt", "index.json",
        "scenes/s0/grounding_latest.json", "scenes/s0/grounding_latest.txt",
        "scenes/s1/grounding_latest.json", "scenes/s1/grounding_latest.txt",
    ]
    assert files["scenes/s0/grounding_latest.json"] == files[
        "episode_ep_train_s0_q1_0/grounding_episode_ep_train_s0_q1_0.json"]
    assert files["grounding_latest.txt"] == files["episode_ep_train_s1_q0_0/grounding_episode_ep_train_s1_q0_0.txt"]
    txt = files["episode_ep_train_s0_q0_0/grounding_episode_ep_train_s0_q0_0.txt"].decode("utf-8")
    assert txt == ("#### Spatial Grounding\n\n- 부엌은 초록색이다.\n\n#### Procedural Grounding\n\n"
                   "- open Fridge_0 first.\n\n#### General Grounding Rules\n\n- 不要重复同样的动作。\n")
    raw = files["episode_ep_train_s0_q0_0/grounding_episode_ep_train_s0_q0_0.json"].decode("utf-8")
    assert "부엌은 초록색이다" in raw and "\\u" not in raw
    assert index["scenes"] == {"s0": ["ep_train_s0_q0_0", "ep_train_s0_q1_0"], "s1": ["ep_train_s1_q0_0"]}
    assert index["episodes"][0] == {"episode_id": "ep_train_s0_q0_0", "scene_id": "s0",
                                    "json": "episode_ep_train_s0_q0_0/grounding_episode_ep_train_s0_q0_0.json",
                                    "txt": "episode_ep_train_s0_q0_0/grounding_episode_ep_train_s0_q0_0.txt"}
    # A rerun into a folder holding stale files: same bytes, stale files gone.
    (out / "episode_old").mkdir()
    (out / "episode_old" / "stale.json").write_text("{}")
    S.write_ground_outputs(S.ground(*collected, timestamp=TS), out, "both")
    assert _tree(out) == files


def test_ground_outputs_save_format_json_only(collected, tmp_path):
    index = S.write_ground_outputs(S.ground(*collected, timestamp=TS), tmp_path / "g", "json")
    assert not list((tmp_path / "g").rglob("*.txt"))
    assert index["episodes"][0]["txt"] is None


def test_failed_write_keeps_the_previous_folder(collected, tmp_path):
    out = tmp_path / "g"
    S.write_ground_outputs(S.ground(*collected, timestamp=TS), out, "both")
    before = _tree(out)
    docs = S.ground(*collected, timestamp=TS)
    docs[1]["expr_info"]["scene_id"] = "bad/scene"
    with pytest.raises(G.GroundingError, match=r"scene_id='bad/scene'"):
        S.write_ground_outputs(docs, out, "both")
    assert _tree(out) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left


def test_ground_metrics(collected):
    m = S.ground_metrics(S.ground(*collected, timestamp=TS))
    assert m == {"num_episodes": 3, "num_steps": 5, "steps_with_feedback": 4,
                 "stacked_entries": {"user_preference": 1, "spatial": 2, "procedural": 1, "general": 1},
                 "final_statements": {"user_preference": 1, "spatial": 2, "procedural": 1, "general": 1},
                 "generator": "extractive", "generator_used": {"extractive": 3}, "fallbacks": {}}


def test_stage_llm_generator_wired_to_the_configured_backend(tiny_lm, collected, tmp_path):
    """``grounding.generator=llm`` through pipeline.llm's backend, loading a local model folder."""
    from omegaconf import OmegaConf

    from pipeline.core.config import ConfigError, compose_text, project_root, validate

    model_dir = tmp_path / "tiny_model"
    tiny_lm.model.save_pretrained(model_dir)
    tiny_lm.tokenizer.save_pretrained(model_dir)
    # the grounding's own token budget, not the agent's turn's (sampling.max_new_tokens: 96)
    overrides = ["grounding.generator=llm", f"model.name_or_path={model_dir}", "sampling.do_sample=false",
                 "grounding.max_new_tokens=8"]
    cfg = validate(OmegaConf.create(compose_text(project_root(), overrides)))
    assert cfg.sampling.max_new_tokens == 96
    generate = S.make_generate(cfg)
    docs = S.ground(*collected, generator="llm", generate=generate, timestamp=TS)
    extractive = S.ground(*collected, timestamp=TS)
    for doc, ref in zip(docs, extractive):
        assert doc["expr_info"]["generator"] == "llm"
        assert doc["expr_info"]["generator_used"] == "extractive"
        assert doc["expr_info"]["fallback_reason"] == \
            "truncated answer: cut off after 8 tokens (grounding.max_new_tokens=8)"
        assert doc["final_grounding"] == ref["final_grounding"]
    assert S.ground_metrics(docs)["fallbacks"] == {"truncated answer": 3}
    with pytest.raises(G.GroundingError, match=r"unusable on 3 of 3 episodes"):  # a random model: no grounding
        S.check_backend_fallbacks(docs, cfg.grounding.max_error_fraction)
    bad = OmegaConf.merge(cfg, {"model": {"name_or_path": str(tmp_path / "missing")}})
    with pytest.raises(ConfigError, match=r"grounding.generator=llm: cannot build the text-generation backend "
                                          r"\(model.backend=transformers, model.name_or_path=.*missing\)"):
        S.make_generate(bad)
    assert S.make_generate(OmegaConf.merge(cfg, {"grounding": {"generator": "extractive"}})) is None


# --------------------------------------------------------------------------- no silent fallback (issue 43)


GOOD_ANSWER = '{"user_preference": "close it", "spatial": "kitchen is green", "procedural": "x", "general": "y"}'


def _failing_backend(cfg_errors, budgets=None):
    """A ``make_backend`` stand-in: each call raises the next of ``cfg_errors`` (None: a good answer; a
    string: that answer; a ``(text, stop_reason)`` pair: that answer, so stopped); ``budgets`` gets each
    call's ``max_new_tokens``."""
    from pipeline.llm.backends import Generation

    answers = iter(cfg_errors)

    class Backend:
        def generate(self, batch, seeds=None, *, max_new_tokens=None, early_stop=None):
            if budgets is not None:
                budgets.append(max_new_tokens)
            item = next(answers)
            if isinstance(item, BaseException):
                raise item
            text, stop = (item, "eos") if isinstance(item, str) else item or (GOOD_ANSWER, "eos")
            return [Generation(prompt="p", prompt_tokens=1, generated_tokens=len(text.split()), text=text,
                               stop_reason=stop)]

    return lambda model_cfg, sampling_cfg: Backend()


@pytest.mark.parametrize("error", [
    BackendConfigError("authentication failed: POST http://h/v1/chat/completions: HTTP 401"),
    BackendConfigError("unknown model: http://h/v1 does not serve model.api_model='nope' (HTTP 404)"),
    KeyError("choices"),  # a programming error in the backend or the parser
    TypeError("generate() got an unexpected keyword argument 'seed'"),
], ids=["401", "404", "KeyError", "TypeError"])
def test_a_configuration_or_programming_error_stops_the_llm_generator_instead_of_falling_back(
        error, collected, tiny_cfg, monkeypatch):
    """It used to be caught like any failure: every episode silently got the extractive grounding."""
    from omegaconf import OmegaConf

    monkeypatch.setattr(S, "make_backend", _failing_backend([error] * 3))
    cfg = OmegaConf.merge(tiny_cfg, {"grounding": {"generator": "llm"}})
    with pytest.raises(type(error), match=re.escape(str(error.args[0]))):
        S.ground(*collected, generator="llm", generate=S.make_generate(cfg), timestamp=TS)


def test_failed_calls_fall_back_counted_and_past_max_error_fraction_the_ground_stage_stops(
        collected, tiny_cfg, monkeypatch):
    from omegaconf import OmegaConf

    from pipeline.llm.backends import BackendError

    cfg = OmegaConf.merge(tiny_cfg, {"grounding": {"generator": "llm"}})
    # 1 of 3 asked episodes failed: below the default limit (0.5), counted and named
    monkeypatch.setattr(S, "make_backend", _failing_backend([None, BackendError("HTTP 503 after 3 attempts"), None]))
    docs = S.ground(*collected, generator="llm", generate=S.make_generate(cfg), timestamp=TS)
    S.check_backend_fallbacks(docs, cfg.grounding.max_error_fraction)
    m = S.ground_metrics(docs)
    assert m["generator"] == "llm" and m["generator_used"] == {"extractive": 1, "llm": 2}
    assert m["fallbacks"] == {"backend error": 1}
    # 2 of 3: more than the limit, the stage would write nothing
    monkeypatch.setattr(S, "make_backend", _failing_backend([BackendError("HTTP 503 after 3 attempts")] * 2 + [None]))
    docs = S.ground(*collected, generator="llm", generate=S.make_generate(cfg), timestamp=TS)
    with pytest.raises(G.GroundingError, match=r"the model call failed or its answer was unusable on 2 of 3 episodes "
                                               r"it was asked for \(67%\), more than grounding.max_error_fraction=0.5, "
                                               r"so nothing was written; the first failure: episode ep_train_s0_q0_0: "
                                               r"backend error: BackendError: HTTP 503"):
        S.check_backend_fallbacks(docs, cfg.grounding.max_error_fraction)
    S.check_backend_fallbacks(docs, 1.0)  # the limit is the config's


@pytest.mark.parametrize("answers, reasons", [
    (["", "", None], {"unparseable answer": 2}),
    (["I cannot help with that.", "I'm sorry, but I can't assist with that request.", None],
     {"unparseable answer": 2}),
    ([('{"spatial": "kitchen is gr', "max_new_tokens"), ('{"user_preference": "close it", "spatial": "kit',
                                                          "max_new_tokens"), None], {"truncated answer": 2}),
    ([(GOOD_ANSWER, "max_new_tokens"), ("", "eos"), None], {"truncated answer": 1, "unparseable answer": 1}),
], ids=["empty", "refusal", "truncated-json", "cut-off-and-empty"])
def test_unusable_answers_count_as_failures_and_past_max_error_fraction_the_ground_stage_stops(
        answers, reasons, collected, tiny_cfg, monkeypatch):
    """Issue 66, finding 1: an empty answer, a refusal or an answer cut off at its budget fell back for every
    episode while only transport errors counted, and the stage exited 0."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(tiny_cfg, {"grounding": {"generator": "llm"}})
    budgets: list = []
    monkeypatch.setattr(S, "make_backend", _failing_backend(answers, budgets))
    docs = S.ground(*collected, generator="llm", generate=S.make_generate(cfg), timestamp=TS)
    assert budgets == [cfg.grounding.max_new_tokens] * 3 == [512] * 3  # the grounding's own budget, not sampling's
    m = S.ground_metrics(docs)
    assert m["generator_used"] == {"extractive": 2, "llm": 1} and m["fallbacks"] == reasons
    with pytest.raises(G.GroundingError, match=r"the model call failed or its answer was unusable on 2 of 3 episodes"):
        S.check_backend_fallbacks(docs, cfg.grounding.max_error_fraction)
    S.check_backend_fallbacks(docs, 1.0)


def scripted_server(answers):
    """A :class:`~tests.reliability.helpers.FakeOpenAI` on 127.0.0.1 whose n-th completion is ``answers[n]``
    (``(content, finish_reason)``, the last one repeated; requests one at a time)."""
    from tests.reliability.helpers import FakeOpenAI

    class Scripted(FakeOpenAI):
        def completion(self) -> bytes:
            content, finish = answers[min(len(self.requests), len(answers)) - 1]
            return json.dumps({"id": "cmpl-1", "object": "chat.completion", "model": "fake",
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                            "finish_reason": finish}],
                               "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}}).encode()

    return Scripted()


@pytest.mark.timeout(60)
def test_unusable_answers_from_a_real_server_stop_the_ground_stage(collected, tiny_cfg):
    """The openai backend against a server on 127.0.0.1: an empty answer, a refusal and a JSON cut off by the
    server (finish_reason=length) fail the run; a healthy server's answers pass. Each request asks for
    grounding.max_new_tokens tokens (its max_tokens), not sampling.max_new_tokens."""
    from omegaconf import OmegaConf

    def config(url):
        return OmegaConf.merge(tiny_cfg, {
            "grounding": {"generator": "llm", "max_new_tokens": 300},
            "model": {"backend": "openai", "base_url": url, "api_model": "fake-model", "max_retries": 0,
                      "logprobs": False, "api_key_env": "GROUNDING_TEST_UNSET_KEY"}})

    unusable = [("", "stop"), ("I cannot help with that.", "stop"), ('{"user_preference": "close it", "spa', "length")]
    with scripted_server(unusable) as server:
        docs = S.ground(*collected, generator="llm", generate=S.make_generate(config(server.url)), timestamp=TS)
    assert [body["max_tokens"] for _, body in server.requests] == [300] * 3
    assert [d["expr_info"]["fallback_reason"] for d in docs] == [
        "unparseable answer: the backend returned an empty answer",
        "unparseable answer: no JSON object in the answer",
        "truncated answer: cut off after 7 tokens (grounding.max_new_tokens=300)"]
    with pytest.raises(G.GroundingError, match=r"unusable on 3 of 3 episodes .* the first failure: episode "
                                               r"ep_train_s0_q0_0: unparseable answer: the backend returned an empty"):
        S.check_backend_fallbacks(docs, 0.5)
    with scripted_server([(GOOD_ANSWER, "stop")]) as server:
        docs = S.ground(*collected, generator="llm", generate=S.make_generate(config(server.url)), timestamp=TS)
    S.check_backend_fallbacks(docs, 0.0)
    assert S.ground_metrics(docs)["generator_used"] == {"llm": 3}


def test_grounding_max_error_fraction_is_range_checked(tiny_cfg):
    from omegaconf import OmegaConf

    from pipeline.core.config import ConfigError, validate

    with pytest.raises(ConfigError, match=r"grounding.max_error_fraction=1.5: expected in \[0, 1\]"):
        validate(OmegaConf.merge(tiny_cfg, {"grounding": {"max_error_fraction": 1.5}}))
