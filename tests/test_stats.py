"""Statistics with known answers: exact McNemar, bootstrap coverage, pairing, degenerate inputs."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from pipeline.core import stats as S
from pipeline.core.seeding import labelled_rng


# --------------------------------------------------------------------------- McNemar


@pytest.mark.parametrize(
    "b, c, expected",
    [
        (0, 5, 0.0625),  # 2 * (1/2)^5
        (5, 0, 0.0625),
        (3, 3, 1.0),  # b == c
        (7, 7, 1.0),
        (0, 0, 1.0),  # no discordant pair
        (1, 9, 22 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10
        (2, 10, 2 * (comb(12, 0) + comb(12, 1) + comb(12, 2)) / 2**12),  # 158/4096
        (0, 1, 1.0),  # a single discordant pair can never be significant
    ],
)
def test_mcnemar_exact_known_values(b, c, expected):
    assert S.mcnemar_exact(b, c) == pytest.approx(expected, abs=1e-12)


def test_mcnemar_exact_rejects_negative_counts():
    with pytest.raises(ValueError, match="b=-1"):
        S.mcnemar_exact(-1, 3)


def test_mcnemar_table_counts_each_cell():
    t = [1, 1, 0, 0, 1, 0, 1]
    c = [1, 0, 1, 0, 0, 0, 1]
    assert S.mcnemar_table(t, c) == {"both": 2, "b": 2, "c": 1, "neither": 2}


def test_paired_binary_on_hand_made_outcomes():
    # Treatment wins 5 tasks the control loses, never the reverse, 5 ties: b=5, c=0.
    t = [True] * 5 + [True] * 3 + [False] * 2
    c = [False] * 5 + [True] * 3 + [False] * 2
    out = S.paired_binary(t, c, n_resamples=500, level=0.95, rng=labelled_rng(0, "x"))
    assert out["table"] == {"both": 3, "b": 5, "c": 0, "neither": 2}
    assert out["p_value"] == pytest.approx(0.0625)
    assert out["treatment"] == 0.8 and out["control"] == 0.3
    assert out["diff"]["value"] == pytest.approx(0.5)
    assert 0.0 <= out["diff"]["ci_low"] <= 0.5 <= out["diff"]["ci_high"] <= 1.0


def test_holm_adjustment():
    assert S.holm([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06]
    assert S.holm([0.5, None, 0.01]) == [0.5, None, 0.02]
    assert S.holm([]) == []


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_is_seeded_and_label_specific():
    x = np.random.default_rng(3).random(40)
    a = S.bootstrap_mean(x, n_resamples=300, level=0.95, rng=labelled_rng(7, "success_rate"))
    b = S.bootstrap_mean(x, n_resamples=300, level=0.95, rng=labelled_rng(7, "success_rate"))
    c = S.bootstrap_mean(x, n_resamples=300, level=0.95, rng=labelled_rng(7, "mean_turns"))
    assert a == b
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)
    assert a.value == pytest.approx(x.mean())


def test_bootstrap_chunking_does_not_change_the_result(monkeypatch):
    x = np.random.default_rng(5).random(50)
    whole = S.bootstrap_mean(x, n_resamples=200, level=0.9, rng=labelled_rng(1, "m"))
    monkeypatch.setattr(S, "_CHUNK_VALUES", 7 * 50)  # 7 resamples per chunk
    chunked = S.bootstrap_mean(x, n_resamples=200, level=0.9, rng=labelled_rng(1, "m"))
    assert whole == chunked


def test_bootstrap_mean_covers_the_truth_at_about_the_nominal_rate():
    # 400 simulated studies of n=80 Bernoulli(0.3) outcomes: a 95% percentile interval
    # should contain 0.3 about 95% of the time (binomial sd over 400 studies ~ 1.1%).
    truth, n, reps = 0.3, 80, 400
    sim = np.random.default_rng(12345)
    hits = 0
    for r in range(reps):
        x = (sim.random(n) < truth).astype(float)
        est = S.bootstrap_mean(x, n_resamples=400, level=0.95, rng=labelled_rng(r, "coverage"))
        hits += est.ci_low <= truth <= est.ci_high
    assert 0.90 <= hits / reps <= 0.99


def test_paired_bootstrap_covers_the_true_difference_and_is_narrower_than_unpaired():
    # Correlated pairs: a shared task difficulty drives both conditions' success.
    truth, n, reps = 0.15, 100, 300
    sim = np.random.default_rng(99)
    hits, paired_w, unpaired_w = 0, [], []
    for r in range(reps):
        u = sim.random(n)
        control = (u < 0.4).astype(float)
        treatment = (u < 0.4 + truth).astype(float)  # true difference exactly 0.15
        d = S.paired_bootstrap_diff(treatment, control, n_resamples=400, level=0.95, rng=labelled_rng(r, "pd"))
        hits += d.ci_low <= truth <= d.ci_high
        paired_w.append(d.ci_high - d.ci_low)
        t_ci = S.bootstrap_mean(treatment, n_resamples=400, level=0.95, rng=labelled_rng(r, "t"))
        c_ci = S.bootstrap_mean(control, n_resamples=400, level=0.95, rng=labelled_rng(r, "c"))
        unpaired_w.append(np.hypot(t_ci.ci_high - t_ci.ci_low, c_ci.ci_high - c_ci.ci_low))
    assert 0.90 <= hits / reps <= 0.99
    assert np.mean(paired_w) < 0.8 * np.mean(unpaired_w)


@pytest.mark.parametrize("values", [[1.0] * 12, [0.0] * 5, [0.7] * 9, [0.42]])
def test_zero_variance_and_single_observation_give_a_point_interval(values):
    est = S.bootstrap_mean(values, n_resamples=100, level=0.95, rng=labelled_rng(0, "z"))
    assert est.value == est.ci_low == est.ci_high == pytest.approx(values[0])
    assert est.n == len(values)
    d = S.paired_bootstrap_diff(values, values, n_resamples=100, level=0.95, rng=labelled_rng(0, "z"))
    assert d.as_dict() == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0, "n": len(values)}


def test_empty_input_gives_nulls_not_nan():
    est = S.bootstrap_mean([], n_resamples=100, level=0.95, rng=labelled_rng(0, "e"))
    assert est.as_dict() == {"value": None, "ci_low": None, "ci_high": None, "n": 0}
    assert S.bootstrap_ratio([], [], n_resamples=10, level=0.95, rng=labelled_rng(0, "e")).value is None


def test_bootstrap_ratio_resamples_whole_units():
    # 3 episodes: (invalid, turns) = (1, 10), (0, 5), (5, 5): per-turn rate 6/20.
    est = S.bootstrap_ratio([1, 0, 5], [10, 5, 5], n_resamples=500, level=0.95, rng=labelled_rng(0, "r"))
    assert est.value == pytest.approx(0.3)
    assert 0.0 <= est.ci_low <= 0.3 <= est.ci_high <= 1.0
    assert S.bootstrap_ratio([0, 0], [0, 0], n_resamples=10, level=0.95, rng=labelled_rng(0, "r")).value is None


def test_bootstrap_argument_errors():
    with pytest.raises(ValueError, match="level"):
        S.percentile_interval(np.ones(3), 1.5)
    with pytest.raises(ValueError, match="n_resamples"):
        S.bootstrap_mean([1.0, 2.0], n_resamples=0, level=0.95, rng=labelled_rng(0))
    with pytest.raises(S.PairingError):
        S.paired_bootstrap_diff([1, 0], [1], n_resamples=10, level=0.95, rng=labelled_rng(0))


# --------------------------------------------------------------------------- pairing


def _ep(eid, seed, won=True):
    return {"episode_id": eid, "seed": seed, "won": won}


def test_pair_rows_matches_by_episode_id_regardless_of_order():
    a = [_ep("ep_eval_s0_q1_0", 11), _ep("ep_eval_s0_q0_0", 10), _ep("ep_eval_s1_q0_0", 12)]
    b = [_ep("ep_eval_s0_q0_0", 10), _ep("ep_eval_s0_q1_0", 11), _ep("ep_eval_s2_q0_0", 13)]
    pairs, only_a, only_b = S.pair_rows(a, b)
    assert [(x["episode_id"], y["episode_id"]) for x, y in pairs] == [
        ("ep_eval_s0_q0_0", "ep_eval_s0_q0_0"), ("ep_eval_s0_q1_0", "ep_eval_s0_q1_0")]
    assert only_a == ["ep_eval_s1_q0_0"] and only_b == ["ep_eval_s2_q0_0"]


def test_pair_rows_rejects_different_task_seeds_across_conditions():
    with pytest.raises(S.PairingError, match=r"different seeds.*ep_eval_s0_q0_0.*C2 seed=10 vs C1 seed=99"):
        S.pair_rows([_ep("ep_eval_s0_q0_0", 10)], [_ep("ep_eval_s0_q0_0", 99)], where=("C2", "C1"))


def test_pair_rows_rejects_duplicate_keys():
    with pytest.raises(S.PairingError, match="occurs twice"):
        S.pair_rows([_ep("e", 1), _ep("e", 1)], [_ep("e", 1)])


def test_rollout_task_seeds_ignore_the_condition():
    # The evaluate stage builds tasks with pipeline.session.rollout: same task -> same seed and id.
    from pipeline.session.rollout import tasks_from_manifest

    manifest = [{"scene_id": "s0", "quest_id": q, "split": "eval", "objective": "Put Apple_0 in Fridge_0",
                 "game_file": f"data/games/s0/{q}.z8", "expert_plan": ["open fridge_0"], "preferences": []}
                for q in ("q0", "q1")]
    c1 = tasks_from_manifest(manifest, split="eval", master_seed=3, condition="C1")
    c2 = tasks_from_manifest(manifest, split="eval", master_seed=3, condition="C2")
    pairs, only_a, only_b = S.pair_rows([vars(t) for t in c2], [vars(t) for t in c1])
    assert len(pairs) == 2 and not only_a and not only_b
    assert [p[0]["episode_id"] for p in pairs] == ["ep_eval_s0_q0_0", "ep_eval_s0_q1_0"]


def test_verdict_needs_the_holm_adjusted_exact_test():
    from pipeline.core.stats import verdict

    assert verdict(0.5, 0, 4, 0.05) == "no detectable difference"  # b=0, c=4 of 9: p=0.125, Holm x4 = 0.5
    assert verdict(1.0, 1, 0, 0.05) == "no detectable difference"  # one discordant pair
    assert verdict(0.004, 0, 10, 0.05) == "worse" and verdict(0.004, 10, 0, 0.05) == "better"
    assert verdict(None, 3, 0, 0.05) == "no detectable difference"


def test_exact_mcnemar_power_and_minimum_detectable_effect():
    from pipeline.core.stats import mcnemar_mde, mcnemar_power

    # The figures: 9 pairs have under 3% power for a 25-point effect at 30% discordance.
    assert mcnemar_power(9, 0.275, 0.025, 0.05) < 0.03
    assert 0.78 < mcnemar_power(40, 0.275, 0.025, 0.05) < 0.9
    assert mcnemar_power(0, 0.3, 0.1, 0.05) == 0.0 and mcnemar_power(50, 0.1, 0.1, 0.05) < 0.05
    mdes = [mcnemar_mde(n, 0.05 / 3) for n in (38, 112, 200)]
    assert mdes == sorted(mdes, reverse=True) and mcnemar_mde(9, 0.05 / 3) is None
    assert 0.13 <= mdes[-1] <= 0.15  # ~200 pairs for a 15-point effect under Holm over 3


def test_cluster_bootstrap_is_wider_when_scenes_disagree():
    from pipeline.core.stats import cluster_bootstrap_diff, paired_bootstrap_diff

    t = [1] * 10 + [0] * 10
    c = [0] * 10 + [0] * 10
    scenes = ["a"] * 10 + ["b"] * 10  # the whole effect sits in one scene
    pairs = paired_bootstrap_diff(t, c, n_resamples=2000, level=0.95, rng=np.random.default_rng(0))
    clus = cluster_bootstrap_diff(t, c, scenes, n_resamples=2000, level=0.95, rng=np.random.default_rng(0))
    assert clus.value == pairs.value == 0.5
    assert clus.ci_high - clus.ci_low > pairs.ci_high - pairs.ci_low


def test_gee_check_answers_or_says_why_not():
    from pipeline.core.stats import gee_check

    assert gee_check([True] * 4, [True] * 4, ["a", "a", "b", "b"])["reason"] == "every outcome is the same"
    assert gee_check([True, False], [False, False], ["a", "a"])["estimable"] is False
    # Identical pairs: a coefficient of 0 with a robust variance of 0, whose p-value would be
    # rounding noise (it differed between two runs of the same bytes) - said, not reported.
    same = [True, False, False, True, False, False, True, False, False, False, True, False] * 3
    assert gee_check(same, same, list("abcdefghijkl") * 3) == {
        "estimable": False, "reason": "no discordant pair: the same outcome in every pair", "clusters": 12}
    # One arm fails (or succeeds) everywhere: no finite log-odds, said from the outcomes. The
    # solver's drift once stopped at +23.16 (p < 0.001) under NumPy's AVX2 code and overflowed
    # under its AVX-512 code: ScienceWorld's smallest report differed between CPUs.
    assert gee_check([1, 1, 0, 0, 0], [0, 0, 0, 0, 0], list("abcde")) == {
        "estimable": False, "reason": "no finite estimate (separation: the control fails in every task)",
        "clusters": 5}
    assert gee_check([1, 1, 1, 1], [1, 0, 1, 1], list("abab"))["reason"] == (
        "no finite estimate (separation: the treatment succeeds in every task)")
    g = gee_check([1, 0, 1, 1, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0, 1, 0], list("aabbccdd"))
    assert g["estimable"] and g["log_odds"] > 0 and 0 <= g["p_value"] <= 1 and g["clusters"] == 4
