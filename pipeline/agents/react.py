"""The ReAct rule agent (seed 004): a thought, then an action, each step kept.

    >>> from pipeline.core.conf_schema import AgentConfig
    >>> from pipeline.core.config import section
    >>> agent = ReActAgent(section(AgentConfig, {"remember_examined": True}), seed=0)
    >>> agent.reset({"episode_id": "ep", "objective": "Take Apple_2."})
    >>> step = agent.act({"agent_location": "Kitchen", "visible_entities": ["Apple_2"],
    ...                   "admissible_actions": [{"action": "pick_up", "target": "Apple_2",
    ...                                           "command": "take Apple_2"}]})
    >>> step.action
    {'action': 'pick_up', 'target': 'Apple_2'}
    >>> agent.reasoning_steps[-1]["thought"]
    'I am in the Kitchen, holding nothing; I see Apple_2. Apple_2 is within reach: take it.'

Unlike the seed's agent, the thought comes from the objective and what the agent has
done so far, and the action is always one of the observation's admissible actions.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from pipeline.agents.base import AgentStep, RuleAgent


class ReActAgent(RuleAgent):
    """Thought -> action; ``reasoning_steps`` holds ``{thought, action, target, observation}``.

    It examines each closed container before opening it (the seed's habit); with
    ``agent.remember_examined=false`` it forgets that it did, and examines it again.
    """

    name = "react"

    def reset(self, episode_meta: Mapping[str, Any] | None = None) -> None:
        super().reset(episode_meta)
        self.reasoning_steps: list[dict] = []

    def _generate_thought(self, obs: Mapping[str, Any], rationale: str) -> str:
        inv = list(obs.get("agent_inventory") or [])
        vis = list(obs.get("visible_entities") or [])
        where = f"I am in the {obs['agent_location']}" if obs.get("agent_location") else "I am somewhere"
        holding = f"holding {', '.join(inv)}" if inv else "holding nothing"
        seeing = f"I see {', '.join(vis[:4])}{' and more' if len(vis) > 4 else ''}" if vis else "I see nothing useful"
        return f"{where}, {holding}; {seeing}. {rationale[:1].upper()}{rationale[1:]}."

    def act(self, obs: Mapping[str, Any]) -> AgentStep:
        """Think about the observation, then pick an admissible action."""
        self.observe(obs)
        action, rationale, _ = self.choose(obs, {})
        thought = self._generate_thought(obs, rationale)
        self.reasoning_steps.append({"thought": thought, "action": action["action"], "target": action.get("target"),
                                     "observation": obs.get("description", "")})
        self.finish_step(action)
        text = f"Thought: {thought}\nAction: {json.dumps(action, ensure_ascii=False, sort_keys=True)}"
        return AgentStep(action=action, reasoning=thought, generated_text=text)
