"""The experiment's design study: what each condition's text is worth to the reader, per design.

The default experiment must give both the grounding and the memory something of their own
to say (docs/memory.md). This tool measures it for candidate designs with the ``reader``
(:mod:`pipeline.agents.reader`: acts on exactly what its prompt states) as the instrument,
on a *design seed* (never the default run's seed: its eval quests decide nothing here)::

    python -m pipeline.tools.design                                  # the study's grid, seed 1000
    python -m pipeline.tools.design --seed 1001 --ks 0 1 2 4 8
    python -m pipeline.tools.design --point my=user.spatial=none,env.regularity=0.8

Each design point is a set of ``key=value`` overrides of ``params.yaml``. For each, in a
scratch folder (``--work``, default ``.checkpoints/design``): the games are built (shared
by the points whose world is the same), a rule agent plays the train quests with the
simulated user (``--collector``; the default run's collector is the model itself), their
grounding and episodic store are built as the ``ground`` and ``store`` stages build them,
and :func:`pipeline.session.experience.experience_curve` renders C0 / C1 / C2 / C2_placebo
from the first ``k`` episodes of each scene and lets the reader play them. The rows go to
``--out`` (CSV, one per point, ``k``, condition and scene split; a DVC plot in dvc.yaml) and
a summary table is printed: success and turns per condition, the paired differences C1 - C0
and C2 - C1 with their discordant pairs and exact McNemar p.

Nothing here is a DVC stage: a design study compiles worlds by the hundred. What it chose is
the default config; the default run then reports the same figures on its own seed.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from omegaconf import OmegaConf

from pipeline.core.conf_schema import AgentConfig, AgentName, Config
from pipeline.core.config import ConfigError, compose_text, config_hash, project_root, validate
from pipeline.core.io import atomic_write_text, read_parquet
from pipeline.core.stats import mcnemar_exact, mcnemar_table
from pipeline.envs import build_games, fact_reader, world_words
from pipeline.grounding.episodes import ground, write_ground_outputs
from pipeline.memory.build import build_store
from pipeline.session.collection import collection_hash, load_games, run_collection
from pipeline.session.experience import CurvePoint, experience_curve
from pipeline.session.rollout import tasks_from_manifest

CONDITIONS = ("C0", "C1", "C2", "C2_placebo")
# The study as run for docs/memory.md: name -> overrides (on top of params.yaml).
# The previous default (the seed's design): a user who says where everything is, small houses
# with things anywhere, 2 visits per house, each advisory its own episode's facts, 30 steps.
BEFORE = ["user.spatial=full", "memory.facts=episode", "memory.lessons=false", "memory.same_scene_first=false",
          "env.num_scenes=8", "env.heldout_scenes=2", "env.rooms_per_scene=3", "env.containers_per_scene=4",
          "env.locked_containers=1", "env.supporters_per_scene=1", "env.objects_per_scene=4",
          "env.train_quests_per_scene=2", "env.eval_quests_per_scene=14", "env.max_steps=30", "env.regularity=0.0"]
GRID: dict[str, list[str]] = {
    "before": BEFORE,
    "quiet user": BEFORE + ["user.spatial=none"],
    "quiet, recall": BEFORE + ["user.spatial=none", "memory.facts=house", "memory.lessons=true",
                               "memory.same_scene_first=true", "env.train_quests_per_scene=6"],
    "default": [],
    "30 steps": ["env.max_steps=30"],
    "no regularity": ["env.regularity=0.0"],
    "user says the room": ["user.spatial=room"],
    "episode facts": ["memory.facts=episode"],
    "no lessons": ["memory.lessons=false"],
}
# What the games depend on (the `games` stage's params in dvc.yaml): equal worlds share their games.
GAMES_KEYS = ("seed", "env.name", "env.scienceworld", "env.num_scenes", "env.heldout_scenes", "env.rooms_per_scene",
              "env.containers_per_scene", "env.locked_containers", "env.supporters_per_scene", "env.objects_per_scene",
              "env.train_quests_per_scene", "env.eval_quests_per_scene", "env.min_quest_length",
              "env.regularity", "user.preferences_per_scene")
CSV_FIELDS = ("point", "seed", "k", "held", "condition", "split", "n", "success", "turns", "injected")


def point_config(base: Config, overrides: Sequence[str], seed: int, collector: str) -> Config:
    """``base`` with ``overrides`` (``key=value``, YAML values), the design seed and a rule-agent collector."""
    try:
        dotlist = OmegaConf.from_dotlist(list(overrides) + [f"seed={seed}"])
    except Exception as exc:  # OmegaConf's grammar errors name the item
        raise ConfigError(f"design point overrides {list(overrides)}: {exc}") from exc
    cfg = validate(OmegaConf.merge(base, dotlist))
    agent = OmegaConf.structured(AgentConfig(name=AgentName(collector)))
    return validate(OmegaConf.merge(cfg, {"agent": agent}))


def summarise(points: Sequence[CurvePoint], name: str, seed: int) -> list[dict[str, Any]]:
    """CSV rows: per curve point, all tasks and each scene split."""
    rows = []
    for p in points:
        splits = sorted({o.scene_split for o in p.outcomes})
        for split in ["all", *splits]:
            out = [o for o in p.outcomes if split == "all" or o.scene_split == split]
            if not out:
                continue
            rows.append({"point": name, "seed": seed, "k": p.k, "held": p.held, "condition": p.condition,
                         "split": split, "n": len(out), "success": round(sum(o.success for o in out) / len(out), 4),
                         "turns": round(sum(o.turns for o in out) / len(out), 3), "injected": p.injected})
    return rows


def at_largest_k(rows: Sequence[dict[str, Any]], name: str, split: str) -> dict[str, dict[str, Any]]:
    """Point ``name``'s rows of scene split ``split`` at its largest k, by condition."""
    kmax = max(r["k"] for r in rows if r["point"] == name)
    return {r["condition"]: r for r in rows if r["point"] == name and r["k"] == kmax and r["split"] == split}


def summary_csv(rows: Sequence[dict[str, Any]]) -> str:
    """One row per point at its largest k (all tasks): each condition's success and the two
    differences, labelled for ``dvc plots`` (template ``bar_horizontal``, ``y: point``)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["point", "k", *CONDITIONS, "c1_minus_c0", "c2_minus_c1"])
    for name in dict.fromkeys(r["point"] for r in rows):
        at = at_largest_k(rows, name, "all")
        cell = {c: r["success"] for c, r in at.items()}
        diff = [f"{cell[a] - cell[b]:+.4f}" if a in cell and b in cell else "" for a, b in (("C1", "C0"), ("C2", "C1"))]
        w.writerow([name, max(r["k"] for r in rows if r["point"] == name), *(cell.get(c, "") for c in CONDITIONS), *diff])
    return buf.getvalue()


def paired(points: Sequence[CurvePoint], k: int, treatment: str, control: str) -> str:
    """``+0.12 (b=15, c=2, p=0.002)``: the paired success difference at ``k``."""
    by = {(p.k, p.condition): p for p in points}
    t, c = by.get((k, treatment)), by.get((k, control))
    if t is None or c is None:
        return "-"
    tab = mcnemar_table([o.success for o in t.outcomes], [o.success for o in c.outcomes])
    diff = t.success - c.success
    return f"{diff:+.2f} (b={tab['b']}, c={tab['c']}, p={mcnemar_exact(tab['b'], tab['c']):.3g})"


def table(results: dict[str, list[CurvePoint]]) -> str:
    """Markdown: one row per point and k."""
    lines = ["| point | k | " + " | ".join(f"{c} success / turns" for c in CONDITIONS) + " | C1 - C0 | C2 - C1 |",
             "|" + "---|" * (4 + len(CONDITIONS))]
    for name, points in results.items():
        ks = sorted({p.k for p in points})
        by = {(p.k, p.condition): p for p in points}
        for k in ks:
            cells = [f"{by[(k, c)].success:.2f} / {by[(k, c)].turns:.1f}" if (k, c) in by else "-" for c in CONDITIONS]
            lines.append(f"| {name} | {k} | " + " | ".join(cells) +
                         f" | {paired(points, k, 'C1', 'C0')} | {paired(points, k, 'C2', 'C1')} |")
    return "\n".join(lines)


def markdown_page(results: dict[str, list[CurvePoint]], args: argparse.Namespace, rows: Sequence[dict]) -> str:
    """The study's page: what was run, each point's overrides, the table (success / mean turns
    per condition, the paired differences), and the same by scene split at the largest k."""
    cmd = ["python -m pipeline.tools.design", f"--seed {args.seed}", "--ks " + " ".join(map(str, args.ks)),
           f"--collector {args.collector}"]
    points = _parse_points(args.point)
    lines = ["# Design study: what each condition's text is worth to the reader", "",
             "Written by `" + " ".join(cmd) + (" --point ..." if args.point else "") + f" --markdown {args.markdown}`"
             " (pipeline/tools/design.py): every point is the default config with the overrides below, on the design "
             f"seed {args.seed} (never the default run's), the train quests played by `{args.collector}` with the "
             "simulated user, then every condition rendered from the first k past episodes of each scene and played "
             "by the reader. Cells: success / mean turns; differences: paired, exact McNemar p.", "",
             "| point | overrides |", "|---|---|"]
    lines += [f"| {name} | {', '.join(f'`{o}`' for o in points.get(name, [])) or '(the default)'} |" for name in results]
    lines += ["", table(results), "", "By scene split, at each point's largest k (success):", "",
              "| point | split | n | " + " | ".join(CONDITIONS) + " |", "|" + "---|" * (3 + len(CONDITIONS))]
    for name in results:
        for split in ("seen", "heldout"):
            cells = at_largest_k(rows, name, split)
            if cells:
                n = next(iter(cells.values()))["n"]
                lines.append(f"| {name} | {split} | {n} | " + " | ".join(
                    f"{cells[c]['success']:.2f}" if c in cells else "-" for c in CONDITIONS) + " |")
    return "\n".join(lines) + "\n"


def run_point(base: Config, root: Path, work: Path, name: str, overrides: Sequence[str], *, seed: int,
              ks: Sequence[int], collector: str, conditions: Sequence[str] = CONDITIONS) -> list[CurvePoint]:
    """One design point: games (shared by equal worlds), collection, grounding, store, the curve."""
    cfg = point_config(base, overrides, seed, collector)
    world = work / f"world-{config_hash(cfg, *GAMES_KEYS)}"
    world.mkdir(parents=True, exist_ok=True)
    for name_ in ("conf",):  # templates and the knowledge base, read relative to the root
        link = world / name_
        if not link.exists():
            link.symlink_to(root / name_)
    point_dir = f"data/points/{name}-{config_hash(cfg)}"
    cfg = validate(OmegaConf.merge(cfg, {"paths": {
        "episodes": f"{point_dir}/episodes", "grounding": f"{point_dir}/grounding", "metrics": f"{point_dir}/metrics",
        "checkpoints": f"{point_dir}/.checkpoints"}}))
    if not (world / cfg.paths.games / "manifest.parquet").exists():
        build_games(cfg, world, progress=True)
    manifest, scenes = load_games(world, cfg)
    tasks = tasks_from_manifest(manifest, split="train", master_seed=cfg.seed)
    if not (world / cfg.paths.episodes / "episodes.parquet").exists():
        run_collection(cfg, world, tasks, world / cfg.paths.episodes, scenes=scenes, ckpt_name="design-collect",
                       desc=f"{name}: collect [{collector}]")
    episodes = read_parquet(world / cfg.paths.episodes / "episodes.parquet")
    turns = read_parquet(world / cfg.paths.episodes / "turns.parquet")
    docs = ground(episodes.to_pylist(), turns.to_pylist(), generator="extractive", timestamp=cfg.grounding.timestamp,
                  unknown_type=cfg.grounding.unknown_type)
    index = write_ground_outputs(docs, world / cfg.paths.grounding, cfg.grounding.save_format)
    store = build_store(episodes, turns, reader=fact_reader(cfg), splits=list(cfg.memory.store_splits) or None,
                        config_hash=collection_hash(cfg))
    store.tie_seed = cfg.seed
    return experience_curve(cfg, world, ks=ks, conditions=list(conditions), episodes=episodes.to_pylist(),
                            grounding_index=index, store=store, work_dir=Path(point_dir) / "curve",
                            words=world_words(cfg), facts=fact_reader(cfg))


def _parse_points(items: Sequence[str] | None) -> dict[str, list[str]]:
    if not items:
        return dict(GRID)
    out = {}
    for item in items:
        name, sep, rest = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--point {item!r}: expected NAME=key=value,key=value (or NAME= for params.yaml as is)")
        out[name] = [o for o in rest.split(",") if o]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.tools.design", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1000, help="design seed (never the default run's)")
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4], help="past episodes per scene")
    ap.add_argument("--point", action="append", help="NAME=key=value,key=value (repeatable; default: the study's grid)")
    ap.add_argument("--collector", default="react", choices=[a.value for a in AgentName if a != AgentName.llm],
                    help="the rule agent that plays the train quests")
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS), help="conditions played")
    ap.add_argument("--work", type=Path, default=Path(".checkpoints/design"), help="scratch folder")
    ap.add_argument("--out", type=Path, default=None, help="CSV of the rows (one per point, k, condition, split)")
    ap.add_argument("--markdown", type=Path, default=None,
                    help="write the summary table, with the command that made it, to this Markdown file")
    args = ap.parse_args(argv)
    try:
        root = project_root()
        base = validate(OmegaConf.create(compose_text(root)))  # conf/ as it is now (params.yaml may be stale)
        if args.seed == base.seed:
            raise ConfigError(f"--seed {args.seed} is the default run's seed: design on another seed")
        work = (args.work if args.work.is_absolute() else root / args.work).resolve()
        results: dict[str, list[CurvePoint]] = {}
        rows: list[dict[str, Any]] = []
        for name, overrides in _parse_points(args.point).items():
            t0 = time.perf_counter()
            results[name] = run_point(base, root, work, name, overrides, seed=args.seed, ks=args.ks,
                                      collector=args.collector, conditions=args.conditions)
            rows += summarise(results[name], name, args.seed)
            print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            print(table({name: results[name]}), file=sys.stderr, flush=True)
        print(table(results))
        if args.markdown:
            atomic_write_text(args.markdown, markdown_page(results, args, rows))
        if args.out:
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
            atomic_write_text(args.out, buf.getvalue())
            summary = args.out.with_name(args.out.stem + "_summary.csv")
            atomic_write_text(summary, summary_csv(rows))
            print(f"wrote {args.out} and {summary}; draw C2 - C1 per point with `dvc plots show {summary} "
                  "--template bar_horizontal -x c2_minus_c1 -y point` (c1_minus_c0 for the grounding)", file=sys.stderr)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
