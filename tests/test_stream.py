"""The streaming protocol (issue 68): the order, each condition's own growing memory, the controls, the figures."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.analysis.stream import degradations, in_window, stream_csv, summarise_streams
from pipeline.core.conf_schema import StreamStart
from pipeline.session.rollout import Task
from pipeline.session.stream import StreamStep, check_identical_streams, stream_rounds


def _task(scene: str, quest: str) -> Task:
    return Task(episode_id=f"eval_{scene}_{quest}_0", scene_id=scene, quest_id=quest, split="eval", objective="",
                game_file="", expert_plan=[], preferences=[], seed=0)


def test_every_condition_streams_each_house_s_tasks_in_one_seeded_order():
    tasks = [_task(s, f"q{i}") for s in ("s1", "s0") for i in range(5)] + [_task("s2", "q0")]
    rounds = stream_rounds(tasks, seed=3)
    assert [len(r) for r in rounds] == [3, 2, 2, 2, 2]  # s2 has one task: it ends after round 0
    assert [[t.scene_id for t in r] for r in rounds][:2] == [["s0", "s1", "s2"], ["s0", "s1"]]
    order = {s: [t.quest_id for r in rounds for t in r if t.scene_id == s] for s in ("s0", "s1")}
    assert sorted(order["s0"]) == [f"q{i}" for i in range(5)]
    assert order["s0"] != sorted(order["s0"]) or order["s1"] != sorted(order["s1"])  # drawn, not the id order
    # the same seed, any task order: the same streams; another seed: others; a scene added moves no other stream
    assert stream_rounds(list(reversed(tasks)), seed=3) == rounds
    assert stream_rounds(tasks, seed=4) != rounds
    more = stream_rounds(tasks + [_task("s3", f"q{i}") for i in range(3)], seed=3)
    assert [[t for t in r if t.scene_id != "s3"] for r in more] == rounds


def _step(cond_prompt: str, scene: str, quest: str, position: int, won: bool, injected: bool = False) -> StreamStep:
    row = {"system_prompt": cond_prompt, "injected": injected, "injected_entry_ids": ["mem_x"] if injected else [],
           "memory_block": "MEM: Apple_2 was in Fridge_0" if injected else ""}
    return StreamStep(position, 2, _task(scene, quest), row, position, position,
                      {"episode_id": f"eval_{scene}_{quest}_0", "is_correct": won, "won": won, "num_turns": 5})


def test_the_controls_of_a_stream_are_checked_and_its_memory_induced_errors_listed():
    c1 = [_step("p1", "s0", "q0", 0, True), _step("p2", "s0", "q1", 1, True)]
    silent = [_step("p1", "s0", "q0", 0, True), _step("p2", "s0", "q1", 1, True)]
    c2 = [_step("p1", "s0", "q0", 0, True), _step("p2+block", "s0", "q1", 1, False, injected=True)]
    assert check_identical_streams({"C1": c1, "C2_silent": silent, "C2": c2}, [["C1", "C2_silent"]]) == []
    leak = [silent[0], _step("p2 with text", "s0", "q1", 1, True)]
    assert check_identical_streams({"C1": c1, "C2_silent": leak}, [["C1", "C2_silent"]]) == [
        "C2_silent vs C1: s0/q1 (position 1): prompts differ"]
    assert check_identical_streams({"C1": c1}, [["C1", "C2_silent"]]) == []  # a stream not played: nothing to check
    rows = [{"agent": "reader", "condition": c, "position": s.position, "scene_id": s.task.scene_id,
             "quest_id": s.task.quest_id, "success": s.episode["is_correct"],
             "injected_entry_ids": s.prompt_row["injected_entry_ids"], "memory_block": s.prompt_row["memory_block"]}
            for c, steps in (("C1", c1), ("C2", c2)) for s in steps]
    assert degradations(rows) == [{"agent": "reader", "scene_id": "s0", "quest_id": "q1", "position": 1,
                                   "injected_entry_ids": ["mem_x"], "memory_block": "MEM: Apple_2 was in Fridge_0"}]
    assert degradations(rows, treatment="C2_placebo") == []  # not streamed: nothing lost


def _rows(successes: dict[str, list[bool]], length: int = 4) -> list[dict]:
    """Rows of one agent: per condition, the outcome of the task at each position of one scene's stream."""
    return [{"agent": "reader", "condition": c, "position": i % length, "length": length, "scene_id": f"s{i // length}",
             "quest_id": f"q{i}", "scene_split": "seen", "success": s, "turns": 3 if s else 9}
            for c, xs in successes.items() for i, s in enumerate(xs)]


def test_the_figures_pair_tasks_per_window_and_adjust_each_family():
    rows = _rows({"C1": [False] * 8, "C2": [False, False, True, True] * 2, "C2_placebo": [False] * 8})
    assert [in_window(r, "second_half") for r in rows[:4]] == [False, False, True, True]
    with pytest.raises(ValueError, match="window='last'"):
        in_window(rows[0], "last")
    s = summarise_streams(rows, families={"comparisons": [["C2", "C1"], ["C2", "C2_placebo"], ["C2", "C0"]]},
                          n_resamples=200, level=0.95, seed=0, alpha=0.05, power=0.8, discordance=0.35)
    pts = {(p["window"], p["condition"]): (p["n"], p["success"]) for p in s["points"]}
    assert pts[("all", "C2")] == (8, 0.5) and pts[("second_half", "C2")] == (4, 1.0)
    got = {(p["window"], p["treatment"], p["control"]): p for p in s["paired"]}
    assert set(got) == {(w, "C2", c) for w in ("all", "second_half") for c in ("C1", "C2_placebo")}  # C0 not streamed
    half = got[("second_half", "C2", "C1")]
    assert (half["n_pairs"], half["success"]["table"]["b"], half["success"]["table"]["c"]) == (4, 4, 0)
    assert half["success"]["p_value"] == pytest.approx(0.125) and half["p_holm"] == pytest.approx(0.25)
    assert stream_csv(rows, agent="reader", value="success", conditions=["C1", "C2"]).splitlines() == [
        "position,C1,C2", "0,0.0000,0.0000", "1,0.0000,0.0000", "2,0.0000,1.0000", "3,0.0000,1.0000"]


@pytest.fixture(scope="module")
def stream_world(tiny_cfg, tmp_path_factory):
    """The tiny world with three eval quests per seen scene (a stream of three), its games built."""
    import shutil

    from pipeline.envs.household.build import build_games

    cfg = OmegaConf.merge(tiny_cfg, {"env": {"eval_quests_per_scene": 3}})
    root = tmp_path_factory.mktemp("stream_project")
    shutil.copytree(Path(__file__).resolve().parents[1] / "conf" / "templates", root / "conf" / "templates")
    build_games(cfg, root, progress=False)
    return cfg, root


def _play(cfg, root: Path, conditions, workers: int):
    from pipeline.envs import fact_reader, world_words
    from pipeline.session.stream import play_streams

    return play_streams(cfg, root, conditions=conditions, start=StreamStart.empty, work_dir=root / "work" / str(workers),
                        words=world_words(cfg), facts=fact_reader(cfg), workers=workers, progress=False)


def test_a_stream_remembers_its_own_earlier_episodes_and_the_controls_hold(stream_world):
    cfg, root = stream_world
    conditions = ["C1", "C2_silent", "C2", "C2_placebo"]
    one = _play(cfg, root, conditions, workers=1)
    steps = one["C2"]
    rounds = max(s.position for s in steps) + 1
    assert rounds == 3 and len(steps) == len(one["C1"])
    # before round i the store holds the episodes of the rounds before it, of every house; none of its own
    per_round = [sum(s.position == i for s in steps) for i in range(rounds)]
    for s in steps:
        assert s.store_entries == sum(per_round[:s.position])
        assert s.grounding_episodes == s.position  # its house's own earlier episodes ground the prompt
    assert all(s.task.quest_id not in " ".join(s.prompt_row["retrieved_entry_ids"] or []) for s in steps)
    assert any(s.prompt_row["injected"] for s in steps if s.position > 0)  # C2 shows what its stream saw
    assert not any(s.prompt_row["injected"] for s in steps if s.position == 0)  # nothing to show yet
    # C2_silent streams exactly C1's prompts; C1's prompts change as its grounding grows
    assert check_identical_streams(one, [["C1", "C2_silent"]]) == []
    assert all(not s.prompt_row["injected"] for s in one["C2_silent"] + one["C1"])
    # the worker count changes no step
    two = _play(cfg, root, conditions, workers=2)
    key = lambda st: [(s.position, s.task.episode_id, s.prompt_row["prompt_sha256"], s.store_entries,  # noqa: E731
                       dict(s.episode)) for s in st]
    assert {c: key(v) for c, v in one.items()} == {c: key(v) for c, v in two.items()}


def test_a_killed_stream_resumes_from_its_last_finished_round_to_the_same_bytes(stream_world, monkeypatch):
    import pipeline.session.stream as stream

    cfg, root = stream_world
    whole = _play(cfg, root, ["C2"], workers=1)["C2"]  # uninterrupted, in its own folder (work/1)
    real, played = stream.play_prompts, []

    def dies_at_round_two(*args, **kwargs):
        if len(played) == 2:
            raise KeyboardInterrupt  # as a kill would: round two never finishes
        played.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(stream, "play_prompts", dies_at_round_two)
    with pytest.raises(KeyboardInterrupt):
        _play(cfg, root, ["C2"], workers=3)  # work/3, one stream: played in this process
    kept = sorted((root / "work" / "3").glob("*/C2/rounds/*.json"))
    assert [p.name for p in kept] == ["0000.json", "0001.json"]

    def counts(*args, **kwargs):
        played.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(stream, "play_prompts", counts)
    played.clear()
    resumed = _play(cfg, root, ["C2"], workers=3)["C2"]
    assert len(played) == 1  # only the round that never finished is played again

    def key(st):
        return [(s.position, s.task.episode_id, s.prompt_row["prompt_sha256"], s.prompt_row["memory_block"],
                 s.store_entries, s.grounding_episodes, dict(s.episode)) for s in st]

    assert key(resumed) == key(whole)
    # a kept round of other prompts (another config or an edited file) is never resumed from
    kept[1].write_text(kept[1].read_text().replace('"prompts": ["', '"prompts": ["0'), encoding="utf-8")
    played.clear()
    assert key(_play(cfg, root, ["C2"], workers=3)["C2"]) == key(whole)
    assert len(played) == 1  # round one again (its file is not its prompts'); round two's prompts follow it, kept
    other = OmegaConf.merge(cfg, {"memory": {"max_message_chars": int(cfg.memory.max_message_chars) - 1}})
    played.clear()
    _play(other, root, ["C2"], workers=3)
    assert len(played) == 3 and len(list((root / "work" / "3").glob("*/C2"))) == 2  # another key: its own folder
    # what changes no step (an analysis key, which other streams run) resumes every round
    same = OmegaConf.merge(cfg, {"experiment": {"alpha": 0.01, "stream": {"conditions": ["C1", "C2"]}}})
    played.clear()
    assert key(_play(same, root, ["C2"], workers=3)["C2"]) == key(whole) and played == []


def test_the_report_shows_the_streams_with_their_families_and_errors(tiny_cfg):
    from pipeline.analysis.stream import stream_summary
    from pipeline.analysis.report import stream_markdown

    rows = [{**r, "injected_entry_ids": ["mem_1"] if r["condition"] == "C2" and r["position"] else [],
             "memory_block": "MEM: Key_1 was in Drawer_3" if r["condition"] == "C2" and r["position"] else ""}
            for r in _rows({"C1": [True, True, False, False], "C2": [True, False, True, True]})]
    summary = stream_summary(rows, tiny_cfg)
    assert summary["conditions"] == ["C1", "C2"] and len(summary["degradations"]) == 1
    text = "\n".join(stream_markdown({"stream": summary}))
    assert "## The streaming protocol" in text and "| reader | second half | 2 | 0.00 | 1.00 |" in text
    assert "| reader | second half | comparisons | C2 − C1 | 2 |" in text
    assert "Memory-induced errors (C2 lost a task C1 won, after an advisory): 1." in text
    assert "s0/q1 at position 1: `MEM: Key_1 was in Drawer_3`" in text
    assert stream_markdown({}) == [] and stream_markdown({"stream": {"points": []}}) == []


def test_two_runs_streams_diff_step_by_step():
    from pipeline.analysis.stream import ROW_FIELDS
    from pipeline.stages.stream import STEP_SCHEMA
    from pipeline.tools.diff.core import ARTIFACTS
    from pipeline.tools.diff.tables import key_columns

    assert ARTIFACTS["stream"] == [("stream", ["steps.parquet"])]
    assert key_columns(STEP_SCHEMA.names) == ["scene_id", "quest_id", "condition", "agent"]
    assert set(ROW_FIELDS) <= set(STEP_SCHEMA.names)


def test_the_readme_s_runtime_block_gives_the_stream_run_s_minutes(tmp_path):
    import json

    from pipeline.tools.results import runtime_summary

    assert "experiment=stream" not in runtime_summary(tmp_path)  # no committed stream run: no row
    run = tmp_path / "runs" / "stream"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"name": "stream", "params": {}}))
    (run / "stream.json").write_text(json.dumps({"wall_time_s": 66.0, "workers": {"reader": 2}}))
    (run / "curve.json").write_text(json.dumps({"wall_time_s": 96.0, "workers": 2}))
    row = next(line for line in runtime_summary(tmp_path).splitlines() if "experiment=stream" in line)
    assert "stream 1.1" in row and "curve 1.6" in row and "**2.7**" in row


def test_the_streams_page_shows_every_step_and_escapes_what_it_quotes():
    from pipeline.view.stream import stream_html

    rows = [{**r, "store_entries": r["position"], "store_hash": "abc123", "grounding_episodes": r["position"],
             "retrieved_entry_ids": ["mem_a"] if r["position"] else [],
             "injected_entry_ids": ["mem_a"] if r["position"] and r["condition"] == "C2" else [],
             "memory_block": "<script>alert(1)</script> Key_1 was in Drawer_3" if r["condition"] == "C2" else ""}
            for r in _rows({"C1": [True, False, True, False], "C2": [True, True, True, True]})]
    page = stream_html(rows)
    assert page == stream_html(list(reversed(rows)))  # the same steps, the same bytes
    assert page.count("<tr><td>") == 8 and "reader: C2</a> (4 of 4 won)" in page and "(2 of 4 won)" in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; Key_1 was in Drawer_3" in page
    assert "<td>mem_a</td>" in page and "<code>abc123</code>" in page
