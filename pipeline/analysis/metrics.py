"""Per-condition evaluation metrics with seeded bootstrap intervals (``metrics/eval/<C>.json``).

The ``evaluate`` stage calls :func:`condition_metrics` on what it just wrote; ``compare``
calls it again for every condition (cheap, and the numbers are identical because every
interval is seeded from the config seed and the metric's name)::

    m = condition_metrics(episodes_rows, turns_rows, prompts_rows, cfg)
    atomic_write_json(root / cfg.paths.metrics / "eval" / f"{condition}.json", m)

Each metric is ``{"value", "ci_low", "ci_high", "n"}`` so that ``dvc metrics show``
prints one row per condition with ``success_rate.value``, ``success_rate.ci_low``, ...

- ``success_rate``: share of episodes with ``is_correct`` (``won``, and the scene's
  preferences held when ``user.preference_in_success``); ``won_rate``: share with
  TextWorld's ``won``. Both come from the game, never from ``done``.
- ``invalid_action_rate`` / ``repeated_action_rate``: per turn (sum over episodes of
  ``num_invalid`` / ``num_repeated`` over the sum of ``num_turns``), with intervals
  from resampling whole episodes, since turns of one episode are not independent.
- ``gate_pass_rate`` / ``injection_rate``: share of the condition's rendered prompts whose
  memory gate passed / that carry an injected memory block (null without prompts).
- ``backend_error_turns`` / ``backend_error_rate``: turns whose model call failed
  (``stop_reason == "error"``: the fallback action was taken) and their share of all turns
  (:func:`backend_errors`). A run above ``agent.max_error_fraction`` never gets this far:
  the stage stops instead of writing a result of a broken server.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping

import numpy as np

from pipeline.core.conf_schema import Config
from pipeline.core.schemas import backend_errors
from pipeline.core.seeding import labelled_rng
from pipeline.core.stats import Estimate, bootstrap_mean, bootstrap_ratio

Rows = Iterable[Mapping[str, Any]]

#: Metric names in the order they are written (JSON keys are sorted anyway).
METRICS = (
    "success_rate", "won_rate", "mean_reward", "mean_turns", "invalid_action_rate", "repeated_action_rate",
    "prompt_tokens_per_episode", "generated_tokens_per_episode", "gate_pass_rate", "injection_rate",
)


def as_rows(rows: Any) -> list[dict]:
    """Accept a list of dicts, a ``pyarrow.Table`` or None (-> [])."""
    if rows is None:
        return []
    if hasattr(rows, "to_pylist"):
        return rows.to_pylist()
    return [dict(r) for r in rows]


def bootstrap_settings(cfg: Config) -> tuple[int, int, float]:
    """``(seed, n_resamples, level)`` from the config (``seed``, ``experiment.*``)."""
    exp = cfg.experiment
    return cfg.seed, exp.bootstrap_samples, exp.ci_level


def _condition_of(episodes: list[dict]) -> str:
    names = sorted({str(e.get("condition") or "") for e in episodes})
    if len(names) > 1:
        raise ValueError(f"episodes of several conditions mixed in one metrics call: {names}")
    return names[0] if names else ""


def check_turns(episodes: list[dict], turns: list[dict]) -> None:
    """Every episode's ``num_turns`` equals its rows in turns (else the files do not belong together)."""
    counts = Counter(t["episode_id"] for t in turns)
    ids = {e["episode_id"] for e in episodes}
    for e in episodes:
        if counts.get(e["episode_id"], 0) != int(e["num_turns"]):
            raise ValueError(f"episode {e['episode_id']!r}: num_turns={e['num_turns']} but turns has "
                             f"{counts.get(e['episode_id'], 0)} rows for it")
    stray = sorted(set(counts) - ids)
    if stray:
        raise ValueError(f"turns has rows of {len(stray)} episode(s) missing from episodes, e.g. {stray[0]!r}")


def condition_metrics(episodes_rows: Any, turns_rows: Any, prompts_rows: Any, cfg: Config) -> dict[str, Any]:
    """Metrics of one condition's evaluation, each with a seeded bootstrap interval.

    Args:
        episodes_rows: Episode rows (``EPISODE_SCHEMA``) of one condition: list of dicts
            or a ``pyarrow.Table``.
        turns_rows: Their turns (``TURN_SCHEMA``); checked against ``num_turns`` and counted
            for the backend errors. None skips both.
        prompts_rows: The condition's rendered prompts (``data/prompts/<C>.parquet``),
            one row per task with ``gate_ok`` and ``injected``; None or [] gives null
            gate metrics.
        cfg: The composed config (reads ``seed``, ``experiment.bootstrap_samples``,
            ``experiment.ci_level``).

    Returns:
        JSON-ready dict: ``condition``, counts, one ``{"value", "ci_low", "ci_high", "n"}``
        per name in :data:`METRICS`, and the ``bootstrap`` settings used.

    Raises:
        ValueError: Mixed conditions, or turns that do not match the episodes.
    """
    episodes = sorted(as_rows(episodes_rows), key=lambda e: str(e["episode_id"]))
    turn_list = as_rows(turns_rows) if turns_rows is not None else None
    if turn_list is not None:
        check_turns(episodes, turn_list)
    prompts = sorted(as_rows(prompts_rows), key=lambda p: (str(p.get("scene_id")), str(p.get("quest_id"))))
    seed, n_resamples, level = bootstrap_settings(cfg)

    def col(name: str) -> np.ndarray:
        return np.asarray([float(e[name] or 0) for e in episodes], dtype=np.float64)

    def mean(name: str, values: np.ndarray) -> Estimate:
        # The rng depends on the metric's name only: every condition resamples the same
        # task indices, and adding a metric never shifts another's interval.
        return bootstrap_mean(values, n_resamples=n_resamples, level=level, rng=labelled_rng(seed, "metric", name))

    def ratio(name: str, num: np.ndarray, den: np.ndarray) -> Estimate:
        return bootstrap_ratio(num, den, n_resamples=n_resamples, level=level, rng=labelled_rng(seed, "metric", name))

    turns = col("num_turns")
    est: dict[str, Estimate] = {
        "success_rate": mean("success_rate", col("is_correct")),
        "won_rate": mean("won_rate", col("won")),
        "mean_reward": mean("mean_reward", col("final_reward")),
        "mean_turns": mean("mean_turns", turns),
        "invalid_action_rate": ratio("invalid_action_rate", col("num_invalid"), turns),
        "repeated_action_rate": ratio("repeated_action_rate", col("num_repeated"), turns),
        "prompt_tokens_per_episode": mean("prompt_tokens_per_episode", col("prompt_tokens")),
        "generated_tokens_per_episode": mean("generated_tokens_per_episode", col("generated_tokens")),
        "gate_pass_rate": mean("gate_pass_rate", np.asarray([bool(p.get("gate_ok")) for p in prompts], float)),
        "injection_rate": mean("injection_rate", np.asarray([bool(p.get("injected")) for p in prompts], float)),
    }
    out: dict[str, Any] = {
        "condition": _condition_of(episodes),
        "num_episodes": len(episodes),
        "num_tasks": len({(e["scene_id"], e["quest_id"]) for e in episodes}),
        "num_turns": int(turns.sum()),
        "num_prompts": len(prompts),
        "bootstrap": {"method": "percentile", "samples": n_resamples, "ci_level": level, "seed": seed},
    }
    out.update({name: est[name].as_dict() for name in METRICS})
    if turn_list is not None:
        out.update(backend_errors(turn_list))
    return out
