"""The collection loop shared by ``collect`` and ``evaluate``: play tasks, record turns.

A plain function over narrow interfaces (``env.reset/step``, ``agent.act``,
``user.step_feedback``). The tasks are cut into a fixed partition of batches
(:func:`pipeline.core.parallel.partition`: consecutive runs of ``batch_size`` tasks, a function of the task list
and the batch size only), played one batch after the other; agents that can generate for
several observations in one call (the llm agent) expose ``act_many(agents, observations)``
and get one batched call per step across the batch's running episodes, finished episodes
dropping out. Every episode's randomness comes from its own task seed.

Which episodes share a batch moves a model's floating-point results (padding, the shapes
of the matrix products, the prompt cache's contents): so every turn is computed in the
same batch, from the same state, whether the run was interrupted or not. Finished
episodes are checkpointed one file per episode as they complete; with
``whole_batches=True`` (a model that plays in batches) a rerun loads a batch only when
all its episodes are checkpointed and otherwise replays it whole, and ``on_batch_start``
(the prompt cache's reset) runs before every batch, so a resumed run writes the same
bytes as an uninterrupted one, tensors included.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from pipeline.agents.base import AgentStep
from pipeline.core.io import atomic_write_text, read_json, safe_name
from pipeline.core.parallel import partition
from pipeline.core.schemas import FEEDBACK_TYPES, EpisodeRecord, TurnRecord, canonical_json
from pipeline.core.seeding import task_seed
from pipeline.grounding.feedback import classify_feedback_lines

TENSOR_KEYS = ("generated_ids", "action_token_mask", "logprobs")


def format_episode_id(split: str, scene_id: str, quest_id: str, k: int) -> str:
    """The id of the ``k``-th episode of a quest in ``split`` (``ep_train_scene_0_q1_0``): the
    one place it is spelled, for the manifest's tasks and the policy's rule-agent episodes."""
    return f"ep_{split}_{scene_id}_{quest_id}_{k}"


@dataclass
class Task:
    """One episode to play: a quest of a scene, with its own seed."""

    episode_id: str
    scene_id: str
    quest_id: str
    split: str
    objective: str
    game_file: str
    expert_plan: list[str]
    preferences: list[str]
    seed: int
    condition: str = ""
    system_prompt: str | None = None
    metadata: dict = field(default_factory=dict)


def tasks_from_manifest(rows: Iterable[dict], *, split: str, master_seed: int, repeats: int = 1,
                        condition: str = "", source: str = "the games manifest (manifest.parquet)") -> list[Task]:
    """Tasks for every quest of ``split``; seeds ignore ``condition`` so conditions are paired.

    A scene or quest id that cannot be a file name (``../x``) is an
    :class:`~pipeline.core.io.ArtifactError` naming ``source`` and the row: the episode id made
    of them names checkpoint and tensor files.
    """
    tasks = []
    for i, row in enumerate(rows):
        if row["split"] != split:
            continue
        for key in ("scene_id", "quest_id"):
            safe_name(row[key], f"{source}, row {i}", key)
        for k in range(repeats):
            tasks.append(Task(
                episode_id=format_episode_id(split, row["scene_id"], row["quest_id"], k),
                scene_id=row["scene_id"], quest_id=row["quest_id"], split=split,
                objective=row["objective"], game_file=row["game_file"],
                expert_plan=list(row["expert_plan"]), preferences=list(row["preferences"] or []),
                seed=task_seed(master_seed, row["scene_id"], row["quest_id"], k),
                condition=condition,
            ))
    return sorted(tasks, key=lambda t: t.episode_id)


class Checkpoints:
    """One JSON (+ optional .pt) per finished episode under a config-hash-keyed folder."""

    def __init__(self, root: Path | None):
        self.root = root  # made by the first save: a run that fails before any episode leaves no empty folder

    def path(self, episode_id: str) -> Path:
        assert self.root is not None
        return self.root / f"{safe_name(episode_id, self.root, 'episode_id')}.json"

    def load(self, episode_id: str) -> dict | None:
        """The checkpointed record of ``episode_id``, or ``None`` (then it is played again).

        A file that is not a record of this episode (corrupt, edited, another episode's)
        is ignored with a warning: a checkpoint never costs more than replaying it.
        """
        if self.root is None or not self.path(episode_id).exists():
            return None
        try:
            rec = read_json(self.path(episode_id))
        except Exception as exc:  # an unreadable checkpoint is simply redone
            print(f"warning: ignoring checkpoint {self.path(episode_id)} ({exc}); the episode is played again",
                  file=sys.stderr)
            return None
        ok = (isinstance(rec, dict) and isinstance(rec.get("episode"), dict)
              and rec["episode"].get("episode_id") == episode_id
              and isinstance(rec.get("turns"), list) and isinstance(rec.get("tensors"), list)
              and all(isinstance(t, dict) and t.get("episode_id") == episode_id for t in rec["turns"]))
        if not ok:
            print(f"warning: ignoring checkpoint {self.path(episode_id)} (not a finished-episode record of "
                  f"{episode_id}); the episode is played again", file=sys.stderr)
            return None
        return rec

    def save(self, episode_id: str, record: dict) -> None:
        if self.root is not None:
            atomic_write_text(self.path(episode_id), json.dumps(record, ensure_ascii=False, sort_keys=True))


def _feedback_columns(lines: list[str], unknown: str = "keep") -> dict:
    by_type = classify_feedback_lines(lines, unknown=unknown) if lines else {}
    return {f"feedback_{t}": by_type.get(t) for t in FEEDBACK_TYPES}


def _turn_row(task: Task, turn_index: int, obs: dict, step: AgentStep, info: dict, reward: float, done: bool,
              fb_lines: list[str], status: str, unknown: str) -> tuple[dict, dict | None]:
    """The turn's :class:`~pipeline.core.schemas.TurnRecord` (as a row) and its tensors, if any."""
    turn = step.model
    gen = turn.generation if turn is not None else None
    prompt = gen.prompt if gen is not None else None
    record = TurnRecord(
        episode_id=task.episode_id,
        turn_index=turn_index,
        observation=canonical_json(obs),
        prompt_hash=hashlib.sha256(prompt.encode()).hexdigest() if prompt is not None else None,
        prompt=prompt,
        generated_text=step.generated_text,
        reasoning=step.reasoning,
        action=canonical_json(step.action),
        command=info.get("command"),
        action_valid=bool(info.get("valid", False)) and (turn is None or turn.action_valid),
        env_feedback=info.get("env_feedback", ""),
        reward=float(reward),
        changed=bool(info.get("changed", False)),
        repeated=bool(info.get("repeated", False)),
        done=bool(done),
        won=bool(info.get("won", False)),
        status=status,
        feedback_lines=list(fb_lines),
        **_feedback_columns(fb_lines, unknown),
        memory=canonical_json(turn.memory) if turn is not None and turn.memory is not None else None,
        prompt_tokens=gen.prompt_tokens if gen is not None else None,
        generated_tokens=gen.generated_tokens if gen is not None else None,
        generated_ids_length=len(gen.generated_ids) if gen is not None and gen.generated_ids is not None else None,
        action_token_start_index=gen.action_token_start_index if gen is not None else None,
        action_token_end_index=gen.action_token_end_index if gen is not None else None,
        tracking_method=gen.tracking_method if gen is not None else None,
        stop_reason=gen.stop_reason if gen is not None else None,
        # Free decoding is recorded as null: the column says which constraint fixed the action.
        decoding=gen.decoding if gen is not None and gen.decoding != "free" else None,
        action_scores=canonical_json(turn.action_scores) if turn is not None and turn.action_scores is not None
        else None,
    )
    tensors = None
    if gen is not None and gen.generated_ids is not None:
        tensors = {"turn_index": turn_index, **{k: getattr(gen, k) for k in TENSOR_KEYS if getattr(gen, k) is not None}}
    return record.row(), tensors


@dataclass
class _Slot:
    task: Task
    env: Any
    agent: Any
    user: Any
    obs: dict
    first_obs: dict
    turns: list = field(default_factory=list)
    tensors: list = field(default_factory=list)
    total_reward: float = 0.0


def _start_slot(task: Task, make_env: Callable[[Task], Any], make_agent: Callable[[Task], Any],
                make_user: Callable[[Task], Any]) -> _Slot:
    """Build the task's environment, agent and user; reset the agent, then the environment."""
    env = make_env(task)
    agent = make_agent(task)
    user = make_user(task)
    agent.reset({"episode_id": task.episode_id, "scene_id": task.scene_id, "quest_id": task.quest_id,
                 "objective": task.objective, "seed": task.seed, "system_prompt": task.system_prompt})
    obs = env.reset()
    return _Slot(task=task, env=env, agent=agent, user=user, obs=obs, first_obs=obs)


def _act_all(active: list[_Slot]) -> list:
    """One step of every running episode: one batched ``act_many`` call when the agent has it."""
    observations = [s.obs for s in active]
    act_many = getattr(type(active[0].agent), "act_many", None)
    if act_many is not None and len(active) > 1:
        return act_many([s.agent for s in active], observations)
    return [s.agent.act(o) for s, o in zip(active, observations)]


def _take_step(slot: _Slot, step: Any, unknown_feedback: str) -> tuple[bool, dict]:
    """Apply ``step`` to the slot's environment, ask the user, record the turn; ``(done, info)``."""
    obs_before = slot.obs
    obs, reward, done, info = slot.env.step(step.action)
    fb = slot.user.step_feedback(len(slot.turns) + 1, obs_before, step.action, info)
    row, tens = _turn_row(slot.task, len(slot.turns), obs_before, step, info, reward, done,
                          fb.lines, fb.status, unknown_feedback)
    slot.turns.append(row)
    if tens is not None:
        slot.tensors.append(tens)
    slot.obs = obs
    return done, info


def _episode_record(slot: _Slot, info: dict, *, agent_name: str, model_name: str, preference_in_success: bool,
                    unknown_feedback: str) -> dict:
    """The finished episode's record: the user's end feedback joins its last turn."""
    pref_ok, end_lines = slot.user.end_feedback(info)
    if slot.turns and end_lines:
        last = slot.turns[-1]
        last["feedback_lines"] = last["feedback_lines"] + list(end_lines)
        last.update(_feedback_columns(last["feedback_lines"], unknown_feedback))
    t = slot.task
    won = bool(info.get("won", False))
    ep = EpisodeRecord(
        episode_id=t.episode_id, scene_id=t.scene_id, quest_id=t.quest_id, split=t.split,
        condition=t.condition, objective=t.objective, question=t.objective,
        choices=list(slot.first_obs.get("admissible_commands", [])),
        ground_truth=" ; ".join(t.expert_plan),
        final_answer=slot.turns[-1]["command"] or "" if slot.turns else "",
        final_reward=float(sum(x["reward"] for x in slot.turns)),
        won=won, preferences_ok=bool(pref_ok),
        is_correct=won and (bool(pref_ok) or not preference_in_success),
        num_turns=len(slot.turns),
        num_invalid=sum(not x["action_valid"] for x in slot.turns),
        num_repeated=sum(bool(x["repeated"]) for x in slot.turns),
        prompt_tokens=sum(x["prompt_tokens"] or 0 for x in slot.turns),
        generated_tokens=sum(x["generated_tokens"] or 0 for x in slot.turns),
        agent=agent_name, model=model_name, seed=t.seed,
        metadata=canonical_json({"lost": bool(info.get("lost", False)), **t.metadata}),
    )
    return {"episode": ep.row(), "turns": slot.turns, "tensors": slot.tensors}


def play(
    tasks: list[Task],
    *,
    make_env: Callable[[Task], Any],
    make_agent: Callable[[Task], Any],
    make_user: Callable[[Task], Any],
    batch_size: int = 1,
    checkpoints: Checkpoints | None = None,
    agent_name: str = "",
    model_name: str = "",
    preference_in_success: bool = True,
    unknown_feedback: str = "keep",
    progress: Any = None,
    save_tensors: Callable[[Path, list[dict]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    whole_batches: bool = False,
    on_batch_start: Callable[[], None] | None = None,
) -> list[dict]:
    """Play every task, batch by batch (:func:`pipeline.core.parallel.partition`); return one record
    ``{"episode", "turns", "tensors"}`` per task.

    Records of episodes already checkpointed are loaded instead of replayed; with
    ``whole_batches`` only when every episode of their batch is (else the batch is
    replayed whole: its turns are then computed exactly as in an uninterrupted run).
    ``on_batch_start`` runs before a batch is played. ``should_stop`` is asked before
    every step; when it says so, ``KeyboardInterrupt`` is raised (a Ctrl-C whose
    exception a destructor swallowed still stops the run).
    """
    checkpoints = checkpoints or Checkpoints(None)
    records: dict[str, dict] = {}

    def finish(slot: _Slot, info: dict) -> None:
        rec = _episode_record(slot, info, agent_name=agent_name, model_name=model_name,
                              preference_in_success=preference_in_success, unknown_feedback=unknown_feedback)
        checkpoints.save(slot.task.episode_id, rec)
        records[slot.task.episode_id] = rec
        slot.env.close()
        if progress is not None:
            progress.update(1)

    for batch in partition(tasks, batch_size):
        loaded = {t.episode_id: rec for t in batch if (rec := checkpoints.load(t.episode_id)) is not None}
        if whole_batches and 0 < len(loaded) < len(batch):
            print(f"replaying a batch of {len(batch)} whole ({len(loaded)} of its episodes were checkpointed): each "
                  "turn is computed in the batch of an uninterrupted run", file=sys.stderr)
            loaded = {}
        records.update(loaded)
        if progress is not None and loaded:
            progress.update(len(loaded))
        pending = [t for t in batch if t.episode_id not in loaded]
        if not pending:
            continue
        if should_stop is not None and should_stop():
            raise KeyboardInterrupt
        if on_batch_start is not None:
            on_batch_start()
        active = [_start_slot(t, make_env, make_agent, make_user) for t in pending]
        while active:
            if should_stop is not None and should_stop():
                raise KeyboardInterrupt
            steps = _act_all(active)
            still = []
            for slot, step in zip(active, steps):
                done, info = _take_step(slot, step, unknown_feedback)
                if done:
                    finish(slot, info)
                else:
                    still.append(slot)
            active = still
    return [records[t.episode_id] for t in tasks]
