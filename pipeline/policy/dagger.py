"""Learning from its own mistakes: whole episodes of the policy in generated houses, the
expert's label for every state the policy reaches (DAgger), and the whole-episode probe.

A model trained only on the expert's episodes has only seen the expert's states: its
first slip takes it where it has no data, and it does not recover (imitation learning's
compounding error; Ross, Gordon & Bagnell 2011, "A Reduction of Imitation Learning and
Structured Prediction to No-Regret Online Learning"). DAgger's answer: let the *policy*
play, ask the expert what it would do in every state the policy reached, add those
labels to the data, train again. Here:

- :func:`play_houses` plays :class:`HouseTask` s (a generated house's first quest under a
  prompt variant) with the model, batched as ``evaluate`` plays (the ``llm`` agent, its
  decoding, greedy), on TextWorld's logic engine. With ``label`` it runs the teacher
  ``policy.teacher`` names (:mod:`pipeline.policy.teacher`) beside it on the same env: the
  teacher knows what the prompt states and what has been seen, answers every state the policy
  reaches, and goes on from the step the policy played. Each turn becomes a
  :class:`pipeline.policy.demos.RenderedTurn`: the messages the *model* was given (its own
  memory dict, its own history) and the *teacher's* answer. So the model's inputs are
  exactly what ``evaluate`` gives it; what it learns is the way back.
- :func:`dagger_tasks`: the houses a round plays, from their own seed stream (never an eval
  scene's layout, never an eval objective: :func:`pipeline.policy.demos.training_houses`),
  each under one prompt variant in turn (plain, grounded, each advisory), half of them
  grounded as the demonstrations are.
- :func:`rollout_pool` and :func:`play_rollouts`: those episodes in worker processes, a batch a
  job, one thread each: any worker count, the same rollouts.
- :class:`EpisodeProbe`: whole-episode success in *held-out* generated houses (the
  in-context probe's seed stream) under C0-, C1- and C2_oracle-like prompts (plain; the
  house's own grounding; grounding + the verified plan). The first-turn probe
  (:mod:`pipeline.policy.incontext`) says whether the model reads; this one says whether it
  plays the episode through.

Everything is a pure function of the config, the model and the house seeds: batches are
fixed by ``agent.batch_size``, decoding is greedy, the houses are drawn by index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from omegaconf import OmegaConf

from pipeline.agents.llm import LLMAgent
from pipeline.core.conf_schema import ConditionKind, Config
from pipeline.core.parallel import OrderedPool, partition
from pipeline.core.seeding import crc_rng, derive_seed
from pipeline.envs import fact_reader, scene_preferences
from pipeline.envs.household.generate import GeneratedHouse
from pipeline.llm.backends.transformers import TransformersBackend
from pipeline.policy.demos import (
    DemoKind,
    advisory_variant_names,
    RenderedTurn,
    SceneMemory,
    Variant,
    freeze_prompt,
    house_env,
    house_grounding,
    house_stream,
    house_variants,
    rule_agent_config,
)
from pipeline.policy.teacher import make_teacher
from pipeline.prompts import PromptOrganizer


@dataclass
class HouseTask:
    """One episode to play: a generated house's first quest under one prompt variant.

    ``prompt`` is the frozen system prompt (what the expert reads); the agent is given it
    unless the variant is bare, when it renders its own prompt as in ``collect``."""

    task_id: str
    kind: str
    house: GeneratedHouse
    row: dict
    variant: Variant
    prompt: str


@dataclass
class Rollout:
    """How one :class:`HouseTask` went: the model's episode and, when labelled, the expert's
    answer at every state the model reached."""

    task: HouseTask
    won: bool
    success: bool
    turns: int
    labels: list[RenderedTurn] = field(default_factory=list)
    agreement: list[bool] = field(default_factory=list)  # per labelled turn: the model played the label's command

    @property
    def agreed(self) -> int:
        """Turns where the model played the expert's command."""
        return sum(self.agreement)


def rollout_config(cfg: Config) -> Config:
    """The config the policy plays with here: ``evaluate``'s agent, greedy, no disk cache."""
    return OmegaConf.merge(cfg, {"sampling": {"do_sample": False}, "model": {"cache_dir": None}})


def _house_variants(cfg: Config, scenes: Mapping[str, Any], memory: SceneMemory, organizer: PromptOrganizer,
                    house: GeneratedHouse, rule_cfg: Config, grounded: bool) -> list[Variant]:
    """:func:`house_variants` with the house's own grounding when ``grounded``."""
    text = house_grounding(rule_cfg, house, {**scenes, house.scene_id: house.spec}) if grounded else None
    return house_variants(cfg, memory, organizer, house, text)


def _task(cfg: Config, organizer: PromptOrganizer, task_id: str, kind: str, house: GeneratedHouse,
          variant: Variant) -> HouseTask:
    row = house.row(0)
    prompt = freeze_prompt(organizer, row["objective"], row["scene_id"], variant.grounding, variant.block)
    return HouseTask(task_id, kind, house, row, variant, prompt)


def dagger_houses(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any], round_: int,
                  n: int) -> list[GeneratedHouse]:
    """Round ``round_``'s ``n`` houses: their own seed stream (``derive_seed(seed, "dagger",
    round)``), never an eval scene's layout or an eval quest's objective."""
    houses = house_stream(cfg, manifest, scenes, derive_seed(cfg.seed, "dagger", round_), 2)
    return houses.houses(n) if n > 0 else []


def dagger_tasks(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
                 memory: SceneMemory, round_: int, n: int) -> list[HouseTask]:
    """One task per house of round ``round_``: a share ``policy.generated_grounding`` of the
    houses (drawn per house) carry their own grounding; the variant is the house's index
    modulo the number of variants (plain / each advisory, grounded or not)."""
    organizer = PromptOrganizer.from_config(cfg)
    rule_cfg = rule_agent_config(cfg)
    out = []
    for i, house in enumerate(dagger_houses(cfg, manifest, scenes, round_, n)):
        grounded = crc_rng(cfg.seed, "dagger-grounding", round_, house.scene_id).random() \
            < cfg.policy.generated_grounding
        variants = _house_variants(cfg, scenes, memory, organizer, house, rule_cfg, grounded)
        v = variants[i % len(variants)]
        name = f"{round_:02d}_{house.scene_id}"
        out.append(_task(cfg, organizer, DemoKind.dagger.prefix + name, v.name, house, v))
    return out


def play_houses(cfg: Config, backend: Any, tasks: Sequence[HouseTask], *, label: bool,
                progress: Callable[[int], None] | None = None) -> list[Rollout]:
    """Play every task with the model behind ``backend`` (``agent.batch_size`` episodes a
    batch, one batched call a turn); with ``label`` the expert's answer at every turn.

    ``cfg`` should be :func:`rollout_config`'s (greedy)."""
    batch = max(1, int(cfg.agent.batch_size))
    explore_cap = int(cfg.policy.explore_cap)
    facts = fact_reader(cfg) if label else None
    out: list[Rollout] = []
    for start in range(0, len(tasks), batch):
        slots = []
        for t in tasks[start:start + batch]:
            env = house_env(cfg, t.house)
            obs = env.reset()
            agent = LLMAgent(cfg, backend=backend)
            agent.reset({"episode_id": t.task_id, "scene_id": t.row["scene_id"], "quest_id": t.row["quest_id"],
                         "objective": t.row["objective"], "seed": 0,
                         "system_prompt": None if t.variant.bare else t.prompt})
            teacher = None
            if label:
                prefs = scene_preferences(t.house.spec, list(t.row.get("preferences") or []))
                teacher = make_teacher(cfg.policy.teacher, env, t.prompt, str(t.row["objective"]), prefs,
                                       facts=facts, explore_cap=explore_cap)
            slots.append({"task": t, "env": env, "agent": agent, "teacher": teacher, "obs": obs,
                          "rollout": Rollout(t, False, False, 0)})
        active = slots
        while active:
            wanted = []
            for s in active:
                if s["teacher"] is None:
                    wanted.append(None)
                    continue
                answer = s["teacher"].answer(s["obs"])
                r = s["rollout"]
                r.labels.append(RenderedTurn(s["task"].task_id, r.turns, s["task"].variant.name,
                                             s["agent"].messages(s["obs"]), answer.response, True))
                wanted.append(answer.command)
            steps = LLMAgent.act_many([s["agent"] for s in active], [s["obs"] for s in active])
            still = []
            for s, step, want in zip(active, steps, wanted):
                obs, _, done, info = s["env"].step(step.action)
                r = s["rollout"]
                r.turns += 1
                if s["teacher"] is not None:
                    r.agreement.append(info.get("command") == want)
                    s["teacher"].played(info.get("command"), step.action)
                s["obs"] = obs
                if done:
                    r.won = bool(info.get("won"))
                    r.success = r.won and bool(info.get("preferences_ok"))
                    s["env"].close()
                    if progress is not None:
                        progress(1)
                else:
                    still.append(s)
            active = still
        out += [s["rollout"] for s in slots]
    return out


ROLLOUT_THREADS = 1  # every rollout job's torch threads, in this process and in a worker


def rollout_pool(cfg: Config, workers: int = 1) -> OrderedPool:
    """The pool a model's whole episodes are played in (:func:`play_rollouts`): ``workers``
    processes (1: this one), each pinned as ``cfg``'s numerics at one thread, ``cfg``
    (:func:`rollout_config`'s) their context. The processes start at the first episodes and
    serve every later play (the ``policy`` step keeps them through its training between rounds)."""
    return OrderedPool(workers, context=cfg, numerics=cfg.numerics, threads=ROLLOUT_THREADS)


def play_rollouts(pool: OrderedPool, model: Any, tokenizer: Any, tasks: Sequence[HouseTask], *, label: bool,
                  progress: Callable[[int], None] | None = None) -> list[Rollout]:
    """Every task's :class:`Rollout`, in task order (``label``: the expert's answer at every turn),
    played in ``pool`` (:func:`rollout_pool`): the batches of ``agent.batch_size`` are the
    partition, a batch a job, each played by :func:`play_houses` on one thread with a backend of
    its own (no prompt cache shared between batches), the model in eval mode. So any worker
    count gives the same rollouts, and they equal :func:`play_houses` run single-threaded. The
    model and tokenizer travel to a worker inside the job (multiprocessing's own pickling between
    this run's processes, never a file: the default policy is ~3 MB, a job a whole batch of
    episodes). ``progress(n)`` as a batch of ``n`` episodes finishes; ``model`` is left in the
    mode (train/eval) it came in."""
    tick = None if progress is None else (lambda rolls: progress(len(rolls)))
    parts = partition(tasks, pool.context.agent.batch_size)
    was_training = model.training
    try:
        done = pool.map(_rollout_job, [(model, tokenizer, part, label) for part in parts], progress=tick)
    finally:
        model.train(was_training)
    return [r for part in done for r in part]


def _rollout_job(cfg: Config, job: tuple[Any, Any, list[HouseTask], bool]) -> list[Rollout]:
    """One batch of tasks, played by :func:`play_houses` on one thread with a backend of its own."""
    import torch  # deferred: heavy optional dependency (torch)

    model, tokenizer, tasks, label = job
    threads = torch.get_num_threads()
    torch.set_num_threads(ROLLOUT_THREADS)
    try:
        model.eval()
        return play_houses(cfg, model_backend(cfg, model, tokenizer), tasks, label=label)
    finally:
        torch.set_num_threads(threads)


def model_backend(cfg: Config, model: Any, tokenizer: Any) -> TransformersBackend:
    """The transformers backend around an in-memory model (``cfg``: :func:`rollout_config`'s)."""
    return TransformersBackend(cfg.model, cfg.sampling, model=model, tokenizer=tokenizer)


def rollout_summary(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """Success, turns and (when labelled) agreement with the expert, overall and per kind."""
    def one(rs: Sequence[Rollout]) -> dict[str, Any]:
        turns = sum(r.turns for r in rs)
        out = {"episodes": len(rs), "success": round(sum(r.success for r in rs) / len(rs), 6),
               "mean_turns": round(turns / len(rs), 3)}
        if any(r.labels for r in rs):
            out["expert_agreement"] = round(sum(r.agreed for r in rs) / max(1, turns), 6)
        return out

    if not rollouts:
        return {"episodes": 0}
    kinds = sorted({r.task.kind for r in rollouts})
    return {**one(rollouts), "by_variant": {k: one([r for r in rollouts if r.task.kind == k]) for k in kinds}}


@dataclass
class EpisodeProbe:
    """Whole episodes in held-out generated houses under C0-, C1- and C2_oracle-like prompts.

    Per house (the in-context probe's stream, :func:`pipeline.policy.demos.training_houses`
    with ``heldout=True``; the same first quests): ``plain`` (no grounding, no advisory),
    ``grounded`` (the house's own grounding, from the simulated user's feedback on its
    second quest; houses whose rule agent drew no feedback have none) and ``oracle``
    (that grounding when there is one, and the positive control's verified plan)."""

    cfg: Any
    tasks: list[HouseTask]

    KINDS = ("plain", "grounded", "oracle")

    @classmethod
    def build(cls, cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
              memory: SceneMemory, *, n: int) -> "EpisodeProbe":
        from pipeline.policy.demos import training_houses  # the in-context probe's stream

        organizer = PromptOrganizer.from_config(cfg)
        rule_cfg = rule_agent_config(cfg)
        oracle = set(advisory_variant_names(cfg, ConditionKind.oracle))
        tasks: list[HouseTask] = []
        houses = training_houses(cfg, manifest, scenes, heldout=True, quests_per_house=2).houses(n) if n > 0 else []
        for house in houses:
            grounded = _house_variants(cfg, scenes, memory, organizer, house, rule_cfg, True)
            plain = _house_variants(cfg, scenes, memory, organizer, house, rule_cfg, False)
            picks = {"plain": next((v for v in plain if v.bare), None),
                     "grounded": next((v for v in grounded if v.grounding is not None and not v.block), None),
                     "oracle": next((v for v in grounded if v.source in oracle), None)}
            for kind in cls.KINDS:
                if picks[kind] is not None:
                    tasks.append(_task(cfg, organizer, f"probe_{kind}_{house.scene_id}", kind, house, picks[kind]))
        return cls(rollout_config(cfg), tasks)

    def score(self, model: Any, tokenizer: Any, *, pool: OrderedPool | None = None) -> dict[str, Any]:
        """``{"<kind>_success": share, "<kind>_turns": mean, "houses": n}`` of the model, greedy,
        played in ``pool`` (:func:`rollout_pool`; default: this process)."""
        if not self.tasks:
            return {"houses": 0}
        pool = pool if pool is not None else rollout_pool(self.cfg)
        rollouts = play_rollouts(pool, model, tokenizer, self.tasks, label=False)
        out: dict[str, Any] = {}
        for kind in self.KINDS:
            rs = [r for r in rollouts if r.task.kind == kind]
            if rs:
                out[f"{kind}_success"] = round(sum(r.success for r in rs) / len(rs), 6)
                out[f"{kind}_turns"] = round(sum(r.turns for r in rs) / len(rs), 3)
                out[f"{kind}_episodes"] = len(rs)
        out["houses"] = len({r.task.house.scene_id for r in rollouts})
        return out


@dataclass
class DaggerResult:
    """What the rounds added: the labelled turns (every round's), the training curve (steps
    numbered on from ``start_step``) and one summary per round."""

    turns: list[RenderedTurn]
    prompts: list[str]
    curve: list[dict]
    rounds: list[dict]


def turn_samples(cfg: Config, model: Any, tokenizer: Any,
                 turns: Sequence[RenderedTurn]) -> tuple[dict[str, list[Any]], list[str]]:
    """Every turn's prompt text, and its train turns' samples (:func:`pipeline.policy.model.answer_sample`,
    the answer weighted by ``policy``'s loss weights) grouped by training unit
    (:func:`pipeline.policy.demos.training_unit`), in turn order: prompts rendered by the backend's own
    chat rendering (chat template, special tokens), so the ids the model is trained on are the ids it
    will be given. The demonstrations' tokenization (:func:`pipeline.policy.training.tokenize_demos`)
    and the DAgger rounds' labels (:func:`turn_units`) are both this."""
    from pipeline.policy.demos import training_unit
    from pipeline.policy.model import IM_END, answer_sample, loss_weights

    backend = TransformersBackend(cfg.model, cfg.sampling, model=model, tokenizer=tokenizer)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    weights = loss_weights(cfg.policy)
    by: dict[str, list[Any]] = {}
    prompts: list[str] = []
    for tr in turns:
        text, ids = backend.render(tr.messages)
        prompts.append(text)
        if tr.train:
            by.setdefault(training_unit(tr.demo_id), []).append(
                answer_sample(tokenizer, ids, tr.response, eos, **weights))
    return by, prompts


def turn_units(cfg: Config, model: Any, tokenizer: Any, turns: Sequence[RenderedTurn]) -> tuple[list[Any], list[str]]:
    """Training units of labelled turns (one per episode, in key order) and every turn's prompt text,
    tokenized as the demonstrations are (:func:`turn_samples`)."""
    from pipeline.policy.model import make_unit

    by, prompts = turn_samples(cfg, model, tokenizer, turns)
    return [make_unit(v) for _, v in sorted(by.items())], prompts


def run_rounds(cfg: Config, model: Any, tokenizer: Any, base_units: Sequence[Any], memory: SceneMemory,
               manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any], *, start_step: int,
               processes: int = 1, after_round: Callable[[int, int], dict] | None = None,
               progress: Callable[[str, int, int], None] | None = None,
               pool: OrderedPool | None = None, resume: DaggerResult | None = None,
               on_round: Callable[[DaggerResult], None] | None = None) -> DaggerResult:
    """``policy.dagger_rounds`` rounds of DAgger on ``model`` (in place).

    Round ``r``: the model plays round ``r``'s houses (:func:`dagger_tasks`, greedy, as
    ``evaluate`` plays), the expert labels every state (:func:`play_houses`); the model is
    trained on every round's labelled units so far plus ``dagger_replay`` times as many
    demonstration units (``base_units``, drawn from ``crc_rng(seed, "dagger-replay", r)``),
    ``dagger_epochs`` epochs at ``dagger_lr``, batch order seeded by ``seed + 1 + r``.
    ``after_round(r, step)`` returns figures kept in the round's summary (the probes).
    ``progress(what, done, total)`` reports rollouts and training steps. The rollouts are
    played in ``pool`` (:func:`rollout_pool` of :func:`rollout_config`; default: this process).

    ``resume``: the result of the rounds already finished (``model`` already holds their
    training; :mod:`pipeline.policy.resume`): their labelled turns are tokenized again, round
    by round, and the rounds go on after them. ``on_round(result)`` is called after each round
    with everything so far (the step's phase checkpoint)."""
    from pipeline.policy.model import train

    pol = cfg.policy
    pool = pool if pool is not None else rollout_pool(rollout_config(cfg))
    turns: list[RenderedTurn] = []
    prompts: list[str] = []
    units: list[Any] = []
    curve: list[dict] = []
    rounds: list[dict] = []
    if resume is not None:  # the finished rounds' units, as each round tokenized its own labels
        at = 0
        for done_round in resume.rounds:
            new = resume.turns[at:at + int(done_round["labelled_turns"])]
            at += len(new)
            new_units, new_prompts = turn_units(cfg, model, tokenizer, new)
            units += new_units
            prompts += new_prompts
        turns, curve, rounds = list(resume.turns), list(resume.curve), list(resume.rounds)
    step = start_step + len(curve)
    for r in range(len(rounds), int(pol.dagger_rounds)):
        tasks = dagger_tasks(cfg, manifest, scenes, memory, r, int(pol.dagger_houses))
        done = 0

        def played(n: int, r: int = r, total: int = len(tasks)) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(f"dagger round {r}: episodes", done, total)

        rolls = play_rollouts(pool, model, tokenizer, tasks, label=True, progress=played)
        new = [t for roll in rolls for t in roll.labels]
        turns += new
        new_units, new_prompts = turn_units(cfg, model, tokenizer, new)
        units += new_units
        prompts += new_prompts
        k = min(len(base_units), int(float(pol.dagger_replay) * len(units)))
        rng = crc_rng(cfg.seed, "dagger-replay", r)
        replay = [base_units[i] for i in sorted(int(j) for j in rng.choice(len(base_units), size=k, replace=False))]
        round_cfg = OmegaConf.merge(pol, {"epochs": int(pol.dagger_epochs), "lr": float(pol.dagger_lr)})
        n_steps = int(pol.dagger_epochs) * -(-(len(units) + len(replay)) // int(pol.episodes_per_batch))
        trained = 0

        def on_step(n: int, loss: float, r: int = r, total: int = n_steps) -> None:
            nonlocal trained
            trained += n
            if progress is not None:
                progress(f"dagger round {r}: training", trained, total)

        part = train(model, units + replay, round_cfg, seed=int(cfg.seed) + 1 + r, pad_id=int(tokenizer.pad_token_id),
                     progress=on_step, processes=processes)
        for rec in part:
            curve.append({**rec, "step": step + rec["step"], "epoch": int(pol.epochs) + r})
        step += len(part)
        summary = {"round": r, "rollout": rollout_summary(rolls), "labelled_turns": len(new),
                   "units": len(units), "replayed_units": len(replay), "steps": len(part),
                   "final_loss": round(sum(c["loss"] for c in part[-20:]) / max(1, len(part[-20:])), 6)}
        if after_round is not None:
            summary.update(after_round(r, step))
        rounds.append(summary)
        if on_round is not None:
            on_round(DaggerResult(list(turns), list(prompts), list(curve), list(rounds)))
    return DaggerResult(turns, prompts, curve, rounds)
