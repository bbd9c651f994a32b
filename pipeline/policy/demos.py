"""Expert demonstrations for the default policy, in exactly the form the ``llm`` agent sees.

Three steps, all on the *train* quests of the games manifest (eval quests are never
played here):

1. :func:`build_scene_memory`: a rule agent (``policy.rule_agent``, with
   ``policy.rule_epsilon`` random slips so that the simulated user has something to
   say) plays the train quests; its feedback goes through the library the ``ground``
   stage runs (:func:`pipeline.grounding.episodes.ground`), the merge rules of the
   ``merge`` stage (per scene) and the store's entries (:func:`memory_from_episodes`:
   the stages' own library, in memory). That gives, per scene, a
   ``$grounding_content`` text and an episodic store to retrieve advisories from, built
   by the same code that builds them for the real run.
2. :func:`play_demos`: for every train quest, prompt *variants* (no grounding / the
   scene's grounding, times no advisory / each of ``demos.advisory_variants``' injected
   block, as ``build_memory_slot`` makes a condition's for the ``render`` stage: the
   policy's own list, never the experiment's conditions), and ``policy.demos_per_quest``
   episodes of the teacher ``policy.teacher`` names (:mod:`pipeline.policy.teacher`: the
   knowledge-limited expert or the reader) replayed in
   :class:`pipeline.envs.household.env.HouseholdEnv`, the variants in turn. The teacher reads the
   variant's frozen system prompt, so what it knows is exactly what the prompt says. The
   first demo of each variant keeps the scene's names and makes no slip; the others
   rename the house (:func:`pipeline.policy.expert.draw_renaming`) and slip now and then.
3. :func:`render_demos`: every turn rendered by the ``llm`` agent's own code
   (:class:`pipeline.agents.llm.LLMAgent`: ``reset`` with the frozen prompt, ``messages``
   per observation, the memory dict updated from each answer by the agent's
   ``PromptOrganizer``), so the model is trained on the very prompts it will be given.

    memory = build_scene_memory(cfg, root, manifest, scenes)
    demos = play_demos(cfg, root, manifest, scenes, memory)
    turns = render_demos(cfg, demos)      # [RenderedTurn(messages, response, train, ...)]

Steps 1 and 2 take ``workers=`` (:func:`pipeline.policy.demo_workers.demo_pool`, the
stage's ``workers`` processes): the rule agent's tasks, each train quest and each chunk of
generated houses are jobs fixed by the config (:data:`RULE_TASKS_PER_JOB`,
:data:`HOUSES_PER_JOB`), every item seeded by its own identity (``crc_rng``, ``task_seed``,
the house index), merged in job order: any worker count gives the same demonstrations.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from omegaconf import OmegaConf

from pipeline import prompts
from pipeline.agents.llm import LLMAgent
from pipeline.core.conf_schema import ConditionKind, Config, GroundingConfig, HouseSizing
from pipeline.core.parallel import OrderedPool, Shared, partition
from pipeline.core.schemas import episodes_table, turns_table
from pipeline.core.seeding import crc_rng, task_seed
from pipeline.envs import fact_reader, scene_preferences, world_words
from pipeline.core.seeding import derive_seed
from pipeline.envs.household.env import HouseholdEnv, LogicHouseholdEnv
from pipeline.envs.household.generate import GeneratedHouse, GeneratedHouses, HouseSizes, layout_key
from pipeline.grounding import TEXT_JOINER
from pipeline.grounding.episodes import scene_groundings
from pipeline.conditions import memory_slot
from pipeline.memory import EpisodicStore
from pipeline.memory.build import build_store
from pipeline.policy.demo_workers import WorkerContext, demo_pool, ticks
from pipeline.policy.expert import DemoEpisode, draw_renaming, rename_obj, rename_pattern, rename_text
from pipeline.policy.teacher import make_teacher, teacher_episode
from pipeline.prompts import PromptOrganizer, extract_json_object
from pipeline.session.collection import make_factories
from pipeline.session.rollout import Task, format_episode_id, play, tasks_from_manifest


# The partition of the work into jobs (pipeline.policy.demo_workers): fixed here, never by the
# worker count; every item is seeded by its identity, so neither changes a byte of the output.
RULE_TASKS_PER_JOB = 4  # the rule agent's train tasks per job
HOUSES_PER_JOB = 16  # generated houses (demonstrations or drills) per job
HOUSE_INDICES_PER_JOB = 64  # house indices drawn per job (GeneratedHouses.house)


@dataclass
class SceneMemory:
    """Grounding and episodic store built from a rule agent's train episodes.

    Attributes:
        grounding: scene_id -> merged grounding Markdown (``""`` when the scene has none).
        store: an :class:`pipeline.memory.EpisodicStore` of those episodes.
        episodes, turns: the rule agent's episode and turn rows (empty when the memory was
            read back from ``data/demos``: :func:`pipeline.policy.demoset.load_demo_set`).
    """

    grounding: dict[str, str]
    store: EpisodicStore
    episodes: list[dict] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Variant:
    """What a demonstration's system prompt carries beyond the observation.

    ``grounding`` is the scene's grounding text (None: none, as for a held-out scene or
    the ``collect`` stage); ``block`` the injected advisory block (``""``: none) and
    ``source`` the advisory variant (``demos.advisory_variants``) that produced it.
    """

    name: str
    grounding: str | None
    block: str
    source: str = ""

    @property
    def bare(self) -> bool:
        return self.grounding is None and not self.block


class DemoKind(StrEnum):
    """What a demonstration is. Its id is the kind's :attr:`prefix` and a name
    (:meth:`Demo.of` writes it; :func:`demo_kind` reads the kind back from a stored id)."""

    quest = "quest"  # demo_<scene>_<quest>_<kk>: an expert episode on a train quest (play_demos)
    drill = "drill"  # drill_<scene>_<quest>_<kk>: a train quest's plan drill, its first turn (plan_drills)
    house = "house"  # gen_<house>: an expert episode in a generated house (generated_demos)
    house_drill = "house_drill"  # drill_gen_<unit>_<kk>: a generated house's plan drill (generated_demos)
    dagger = "dagger"  # dagger_<round>_<house>: the policy's own episode, the expert's labels (pipeline.policy.dagger)

    @property
    def prefix(self) -> str:
        """The start of the ids of this kind."""
        return _DEMO_PREFIXES[self]

    @property
    def is_drill(self) -> bool:
        """A plan drill: one first turn, trained with the other drills of its unit (:func:`training_unit`)."""
        return self in (DemoKind.drill, DemoKind.house_drill)


_DEMO_PREFIXES = {DemoKind.quest: "demo_", DemoKind.drill: "drill_", DemoKind.house: "gen_",
                  DemoKind.house_drill: "drill_gen_", DemoKind.dagger: "dagger_"}


def demo_kind(demo_id: str) -> DemoKind:
    """The kind of a stored demonstration id (``data/demos`` keeps ids, not kinds): the kind
    of the longest prefix it starts with.

    Raises:
        ValueError: an id of no kind.
    """
    for kind in sorted(DemoKind, key=lambda k: -len(k.prefix)):
        if demo_id.startswith(kind.prefix):
            return kind
    raise ValueError(f"demo id {demo_id!r} starts with none of {sorted(_DEMO_PREFIXES.values())}")


@dataclass
class Demo:
    """One demonstration episode: the quest, the prompt variant, the renaming, the turns, and
    what kind of demonstration it is (``demo_id`` starts with ``kind.prefix``)."""

    demo_id: str
    task: dict  # manifest row
    variant: Variant
    mapping: dict[str, str]
    episode: DemoEpisode
    index: int  # k-th demo of its quest (of its drill stream for a generated house's drill)
    kind: DemoKind

    @classmethod
    def of(cls, kind: DemoKind, name: str, task: dict, variant: Variant, mapping: dict[str, str],
           episode: DemoEpisode, index: int) -> Demo:
        """A demonstration of ``kind`` named ``name`` (``<scene>_<quest>_<kk>``, the house,
        ``<unit>_<kk>``): its id is ``kind.prefix + name``."""
        return cls(kind.prefix + name, task, variant, mapping, episode, index, kind)


@dataclass
class RenderedTurn:
    """One demonstration turn as the agent would send it to the model."""

    demo_id: str
    turn_index: int
    variant: str
    messages: list[dict]
    response: str
    train: bool


def _scene_prefs(scenes: Mapping[str, Any], row: Mapping[str, Any]) -> list[dict]:
    """The preference specs of a manifest row's quest (:func:`pipeline.envs.scene_preferences`)."""
    return scene_preferences(scenes[row["scene_id"]], list(row.get("preferences") or []))


def make_env(cfg: Config, root: Path, scenes: Mapping[str, Any], row: Mapping[str, Any]) -> HouseholdEnv:
    """The ``HouseholdEnv`` of a manifest row, built as the ``collect`` stage builds it
    (minus ``info["expert_plan"]``: the expert plans for itself)."""
    return HouseholdEnv(str(root / row["game_file"]), scene_id=row["scene_id"], quest_id=row["quest_id"],
                        objective=row["objective"], max_steps=cfg.env.max_steps, reward=cfg.env.reward,
                        preferences=_scene_prefs(scenes, row), compute_expert_plan=False)


@contextmanager
def _workers_or_inline(workers: OrderedPool | None, cfg: Config, root: Path, manifest: Sequence[Mapping[str, Any]],
                       scenes: Mapping[str, Any]) -> Iterator[OrderedPool]:
    """``workers``, or (None) every job in this process."""
    if workers is not None:
        yield workers
        return
    with demo_pool(cfg, root, manifest, scenes, workers=1) as pool:
        yield pool


# --------------------------------------------------------------------------- scene memory


def advisory_variant_names(cfg: Config, kind: ConditionKind) -> list[str]:
    """The names of the ``demos.advisory_variants`` whose memory block is of ``kind`` (a
    condition's :class:`~pipeline.core.conf_schema.ConditionKind`), in config order."""
    return [str(a.name) for a in cfg.demos.advisory_variants if str(a.kind) == str(kind)]


def rule_agent_config(cfg: Config) -> Config:
    """``cfg`` with the rule agent as the agent: ``policy.rule_agent`` with ``policy.rule_epsilon``."""
    pol = cfg.policy
    return OmegaConf.merge(cfg, {"agent": {"name": str(pol.rule_agent), "epsilon": pol.rule_epsilon}})


def rule_agent_episodes(cfg: Config, root: Path, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
                        *, progress: Callable[[int], None] | None = None,
                        workers: OrderedPool | None = None) -> tuple[list[dict], list[dict]]:
    """The rule agent (``policy.rule_agent`` with ``policy.rule_epsilon``) on every train quest,
    in chunks of :data:`RULE_TASKS_PER_JOB` tasks (``workers``: the processes; None: this one).

    Returns:
        ``(episodes, turns)``: the rows :func:`pipeline.session.rollout.play` records.
    """
    tasks = tasks_from_manifest(manifest, split="train", master_seed=cfg.seed)
    with _workers_or_inline(workers, cfg, root, manifest, scenes) as pool:
        records = [r for part in pool.map(_rule_agent_job, partition(tasks, RULE_TASKS_PER_JOB),
                                          progress=ticks(progress)) for r in part]
    return [r["episode"] for r in records], [t for r in records for t in r["turns"]]


def _rule_agent_job(ctx: WorkerContext, tasks: list[Task]) -> list[dict]:
    """The rule agent's records of some train tasks (each task seeded by its identity: any chunk, the same)."""
    cfg = ctx.cfg
    pol = cfg.policy
    make_env_, make_agent_, make_user_ = ctx.cached("rule_factories", lambda: make_factories(
        rule_agent_config(cfg), ctx.root, dict(ctx.scenes)))
    return play(tasks, make_env=make_env_, make_agent=make_agent_, make_user=make_user_, batch_size=1,
                agent_name=str(pol.rule_agent), preference_in_success=cfg.user.preference_in_success,
                unknown_feedback=str(cfg.grounding.unknown_type))


def build_scene_memory(cfg: Config, root: Path, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
                       *, progress: Callable[[int], None] | None = None,
                       workers: OrderedPool | None = None) -> SceneMemory:
    """Play the train quests with the rule agent (in ``workers``) and build grounding + store from them."""
    episodes, turns = rule_agent_episodes(cfg, root, manifest, scenes, progress=progress, workers=workers)
    return memory_from_episodes(cfg, episodes, turns)


def memory_from_episodes(cfg: Config, episodes: list[dict], turns: list[dict]) -> SceneMemory:
    """What played episodes leave for the next prompts, as the experiment's stages leave it from
    ``collect``'s: per scene, the ``ground`` + ``merge`` stages' grounding text
    (:func:`pipeline.grounding.episodes.scene_groundings`), and the ``store`` stage's store
    (:func:`pipeline.memory.build.build_store`, same reader and splits)."""
    store = build_store(episodes_table(episodes), turns_table(turns), reader=fact_reader(cfg),
                        splits=list(cfg.memory.store_splits) or None, config_hash=None, tie_seed=cfg.seed)
    return SceneMemory(grounding=scene_groundings(cfg.grounding, episodes, turns), store=store, episodes=episodes,
                       turns=turns)


class _Progress:
    """``progress.update(n)`` for :func:`pipeline.session.rollout.play` over a plain callback."""

    def __init__(self, fn: Callable[[int], None] | None):
        self.fn = fn

    def update(self, n: int = 1) -> None:
        if self.fn is not None:
            self.fn(n)


# --------------------------------------------------------------------------- prompts


def grounding_text(grounding_cfg: GroundingConfig, memory: SceneMemory, scene_id: str,
                   organizer: PromptOrganizer) -> str | None:
    """``$grounding_content`` of a task, as the ``render`` stage assembles it (None: nothing).

    The scene's merged grounding, then the merge of ``grounding.files`` when set, joined
    like the merged files are; None when ``grounding.use_in_prompt`` is off or both are empty.
    """
    if not grounding_cfg.use_in_prompt:
        return None
    parts = [memory.grounding.get(scene_id, "")]
    if organizer.grounding_file_path:
        configured = organizer.grounding_content()
        parts.append("" if configured == organizer.empty_grounding_text else configured)
    parts = [p.strip() for p in parts if p and p.strip()]
    return TEXT_JOINER.join(parts) if parts else None


def freeze_prompt(organizer: PromptOrganizer, objective: str, scene_id: str, grounding: str | None, block: str) -> str:
    """A variant's per-episode system prompt, assembled by :func:`pipeline.prompts.task_prompt`
    (as ``pipeline.conditions.Renderer.prompt`` assembles an eval prompt), with ``grounding``
    as its text.

    With neither grounding nor block it is the prompt the ``llm`` agent renders for itself
    in ``collect`` (the default grounding files, no advisory slot); a block without
    grounding shows the empty grounding text, as a held-out scene's eval prompt does.
    """
    if grounding is None and block:
        grounding = organizer.empty_grounding_text
    # Looked up on the package at call time, so a test can see that both callers use it.
    return prompts.task_prompt(organizer, objective, scene_id, grounding, block).text


def prompt_variants(cfg: Config, memory: SceneMemory, row: Mapping[str, Any],
                    organizer: PromptOrganizer) -> list[Variant]:
    """The prompt variants of a task: {no grounding, scene grounding} x {no block, each
    distinct non-empty block of ``demos.advisory_variants``, in that order}.

    Only the policy's own config is read (never ``cfg.condition``): the demonstrations do
    not change when the experiment's list of conditions does.
    """
    groundings: list[tuple[str, str | None]] = [("plain", None)]
    text = grounding_text(cfg.grounding, memory, str(row["scene_id"]), organizer)
    if text is not None:
        groundings.append(("grounded", text))
    blocks: list[tuple[str, str]] = [("", "")]
    for adv in cfg.demos.advisory_variants:
        slot = memory_slot(memory.store, dict(row), adv, cfg.memory, rng=cfg.seed, name=str(adv.name),
                           words=world_words(cfg), facts=fact_reader(cfg))
        block = slot.injected_block_text
        if block and block not in [b for _, b in blocks]:
            blocks.append((str(adv.name), block))
    out = []
    for gname, gtext in groundings:
        for source, block in blocks:
            out.append(Variant(f"{gname}+{source}" if source else gname, gtext, block, source))
    return out


# --------------------------------------------------------------------------- demonstrations


def house_variants(cfg: Config, memory: SceneMemory, organizer: PromptOrganizer, house: GeneratedHouse,
                   text: str | None) -> list[Variant]:
    """The house's prompt variants (:func:`pipeline.policy.demos.prompt_variants`) under its
    grounding ``text`` (only the grounded ones then, as ``house_demo`` does), or all of them
    without one (None)."""
    variants = prompt_variants(cfg, replace(memory, grounding={house.scene_id: text}) if text else memory,
                               house.row(0), organizer)
    return [v for v in variants if v.grounding is not None] if text else variants


def demo_renaming(spec: Mapping[str, Any], objective: str, eval_objectives: set[str], rng: Any) -> dict[str, str]:
    """A renaming of the house (:func:`pipeline.policy.expert.draw_renaming`) under which the
    objective does not read like an eval quest's (``{}`` after 20 tries)."""
    for _ in range(20):  # a renamed train quest must not read like an eval quest
        mapping = draw_renaming(spec, rng)
        if rename_text(objective, mapping) not in eval_objectives:
            return mapping
    return {}


def play_demos(cfg: Config, root: Path, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
               memory: SceneMemory, *, progress: Callable[[int], None] | None = None,
               workers: OrderedPool | None = None) -> list[Demo]:
    """Expert episodes on every train quest and prompt variant (see the module docstring),
    then the generated houses' (:func:`generated_demos`); each train quest's and each chunk
    of houses' in one job of ``workers`` (None: this process), merged in that order."""
    rows = sorted((r for r in manifest if r["split"] == "train"), key=lambda r: (r["scene_id"], r["quest_id"]))
    with _workers_or_inline(workers, cfg, root, manifest, scenes) as pool:
        shared = pool.share((_prompt_memory(memory), PromptOrganizer.from_config(cfg)))
        demos = [d for part in pool.map(_quest_job, [(shared, dict(r)) for r in rows], progress=ticks(progress))
                 for d in part]
        demos += _generated_demos(pool, shared, progress=progress)
    return demos


def quest_demos(cfg: Config, root: Path, scenes: Mapping[str, Any], row: Mapping[str, Any], memory: SceneMemory,
                organizer: PromptOrganizer, eval_objectives: set[str]) -> list[Demo]:
    """A train quest's ``policy.demos_per_quest`` demonstrations, then its plan drills (:func:`plan_drills`)."""
    pol = cfg.policy
    variants = prompt_variants(cfg, memory, row, organizer)
    frozen = [freeze_prompt(organizer, row["objective"], row["scene_id"], v.grounding, v.block) for v in variants]
    demos: list[Demo] = []
    for k in range(pol.demos_per_quest):
        # One demo per variant with the scene's own names and no slip, then renamed
        # houses (other names, places and directions) with slips, variants in turn.
        vi = k % len(variants)
        rng = crc_rng(cfg.seed, "demo", row["scene_id"], row["quest_id"], k)
        mapping: dict[str, str] = {}
        if k >= len(variants):
            mapping = demo_renaming(scenes[row["scene_id"]], row["objective"], eval_objectives, rng)
        episode = play_teacher(cfg, root, scenes, row, frozen[vi], rng=rng,
                              slip_prob=pol.slip_prob if mapping else 0.0)
        demos.append(Demo.of(DemoKind.quest, f"{row['scene_id']}_{row['quest_id']}_{k:02d}", dict(row),
                             variants[vi], mapping, episode, k))
    return demos + plan_drills(cfg, root, scenes, row, variants, frozen, eval_objectives)


def _eval_objectives(manifest: Sequence[Mapping[str, Any]]) -> set[str]:
    return {r["objective"] for r in manifest if r["split"] != "train"}


def _quest_job(ctx: WorkerContext, job: tuple[Shared, dict]) -> list[Demo]:
    shared, row = job
    memory, organizer = ctx.get(shared)
    return quest_demos(ctx.cfg, ctx.root, ctx.scenes, row, memory, organizer,
                       ctx.cached("eval_objectives", lambda: _eval_objectives(ctx.manifest)))


def training_houses(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any], *,
                    heldout: bool = False, quests_per_house: int = 1) -> GeneratedHouses:
    """The generated houses the policy trains on (``heldout``: the disjoint stream its
    in-context score is measured on), never an eval scene's layout or an eval objective.
    A house's first quest does not depend on ``quests_per_house`` (the later ones are drawn after it)."""
    return house_stream(cfg, manifest, scenes, derive_seed(cfg.seed, "heldout") if heldout else cfg.seed,
                        quests_per_house)


def house_stream(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any], seed: int,
                 quests: int) -> GeneratedHouses:
    """Generated houses of ``quests`` quests drawn from ``seed``, never an eval scene's layout or an
    eval objective: every stream of the model's houses (:func:`training_houses`, DAgger's rounds,
    the statement drills, the studies' arms), each from a seed of its own."""
    eval_split = [r for r in manifest if r["split"] != "train"]
    return GeneratedHouses(house_sizes(cfg), seed=seed, base=cfg.env, quests_per_house=quests,
                           preferences_per_scene=cfg.user.preferences_per_scene,
                           exclude=[layout_key(scenes[s]) for s in sorted({r["scene_id"] for r in eval_split})
                                    if s in scenes],
                           exclude_objectives={r["objective"] for r in eval_split})


def house_sizes(cfg: Config) -> HouseSizes:
    """What the recipe's generated houses are sized by (``policy.house_sizes``): ``HouseSizes``' ranges, or every
    house at ``cfg.env``'s counts (the eval's scenes' sizes; names still drawn up to ``max_index``, and the draws
    consume the same randomness)."""
    if cfg.policy.house_sizes != HouseSizing.env:
        return HouseSizes()
    env = cfg.env
    return HouseSizes(**{field: (int(env[key]), int(env[key])) for field, key in (
        ("rooms", "rooms_per_scene"), ("containers", "containers_per_scene"), ("locked", "locked_containers"),
        ("supporters", "supporters_per_scene"), ("objects", "objects_per_scene"))})


def house_env(cfg: Config, house: GeneratedHouse, k: int = 0) -> LogicHouseholdEnv:
    """Quest ``k`` of a generated house on TextWorld's logic engine (no compiling)."""
    row = house.row(k)
    return LogicHouseholdEnv(house.game(k), scene_id=house.scene_id, quest_id=row["quest_id"],
                             objective=row["objective"], max_steps=cfg.env.max_steps, reward=cfg.env.reward,
                             preferences=house.spec["preferences"], compute_expert_plan=False)


def house_grounding(rule_cfg: Config, house: GeneratedHouse, scenes: dict[str, Any]) -> str | None:
    """A generated house's grounding: what the simulated user taught the rule agent
    (``rule_cfg``: :func:`rule_agent_config`, made once by the caller) on the house's
    *second* quest, through the ``ground`` + ``merge`` library (:func:`scene_groundings`),
    as the train quests of a seen scene give its grounding to the eval prompts: true of
    this house, and about another quest than the one demonstrated. None: the house has one
    quest, or the episode drew no feedback.

    ``scenes`` must hold the house's spec (the simulated user reads the scene)."""
    if len(house.quests) < 2:
        return None
    pol = rule_cfg.policy
    row = house.row(1)
    _, make_agent, make_user = make_factories(rule_cfg, Path("."), scenes)
    task = Task(episode_id=format_episode_id("train", house.scene_id, row["quest_id"], 0),
                scene_id=house.scene_id, quest_id=row["quest_id"], split="train", objective=row["objective"],
                game_file="", expert_plan=list(row["expert_plan"]), preferences=list(row["preferences"]),
                seed=task_seed(rule_cfg.seed, house.scene_id, row["quest_id"], 0))
    records = play([task], make_env=lambda _t: house_env(rule_cfg, house, 1), make_agent=make_agent,
                   make_user=make_user, agent_name=str(pol.rule_agent),
                   preference_in_success=rule_cfg.user.preference_in_success,
                   unknown_feedback=str(rule_cfg.grounding.unknown_type))
    text = scene_groundings(rule_cfg.grounding, [r["episode"] for r in records],
                            [t for r in records for t in r["turns"]]).get(house.scene_id, "")
    return text or None


def generated_demos(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
                    memory: SceneMemory, organizer: PromptOrganizer, *,
                    progress: Callable[[int], None] | None = None,
                    workers: OrderedPool | None = None) -> list[Demo]:
    """One expert demonstration in each of ``policy.generated_houses`` generated houses, and
    ``policy.generated_drills`` drills in further houses (:func:`house_demo`), in chunks of
    :data:`HOUSES_PER_JOB` houses in ``workers`` (None: this process), merged in house order."""
    with _workers_or_inline(workers, cfg, Path("."), manifest, scenes) as pool:
        return _generated_demos(pool, pool.share((_prompt_memory(memory), organizer)), progress=progress)


def _prompt_memory(memory: SceneMemory) -> SceneMemory:
    """What the prompts read of ``memory`` (grounding and store), for the workers: without the
    rule agent's episode and turn rows."""
    return replace(memory, episodes=[], turns=[])


def _generated_demos(pool: OrderedPool, shared: Shared, *,
                     progress: Callable[[int], None] | None = None) -> list[Demo]:
    """:func:`generated_demos` on ``pool``, ``shared`` holding ``(memory, organizer)``."""
    pol = pool.context.cfg.policy
    n = max(0, pol.generated_houses) + max(0, pol.generated_drills)
    if n == 0:
        return []
    # two quests a house: the first is demonstrated, the second (where the house has one) is
    # what the rule agent plays for the house's grounding; the first is the same either way
    houses = _draw_houses(pool, n)
    jobs = [(shared, part) for part in partition(list(enumerate(houses)), HOUSES_PER_JOB)]
    parts = pool.map(_generated_job, jobs, progress=ticks(progress, lambda ds: sum(d is not None for d in ds)))
    return [d for part in parts for d in part if d is not None]


def _draw_houses(pool: OrderedPool, n: int) -> list[GeneratedHouse]:
    """``training_houses(..., quests_per_house=2).houses(n)``, drawn in chunks of house indices on the
    workers: the first ``n`` houses not skipped (each a pure function of its index).

    Raises:
        ValueError: as :meth:`GeneratedHouses.houses`, too many houses were skipped.
    """
    limit = 4 * n + 100  # GeneratedHouses.houses gives up at index 4n+100
    out: list[GeneratedHouse] = []
    start = 0
    while len(out) < n:
        if start >= limit:
            raise ValueError(f"only {len(out)} of {n} generated houses could be drawn (too many skipped)")
        stop = min(limit, start + n - len(out))
        chunks = [(i, min(i + HOUSE_INDICES_PER_JOB, stop)) for i in range(start, stop, HOUSE_INDICES_PER_JOB)]
        out += [h for part in pool.map(_houses_job, chunks) for h in part if h is not None]
        start = stop
    return out[:n]


def _houses_job(ctx: WorkerContext, span: tuple[int, int]) -> list[GeneratedHouse | None]:
    houses = ctx.cached("training_houses", lambda: training_houses(ctx.cfg, ctx.manifest, ctx.scenes,
                                                                   quests_per_house=2))
    return [houses.house(i) for i in range(*span)]


def _generated_job(ctx: WorkerContext, job: tuple[Shared, list[tuple[int, GeneratedHouse]]]) -> list[Demo | None]:
    shared, items = job
    memory, organizer = ctx.get(shared)
    rule_cfg = ctx.cached("rule_cfg", lambda: rule_agent_config(ctx.cfg))
    return [house_demo(ctx.cfg, ctx.scenes, memory, organizer, house, k, rule_cfg=rule_cfg) for k, house in items]


def house_demo(cfg: Config, scenes: Mapping[str, Any], memory: SceneMemory, organizer: PromptOrganizer,
               house: GeneratedHouse, k: int, *, rule_cfg: Config | None = None) -> Demo | None:
    """The demonstration of the ``k``-th generated house: an expert episode for ``k <
    policy.generated_houses``, else a drill (None: no ``oracle`` advisory variant to drill on).

    The prompt variants are the train quests' (no advisory / each of
    ``demos.advisory_variants``' blocks, built by the memory's own :func:`build_memory_slot`
    from the scene store), in turn. A share ``policy.generated_grounding`` of the houses
    (drawn per house from the seed) also carries the house's own grounding
    (:func:`house_grounding`: the user's feedback to the rule agent on another quest of the
    house), as a seen scene's eval prompts carry what its train quests taught; the others
    have none, as a held-out scene's. In a house never seen before, with names drawn per
    house, the objective, the observations, the grounding and an advisory that is true of
    this house are the only ways to predict the next action: the retrieved and placebo
    advisories speak of other houses, and the oracle's verified plan is this quest's (see
    :mod:`pipeline.envs.household.generate`). Everything random is drawn from the house's
    own seeds: the demonstration does not depend on which process makes it, or after what.
    """
    pol = cfg.policy
    n_houses = max(0, pol.generated_houses)
    oracle_names = set(advisory_variant_names(cfg, ConditionKind.oracle))
    rule_cfg = rule_cfg if rule_cfg is not None else rule_agent_config(cfg)
    row = house.row(0)
    all_scenes = {**scenes, house.scene_id: house.spec}
    grounded = crc_rng(cfg.seed, "generated-grounding", house.scene_id).random() < pol.generated_grounding
    text = house_grounding(rule_cfg, house, all_scenes) if grounded else None
    house_memory = replace(memory, grounding={house.scene_id: text}) if text else memory
    variants = prompt_variants(cfg, house_memory, row, organizer)
    if text:  # the prompts of a grounded house carry its grounding, as a seen scene's eval prompts do
        variants = [x for x in variants if x.grounding is not None]
    drill = k >= n_houses
    if drill:  # the oracle's first turn: copy the first step, keep the rest as the plan
        v = next((x for x in variants if x.source in oracle_names), None)
        if v is None:
            return None
    else:
        v = variants[int(house.scene_id.rsplit("_", 1)[1]) % len(variants)]
    prompt = freeze_prompt(organizer, row["objective"], row["scene_id"], v.grounding, v.block)
    rng = crc_rng(cfg.seed, "generated", house.scene_id)
    episode = play_teacher(cfg, Path("."), all_scenes, row, prompt, rng=rng,
                          slip_prob=0.0 if drill else pol.slip_prob, env=house_env(cfg, house))
    if drill:
        j = k - n_houses
        first = DemoEpisode(episode.turns[:1], episode.won, episode.preferences_ok, episode.searched_steps)
        # eight drills make one training unit (training_unit: the part before the last "_")
        return Demo.of(DemoKind.house_drill, f"{j // 8:05d}_{j % 8:02d}", row, v, {}, first, j)
    return Demo.of(DemoKind.house, house.scene_id, row, v, {}, episode, 0)


def play_teacher(cfg: Config, root: Path, scenes: Mapping[str, Any], row: Mapping[str, Any], prompt: str, *,
                 rng: Any, slip_prob: float, env: Any = None) -> DemoEpisode:
    """One :func:`pipeline.policy.teacher.teacher_episode` of ``row``'s quest by ``policy.teacher``,
    knowing what ``prompt`` (a frozen system prompt) tells, in a freshly reset env (the compiled
    game's, or ``env``: a generated house on the logic engine)."""
    env = env if env is not None else make_env(cfg, root, scenes, row)
    try:
        env.reset()
        teacher = make_teacher(cfg.policy.teacher, env, prompt, str(row["objective"]), _scene_prefs(scenes, row),
                               facts=fact_reader(cfg), explore_cap=cfg.policy.explore_cap)
        return teacher_episode(env, teacher, slip_prob=slip_prob, rng=rng)
    finally:
        env.close()


def plan_drills(cfg: Config, root: Path, scenes: Mapping[str, Any], row: Mapping[str, Any],
                variants: Sequence[Variant], frozen: Sequence[str], eval_objectives: set[str], *,
                progress: Callable[[int], None] | None = None) -> list[Demo]:
    """``policy.plan_drills`` first turns of ``row`` under its ``oracle`` advisory variants.

    The turn where the expert, reading a verified plan, takes its first step and writes
    the rest into its memory is the one a small model fails at: in a full demonstration
    it is one turn in eight, and the train quests are few, so the model learns their plans
    by heart instead of copying the one in its prompt. Each drill is that turn in a newly
    renamed house (other names, places, directions), so the plan to copy is new every
    time. The drills of a quest are one training unit (:func:`training_unit`).
    """
    n = cfg.policy.plan_drills
    oracle_names = set(advisory_variant_names(cfg, ConditionKind.oracle))
    picks = [i for i, v in enumerate(variants) if v.source in oracle_names]
    if n <= 0 or not picks:
        return []
    out = []
    for k in range(n):
        vi = picks[k % len(picks)]
        rng = crc_rng(cfg.seed, "drill", row["scene_id"], row["quest_id"], k)
        mapping = demo_renaming(scenes[row["scene_id"]], row["objective"], eval_objectives, rng)
        episode = play_teacher(cfg, root, scenes, row, frozen[vi], rng=rng, slip_prob=0.0)
        first = DemoEpisode(episode.turns[:1], episode.won, episode.preferences_ok, episode.searched_steps)
        out.append(Demo.of(DemoKind.drill, f"{row['scene_id']}_{row['quest_id']}_{k:02d}", dict(row),
                           variants[vi], mapping, first, k))
        if progress is not None:
            progress(1)
    return out


def training_unit(demo_id: str) -> str:
    """The training unit a demonstration's turns belong to: its own episode, or for plan
    drills (:func:`plan_drills`) all the drills of its quest (one optimizer step runs them
    together, as it runs an episode's turns): the id without its last ``_kk``."""
    return demo_id.rsplit("_", 1)[0] if demo_kind(demo_id).is_drill else demo_id


class NoBackend:
    """Stands in for a model when the agent is only used to build prompts (demos, the probe)."""

    name = "none"

    def generate(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise RuntimeError("the demonstrations and the probe only build prompts: nothing generates")


def render_demos(cfg: Config, demos: Sequence[Demo]) -> list[RenderedTurn]:
    """Every demonstration turn as the ``llm`` agent's chat messages and the expert's answer.

    The agent is reset with the demonstration's frozen prompt (None for a bare variant, so
    the agent renders ``prompts.system_template`` itself, as in ``collect``); after each
    turn its memory dict is updated from the answer exactly as ``LLMAgent.finish_turn``
    does. Renamed demonstrations rename the objective, grounding, block, observations and
    answers consistently before anything is rendered.
    """
    agent = LLMAgent(cfg, backend=NoBackend())
    organizer = PromptOrganizer.from_config(cfg)
    out: list[RenderedTurn] = []
    for demo in demos:
        m = demo.mapping
        pat = rename_pattern(m)
        task = demo.task
        objective = rename_text(task["objective"], m, pat)
        system_prompt = None
        if not demo.variant.bare:
            g = demo.variant.grounding
            system_prompt = freeze_prompt(organizer, objective, task["scene_id"],
                                          rename_text(g, m, pat) if g is not None else None,
                                          rename_text(demo.variant.block, m, pat))
        agent.reset({"episode_id": demo.demo_id, "scene_id": task["scene_id"], "quest_id": task["quest_id"],
                     "objective": objective, "seed": 0, "system_prompt": system_prompt})
        for i, turn in enumerate(demo.episode.turns):
            obs = rename_obj(turn.obs, m, pat)
            response = rename_text(turn.response, m, pat)
            out.append(RenderedTurn(demo.demo_id, i, demo.variant.name, agent.messages(obs), response, turn.train))
            parsed = extract_json_object(response)
            if parsed is not None:
                agent.organizer.update_memory_from_response(parsed)
            agent.turn += 1
    return out


def demo_stats(demos: Sequence[Demo], turns: Sequence[RenderedTurn]) -> dict:
    """Counts for ``metrics/policy.json``: episodes, turns, expert success per variant kind."""
    drills = [d for d in demos if d.kind.is_drill]
    demos = [d for d in demos if not d.kind.is_drill]
    generated = sum(d.kind == DemoKind.house for d in demos)
    by: dict[str, list[Demo]] = {}
    for d in demos:
        by.setdefault(d.variant.name.split("+")[0] + ("+memory" if d.variant.block else ""), []).append(d)

    def rate(ds: list[Demo], f: Callable[[Demo], bool]) -> float:
        return round(sum(map(f, ds)) / len(ds), 6) if ds else 0.0

    return {
        "episodes": len(demos),
        "turns": len(turns),
        "train_turns": sum(t.train for t in turns),
        "renamed_episodes": sum(bool(d.mapping) for d in demos),
        "plan_drills": len(drills),
        "generated_houses": generated,
        "generated_drills": sum(d.kind == DemoKind.house_drill for d in drills),
        "slips": sum(not t.train for t in turns),
        "by_variant": {k: {"episodes": len(v), "expert_won": rate(v, lambda d: d.episode.won),
                           "expert_success": rate(v, lambda d: d.episode.won and d.episode.preferences_ok),
                           "mean_turns": round(sum(len(d.episode.turns) for d in v) / len(v), 3),
                           "mean_search_steps": round(sum(d.episode.searched_steps for d in v) / len(v), 3)}
                       for k, v in sorted(by.items())},
    }


def demo_rows(turns: Sequence[RenderedTurn], prompts: Sequence[str]) -> list[dict]:
    """Rows of ``data/policy/demos.parquet``: what the model was trained on, verbatim."""
    return [{"demo_id": t.demo_id, "turn_index": t.turn_index, "variant": t.variant, "prompt": p,
             "response": t.response, "train": t.train} for t, p in zip(turns, prompts)]
