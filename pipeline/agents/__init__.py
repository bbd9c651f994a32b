"""Agents that play the household games: ``react`` and ``rag`` (rule-based, seed 004) and ``llm``.

    agent = make_agent(cfg, seed=task.seed)   # cfg: the composed config (or its `agent` group)
    agent.reset({"episode_id": ..., "objective": ..., "seed": ...})
    step = agent.act(obs)                     # AgentStep(action, reasoning, generated_text, extra)
"""

from __future__ import annotations

from typing import Any

from pipeline.agents.base import AgentStep

AGENT_NAMES = ("react", "rag", "llm")

__all__ = ["AGENT_NAMES", "AgentStep", "make_agent", "plays_with_model"]


def make_agent(cfg: Any, seed: int = 0, **kwargs: Any):
    """Build the agent named by ``agent.name``.

    Args:
        cfg: the composed config (``cfg.agent`` is used) or the ``agent`` group itself.
        seed: base seed of the agent's random draws.
        **kwargs: passed to the llm agent only (e.g. ``shared`` to reuse a loaded model).

    Raises:
        ValueError: ``agent.name`` is not one of :data:`AGENT_NAMES`.
    """
    agent_cfg = cfg["agent"] if "agent" in cfg else cfg
    raw = agent_cfg["name"] if "name" in agent_cfg else None
    name = str(getattr(raw, "value", raw))
    if name == "react":
        from pipeline.agents.react import ReActAgent

        return ReActAgent(agent_cfg, seed=seed)
    if name == "rag":
        from pipeline.agents.rag import RAGAgent

        return RAGAgent(agent_cfg, seed=seed)
    if name == "llm":
        # Imported only here: it pulls in torch / transformers.
        from pipeline.agents.llm import LLMAgent

        return LLMAgent(cfg, seed=seed, **kwargs)
    raise ValueError(f"agent.name={name!r}: unknown agent, expected one of {', '.join(AGENT_NAMES)}")


def plays_with_model(agent_cfg: Any) -> bool:
    """True for the agent that asks a language model for its actions (``agent.name=llm``)."""
    raw = agent_cfg.name
    return str(getattr(raw, "value", raw)) == "llm"
