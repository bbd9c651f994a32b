"""The ``llm`` agent: seed 004's LLM baseline done properly.

Seed 004's baseline sent a bare scene name to GPT-4o, asked for ``"verb target"`` text and
fell back to ``examine`` whenever parsing failed. Here the prompt is the system template
(``prompts.system_template``, seed 002 slots) rendered with the episode's objective,
grounding, memory dict and the full observation; the model writes a short reasoning line
and one JSON action, which is tracked token by token while it is generated (early stop
when it closes), parsed, and matched against the admissible actions::

    agent = build_llm_agent(cfg, seed=task.seed)       # or make_agent(cfg, seed, shared=SharedBackend())
    agent.reset({"episode_id": ..., "objective": ..., "seed": ..., "system_prompt": None})
    step = agent.act(obs)                              # AgentStep(action, reasoning, generated_text, model)
    step.model.generation.generated_ids, step.model.action_valid   # the typed model turn (ModelTurn)
    steps = LLMAgent.act_many(agents, observations)    # one batched generation for N episodes

One agent plays one episode at a time (its memory dict and turn counter are per
episode); agents built with the same :class:`SharedBackend` share one loaded backend, and
:meth:`LLMAgent.act_many` generates for all of them in one batched call.

Unparseable or inadmissible output never crashes: the turn records
``step.model.action_valid = False``, the reason (``parse_error``) and the raw text, and the
configured ``agent.fallback_action`` is taken. A failed backend call does the same when
``agent.on_backend_error=record`` and raises when it is ``fail``.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Mapping, Sequence

from pipeline.agents.base import AgentStep, ModelTurn, candidate_actions, clean_action
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError
from pipeline.core.seeding import turn_seed
from pipeline.llm.backends import (
    Backend,
    BackendError,
    CachesPrompts,
    ConstraintProbe,
    Generation,
    SettlesConstraint,
    make_backend,
)
from pipeline.prompts import TURN_VARIABLES, PromptOrganizer, observation_variables, task_prompt, template_slots

# The user turn when the system template already shows the observation (the compact and
# default templates do): the model is asked for its answer and nothing else.
USER_TURN = "Your next action? One short line of reasoning, then the JSON action."

# The user turn when the template shows no observation fields: the observation itself.
OBSERVATION_TEMPLATE = """## Objective
{objective}

## Current Observation
- Step: {step} of {max_steps}
- Location: {agent_location}
- Inventory: {agent_inventory}
- Visible: {visible_entities}
- Actions: {available_actions}
- Valid commands: {admissible_commands}
- Description: {description}

Write one short line of reasoning, then one JSON action on one line:
{{"action": "<verb>", "target": "<entity or null>"}}"""

_NULLS = ("", "null", "none")


def format_observation(obs: Mapping[str, Any], objective: str | None = None) -> str:
    """The observation as a user message (for templates without observation slots)."""
    values = observation_variables(obs)
    return OBSERVATION_TEMPLATE.format(objective=objective or obs.get("objective") or "unknown", **values)


def render_response(reasoning: str, action: Mapping[str, Any], memory: Mapping[str, Any] | None = None) -> str:
    """The answer format the agent asks for: one reasoning line, then the JSON action.

    Used to build demonstrations (the model pipeline) in exactly the form the agent parses.
    """
    obj = dict(clean_action(action))
    if memory is not None:
        obj["memory"] = dict(memory)
    line = " ".join(str(reasoning).split())
    return f"{line}\n{json.dumps(obj, ensure_ascii=False)}"


def _norm(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return None if text.lower() in _NULLS else text


def parse_action(action_text: str | None, obs: Mapping[str, Any]) -> tuple[dict | None, dict | None, str | None]:
    """Parse the tracked JSON action and match it to an admissible action.

    Returns:
        ``(action, parsed, error)``: the action dict to send (None when invalid), the
        parsed JSON object (None when there is none) and the reason it is invalid.
    """
    if not action_text:
        return None, None, "no complete JSON object in the output"
    try:
        parsed = json.loads(action_text, strict=False)
    except ValueError as exc:  # the tracker only closes on valid JSON; kept for direct callers
        return None, None, f"invalid JSON: {exc}"
    if not isinstance(parsed, dict):
        return None, None, "the JSON is not an object"
    verb = parsed.get("action")
    if not isinstance(verb, str) or not verb.strip():
        return None, parsed, 'the JSON object has no "action" string'
    want = {"action": verb.strip().lower().replace(" ", "_")}
    for k in ("target", "receptacle", "key"):
        want[k] = _norm(parsed.get(k))
    verbs = [str(v) for v in obs.get("available_actions") or []]
    if want["action"] == "wait" and ("wait" in verbs or not verbs):
        return {"action": "wait", "target": None}, parsed, None
    if not obs.get("admissible_actions") and not verbs:
        return clean_action(want), parsed, None  # nothing to check against
    match = _match(want, candidate_actions(obs))
    if match is None:
        shown = json.dumps(clean_action(want), ensure_ascii=False)
        return None, parsed, f"inadmissible action {shown}"
    return clean_action(match), parsed, None


def _match(want: dict, cands: list[dict]) -> dict | None:
    """The admissible action meant by ``want`` (names compared case-insensitively).

    A field the model left out matches any value; among several matches the one whose
    missing fields are empty wins, then the first by command (the env's own tie rule).
    """
    found = []
    for a in cands:
        if str(a.get("action", "")).lower() != want["action"]:
            continue
        ok = True
        for k in ("target", "receptacle", "key"):
            w = want.get(k)
            if w is None:
                continue
            have = _norm(a.get(k))
            if have is not None and have.lower() == w.lower():
                continue
            # go_to may name a direction; the admissible dict names the room it leads to.
            if k == "target" and want["action"] == "go_to" and str(a.get("command", "")).lower() == f"go {w.lower()}":
                continue
            ok = False
            break
        if ok:
            found.append(a)
    if not found:
        return None
    unspecified = [k for k in ("target", "receptacle", "key") if want.get(k) is None]
    exact = [a for a in found if all(_norm(a.get(k)) is None for k in unspecified)]
    pool = exact or found
    return sorted(pool, key=lambda a: str(a.get("command", "")))[0]


def _reasoning(text: str, action_text: str | None) -> str:
    """The text before the JSON action (all of it when there is none)."""
    if action_text and action_text in text:
        return text[: text.index(action_text)].strip()
    return text.strip()


class SharedBackend:
    """The one backend the ``llm`` agents of a run share, loaded by the first that needs it.

    The collection keeps it to read the backend's statistics once the run is over::

        shared = SharedBackend()
        agents = [make_agent(cfg, seed=t.seed, shared=shared) for t in tasks]
        ...
        shared.prompt_cache_stats()      # None: no backend loaded, or one without a prompt cache
        shared.constraint_probe()        # None: no server probed for its action constraint
    """

    def __init__(self, backend: Backend | None = None):
        self.backend = backend
        self.first_error: str | None = None  # the first failed call this run recorded (names the cause)

    def note_error(self, where: str, error: str) -> None:
        """Remember the first failed model call of the run (``agent.on_backend_error=record``)."""
        if self.first_error is None:
            self.first_error = f"{where}: {error}"

    def get(self, cfg: Config) -> Backend:
        """The shared backend (built from ``cfg.model`` and ``cfg.sampling`` on first use)."""
        if self.backend is None:
            self.backend = make_backend(cfg.model, cfg.sampling)
        return self.backend

    def start_batch(self) -> None:
        """Before a batch of episodes: the backend's prompt cache is emptied, so the batch's
        turns are computed from the same state whether the run was resumed or not."""
        if isinstance(self.backend, CachesPrompts):
            self.backend.clear_prompt_cache()

    def prompt_cache_stats(self) -> dict[str, int] | None:
        """Prompt tokens reused across turns vs encoded, this run's (a local model's prompt
        cache, :class:`pipeline.llm.backends.CachesPrompts`); None without one."""
        return self.backend.prompt_cache_stats() if isinstance(self.backend, CachesPrompts) else None

    def constraint_probe(self) -> ConstraintProbe | None:
        """How the server constrained the actions, as probed at start (``model.structured_output``
        other than ``none``, :class:`pipeline.llm.backends.SettlesConstraint`); None otherwise."""
        if isinstance(self.backend, SettlesConstraint) and self.backend.constraint is not None \
                and self.backend.constraint.tried:
            return self.backend.constraint
        return None


class LLMAgent:
    """A language model choosing household actions (``agent.name=llm``).

    Args:
        cfg: the composed config (``agent``, ``model``, ``sampling``, ``prompts``,
            ``grounding``, ``memory`` groups are read).
        seed: base seed of this agent (the task seed); each turn samples with a seed
            derived from (``sampling.seed``, this seed, episode id, turn index).
        shared: the :class:`SharedBackend` of the agents of one run: the backend is
            loaded once, by the first agent that needs it.
        backend: an already built backend (tests, benchmarks).
    """

    name = "llm"

    def __init__(self, cfg: Config, seed: int = 0, *, shared: SharedBackend | None = None,
                 backend: Backend | None = None):
        self.cfg = cfg
        self.seed = int(seed)
        self.sampling_seed = cfg.sampling.seed
        agent_cfg = cfg.agent
        fb = agent_cfg.fallback_action
        self.fallback = clean_action({"action": fb.action, "target": fb.target})
        self.on_backend_error = str(agent_cfg.on_backend_error)
        self.batch_size = max(1, agent_cfg.batch_size)
        self.decoding = str(agent_cfg.decoding)
        self.reasoning_max_tokens = agent_cfg.reasoning_max_tokens
        self.shared = shared
        if backend is None:
            backend = shared.get(cfg) if shared is not None else make_backend(cfg.model, cfg.sampling)
        self.backend = backend
        if self.decoding in ("auto", "constrained") and isinstance(backend, SettlesConstraint):
            # A server is asked once, at start, which constraint it enforces (the agents of a run
            # share the backend and its answer); constrained without one stops here, in its words.
            backend.settle_constraint(required=self.decoding == "constrained")
        offered = getattr(backend, "decodings", None)  # None: a stand-in that declares nothing (prompt building)
        if self.decoding == "auto":  # the strongest the backend offers
            self.decoding = "constrained" if offered and "constrained" in offered else "free"
        if offered is not None and self.decoding not in offered:
            raise ConfigError(f"agent.decoding={self.decoding!r}: the {type(backend).__name__} here offers "
                              f"{', '.join(offered)} (constrained with model.backend=openai needs "
                              "model.structured_output=auto or a form; choice needs a local model: "
                              "model.backend=transformers)")
        self.organizer = PromptOrganizer.from_config(cfg)
        self.reset({})

    # -- episode ------------------------------------------------------------------------

    def reset(self, episode_meta: Mapping[str, Any] | None = None) -> None:
        """Start an episode: fresh memory dict, turn 0, the episode's system prompt.

        Args:
            episode_meta: ``episode_id``, ``objective``, ``scene_id``, ``seed``, and
                optionally ``system_prompt``: a per-episode prompt already rendered by the
                ``render`` stage (turn slots and ``$memory[...]`` kept), used instead of
                rendering ``prompts.system_template``.
        """
        meta = dict(episode_meta or {})
        self.episode_id = str(meta.get("episode_id") or "")
        self.objective = meta.get("objective")
        self.scene_id = meta.get("scene_id") or ""
        self.turn = 0
        self.organizer.reset_memory()
        self._frozen: str | None = meta.get("system_prompt") or None
        self._frozen_name = "<episode system prompt>" if self._frozen else self.organizer.system_template_path
        self._obs_in_template: bool | None = None

    def _system_prompt(self, obs: Mapping[str, Any]) -> str:
        if self._frozen is None:
            if not self.objective:  # no episode meta: the observation carries the objective
                self.objective = obs.get("objective") or ""
            self._frozen = task_prompt(self.organizer, self.objective or "", self.scene_id, None).text
        if self._obs_in_template is None:
            names, _ = template_slots(self._frozen)
            self._obs_in_template = bool(names & set(TURN_VARIABLES))
        return self.organizer.render_turn(self._frozen, obs, template_name=self._frozen_name)

    def messages(self, obs: Mapping[str, Any]) -> list[dict]:
        """The chat messages for this turn: rendered system prompt, then the user turn."""
        system = self._system_prompt(obs)
        user = USER_TURN if self._obs_in_template else format_observation(obs, self.objective)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def current_seed(self) -> int:
        """This turn's sampling seed: from (``sampling.seed``, agent seed, episode id, turn index)."""
        return turn_seed(self.sampling_seed, self.seed, self.episode_id, self.turn)

    # -- acting -------------------------------------------------------------------------

    def act(self, obs: Mapping[str, Any]) -> AgentStep:
        """One turn for this agent's episode."""
        return self.act_many([self], [obs])[0]

    @classmethod
    def act_many(cls, agents: Sequence["LLMAgent"], observations: Sequence[Mapping[str, Any]]) -> list[AgentStep]:
        """One turn for each (agent, observation): batched generation, ``agent.batch_size`` at a time.

        Agents sharing a backend are generated for together; the result for an agent does
        not depend on the others in its batch (each turn samples with its own seed).
        """
        if len(agents) != len(observations):
            raise ValueError(f"act_many: {len(agents)} agents but {len(observations)} observations")
        requests = [(a, o, a.messages(o), a.current_seed()) for a, o in zip(agents, observations)]
        steps: list[AgentStep | None] = [None] * len(requests)
        groups: dict[int, list[int]] = {}
        for i, (a, _, _, _) in enumerate(requests):
            groups.setdefault(id(a.backend), []).append(i)
        for idxs in groups.values():
            backend, size = requests[idxs[0]][0].backend, requests[idxs[0]][0].batch_size
            for k in range(0, len(idxs), size):
                chunk = idxs[k:k + size]
                # A backend that can constrain the action (agent.decoding, model.structured_output)
                # gets the admissible ones.
                first = requests[idxs[0]][0]
                kw = ({"admissible": [candidate_actions(requests[i][1]) for i in chunk], "decoding": first.decoding,
                       "reasoning_max_tokens": first.reasoning_max_tokens}
                      if getattr(backend, "constrains_actions", False) else {})
                gens = backend.generate([requests[i][2] for i in chunk], seeds=[requests[i][3] for i in chunk], **kw)
                for i, gen in zip(chunk, gens):
                    steps[i] = requests[i][0].finish_turn(requests[i][1], gen)
        return steps  # type: ignore[return-value]

    def finish_turn(self, obs: Mapping[str, Any], gen: Generation) -> AgentStep:
        """Turn a backend :class:`~pipeline.llm.backends.Generation` into this turn's step."""
        seed = self.current_seed()
        if gen.error:
            if self.on_backend_error == "fail":
                raise BackendError(f"episode {self.episode_id} turn {self.turn}: {gen.error} (agent.on_backend_error=fail)")
            action, parsed, error = None, None, f"backend error: {gen.error}"
            if self.shared is not None:
                self.shared.note_error(f"episode {self.episode_id} turn {self.turn}", gen.error)
        else:
            action, parsed, error = parse_action(gen.action_text, obs)
            if gen.chosen_index is not None:
                # The constraint fixed the action (constrained / choice decoding); the JSON text
                # may still carry memory notes, or be cut off after the action's fields.
                action, error = clean_action(candidate_actions(obs)[gen.chosen_index]), None
            elif error and gen.stop_reason == "max_new_tokens" and parsed is None:
                error += " (cut off at max_new_tokens)"
        scores = None
        if gen.decoding != "free" and gen.action_scores is not None:
            scores = {str(a.get("command") or json.dumps(clean_action(a))): (sc if sc != float("-inf") else None)
                      for a, sc in zip(candidate_actions(obs), gen.action_scores)}
        if parsed is not None:
            self.organizer.update_memory_from_response(parsed)
        self.turn += 1
        return AgentStep(
            action=action if action is not None else dict(self.fallback),
            reasoning=_reasoning(gen.text, gen.action_text),
            generated_text=gen.text,
            model=ModelTurn(generation=gen, seed=seed, action_valid=action is not None, parse_error=error,
                            memory=copy.deepcopy(self.organizer.memory_dict), action_scores=scores),
        )


def build_llm_agent(cfg: Config, seed: int = 0, **kwargs: Any) -> LLMAgent:
    """The ``llm`` agent for ``cfg`` (``kwargs``: ``shared``, a :class:`SharedBackend`, or ``backend``)."""
    return LLMAgent(cfg, seed=seed, **kwargs)
