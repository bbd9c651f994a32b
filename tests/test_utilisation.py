"""The utilisation probe (``pipeline.policy.utilisation``, issue 64): the held-out houses' four
prompt kinds played by the model and the reader, paired by house, the model's difference over
the reader's. Real code on the session's tiny games (the fixtures of tests/test_dagger.py)."""

from __future__ import annotations

import pytest

from tests.test_dagger import cfg, memory, tiny_model  # noqa: F401  (fixtures)


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
    assert "reader,C2,0.857143,7" in success_csv(s).splitlines()


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
    with rollout_pool(rollout_config(cfg)) as pool:
        played = {r.task.task_id: bool(r.success) for r in play_rollouts(pool, model, tok, tasks, label=False)}
    s = summarise(played, reader, seed=0)
    assert s["success"]["reader"]["C2_oracle"]["success"] == 1.0
    assert {(x["agent"], x["treatment"], x["control"]) for x in s["paired"]} >= {("reader", "C2_oracle", "C1")}


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
    assert "it played houses=48 quests=6 skip=0, this run houses=96 quests=6 skip=0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path / "nowhere")])
    assert "config.json not found (a transformers model directory)" in capsys.readouterr().err
