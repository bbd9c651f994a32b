"""PromptOrganizer: the real templates in conf/templates/, grounding files, memory slot, memory dict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.conf_schema import PromptsConfig
from pipeline.core.config import load_params, section
from pipeline.prompts import (
    TURN_VARIABLES,
    PromptOrganizer,
    PromptTemplateError,
    parse_verbalized_distribution,
    template_slots,
)

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = sorted((ROOT / "conf" / "templates").glob("*.txt"))
EPISODE_VARIABLES = {"objective", "grounding_content", "memory_slot"}

OBS = {
    "scene": "scene_0",
    "agent_location": "Kitchen",
    "agent_inventory": ["Key_1"],
    "visible_entities": ["Cabinet_0", "Drawer_1", "Apple_2"],
    "available_actions": ["go_to", "pick_up", "open", "examine", "wait"],
    "admissible_commands": ["open cabinet_0", "take apple_2", "go east"],
    "description": "You are in the kitchen. You see a cabinet, a drawer and an apple.",
    "objective": "Put Apple_2 in Fridge_0 and close it",
    "step": 2,
    "max_steps": 30,
}
BUNDLE = {
    "schema_version": "1.1",
    "memory_on": True,
    "retrieved": [{"advisory_id": "adv_000001", "message": "Open a container before putting things in it."}],
    "warnings": [],
    "meta": {"memory_mode": "on", "topk": 3, "masked_injection": False, "retrieval_executed": True},
}


@pytest.fixture(scope="module")
def cfg():
    return load_params(ROOT, check_stale=False)


@pytest.fixture
def org(cfg):
    o = PromptOrganizer.from_config(cfg, root=ROOT)
    o.set_variables(objective=OBS["objective"])
    return o


@pytest.fixture
def grounding_files(tmp_path):
    doc = {
        "expr_info": {"episode_id": 1},
        "grounding_per_step": [],
        "stacked_grounding": {"user_preference": [], "spatial": ["[ Step1 - Success ] : kitchen is green"],
                              "procedural": [], "general": []},
        "final_grounding": {
            "generation_timestamp": "1970-01-01T00:00:00+00:00",
            "user_preference_grounding": {"content": ""},
            "spatial_grounding": {"content": "The green room is the kitchen."},
            "procedural_grounding": {"content": "Unlock Cabinet_0 with Key_1 first."},
            "general_grounding_rules": {"content": ""},
        },
    }
    j = tmp_path / "grounding_episode_1.json"
    j.write_text(json.dumps(doc), encoding="utf-8")
    t = tmp_path / "custom_grounding.txt"
    t.write_text("The user prefers the fridge closed.\n", encoding="utf-8")
    return j, t


def test_templates_use_only_known_slots(cfg):
    """Every template renders from the episode variables, the observation and the memory defaults."""
    assert {p.name for p in TEMPLATES} >= {"system_compact.txt", "system_verbalized_entropy.txt",
                                            "system_default.txt"}
    defaults = set(cfg.prompts.memory_defaults)
    for path in TEMPLATES:
        names, paths = template_slots(path.read_text(encoding="utf-8"))
        assert names <= EPISODE_VARIABLES | set(TURN_VARIABLES), path.name
        assert {p[0] for p in paths} <= defaults, path.name


@pytest.mark.parametrize("template", [p.name for p in TEMPLATES])
def test_each_template_renders_without_warnings(cfg, template, capsys):
    o = PromptOrganizer(section(PromptsConfig, {**dict(cfg.prompts), "system_template": f"conf/templates/{template}"}),
                        root=ROOT)
    o.set_variables(objective=OBS["objective"])
    text = o.get_system_prompt(observation=OBS)
    assert capsys.readouterr().err == ""  # memory defaults cover every $memory[...] slot
    assert "$" not in text and OBS["objective"] in text and "Cabinet_0, Drawer_1, Apple_2" in text
    assert "## Memory (State Continuity)" in text and "- Previous Action: None" in text
    assert '{"action": "<verb>", "target": "<' in text  # the output format survives verbatim (the world's own nouns)


def test_compact_template_layout(org):
    text = org.get_system_prompt(observation=OBS)
    sections = [line for line in text.split("\n") if line.startswith("## ")]
    assert sections == ["## Objective", "## Grounding (what the user taught you before)",
                        "## Memory (State Continuity)", "## Current Observation", "## Output"]
    assert "- Location: Kitchen" in text and "- Step: 2 of 30" in text


def test_grounding_str_list_none(org, grounding_files, tmp_path):
    j, t = grounding_files
    assert "## Grounding (what the user taught you before)\nNone\n" in org.get_system_prompt(observation=OBS)
    one = org.get_system_prompt(str(j), observation=OBS)
    assert "#### Spatial Grounding\n\n- The green room is the kitchen." in one  # H3 -> H4
    both_list = org.get_system_prompt([str(j), str(t)], observation=OBS)
    both_str = org.get_system_prompt(f"{j},{t}", observation=OBS)
    assert both_list == both_str
    assert "Unlock Cabinet_0 with Key_1 first.\n\n---\n\nThe user prefers the fridge closed." in both_list
    # The default files (config grounding.files) are used when none are given.
    org.grounding_file_path = [str(t)]
    assert "The user prefers the fridge closed." in org.get_system_prompt(observation=OBS)


def test_grounding_file_change_is_seen(org, grounding_files):
    _, t = grounding_files
    assert "fridge closed" in org.grounding_content(str(t))
    t.write_text("Changed text, longer than before.\n", encoding="utf-8")
    assert org.grounding_content(str(t)) == "Changed text, longer than before."


def test_memory_slot_only_when_exposed(org):
    plain = org.get_system_prompt(observation=OBS)
    org.set_memory_slot(BUNDLE, exposed=False)
    assert org.get_system_prompt(observation=OBS) == plain
    block = org.set_memory_slot(BUNDLE, exposed=True)
    text = org.get_system_prompt(observation=OBS)
    assert block in text and "DEBATE_CONTEXT__MEMORY" in text and "adv_000001" in text
    assert text.replace(block, "") == plain
    assert json.loads(block.split("\n", 1)[1]) == {"DEBATE_CONTEXT__MEMORY": BUNDLE}


def test_memory_dict_cycle(org, cfg):
    first = org.get_system_prompt(observation=OBS)
    assert "- Plan: None" in first
    reply = ('Fridge first.\n{"action": "open", "target": "Fridge_0", "memory": '
             '{"previous_action": "open Fridge_0", "plan": ["take Apple_2", "put Apple_2 in Fridge_0"]}}')
    assert org.update_memory_from_response(reply)
    # The whole object becomes the memory dict; omitted keys keep their defaults.
    assert org.memory_dict == {**dict(cfg.prompts.memory_defaults), "previous_action": "open Fridge_0",
                               "plan": ["take Apple_2", "put Apple_2 in Fridge_0"]}
    second = org.get_system_prompt(observation=OBS)
    assert "- Previous Action: open Fridge_0\n- Plan: - take Apple_2\n- put Apple_2 in Fridge_0\n" in second
    assert json.loads(org.memory_json())["previous_action"] == "open Fridge_0"
    assert not org.update_memory_from_response('{"action": "look"}')  # no memory: kept
    assert org.memory_dict["previous_action"] == "open Fridge_0"
    org.reset_memory()
    assert org.get_system_prompt(observation=OBS) == first


def test_memory_without_defaults_merge():
    o = PromptOrganizer(section(PromptsConfig, {"memory_merge_defaults": False, "memory_defaults": {"a": "x", "b": "y"}}),
                        root=ROOT)
    o.update_memory_from_response({"memory": {"a": "z"}})
    assert o.memory_dict == {"a": "z"}
    with pytest.raises(TypeError, match="mapping"):
        o.set_memory_dict(["not", "a", "dict"])


def test_frozen_prompt_then_turns(org, grounding_files):
    j, _ = grounding_files
    org.set_memory_slot(BUNDLE, exposed=True)
    org.set_variables(objective="Pay $$5 ${x} $memory[plan] to the fridge")  # hostile objective text
    frozen = org.freeze_system_prompt(str(j))
    assert "$agent_location" in frozen and "$memory[previous_action]" in frozen
    for memory in ({}, {"previous_action": "look", "plan": ["a", "b"]}):
        org.set_memory_dict({**org.memory_defaults, **memory})
        assert org.render_turn(frozen, OBS) == org.get_system_prompt(str(j), observation=OBS)


def test_pure_freeze_equals_the_mutate_and_read_path(cfg, grounding_files):
    """freeze() gives the text and block set_variables + set_memory_block + freeze_system_prompt
    give (memory_slot read back), and leaves the organizer's own state as it was."""
    j, t = grounding_files
    org = PromptOrganizer.from_config(cfg, root=ROOT)
    block = json.dumps({"DEBATE_CONTEXT__MEMORY": BUNDLE})
    for variables, blk, files in [({"objective": "Pay $$5 ${x} $memory[plan]", "scene": "scene_0"}, block, [str(j)]),
                                  ({"objective": OBS["objective"], "scene": "scene_1"}, "", [str(j), str(t)]),
                                  ({"objective": OBS["objective"], "scene": "scene_1"}, block, []),
                                  ({"objective": OBS["objective"], "grounding_content": "given"}, block, None)]:
        frozen = org.freeze(variables, blk, files)
        for entropy in (False, True):
            old = PromptOrganizer.from_config(cfg, root=ROOT)
            old.set_variables(**{k: v for k, v in variables.items() if k != "grounding_content"})
            old.set_memory_block(blk)
            extra = {k: v for k, v in variables.items() if k == "grounding_content"}
            assert org.freeze(variables, blk, files, entropy=entropy).text == old.freeze_system_prompt(
                files, entropy=entropy, **extra)
            assert frozen.memory_block == old.memory_slot
        assert bool(frozen.memory_block) == bool(blk) and (blk in frozen.text if blk else True)
    assert org.variables == {} and org.memory_slot == ""
    with pytest.raises(ValueError, match="as `block`"):
        org.freeze({"objective": "x", "memory_slot": "a block"})


def test_verbalized_entropy_prompt(org):
    text = org.get_verbalized_entropy_system_prompt(observation=OBS)
    assert "P(<command>) = <probability>" in text
    reply = "P(open fridge_0) = 0.7\nP(go east) = 0.3\n{\"action\": \"open\", \"target\": \"Fridge_0\"}"
    dist, h = parse_verbalized_distribution(reply)
    assert list(dist) == ["open fridge_0", "go east"] and 0.6 < h < 0.62


def test_strict_missing_variable_names_template_file(cfg):
    o = PromptOrganizer(cfg.prompts, root=ROOT)  # objective never set
    with pytest.raises(PromptTemplateError, match=r"conf/templates/system_compact.txt line \d+: missing variable "
                                                  r"\$objective"):
        o.get_system_prompt(observation=OBS)


def test_missing_template_file(tmp_path):
    o = PromptOrganizer(section(PromptsConfig, {"system_template": "conf/templates/nope.txt"}), root=tmp_path)
    with pytest.raises(PromptTemplateError, match="nope.txt does not exist"):
        o.get_system_prompt()
