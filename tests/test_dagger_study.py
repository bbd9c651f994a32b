"""The model's study (``pipeline.policy.study``): its arms reproduce the library's
round and probe tasks at the library's settings, the longer grounding merges more quests, the
paired probe table counts the discordant pairs, the run's labels tokenize as rendered, and a
held-out house's past visits reach its memory block (the ``memory`` probe and arm key).

Real code on the session's tiny games (the fixtures of tests/test_dagger.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.test_dagger import cfg, memory, tiny_model  # noqa: F401  (fixtures)


def _ids(tasks):
    return [(t.task_id, t.kind, t.prompt) for t in tasks]


def test_probe_tasks_at_two_quests_are_the_episode_probes(cfg, tiny_games, memory):  # noqa: F811
    from pipeline.policy.dagger import EpisodeProbe
    from pipeline.policy.study import probe_tasks

    rows, scenes = tiny_games.rows, tiny_games.scenes
    lib = EpisodeProbe.build(cfg, rows, scenes, memory, n=3).tasks
    assert lib and _ids(probe_tasks(cfg, rows, scenes, memory, 3)) == _ids(lib)


def test_a_skipped_probe_sample_is_the_held_out_streams_next_houses(cfg, tiny_games, memory):  # noqa: F811
    """``--probe-skip``: a confirmation's fresh sample is the held-out houses after the first ones,
    none of them shared with the sample the study decided on."""
    from pipeline.policy.study import probe_tasks

    rows, scenes = tiny_games.rows, tiny_games.scenes
    first, fresh = probe_tasks(cfg, rows, scenes, memory, 2), probe_tasks(cfg, rows, scenes, memory, 1, skip=2)
    both = probe_tasks(cfg, rows, scenes, memory, 3)
    houses = lambda ts: [t.house.scene_id for t in ts]  # noqa: E731
    assert fresh and not set(houses(fresh)) & set(houses(first))
    assert _ids(both) == _ids(first) + _ids(fresh)


def test_round_tasks_at_the_librarys_settings_are_dagger_tasks(cfg, tiny_games, memory):  # noqa: F811
    from pipeline.policy.dagger import dagger_tasks
    from pipeline.policy.study import Arm, round_tasks

    rows, scenes = tiny_games.rows, tiny_games.scenes
    library = round_tasks(cfg, rows, scenes, memory, 1, 5,
                          Arm("library", quests=2, grounded=float(cfg.policy.generated_grounding)))
    assert _ids(library) == _ids(dagger_tasks(cfg, rows, scenes, memory, 1, 5))
    everyone = round_tasks(cfg, rows, scenes, memory, 1, 5, Arm("all", quests=2, grounded=1.0))
    nobody = round_tasks(cfg, rows, scenes, memory, 1, 5, Arm("none", quests=2, grounded=0.0))
    assert [t.house.scene_id for t in everyone] == [t.house.scene_id for t in nobody]  # same houses
    assert not any(t.variant.grounding for t in nobody)
    assert sum(bool(t.variant.grounding) for t in everyone) >= sum(bool(t.variant.grounding) for t in library)


def test_longer_grounding_merges_the_later_quests_of_the_same_houses(cfg, tiny_games):  # noqa: F811
    from pipeline.policy.demos import house_grounding, rule_agent_config, training_houses
    from pipeline.policy.study import grounding_from_quests

    rows, scenes = tiny_games.rows, tiny_games.scenes
    rule_cfg = rule_agent_config(cfg)
    two = training_houses(cfg, rows, scenes, heldout=True, quests_per_house=2).houses(4)
    five = training_houses(cfg, rows, scenes, heldout=True, quests_per_house=5).houses(4)
    assert [h.row(0)["objective"] for h in two] == [h.row(0)["objective"] for h in five]
    longer = 0
    for h2, h5 in zip(two, five):
        s2, s5 = {**scenes, h2.scene_id: h2.spec}, {**scenes, h5.scene_id: h5.spec}
        assert grounding_from_quests(rule_cfg, h2, s2) == house_grounding(rule_cfg, h2, s2)
        short, long_ = grounding_from_quests(rule_cfg, h2, s2), grounding_from_quests(rule_cfg, h5, s5)
        longer += len((long_ or "").splitlines()) > len((short or "").splitlines())
    assert longer > 0


def test_paired_table_counts_discordant_pairs_against_plain_on_the_same_houses():
    from pipeline.policy.study import paired_table

    res = {"p2": {"probe_plain_h0": True, "probe_plain_h1": False, "probe_plain_h2": False,
                  "probe_grounded_h0": False, "probe_grounded_h1": True, "probe_grounded_h2": True,
                  "probe_oracle_h0": True},
           "p6": {"probe_grounded_h1": False, "probe_grounded_h2": True}}
    table = paired_table(res)
    assert table["plain"] == {"won": 1, "n": 3}
    assert table["p2_grounded"] == {"won": 2, "n": 3, "plain_won": 1, "b": 2, "c": 1}
    assert table["p2_oracle"] == {"won": 1, "n": 1, "plain_won": 1, "b": 0, "c": 0}
    assert table["p6_grounded"] == {"won": 1, "n": 2, "plain_won": 0, "b": 1, "c": 0}
    with pytest.raises(ValueError, match="no plain episode"):
        paired_table({"p6": {"probe_grounded_h9": True}, "p2": {"probe_plain_h0": True}})


def test_the_memory_kind_is_paired_with_grounded_on_the_same_houses():
    from pipeline.policy.study import markdown, paired_table

    res = {"p2": {"probe_plain_h0": True, "probe_plain_h1": False, "probe_plain_h2": True},
           "p6": {"probe_grounded_h0": True, "probe_grounded_h1": False, "probe_grounded_h2": True,
                  "probe_memory_h0": False, "probe_memory_h1": True, "probe_memory_h2": False}}
    table = paired_table(res)
    assert table["p6_memory"] == {"won": 1, "n": 3, "plain_won": 2, "b": 1, "c": 2,
                                  "grounded_won": 2, "b_vs_grounded": 1, "c_vs_grounded": 2}
    assert "1/3 (grounded 2; b=1 c=2)" in markdown([{"arm": "run", "probe": table}])
    with pytest.raises(ValueError, match="no grounded episode"):
        paired_table({"p2": {"probe_plain_h0": True}, "p6": {"probe_memory_h0": True}})


def test_a_held_out_houses_past_visits_reach_its_memory_block(cfg, tiny_games, memory):  # noqa: F811
    """The ``memory`` probe: the grounded prompt of the same house plus the C2 block, built from a
    store that holds the rule agent's episodes of the house's later quests: the block says what
    this house held, which the run's store (other houses only) cannot."""
    from pipeline.policy.study import house_memory, past_visits, probe_tasks
    from pipeline.policy.demos import rule_agent_config, training_houses

    rows, scenes = tiny_games.rows, tiny_games.scenes
    house = training_houses(cfg, rows, scenes, heldout=True, quests_per_house=3).houses(1)[0]
    episodes, turns = past_visits(rule_agent_config(cfg), house, {**scenes, house.scene_id: house.spec})
    assert len(episodes) == 2 and {e["scene_id"] for e in episodes} == {house.scene_id}
    with_visits = house_memory(cfg, memory, episodes, turns)
    assert len(with_visits.store) == len(memory.store) + 2
    assert house_memory(cfg, memory, [], []) is memory
    tasks = probe_tasks(cfg, rows, scenes, memory, 4, quests=3, kinds=("grounded", "memory"))
    by = {(t.kind, t.house.scene_id): t for t in tasks}
    paired = [(by[("grounded", h)], t) for (k, h), t in by.items() if k == "memory"]
    assert paired, "no held-out house got a memory prompt"
    for grounded, mem in paired:
        assert mem.variant.grounding == grounded.variant.grounding and mem.variant.block
        assert grounded.variant.grounding in mem.prompt and mem.variant.block in mem.prompt
        assert "This house" in mem.variant.block  # its own past visits, not only other houses'
    assert all(k in ("grounded", "memory") for k, _ in by)


def test_a_memory_arm_plays_the_librarys_houses_with_their_past_visits(cfg, tiny_games, memory):  # noqa: F811
    from pipeline.policy.study import VISITS, Arm, round_tasks

    rows, scenes = tiny_games.rows, tiny_games.scenes
    library = round_tasks(cfg, rows, scenes, memory, 1, 4, Arm("lib", quests=3, grounded=1.0))
    visits = round_tasks(cfg, rows, scenes, memory, 1, 4, Arm("visits", quests=3, grounded=1.0, memory=1.0))
    assert [t.house.scene_id for t in visits] == [t.house.scene_id for t in library]
    assert not any(t.kind.endswith(VISITS) for t in library)
    own = [t for t in visits if t.kind.endswith(VISITS)]
    assert own and all("This house" in t.variant.block for t in own)


@pytest.mark.parametrize("text, problem", [("x", "expected NAME"), ("x=quests=1", "quests must be"),
                                            ("x=width=3", "is not quests"), ("x=grounded=2", "grounded and memory"),
                                            ("x=memory=1.5", "grounded and memory"), ("x=memory=lots", "not a number")])
def test_an_arm_that_cannot_be_read_is_refused_with_the_text(text, problem):
    from pipeline.policy.study import Arm

    with pytest.raises(ValueError, match=problem):
        Arm.parse(text)


def test_the_runs_labels_tokenize_from_their_text_as_the_backend_rendered_them(cfg, tiny_games, memory,  # noqa: F811
                                                                             tiny_model, tmp_path):
    from pipeline.core.io import write_parquet
    from pipeline.policy.training import demos_table
    from pipeline.policy.dagger import dagger_tasks, model_backend, play_houses, rollout_config, turn_units
    from pipeline.policy.study import run_label_units

    model, tok = tiny_model
    rcfg = rollout_config(cfg)
    tasks = dagger_tasks(cfg, tiny_games.rows, tiny_games.scenes, memory, 0, 2)
    rcfg = OmegaConf.merge(rcfg, {"env": {"max_steps": 3}})
    labels = [x for r in play_houses(rcfg, model_backend(rcfg, model, tok), tasks, label=True) for x in r.labels]
    units, prompts = turn_units(cfg, model, tok, labels)
    write_parquet(demos_table(labels, prompts), tmp_path / "demos.parquet")
    again = run_label_units(tok, tmp_path / "demos.parquet")
    assert labels and again == units


def test_an_arms_drills_key_parses(cfg):  # noqa: F811
    """The study's ``drills`` arm key: the library's statement drills (tests/test_statement_drills.py)."""
    from pipeline.policy.study import Arm

    assert Arm.parse("s=drills=2400").drills == 2400
    with pytest.raises(ValueError, match="drills >= 0"):
        Arm.parse("s=drills=-1")
