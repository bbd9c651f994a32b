"""Drills of later turns (issue 64): the steps of an episode after the search, take what the goal
needs, carry it, put it, as plan drills teach the first turn.

The utilisation probe's decisions (``python -m pipeline.policy.utilisation --decisions``;
docs/policy.md, *Where the model leaves the reader's path*) found the default model failing at the
step in front of it more than at reading: where the teacher takes what the goal needs, in reach, the
model takes it about one time in three under every prompt, and it carries and puts at about the same
rate. Its training has few such turns: 65% of the demonstrations' answers are first turns (the 9,600
plan drills are), and about 1,000 later turns take something. A later-turn drill is one such turn:

- a generated house of a stream of its own (``derive_seed(seed, "later-drills")``, two quests), its
  *past visit* played by the rule agent on the second quest (:func:`pipeline.policy.statements.past_visits`);
- a prompt drawn per house from every variant the demonstrations have (no block, the C2 block built
  from a store that holds the past visit, the placebo's, the oracle's verified plan), under the
  visit's grounding for a share ``policy.generated_grounding`` of the houses, as generated houses'
  demonstrations are;
- the teacher ``policy.teacher`` names plays the first quest with no slips; the drill is one of its
  turns from the first that picks something up to the last (take, carry, open, put), drawn per house,
  rendered with the episode's history before it (the agent's memory dict as the teacher's answers
  left it), and only that turn is learned. A house whose teacher never picks anything up gives none.

``policy.later_drills`` drills are built by the ``demos`` step after the statement drills
(:func:`later_drills`: :func:`pipeline.policy.statements.draw_drills`, the same drills on any number
of workers) and trained as plan drills are, eight to a unit
(:func:`pipeline.policy.demos.training_unit`). The houses are never an eval scene's layout or an
eval objective (:func:`pipeline.policy.demos.house_stream`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pipeline.core.conf_schema import Config
from pipeline.core.parallel import OrderedPool
from pipeline.core.seeding import crc_rng
from pipeline.envs.household.generate import GeneratedHouse
from pipeline.policy.demos import (
    Demo,
    DemoKind,
    RenderedTurn,
    SceneMemory,
    freeze_prompt,
    house_env,
    house_variants,
    play_teacher,
    render_demos,
    rule_agent_config,
)
from pipeline.policy.expert import DemoEpisode
from pipeline.policy.statements import draw_drills, history_grounding, house_memory, past_visits
from pipeline.prompts import PromptOrganizer
from pipeline.prompts.observation import extract_json_object

STREAM = "later-drills"
TAG = "late"  # drill ids drill_gen_late<unit>_<kk> (pipeline.policy.statements.drill_id)
TAKE = "pick_up"  # the household's action that takes a thing (a key or what the goal needs)


def houses_for(n: int) -> int:
    """The houses ``n`` drills are expected to need: nearly every house gives one (its teacher
    picks something up); a tenth more for those that do not."""
    return (11 * max(0, n) + 9) // 10


def action_of(response: str) -> str | None:
    """The action an answer's JSON names (``"pick_up"``, ``"go_to"``, ...), or None."""
    return (extract_json_object(response) or {}).get("action")


def endgame_turns(episode: DemoEpisode) -> list[int]:
    """The learned turns of ``episode`` from its first that picks something up to its last, turn 0
    excepted (the plan and statement drills teach it): the drill's candidates."""
    actions = [action_of(t.response) for t in episode.turns]
    first = next((i for i, a in enumerate(actions) if a == TAKE), None)
    if first is None:
        return []
    return [i for i in range(max(1, first), len(episode.turns)) if episode.turns[i].train]


def later_drill(cfg: Config, scenes: Mapping[str, Any], memory: SceneMemory, organizer: PromptOrganizer,
                house: GeneratedHouse | None, *, rule_cfg: Config | None = None) -> RenderedTurn | None:
    """The drill of one house of the stream (module docstring), its id a placeholder
    (:func:`later_drills` numbers the drills in house order); None where the house gives none (an
    excluded draw, or a teacher that picked nothing up)."""
    if house is None:  # an excluded layout, or no quest left
        return None
    rule_cfg = rule_cfg if rule_cfg is not None else rule_agent_config(cfg)
    all_scenes = {**scenes, house.scene_id: house.spec}
    episodes, turns = past_visits(rule_cfg, house, all_scenes)
    rng = crc_rng(cfg.seed, STREAM, house.scene_id)
    grounded = rng.random() < cfg.policy.generated_grounding
    text = history_grounding(rule_cfg, house, episodes, turns) if grounded else None
    variants = house_variants(cfg, house_memory(cfg, memory, episodes, turns), organizer, house, text)
    v = variants[int(rng.integers(len(variants)))]
    row = house.row(0)
    prompt = freeze_prompt(organizer, row["objective"], row["scene_id"], v.grounding, v.block)
    episode = play_teacher(cfg, Path("."), all_scenes, row, prompt, rng=rng, slip_prob=0.0,
                           env=house_env(cfg, house))
    picks = endgame_turns(episode)
    if not picks:
        return None
    t = picks[int(rng.integers(len(picks)))]
    # the turns before it are rendered for the history they leave (the memory dict), and only turn t is kept
    upto = replace(episode, turns=episode.turns[:t + 1])
    return render_demos(cfg, [Demo.of(DemoKind.house_drill, f"{TAG}_{house.scene_id}", row, v, {}, upto, 0)])[t]


def later_drills(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any],
                 memory: SceneMemory, n: int, *, workers: OrderedPool | None = None,
                 progress: Callable[[int], None] | None = None) -> list[RenderedTurn]:
    """``n`` later-turn drills (module docstring), in house order, the same at any worker count.

    Raises:
        ValueError: the stream gave fewer than ``n`` drills from ``50 n + 100`` houses.
    """
    return draw_drills(cfg, manifest, scenes, memory, n, make=later_drill, stream=STREAM, tag=TAG,
                       houses_needed=houses_for, key="policy.later_drills", workers=workers, progress=progress)
