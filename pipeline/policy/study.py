"""The model's study (issue 45): one more DAgger round from a finished run's model, per arm,
judged on held-out houses only (the whole-episode probe), never on the eval quests::

    python -m pipeline.policy.study                   # the study's arms on the run in .
    python -m pipeline.policy.study --arm long=quests=6,grounded=1.0 --houses 200
    python -m pipeline.policy.study --before-only      # the probes on the run's model

Each arm starts from the run's model (``paths.policy``: after its ``policy.dagger_rounds``
rounds) and plays round ``dagger_rounds`` (the next one: its own houses) as
:func:`pipeline.policy.dagger.run_rounds` does; the model then trains on the run's own DAgger
labels (``demos.parquet``), this round's, and as many demonstration units, one epoch at
``dagger_lr``. An arm is a set of ``key=value``:

- ``quests``: quests per generated house. Its grounding is what the simulated user taught
  the rule agent on every quest but the first (the one played), merged as ``ground`` +
  ``merge`` merge a scene's: 2 is the library's (:func:`pipeline.policy.demos.house_grounding`,
  one other quest, ~5 lines). An eval scene's grounding merges several train quests (~16
  lines in the default run), so longer groundings are what the model meets in C1.
- ``grounded``: the share of the round's houses that carry their grounding
  (``policy.generated_grounding`` in the library: 0.5).
- ``memory``: the share of the round's houses played under ``grounded+C2`` with the house's
  own *past visits* in the store: the rule agent's episodes of its later quests (the ones
  its grounding comes from) become store entries beside the run's, so the C2 block names
  where things were in this house ("This house, from n past visits: ..."), as an eval task
  of a seen scene's does (0 in the library: a generated house's C2 block only retrieves
  other houses' advisories, and a seen house's block is met in the train quests' demos only).
- ``drills``: statement drills trained with the round (:func:`statement_drills`): first turns
  under a prompt that says where things are (a past visit's grounding, or its C2 block alone)
  and no plan, where the knowledge-limited expert's answer is not what it would do told nothing.
  With ``--houses 0`` an arm plays no round: it trains on the run's labels, its drills and the
  replayed units only (``drills=0``: the control of that).

``--utilisation`` scores every model on the utilisation probe instead
(:mod:`pipeline.policy.utilisation`: five prompts on the held-out houses, the reader's outcomes
beside them, the model's difference over the reader's). Otherwise two probes score the run's model and each arm's, on the whole-episode probe's held-out houses
(:class:`pipeline.policy.dagger.EpisodeProbe`, whose tasks ``quests=2`` reproduces): ``p2``,
plain / grounded (the library's 2-quest grounding) / oracle; and ``pQ`` (``--probe-quests``),
grounded / oracle / memory with the longer grounding of the same houses' first quests, and
``memory`` the C1-like grounded prompt plus the C2 block built with the house's ``Q - 1`` past
visits in the store (the held-out analogue of C2 vs C1 on a seen scene). Each grounded
figure is paired with plain on the same houses (grounded houses are the harder ones: their
rule agent drew feedback), with the discordant pairs b (only grounded won) and c (only plain);
``memory`` is also paired with its probe's ``grounded`` (``b_vs_grounded``, ``c_vs_grounded``).

Nothing here is a DVC stage (no stage imports this module, so it is no stage's code
dependency) and nothing is written into the run: rows go to ``--out`` (JSON)
and a Markdown table is printed. The episodes (the arm's round, both probes) are played in
``--workers`` processes (:func:`pipeline.policy.dagger.rollout_pool`: the same rollouts at any count).
The arms' code is the candidate for the library: an arm
that wins moves into :mod:`pipeline.policy.dagger` / :mod:`pipeline.policy.demos` with the
next default run (changing them changes the model pipeline's recorded code).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from omegaconf import OmegaConf

from pipeline.core.conf_schema import ConditionKind, Config
from pipeline.core.config import MODEL, load_params, project_root
from pipeline.core.io import atomic_write_text, read_parquet
from pipeline.core.numerics import pin
from pipeline.core.parallel import OrderedPool, resolve_workers
from pipeline.core.seeding import crc_rng, derive_seed
from pipeline.envs.household.generate import GeneratedHouse
from pipeline.policy.dagger import (  # _task: the library's task of a house and prompt variant
    HouseTask,
    _task,
    house_variants,
    play_rollouts,
    rollout_config,
    rollout_pool,
    rollout_summary,
    turn_units,
)
from pipeline.policy.demos import (
    DemoKind,
    advisory_variant_names,
    SceneMemory,
    house_stream,
    rule_agent_config,
    training_houses,
    training_unit,
)
from pipeline.policy.statements import (  # shared with the library's statement drills
    history_grounding,
    house_memory,
    memory_variant,
    past_visits,
    statement_drills,
)
from pipeline.policy.training import DEMOS_FILE, MODEL_DIR
from pipeline.prompts import PromptOrganizer

KINDS = ("plain", "grounded", "oracle")  # the library's EpisodeProbe
ALL_KINDS = (*KINDS, "memory", "recall")  # recall: the memory block alone (no grounding; the utilisation probe's)
VISITS = "visits"  # the kind's suffix of a round's task whose store holds its house's past visits
# The study as run for docs/policy.md: name -> arm.
ARMS: dict[str, dict[str, float]] = {
    "more rounds": {"quests": 2, "grounded": 0.5},
    "long grounding": {"quests": 6, "grounded": 1.0},
    "grounded houses": {"quests": 2, "grounded": 1.0},
}


@dataclass(frozen=True)
class Arm:
    name: str
    quests: int = 2
    grounded: float = 0.5
    memory: float = 0.0
    drills: int = 0  # statement drills trained with the round (statement_drills)

    @classmethod
    def parse(cls, text: str) -> "Arm":
        """``NAME=key=value,key=value`` (keys: ``quests``, ``grounded``, ``memory``, ``drills``)."""
        name, _, rest = text.partition("=")
        if not name or not rest:
            raise ValueError(f"--arm {text!r}: expected NAME=key=value[,key=value] (keys: quests, grounded, memory, "
                             "drills)")
        kw: dict[str, Any] = {}
        for part in rest.split(","):
            key, _, value = part.partition("=")
            if key not in ("quests", "grounded", "memory", "drills") or not value:
                raise ValueError(f"--arm {text!r}: {part!r} is not quests=<int>, grounded=<share in [0, 1]>, "
                                 "memory=<share in [0, 1]> or drills=<int>")
            try:
                kw[key] = int(value) if key in ("quests", "drills") else float(value)
            except ValueError:
                raise ValueError(f"--arm {text!r}: {part!r}: {value!r} is not a number") from None
        arm = cls(name, **kw)
        if arm.quests < 2 or not 0.0 <= arm.grounded <= 1.0 or not 0.0 <= arm.memory <= 1.0 or arm.drills < 0:
            raise ValueError(f"--arm {text!r}: quests must be >= 2, grounded and memory in [0, 1], drills >= 0")
        return arm


def grounding_from_quests(rule_cfg: Config, house: GeneratedHouse, scenes: Mapping[str, Any]) -> str | None:
    """What the simulated user taught the rule agent on quests 1..n-1 of ``house``, merged.

    With 2 quests this is :func:`pipeline.policy.demos.house_grounding`'s text (a test keeps
    them equal); it differs only in playing every later quest, not the second alone."""
    return history_grounding(rule_cfg, house, *past_visits(rule_cfg, house, scenes))


def probe_tasks(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any], memory: SceneMemory,
                n: int, *, quests: int = 2, kinds: Sequence[str] = KINDS, skip: int = 0) -> list[HouseTask]:
    """The whole-episode probe's tasks (:meth:`pipeline.policy.dagger.EpisodeProbe.build`'s for
    ``quests=2`` and ``skip=0``), the grounding from ``quests - 1`` later quests of the same
    held-out houses (their first quests do not depend on ``quests``). ``skip``: the held-out
    stream's first ``skip`` houses are passed over (a fresh sample of houses for a confirmation)."""
    organizer, rule_cfg = PromptOrganizer.from_config(cfg), rule_agent_config(cfg)
    oracle = set(advisory_variant_names(cfg, ConditionKind.oracle))
    out = []
    for house in training_houses(cfg, manifest, scenes, heldout=True, quests_per_house=quests).houses(skip + n)[skip:]:
        episodes, turns = past_visits(rule_cfg, house, {**scenes, house.scene_id: house.spec})
        text = history_grounding(rule_cfg, house, episodes, turns)
        grounded = house_variants(cfg, memory, organizer, house, text)
        plain = house_variants(cfg, memory, organizer, house, None) if "plain" in kinds else []
        picks = {"plain": next((v for v in plain if v.bare), None),
                 "grounded": next((v for v in grounded if v.grounding is not None and not v.block), None),
                 "oracle": next((v for v in grounded if v.source in oracle), None), "memory": None}
        wanted = ("memory" in kinds and text is not None) or ("recall" in kinds and episodes)
        visited = house_memory(cfg, memory, episodes, turns) if wanted else memory  # once for both kinds
        if "memory" in kinds and text is not None:  # paired with "grounded": the same grounding, and the block
            picks["memory"] = memory_variant(cfg, visited, organizer, house, text)
        picks["recall"] = None
        if "recall" in kinds and episodes:  # paired with "plain": the same block, no grounding
            picks["recall"] = memory_variant(cfg, visited, organizer, house, None)
        out += [_task(cfg, organizer, f"probe_{k}_{house.scene_id}", k, house, picks[k])
                for k in ALL_KINDS if k in kinds and picks[k] is not None]
    return out


def round_tasks(cfg: Config, manifest: Sequence[Mapping[str, Any]], scenes: Mapping[str, Any], memory: SceneMemory,
                round_: int, n: int, arm: Arm) -> list[HouseTask]:
    """Round ``round_``'s houses (:func:`pipeline.policy.dagger.dagger_tasks`' stream and
    variant rule) with ``arm.quests`` quests and a share ``arm.grounded`` grounded."""
    houses = house_stream(cfg, manifest, scenes, derive_seed(cfg.seed, "dagger", round_), arm.quests)
    organizer, rule_cfg = PromptOrganizer.from_config(cfg), rule_agent_config(cfg)
    out = []
    for i, house in enumerate(houses.houses(n) if n > 0 else []):
        grounded = crc_rng(cfg.seed, "dagger-grounding", round_, house.scene_id).random() < arm.grounded
        # drawn only when the arm asks for it: the library's rounds (memory 0) keep their stream
        visits = arm.memory > 0 and crc_rng(cfg.seed, "dagger-memory", round_, house.scene_id).random() < arm.memory
        episodes, turns = past_visits(rule_cfg, house, {**scenes, house.scene_id: house.spec}) \
            if grounded or visits else ([], [])
        text = history_grounding(rule_cfg, house, episodes, turns) if grounded else None
        if visits:
            v = memory_variant(cfg, house_memory(cfg, memory, episodes, turns), organizer, house, text)
            if v is not None:
                out.append(_task(cfg, organizer, f"{DemoKind.dagger.prefix}{round_:02d}_{house.scene_id}",
                                 f"{v.name}+{VISITS}", house, v))
                continue
        variants = house_variants(cfg, memory, organizer, house, text)
        v = variants[i % len(variants)]
        out.append(_task(cfg, organizer, f"{DemoKind.dagger.prefix}{round_:02d}_{house.scene_id}", v.name, house, v))
    return out


def paired_table(results: Mapping[str, Mapping[str, bool]]) -> dict[str, dict[str, Any]]:
    """Per probe and kind: ``{"won", "n", "plain_won"}`` (plain on the same houses) and the
    discordant pairs ``b`` (only this kind won) and ``c`` (only plain won).

    ``results``: probe name -> task id (``probe_<kind>_<house>``) -> success; the plain
    episodes are read from the probe that has them."""
    plain = {tid.split("_", 2)[2]: won for r in results.values() for tid, won in r.items()
             if tid.startswith("probe_plain_")}
    out: dict[str, dict[str, Any]] = {}
    if plain:
        out["plain"] = {"won": sum(plain.values()), "n": len(plain)}
    for name, res in results.items():
        by_kind = {kind: {tid.split("_", 2)[2]: won for tid, won in res.items() if tid.startswith(f"probe_{kind}_")}
                   for kind in ("grounded", "oracle", "memory")}
        grounded = by_kind["grounded"]
        for kind, got in by_kind.items():
            if not got:
                continue
            missing = sorted(set(got) - set(plain))
            if missing:
                raise ValueError(f"probe {name!r}: no plain episode for house(s) {missing[:3]}")
            row = out[f"{name}_{kind}"] = {"won": sum(got.values()), "n": len(got),
                                           "plain_won": sum(plain[h] for h in got),
                                           "b": sum(got[h] and not plain[h] for h in got),
                                           "c": sum(plain[h] and not got[h] for h in got)}
            if kind == "memory":  # C2 vs C1: the same houses, the same grounding
                missing = sorted(set(got) - set(grounded))
                if missing:
                    raise ValueError(f"probe {name!r}: no grounded episode for house(s) {missing[:3]}")
                row.update(grounded_won=sum(grounded[h] for h in got),
                           b_vs_grounded=sum(got[h] and not grounded[h] for h in got),
                           c_vs_grounded=sum(grounded[h] and not got[h] for h in got))
    return out


def run_label_units(tokenizer: Any, demos_file: Path, weights: Mapping[str, float] | None = None) -> list[Any]:
    """The run's own DAgger labels (``demos.parquet``'s ``dagger_`` train rows) as training
    units, from the prompt text the run rendered (the backend's rendering: its ids are the
    text's, a test keeps them equal), weighted as the run trained them (``weights``: :func:`pipeline.policy.model.loss_weights` of its recipe)."""
    from pipeline.policy.model import IM_END, answer_sample, make_unit

    eos = tokenizer.convert_tokens_to_ids(IM_END)
    by: dict[str, list[Any]] = {}
    for r in read_parquet(demos_file).to_pylist():
        if r["train"] and r["demo_id"].startswith(DemoKind.dagger.prefix):
            ids = list(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"])
            by.setdefault(training_unit(r["demo_id"]), []).append(
                answer_sample(tokenizer, ids, r["response"], eos, **(weights or {})))
    return [make_unit(v) for _, v in sorted(by.items())]


class Study:
    """A finished run's games, demonstrations, model and the two probes' tasks."""

    def __init__(self, root: Path, cfg: Config, *, probe_houses: int, probe_quests: int,
                 pool: OrderedPool | None = None, probe_skip: int = 0, utilisation: bool = False):
        from pipeline.policy.demoset import load_demo_set
        from pipeline.session.collection import load_games

        self.root, self.cfg, self.rcfg = root, cfg, rollout_config(cfg)
        self.pool = pool if pool is not None else rollout_pool(self.rcfg)  # the episodes: any count, same rollouts
        self.manifest, self.scenes = load_games(root, cfg)
        self.demo_set = load_demo_set(root / cfg.paths.demos, tie_seed=int(cfg.seed))
        self._units: tuple[list[Any], list[Any]] | None = None
        mem = self.demo_set.memory
        self.reader: dict[str, bool] | None = None
        if utilisation:  # the utilisation probe's houses and prompts, the reader's outcomes played once
            from pipeline.policy.utilisation import KINDS as U_KINDS, play_reader

            self.probes = {"u": probe_tasks(cfg, self.manifest, self.scenes, mem, probe_houses, quests=probe_quests,
                                            kinds=tuple(U_KINDS), skip=probe_skip)}
            self.reader = play_reader(cfg, self.probes["u"])
            return
        self.probes = {"p2": probe_tasks(cfg, self.manifest, self.scenes, mem, probe_houses, skip=probe_skip)}
        if probe_quests != 2:
            self.probes[f"p{probe_quests}"] = probe_tasks(cfg, self.manifest, self.scenes, mem, probe_houses,
                                                          quests=probe_quests,
                                                          kinds=("grounded", "oracle", "memory"), skip=probe_skip)

    def units(self, model: Any, tokenizer: Any) -> tuple[list[Any], list[Any]]:
        """The demonstration units and the run's own DAgger label units, tokenized once: every
        arm's tokenizer is the run's, and the rendering does not read the weights."""
        if self._units is None:
            from pipeline.policy.model import loss_weights

            self._units = (turn_units(self.cfg, model, tokenizer, self.demo_set.turns)[0],
                           run_label_units(tokenizer, self.root / self.cfg.paths.policy / DEMOS_FILE,
                                           loss_weights(self.cfg.policy)))
        return self._units

    def model(self) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = self.root / self.cfg.paths.policy / MODEL_DIR
        return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)

    def probe(self, model: Any, tokenizer: Any) -> dict[str, dict[str, bool]]:
        return {name: {r.task.task_id: bool(r.success) for r in play_rollouts(self.pool, model, tokenizer, tasks, label=False)}
                for name, tasks in self.probes.items()}

    def arm(self, arm: Arm, houses: int, *, progress: Callable[[str], None] = print) -> dict[str, Any]:
        """One round of ``arm`` from the run's model: rollouts, training, both probes."""
        from pipeline.policy.model import train

        cfg, pol = self.cfg, self.cfg.policy
        model, tok = self.model()
        r = int(pol.dagger_rounds)
        t = time.perf_counter()
        tasks = round_tasks(cfg, self.manifest, self.scenes, self.demo_set.memory, r, houses, arm)
        rolls = play_rollouts(self.pool, model, tok, tasks, label=True)
        roll_s = time.perf_counter() - t
        progress(f"{arm.name}: {len(rolls)} episodes in {roll_s:.0f} s")
        base_units, run_labels = self.units(model, tok)
        units = run_labels + turn_units(cfg, model, tok, [x for roll in rolls for x in roll.labels])[0]
        drills = statement_drills(cfg, self.manifest, self.scenes, self.demo_set.memory, arm.drills) \
            if arm.drills else []
        units += turn_units(cfg, model, tok, drills)[0]
        k = min(len(base_units), int(float(pol.dagger_replay) * len(units)))
        rng = crc_rng(cfg.seed, "dagger-replay", r)
        replay = [base_units[i] for i in sorted(int(j) for j in rng.choice(len(base_units), size=k, replace=False))]
        t = time.perf_counter()
        model.train()
        curve = train(model, units + replay, OmegaConf.merge(pol, {"epochs": int(pol.dagger_epochs),
                                                                    "lr": float(pol.dagger_lr)}),
                      seed=int(cfg.seed) + 1 + r, pad_id=int(tok.pad_token_id))
        train_s = time.perf_counter() - t
        progress(f"{arm.name}: {len(curve)} steps in {train_s:.0f} s")
        t = time.perf_counter()
        results = self.probe(model, tok)
        return {"arm": arm.name, "quests": arm.quests, "grounded": arm.grounded, "memory": arm.memory,
                "drills": len(drills), "round": r,
                "houses": houses, "grounded_houses": sum(x.variant.grounding is not None for x in tasks),
                "memory_houses": sum(x.kind.endswith(f"+{VISITS}") for x in tasks),
                "rollout": rollout_summary(rolls), "units": len(units), "replayed_units": len(replay),
                "steps": len(curve), "final_loss": round(sum(c["loss"] for c in curve[-20:]) / max(1, len(curve[-20:])), 6),
                "probe": paired_table(results), "results": results,
                "seconds": {"rollouts": round(roll_s), "training": round(train_s),
                            "probes": round(time.perf_counter() - t)}}


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per row: the probe figures (won/n; plain on the same houses, b/c) and the rollout."""
    keys = [k for k in rows[0]["probe"]] if rows else []
    head = "| arm | " + " | ".join(keys) + " | rollout success / agreement | steps |"
    lines = [head, "|" + "---|" * (len(keys) + 3)]
    for row in rows:
        cells = []
        for k in keys:
            p = row["probe"].get(k)
            if p is None:
                cells.append("")
            elif "grounded_won" in p:
                cells.append(f"{p['won']}/{p['n']} (grounded {p['grounded_won']}; b={p['b_vs_grounded']} "
                             f"c={p['c_vs_grounded']})")
            elif "plain_won" in p:
                cells.append(f"{p['won']}/{p['n']} (plain {p['plain_won']}; b={p['b']} c={p['c']})")
            else:
                cells.append(f"{p['won']}/{p['n']}")
        roll = row.get("rollout") or {}
        lines.append(f"| {row['arm']} | " + " | ".join(cells)
                     + f" | {roll.get('success', '')} / {roll.get('expert_agreement', '')} | {row.get('steps', '')} |")
    return "\n".join(lines) + "\n"


def workers_option(ap: argparse.ArgumentParser, cfg: Config, text: str | None) -> int:
    """The processes a ``--workers`` option asks for (None: the run's ``workers``; ``auto``: this
    process's cores); a usage error naming the value otherwise."""
    try:
        return resolve_workers(cfg.workers if text is None else (int(text) if str(text).isdigit() else text))
    except ValueError as exc:
        ap.error(f"--workers {text}: expected a number of processes >= 1 or auto ({exc})")
        raise  # ap.error exits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.policy.study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=None, help="the finished run (default: this project)")
    ap.add_argument("--arm", action="append",
                    help="NAME=quests=<int>,grounded=<share>,memory=<share> (repeatable; default: the study's)")
    ap.add_argument("--houses", type=int, default=None, help="houses in the round (default: policy.dagger_houses)")
    ap.add_argument("--probe-houses", type=int, default=96, help="held-out houses in each probe")
    ap.add_argument("--probe-quests", type=int, default=6, help="quests per house of the long-grounding probe")
    ap.add_argument("--probe-skip", type=int, default=0,
                    help="pass over the held-out stream's first N houses (a fresh probe sample: a confirmation)")
    ap.add_argument("--before-only", action="store_true", help="only the probes on the run's model")
    ap.add_argument("--utilisation", action="store_true",
                    help="score on the utilisation probe instead (pipeline.policy.utilisation: --probe-houses houses of "
                         "--probe-quests quests, five prompts, the model beside the reader)")
    ap.add_argument("--workers", default=None,
                    help="processes for the episodes (default: the run's `workers`, auto = this process's cores); "
                         "the rollouts do not depend on it")
    ap.add_argument("--out", type=Path, default=Path(".checkpoints/dagger_study/study.json"), help="JSON rows")
    args = ap.parse_args(argv)
    root = (args.run or project_root()).resolve()
    try:
        arms = [Arm.parse(a) for a in args.arm] if args.arm else [Arm(n, **kw) for n, kw in ARMS.items()]
    except ValueError as exc:
        ap.error(str(exc))
    cfg = load_params(root, check_stale=False, pipeline=MODEL)
    demos = root / cfg.paths.policy / DEMOS_FILE
    if not demos.is_file():
        ap.error(f"{demos}: not found (the run's DAgger labels); build the model first: make model")
    workers = workers_option(ap, cfg, args.workers)
    pin(cfg.numerics)
    rows: list[dict[str, Any]] = []

    def keep(row: dict[str, Any]) -> None:
        if study.reader is not None:
            from pipeline.policy.utilisation import markdown as u_markdown, summarise

            row["utilisation"] = summarise(row["results"]["u"], study.reader, seed=int(cfg.seed))
            print(f"{row['arm']}:\n{u_markdown(row['utilisation'])}", flush=True)
        rows.append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, json.dumps(rows, indent=1) + "\n")
        print(markdown(rows[-1:]), flush=True)

    with rollout_pool(rollout_config(cfg), workers=workers) as pool:
        study = Study(root, cfg, probe_houses=args.probe_houses, probe_quests=args.probe_quests, pool=pool,
                      probe_skip=args.probe_skip, utilisation=args.utilisation)
        t = time.perf_counter()
        model, tok = study.model()
        results = study.probe(model, tok)
        keep({"arm": "the run's model", "workers": workers, "probe": paired_table(results), "results": results,
              "seconds": {"probes": round(time.perf_counter() - t)}})
        for arm in [] if args.before_only else arms:
            keep(study.arm(arm, int(args.houses if args.houses is not None else cfg.policy.dagger_houses)))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
