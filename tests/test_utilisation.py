"""The utilisation probe (``pipeline.policy.utilisation``, issue 64): the held-out houses' four
prompt kinds played by the model and the reader, paired by house, the model's difference over
the reader's. Real code on the session's tiny games (the fixtures of tests/test_dagger.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.test_dagger import capped, cfg, memory, tiny_model  # noqa: F401  (fixtures)


def _outcomes(by_kind: dict[str, list[bool]]) -> dict[str, bool]:
    return {f"probe_{kind}_house{i}": won for kind, wins in by_kind.items() for i, won in enumerate(wins)}


def test_the_model_s_utilisation_is_its_paired_difference_over_the_reader_s_on_the_same_houses():
    from pipeline.policy.utilisation import markdown, success_csv, summarise

    # 8 houses; house 7 has no memory block (the gate withheld it): C2 - C1 pairs 7 houses
    reader = _outcomes({"plain": [0, 0, 0, 0, 1, 0, 0, 0], "grounded": [0, 0, 1, 1, 1, 0, 0, 0],
                        "memory": [1, 1, 1, 1, 1, 1, 0], "oracle": [1] * 8, "recall": [1, 1, 0, 1, 1, 0, 0, 1]})
    model = _outcomes({"plain": [0] * 8, "grounded": [0, 0, 1, 0, 0, 0, 0, 0],
                       "memory": [1, 0, 1, 0, 0, 0, 0], "oracle": [1, 1, 0, 0, 0, 0, 0, 1], "recall": [0] * 8})
    s = summarise({k: bool(v) for k, v in model.items()}, {k: bool(v) for k, v in reader.items()}, seed=0)
    assert s["success"]["reader"]["C2"] == {"success": round(6 / 7, 6), "n": 7}
    assert s["success"]["model"]["C0"] == {"success": 0.0, "n": 8}
    rows = {(r["agent"], r["treatment"], r["control"]): r for r in s["paired"]}
    m, r = rows[("model", "C2", "C1")], rows[("reader", "C2", "C1")]
    assert m["houses"] == r["houses"] == 7
    assert m["success"]["table"]["b"] == 1 and m["success"]["table"]["c"] == 0  # house 0 only
    assert r["success"]["table"]["b"] == 3 and r["success"]["table"]["c"] == 0  # houses 0, 1, 5; none lost
    # the model's +1/7 over the reader's +3/7 on the same seven houses
    assert m["utilisation"]["value"] == pytest.approx(1 / 3)
    assert "utilisation" not in r
    # Holm within each agent: never below the exact p, the largest at most 1
    for agent in ("model", "reader"):
        ps = [x for x in s["paired"] if x["agent"] == agent]
        assert len(ps) == 4 and all(x["p_holm"] >= x["success"]["p_value"] for x in ps)
    # the block alone against nothing: the reader +4/8 (houses 0, 1, 3, 7; house 4 both), the model 0
    alone = rows[("model", "C0+memory", "C0")]
    assert alone["houses"] == 8 and alone["utilisation"]["value"] == 0.0
    assert rows[("reader", "C0+memory", "C0")]["success"]["table"] == {"both": 1, "b": 4, "c": 0, "neither": 3}
    assert "| C2 − C1 | 7 |" in markdown(s) and "0.33 [" in markdown(s)
    assert "reader,C2,0.857143,7,reader C2" in success_csv(s).splitlines()


def test_the_reader_plays_the_held_out_probe_and_follows_every_verified_plan(cfg, tiny_games, memory, tiny_model):  # noqa: F811
    from pipeline.policy.dagger import play_rollouts, rollout_config, rollout_pool
    from pipeline.policy.study import probe_tasks
    from pipeline.policy.utilisation import KINDS, play_reader, summarise

    tasks = probe_tasks(cfg, tiny_games.rows, tiny_games.scenes, memory, 4, quests=3, kinds=tuple(KINDS))
    kinds = {t.kind for t in tasks}
    assert {"plain", "grounded", "oracle", "recall"} <= kinds
    # the block alone: a memory block, no grounding (the house's past visits are in the store)
    assert all(t.variant.block and t.variant.grounding is None for t in tasks if t.kind == "recall")
    reader = play_reader(cfg, tasks)
    assert set(reader) == {t.task_id for t in tasks}
    assert all(reader[t.task_id] for t in tasks if t.kind == "oracle")  # the plan's text is worth the task to it
    # the held-out houses are the generated stream's, never a game of the manifest
    assert not {t.house.scene_id for t in tasks} & {r["scene_id"] for r in tiny_games.rows}
    model, tok = tiny_model
    with rollout_pool(rollout_config(capped(cfg))) as pool:
        played = {r.task.task_id: bool(r.success) for r in play_rollouts(pool, model, tok, tasks, label=False)}
    s = summarise(played, reader, seed=0)
    assert s["success"]["reader"]["C2_oracle"]["success"] == 1.0
    assert {(x["agent"], x["treatment"], x["control"]) for x in s["paired"]} >= {("reader", "C2_oracle", "C1")}


def test_the_reader_s_reasoning_line_names_its_decision_first_phrase_in_order():
    from pipeline.policy.utilisation import OTHER, decision_of

    lines = {  # the reader teacher's first lines as it writes them (rationale, then the command)
        "Verified step 2 of 5: take Bowl_4 from Cabinet_1": "verified plan",
        "Soap_7 should be in Cabinet_4: open it: open Cabinet_4.": "open a believed holder",
        "Soap_7 is in the LivingRoom (Cabinet_4): go there: go west.": "go where a statement places it",
        "Spoon_4 is within reach: take it: take Spoon_4 from Cabinet_4.": "take what it needs",
        "Nothing I need is left in Fridge_9, and the user wants it closed: close Fridge_9.": "keep a preference",
        "I carry Remote_0; the way to the LivingRoom is through 'LivingRoom': go east.": "carry it",
        "I hold Cup_1 and Shelf_2 is here: put it on Shelf_2: put Cup_1 on Shelf_2.": "put it at the destination",
        # a search line that ends like a take or a walk is a search (the order of DECISIONS)
        "Key_5 may open a locked container: take it before closing Fridge_9: take Key_5 from Fridge_9.": "search",
        "Drawer_2 in the Kitchen may hold what I need (not yet looked into): go there: go north.": "search",
        "Another step was played: look.": OTHER,
    }
    for line, kind in lines.items():
        assert decision_of(line + '\n{"action": "look"}') == kind, line


def test_decisions_count_where_the_model_plays_the_reader_s_command(cfg, tiny_games, memory, tiny_model):  # noqa: F811
    """Labelled by the reader on the model's own states: the episodes are those of an unlabelled
    run, each turn is counted once under its decision and once under turn 0 / later."""
    from pipeline.policy.dagger import play_rollouts, rollout_config, rollout_pool
    from pipeline.policy.study import probe_tasks
    from pipeline.policy.utilisation import DECISIONS, KINDS, OTHER, decisions, decisions_markdown

    tasks = probe_tasks(cfg, tiny_games.rows, tiny_games.scenes, memory, 3, quests=3, kinds=tuple(KINDS))
    model, tok = tiny_model
    play = OmegaConf.merge(rollout_config(capped(cfg)), {"policy": {"teacher": "reader"}})
    with rollout_pool(play) as pool:
        labelled = play_rollouts(pool, model, tok, tasks, label=True)
        plain = play_rollouts(pool, model, tok, tasks, label=False)
    assert [(r.won, r.success, r.turns) for r in labelled] == [(r.won, r.success, r.turns) for r in plain]
    for r in labelled:
        assert len(r.agreement) == len(r.labels) == r.turns and sum(r.agreement) == r.agreed
    table = decisions(labelled)
    names = {n for n, _ in DECISIONS} | {OTHER, "turn 0", "later", "all"}
    for kind, cond in KINDS.items():
        rolls = [r for r in labelled if r.task.kind == kind]
        if not rolls:
            continue
        by = table[cond]
        assert set(by) <= names
        assert by["all"] == {"turns": sum(r.turns for r in rolls), "agreed": sum(r.agreed for r in rolls)}
        assert by["turn 0"]["turns"] == len(rolls)
        split = [v for k, v in by.items() if k not in ("turn 0", "later", "all")]
        assert sum(v["turns"] for v in split) == by["all"]["turns"]
        assert sum(v["agreed"] for v in split) == by["all"]["agreed"]
    # the reader's first step under a verified plan is the plan's
    oracle = [r for r in labelled if r.task.kind == "oracle"]
    assert oracle and all(r.labels[0].response.startswith("Verified step 1 of") for r in oracle)
    assert table["C2_oracle"]["verified plan"]["turns"] >= len(oracle)
    assert "| verified plan |" in decisions_markdown(table)


def test_two_models_are_paired_on_the_same_tasks_per_prompt_and_pooled():
    """``--against``: a candidate recipe's model against another's on the same held-out tasks (the
    rules of a recipe's decision pool C1 and C0+memory, the prompts that state where things are, or
    every prompt)."""
    from pipeline.policy.utilisation import against, against_markdown

    mine = _outcomes({"plain": [1, 0, 0], "grounded": [1, 1, 0], "recall": [1, 1, 1], "oracle": [1, 1, 1]})
    theirs = _outcomes({"plain": [1, 1, 0], "grounded": [0, 0, 0], "recall": [1, 0, 0], "oracle": [1, 1, 1]})
    rows = against({k: bool(v) for k, v in mine.items()}, {k: bool(v) for k, v in theirs.items()})
    assert rows["C0"] == {"n": 3, "won": 1, "other_won": 2, "b": 0, "c": 1, "p_exact": 1.0}
    assert rows["C1"]["b"] == 2 and rows["C1"]["c"] == 0
    pooled = rows["C1 + C0+memory"]
    assert (pooled["n"], pooled["won"], pooled["other_won"], pooled["b"], pooled["c"]) == (6, 5, 1, 4, 0)
    assert pooled["p_exact"] == pytest.approx(0.125)
    assert "C2" not in rows  # no such episodes: no row
    every = rows["all five prompts"]  # C0, C1, C0+memory and C2_oracle: 12 pairs
    assert (every["n"], every["won"], every["other_won"], every["b"], every["c"]) == (12, 9, 6, 4, 1)
    assert every["p_exact"] == pytest.approx(0.375)
    assert "| C1 + C0+memory | 6 | 5 | 1 | 4 / 0 | 0.125 |" in against_markdown(rows, "other")


def test_the_probe_names_what_it_lacks(tmp_path, capsys):
    from pipeline.policy.utilisation import main

    with pytest.raises(SystemExit):
        main(["--houses", "0"])
    assert "--houses 0 --quests 6: expected at least 1 house and 2 quests" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--skip", "-1"])
    assert "--skip -1: expected a count of held-out houses >= 0" in capsys.readouterr().err
    (tmp_path / "other.json").write_text('{"houses": 48, "quests": 6, "outcomes": {"model": {}}}')
    with pytest.raises(SystemExit):
        main(["--against", str(tmp_path / "other.json")])
    assert ("it played houses=48 quests=6 skip=0 sizes=drawn, this run houses=96 quests=6 skip=0 sizes=env"
            in capsys.readouterr().err)  # a file without sizes was written before the option: drawn houses
    (tmp_path / "other.json").write_text('{"houses": 96, "quests": 6, "sizes": "env", "outcomes": {"model": {}}}')
    with pytest.raises(SystemExit):  # the same houses, other sizes: not the same tasks
        main(["--against", str(tmp_path / "other.json"), "--sizes", "drawn"])
    assert "sizes=env, this run houses=96 quests=6 skip=0 sizes=drawn" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path / "nowhere")])
    assert "config.json not found (a transformers model directory)" in capsys.readouterr().err
