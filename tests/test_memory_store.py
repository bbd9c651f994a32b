"""The store stage: entries from collected episodes, canonical Parquet + JSONL, content hash."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.core.io import ArtifactError, atomic_write_text, read_parquet, write_parquet
from pipeline.memory import EpisodicMemoryEntryV1_1, advisory_type_for, build_entries, load_store, write_store
from pipeline.memory.store import STORE_HASH, STORE_JSONL, STORE_PARQUET
from pipeline.core.schemas import FEEDBACK_TYPES, episodes_table, turns_table
from pipeline.envs.household.reader import HouseholdFactReader
from pipeline.memory.build import build_store, store_metrics

READER = HouseholdFactReader()

ROOT = Path(__file__).resolve().parents[1]


def episode(eid, scene, quest, objective, won, turns, split="train", metadata="{}"):
    """An episodes row and its turns rows; each turn spec: action, target, valid, status, feedback, ..."""
    row = dict(episode_id=eid, scene_id=scene, quest_id=quest, split=split, condition="", objective=objective,
               question=objective, choices=[], ground_truth="", final_answer="", final_reward=1.0 if won else -0.2,
               won=won, preferences_ok=True, is_correct=won, num_turns=len(turns),
               num_invalid=sum(not t.get("valid", True) for t in turns), num_repeated=sum(t.get("rep", False) for t in turns),
               prompt_tokens=0, generated_tokens=0, agent="react", model="none", seed=3, metadata=metadata)
    rows = []
    for i, t in enumerate(turns):
        fb = t.get("fb", {})
        rows.append(dict(
            episode_id=eid, turn_index=i, observation="{}", generated_text="", reasoning=t.get("reason"),
            action=json.dumps({"action": t["a"], "target": t.get("t")}), command=f"{t['a']} {t.get('t') or ''}".strip(),
            action_valid=t.get("valid", True), env_feedback="", reward=0.0, changed=not t.get("rep", False),
            repeated=t.get("rep", False), done=i == len(turns) - 1, won=won and i == len(turns) - 1,
            status=t.get("status", "WiP"), feedback_lines=[f"feedback : {k}: {v}" for k, v in fb.items()],
            **{f"feedback_{k}": fb.get(k) for k in FEEDBACK_TYPES}))
    return row, rows


OBJ_FIX = "Put Apple_2 in Fridge_0"
OBJ_ANCHOR = "Take Key_1 but do not open Drawer_1"
SPECS = [
    ("ep_train_s0_q0_0", "s0", "q0", OBJ_FIX, True, [
        dict(a="pick_up", t="Apple_2", valid=False, status="Failure",
             fb={"procedural": "Open Fridge_0 before putting things in it.", "spatial": "Apple_2 is on Counter_0."}),
        dict(a="open", t="Fridge_0", status="Success"),
        dict(a="put", t="Apple_2", status="Success", reason=f"My goal is: {OBJ_FIX}")]),
    ("ep_train_s0_q1_0", "s0", "q1", "Put Mug_0 in Cabinet_0", False, [
        dict(a="examine", t="Cabinet_0", status="Failure", fb={"general": "You already examined Cabinet_0."}),
        dict(a="examine", t="Cabinet_0", rep=True, status="Failure"),
        dict(a="examine", t="Cabinet_0", rep=True, status="Failure")]),
    ("ep_train_s1_q0_0", "s1", "q0", OBJ_ANCHOR, True, [
        dict(a="go_to", t="Bedroom", status="Success", fb={"user_preference": "Keep Drawer_1 closed."}),
        dict(a="pick_up", t="Key_1", status="Success")]),
    ("ep_train_s1_q1_0", "s1", "q1", "Key_1을 Drawer_1에 넣지 마세요", False, [
        dict(a="wait", status="WiP")]),
    ("ep_eval_s1_q5_0", "s1", "q5", "Eval task", True, [dict(a="look", status="Success")], "eval"),
]


def tables(specs=SPECS):
    eps, turns = [], []
    for s in specs:
        e, t = episode(*s)
        eps.append(e)
        turns += t
    return episodes_table(eps), turns_table(turns)


def test_one_entry_per_train_episode_with_every_part():
    eps, turns = tables()
    entries = build_entries(eps, turns, config_hash="cfg123", reader=READER)
    assert [e.entry_id for e in entries] == ["mem_ep_train_s0_q0_0", "mem_ep_train_s0_q1_0",
                                             "mem_ep_train_s1_q0_0", "mem_ep_train_s1_q1_0"]
    fix, loop, anchor, ko = (e.model_dump() for e in entries)
    assert [advisory_type_for(e) for e in (fix, loop, anchor, ko)] == [
        "successful_override", "failed_override_warning", "consistency_anchor", "failed_override_warning"]
    # input_signature of the objective
    assert fix["input_signature"] == {"language": "en", "detected_structure": ["none"], "contrast_marker": None,
                                      "has_negation": False, "num_aspects": 2, "length_bucket": "short"}
    assert anchor["input_signature"]["detected_structure"] == ["negation", "contrast"]
    assert ko["input_signature"]["language"] == "ko" and ko["input_signature"]["has_negation"] is True
    # case_summary: what went wrong, what fixed it
    assert "1 inadmissible action (first: pick_up Apple_2)" in fix["case_summary"]["symptom"]
    assert "Open Fridge_0 before putting things in it." in fix["case_summary"]["rationale_summary"]
    assert "goal was reached in 3 turns" in fix["case_summary"]["rationale_summary"]
    assert "examine_loop" in loop["case_summary"]["risk_tags"]
    assert anchor["case_summary"]["symptom"] == "no mistakes recorded"
    # stage_snapshot, correction, evaluation, provenance
    assert fix["stage_snapshot"]["first_actions"] == ["pick_up Apple_2", "open Fridge_0", "put Apple_2"]
    assert fix["correction"]["corrected"] is True and fix["correction"]["first_correction_turn"] == 0
    assert fix["correction"]["by_type"]["spatial"] == ["Apple_2 is on Counter_0."]
    assert fix["correction"]["num_feedback_lines"] == 2
    assert anchor["correction"]["corrected"] is False  # feedback on a successful step is no correction
    assert anchor["correction"]["by_type"]["user_preference"] == ["Keep Drawer_1 closed."]
    assert loop["evaluation"] == {"won": False, "is_correct": False, "final_reward": -0.2, "num_turns": 3,
                                  "num_invalid": 0, "num_repeated": 2}
    assert fix["provenance"] == {"episode_id": "ep_train_s0_q0_0", "scene_id": "s0", "quest_id": "q0",
                                 "split": "train", "agent": "react", "model": "none", "seed": 3,
                                 "config_hash": "cfg123"}


def test_feedback_on_a_wip_step_is_a_correction_and_on_a_success_step_is_not():
    specs = [("ep_w", "s0", "q0", "Put Bowl_0 on Desk_0", True, [
        dict(a="open", t="Cabinet_1", status="WiP", fb={"spatial": "Bowl_0 is in the Bathroom."}),
        dict(a="pick_up", t="Bowl_0", status="Success", fb={"general": "Good."})])]
    (entry,) = build_entries(*tables(specs), reader=READER)
    assert entry.correction.corrected is True and entry.correction.first_correction_turn == 0
    assert advisory_type_for(entry.model_dump()) == "successful_override"
    assert "spatial: Bowl_0 is in the Bathroom." in entry.case_summary.rationale_summary
    assert "general: Good." not in entry.case_summary.rationale_summary  # corrective feedback first
    assert entry.case_summary.symptom == "1 step without progress"
    assert "no_progress" in entry.case_summary.risk_tags


def test_raw_objective_is_never_stored():
    eps, turns = tables()
    store = build_store(eps, turns, splits=["train"], config_hash="c", reader=READER)
    text = store.jsonl()
    for objective in (OBJ_FIX, OBJ_ANCHOR, "Put Mug_0 in Cabinet_0"):
        assert objective not in text
    assert "<objective>" in text  # the reasoning quoted it; it was redacted


def test_split_filter_and_config_hash_from_metadata():
    specs = [*SPECS[:1], ("ep_x", "s2", "q0", "Take Apple_2", True, [dict(a="look")], "train",
                          json.dumps({"config_hash": "from_collect"}))]
    eps, turns = tables(specs)
    entries = build_entries(eps, turns, splits=None, config_hash="fallback", reader=READER)
    assert {e.provenance.config_hash for e in entries} == {"fallback", "from_collect"}
    assert len(build_entries(*tables(), splits=None, reader=READER)) == 5
    assert len(build_entries(*tables(), splits=["eval"], reader=READER)) == 1


def test_store_stage_outputs_are_byte_identical_and_order_independent(tmp_path):
    eps, turns = tables()
    write_store(build_store(eps, turns, splits=["train"], config_hash="c", reader=READER), tmp_path / "a")
    write_store(build_store(eps, turns, splits=["train"], config_hash="c", reader=READER), tmp_path / "b")
    rev = eps.take(pa.array(list(reversed(range(eps.num_rows)))))
    write_store(build_store(rev, turns.take(pa.array(list(reversed(range(turns.num_rows))))),
                            splits=["train"], config_hash="c", reader=READER), tmp_path / "c")
    for name in (STORE_PARQUET, STORE_JSONL, STORE_HASH):
        data = (tmp_path / "a" / name).read_bytes()
        assert data == (tmp_path / "b" / name).read_bytes() == (tmp_path / "c" / name).read_bytes(), name
    recorded = (tmp_path / "a" / STORE_HASH).read_text().strip()
    assert recorded == hashlib.sha256((tmp_path / "a" / STORE_JSONL).read_bytes()).hexdigest()
    written = read_parquet(tmp_path / "a" / STORE_PARQUET)
    assert written.num_rows == 4 and written.schema.metadata[b"schema_version"] == b"1.1"


def test_jsonl_is_the_seed_entry_shape_and_load_round_trips(tmp_path):
    store = build_store(*tables(), splits=["train"], config_hash="c", reader=READER)
    write_store(store, tmp_path)
    lines = (tmp_path / STORE_JSONL).read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4
    for line in lines:
        EpisodicMemoryEntryV1_1.model_validate(json.loads(line))
    assert "넣지" not in (tmp_path / STORE_JSONL).read_text(encoding="utf-8")  # objective not stored, even in Korean
    loaded = load_store(tmp_path, tie_seed=0)
    assert loaded.store_hash == store.store_hash
    assert loaded.entries() == store.entries()
    assert loaded.jsonl() == store.jsonl()


def test_tampered_store_is_refused(tmp_path):
    write_store(build_store(*tables(), splits=["train"], config_hash="c", reader=READER), tmp_path)
    atomic_write_text(tmp_path / STORE_JSONL, (tmp_path / STORE_JSONL).read_text() + "\n")
    with pytest.raises(ArtifactError, match="modified outside the store stage"):
        load_store(tmp_path)
    (tmp_path / STORE_HASH).unlink()
    with pytest.raises(ArtifactError, match="store_hash.txt"):
        load_store(tmp_path)


def test_missing_column_is_a_clear_error():
    eps, turns = tables()
    with pytest.raises(ArtifactError, match=r"turns\.parquet: missing column\(s\) \['action_valid'\]"):
        build_entries(eps, turns.drop_columns(["action_valid"]), turns_name="turns.parquet", reader=READER)
    with pytest.raises(ArtifactError, match="no turns for episode 'ep_train_s0_q0_0'"):
        build_entries(eps, turns.filter(pa.compute.not_equal(turns["episode_id"], "ep_train_s0_q0_0")), reader=READER)


def test_metrics():
    m = store_metrics(build_store(*tables(), splits=["train"], config_hash="c", reader=READER))
    assert m["num_entries"] == 4 and m["num_scenes"] == 2
    assert m["advisory_types"] == {"consistency_anchor": 1, "failed_override_warning": 2, "successful_override": 1}
    assert m["languages"] == {"en": 3, "ko": 1}


def test_stage_main_end_to_end(tmp_path, monkeypatch):
    """`python -m pipeline.stages.store` on a copy of the project config."""
    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    eps, turns = tables()
    write_parquet(eps, tmp_path / "data/episodes/episodes.parquet")
    write_parquet(turns, tmp_path / "data/episodes/turns.parquet")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    from pipeline.stages import store as stage

    assert stage.main() == 0
    first = {p: (tmp_path / "data/store" / p).read_bytes() for p in (STORE_PARQUET, STORE_JSONL, STORE_HASH)}
    metrics = json.loads((tmp_path / "metrics/store.json").read_text())
    assert metrics["num_entries"] == 4 and metrics["store_hash"] == first[STORE_HASH].decode().strip()
    assert stage.main() == 0
    assert first == {p: (tmp_path / "data/store" / p).read_bytes() for p in first}
    (tmp_path / "data/episodes/turns.parquet").unlink()
    assert stage.main() == 1  # one-line error, nothing overwritten
    assert first == {p: (tmp_path / "data/store" / p).read_bytes() for p in first}


@pytest.mark.parametrize("change", ["remove_row", "plant_row"])
def test_a_row_removed_from_or_planted_in_the_table_is_refused_naming_the_file(tmp_path, change):
    """The hash is checked on the table retrieval reads, not only on the JSONL export beside it."""
    store = build_store(*tables(), splits=["train"], config_hash="c", reader=READER)
    write_store(store, tmp_path)
    table = read_parquet(tmp_path / STORE_PARQUET)
    table = table.slice(1) if change == "remove_row" else pa.concat_tables([table, table.slice(0, 1)])
    write_parquet(table, tmp_path / STORE_PARQUET)  # still valid Parquet; JSONL and hash untouched
    with pytest.raises(ArtifactError, match=f"{STORE_PARQUET}: its {3 if change == 'remove_row' else 5} entries "
                                            "hash to .* modified outside the store stage"):
        load_store(tmp_path)


def test_a_missing_jsonl_export_is_an_error_not_a_skipped_check(tmp_path):
    write_store(build_store(*tables(), splits=["train"], config_hash="c", reader=READER), tmp_path)
    (tmp_path / STORE_JSONL).unlink()
    with pytest.raises(ArtifactError, match=f"missing .*{STORE_JSONL}"):
        load_store(tmp_path)
