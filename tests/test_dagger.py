"""Learning from its own mistakes (``pipeline.policy.dagger``): the policy plays generated houses,
the knowledge-limited expert labels every state it reaches, the model trains on the labels; and
the whole-episode probe on held-out houses; the same episodes played in worker processes
(``pipeline.policy.dagger.play_rollouts``).

Real code on the session's tiny games and a tiny untrained model (it plays badly, which is the
point: its states are not the expert's).
"""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.conftest import SHORT_TURN_TOKENS, train_config
from tests.test_policy import TINY_POLICY


@pytest.fixture(scope="module")
def cfg(tiny_cfg):
    return train_config(tiny_cfg, {"agent": {"name": "llm", "batch_size": 3},
                                   "policy": {**TINY_POLICY, "evaluate": False},
                                   "sampling": {"max_new_tokens": SHORT_TURN_TOKENS}})


@pytest.fixture(scope="module")
def memory(cfg, tiny_games):
    from pipeline.policy.demos import build_scene_memory

    return build_scene_memory(cfg, tiny_games.root, tiny_games.rows, tiny_games.scenes)


@pytest.fixture(scope="module")
def tiny_model(cfg, tiny_games, memory):
    """A tiny untrained model whose tokenizer knows the houses' words."""
    import torch

    from pipeline.policy.dagger import dagger_tasks
    from pipeline.policy.model import build_model, train_tokenizer

    torch.set_num_threads(1)
    tasks = dagger_tasks(cfg, tiny_games.rows, tiny_games.scenes, memory, 0, 4)
    tok = train_tokenizer([t.prompt for t in tasks] + ['{"action": "go_to", "target": "north"}'], vocab_size=400)
    return build_model(tok, OmegaConf.create(TINY_POLICY), seed=0), tok


# Episodes of at most 6 steps (an untrained or barely trained model plays every rollout and probe episode to
# the cap: the cap is what these tests pay for), and for the build_policy tests one demonstration per train quest.
CAP = {"env": {"max_steps": 6}}
SHORT = {**CAP, "policy": {"demos_per_quest": 1}}


def capped(cfg):
    """``cfg`` with episodes of at most :data:`CAP`'s steps."""
    return OmegaConf.merge(cfg, CAP)


@pytest.fixture(scope="module")
def demo_set(cfg, tiny_games, tmp_path_factory):
    """The demonstrations of :data:`SHORT`, written and read back as the stage does: what the
    build_policy tests train on (a DAgger recipe changes none of them)."""
    from pipeline.policy.demoset import build_demo_set, load_demo_set, write_demo_set

    one = OmegaConf.merge(cfg, SHORT)
    out = tmp_path_factory.mktemp("dagger") / "demos"
    write_demo_set(build_demo_set(one, tiny_games.root, tiny_games.rows, tiny_games.scenes), out)
    return load_demo_set(out, tie_seed=int(one.seed))


class Recording:
    """The backend, recording every conversation it is asked to answer."""

    def __init__(self, backend):
        self.backend = backend
        self.seen: list[list[dict]] = []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate(self, messages, **kw):
        self.seen += messages
        return self.backend.generate(messages, **kw)


def test_dagger_houses_are_their_own_stream_and_never_an_eval_layout(cfg, tiny_games, memory):
    """A round's houses are not the demonstrations', the probe's or another round's, and no
    eval scene's layout or eval objective; each task's prompt variant is one of the house's."""
    from pipeline.envs.household.generate import layout_key
    from pipeline.policy.dagger import dagger_houses, dagger_tasks
    from pipeline.policy.demos import training_houses

    rows, scenes = tiny_games.rows, tiny_games.scenes
    r0 = dagger_houses(cfg, rows, scenes, 0, 6)
    r1 = dagger_houses(cfg, rows, scenes, 1, 6)
    layouts = lambda hs: {layout_key(h.spec) for h in hs}  # noqa: E731
    demo = training_houses(cfg, rows, scenes).houses(6)
    held = training_houses(cfg, rows, scenes, heldout=True).houses(6)
    assert len(layouts(r0)) == 6
    assert not layouts(r0) & layouts(r1) and not layouts(r0) & layouts(demo) and not layouts(r0) & layouts(held)
    eval_scenes = {r["scene_id"] for r in rows if r["split"] != "train"}
    assert not layouts(r0) & {layout_key(scenes[s]) for s in eval_scenes}
    eval_objectives = {r["objective"] for r in rows if r["split"] != "train"}
    tasks = dagger_tasks(cfg, rows, scenes, memory, 0, 6)
    assert [t.house.scene_id for t in tasks] == [h.scene_id for h in r0]
    assert all(t.row["objective"] not in eval_objectives for t in tasks)
    assert all(t.task_id.startswith("dagger_00_") for t in tasks)
    assert len({t.kind for t in tasks}) > 1  # the variants are taken in turn


def test_the_expert_labels_every_state_the_model_reached_with_the_models_own_prompt(cfg, tiny_games, memory,
                                                                                   tiny_model):
    """Every turn the model played has one label; its messages are exactly what the model was
    given that turn (its own memory and history); its answer is an admissible action of that
    state, the expert's; the labels are a pure function of the model and the config."""
    from pipeline.agents.llm import parse_action
    from pipeline.prompts import extract_json_object
    from pipeline.policy.dagger import dagger_tasks, model_backend, play_houses, rollout_config
    from pipeline.policy.demos import DemoKind, demo_kind, house_env, training_unit

    model, tok = tiny_model
    rcfg = rollout_config(capped(cfg))
    tasks = dagger_tasks(cfg, tiny_games.rows, tiny_games.scenes, memory, 0, 4)
    backend = Recording(model_backend(rcfg, model, tok))
    rolls = play_houses(rcfg, backend, tasks, label=True)
    labels = [t for r in rolls for t in r.labels]
    assert [len(r.labels) for r in rolls] == [r.turns for r in rolls] and all(r.turns > 0 for r in rolls)
    assert sorted(json.dumps(t.messages) for t in labels) == sorted(json.dumps(m) for m in backend.seen)
    assert any(r.agreed < r.turns for r in rolls)  # an untrained model leaves the expert's path
    for r in rolls:
        assert [t.turn_index for t in r.labels] == list(range(r.turns))
        assert {demo_kind(t.demo_id) for t in r.labels} == {DemoKind.dagger}
        assert {training_unit(t.demo_id) for t in r.labels} == {r.task.task_id}  # one unit per episode
    env = house_env(cfg, rolls[0].task.house)  # the first state's label is an admissible action there
    first = env.reset()
    env.close()
    action, parsed, error = parse_action(json.dumps(extract_json_object(rolls[0].labels[0].response)), first)
    assert error is None and action is not None and parsed is not None
    again = play_houses(rcfg, model_backend(rcfg, model, tok), tasks, label=True)
    assert [[(t.response, t.messages) for t in r.labels] for r in again] == \
        [[(t.response, t.messages) for t in r.labels] for r in rolls]


def test_episode_probe_plays_plain_grounded_and_oracle_prompts_of_held_out_houses(cfg, tiny_games, memory,
                                                                                  tiny_model):
    """Three prompts per held-out house (grounded only where the house has grounding): the
    oracle's states the verified plan, the plain one nothing; the probe's houses are the
    first-turn probe's; the score is greedy, so the same model scores the same."""
    from pipeline.policy.dagger import EpisodeProbe
    from pipeline.policy.demos import training_houses

    model, tok = tiny_model
    probe = EpisodeProbe.build(capped(cfg), tiny_games.rows, tiny_games.scenes, memory, n=3)
    kinds = {}
    for t in probe.tasks:
        kinds.setdefault(t.house.scene_id, []).append(t.kind)
    assert len(kinds) == 3 and all(k[0] == "plain" and k[-1] == "oracle" for k in kinds.values())
    held = training_houses(cfg, tiny_games.rows, tiny_games.scenes, heldout=True).houses(3)
    assert list(kinds) == [h.scene_id for h in held]  # the first-turn probe's houses and quests
    assert [t.row["objective"] for t in probe.tasks if t.kind == "plain"] == [h.row(0)["objective"] for h in held]
    for t in probe.tasks:
        assert t.variant.bare == (t.kind == "plain")
        assert ("solve this exact task" in t.prompt) == (t.kind == "oracle")
        if t.kind == "grounded":
            assert t.variant.grounding and t.variant.grounding in t.prompt and not t.variant.block
    score = probe.score(model, tok)
    assert score["houses"] == 3 and score["plain_episodes"] == 3 and score["oracle_episodes"] == 3
    assert all(0.0 <= score[f"{k}_success"] <= 1.0 for k in ("plain", "oracle"))
    assert probe.score(model, tok) == score


def _rollout_record(rolls) -> list:
    """Everything a rollout carries that a caller reads, in order."""
    return [(r.task.task_id, r.task.kind, r.won, r.success, r.turns, r.agreed,
             [(t.demo_id, t.turn_index, t.variant, json.dumps(t.messages), t.response, t.train) for t in r.labels])
            for r in rolls]


def test_rollouts_in_one_or_two_worker_processes_are_play_houses_own(cfg, tiny_games, memory, tiny_model):
    """``pipeline.policy.dagger.play_rollouts``: the batches of ``agent.batch_size`` are the partition,
    so one worker and two give the same rollouts, the expert's labels included, and both equal
    ``play_houses`` run single-threaded; the caller's thread count and the model's mode are kept."""
    import torch

    from pipeline.core.parallel import partition
    from pipeline.policy.dagger import dagger_tasks, model_backend, play_houses, play_rollouts, rollout_config, \
        rollout_pool

    model, tok = tiny_model
    rcfg = rollout_config(capped(cfg))
    tasks = dagger_tasks(cfg, tiny_games.rows, tiny_games.scenes, memory, 0, 4)
    assert [len(b) for b in partition(tasks, rcfg.agent.batch_size)] == [3, 1]  # the last batch is partial

    torch.set_num_threads(1)
    reference = _rollout_record(play_houses(rcfg, model_backend(rcfg, model, tok), tasks, label=True))
    assert sum(len(r[-1]) for r in reference) > len(tasks)  # labelled, several turns an episode

    model.train()
    seen: list[int] = []
    with rollout_pool(rcfg, workers=1) as pool:
        one = _rollout_record(play_rollouts(pool, model, tok, tasks, label=True, progress=seen.append))
    assert model.training  # left as it came
    assert seen == [3, 1]
    torch.set_num_threads(2)  # the caller's threads do not reach a job
    try:
        with rollout_pool(rcfg, workers=2) as pool:
            two = _rollout_record(play_rollouts(pool, model, tok, tasks, label=True))
            assert play_rollouts(pool, model, tok, tasks[:2], label=False)[1].task.task_id == tasks[1].task_id
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert one == reference
    assert two == reference


def test_build_policy_runs_dagger_rounds_and_keeps_what_it_trained_on(cfg, tiny_games, demo_set, tmp_path):
    """With ``dagger_rounds`` the stage's core trains on, after the demonstrations: the loss curve
    goes on, demos.parquet holds the labelled turns, training.json each round's figures."""
    import pyarrow.parquet as pq
    import torch

    from pipeline.core.parallel import OrderedPool
    from pipeline.policy.dagger import EpisodeProbe, rollout_config, rollout_pool
    from pipeline.policy.training import build_policy

    class Counted(OrderedPool):  # the stage passes its rollout pool here: every episode goes through it
        calls: list = []

        def map(self, fn, jobs, *, progress=None):
            jobs = list(jobs)  # a play's batches: (model, tokenizer, tasks, label)
            self.calls.append((jobs[0][3], sum(len(j[2]) for j in jobs)))
            return super().map(fn, jobs, progress=progress)

    torch.set_num_threads(1)
    small = OmegaConf.merge(cfg, SHORT, {"policy": {"dagger_rounds": 2, "dagger_houses": 3, "dagger_replay": 1.0}})
    probe = EpisodeProbe.build(small, tiny_games.rows, tiny_games.scenes, demo_set.memory, n=2)
    base = rollout_pool(rollout_config(small))
    players = Counted(1, context=base.context, numerics=base.numerics, threads=base.threads)
    built = build_policy(small, demo_set, tmp_path / "policy", episode_probe=probe,
                         games=(tiny_games.rows, tiny_games.scenes), pool=players)
    n_probe = len(probe.tasks)  # the probe after the demonstrations, then each round's rollouts and probe
    assert players.calls == [(False, n_probe), (True, 3), (False, n_probe), (True, 3), (False, n_probe)]
    s = json.loads((tmp_path / "policy" / "training.json").read_text())
    rounds = s["dagger"]["rounds"]
    assert [r["round"] for r in rounds] == [0, 1]
    assert rounds[0]["units"] == 3 and rounds[1]["units"] == 6  # every round's labels so far
    assert all(r["replayed_units"] == min(r["units"], s["training"]["episodes"]) for r in rounds)
    assert s["dagger"]["steps"] == sum(r["steps"] for r in rounds) > 0
    curve = built["curve"]
    assert [c["step"] for c in curve] == list(range(len(curve)))
    assert s["episode_probe"]["after_demonstrations"]["houses"] == 2
    assert s["episode_probe"] == {**rounds[-1]["episode_probe"], "after_demonstrations":
                                  s["episode_probe"]["after_demonstrations"]}
    ids = pq.read_table(tmp_path / "policy" / "demos.parquet").column("demo_id").to_pylist()
    assert sum(i.startswith("dagger_") for i in ids) == s["dagger"]["labelled_turns"] > 0
    with pytest.raises(ValueError, match="games"):
        build_policy(small, demo_set, tmp_path / "again")


def test_an_interrupted_policy_run_resumes_after_its_last_phase_and_writes_the_same_bytes(cfg, tiny_games, demo_set,
                                                                                           tmp_path):
    """``build_policy`` with ``checkpoints``: stopped in DAgger round 0 it resumes after the
    demonstrations' training (none of it trained again); stopped in round 1 it resumes after
    round 0; either way the model, demos.parquet and training.json are an uninterrupted run's
    bytes, and the phases are removed at the end. The key changes with the recipe, not with
    ``workers``. Torch's deterministic algorithms and one training thread, as the stage pins
    them (``numerics``): without them two uninterrupted runs already differ in the last bits
    (the embedding's multi-threaded backward). The same after a kill -9 of the stage's process:
    tests/test_model_pipeline.py."""
    import torch

    from pipeline.policy.resume import TRAINED, PhaseCheckpoints, checkpoint_dir, round_phase
    from pipeline.policy.training import build_policy

    class Stop(Exception):
        pass

    def stop_at(what: str):
        def progress(seen: str, done: int, total: int) -> None:
            if seen == what:
                raise Stop(seen)
        return progress

    torch.set_num_threads(1)
    small = OmegaConf.merge(cfg, SHORT, {"policy": {"threads": 1, "dagger_rounds": 2, "dagger_houses": 2,
                                                    "dagger_replay": 1.0}})
    games = (tiny_games.rows, tiny_games.scenes)
    ckpt = tmp_path / "ckpt"
    phases = [TRAINED, round_phase(0), round_phase(1)]
    trained_steps: list[int] = []
    torch.use_deterministic_algorithms(True)
    try:
        reference = build_policy(small, demo_set, tmp_path / "whole", games=games)
        with pytest.raises(Stop):
            build_policy(small, demo_set, tmp_path / "resumed", games=games, checkpoints=ckpt,
                         dagger_progress=stop_at("dagger round 0: episodes"))
        assert PhaseCheckpoints(ckpt).latest(phases) == TRAINED
        with pytest.raises(Stop):
            build_policy(small, demo_set, tmp_path / "resumed", games=games, checkpoints=ckpt,
                         train_progress=trained_steps.append,
                         dagger_progress=stop_at("dagger round 1: training"))
        assert PhaseCheckpoints(ckpt).latest(phases) == round_phase(0)
        resumed = build_policy(small, demo_set, tmp_path / "resumed", games=games, checkpoints=ckpt)
    finally:
        torch.use_deterministic_algorithms(False)
    assert reference["resumed"] is None
    assert trained_steps == []  # the demonstrations' training was not done again
    assert resumed["resumed"] == round_phase(0)
    assert not ckpt.exists()
    assert resumed["curve"] == reference["curve"]
    whole = sorted(p.relative_to(tmp_path / "whole") for p in (tmp_path / "whole").rglob("*") if p.is_file())
    assert whole == sorted(p.relative_to(tmp_path / "resumed") for p in (tmp_path / "resumed").rglob("*")
                           if p.is_file())
    assert any(p.suffix == ".safetensors" for p in whole)
    for rel in whole:
        assert (tmp_path / "resumed" / rel).read_bytes() == (tmp_path / "whole" / rel).read_bytes(), rel

    root = tiny_games.root
    key = checkpoint_dir(small, root)
    assert checkpoint_dir(OmegaConf.merge(small, {"workers": 7}), root) == key
    assert checkpoint_dir(OmegaConf.merge(small, {"policy": {"lr": 0.5}}), root) != key
