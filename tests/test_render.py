"""The ``render`` stage: prompts per condition, and its evidence checks (also on broken inputs)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.conditions import sources
from pipeline.core.config import ConfigError, load_params
from pipeline.core.io import read_parquet, write_parquet
from pipeline.envs.household.reader import HouseholdFactReader
from pipeline.memory import EpisodicStore, build_entry, write_store
from pipeline.prompts import PromptOrganizer, render_turn_prompt
from pipeline.core.schemas import manifest_table
from pipeline import conditions as R
from pipeline.stages import common as stage_common, render as render_stage

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVE = "Put Apple_2 in Fridge_0 and close it"
SCENE_S0_GROUNDING = "#### Spatial Grounding\n\n- The fridge is in the kitchen, east of the bedroom."


def _episode(scene: str, quest: str, *, won: bool, objective: str = OBJECTIVE) -> tuple[dict, list[dict]]:
    ep_id = f"ep_train_{scene}_{quest}_0"
    episode = {"episode_id": ep_id, "scene_id": scene, "quest_id": quest, "split": "train", "objective": objective,
               "won": won, "is_correct": won, "final_reward": 1.0 if won else -0.2, "num_turns": 3,
               "num_invalid": 1, "num_repeated": 1, "agent": "react", "model": "", "seed": 0, "metadata": "{}"}
    turns = [
        {"episode_id": ep_id, "turn_index": 0, "action": json.dumps({"action": "examine", "target": "Drawer_1"}),
         "command": "examine drawer_1", "action_valid": True, "status": "Failure", "repeated": True,
         "feedback_lines": ["feedback : procedural: open containers before looking inside"],
         "feedback_procedural": "open containers before looking inside"},
        {"episode_id": ep_id, "turn_index": 1, "action": json.dumps({"action": "open", "target": "Cabinet_0"}),
         "command": "open cabinet_0", "action_valid": False, "status": "Failure",
         "feedback_lines": [f"feedback : spatial: the key for {scene} is in the bedroom"],
         "feedback_spatial": f"the key for {scene} is in the bedroom"},
        {"episode_id": ep_id, "turn_index": 2, "action": json.dumps({"action": "look", "target": None}),
         "command": "look", "action_valid": True, "status": "Success", "feedback_lines": []},
    ]
    return episode, turns


@pytest.fixture(scope="module")
def store():
    entries = [build_entry(*_episode(s, q, won=w), reader=HouseholdFactReader()) for s, q, w in
               [("s0", "q0", True), ("s0", "q1", False), ("s1", "q0", True), ("s1", "q1", True),
                ("s3", "q0", False), ("s3", "q1", True), ("s4", "q0", True), ("s4", "q1", False)]]
    return EpisodicStore.from_entries(entries, tie_seed=0)


def _task(scene: str, quest: str, objective: str = OBJECTIVE, scene_split: str = "seen") -> dict:
    return {"scene_id": scene, "quest_id": quest, "split": "eval", "scene_split": scene_split,
            "objective": objective, "quest_length": 4,
            "expert_plan": ["go east", "open fridge_0", "put apple_2 in fridge_0", "close fridge_0"],
            "game_file": f"data/games/{scene}_{quest}.z8", "scene_seed": 1, "quest_seed": 2,
            "preferences": [], "metadata": "{}"}


TASKS = [_task("s0", "e0"), _task("s0", "e1", "Take the $5 Mug_0 ${x} and put it on Table_0"),
         _task("s2", "e0", scene_split="heldout")]


@pytest.fixture
def project(tmp_path, store):
    """A project folder with the stage's inputs, and a config pointing at it."""
    gm = tmp_path / "data" / "grounding_merged"
    gm.mkdir(parents=True)
    (gm / "s0.md").write_text(SCENE_S0_GROUNDING + "\n", encoding="utf-8")
    (gm / "s1.md").write_text("#### Spatial Grounding\n\n- s1 has no fridge.\n", encoding="utf-8")
    write_parquet(manifest_table(TASKS + [{**_task("s0", "t0"), "split": "train"}]),
                  tmp_path / "data" / "games" / "manifest.parquet")
    write_store(store, tmp_path / "data" / "store")
    cfg = load_params(ROOT, check_stale=False)
    cfg = OmegaConf.merge(cfg, {"prompts": {"system_template": str(ROOT / "conf/templates/system_compact.txt")}})
    return tmp_path, cfg


def test_conditions_follow_seed_001(project, store):
    root, cfg = project
    rows = {c: R.render_condition(TASKS, c, cfg, store, root)[0] for c in ("C1", "C2", "C2_silent", "C2_placebo")}
    for c, rs in rows.items():
        assert [r["task_id"] for r in rs] == ["s0/e0", "s0/e1", "s2/e0"] and {r["condition"] for r in rs} == {c}
    c1, c2, silent, placebo = rows["C1"], rows["C2"], rows["C2_silent"], rows["C2_placebo"]
    # C1: no retrieval, nothing shown.
    assert all(not r["retrieval_executed"] and r["store_hash"] is None and r["gate_reason"] == "memory_off"
               and r["memory_block"] == "" and not r["injected"] and r["retrieved_entry_ids"] == [] for r in c1)
    # C2_silent: retrieval ran (recorded), content masked, the prompt is C1's byte for byte.
    assert all(r["retrieval_executed"] and r["store_hash"] == store.store_hash and r["gate_reason"] == "masked"
               and r["retrieved_entry_ids"] and r["advisory_ids"] == [] and not r["injected"] for r in silent)
    assert [r["system_prompt"] for r in silent] == [r["system_prompt"] for r in c1]
    # C2: advisories injected where the gate passed; the block is the only difference from C1.
    assert all(r["gate_ok"] and r["gate_reason"] == "ok" and r["injected"] for r in c2)
    for r2, r1 in zip(c2, c1):
        block = r2["memory_block"]
        assert block.startswith(cfg.prompts.memory_slot_heading + "\n")
        assert "DEBATE_CONTEXT__MEMORY" in block and r2["advisory_ids"]
        bundle = json.loads(r2["bundle_json"])
        assert bundle["memory_on"] and bundle["meta"]["gate_reason"] == "ok"
        assert block.split("\n", 1)[1].startswith("DEBATE_CONTEXT__MEMORY:\n- advisory_type: ")
        assert all(a["message"] in block for a in bundle["retrieved"]) and bundle["meta"]["store_hash"] not in block
        seen2 = render_turn_prompt(r2["system_prompt"], {}, json.loads(r2["memory_defaults"]))
        seen1 = render_turn_prompt(r1["system_prompt"], {}, json.loads(r1["memory_defaults"]))
        assert block in seen2 and seen2.replace(block, "", 1) == seen1
    # C2_placebo: advisories from other scenes, same count as C2.
    for rp, r2 in zip(placebo, c2):
        assert rp["injected"] and len(rp["advisory_ids"]) == len(r2["advisory_ids"])
        assert all(not i.startswith(f"mem_ep_train_{rp['scene_id']}_") for i in rp["injected_entry_ids"])


def test_grounding_per_scene_and_hostile_objective(project, store):
    root, cfg = project
    rows, report = R.render_condition(TASKS, "C1", cfg, store, root)
    s0, s0b, s2 = rows
    assert s0["grounding_files"] == ["data/grounding_merged/s0.md"]  # relative to the project root
    assert SCENE_S0_GROUNDING in s0["system_prompt"]
    assert s2["grounding_files"] == [] and "## Grounding (what the user taught you before)\nNone\n" in s2["system_prompt"]
    # Turn slots are kept; `$` in the objective is escaped so the turn fill gives it back verbatim.
    assert "$agent_location" in s0["system_prompt"] and "$memory[previous_action]" in s0["system_prompt"]
    seen = render_turn_prompt(s0b["system_prompt"], {"agent_location": "Kitchen"}, {})
    assert "Take the $5 Mug_0 ${x} and put it on Table_0" in seen and "- Location: Kitchen" in seen
    assert report["evidence"]["passed"] and report["evidence"]["checks"] == {
        "injected_block_present": 0, "only_block_differs": 0, "no_advisory_text": 0, "masked_identical": 0}
    assert report["gate_reasons"] == {"memory_off": 3} and report["injected"] == 0


def test_deterministic_bytes(project, store, tmp_path):
    root, cfg = project
    paths = []
    for i in range(2):
        rows, _ = R.render_condition(list(reversed(TASKS)) if i else TASKS, "C2", cfg, store, root)
        paths.append(write_parquet(R.prompts_table(rows), tmp_path / f"out{i}.parquet", sort_by=["scene_id", "quest_id"]))
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_unknown_condition(project, store):
    root, cfg = project
    with pytest.raises(R.ConfigError, match="C9"):
        R.render_condition(TASKS, "C9", cfg, store, root)


def _leak_silent(monkeypatch):
    """A broken injection: C2_silent gets C2's slot (content exposed despite the mask)."""
    real = sources.memory_slot

    def leaky(store, task, cond, mem, rng=0, *, name="?", measure=len, words=None, facts=None):
        kw = dict(name=name, measure=measure, words=words, facts=facts)
        if name == "C2_silent":
            return real(store, task, {"kind": "memory"}, mem, rng, **kw)
        return real(store, task, cond, mem, rng, **kw)

    monkeypatch.setattr(sources, "memory_slot", leaky)


def test_stage_fails_when_a_masked_condition_leaks(project, store, monkeypatch):
    root, cfg = project
    _leak_silent(monkeypatch)
    with pytest.raises(R.EvidenceError) as ei:
        R.render_condition(TASKS, "C2_silent", cfg, store, root)
    found = {v.split("]")[0] + "]" for v in ei.value.violations}
    # (only_block_differs holds: the leaked block is the only difference.)
    assert found == {"[injected_block_present]", "[no_advisory_text]", "[masked_identical]"}
    assert any(v.startswith("[masked_identical] s0/e0: C2_silent differs from C1 (first difference at character")
               for v in ei.value.violations)
    assert any("prompt contains 'DEBATE_CONTEXT__MEMORY'" in v for v in ei.value.violations)
    assert str(ei.value).startswith("render C2_silent: evidence checks failed:\n  [injected_block_present] C2_silent")


def test_stage_fails_when_prompt_differs_beyond_the_block(project, store, monkeypatch):
    root, cfg = project
    real_prompt = R.Renderer.prompt

    def drifting(self, task, block, files):  # e.g. a condition-dependent template variable
        frozen = real_prompt(self, task, block, files)
        return replace(frozen, text=frozen.text + "\n(memory on)") if block else frozen

    monkeypatch.setattr(R.Renderer, "prompt", drifting)
    with pytest.raises(R.EvidenceError, match=r"\[only_block_differs\] C2 s0/e0: differs from the no-memory prompt"):
        R.render_condition(TASKS, "C2", cfg, store, root)


def test_renderer_freezes_without_touching_its_organizer(project, store):
    """Renderer.prompt is the organizer's pure freeze: the text and block the former
    set_variables + set_memory_block + freeze_system_prompt path read back; rendering
    leaves the shared organizer as it was built."""
    root, cfg = project
    r = R.Renderer(cfg, store, root)
    assert any(r.row(t, "C2")["injected"] for t in TASKS)
    assert r.organizer.variables == {} and r.organizer.memory_slot == ""
    for t in TASKS:
        files = r.grounding(t["scene_id"], "C2")
        old = PromptOrganizer.from_config(cfg, root=root)
        old.set_variables(objective=t["objective"], scene=t["scene_id"])
        old.set_memory_block('{"DEBATE_CONTEXT__MEMORY": "$5 ${x}"}')
        frozen = r.prompt(t, '{"DEBATE_CONTEXT__MEMORY": "$5 ${x}"}', files)
        assert (frozen.text, frozen.memory_block) == (old.freeze_system_prompt(files), old.memory_slot)


# --------------------------------------------------------------------------- pure checks


def _row(cond="C2", tid="s/q", gate_ok=True, block="BLOCK", prompt="head BLOCK tail", reason="ok"):
    return {"condition": cond, "task_id": tid, "gate_ok": gate_ok, "gate_reason": reason, "seen_block": block,
            "seen_prompt": prompt}


class TestCheckInjectedBlocks:
    def test_good(self):
        assert R.check_injected_blocks([_row(), _row(gate_ok=False, block="", prompt="p", reason="x")],
                                       exposed=True) == []
        assert R.check_injected_blocks([_row(cond="C1", gate_ok=False, block="", prompt="p")], exposed=False) == []

    def test_block_missing_from_prompt(self):
        out = R.check_injected_blocks([_row(prompt="head tail")], exposed=True)
        assert out == ["C2 s/q: gate passed but the prompt lacks its memory block"]

    def test_gate_passed_but_nothing_injected(self):
        assert "no memory block was injected" in R.check_injected_blocks([_row(block="")], exposed=True)[0]

    def test_block_despite_refused_gate_or_mask(self):
        assert "gate refused (below_relevance_threshold)" in R.check_injected_blocks(
            [_row(gate_ok=False, reason="below_relevance_threshold")], exposed=True)[0]
        assert "condition is masked" in R.check_injected_blocks([_row(cond="C2_silent", gate_ok=False)],
                                                                exposed=False)[0]


class TestCheckOnlyBlockDiffers:
    def test_good(self):
        assert R.check_only_block_differs([_row()], {"s/q": "head  tail"}) == []
        assert R.check_only_block_differs([_row(block="", prompt="same")], {"s/q": "same"}) == []

    def test_extra_text(self):
        out = R.check_only_block_differs([_row(prompt="head BLOCK tail!")], {"s/q": "head  tail"})
        assert out == ["C2 s/q: differs from the no-memory prompt beyond its memory block (first difference at "
                       "character 10)"]

    def test_missing_reference(self):
        assert "no reference prompt" in R.check_only_block_differs([_row()], {})[0]


class TestCheckNoAdvisoryText:
    MARKERS = ["DEBATE_CONTEXT__MEMORY", "## Episodic Memory", '"advisory_id"']

    def test_good(self):
        rows = [_row(cond="C1", block="", prompt="objective: open the fridge")]
        assert R.check_no_advisory_text(rows, {"s/q": ["Principle: unlock first."]}, self.MARKERS) == []

    def test_marker(self):
        rows = [_row(cond="C1", block="", prompt='x {"DEBATE_CONTEXT__MEMORY": {}}')]
        assert R.check_no_advisory_text(rows, {}, self.MARKERS) == [
            "C1 s/q: prompt contains 'DEBATE_CONTEXT__MEMORY'"]

    def test_message_leak(self):
        rows = [_row(cond="C2_silent", block="", prompt="... Principle: unlock first. ...")]
        out = R.check_no_advisory_text(rows, {"s/q": ["Principle: unlock first."]}, self.MARKERS)
        assert out == ["C2_silent s/q: prompt contains advisory text 'Principle: unlock first.'"]
        # The same sentence quoted by the task's grounding is not a leak.
        assert R.check_no_advisory_text(rows, {"s/q": ["Principle: unlock first."]}, self.MARKERS,
                                        {"s/q": "grounding: Principle: unlock first."}) == []

    def test_block_present(self):
        rows = [_row(cond="C1", block="B", prompt="B")]
        assert R.check_no_advisory_text(rows, {}, []) == ["C1 s/q: masked condition has a memory block"]


class TestCheckMaskedIdentical:
    def test_good(self):
        assert R.check_masked_identical({"C1": {"a": "x", "b": "y"}, "C2_silent": {"a": "x", "b": "y"}}) == []
        assert R.check_masked_identical({"C1": {"a": "x"}}) == []

    def test_one_byte(self):
        out = R.check_masked_identical({"C1": {"a": "prompt\n"}, "C2_silent": {"a": "prompt \n"}})
        assert out == ["a: C2_silent differs from C1 (first difference at character 6)"]

    def test_missing_task(self):
        assert R.check_masked_identical({"C1": {"a": "x"}, "C2_silent": {}}) == ["a: missing under C2_silent"]


# --------------------------------------------------------------------------- main


def _run_main(monkeypatch, root, cfg, condition):
    monkeypatch.setattr(stage_common, "load_params", lambda **_: cfg)
    monkeypatch.setattr(stage_common, "project_root", lambda: root)
    return render_stage.main(["--condition", condition])


def test_main_writes_parquet_and_metrics(project, monkeypatch, capsys):
    root, cfg = project
    assert _run_main(monkeypatch, root, cfg, "C2") == 0
    table = read_parquet(root / "data/prompts/C2.parquet")
    assert table.schema.remove_metadata() == R.PROMPTS_SCHEMA
    assert table.column("task_id").to_pylist() == ["s0/e0", "s0/e1", "s2/e0"]  # eval split only
    metrics = json.loads((root / "metrics/render.json").read_text())["conditions"]["C2"]
    assert metrics["evidence"]["passed"] and metrics["tasks"] == 3 and metrics["injected"] == 3
    assert "evidence checks passed" in capsys.readouterr().out


def test_main_without_condition_writes_every_condition_as_one_condition_at_a_time_does(project, monkeypatch):
    """`dvc repro render` (no --condition): every configured condition's file and report, each the
    bytes its own --condition run writes (the checks render every condition either way)."""
    root, cfg = project
    monkeypatch.setattr(stage_common, "load_params", lambda **_: cfg)
    monkeypatch.setattr(stage_common, "project_root", lambda: root)
    assert render_stage.main([]) == 0
    every = json.loads((root / "metrics/render.json").read_text())
    assert set(every["conditions"]) == set(cfg.condition) and every["wall_time_s"] >= 0
    together = {c: (root / f"data/prompts/{c}.parquet").read_bytes() for c in cfg.condition}
    for c in cfg.condition:
        assert _run_main(monkeypatch, root, cfg, c) == 0
        assert (root / f"data/prompts/{c}.parquet").read_bytes() == together[c], c
        alone = json.loads((root / "metrics/render.json").read_text())
        assert list(alone["conditions"]) == [c] and alone["conditions"][c] == every["conditions"][c]


def test_main_fails_and_keeps_previous_output(project, monkeypatch, capsys):
    root, cfg = project
    assert _run_main(monkeypatch, root, cfg, "C2_silent") == 0
    before = (root / "data/prompts/C2_silent.parquet").read_bytes()
    _leak_silent(monkeypatch)
    assert _run_main(monkeypatch, root, cfg, "C2_silent") == 1
    assert "evidence checks failed" in capsys.readouterr().err
    assert (root / "data/prompts/C2_silent.parquet").read_bytes() == before


def test_main_missing_inputs(project, monkeypatch, capsys):
    root, cfg = project
    (root / "data/store/store_hash.txt").unlink()
    assert _run_main(monkeypatch, root, cfg, "C1") == 1
    assert "store_hash.txt" in capsys.readouterr().err
    assert _run_main(monkeypatch, root, cfg, "C7") == 1
    assert "--condition 'C7'" in capsys.readouterr().err


def test_c0_drops_the_grounding_and_nothing_else(project, store):
    """Grounding and memory are orthogonal switches: C0 is C1 without the scene's grounding."""
    root, cfg = project
    c0, report = R.render_condition(TASKS, "C0", cfg, store, root)
    c1 = R.render_condition(TASKS, "C1", cfg, store, root)[0]
    assert report["evidence"]["passed"] and report["evidence"]["checks"]["no_grounding_text"] == 0
    assert all(r["grounding_files"] == [] and not r["injected"] and not r["retrieval_executed"] for r in c0)
    assert SCENE_S0_GROUNDING not in c0[0]["system_prompt"] and SCENE_S0_GROUNDING in c1[0]["system_prompt"]
    assert c0[0]["system_prompt"] != c1[0]["system_prompt"] and c0[2]["system_prompt"] == c1[2]["system_prompt"]
    # The held-out scene has no grounding either way, so its C0 and C1 prompts are the same bytes.
    leak = R.check_no_grounding_text([{"condition": "C0", "task_id": "s0/e0", "seen_prompt": c1[0]["system_prompt"]}],
                                     {"s0/e0": SCENE_S0_GROUNDING})
    assert leak and "grounding text" in leak[0]


def test_placebo_is_matched_and_disjoint_and_the_oracle_carries_the_plan(project, store):
    root, cfg = project
    c2 = R.render_condition(TASKS, "C2", cfg, store, root)[0]
    placebo, rep = R.render_condition(TASKS, "C2_placebo", cfg, store, root)
    assert rep["evidence"]["checks"]["placebo_matched"] == 0
    for rp, r2 in zip(placebo, c2):
        assert len(rp["advisory_ids"]) == len(r2["advisory_ids"])
        assert not set(rp["injected_entry_ids"]) & set(r2["injected_entry_ids"])  # held-out s2 included
        assert abs(len(rp["memory_block"]) - len(r2["memory_block"])) <= 0.02 * len(r2["memory_block"])
    oracle, rep = R.render_condition(TASKS, "C2_oracle", cfg, store, root)
    assert rep["evidence"]["checks"]["oracle_content"] == 0
    for ro, r2, task in zip(oracle, c2, TASKS):
        assert ro["gate_ok"] and ro["injected"] and len(ro["advisory_ids"]) == min(len(r2["advisory_ids"]), 4)
        assert all(step in ro["memory_block"] for step in task["expert_plan"])
        assert ro["injected_entry_ids"] == [] and any(n.startswith("oracle:") for n in ro["notes"])


def test_placebo_is_matched_in_the_models_tokens(project, store):
    """Issue 16: the placebo's block matches C2's within 2% in the model's tokens (not
    characters); the render report names the unit. The tokenizer is a byte-level BPE
    trained on C2's blocks only: C2's wording costs few tokens, other text more, so equal
    characters are far from equal tokens."""
    from pipeline.llm.tiny import train_tokenizer

    root, cfg = project
    # Without its own house first, C2 draws three successes and the placebo a longer failure
    # warning among its three: blocks of different wording, the case the unit matters for.
    cfg = OmegaConf.merge(cfg, {"memory": {"same_scene_first": False}})
    c2_text = [r["memory_block"] for r in R.render_condition(TASKS, "C2", cfg, store, root)[0]]
    length = R.block_length_for(cfg, root, tokenizer=train_tokenizer(c2_text * 30, vocab_size=700))
    assert length.unit.startswith("tokens")
    count = length.measure
    c2 = R.render_condition(TASKS, "C2", cfg, store, root, length)[0]
    placebo, rep = R.render_condition(TASKS, "C2_placebo", cfg, store, root, length)
    assert rep["block_length_unit"] == length.unit and rep["evidence"]["checks"]["placebo_matched"] == 0
    chars_apart = 0
    for rp, r2 in zip(placebo, c2):
        assert rp["injected"] and r2["injected"]
        a, b = count(rp["memory_block"]), count(r2["memory_block"])
        assert abs(a - b) <= 0.02 * b, (rp["task_id"], a, b)
        chars_apart += len(rp["memory_block"]) != len(r2["memory_block"])
        assert len(rp["advisory_ids"]) == len(r2["advisory_ids"])
        assert not set(rp["injected_entry_ids"]) & set(r2["injected_entry_ids"])
        assert all(len(m["message"]) <= cfg.memory.max_message_chars
                   for m in json.loads(rp["bundle_json"])["retrieved"])
    assert chars_apart  # the unit really is tokens: character lengths differ where tokens match
    # Matched in characters instead, the same placebo is off in tokens, and the check says so.
    by_chars = R.render_condition(TASKS, "C2_placebo", cfg, store, root)[0]
    found = R.check_placebo_matched(by_chars, c2, {}, measure=count, unit=length.unit)
    assert found and all("more than 2% apart" in f and "tokens" in f for f in found)


def test_block_length_is_characters_unless_a_local_model_plays(project):
    root, cfg = project
    react = OmegaConf.merge(cfg, {"agent": {"name": "react"}})
    assert R.block_length_for(react, root).unit == "characters"
    remote = OmegaConf.merge(cfg, {"agent": {"name": "llm"}, "model": {"backend": "openai"}})
    assert R.block_length_for(remote, root).unit == "characters"
    missing = OmegaConf.merge(cfg, {"agent": {"name": "llm"}, "model": {"name_or_path": "data/nowhere"}})
    assert R.block_length_for(missing, root).unit == "characters"  # not built yet: nothing to read
    broken = root / "data" / "broken_model"
    broken.mkdir(parents=True)
    (broken / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
    bad = OmegaConf.merge(cfg, {"agent": {"name": "llm"}, "model": {"name_or_path": "data/broken_model"}})
    with pytest.raises(ConfigError, match="data/broken_model"):
        R.block_length_for(bad, root)


def test_placebo_and_oracle_checks_catch_violations():
    c2 = {"task_id": "s0/e0", "condition": "C2", "scene_id": "s0", "injected": True, "advisory_ids": ["a", "b"],
          "injected_entry_ids": ["m1", "m2"], "memory_block": "x" * 1000}
    bad = {**c2, "condition": "C2_placebo", "advisory_ids": ["a"], "injected_entry_ids": ["m2", "m9"],
           "memory_block": "y" * 900}
    found = R.check_placebo_matched([bad], [c2], {"m9": "s0", "m2": "s1"})
    assert any("1 advisories, C2 2" in f for f in found) and any("injected too: m2" in f for f in found)
    assert any("own scene: m9" in f for f in found) and any("more than 2% apart" in f for f in found)
    ok = {**bad, "advisory_ids": ["a", "b"], "injected_entry_ids": ["m7", "m8"], "memory_block": "y" * 1015}
    assert R.check_placebo_matched([ok], [c2], {"m7": "s1", "m8": "s3"}) == []
    row = {"task_id": "s0/e0", "condition": "C2_oracle", "injected": True, "memory_block": "go east; open fridge_0"}
    assert R.check_oracle_content([row], {"s0/e0": ["go east", "open fridge_0"]}) == []
    assert "lacks plan steps ['close fridge_0']" in R.check_oracle_content(
        [row], {"s0/e0": ["go east", "close fridge_0"]})[0]


def test_a_placebo_the_store_cannot_supply_is_listed_not_failed():
    c2 = {"task_id": "s0/e0", "condition": "C2", "scene_id": "s0", "injected": True, "advisory_ids": ["a"],
          "injected_entry_ids": ["m1"], "memory_block": "x" * 100, "notes": []}
    none = {**c2, "condition": "C2_placebo", "injected": False, "advisory_ids": [], "injected_entry_ids": [],
            "memory_block": "", "notes": ["placebo: no entries of other scenes in the store; nothing injected"]}
    assert R.placebo_unavailable([none]) == ["s0/e0"] and R.check_placebo_matched([none], [c2], {}) == []
    silent = {**none, "notes": []}  # nothing injected and no reason recorded: a violation
    assert "injects nothing although C2 does" in R.check_placebo_matched([silent], [c2], {})[0]


def test_rows_count_whether_grounding_and_memory_reveal_the_answer(project, store):
    """The label-hint rule that drops advisories, counted on the grounding text and the memory block."""
    root, cfg = project
    (root / "data/grounding_merged/s0.md").write_text(
        SCENE_S0_GROUNDING + "\n- Open Fridge_0, then put Apple_2 in Fridge_0.\n", encoding="utf-8")
    rows = {c: R.render_condition(TASKS, c, cfg, store, root) for c in ("C0", "C1", "C2", "C2_oracle")}
    flags = {c: [(r["grounding_label_hint"], r["grounding_hint_commands"], r["memory_label_hint"])
                 for r in rs] for c, (rs, _) in rows.items()}
    # s0's grounding names two of the plan's three object commands (go east is the map); s2 has none.
    assert flags["C1"] == [(True, 2, False), (True, 2, False), (False, 0, False)]
    assert flags["C0"] == [(False, 0, False)] * 3  # no grounding shown
    assert [f[2] for f in flags["C2"]] == [False] * 3  # advisories that reveal it are dropped before injection
    assert [f[2] for f in flags["C2_oracle"]] == [True] * 3  # the positive control gives the answer on purpose
    assert all(r["memory_hint_commands"] == 3 for r in rows["C2_oracle"][0])
    assert rows["C1"][1]["label_hints"] == {"prompts": 3, "grounding": 2, "memory": 0, "either": 2}
    assert rows["C2_oracle"][1]["label_hints"]["memory"] == 3
    table = R.prompts_table(rows["C1"][0])
    assert table.column("grounding_label_hint").to_pylist() == [True, True, False]
    # Rows rendered before the check existed give nulls, not an error.
    old = [{k: v for k, v in r.items() if k not in R.LABEL_HINT_COLUMNS} for r in rows["C1"][0]]
    assert R.prompts_table(old).column("memory_hint_commands").to_pylist() == [None] * 3
