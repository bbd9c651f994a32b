"""The default policy (stage ``policy``): expert, demonstrations, tokenizer, training, reload.

Runs the real code on the session's tiny games: a rule agent's train episodes give the
grounding and advisories, the knowledge-limited expert plays demonstrations rendered by
the ``llm`` agent's own prompt code, and a tiny model trained for a few dozen steps on
one quest's demonstrations is saved, reloaded with ``AutoModelForCausalLM`` /
``AutoTokenizer`` and plays that quest with parseable actions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import train_config

TINY_POLICY = {
    "rule_agent": "react", "rule_epsilon": 0.6, "demos_per_quest": 8, "slip_prob": 0.2, "explore_cap": 12,
    "vocab_size": 400, "hidden_size": 48, "intermediate_size": 96, "n_layer": 2, "n_head": 2, "max_positions": 1024,
    "epochs": 1, "episodes_per_batch": 2, "lr": 0.005, "warmup_steps": 3, "weight_decay": 0.0,
    "evaluate": True, "generated_houses": 0, "generated_drills": 0,
    "dagger_rounds": 0, "episode_probe_houses": 0,  # tests/test_dagger.py turns them on
}


@pytest.fixture(scope="module")
def cfg(tiny_cfg):
    """The tiny config with the llm agent, the policy model group and a tiny policy."""
    return train_config(tiny_cfg, {"agent": {"name": "llm", "batch_size": 4}, "policy": TINY_POLICY})


@pytest.fixture(scope="module")
def memory(cfg, tiny_games):
    from pipeline.policy.demos import build_scene_memory

    return build_scene_memory(cfg, tiny_games.root, tiny_games.rows, tiny_games.scenes)


@pytest.fixture(scope="module")
def demos(cfg, tiny_games, memory):
    from pipeline.policy.demos import play_demos, render_demos

    demos = play_demos(cfg, tiny_games.root, tiny_games.rows, tiny_games.scenes, memory)
    return demos, render_demos(cfg, demos)


@pytest.fixture(scope="module")
def three(cfg, tiny_games):
    """Three demonstrations per train quest and a 2-task in-context probe: the config and its demonstration
    set, as the demos stage builds them (the stage's core and the scaling study train on it)."""
    from pipeline.policy.demoset import build_demo_set

    small = OmegaConf.merge(cfg, {"policy": {"demos_per_quest": 3, "incontext_tasks": 2}})
    return small, build_demo_set(small, tiny_games.root, tiny_games.rows, tiny_games.scenes)


def _train_row(tiny_games):
    return sorted((r for r in tiny_games.rows if r["split"] == "train"), key=lambda r: r["quest_id"])[0]


# --------------------------------------------------------------------------- expert


def test_knowledge_counts_only_true_statements_and_known_preferences(tiny_games):
    from pipeline.envs.household.env import HouseholdEnv
    from pipeline.policy.expert import read_knowledge

    row = _train_row(tiny_games)
    prefs = tiny_games.scenes[row["scene_id"]]["preferences"]
    with HouseholdEnv(tiny_games.game_path(row), objective=row["objective"], preferences=prefs) as env:
        env.reset()
        w = env.world
        obj = sorted(w.location)[0]
        room = w.room_of(obj)
        wrong = next(r for r in w.rooms() if r != room)
        text = f"- {obj} is in the {wrong}.\n- Nothing_9 is in the {room}.\n"
        assert read_knowledge(text, w, prefs).located == frozenset()
        truth = read_knowledge(f"{obj} is in the {room}.\n" + "\n".join(p["text"] for p in prefs), w, prefs)
        assert obj in truth.located
        assert [p["id"] for p in truth.preferences] == [p["id"] for p in prefs]


def test_knowledge_from_scene_facts_and_a_verified_plan(tiny_games):
    """A memory advisory's scene fact ("X was in H in the Room") and the commands of a verified
    plan (the oracle's advisories) locate what they name, when true in this scene."""
    from pipeline.envs.household.env import HouseholdEnv
    from pipeline.policy.expert import read_knowledge

    row = _train_row(tiny_games)
    prefs = tiny_games.scenes[row["scene_id"]]["preferences"]
    with HouseholdEnv(tiny_games.game_path(row), objective=row["objective"], preferences=prefs) as env:
        env.reset()
        w = env.world
        obj, (rel, holder) = next((o, v) for o, v in sorted(w.location.items()) if v[0] in ("in", "on"))
        fact = f"Facts of that case's scene: {obj} was {rel} {holder} in the {w.room_of(obj)}."
        assert {obj, holder} <= read_knowledge(fact, w, prefs).located
        plan = f"Verified steps 1-1 of 1 that solve this exact task: take {obj} from {holder}."
        assert {obj, holder} <= read_knowledge(plan, w, prefs).located
        # The same command outside a verified plan, or naming what this scene lacks, tells nothing.
        assert read_knowledge(f"take {obj} from {holder}.", w, prefs).located == frozenset()
        assert read_knowledge(plan.replace(obj, "Nothing_9").replace(holder, "Nowhere_9"), w, prefs).located == frozenset()


def test_verified_plan_is_read_back_and_followed_as_written(cfg, tiny_games, memory):
    """The oracle's advisories read back into the plan they split (missing or out-of-order
    parts read as none); the expert follows a true verified plan step by step, preference
    steps included, and ignores one that names another house's things."""
    from pipeline.envs.household.generate import GeneratedHouses, HouseSizes
    from pipeline.conditions.oracle import oracle_advisories, read_verified_steps
    from pipeline.policy.demos import house_env
    from pipeline.policy.expert import expert_episode, read_knowledge

    plan = ["go west", "take Key_2", "unlock Cabinet_2 with Key_2", "open Cabinet_2", "take Cup_3 from Cabinet_2",
            "close Cabinet_2", "lock Cabinet_2 with Key_2"]
    text = "\n".join(f"  message: {a.message}" for a in oracle_advisories(plan, 3, 800, "s/q"))
    assert read_verified_steps(text) == plan
    assert read_verified_steps(text.split("\n", 1)[1]) == []  # steps 1-3 missing
    assert read_verified_steps("take Cup_3 from Cabinet_2.") == []

    house = next(h for h in GeneratedHouses(HouseSizes(), seed=5, base=cfg.env).houses(40)
                 if any(c.startswith(("close ", "lock ")) for c in h.quests[0]["plan"]))
    row = house.row(0)
    block = "\n".join(a.message for a in oracle_advisories(row["expert_plan"], 2, 800, "g/q00"))
    with house_env(cfg, house) as env:
        env.reset()
        know = read_knowledge(block, env.world, [])  # no preference sentence: only the plan keeps them
        assert know.verified_plan == tuple(row["expert_plan"])
        episode = expert_episode(env, know)
    assert [t.response.partition("\n")[0] for t in episode.turns] == [f"Plan: {c}." for c in row["expert_plan"]]
    assert episode.won and episode.preferences_ok
    with house_env(cfg, house) as env:
        env.reset()
        other = "\n".join(a.message for a in oracle_advisories(plan, 2, 800, "s/q"))
        assert read_knowledge(other, env.world, []).verified_plan == ()


def test_demos_and_the_renderer_assemble_prompts_with_the_one_function(cfg, monkeypatch):
    """The policy's demonstrations (``freeze_prompt``) and the render stage's ``Renderer``
    both assemble a task's prompt with :func:`pipeline.prompts.task_prompt`: what it
    returns is what each gives, from the inputs each passes it."""
    from pipeline import prompts
    from pipeline.conditions import Renderer
    from pipeline.memory import EpisodicStore
    from pipeline.policy.demos import freeze_prompt

    calls = []

    def assembly(organizer, objective, scene_id, grounding, block=""):
        calls.append((objective, scene_id, grounding, block))
        return prompts.FrozenPrompt(f"prompt {len(calls)}", block)

    monkeypatch.setattr(prompts, "task_prompt", assembly)
    org = prompts.PromptOrganizer.from_config(cfg)
    objective, grounding = "Put Apple_2 in Fridge_0", "- The fridge is in the kitchen."
    assert freeze_prompt(org, objective, "s0", grounding, "BLOCK") == "prompt 1"
    assert freeze_prompt(org, objective, "s0", None, "BLOCK") == "prompt 2"
    assert freeze_prompt(org, objective, "s0", None, "") == "prompt 3"
    r = Renderer(cfg, EpisodicStore.from_entries([], tie_seed=0), Path(__file__).resolve().parents[1])
    assert r.prompt({"objective": objective, "scene_id": "s0"}, "BLOCK", []).text == "prompt 4"
    empty = org.empty_grounding_text
    assert calls == [(objective, "s0", grounding, "BLOCK"), (objective, "s0", empty, "BLOCK"),
                     (objective, "s0", None, ""), (objective, "s0", empty, "BLOCK")]


def test_demo_prompts_are_the_text_they_were(cfg):
    """A demonstration's prompt for fixed inputs is byte for byte the text it was before the
    one assembly: the mutate-and-read organizer's (set_variables + set_memory_block +
    freeze_system_prompt), a fixed hash for one case, and the shared organizer keeps no
    task's state."""
    import hashlib

    from pipeline.policy.demos import freeze_prompt
    from pipeline.prompts import PromptOrganizer

    org = PromptOrganizer.from_config(cfg)
    block = json.dumps({"DEBATE_CONTEXT__MEMORY": {"retrieved": [{"message": "Open $it first."}]}})
    for grounding in (None, "- The fridge is in the kitchen ($5).", ""):
        for blk in ("", block):
            old = PromptOrganizer.from_config(cfg)
            old.set_variables(objective="Put Apple_2 in Fridge_0", scene="s0")
            old.set_memory_block(blk)
            content = grounding if grounding is not None else old.empty_grounding_text
            expected = (old.freeze_system_prompt() if grounding is None and not blk
                        else old.freeze_system_prompt(None, grounding_content=content))
            assert freeze_prompt(org, "Put Apple_2 in Fridge_0", "s0", grounding, blk) == expected
    assert org.variables == {} and org.memory_slot == ""
    text = freeze_prompt(org, "Put Apple_2 in Fridge_0", "s0", "- The fridge is in the kitchen ($5).", block)
    assert hashlib.sha256(text.encode()).hexdigest() == GOLDEN_PROMPT_SHA256, text


#: sha256 of the tiny config's demonstration prompt in :func:`test_demo_prompts_are_the_text_they_were`
#: (a change of conf/templates/ or of the assembly changes it: then every demo prompt changed too).
GOLDEN_PROMPT_SHA256 = "6ee2e370debf50258ac1af9116fb33ccc78a4a7b3409aa1a796507b9db15e0a3"


def test_expert_demos_win_and_cover_the_prompt_variants(demos, memory):
    demos, turns = demos
    assert demos and all(d.episode.won for d in demos if not d.mapping), "clean expert demos must win"
    variants = {d.variant.name for d in demos}
    assert "plain" in variants and any(v.startswith("grounded") for v in variants)
    assert any(d.variant.block for d in demos), "some demos carry an advisory block"
    # Every answer is one reasoning line then a JSON action the agent parses.
    from pipeline.prompts import extract_json_object

    for t in turns:
        line, _, js = t.response.partition("\n")
        obj = json.loads(js)
        assert line and obj["action"] and set(obj["memory"]) == {"plan", "notes"}
        assert extract_json_object(t.response) == obj


def test_renamed_demos_rename_prompts_and_answers_consistently(demos, tiny_games):
    demos, turns = demos
    renamed = [d for d in demos if d.mapping]
    assert renamed
    d = renamed[0]
    text = "\n".join(t.messages[0]["content"] + t.response for t in turns if t.demo_id == d.demo_id)
    objects = [o["name"] for o in tiny_games.scenes[d.task["scene_id"]]["objects"]]
    for old, new in d.mapping.items():
        if old in objects and old not in d.mapping.values():  # a name another one was renamed to may appear
            assert new in text and f"{old}," not in text and f"{old}." not in text


def test_plan_drills_are_first_turns_copying_a_new_verified_plan(cfg, tiny_games, memory):
    """Each drill is the first turn under the oracle variant in a newly renamed house: the
    expert takes the plan's first step and writes the rest into its memory; a quest's
    drills are one training unit."""
    import re

    from pipeline.policy.demos import DemoKind, demo_kind, play_demos, render_demos, training_unit

    drilled = OmegaConf.merge(cfg, {"policy": {"plan_drills": 3, "demos_per_quest": 1}})
    demos = play_demos(drilled, tiny_games.root, tiny_games.rows, tiny_games.scenes, memory)
    assert all(demo_kind(d.demo_id) == d.kind and d.demo_id.startswith(d.kind.prefix) for d in demos)
    assert {d.kind for d in demos} == {DemoKind.quest, DemoKind.drill}
    drills = [d for d in demos if d.kind.is_drill]
    n_train = sum(r["split"] == "train" for r in tiny_games.rows)
    assert len(drills) == 3 * n_train and len(demos) == 4 * n_train
    assert all(len(d.episode.turns) == 1 and d.mapping and d.variant.source == "C2_oracle" for d in drills)
    assert len({tuple(sorted(d.mapping.items())) for d in drills}) > 1  # a new house each time
    turns = render_demos(drilled, drills)
    for t in turns:
        steps = [s.strip() for part in re.findall(r"that solve this exact task: (.*?)\.\n", t.messages[0]["content"])
                 for s in part.split(";")]
        answer = json.loads(t.response.partition("\n")[2])
        assert steps and t.response.startswith(f"Plan: {steps[0]}.")
        assert answer["memory"]["plan"] == "; ".join(steps[1:])
    assert {training_unit(d.demo_id) for d in drills} == {f"drill_{r['scene_id']}_{r['quest_id']}"
                                                         for r in tiny_games.rows if r["split"] == "train"}
    assert training_unit("demo_scene_00_q01_03") == "demo_scene_00_q01_03"


def test_demo_kind_reads_each_kind_back_from_its_id():
    """Every kind's id reads back as that kind (a house drill's prefix starts with a drill's);
    an id of no kind is refused."""
    from pipeline.policy.demos import DemoKind, demo_kind

    ids = {"demo_scene_00_q01_03": DemoKind.quest, "drill_scene_00_q01_02": DemoKind.drill,
           "gen_gen_00004": DemoKind.house, "drill_gen_00001_07": DemoKind.house_drill,
           "dagger_00_gen_00007": DemoKind.dagger}
    assert {i: demo_kind(i) for i in ids} == ids
    assert {k.prefix for k in DemoKind} == {"demo_", "drill_", "gen_", "drill_gen_", "dagger_"}
    with pytest.raises(ValueError, match="ep_train_s0_q1_0"):
        demo_kind("ep_train_s0_q1_0")


def test_generated_house_demos_and_drills_read_only_their_own_house(cfg, tiny_games, memory):
    """Demonstrations in generated houses cycle through the prompt variants; a drill is the
    oracle's first turn in one more house; none is an eval layout or objective; eight
    drills make one training unit."""
    import re

    from pipeline.envs.household.generate import layout_key
    from pipeline.policy.demos import DemoKind, demo_kind, generated_demos, render_demos, training_houses, training_unit
    from pipeline.prompts import PromptOrganizer

    gen = OmegaConf.merge(cfg, {"policy": {"generated_houses": 8, "generated_drills": 9,
                                                     "generated_grounding": 0.0}})
    demos = generated_demos(gen, tiny_games.rows, tiny_games.scenes, memory, PromptOrganizer.from_config(gen))
    assert all(demo_kind(d.demo_id) == d.kind for d in demos)
    episodes = [d for d in demos if d.kind == DemoKind.house]
    drills = [d for d in demos if d.kind == DemoKind.house_drill]
    assert len(episodes) == 8 and len(drills) == 9
    # the prompt variants in turn (the tiny store's placebo block equals none or C2's: dropped as a duplicate)
    assert {"plain", "plain+C2", "plain+C2_oracle"} <= {d.variant.name for d in episodes}
    assert sum(d.episode.won for d in episodes) >= 6  # a big house can outlast the tiny world's 15 steps
    assert {training_unit(d.demo_id) for d in drills} == {"drill_gen_00000", "drill_gen_00001"}
    eval_rows = [r for r in tiny_games.rows if r["split"] == "eval"]
    assert not {d.task["objective"] for d in demos} & {r["objective"] for r in eval_rows}
    houses = training_houses(gen, tiny_games.rows, tiny_games.scenes).houses(17)
    assert not {layout_key(h.spec) for h in houses} & {layout_key(tiny_games.scenes[r["scene_id"]]) for r in eval_rows}
    for t in render_demos(gen, drills):
        steps = re.findall(r"that solve this exact task: ([^;.]*)", t.messages[0]["content"])
        assert t.response.startswith(f"Plan: {steps[0]}.")
    # The probe's houses are another stream: none is a training house.
    probe = training_houses(gen, tiny_games.rows, tiny_games.scenes, heldout=True).houses(17)
    assert not {layout_key(h.spec) for h in probe} & {layout_key(h.spec) for h in houses}


def test_generated_houses_carry_their_own_grounding(cfg, tiny_games, memory):
    """With ``generated_grounding=1`` a generated house with a second quest is grounded by
    what the simulated user taught the rule agent on that quest (the ground + merge
    library): deterministic, naming only the house's own entities, and in every prompt of
    the house's demonstration or drill; at 0 no generated prompt has a grounding section.
    The demonstrated quest does not depend on the second one being drawn."""
    import json
    import re

    from pipeline.policy.demos import (generated_demos, house_grounding, render_demos, rule_agent_config,
                                       training_houses)
    from pipeline.prompts import PromptOrganizer

    gen = OmegaConf.merge(cfg, {"policy": {"generated_houses": 6, "generated_drills": 6,
                                                     "generated_grounding": 1.0}})
    houses = training_houses(gen, tiny_games.rows, tiny_games.scenes, quests_per_house=2).houses(12)
    single = training_houses(gen, tiny_games.rows, tiny_games.scenes).houses(12)
    assert [h.row(0) for h in houses] == [h.row(0) for h in single]
    rule_cfg = rule_agent_config(gen)
    texts = {h.scene_id: house_grounding(rule_cfg, h, {**tiny_games.scenes, h.scene_id: h.spec}) for h in houses}
    assert sum(bool(t) for t in texts.values()) >= 4, texts
    again = {h.scene_id: house_grounding(rule_cfg, h, {**tiny_games.scenes, h.scene_id: h.spec}) for h in houses[:3]}
    assert again == {k: texts[k] for k in again}
    name = re.compile(r"\b[A-Z][A-Za-z]*_\d+\b")
    for h in houses:
        assert set(name.findall(texts[h.scene_id] or "")) <= set(name.findall(json.dumps(h.spec))), h.scene_id

    organizer = PromptOrganizer.from_config(gen)
    demos = generated_demos(gen, tiny_games.rows, tiny_games.scenes, memory, organizer)
    assert len(demos) == 12
    for d in demos:
        assert d.variant.grounding == texts[d.task["scene_id"]], d.demo_id
    scene_of = {d.demo_id: d.task["scene_id"] for d in demos}
    rendered = render_demos(gen, demos)
    assert any(texts[scene_of[t.demo_id]] for t in rendered)
    for t in rendered:
        text = texts[scene_of[t.demo_id]]
        assert text is None or text in t.messages[0]["content"], t.demo_id

    none = OmegaConf.merge(gen, {"policy": {"generated_grounding": 0.0}})
    assert all(d.variant.grounding is None for d in generated_demos(none, tiny_games.rows, tiny_games.scenes,
                                                                     memory, organizer))


def test_incontext_probe_scores_first_steps_of_held_out_houses(cfg, tiny_games, memory):
    """The probe asks for the first action of held-out generated houses with and without the
    oracle advisory; a model that has learned nothing scores the same under both."""
    import torch

    from pipeline.policy.incontext import InContextProbe
    from pipeline.policy.model import build_model, train_tokenizer

    torch.set_num_threads(1)
    probe = InContextProbe.build(cfg, tiny_games.rows, tiny_games.scenes, memory, n=4)
    assert [t.kind for t in probe.tasks] == ["oracle", "plain"] * 4
    for t in probe.tasks:
        assert t.answer in [a["command"] for a in t.admissible]
        assert ("that solve this exact task: " + t.answer in t.messages[0]["content"]) == (t.kind == "oracle")
        # the plan's remaining steps: what a right turn-0 answer keeps in its memory
        assert all(step in t.messages[0]["content"] for step in t.rest.split("; ")) or t.kind == "plain"
    tok = train_tokenizer([m["content"] for t in probe.tasks for m in t.messages], vocab_size=400)
    model = build_model(tok, OmegaConf.create(TINY_POLICY), seed=0)
    score = probe.score(model, tok)
    assert score["tasks"] == 4 and set(score) == {"oracle_first_step", "oracle_plan_copied", "plain_first_step",
                                                  "tasks"}
    assert all(0.0 <= score[k] <= 1.0 for k in ("oracle_first_step", "oracle_plan_copied", "plain_first_step"))
    assert probe.score(model, tok) == score  # greedy, no cache: the same model scores the same


def test_scene_grounding_is_what_the_ground_and_merge_stages_write(cfg, memory, tmp_path):
    """The demos' grounding text equals the merge stage's output for the same episodes."""
    from pipeline.grounding.episodes import ground, write_ground_outputs
    from pipeline.grounding.scenes import merge_groundings

    docs = ground(memory.episodes, memory.turns, generator="extractive", timestamp=str(cfg.grounding.timestamp))
    index = write_ground_outputs(docs, tmp_path / "grounding", "both")
    merged, _ = merge_groundings(index, "grounding", [], root=tmp_path)
    assert merged and {s: m.content.strip() for s, m in merged.items()} == memory.grounding
    assert any(memory.grounding.values()), "the rule agent's slips drew feedback"


def test_demo_prompts_are_the_agents_prompts(cfg, demos, tiny_games):
    """A plain demo turn's messages are what the llm agent itself sends for that observation."""
    from pipeline.agents.llm import LLMAgent
    from pipeline.policy.demos import NoBackend

    demos, turns = demos
    d = next(d for d in demos if d.variant.bare and not d.mapping)
    agent = LLMAgent(cfg, backend=NoBackend())
    agent.reset({"episode_id": "x", "objective": d.task["objective"], "system_prompt": None})
    first = next(t for t in turns if t.demo_id == d.demo_id and t.turn_index == 0)
    assert first.messages == agent.messages(d.episode.turns[0].obs)
    assert "Objective\n" + d.task["objective"] in first.messages[0]["content"]


# --------------------------------------------------------------------------- model


def test_tokenizer_keeps_names_composable_and_is_deterministic(demos):
    from pipeline.policy.model import train_tokenizer

    _, turns = demos
    texts = [m["content"] for t in turns for m in t.messages] + [t.response for t in turns]
    a, b = train_tokenizer(texts, vocab_size=400), train_tokenizer(texts, vocab_size=400)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    text = "Put Zebra_7 in Drawer_3."
    ids = a(text, add_special_tokens=False)["input_ids"]
    cuts = {len(a.decode(ids[:k])) for k in range(len(ids) + 1)}
    # Names never fuse with the phrase around them: kind and index start their own tokens.
    assert {4, 9, 11, 15, 21, 23} <= cuts, cuts
    assert a.decode(a("héllo {\"x\": 1}")["input_ids"]) == "héllo {\"x\": 1}"  # every byte encodes


def test_shared_prefix_loss_equals_full_prompt_loss():
    """Turns sharing a prompt prefix (one KV cache, repeated) give the loss and gradients
    of running every prompt in full."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.policy.model import Sample, answer_loss, collate, make_unit

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True))
    r = lambda n: torch.randint(3, 50, (n,)).tolist()  # noqa: E731
    head = r(9)
    samples = [Sample(head + r(4), r(3)), Sample(head + r(6), r(2)), Sample(head + r(1), r(5))]
    other = make_unit([Sample(r(7), r(2))])  # a second unit with a shorter prefix: left padding
    unit = make_unit(samples)
    assert unit.prefix == head and [len(p) for p, _ in unit.turns] == [4, 6, 1]
    shared = answer_loss(model, collate([unit, other], pad_id=0))
    shared.backward()
    g_shared = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    model.zero_grad()
    full = answer_loss(model, collate([make_unit([s]) for s in samples] + [other], pad_id=0))
    full.backward()
    assert torch.allclose(shared, full, atol=1e-5)
    assert torch.allclose(g_shared, model.model.layers[0].self_attn.q_proj.weight.grad, atol=1e-5)


def test_answer_sample_weights_the_memory_dict_and_nothing_else(demos):
    from pipeline.policy.model import IM_END, MEMORY_KEY, answer_sample, train_tokenizer

    _, turns = demos
    answers = [t.response for t in turns if t.train][:40]
    tok = train_tokenizer(answers, vocab_size=400)
    eos = tok.convert_tokens_to_ids(IM_END)
    shares = []
    for text in answers:
        plain = answer_sample(tok, [5, 6], text, eos)
        weighted = answer_sample(tok, [5, 6], text, eos, memory_weight=0.25)
        assert plain.weights is None and plain.answer_ids == weighted.answer_ids and plain.prompt_ids == [5, 6]
        assert len(weighted.weights) == len(weighted.answer_ids) and weighted.weights[-1] == 1.0  # EOS
        light = [i for i, w in zip(weighted.answer_ids, weighted.weights) if w == 0.25]
        heavy = [i for i, w in zip(weighted.answer_ids[:-1], weighted.weights) if w == 1.0]
        assert set(weighted.weights) <= {0.25, 1.0}
        shares.append(len(light) / len(weighted.weights))
        # the heavy tokens are the reasoning line and the command, the light ones the memory dict to the end
        # (a token that starts before the memory key is heavy, even where it merges the key in)
        head, tail = tok.decode(heavy), tok.decode(light)
        assert head + tail == text and tail.endswith("}}") and '"action"' in head and '"action"' not in tail
        assert len(head) >= text.rfind(MEMORY_KEY)
    assert sum(shares) / len(shares) > 0.3  # most of a memory dict is light


def test_answer_sample_weights_the_notes_apart_from_the_plan(demos):
    from pipeline.policy.model import IM_END, MEMORY_KEY, NOTES_KEY, answer_sample, train_tokenizer

    _, turns = demos
    answers = [t.response for t in turns if t.train][:40]
    tok = train_tokenizer(answers, vocab_size=400)
    eos = tok.convert_tokens_to_ids(IM_END)
    for text in answers:
        plain = answer_sample(tok, [5], text, eos)
        notes = answer_sample(tok, [5], text, eos, notes_weight=0.25)
        both = answer_sample(tok, [5], text, eos, memory_weight=0.5, notes_weight=0.25)
        assert notes.answer_ids == both.answer_ids == plain.answer_ids
        assert set(notes.weights) == {0.25, 1.0} and set(both.weights) == {0.125, 0.5, 1.0}
        assert notes.weights[-1] == both.weights[-1] == 1.0  # EOS
        ids = notes.answer_ids[:-1]
        # notes_weight alone: the plan weighs as the command does, the notes from their key to the end are light
        head = tok.decode([i for i, w in zip(ids, notes.weights) if w == 1.0])
        tail = tok.decode([i for i, w in zip(ids, notes.weights) if w == 0.25])
        assert head + tail == text and tail.endswith("}}") and '"plan"' in head and '"plan"' not in tail
        assert len(head) >= text.rfind(NOTES_KEY) > text.rfind(MEMORY_KEY)
        # both: the command, the plan at memory_weight, the notes at the product; each class contiguous, in order
        kinds = [{1.0: 0, 0.5: 1, 0.125: 2}[w] for w in both.weights[:-1]]
        assert kinds == sorted(kinds) and set(kinds) == {0, 1, 2}
        parts = [tok.decode([i for i, k in zip(ids, kinds) if k == c]) for c in (0, 1, 2)]
        assert "".join(parts) == text and '"action"' in parts[0] and '"action"' not in parts[1] + parts[2]
        assert len(parts[0]) >= text.rfind(MEMORY_KEY) and len(parts[0] + parts[1]) >= text.rfind(NOTES_KEY)
        assert '"plan"' not in parts[2] and parts[2].endswith("}}")


def test_the_weighted_answer_loss_is_the_weighted_mean_and_weights_of_one_change_nothing():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.policy.model import Sample, answer_loss, collate, make_unit

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True))
    r = lambda n: torch.randint(3, 50, (n,)).tolist()  # noqa: E731
    head = r(6)
    a, b, c = r(3), r(4), r(2)
    plain = [make_unit([Sample(head + r(2), a), Sample(head + r(3), b)]), make_unit([Sample(r(5), c)])]
    # per-token losses of the plain batch, for the hand-computed weighted mean
    batch = collate(plain, pad_id=0)
    assert "target_weights" not in batch
    with torch.no_grad():
        mean = answer_loss(model, batch)
        w = torch.tensor([0.5, 0.5, 1.0] + [1.0, 0.1, 0.1, 1.0] + [1.0, 1.0])
        weighted_units = [make_unit([Sample(plain[0].prefix + plain[0].turns[0][0], a, [0.5, 0.5, 1.0]),
                                     Sample(plain[0].prefix + plain[0].turns[1][0], b, [1.0, 0.1, 0.1, 1.0])]),
                          plain[1]]  # a unit without weights beside one with: its tokens weigh 1
        wb = collate(weighted_units, pad_id=0)
        assert torch.equal(wb["target_weights"], w) and torch.equal(wb["targets"], batch["targets"])
        got = answer_loss(model, wb)
        # the per-token cross-entropy, from the plain batch's mean over tokens of one weight class each
        per_token = []
        for k in range(len(w)):
            one = dict(batch)
            mask = torch.zeros(len(w))
            mask[k] = 1.0
            one["target_weights"] = mask
            per_token.append(answer_loss(model, one))
        per_token = torch.stack(per_token)
        assert torch.allclose(per_token.mean(), mean, atol=1e-6)
        assert torch.allclose(got, (per_token * w).sum() / w.sum(), atol=1e-6)
        assert not torch.allclose(got, mean, atol=1e-4)
        unit_ones = make_unit([Sample(s_p, s_a, [1.0] * len(s_a)) for s_p, s_a in
                               [(plain[1].prefix + plain[1].turns[0][0], c)]])
        assert torch.allclose(answer_loss(model, collate([plain[0], unit_ones], pad_id=0)), mean, atol=1e-6)


def test_weighted_micro_batches_train_as_the_single_batch_does():
    """Each micro-batch's share of a weighted step is its weights' sum, so two micro-batches
    give the single batch's weighted mean (to float rounding)."""
    import dataclasses

    import numpy as np
    import torch

    from pipeline.policy.fingerprint import tiny_setup
    from pipeline.policy.model import Unit, build_model, train

    torch.set_num_threads(1)
    tok, pol, units = tiny_setup(epochs=1)
    rng = np.random.default_rng(3)
    units = [Unit(u.prefix, u.turns, [rng.choice([0.2, 1.0], len(a)).tolist() for _, a in u.turns]) for u in units]
    runs = {}
    for parts in (1, 2):
        model = build_model(tok, dataclasses.replace(pol, micro_batches=parts), seed=0)
        curve = train(model, units, dataclasses.replace(pol, micro_batches=parts), seed=0,
                      pad_id=int(tok.pad_token_id))
        runs[parts] = ([c["loss"] for c in curve], [c["tokens"] for c in curve],
                       torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert np.allclose(runs[1][0], runs[2][0], atol=1e-5) and runs[1][1] == runs[2][1]
    assert torch.allclose(runs[1][2], runs[2][2], atol=1e-5)


def test_tiny_policy_memorises_a_quest_and_reloads(cfg, demos, tiny_games, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.agents.llm import LLMAgent, parse_action
    from pipeline.envs.household.env import HouseholdEnv
    from pipeline.llm.backends.transformers import TransformersBackend
    from pipeline.policy.model import IM_END, Sample, build_model, make_unit, save_policy, train, train_tokenizer

    torch.set_num_threads(1)
    demos, turns = demos
    row = _train_row(tiny_games)
    mine = {d.demo_id for d in demos if d.task["quest_id"] == row["quest_id"] and d.task["scene_id"] == row["scene_id"]
            and d.variant.bare and not d.mapping}
    chosen = [t for t in turns if t.demo_id in mine and t.train]
    tok = train_tokenizer([m["content"] for t in chosen for m in t.messages] + [t.response for t in chosen],
                          vocab_size=400)
    pol = OmegaConf.merge(cfg.policy, {"epochs": 80, "episodes_per_batch": 1, "lr": 0.01})
    model = build_model(tok, pol, seed=0)
    backend = TransformersBackend(cfg.model, OmegaConf.merge(cfg.sampling, {"do_sample": False}), model=model,
                                  tokenizer=tok)
    eos = tok.convert_tokens_to_ids(IM_END)
    unit = make_unit([Sample(backend.render(t.messages)[1], tok(t.response, add_special_tokens=False)["input_ids"]
                             + [eos]) for t in chosen])
    curve = train(model, [unit], pol, seed=0, pad_id=tok.pad_token_id)
    assert len(curve) == 80
    assert curve[-1]["loss"] < 0.3 * curve[0]["loss"], (curve[0], curve[-1])

    path = save_policy(tmp_path / "model", model, tok)
    assert (path / "model.safetensors").exists() and (path / "tokenizer.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(path)
    tok2 = AutoTokenizer.from_pretrained(path)
    assert tok2.chat_template and tok2.eos_token == IM_END
    ids = torch.tensor([unit.prefix[:20]])
    assert torch.allclose(reloaded(ids).logits, model(ids).logits, atol=1e-5)

    # The backend loads the directory like any user's model; the agent plays the quest.
    mcfg = OmegaConf.merge(cfg, {"model": {"name_or_path": str(path)}, "sampling": {"do_sample": False}})
    agent = LLMAgent(mcfg, seed=0)
    prefs = tiny_games.scenes[row["scene_id"]]["preferences"]
    with HouseholdEnv(tiny_games.game_path(row), objective=row["objective"], preferences=prefs,
                      max_steps=cfg.env.max_steps) as env:
        obs = env.reset()
        agent.reset({"episode_id": "seen", "objective": row["objective"], "system_prompt": None})
        parsed = 0
        for _ in range(4):
            step = agent.act(obs)
            action, obj, err = parse_action(step.model.generation.action_text, obs)
            parsed += obj is not None
            obs, _, done, info = env.step(step.action)
            if done:
                break
    assert parsed >= 3, ("the memorised quest's answers parse", step.generated_text)


def test_build_policy_and_quality_report(three, tiny_games, tmp_path):
    """The stage's core end to end on the tiny world (one short epoch), then its evaluation."""
    import torch

    from pipeline.policy.demoset import load_demo_set, write_demo_set
    from pipeline.policy.quality import evaluate_policy, summary
    from pipeline.policy.training import MODEL_DIR, build_policy

    torch.set_num_threads(1)
    small, demo_set = three
    out = tmp_path / "policy"
    # The demos stage's product, written and read back as the policy stage reads it.
    write_demo_set(demo_set, tmp_path / "demos")
    built = build_policy(small, load_demo_set(tmp_path / "demos", tie_seed=int(small.seed)), out)
    assert (out / MODEL_DIR / "model.safetensors").exists() and (out / "demos.parquet").exists()
    s = json.loads((out / "training.json").read_text())
    assert s["training"]["steps"] == len(built["curve"]) > 0 and s["demos"]["episodes"] > 0
    assert s["training"]["tokens_per_epoch"] < s["training"]["full_prompt_tokens_per_epoch"]
    report = evaluate_policy(small, tiny_games.root, tiny_games.rows, tiny_games.scenes, out / MODEL_DIR,
                             memory=built["memory"])
    q = summary(report)
    for key in ("greedy_json_valid_rate", "greedy_success_plain", "react_success", "rag_success"):
        assert 0.0 <= q[key] <= 1.0
    assert report["tasks"] == sum(r["split"] == "eval" for r in tiny_games.rows)
    assert report["llm"]["greedy"]["plain"]["prompt_tokens_per_turn"] > 0


def test_scaling_study_trains_the_model_the_stage_trains(cfg, three, tiny_games, tmp_path):
    """``pipeline.policy.scaling``: a bundle made by the stage's library, trained by a grid
    point on the CPU, gives the stage's own loss curve; the point's record and table."""
    import torch

    from pipeline.policy.model import train
    from pipeline.policy.training import tokenize_demos
    from pipeline.policy.scaling import prepare_bundle, run_point, table

    torch.set_num_threads(1)
    small, demo_set = three  # the stage's demonstrations of the recipe the bundle is made with
    overrides = {"demos_per_quest": 3, "incontext_tasks": 2}
    assert OmegaConf.merge(cfg, {"policy": overrides}) == small
    info = prepare_bundle(cfg, tiny_games.root, tiny_games.rows, tiny_games.scenes, tmp_path / "b" / "d", overrides)
    rec = run_point(tmp_path / "b", "d", "cpu", 0, tmp_path / "r", 1)
    tok = tokenize_demos(small, demo_set.turns)
    curve = train(tok.model, tok.units, small.policy, seed=int(small.seed),
                  pad_id=int(tok.tokenizer.pad_token_id))
    assert info["units"] == len(tok.units) and info["probe_tasks"] == 4  # 2 houses x (oracle, plain)
    assert rec["done"] and rec["steps"] == rec["steps_planned"] == len(curve) > 0
    tail = [c["loss"] for c in curve[-50:]]
    assert rec["final_loss"] == pytest.approx(sum(tail) / len(tail), abs=1e-5)
    assert [c["step"] for c in rec["curve"]] == [0, len(curve)]
    assert {"oracle_first_step", "plain_first_step", "oracle_plan_copied"} <= set(rec["final"])
    row = [ln for ln in table(tmp_path / "r").splitlines() if ln.startswith("| d |")]
    assert len(row) == 1 and f"{len(curve)} ({len(curve)})" in row[0]
    with pytest.raises(SystemExit, match="unknown policy keys"):
        run_point(tmp_path / "b", "d:width=3", "cpu", 0, tmp_path / "r", 1)


# --------------------------------------------------------------------------- stage


def test_policy_check_measures_an_even_subset_of_eval_tasks():
    from pipeline.policy.quality import measured_rows

    rows = [{"scene_id": f"scene_{s:02d}", "quest_id": f"q{q:02d}", "split": "eval"} for s in range(4) for q in range(5)]
    rows += [{"scene_id": "scene_00", "quest_id": "t00", "split": "train"}]
    cut = measured_rows(rows, "eval", 8)
    evals = [(r["scene_id"], r["quest_id"]) for r in cut if r["split"] == "eval"]
    assert len(evals) == 8 and len({s for s, _ in evals}) == 4  # spread over every scene
    assert [r for r in cut if r["split"] == "train"] == rows[-1:]
    assert measured_rows(rows, "eval", 0) == rows[-1:] + rows[:-1] and len(measured_rows(rows, "eval", 99)) == 21


def test_the_dagger_bar_resets_once_per_phase_and_counts_its_steps():
    import io

    from tqdm import tqdm

    from pipeline.stages.policy import dagger_bar

    out = io.StringIO()
    with tqdm(desc="policy: training", unit="step", file=out, mininterval=0) as bar:
        bar.set_postfix(loss="0.240")  # the demonstrations' training's last loss
        progress = dagger_bar(bar)
        progress("dagger round 0: episodes", 0, 400)
        assert "loss" not in str(bar)  # not shown beside the rounds' episodes and steps
        started = bar.start_t
        for done in (56, 112, 400):
            progress("dagger round 0: episodes", done, 400)
            assert bar.n == done and bar.total == 400 and bar.start_t == started  # no reset inside a phase
        progress("dagger round 0: training", 3, 800)
        assert (bar.n, bar.total) == (3, 800) and bar.desc.startswith("policy: dagger round 0: training")
        progress("dagger round 0: training", 800, 800)
        assert bar.n == 800
    assert out.getvalue().count("| 0/800 ") == 1  # one reset into the training phase, then its steps


def test_house_sizes_env_gives_every_generated_house_the_worlds_counts(cfg, tiny_games):
    """``policy.house_sizes=env``: every house of the recipe's streams at ``env``'s counts (the eval's
    scenes' sizes), still never an eval layout or objective; ``drawn`` (the default) draws them."""
    from pipeline.envs.household.generate import HouseSizes, layout_key
    from pipeline.policy.demos import house_sizes, training_houses

    def counts(h):
        s = h.spec
        return (len(s["rooms"]), len(s["containers"]), sum(bool(c["locked"]) for c in s["containers"]),
                len(s["supporters"]), len(s["objects"]))

    env = OmegaConf.merge(cfg, {"policy": {"house_sizes": "env"}})
    e = cfg.env
    want = (e.rooms_per_scene, e.containers_per_scene, e.locked_containers, e.supporters_per_scene, e.objects_per_scene)
    for heldout in (False, True):
        houses = training_houses(env, tiny_games.rows, tiny_games.scenes, heldout=heldout, quests_per_house=2).houses(40)
        assert {counts(h) for h in houses} == {want}
        assert len({layout_key(h.spec) for h in houses}) == 40
        eval_rows = [r for r in tiny_games.rows if r["split"] == "eval"]
        assert not {layout_key(h.spec) for h in houses} & {layout_key(tiny_games.scenes[r["scene_id"]]) for r in eval_rows}
        assert not {q["objective"] for h in houses for q in h.quests} & {r["objective"] for r in eval_rows}
    drawn = training_houses(cfg, tiny_games.rows, tiny_games.scenes).houses(40)
    assert len({counts(h) for h in drawn}) > 1
    assert house_sizes(cfg) == HouseSizes()  # the default recipe's houses as before the option
    with pytest.raises(Exception, match="house_sizes"):
        OmegaConf.merge(cfg, {"policy": {"house_sizes": "large"}})
