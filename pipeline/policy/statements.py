"""Statement drills (issue 64): first turns that teach the model to act on a statement of where a
thing is, as plan drills teach it to copy a verified plan.

The utilisation probe (:mod:`pipeline.policy.utilisation`) found the default model acting on a
verified plan (the one thing 94% of its training first turns carried) and on nothing else: the
grounding of a past visit takes the reader from 0.48 to 0.95 on held-out houses and the model
nowhere, and so does the C2 block that names where things were in this house. A statement drill
is a generated house's first turn under a prompt that says where things are and gives no plan,
answered by the teacher ``policy.teacher`` names (:mod:`pipeline.policy.teacher`; both the
knowledge-limited expert and the reader act on every true statement of where a thing is):

- the house's *past visit*: the rule agent plays its second quest (:func:`past_visits`);
- the prompt is what that visit taught (its grounding, :func:`history_grounding`) or, drawn per
  house (and whenever it taught nothing), the C2 block alone, retrieved from the store with the
  visit in it (:func:`house_memory`, :func:`memory_variant`: "This house, from 1 past visit: ...");
- it is kept only where the teacher's answer (its command and what it rests on) is not what the
  teacher told nothing would do: a first turn the statement does not change teaches nothing of it.

``policy.statement_drills`` drills are built by the ``demos`` step (:func:`statement_drills`, in the
demos' worker pool: chunks of house indices, merged in index order, so any worker count gives the
same drills) and trained as plan drills are, eight to a unit
(:func:`pipeline.policy.demos.training_unit`). The houses are a stream of their own
(``derive_seed(seed, "statement-drills")``), never an eval scene's layout or an eval objective.

The functions that build a house's past visits and their prompts are shared with the model's
studies (:mod:`pipeline.policy.study`, :mod:`pipeline.policy.utilisation`), whose held-out houses
they also build.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pipeline.core.conf_schema import Config
from pipeline.core.parallel import OrderedPool, Shared
from pipeline.core.schemas import episodes_table, turns_table
from pipeline.core.seeding import crc_rng, derive_seed, task_seed
from pipeline.envs import fact_reader, scene_preferences
from pipeline.envs.household.generate import GeneratedHouse
from pipeline.grounding.episodes import scene_groundings
from pipeline.memory import EpisodicStore, build_entries, table_to_entries
from pipeline.policy.demo_workers import WorkerContext
from pipeline.policy.demos import (
    DemoKind,
    NoBackend,
    RenderedTurn,
    SceneMemory,
    Variant,
    _prompt_memory,
    _workers_or_inline,
    freeze_prompt,
    house_env,
    house_stream,
    house_variants,
    rule_agent_config,
)
from pipeline.policy.quality import exposed_variant
from pipeline.prompts import PromptOrganizer
from pipeline.session.collection import make_factories
from pipeline.session.rollout import Task, format_episode_id, play

DRILLS_PER_UNIT = 8  # as plan drills (pipeline.policy.demos.house_demo): one optimizer step runs a unit
INDICES_PER_JOB = 32  # house indices tried per job (about one in five gives a drill)
STREAM = "statement-drills"


def houses_for(n: int) -> int:
    """The houses ``n`` drills are expected to need: about five and a half give one (measured on the
    default's stream: 26,400 houses for 4,800 drills)."""
    return (11 * max(0, n) + 1) // 2


def history_grounding(rule_cfg: Config, house: GeneratedHouse, episodes: list[dict], turns: list[dict]) -> str | None:
    """The merged grounding of ``house``'s past visits (:func:`past_visits`), or None."""
    if not episodes:
        return None
    text = scene_groundings(rule_cfg.grounding, episodes, turns).get(house.scene_id, "")
    return text or None


def past_visits(rule_cfg: Config, house: GeneratedHouse, scenes: Mapping[str, Any]) -> tuple[list[dict], list[dict]]:
    """The rule agent's episode and turn rows on quests 1..n-1 of ``house`` (its past visits:
    what the grounding is taught on and, in a ``memory`` prompt, what the store holds of it);
    ``([], [])`` for a one-quest house."""
    if len(house.quests) < 2:
        return [], []
    _, make_agent, make_user = make_factories(rule_cfg, Path("."), dict(scenes))
    index: dict[str, int] = {}
    tasks = []
    for k in range(1, len(house.quests)):
        row = house.row(k)
        index[row["quest_id"]] = k
        tasks.append(Task(episode_id=format_episode_id("train", house.scene_id, row["quest_id"], 0),
                          scene_id=house.scene_id, quest_id=row["quest_id"], split="train",
                          objective=row["objective"], game_file="", expert_plan=list(row["expert_plan"]),
                          preferences=list(row["preferences"]),
                          seed=task_seed(rule_cfg.seed, house.scene_id, row["quest_id"], 0)))
    records = play(tasks, make_env=lambda t: house_env(rule_cfg, house, index[t.quest_id]), make_agent=make_agent,
                   make_user=make_user, agent_name=str(rule_cfg.policy.rule_agent),
                   preference_in_success=rule_cfg.user.preference_in_success,
                   unknown_feedback=str(rule_cfg.grounding.unknown_type))
    return [r["episode"] for r in records], [t for r in records for t in r["turns"]]


def house_memory(cfg: Config, memory: SceneMemory, episodes: list[dict], turns: list[dict]) -> SceneMemory:
    """``memory`` with a house's past visits (:func:`past_visits`) added to its store, as
    ``store`` builds entries from ``collect``'s episodes (same reader, same splits)."""
    if not episodes:
        return memory
    splits = list(cfg.memory.store_splits) or None
    added = build_entries(episodes_table(episodes), turns_table(turns), reader=fact_reader(cfg), splits=splits,
                          config_hash=None)
    store = EpisodicStore.from_entries(table_to_entries(memory.store.table) + list(added),
                                       tie_seed=memory.store.tie_seed)
    return replace(memory, store=store)


def memory_variant(cfg: Config, memory: SceneMemory, organizer: PromptOrganizer, house: GeneratedHouse,
                   grounding: str | None) -> Variant | None:
    """The house's first quest under its grounding (None: none) and the exposed advisory
    variant's block (``C2``: :func:`pipeline.policy.quality.exposed_variant`) built from
    ``memory``; None when that block is empty (the gate withheld it)."""
    name, _ = exposed_variant(cfg.demos)
    return next((v for v in house_variants(cfg, memory, organizer, house, grounding)
                 if v.source == name and v.grounding == grounding), None)


def statement_drill(cfg: Config, scenes: Mapping[str, Any], memory: SceneMemory, organizer: PromptOrganizer,
                    house: GeneratedHouse | None, *, rule_cfg: Config | None = None) -> RenderedTurn | None:
    """The drill of one house of the stream (module docstring), its id a placeholder
    (:func:`statement_drills` numbers the drills in house order); None where the house gives none
    (an excluded draw, no block, or a statement that changes nothing at the first turn)."""
    from pipeline.agents.llm import LLMAgent
    from pipeline.envs import fact_reader
    from pipeline.policy.teacher import make_teacher

    if house is None:  # an excluded layout, or no quest left
        return None
    rule_cfg = rule_cfg if rule_cfg is not None else rule_agent_config(cfg)
    episodes, turns = past_visits(rule_cfg, house, {**scenes, house.scene_id: house.spec})
    text = history_grounding(rule_cfg, house, episodes, turns)
    if text is not None and crc_rng(cfg.seed, "statement-drill", house.scene_id).random() < 0.5:
        v = next((x for x in house_variants(cfg, memory, organizer, house, text) if not x.block), None)
    else:
        v = memory_variant(cfg, house_memory(cfg, memory, episodes, turns), organizer, house, None)
    if v is None:
        return None
    row = house.row(0)
    prompt = freeze_prompt(organizer, row["objective"], row["scene_id"], v.grounding, v.block)
    env = house_env(cfg, house)
    try:
        obs = env.reset()
        prefs = scene_preferences(house.spec, list(row.get("preferences") or []))
        facts = fact_reader(cfg)
        told = {k: make_teacher(cfg.policy.teacher, env, text_, str(row["objective"]), prefs, facts=facts,
                                explore_cap=int(cfg.policy.explore_cap)).answer(obs) for k, text_ in
                (("prompt", prompt), ("nothing", ""))}
    finally:
        env.close()
    answer = told["prompt"].response
    if (told["prompt"].command, told["prompt"].basis) == (told["nothing"].command, told["nothing"].basis):
        return None  # the statement changes nothing at this turn (the same step on the same basis): no drill of it
    agent = LLMAgent(cfg, backend=NoBackend())
    agent.reset({"episode_id": f"stmt_{house.scene_id}", "scene_id": row["scene_id"], "quest_id": row["quest_id"],
                 "objective": row["objective"], "seed": 0, "system_prompt": prompt})
    return RenderedTurn("", 0, v.name, agent.messages(obs), answer, True)


def drill_id(j: int, tag: str = "stmt") -> str:
    """The ``j``-th drill's id of a drill stream tagged ``tag`` (``stmt``: the statement drills): a
    generated house's drill (:class:`DemoKind`), eight to a unit."""
    return f"{DemoKind.house_drill.prefix}{tag}{j // DRILLS_PER_UNIT:05d}_{j % DRILLS_PER_UNIT:02d}"


def statement_drills(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
                     memory: SceneMemory, n: int, *, workers: OrderedPool | None = None,
                     progress: Callable[[int], None] | None = None) -> list[RenderedTurn]:
    """``n`` statement drills (module docstring), drawn by :func:`draw_drills`.

    Raises:
        ValueError: the stream gave fewer than ``n`` drills from ``50 n + 100`` houses.
    """
    return draw_drills(cfg, manifest, scenes, memory, n, make=statement_drill, stream=STREAM, tag="stmt",
                       houses_needed=houses_for, key="policy.statement_drills", workers=workers, progress=progress)


DrillMaker = Callable[..., "RenderedTurn | None"]
"""``make(cfg, scenes, memory, organizer, house, *, rule_cfg)``: one house's drill, or None (a top-level
function: the workers are given it by name)."""


def draw_drills(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
                memory: SceneMemory, n: int, *, make: DrillMaker, stream: str, tag: str,
                houses_needed: Callable[[int], int], key: str, workers: OrderedPool | None = None,
                progress: Callable[[int], None] | None = None) -> list[RenderedTurn]:
    """``n`` drills of a house stream of their own (``derive_seed(seed, stream)``, two quests a house):
    ``make`` tries each house, in chunks of :data:`INDICES_PER_JOB` indices in ``workers`` (None: this
    process), and the first ``n`` drills in house order are kept and numbered (:func:`drill_id` with
    ``tag``), so the drills are the same at any worker count. ``houses_needed(k)``: the houses ``k``
    more drills are expected to need (how much one map tries).

    Raises:
        ValueError: the stream gave fewer than ``n`` drills from ``50 n + 100`` houses (``key``: the
            config key that asked for them, named in the message).
    """
    if n <= 0:
        return []
    limit = 50 * n + 100  # the statement drills need about one house in five
    out: list[RenderedTurn] = []
    with _workers_or_inline(workers, cfg, Path("."), manifest, scenes) as pool:
        shared = pool.share((_prompt_memory(memory), PromptOrganizer.from_config(cfg)))
        start = 0
        found = 0  # drills found so far (in the order jobs finish: for the progress bar only)

        def tick(part: list[RenderedTurn | None]) -> None:
            nonlocal found
            k = min(n, found + sum(t is not None for t in part)) - found
            found += k
            if progress is not None and k:
                progress(k)

        while len(out) < n:
            if start >= limit:
                raise ValueError(f"{tag} drills: only {len(out)} of {n} drawn from {start} houses ({key}={n})")
            # the houses the rest needs, in one map
            span = min(limit - start, max(INDICES_PER_JOB * pool.workers, houses_needed(n - len(out))))
            jobs = [(shared, make, stream, (i, min(i + INDICES_PER_JOB, start + span)))
                    for i in range(start, start + span, INDICES_PER_JOB)]
            for part in pool.map(_drills_job, jobs, progress=tick):
                out += [replace(t, demo_id=drill_id(len(out) + j, tag)) for j, t in
                        enumerate([t for t in part if t is not None][:n - len(out)])]
            start += span
    return out


def _drills_job(ctx: WorkerContext, job: tuple[Shared, DrillMaker, str, tuple[int, int]]) -> list[RenderedTurn | None]:
    shared, make, stream, (lo, hi) = job
    memory, organizer = ctx.get(shared)
    cfg = ctx.cfg
    houses = ctx.cached(f"drill_houses:{stream}", lambda: house_stream(cfg, ctx.manifest, ctx.scenes,
                                                                       derive_seed(cfg.seed, stream), 2))
    rule_cfg = ctx.cached("rule_cfg", lambda: rule_agent_config(cfg))
    return [make(cfg, ctx.scenes, memory, organizer, houses.house(k), rule_cfg=rule_cfg) for k in range(lo, hi)]
