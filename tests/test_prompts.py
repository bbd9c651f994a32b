"""Template substitution and the memory renderer (seed 002), verbalized entropy, organizer."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.conf_schema import PromptsConfig
from pipeline.core.config import section
from pipeline.prompts import (
    DEPTH_CAP_PLACEHOLDER,
    TURN_VARIABLES,
    PromptOrganizer,
    PromptTemplateError,
    extract_json_object,
    memory_from_response,
    memory_slot_text,
    observation_variables,
    parse_verbalized_distribution,
    render_memory_slot,
    render_memory_value,
    render_turn_prompt,
    split_grounding_paths,
    system_prompt_interp,
    template_slots,
)

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- seed 002 section 4.1
MEMORY_41 = {
    "spatial_description": "Left room has wall at E3. Corridor connects to restroom at G4.",
    "high-level_planning": [
        "Move to corridor",
        "Turn toward restroom",
        "Enter restroom",
        "Locate target object",
        "Return to start",
    ],
    "historical_summrization": "Reached corridor. Currently facing restroom door.",
    "immidate_action_instruction": "Take one step east into the restroom.",
}

# ---------------------------------------------------------------- seed 002 section 4.2
MEMORY_42 = {
    "task_process": {
        "status": "in_progress",
        "current_subgoal_id": 1,
        "subgoals": [
            {
                "subgoal_id": 1,
                "subgoal_type": "navigation",
                "target": "restroom",
                "explicit_completion_condition": "AGENT occupies any cell within E1-G3",
                "subgoal_status": "in_progress",
            },
            {
                "subgoal_id": 2,
                "subgoal_type": "navigation",
                "target": "storage",
                "explicit_completion_condition": "AGENT occupies any cell within J6-K6",
                "subgoal_status": "pending",
            },
        ],
    },
    "previous_action": "move right",
}

SUBGOALS_42 = (
    "- subgoal_id: 1\n"
    "  subgoal_type: navigation\n"
    "  target: restroom\n"
    "  explicit_completion_condition: AGENT occupies any cell within E1-G3\n"
    "  subgoal_status: in_progress\n"
    "- subgoal_id: 2\n"
    "  subgoal_type: navigation\n"
    "  target: storage\n"
    "  explicit_completion_condition: AGENT occupies any cell within J6-K6\n"
    "  subgoal_status: pending"
)
TASK_PROCESS_42 = (
    "status: in_progress\n"
    "current_subgoal_id: 1\n"
    "subgoals: - subgoal_id: 1\n"
    "  subgoal_type: navigation\n"
    "  target: restroom\n"
    "  explicit_completion_condition: AGENT occupies any cell within E1-G3\n"
    "  subgoal_status: in_progress\n"
    "- subgoal_id: 2\n"
    "  subgoal_type: navigation\n"
    "  target: storage\n"
    "  explicit_completion_condition: AGENT occupies any cell within J6-K6\n"
    "  subgoal_status: pending"
)


def interp(template, memory, **kw):
    return system_prompt_interp(template, {}, memory, template_name="t.txt", **kw)


class TestSeed41:
    @pytest.mark.parametrize(
        "slot, expected",
        [
            ("$memory[spatial_description]", "Left room has wall at E3. Corridor connects to restroom at G4."),
            ("$memory[high-level_planning]",
             "- Move to corridor\n- Turn toward restroom\n- Enter restroom\n- Locate target object\n- Return to start"),
            ("$memory[historical_summrization]", "Reached corridor. Currently facing restroom door."),
            ("$memory[immidate_action_instruction]", "Take one step east into the restroom."),
        ],
    )
    def test_each_slot(self, slot, expected):
        assert interp(slot, MEMORY_41) == expected

    def test_whole_block(self):
        template = (
            "## Memory (State Continuity)\n"
            "- Scene: $memory[spatial_description]\n"
            "- Plan: $memory[high-level_planning]\n"
            "- History: $memory[historical_summrization]\n"
            "- Next: $memory[immidate_action_instruction]\n"
        )
        assert interp(template, MEMORY_41) == (
            "## Memory (State Continuity)\n"
            "- Scene: Left room has wall at E3. Corridor connects to restroom at G4.\n"
            "- Plan: - Move to corridor\n- Turn toward restroom\n- Enter restroom\n"
            "- Locate target object\n- Return to start\n"
            "- History: Reached corridor. Currently facing restroom door.\n"
            "- Next: Take one step east into the restroom.\n"
        )

    def test_response_memory_object_becomes_memory_dict(self):
        org = PromptOrganizer(section(PromptsConfig, {"memory_merge_defaults": False}), root=ROOT)
        assert org.update_memory_from_response({"memory": MEMORY_41})
        assert org.memory_dict == MEMORY_41


class TestSeed42:
    @pytest.mark.parametrize(
        "slot, expected",
        [
            ("$memory[previous_action]", "move right"),
            ("$memory[task_process]", TASK_PROCESS_42),
            ("$memory[task_process][status]", "in_progress"),
            ("$memory[task_process][current_subgoal_id]", "1"),
            ("$memory[task_process][subgoals]", SUBGOALS_42),
        ],
    )
    def test_each_slot(self, slot, expected):
        assert interp(slot, MEMORY_42) == expected

    def test_prompt_block(self):
        template = (
            "## Memory\n"
            "- Last action: $memory[previous_action]\n"
            "- Task state: $memory[task_process]\n"
            "- Status only: $memory[task_process][status]\n"
            "- Current subgoal id: $memory[task_process][current_subgoal_id]\n"
            "- Subgoals list: $memory[task_process][subgoals]\n"
        )
        assert interp(template, MEMORY_42) == (
            "## Memory\n"
            "- Last action: move right\n"
            f"- Task state: {TASK_PROCESS_42}\n"
            "- Status only: in_progress\n"
            "- Current subgoal id: 1\n"
            f"- Subgoals list: {SUBGOALS_42}\n"
        )

    def test_renderer_directly(self):
        assert render_memory_value(MEMORY_42["task_process"]) == TASK_PROCESS_42
        assert render_memory_value(MEMORY_42["task_process"]["subgoals"]) == SUBGOALS_42

    def test_digit_key_indexes_a_list(self):
        assert interp("$memory[task_process][subgoals][1][target]", MEMORY_42) == "storage"


class TestSeed43:
    @pytest.mark.parametrize(
        "memory, slot, expected",
        [
            ({"previous_action": "north"}, "$memory[previous_action]", "north"),
            ({"reason": ""}, "$memory[reason]", "None"),
            ({"count": 3}, "$memory[count]", "3"),
            ({"done": True}, "$memory[done]", "True"),
            ({"steps": ["a", "b"]}, "$memory[steps]", "- a\n- b"),
            ({"ids": [1, 2, 3]}, "$memory[ids]", "- 1\n- 2\n- 3"),
            ({"task_process": {"goal": "restroom", "status": "in_progress"}}, "$memory[task_process]",
             "goal: restroom\nstatus: in_progress"),
            ({"task_process": {"goal": "restroom", "status": "in_progress"}}, "$memory[task_process][goal]",
             "restroom"),
            ({"task_process": {"goal": "restroom", "status": "in_progress"}}, "$memory[task_process][status]",
             "in_progress"),
            ({"high-level_planning": ["step1"]}, "$memory[high-level_planning]", "- step1"),
            ({"a": {"b": {"c": "leaf"}}}, "$memory[a][b][c]", "leaf"),
        ],
    )
    def test_row(self, memory, slot, expected, capsys):
        assert interp(slot, memory) == expected
        assert "WARNING" not in capsys.readouterr().err  # present keys never warn

    @pytest.mark.parametrize("memory", [{}, {"other": 1}])
    def test_empty_or_missing(self, memory, capsys, caplog):
        with caplog.at_level(logging.WARNING, logger="pipeline.prompts"):
            assert interp("$memory[previous_action]", memory) == "None"
        assert "PROMPT MEMORY WARNING" in capsys.readouterr().err
        assert any("$memory[previous_action]" in r.getMessage() for r in caplog.records)

    def test_memory_none_is_empty(self, capsys):
        assert system_prompt_interp("$memory[x]", {}, None) == "None"
        assert "$memory[x]" in capsys.readouterr().err


class TestMissingMemoryKeys:
    MEM = {"a": {"b": {"c": "leaf"}}, "s": "text", "l": ["x"]}

    @pytest.mark.parametrize(
        "slot, level_key, parent",
        [
            ("$memory[zz]", "zz", "$memory"),
            ("$memory[a][zz]", "zz", "$memory[a]"),
            ("$memory[a][b][zz]", "zz", "$memory[a][b]"),
            ("$memory[a][b][c][zz]", "zz", "$memory[a][b][c]"),  # descending into a string
            ("$memory[s][zz]", "zz", "$memory[s]"),
            ("$memory[l][5]", "5", "$memory[l]"),  # index out of range
            ("$memory[zz][b][c]", "zz", "$memory"),  # the first missing level is reported
        ],
    )
    def test_level(self, slot, level_key, parent, capsys, caplog):
        with caplog.at_level(logging.WARNING, logger="pipeline.prompts"):
            out = system_prompt_interp(f"X {slot} Y", {}, self.MEM, template_name="conf/templates/t.txt")
        assert out == "X None Y"
        err = capsys.readouterr().err
        assert "PROMPT MEMORY WARNING" in err and slot in err and "conf/templates/t.txt" in err
        recs = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "pipeline.prompts"]
        assert len(recs) == 1
        msg = recs[0].getMessage()
        assert slot in msg and "conf/templates/t.txt" in msg and repr(level_key) in msg and parent in msg
        assert recs[0].memory_key_path == [k.strip("]") for k in slot[len("$memory["):].split("[")]
        assert recs[0].template == "conf/templates/t.txt"

    def test_configurable_value(self, capsys):
        assert interp("$memory[zz]", {}, missing_memory_value="(unset)") == "(unset)"
        assert "(unset)" in capsys.readouterr().err

    def test_explicit_null_renders_none_without_warning(self, capsys):
        assert interp("$memory[k]", {"k": None}) == "None"
        assert capsys.readouterr().err == ""

    def test_malformed_memory_slot(self):
        with pytest.raises(PromptTemplateError, match=r"t.txt line 2: malformed memory slot"):
            interp("ok\n$memory[bad key]", {"bad key": 1})
        with pytest.raises(PromptTemplateError, match="malformed memory slot"):
            interp("$memory[a][b!]", {"a": {"b!": 1}})


class TestVariables:
    def test_dollar_and_brace_forms(self):
        t = "$objective|${objective}|${scene}_x|$scene_x|$scene."
        out = system_prompt_interp(t, {"objective": "Put Apple_2", "scene": "s0", "scene_x": "SX"})
        assert out == "Put Apple_2|Put Apple_2|s0_x|SX|s0."

    def test_double_dollar_escapes(self):
        assert system_prompt_interp("costs $$5 and $$name and $$$x", {"x": "X"}) == "costs $5 and $name and $X"

    def test_strict_missing_variable_names_it_and_the_template(self):
        with pytest.raises(PromptTemplateError) as ei:
            system_prompt_interp("a\nb $grounding_content", {"objective": "o"},
                                 template_name="conf/templates/system_compact.txt")
        msg = str(ei.value)
        assert "$grounding_content" in msg and "conf/templates/system_compact.txt" in msg and "line 2" in msg
        assert "objective" in msg  # what was given

    def test_non_strict_leaves_missing_variable(self, caplog):
        with caplog.at_level(logging.WARNING, logger="pipeline.prompts"):
            assert system_prompt_interp("a $x ${y} b", {}, strict=False) == "a $x ${y} b"
        assert "$x" in caplog.text

    def test_non_string_values_use_the_renderer(self):
        assert system_prompt_interp("$n|$l|$d|$e", {"n": 3, "l": ["a"], "d": {"k": True}, "e": ""}) == \
            "3|- a|k: True|"

    @pytest.mark.parametrize("bad", ["${__import__('os').system('echo hi')}", "${1+1}", "${objective.upper()}",
                                     "$5", "$ ", "${}", "{$}"])
    def test_no_evaluation_strict(self, bad):
        with pytest.raises(PromptTemplateError, match="invalid slot"):
            system_prompt_interp(f"x {bad} y", {"objective": "o"})

    def test_no_evaluation_non_strict_keeps_text(self):
        t = "x ${__import__('os').getcwd()} {objective} %(objective)s y"
        assert system_prompt_interp(t, {"objective": "o"}, strict=False) == t

    def test_values_are_not_rescanned(self):
        evil = "$memory[secret] ${objective} $$ $objective"
        out = system_prompt_interp("$a / $memory[m]", {"a": evil, "objective": "o"}, {"m": evil, "secret": "S"})
        assert out == f"{evil} / {evil}"

    def test_template_slots(self):
        names, paths = template_slots("$a ${b} $memory[x][y-z] $$c")
        assert names == {"a", "b"} and paths == {("x", "y-z")}


class TestRenderer:
    def test_scalars(self):
        assert render_memory_value(None) == "None"
        assert render_memory_value(False) == "False"
        assert render_memory_value(0) == "0"
        assert render_memory_value(0.25) == "0.25"
        assert render_memory_value("", empty_value="-") == "-"

    def test_empty_containers_render_as_empty_value(self):
        assert render_memory_value([]) == "None"
        assert render_memory_value({}, empty_value="(empty)") == "(empty)"

    def test_multiline_strings_and_nested_lists_indent(self):
        assert render_memory_value(["one\ntwo", ["a", "b"], {"k": ["x", "y"]}]) == (
            "- one\n  two\n- - a\n  - b\n- k: - x\n  - y")

    def test_depth_cap_default_is_8(self):
        deep = "leaf"
        for i in range(8):
            deep = {f"k{i}": deep}
        text = render_memory_value(deep)  # 8 nested dicts: levels 0..7, all expanded
        assert text.endswith("k0: leaf") and "{" not in text
        deeper = {"top": deep}  # the 9th level is written as compact JSON
        assert render_memory_value(deeper) == "top: k7: k6: k5: k4: k3: k2: k1: " + json.dumps(
            {"k0": "leaf"}, separators=(",", ":"))

    def test_depth_cap_fallback_json(self):
        value = {"a": {"b": {"c": "leaf"}}, "l": [[1, [2]]]}
        assert render_memory_value(value, max_depth=1) == 'a: {"b":{"c":"leaf"}}\nl: [[1,[2]]]'
        assert render_memory_value(value, max_depth=0) == json.dumps(value, separators=(",", ":"))
        assert render_memory_value(["é"], max_depth=0) == '["é"]'  # UTF-8 kept

    def test_cycle_does_not_raise(self):
        a: list = []
        a.append(a)
        assert render_memory_value(a, max_depth=3) == "- - - " + DEPTH_CAP_PLACEHOLDER

    def test_foreign_objects(self):
        class Bad:
            def __str__(self):
                raise RuntimeError("boom")

        assert render_memory_value({"x": Bad()}) == "x: <unrenderable Bad>"
        assert render_memory_value({1: (2, 3)}) == "1: - 2\n- 3"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON, st.integers(min_value=0, max_value=10))
def test_renderer_never_raises(value, depth):
    out = render_memory_value(value, max_depth=depth)
    assert isinstance(out, str)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_-]{0,5}", fullmatch=True), JSON, max_size=4),
       st.lists(st.from_regex(r"[a-z][a-z0-9_-]{0,5}", fullmatch=True), min_size=1, max_size=4))
def test_memory_lookup_never_raises(memory, keys):
    slot = "$memory" + "".join(f"[{k}]" for k in keys)
    out = system_prompt_interp(f"<{slot}>", {}, memory, missing_memory_value="MISSING")
    assert out.startswith("<") and out.endswith(">")


TEXT = st.text(alphabet=st.sampled_from(list("ab $[]{}_\n")), max_size=30)


@settings(max_examples=200, deadline=None)
@given(objective=TEXT, grounding=TEXT, plan=TEXT, location=TEXT)
def test_frozen_then_turn_equals_one_pass(objective, grounding, plan, location):
    template = ("O: $objective\nG: ${grounding_content}\nP: $memory[plan]\nL: $agent_location $$x\n"
                "S: $step/${max_steps}\n")
    obs = {"agent_location": location, "step": 1, "max_steps": 30}
    episode = {"objective": objective, "grounding_content": grounding}
    memory = {"plan": plan}
    one_pass = system_prompt_interp(template, {**episode, **observation_variables(obs)}, memory)
    frozen = system_prompt_interp(template, episode, keep=TURN_VARIABLES, keep_memory=True)
    assert render_turn_prompt(frozen, obs, memory) == one_pass


class TestVerbalizedEntropy:
    def test_lines(self):
        text = "I think:\nP(open Fridge_0) = 0.6\n- P(go to kitchen): 0.3\nP( look ) = 0.1\n{\"action\": \"open\"}"
        dist, h = parse_verbalized_distribution(text)
        assert dist == pytest.approx({"open Fridge_0": 0.6, "go to kitchen": 0.3, "look": 0.1})
        assert h == pytest.approx(-(0.6 * math.log(0.6) + 0.3 * math.log(0.3) + 0.1 * math.log(0.1)))

    def test_percentages_normalised_and_duplicates_added(self):
        dist, h = parse_verbalized_distribution("P(a) = 50%\nP(b) = 25%\nP(a) = 25%")
        assert dist == pytest.approx({"a": 0.75, "b": 0.25})
        dist2, _ = parse_verbalized_distribution("P(a)=3\nP(b)=1")
        assert dist2 == pytest.approx(dist)

    def test_json_forms(self):
        d1, _ = parse_verbalized_distribution('x {"probabilities": {"look": 0.5, "wait": "50%"}} y')
        assert d1 == pytest.approx({"look": 0.5, "wait": 0.5})
        d2, h2 = parse_verbalized_distribution(
            '{"distribution": [{"action": "open Cabinet_0", "p": 1.0}, {"action": "x", "p": -1}]}')
        assert d2 == {"open Cabinet_0": 1.0} and h2 == 0.0

    def test_bits(self):
        _, h = parse_verbalized_distribution("P(a)=0.5\nP(b)=0.5", base=2)
        assert h == pytest.approx(1.0)

    @pytest.mark.parametrize("text", ["", "no distribution here", "P(a) = 0", '{"probabilities": {}}', "P(a) = x"])
    def test_nothing(self, text):
        assert parse_verbalized_distribution(text) == ({}, None)


class TestResponses:
    def test_extract_json_with_braces_in_strings(self):
        text = 'Reasoning: use {this}.\n{"action": "put", "target": "A}", "memory": {"plan": ["a{"]}} trailing'
        obj = extract_json_object(text)
        assert obj == {"action": "put", "target": "A}", "memory": {"plan": ["a{"]}}
        assert memory_from_response(text) == {"plan": ["a{"]}

    def test_no_memory(self):
        assert memory_from_response('{"action": "look"}') is None
        assert memory_from_response('{"memory": "not a dict"}') is None
        assert memory_from_response("garbage {") is None


class TestSlot:
    BUNDLE = {"schema_version": "1.1", "memory_on": True, "retrieved": [{"message": "Open containers first."}],
              "warnings": [], "meta": {"memory_mode": "on", "topk": 3}}

    def test_exposed(self):
        text = render_memory_slot(self.BUNDLE, slot_name="DEBATE_CONTEXT__MEMORY", exposed=True, heading="## M")
        head, body = text.split("\n", 1)
        assert head == "## M" and body.endswith("}\n\n")
        assert json.loads(body) == {"DEBATE_CONTEXT__MEMORY": self.BUNDLE}
        assert memory_slot_text(body.rstrip("\n"), heading="## M") == text

    def test_not_exposed_is_empty(self):
        assert render_memory_slot(self.BUNDLE, exposed=False) == ""
        assert render_memory_slot(None, exposed=True) == ""


def test_split_grounding_paths():
    assert split_grounding_paths(None) == []
    assert split_grounding_paths("a.json, b.txt,,") == ["a.json", "b.txt"]
    assert split_grounding_paths(["a.json", Path("b.md")]) == ["a.json", "b.md"]


def test_observation_variables():
    obs = {"agent_location": "Kitchen", "agent_inventory": [], "visible_entities": ["Cabinet_0", "Apple_2"],
           "step": 3, "max_steps": 30}
    v = observation_variables(obs)
    assert set(v) == set(TURN_VARIABLES)
    assert v["agent_inventory"] == "nothing" and v["visible_entities"] == "Cabinet_0, Apple_2"
    assert v["description"] == "unknown" and v["step"] == "3"


def test_renderer_huge_int_and_str_subclass():
    class S(str):
        def __str__(self):
            raise RuntimeError("boom")

    assert render_memory_value([S("x"), S("")]) == "- x\n- None"
    assert render_memory_value(10 ** 5000).startswith("<unrenderable")
