"""The RAG rule agent (seed 004): extract entities, retrieve knowledge, act on it.

    >>> agent = RAGAgent(section(AgentConfig, {"knowledge_base": "conf/knowledge/household_kb.json"}), seed=0)  # doctest: +SKIP
    >>> agent.reset({"episode_id": "ep", "objective": "Put Apple_2 in Fridge_0 and close it."})  # doctest: +SKIP
    >>> agent.act(obs).action  # doctest: +SKIP

The knowledge base (``conf/knowledge/household_kb.json``, path in ``agent.knowledge_base``)
has seed 004's three sections, each ``{key: [sentence, ...]}``:

- ``object_interactions``, keyed by entity type (``cabinet``, ``key``, ``apple``): where
  things are usually found and how containers behave;
- ``action_strategies``, keyed by verb (``examine``, ``open``);
- ``task_patterns``, keyed by ``<goal verb>_task`` (``put_task``, ``take_task``).

Retrieved sentences steer the shared heuristics: containers whose type is mentioned in
the target object's knowledge are searched first ("Apples are usually kept in the
fridge"), a container whose entry says "check"/"examine" is examined before it is opened,
one whose entry says to close it after use is closed again, and keys are taken on sight
when the key entry says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from pipeline.agents.base import ROOM_WORDS, AgentStep, RuleAgent, candidate_actions, etype
from pipeline.core.conf_schema import AgentConfig
from pipeline.core.config import project_root

KB_SECTIONS = ("object_interactions", "action_strategies", "task_patterns")
DEFAULT_KB = "conf/knowledge/household_kb.json"


def load_knowledge_base(path: str | Path) -> dict[str, dict[str, list[str]]]:
    """Read and check a knowledge base JSON (each section ``{key: [sentence, ...]}``).

    Raises:
        FileNotFoundError: the file is missing (the message names ``agent.knowledge_base``).
        ValueError: the JSON is invalid or a section / entry has the wrong shape.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"agent.knowledge_base={str(path)!r}: file not found")
    try:
        kb = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: invalid JSON in the knowledge base ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(kb, dict):
        raise ValueError(f"{p}: expected a JSON object with sections {', '.join(KB_SECTIONS)}")
    for sec in KB_SECTIONS:
        entries = kb.get(sec)
        if not isinstance(entries, dict):
            raise ValueError(f"{p}: section {sec!r} missing or not an object; expected {{key: [sentence, ...]}}")
        for key, sentences in entries.items():
            if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
                raise ValueError(f"{p}: {sec}.{key} must be a list of strings")
    return {sec: {k.lower(): list(v) for k, v in kb[sec].items()} for sec in KB_SECTIONS}


class RAGAgent(RuleAgent):
    """Entities -> retrieved knowledge -> action; ``retrieval_history`` keeps each step.

    Args:
        agent_cfg: the ``agent`` config group (``knowledge_base`` path, relative to the
            project root, plus the common fields).
        seed: base seed.
        knowledge_base: an already loaded knowledge base (tests), instead of the file.
    """

    name = "rag"

    def __init__(self, agent_cfg: AgentConfig, seed: int = 0, knowledge_base: dict | None = None):
        if knowledge_base is None:
            path = Path(agent_cfg.knowledge_base or DEFAULT_KB)
            knowledge_base = load_knowledge_base(path if path.is_absolute() else project_root() / path)
        self.knowledge_base = knowledge_base
        super().__init__(agent_cfg, seed)

    def reset(self, episode_meta: Mapping[str, Any] | None = None) -> None:
        super().reset(episode_meta)
        self.retrieval_history: list[dict] = []

    # -- seed 004's three steps ----------------------------------------------------------

    def _extract_key_entities(self, obs: Mapping[str, Any]) -> list[str]:
        """Entity types from what is visible, carried and named by the goal, plus room words."""
        names = list(obs.get("visible_entities") or []) + list(obs.get("agent_inventory") or [])
        if self.goal is not None:
            names += [n for n in (self.goal.obj, self.goal.dest) if n]
        types = [etype(n) for n in names]
        context = f"{obs.get('description', '')} {obs.get('agent_location', '')}".lower()
        types += [w for w in ROOM_WORDS if w in context]
        return sorted(set(t for t in types if t))

    def _retrieve_knowledge(self, entities: list[str], obs: Mapping[str, Any]) -> dict[str, list[str]]:
        kb = self.knowledge_base
        out: dict[str, list[str]] = {}
        for e in entities:
            if e in kb["object_interactions"]:
                out[f"object_{e}"] = kb["object_interactions"][e]
        verbs = sorted({a["action"] for a in candidate_actions(obs)} | set(obs.get("available_actions") or []))
        for v in verbs:
            if v in kb["action_strategies"]:
                out[f"strategy_{v}"] = kb["action_strategies"][v]
        if self.goal is not None:
            task = f"{self.goal.verb}_task"
            if task in kb["task_patterns"]:
                out[f"pattern_{task}"] = kb["task_patterns"][task]
        return out

    # -- hooks steered by the retrieved knowledge ------------------------------------------

    @staticmethod
    def _says(sentences: list[str], *words: str) -> bool:
        low = " ".join(sentences).lower()
        return any(w in low for w in words)

    def examine_first(self, entity: str, ctx: dict) -> bool:
        return self._says(ctx.get(f"object_{etype(entity)}", []), "check", "examine")

    def rank_containers(self, names: list[str], ctx: dict) -> list[str]:
        target = etype(self.goal.obj) if self.goal and self.goal.obj else ""
        hints = ctx.get(f"object_{target}", [])

        def score(c: str) -> int:
            t = etype(c)
            own = ctx.get(f"object_{t}", [])
            return -(sum(t in s.lower() for s in hints) + sum(bool(target) and target in s.lower() for s in own))

        return sorted(names, key=score)  # stable: ties keep the observation's order

    def close_after_use(self, entity: str, ctx: dict) -> bool:
        own = ctx.get(f"object_{etype(entity)}", []) + ctx.get("strategy_close", [])
        return self._says(own, "close it after use", "close it again", "close containers after use")

    def want_keys(self, ctx: dict) -> bool:
        return super().want_keys(ctx) or self._says(ctx.get("object_key", []), "take keys", "pick up keys")

    def act(self, obs: Mapping[str, Any]) -> AgentStep:
        """Extract entities, retrieve knowledge, then pick an admissible action with it."""
        self.observe(obs)
        entities = self._extract_key_entities(obs)
        knowledge = self._retrieve_knowledge(entities, obs)
        action, rationale, _ = self.choose(obs, knowledge)
        self.retrieval_history.append({"entities": entities, "knowledge": knowledge,
                                       "action": action["action"], "target": action.get("target")})
        self.finish_step(action)
        summary = f"retrieved {', '.join(sorted(knowledge)) or 'nothing'}; {rationale}"
        text = f"Knowledge: {json.dumps(knowledge, ensure_ascii=False, sort_keys=True)}\n" \
               f"Action: {json.dumps(action, ensure_ascii=False, sort_keys=True)}"
        return AgentStep(action=action, reasoning=summary, generated_text=text)
