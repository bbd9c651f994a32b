"""The utilisation probe (issue 64): what the eval measures, on held-out generated houses, the
model beside the reader that measures each prompt's worth::

    python -m pipeline.policy.utilisation                        # models/policy, 96 held-out houses, 6 quests each
    python -m pipeline.policy.utilisation --model data/model/policy/model --houses 48 --out /tmp/u.json
    python -m pipeline.policy.utilisation --model cand/ --skip 96 --houses 192 --against control.json  # a decision

Per held-out house (the whole-episode probe's stream, :func:`pipeline.policy.demos.training_houses`
with ``heldout=True``: never an eval scene's layout, never an eval objective; each at the eval's
scenes' counts, ``policy.utilisation_sizes: env``, or ``--sizes drawn`` for the training's ranges,
where the reader solves nearly every house on its grounding alone), the rule agent plays
quests 1..Q-1 (the house's past visits, :func:`pipeline.policy.study.past_visits`), and the first
quest is played under five prompts, four as the eval's conditions build theirs on a seen scene:

- ``C0``: nothing (the ``plain`` kind);
- ``C1``: the house's grounding, what the simulated user taught on those visits (``grounded``);
- ``C2``: that grounding and the exposed advisory variant's block, retrieved from the model
  pipeline's store with the house's past visits in it ("This house, from n past visits: ...",
  ``memory``);
- ``C2_oracle``: that grounding and the verified plan (``oracle``);
- ``C0+memory``: the C2 block alone, no grounding (``recall``): in a generated house the grounding
  of one visit already tells the reader where things are, so what the block's statements are worth
  is measured against nothing.

Both agents play every task: the model (greedy, its decoding as ``evaluate`` plays it; the episodes
of :func:`pipeline.policy.dagger.play_rollouts`) and the reader (``agent=reader``: what the prompt's
text is worth to an agent that acts on all of it). Per agent, the comparisons are paired by house
(C1 - C0, C2 - C1, C2_oracle - C1: exact McNemar p, Holm within the agent), and the model's
*utilisation* of each is its difference over the reader's on the same houses, with a bootstrap
interval (:func:`pipeline.core.stats.ratio_of_paired_diffs`): what the eval's utilisation measures,
on data no eval quest is in, so a recipe can be chosen on it.

It reads the model pipeline's games and demonstrations (``data/model/games``, ``data/model/demos``:
``make model``, or its first two steps, ``python -m pipeline.stages.games --pipeline model`` and
``python -m pipeline.stages.demos``). It is the model pipeline's last step (``models/dvc.yaml``:
``--decisions``, after the checkpoint is published; ``--houses`` and ``--quests`` default to the
recipe's ``policy.utilisation_houses`` and ``policy.utilisation_quests``), so ``make model`` measures every checkpoint it builds. Writes ``--out``
(JSON: the figures and every house's outcomes) and ``--csv`` (success per agent and prompt kind: the
``utilisation`` plot of ``dvc plots show``).
``--against`` pairs this model with another model's ``--out`` on the same houses, per prompt and
pooled over C1 and C0+memory (:func:`against`): how a recipe's candidate is judged against the
checkpoint it would replace (``--skip``: on held-out houses no earlier decision used).

``--decisions`` also labels every state the model reached with the reader's answer there (the
reader as the teacher, :class:`pipeline.policy.teacher.ReaderTeacher`: what an agent that acts on
the whole prompt would do from the model's own state) and reports, per prompt kind, how often the
model played that command, split by what the reader's reasoning line says it decided
(:data:`DECISIONS`: take what it needs, go where a statement places it, keep a preference, ...) and
by turn 0 against the later turns: where the model leaves the reader's path. The episodes, and so
every success figure, are the same with it or without it (a label is never played).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from omegaconf import OmegaConf

from pipeline.core.conf_schema import Config, HouseSizing
from pipeline.core.config import MODEL, load_params, project_root
from pipeline.core.io import atomic_write_json, atomic_write_text, read_json
from pipeline.core.numerics import pin
from pipeline.core.seeding import crc_rng
from pipeline.core.stats import holm, mcnemar_exact, mcnemar_mde, mcnemar_table, paired_binary, ratio_of_paired_diffs
from pipeline.policy.dagger import HouseTask, play_rollouts, rollout_config, rollout_pool
from pipeline.policy.demos import house_env
from pipeline.policy.study import probe_tasks, workers_option
from pipeline.policy.teacher import _SEARCH_OPENINGS

# The probe's prompt kinds (pipeline.policy.study's names) as the eval's conditions they stand for.
# C0+memory is no eval condition: the C2 block without the grounding, whose use is measurable where
# the grounding already tells the reader what the block would (a generated house's, above all).
KINDS = {"plain": "C0", "grounded": "C1", "memory": "C2", "oracle": "C2_oracle", "recall": "C0+memory"}
# (treatment, control): the comparisons each agent is paired on, in the eval's families' order.
COMPARISONS = (("C2", "C1"), ("C2_oracle", "C1"), ("C1", "C0"), ("C0+memory", "C0"))
N_RESAMPLES = 2000
LEVEL = 0.95

# What the reader decided at a turn, read from its reasoning line (the teacher's answer's first
# line: the rationale of pipeline.agents.reader / pipeline.agents.base, then the command), lower
# case; the first kind with a phrase in the line wins, so the order matters (a search line may end in
# "take it" or "go there"). A line that matches none is "other" (a refused step's wait, a look).
DECISIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("verified plan", ("verified step",)),
    ("search", tuple(o.lower() for o in _SEARCH_OPENINGS) + ("i should examine it",)),
    ("keep a preference", ("the user wants", "so i close it again", "now i close", "now i lock", "close it to lock it")),
    ("open a believed holder", ("should be in", " holds ")),
    ("take what it needs", ("within reach", "is here and i need it", ": take it", "the task is to")),
    ("put it at the destination", ("put it ", "drop it here", "open it before putting", "is locked and i have its key")),
    ("carry it", ("i carry ", "i saw ")),
    ("go where a statement places it", (": go there", "on the way to the")),
)
OTHER = "other"


def decision_of(response: str) -> str:
    """The :data:`DECISIONS` kind of a teacher's answer (its first line), else :data:`OTHER`."""
    line = response.split("\n", 1)[0].lower()
    return next((name for name, phrases in DECISIONS if any(p in line for p in phrases)), OTHER)


def decisions(rolls: Sequence[Any]) -> dict[str, dict[str, dict[str, int]]]:
    """Per prompt kind (the eval's condition names), per decision kind and for ``turn 0`` /
    ``later`` / ``all``: the labelled turns and those where the model played the reader's command
    (``{"turns": n, "agreed": k}``), from labelled rollouts (:func:`pipeline.policy.dagger.play_rollouts`
    with ``label=True``)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for r in rolls:
        by = out.setdefault(KINDS[r.task.kind], {})
        for i, (label, agreed) in enumerate(zip(r.labels, r.agreement)):
            for key in (decision_of(label.response), "turn 0" if i == 0 else "later", "all"):
                cell = by.setdefault(key, {"turns": 0, "agreed": 0})
                cell["turns"] += 1
                cell["agreed"] += int(agreed)
    return {c: out[c] for c in KINDS.values() if c in out}


def decisions_markdown(table: Mapping[str, Mapping[str, Mapping[str, int]]]) -> str:
    """Rows: decision kinds, then turn 0 / later / all; columns: prompt kinds; cells: the share of
    the reader's commands the model played (turns)."""
    conds = list(table)
    rows = [name for name, _ in DECISIONS] + [OTHER, "turn 0", "later", "all"]
    lines = ["| the reader's decision | " + " | ".join(conds) + " |", "|---|" + "---|" * len(conds)]
    for row in rows:
        cells = [table[c].get(row) for c in conds]
        if not any(cells):
            continue
        lines.append(f"| {row} | " + " | ".join("" if x is None else f"{x['agreed'] / x['turns']:.2f} ({x['turns']})"
                                                 for x in cells) + " |")
    return "\n".join(lines) + "\n"


def probe_houses(cfg: Config, root: Path, houses: int, quests: int, skip: int, sizes: str) -> list[HouseTask]:
    """The probe's tasks: every held-out house's first quest under the five kinds (:data:`KINDS`;
    a house without grounding, or whose C2 block the gate withheld, has fewer); ``skip``: the
    held-out stream's first houses passed over (a fresh sample for a decision); ``sizes``: what the
    houses are sized by (:class:`HouseSizing`: ``env`` | ``drawn``), whatever the recipe trained on."""
    from pipeline.policy.demoset import load_demo_set
    from pipeline.session.collection import load_games

    manifest, scenes = load_games(root, cfg)
    memory = load_demo_set(root / cfg.paths.demos, tie_seed=int(cfg.seed)).memory
    sized = OmegaConf.merge(cfg, {"policy": {"house_sizes": sizes}})
    return probe_tasks(sized, manifest, scenes, memory, houses, quests=quests, kinds=tuple(KINDS), skip=skip)


def play_reader(cfg: Config, tasks: Sequence[HouseTask]) -> dict[str, bool]:
    """Each task played by the reader with the task's prompt (the bare one for ``plain``):
    task id -> success (won, and the house's preferences kept)."""
    from pipeline.agents import make_agent
    from pipeline.session.evaluation import reader_config

    rcfg = reader_config(cfg)
    out = {}
    for t in tasks:
        env = house_env(rcfg, t.house)
        obs = env.reset()
        agent = make_agent(rcfg, seed=0)
        agent.reset({"episode_id": t.task_id, "scene_id": t.row["scene_id"], "quest_id": t.row["quest_id"],
                     "objective": t.row["objective"], "seed": 0, "system_prompt": t.prompt})
        done, info = False, {}
        while not done:
            obs, _, done, info = env.step(agent.act(obs).action)
        env.close()
        out[t.task_id] = bool(info.get("won")) and bool(info.get("preferences_ok"))
    return out


def _by_kind(outcomes: Mapping[str, bool]) -> dict[str, dict[str, bool]]:
    """task id ``probe_<kind>_<house>`` -> success, as condition -> house -> success."""
    out: dict[str, dict[str, bool]] = {c: {} for c in KINDS.values()}
    for tid, won in outcomes.items():
        _, kind, house = tid.split("_", 2)
        out[KINDS[kind]][house] = won
    return out


def summarise(model: Mapping[str, bool], reader: Mapping[str, bool], *, seed: int,
              alpha: float = 0.05) -> dict[str, Any]:
    """Success per agent and condition, the paired comparisons (Holm within each agent) and the
    model's utilisation of each comparison, from the two agents' outcomes (task id -> success)."""
    agents = {"model": _by_kind(model), "reader": _by_kind(reader)}
    rng = crc_rng(seed, "utilisation")
    success = {a: {c: {"success": round(float(np.mean(list(h.values()))), 6) if h else None, "n": len(h)}
                   for c, h in by.items()} for a, by in agents.items()}
    paired: list[dict[str, Any]] = []
    for name, by in agents.items():
        rows = []
        for t, c in COMPARISONS:
            houses = sorted(set(by[t]) & set(by[c]) & set(agents["reader"][t]) & set(agents["reader"][c]))
            if not houses:
                continue
            x = paired_binary([by[t][h] for h in houses], [by[c][h] for h in houses], n_resamples=N_RESAMPLES,
                              level=LEVEL, rng=rng)
            row = {"agent": name, "treatment": t, "control": c, "houses": len(houses), "success": x,
                   "mde": mcnemar_mde(len(houses), alpha)}  # None: too few houses for any difference
            if name == "model":  # its difference over the reader's, on the same houses
                r = agents["reader"]
                row["utilisation"] = ratio_of_paired_diffs(
                    [by[t][h] for h in houses], [by[c][h] for h in houses], [r[t][h] for h in houses],
                    [r[c][h] for h in houses], n_resamples=N_RESAMPLES, level=LEVEL, rng=rng).as_dict()
            rows.append(row)
        for row, p in zip(rows, holm([r["success"]["p_value"] for r in rows])):
            row["p_holm"] = p
        paired += rows
    return {"success": success, "paired": paired}


# The candidate-against-control rules of a recipe's decisions (docs/policy.md): the statements' use pooled
# over the two prompts that state where things are and give no plan (statement drills), and every episode
# pooled over the five prompts (a wider model: better at all of it, worse at none).
POOLED = ("C1", "C0+memory")
ALL = "all five prompts"


def against(model: Mapping[str, bool], other: Mapping[str, bool]) -> dict[str, dict[str, Any]]:
    """This model's outcomes paired with another model's on the same tasks (task id -> success):
    per condition, pooled over :data:`POOLED` and over every condition (:data:`ALL`), the successes
    of each, the discordant pairs ``b`` (only this model won) and ``c`` (only the other) and the
    exact McNemar p."""
    mine, theirs = _by_kind(model), _by_kind(other)
    out: dict[str, dict[str, Any]] = {}
    groups = [(c, (c,)) for c in KINDS.values()] + [(" + ".join(POOLED), POOLED), (ALL, tuple(KINDS.values()))]
    for name, conds in groups:
        pairs = [(mine[c][h], theirs[c][h]) for c in conds for h in sorted(set(mine[c]) & set(theirs[c]))]
        if not pairs:
            continue
        t = mcnemar_table([a for a, _ in pairs], [b for _, b in pairs])
        out[name] = {"n": len(pairs), "won": sum(a for a, _ in pairs), "other_won": sum(b for _, b in pairs),
                     "b": t["b"], "c": t["c"], "p_exact": mcnemar_exact(t["b"], t["c"])}
    return out


def against_markdown(rows: Mapping[str, Mapping[str, Any]], other: str) -> str:
    lines = [f"| prompt | tasks | this model | {other} | b / c | exact p |", "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {r['n']} | {r['won']} | {r['other_won']} | {r['b']} / {r['c']} | {r['p_exact']:.3g} |"
              for k, r in rows.items()]
    return "\n".join(lines) + "\n"


def success_csv(summary: Mapping[str, Any]) -> str:
    """``agent,condition,success,n,who``: one row per agent and prompt kind; ``who`` (``model C0``) labels
    the bars of the DVC plot, one per agent and prompt."""
    lines = ["agent,condition,success,n,who"]
    for agent, by in summary["success"].items():
        for cond in KINDS.values():
            s = by[cond]
            lines.append(f"{agent},{cond},{'' if s['success'] is None else s['success']},{s['n']},{agent} {cond}")
    return "\n".join(lines) + "\n"


def markdown(summary: Mapping[str, Any]) -> str:
    """The probe's table: per comparison, each agent's difference (b/c, Holm p) and the utilisation."""
    s = summary["success"]
    head = ["| | " + " | ".join(KINDS.values()) + " |", "|---|" + "---|" * len(KINDS)]
    for agent in ("model", "reader"):
        head.append(f"| {agent} | " + " | ".join("" if s[agent][c]["success"] is None else
                                                 f"{s[agent][c]['success']:.2f} (n {s[agent][c]['n']})"
                                                 for c in KINDS.values()) + " |")
    lines = head + ["", "| comparison | houses | model | reader | utilisation |", "|---|---|---|---|---|"]
    by = {(r["agent"], r["treatment"], r["control"]): r for r in summary["paired"]}
    for t, c in COMPARISONS:
        if ("model", t, c) not in by:
            continue
        cells = []
        for agent in ("model", "reader"):
            r = by[(agent, t, c)]
            x, d = r["success"], r["success"]["diff"]["value"]
            cells.append("" if d is None else f"{d:+.2f} (b {x['table']['b']}, c {x['table']['c']}, Holm p {r['p_holm']:.3g})")
        u = by[("model", t, c)]["utilisation"]
        util = "" if u["value"] is None else (f"{u['value']:.2f} [{u['ci_low']:.2f}, {u['ci_high']:.2f}]"
                                                  if u["ci_low"] is not None else f"{u['value']:.2f}")
        lines.append(f"| {t} − {c} | {by[('model', t, c)]['houses']} | {cells[0]} | {cells[1]} | {util} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.policy.utilisation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=None, help="the project whose model pipeline's data it reads (default: this one)")
    ap.add_argument("--model", type=Path, default=Path("models/policy"),
                    help="a transformers directory (default: the committed checkpoint, models/policy)")
    ap.add_argument("--houses", type=int, default=None, help="held-out houses (default: the recipe's policy.utilisation_houses)")
    ap.add_argument("--skip", type=int, default=0, help="held-out houses passed over first (a fresh sample)")
    ap.add_argument("--against", type=Path, default=None,
                    help="another model's --out of the same houses: the two paired per prompt (exact McNemar)")
    ap.add_argument("--quests", type=int, default=None, help="quests per house: the first is played, the others are its "
                                                             "past visits (default: the recipe's policy.utilisation_quests)")
    ap.add_argument("--sizes", choices=[s.value for s in HouseSizing], default=None,
                    help="what the held-out houses are sized by: env (the eval's scenes' counts) or drawn (the "
                         "training's ranges; the study's earlier arms) (default: the recipe's policy.utilisation_sizes)")
    ap.add_argument("--workers", default=None, help="processes for the model's episodes (default: the run's `workers`); "
                                                   "the episodes do not depend on it")
    ap.add_argument("--out", type=Path, default=Path("models/metrics/utilisation.json"), help="the figures (JSON)")
    ap.add_argument("--csv", type=Path, default=Path("models/metrics/utilisation.csv"), help="success per agent and kind")
    ap.add_argument("--decisions", action="store_true",
                    help="also label the model's states with the reader's answer: how often the model plays it, "
                         "by the reader's decision and prompt kind (the episodes do not change)")
    args = ap.parse_args(argv)
    root = (args.run or project_root()).resolve()
    cfg = load_params(root, check_stale=False, pipeline=MODEL)
    args.houses = cfg.policy.utilisation_houses if args.houses is None else args.houses
    args.quests = cfg.policy.utilisation_quests if args.quests is None else args.quests
    args.sizes = str(cfg.policy.utilisation_sizes if args.sizes is None else args.sizes)
    other = None
    if args.against is not None:
        try:
            other = read_json(args.against)
        except (OSError, ValueError) as exc:
            ap.error(f"--against {args.against}: {exc}")
        # a file without "sizes" was written before the option: its houses were drawn
        theirs = (other.get("houses"), other.get("quests"), other.get("skip", 0), other.get("sizes", "drawn"))
        if theirs != (args.houses, args.quests, args.skip, args.sizes):
            ap.error(f"--against {args.against}: it played houses={theirs[0]} quests={theirs[1]} skip={theirs[2]} "
                     f"sizes={theirs[3]}, this run houses={args.houses} quests={args.quests} skip={args.skip} "
                     f"sizes={args.sizes}")
    if args.skip < 0:
        ap.error(f"--skip {args.skip}: expected a count of held-out houses >= 0")
    if args.houses < 1 or args.quests < 2:
        ap.error(f"--houses {args.houses} --quests {args.quests}: expected at least 1 house and 2 quests "
                 "(the first is played, the others give its grounding and memory)")
    model_dir = args.model if args.model.is_absolute() else root / args.model
    if not (model_dir / "config.json").is_file():
        ap.error(f"--model {args.model}: {model_dir / 'config.json'} not found (a transformers model directory)")
    for what, path in (("games", cfg.paths.games), ("demonstrations", cfg.paths.demos)):
        if not (root / path).is_dir():
            ap.error(f"{root / path}: not found (the model pipeline's {what}); build them with "
                     "`python -m pipeline.stages.games --pipeline model && python -m pipeline.stages.demos` (or make model)")
    workers = workers_option(ap, cfg, args.workers)
    pin(cfg.numerics)  # before torch loads (transformers imports it)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tasks = probe_houses(cfg, root, args.houses, args.quests, args.skip, args.sizes)
    build_s = time.perf_counter() - t0
    print(f"utilisation: {len(tasks)} episodes in {len({t.house.scene_id for t in tasks})} held-out houses "
          f"({build_s:.0f} s to build)", file=sys.stderr)
    t = time.perf_counter()
    reader = play_reader(cfg, tasks)
    reader_s = time.perf_counter() - t
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    t = time.perf_counter()
    play_cfg = rollout_config(cfg)
    if args.decisions:  # the reader labels the states (whatever teacher the recipe names)
        play_cfg = OmegaConf.merge(play_cfg, {"policy": {"teacher": "reader"}})
    with rollout_pool(play_cfg, workers=workers) as pool:
        rolls = play_rollouts(pool, model, tok, tasks, label=args.decisions)
    model_s = time.perf_counter() - t
    played = {r.task.task_id: bool(r.success) for r in rolls}
    table = decisions(rolls) if args.decisions else None
    summary = summarise(played, reader, seed=int(cfg.seed))
    atomic_write_json(args.out if args.out.is_absolute() else root / args.out, {
        "model": str(args.model), "houses": args.houses, "quests": args.quests, "skip": args.skip,
        "sizes": args.sizes, **summary,
        **({"against": {"model": other.get("model"), "paired": against(played, other["outcomes"]["model"])}}
           if other is not None else {}),
        **({"decisions": table} if table is not None else {}),
        "outcomes": {"model": played, "reader": reader},
        "seconds": {"build": round(build_s), "reader": round(reader_s), "model": round(model_s)},
        "workers": workers})
    atomic_write_text(args.csv if args.csv.is_absolute() else root / args.csv, success_csv(summary))
    print(markdown(summary))
    if table is not None:
        print(decisions_markdown(table))
    if other is not None:
        # the other column named by its file too: two runs of one path (models/policy in two clones) read alike
        print(against_markdown(against(played, other["outcomes"]["model"]), f"{other.get('model')} ({args.against})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
