"""Agents that play the household games: ``react`` and ``rag`` (rule-based, seed 004), ``llm``,
``reader`` (a rule agent acting on exactly what its prompt states: a condition's information ceiling)
and ``trial`` (the reader with seeded draws: trials that test a focus task's candidates).

    agent = make_agent(cfg, seed=task.seed)   # cfg: the composed config (or its `agent` group)
    agent.reset({"episode_id": ..., "objective": ..., "seed": ...})
    step = agent.act(obs)                     # AgentStep(action, reasoning, generated_text, model)

Every agent satisfies the :class:`Agent` protocol; an agent class that can act for many
episodes in one call (the ``llm`` agent's batched generation) also has
:meth:`BatchedAgent.act_many`. :func:`make_agent`, :func:`plays_with_model` and
:func:`reads_prompt` are the only places that look at ``agent.name``.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from pipeline.agents.base import AgentStep
from pipeline.agents.llm import LLMAgent
from pipeline.agents.rag import RAGAgent
from pipeline.agents.react import ReActAgent
from pipeline.agents.reader import ReaderAgent
from pipeline.agents.trial import TrialAgent
from pipeline.core.conf_schema import AgentConfig, AgentName, Config
from pipeline.envs import fact_reader

AGENT_NAMES = tuple(str(name) for name in AgentName)  # ("react", "rag", "llm", "reader", "trial")

__all__ = ["AGENT_NAMES", "Agent", "AgentStep", "BatchedAgent", "make_agent", "plays_with_model", "reads_prompt"]


class Agent(Protocol):
    """What the rollout needs from an agent: one episode at a time, one action per observation.

    Attributes:
        name: the agent's ``agent.name`` (``react`` | ``rag`` | ``llm`` | ``reader``).
    """

    name: str

    def reset(self, episode_meta: Mapping[str, Any] | None = None) -> None:
        """Start an episode (``episode_id``, ``objective``, ``seed``, ... all optional)."""
        ...

    def act(self, obs: Mapping[str, Any]) -> AgentStep:
        """The agent's decision for this observation of its episode."""
        ...


class BatchedAgent(Agent, Protocol):
    """An agent whose class can take one step for several episodes in one call."""

    @classmethod
    def act_many(cls, agents: Sequence[Any], observations: Sequence[Mapping[str, Any]]) -> list[AgentStep]:
        """One step for each (agent, observation) pair, in order; the result for an agent
        does not depend on the others it is batched with."""
        ...


def make_agent(cfg: Config | AgentConfig, seed: int = 0, **kwargs: Any) -> Agent:
    """Build the agent named by ``agent.name``.

    Args:
        cfg: the composed config (``cfg.agent`` is used) or the ``agent`` group itself
            (the ``llm`` and ``reader`` agents need the composed config: the model, the world).
        seed: base seed of the agent's random draws.
        **kwargs: passed to the llm agent only (e.g. ``shared``, a
            :class:`pipeline.agents.llm.SharedBackend`, to reuse a loaded model).

    Raises:
        ValueError: ``agent.name`` is not one of :data:`AGENT_NAMES`.
    """
    # Read as a mapping: an unvalidated config with an unknown name still gets this error.
    agent_cfg = cfg["agent"] if "agent" in cfg else cfg
    name = str(agent_cfg.get("name"))
    if name == AgentName.react:
        return ReActAgent(agent_cfg, seed=seed)
    if name == AgentName.rag:
        return RAGAgent(agent_cfg, seed=seed)
    if name == AgentName.llm:
        return LLMAgent(cfg, seed=seed, **kwargs)
    if name in (AgentName.reader, AgentName.trial):
        if "env" not in cfg:
            raise ValueError(f"agent.name={name} reads its world's facts: make_agent needs the composed config")
        agent_class = ReaderAgent if name == AgentName.reader else TrialAgent
        return agent_class(agent_cfg, seed=seed, facts=fact_reader(cfg))
    raise ValueError(f"agent.name={name!r}: unknown agent, expected one of {', '.join(AGENT_NAMES)}")


def plays_with_model(agent_cfg: AgentConfig) -> bool:
    """True for the agent that asks a language model for its actions (``agent.name=llm``)."""
    return str(agent_cfg.name) == AgentName.llm


def reads_prompt(agent_cfg: AgentConfig) -> bool:
    """True for an agent whose actions depend on its system prompt (``llm``, ``reader``,
    ``trial``); ``react`` and ``rag`` ignore it."""
    return str(agent_cfg.name) in (AgentName.llm, AgentName.reader, AgentName.trial)
