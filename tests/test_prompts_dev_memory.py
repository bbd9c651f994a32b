"""Dev-memory tool (seed 002 section 6): stub callable, canned reply, and a tiny local model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.tools import dev_memory
from pipeline.prompts import PromptOrganizer

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = "Goal: $objective\n## Memory\n- Last: $memory[previous_action]\n- Plan: $memory[plan]\nAt: $agent_location\n"


def test_run_with_stub_callable():
    seen = []

    def generate(prompt: str) -> str:
        seen.append(prompt)
        return ('I should open the fridge.\n{"action": "open", "target": "Fridge_0", '
                '"memory": {"previous_action": "open Fridge_0", "plan": ["take Apple_2", "put it in"]}}')

    org = PromptOrganizer({"memory_defaults": {"previous_action": "", "plan": ""}})
    res = dev_memory.run_dev_memory(TEMPLATE, generate, organizer=org)
    assert seen == [res.prompt]
    assert res.prompt == ("Goal: Put Apple_2 in Fridge_0 and close it\n## Memory\n- Last: None\n- Plan: None\n"
                          "At: Kitchen\n")
    assert res.response["action"] == "open" and res.memory_updated
    assert res.memory == {"previous_action": "open Fridge_0", "plan": ["take Apple_2", "put it in"]}
    assert res.rerendered_prompt == ("Goal: Put Apple_2 in Fridge_0 and close it\n## Memory\n"
                                     "- Last: open Fridge_0\n- Plan: - take Apple_2\n- put it in\nAt: Kitchen\n")
    report = dev_memory.format_result(res)
    for title in ("model output", "returned JSON", "memory dict", "prompt re-rendered with the memory"):
        assert f"===== {title} =====" in report


def test_run_without_json_keeps_memory():
    res = dev_memory.run_dev_memory(TEMPLATE, lambda p: "no json here", memory={"previous_action": "look"},
                                    observation={"agent_location": "Bedroom"}, variables={"objective": "o"})
    assert res.response is None and not res.memory_updated
    assert res.memory == {"previous_action": "look"}
    assert res.rerendered_prompt == res.prompt
    assert "- Last: look\n" in res.prompt and "At: Bedroom" in res.prompt
    assert "(no JSON object in the output)" in dev_memory.format_result(res)


def test_cli_with_canned_response(tmp_path, capsys):
    prompt = tmp_path / "p.txt"
    prompt.write_text(TEMPLATE, encoding="utf-8")
    rc = dev_memory.main(["--prompt", str(prompt), "--memory", '{"plan": ["a"]}', "--json", "--response",
                          '{"action": "look", "target": null, "memory": {"previous_action": "look"}}'])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["response"] == {"action": "look", "target": None, "memory": {"previous_action": "look"}}
    # The configured defaults fill what the response's memory lacks (prompts.memory_merge_defaults).
    assert out["memory"]["previous_action"] == "look" and out["memory"]["plan"] == ""
    assert "- Last: look\n- Plan: None\n" in out["rerendered_prompt"]
    assert "- Plan: - a\n" in out["prompt"]


def test_cli_without_model_is_a_clear_error(tmp_path, capsys):
    prompt = tmp_path / "p.txt"
    prompt.write_text(TEMPLATE, encoding="utf-8")
    assert dev_memory.main(["--prompt", str(prompt), "model=none"]) == 2  # the default (policy) has a model
    assert "model.name_or_path" in capsys.readouterr().err
    assert dev_memory.main(["--prompt", str(tmp_path / "missing.txt"), "--response", "x"]) == 2
    assert "missing.txt does not exist" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised 1-layer GPT-2 and a byte-level BPE tokenizer trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [TEMPLATE, (ROOT / "conf/templates/system_compact.txt").read_text(encoding="utf-8"),
              '{"action": "open", "target": "Fridge_0", "memory": {"plan": ["x"]}}'] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=2048, n_embd=16, n_layer=1,
                                       n_head=2, eos_token_id=tokenizer.eos_token_id))
    out = tmp_path_factory.mktemp("tiny_lm")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_cli_with_tiny_local_model(tiny_model_dir, capsys):
    rc = dev_memory.main(["--prompt", "conf/templates/system_compact.txt", "--json",
                          f"model.name_or_path={tiny_model_dir}", "sampling.do_sample=false",
                          "sampling.max_new_tokens=6"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    out = json.loads(captured.out)
    assert "## Memory (State Continuity)" in out["prompt"] and "- Location: Kitchen" in out["prompt"]
    assert isinstance(out["output"], str)
    if out["response"] is None or "memory" not in out["response"]:  # a random model: almost surely
        assert out["rerendered_prompt"] == out["prompt"] and not out["memory_updated"]
