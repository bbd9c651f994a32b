"""The policy's scaling study (issue 30): data x model size x steps -> in-context score.

    # 1. on the machine that has the built games (``dvc repro games``): build each data
    #    variant's demonstrations, tokenizer, training units and in-context probe once
    python -m pipeline.policy.scaling prepare --out study/ \\
        --data 'd2400={"generated_drills": 2400}' 'd9600={"generated_drills": 9600}'
    # 2. anywhere torch runs (a GPU if there is one; no TextWorld, no games needed):
    #    train every grid point from scratch and probe it while it trains
    python -m pipeline.policy.scaling run --bundle study/ --device cuda --jobs 6 --out results/ \\
        --grid 'd2400' 'd9600' 'd9600:hidden_size=256,intermediate_size=704,n_head=8'
    # 3. the table (markdown)
    python -m pipeline.policy.scaling table results/

``run`` exits 1 when a grid point failed (after printing the table of the others); the table
marks a point whose record is not final (stopped, failed or still training: its figures are
those of its last probe) with ``(partial)`` and says how many there are. ``run`` removes each
of its points' records of an earlier run before it starts the point, and lists its points in
``_grid.json`` in the results folder: ``table`` shows that run's points only (a point without a
record, failed before its first probe or not yet at it: ``(no record)``) and names the records
of earlier runs it leaves out (``table --all`` shows them too, marked ``(earlier run)``).

``prepare`` calls the policy step's own library (``build_demo_set``, ``tokenize_demos``,
``InContextProbe.build``) on ``params.yaml`` with each variant's ``policy`` overrides,
and writes per variant: the tokenizer (``save_pretrained``), the training units and the
probe's tasks as gzipped JSON (no pickle), and the probe's config as YAML. ``run`` trains
a fresh model per grid point with ``pipeline.policy.model.train`` (the stage's trainer, on
``--device``) and scores the probe (``InContextProbe.score``, the stage's scorer) every
``--every`` steps and at the end; each point is one process (``--jobs`` at a time), one
JSON file per point. A grid point is ``DATA[:key=value,...]``, the keys
``policy``'s (sizes, ``epochs``, ``lr``, ``episodes_per_batch``, ...).

This is a study tool, not a stage: its results are not DVC outputs, and a GPU's float
reductions differ from the CPU's, so a point's figures say which device made them; the
default policy is trained on the CPU by ``make model``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.core.io import atomic_write_bytes, atomic_write_text


def _parse_pairs(text: str) -> dict[str, Any]:
    """``a=1,b=x`` -> ``{"a": 1, "b": "x"}`` (values read as JSON where they parse)."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise SystemExit(f"scaling: grid override {part!r}: expected key=value")
        k, v = part.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v.strip()
    return out


def _write_json_gz(path: Path, obj: Any) -> None:
    # mtime=0: the same bundle gives the same bytes
    atomic_write_bytes(path, gzip.compress(json.dumps(obj, separators=(",", ":")).encode("utf-8"), mtime=0))


def _read_json_gz(path: Path) -> Any:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


# ----------------------------------------------------------------------------- prepare


def prepare(out: Path, variants: dict[str, dict[str, Any]]) -> None:
    """Every variant's bundle from ``params.yaml`` and the built games of the project at cwd."""
    from pipeline.core.config import MODEL, load_params, project_root
    from pipeline.core.numerics import pin
    from pipeline.session.collection import load_games

    base = load_params(pipeline=MODEL)
    pin(base.numerics)  # before anything loads torch: the numerics the policy step trains under
    root = project_root()
    manifest, scenes = load_games(root, base)
    for name, overrides in variants.items():
        info = prepare_bundle(base, root, manifest, scenes, out / name, overrides)
        print(f"prepared {name}: {info['units']} units, {info['tokens_per_epoch']:,} tokens/epoch, "
              f"{info['probe_tasks']} probe tasks ({info['prepare_s']} s)", flush=True)


def prepare_bundle(base: Any, root: Path, manifest: Any, scenes: Any, d: Path, overrides: dict[str, Any]) -> dict:
    """One data variant: ``base`` with ``policy`` ``overrides``, through the policy
    stage's own library, written into ``d``; returns its ``info.json``."""
    from omegaconf import OmegaConf

    from pipeline.policy.demoset import build_demo_set
    from pipeline.policy.incontext import InContextProbe
    from pipeline.policy.training import tokenize_demos

    t0 = time.perf_counter()
    cfg = OmegaConf.merge(base, {"policy": overrides})
    ds = build_demo_set(cfg, root, manifest, scenes)
    tok = tokenize_demos(cfg, ds.turns)
    probe = InContextProbe.build(cfg, manifest, scenes, ds.memory, n=int(cfg.policy.incontext_tasks))
    d.mkdir(parents=True, exist_ok=True)
    tok.tokenizer.save_pretrained(d / "tokenizer")
    _write_json_gz(d / "units.json.gz", [[u.prefix, [[p, a] for p, a in u.turns]] for u in tok.units])
    _write_json_gz(d / "probe.json.gz", [dataclasses.asdict(t) for t in probe.tasks])
    atomic_write_text(d / "probe_config.yaml", OmegaConf.to_yaml(probe.cfg, resolve=True))
    info = {"overrides": overrides, "policy": OmegaConf.to_container(cfg.policy, resolve=True),
            "seed": int(cfg.seed), "units": len(tok.units), "train_turns": sum(len(u.turns) for u in tok.units),
            "tokens_per_epoch": sum(u.tokens for u in tok.units), "probe_tasks": len(probe.tasks),
            "pad_id": int(tok.tokenizer.pad_token_id), "prepare_s": round(time.perf_counter() - t0, 1)}
    atomic_write_text(d / "info.json", json.dumps(info, indent=1, sort_keys=True) + "\n")
    return info


# ----------------------------------------------------------------------------- run


GRID_FILE = "_grid.json"  # the points of the last ``run`` into a results folder (``table`` shows those)


def record_name(point: str) -> str:
    """The file name of a grid point's record in the results folder."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in point) + ".json"


def run_point(bundle: Path, point: str, device: str, every: int, out: Path, threads: int) -> dict[str, Any]:
    """Train one grid point from scratch on ``device`` and probe it; returns (and writes) its record."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from pipeline.core.conf_schema import PolicyConfig
    from pipeline.policy.incontext import InContextProbe, ProbeTask
    from pipeline.policy.model import Unit, build_model, count_parameters, train

    torch.set_num_threads(threads)
    data, _, rest = point.partition(":")
    d = bundle / data
    info = json.loads((d / "info.json").read_text())
    overrides = _parse_pairs(rest)
    fields = {f.name for f in dataclasses.fields(PolicyConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise SystemExit(f"scaling: grid point {point!r}: unknown policy keys {unknown}")
    pol = PolicyConfig(**{k: v for k, v in info["policy"].items() if k in fields})
    pol = dataclasses.replace(pol, **overrides)
    tokenizer = AutoTokenizer.from_pretrained(str(d / "tokenizer"))
    units = [Unit(prefix, [(p, a) for p, a in turns]) for prefix, turns in _read_json_gz(d / "units.json.gz")]
    pcfg = OmegaConf.load(d / "probe_config.yaml")
    pcfg.model.device = device
    probe = InContextProbe(pcfg, [ProbeTask(**t) for t in _read_json_gz(d / "probe.json.gz")])
    model = build_model(tokenizer, pol, seed=info["seed"]).to(device)
    steps_total = pol.epochs * -(-len(units) // pol.episodes_per_batch)
    curve: list[dict[str, Any]] = []
    state: dict[str, Any] = {"step": 0, "probe_s": 0.0, "losses": []}
    t0 = time.perf_counter()
    tokens = sum(u.tokens for u in units)
    out.mkdir(parents=True, exist_ok=True)

    def record(done: bool) -> dict[str, Any]:
        """The point's record so far (written after every probe: a point stopped early keeps its curve)."""
        wall = time.perf_counter() - t0
        tail = state["losses"][-50:]
        rec = {"point": point, "data": data, "overrides": overrides, "device": device, "done": done,
               "device_name": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu",
               "parameters": count_parameters(model), "steps": state["step"], "steps_planned": steps_total,
               "epochs": pol.epochs, "tokens_per_epoch": tokens,
               "tokens_seen": round(tokens * pol.epochs * state["step"] / max(1, steps_total)),
               "units": len(units), "final_loss": sum(tail) / max(1, len(tail)),
               "train_s": round(wall - state["probe_s"], 1), "probe_s": round(state["probe_s"], 1),
               "final": {k: v for k, v in curve[-1].items() if k != "step"}, "curve": curve}
        atomic_write_text(out / record_name(point), json.dumps(rec, indent=1, sort_keys=True) + "\n")
        return rec

    def measure() -> None:
        t = time.perf_counter()
        curve.append({"step": state["step"], **probe.score(model, tokenizer)})
        state["probe_s"] += time.perf_counter() - t
        record(False)

    def on_step(n: int, loss: float) -> None:
        state["step"] += n
        state["losses"].append(loss)
        if every > 0 and state["step"] % every == 0 and state["step"] < steps_total:
            measure()
            print(f"[{point}] step {state['step']}/{steps_total} loss {loss:.3f} {curve[-1]}", flush=True)

    measure()
    losses = train(model, units, pol, seed=info["seed"], pad_id=info["pad_id"], progress=on_step)
    curve.append({"step": state["step"], **probe.score(model, tokenizer)})
    rec = record(True)
    print(f"[{point}] done: {rec['final']} in {rec['train_s']} s ({len(losses)} steps)", flush=True)
    return rec


def run_grid(bundle: Path, points: list[str], device: str, every: int, out: Path, jobs: int,
             threads: int) -> list[str]:
    """Every point in its own process, ``jobs`` at a time (a failure is that point's, not the grid's:
    the others run on); returns the failed points, each with its exit code. The points are listed in
    ``out/_grid.json`` and each point's record of an earlier run is removed before the point starts
    (a point that fails before its first probe must not show an earlier run's figures).

    Raises:
        ValueError: ``jobs`` < 1 (nothing would ever start), or two points share a record file.
    """
    if jobs < 1:
        raise ValueError(f"scaling: --jobs {jobs}: expected a number of points trained at a time >= 1")
    names = [record_name(p) for p in points]
    clash = sorted({n for n in names if names.count(n) > 1 or n == GRID_FILE})
    if clash:
        raise ValueError(f"scaling: --grid: points written to the same file ({', '.join(clash)}): name them apart")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / GRID_FILE, json.dumps({"points": list(points)}, indent=1) + "\n")
    for name in names:
        (out / name).unlink(missing_ok=True)
    pending, running, failed = list(points), [], []
    while pending or running:
        while pending and len(running) < jobs:
            p = pending.pop(0)
            cmd = [sys.executable, "-m", "pipeline.policy.scaling", "point", "--bundle", str(bundle), "--device", device,
                   "--every", str(every), "--out", str(out), "--threads", str(threads), p]
            running.append((p, subprocess.Popen(cmd)))
        time.sleep(1.0)
        for item in list(running):
            if item[1].poll() is not None:
                running.remove(item)
                if item[1].returncode != 0:
                    failed.append(f"{item[0]} (exit {item[1].returncode})")
    if failed:
        print("scaling: failed points: " + "; ".join(failed), file=sys.stderr)
    return failed


# ----------------------------------------------------------------------------- table


def table(results: Path, *, earlier: bool = False) -> str:
    """The markdown table of a results folder; a point whose record is not final is marked ``(partial)``.

    When a ``run`` wrote the folder (``_grid.json``), the rows are its points, each point without a record
    marked ``(no record)``, and the records of earlier runs are left out, named in a note (``earlier``:
    shown, marked ``(earlier run)``)."""
    recs = sorted((json.loads(p.read_text()) for p in results.glob("*.json") if p.name != GRID_FILE),
                  key=lambda r: r["point"])
    grid = json.loads((results / GRID_FILE).read_text())["points"] if (results / GRID_FILE).is_file() else None
    old = [r["point"] for r in recs if grid is not None and r["point"] not in grid]
    missing = [] if grid is None else [p for p in grid if p not in {r["point"] for r in recs}]
    if not earlier:
        recs = [r for r in recs if r["point"] not in old]
    head = ("| point | parameters | steps (of planned) | tokens seen | oracle first step | plain first step | plan copied | "
            "best plan copied (step) | loss | train s | device |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in recs:
        f = r["final"]
        best = max(r["curve"], key=lambda c: (c.get("oracle_plan_copied", 0), -c["step"]))
        point = r["point"] + ("" if r.get("done") else " (partial)") + (" (earlier run)" if r["point"] in old else "")
        lines.append(f"| {point} | {r['parameters']:,} | {r['steps']:,} ({r['steps_planned']:,}) | "
                     f"{r['tokens_seen'] / 1e6:.2f}M | "
                     f"{f.get('oracle_first_step', 0):.2f} | {f.get('plain_first_step', 0):.2f} | "
                     f"{f.get('oracle_plan_copied', 0):.2f} | {best.get('oracle_plan_copied', 0):.2f} "
                     f"({best['step']}) | {r['final_loss']:.3f} | {r['train_s']:.0f} | {r['device_name']} |")
    lines += [f"| {p} (no record) |" + " – |" * (head.count("|") - 2) for p in missing]
    partial = sum(not r.get("done") for r in recs)
    if partial:
        lines += ["", f"{partial} of {len(recs)} points are partial (stopped, failed or still training): their "
                      "figures are those of their last probe, not of the planned steps."]
    if missing:
        lines += ["", f"{len(missing)} of {len(grid)} points of the run have no record (failed before their first "
                      f"probe, or not yet at it): {', '.join(missing)}."]
    if old:
        verb = "are" if len(old) > 1 else "is"
        lines += ["", f"{len(old)} record{'s' if len(old) > 1 else ''} of earlier runs in {results} {verb} "
                      f"{'shown, marked (earlier run)' if earlier else 'left out (table --all shows them)'}: "
                      f"{', '.join(old)}."]
    return "\n".join(lines)


def _count(least: int) -> Any:
    """An argparse type: an integer >= ``least`` (``--jobs 0`` started no point and waited for ever)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= {least}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.policy.scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build each data variant's bundle (needs the built games)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--data", nargs="+", required=True, metavar="NAME=JSON",
                   help='a data variant: name and its policy overrides, e.g. d9600=\'{"generated_drills": 9600}\'')
    for name in ("run", "point"):
        r = sub.add_parser(name, help="train and probe grid points" if name == "run" else "one point (run's worker)")
        r.add_argument("--bundle", type=Path, required=True)
        r.add_argument("--device", default="cpu")
        r.add_argument("--every", type=_count(0), default=400,
                       help="training steps between probes (0: start and end only)")
        r.add_argument("--out", type=Path, required=True)
        r.add_argument("--threads", type=_count(1), default=1, help="torch threads per point")
        if name == "run":
            r.add_argument("--jobs", type=_count(1), default=1, help="points trained at a time")
            r.add_argument("--grid", nargs="+", required=True, metavar="DATA[:k=v,...]")
        else:
            r.add_argument("point")
    t = sub.add_parser("table", help="the markdown table of a results folder (its last run's points)")
    t.add_argument("results", type=Path)
    t.add_argument("--all", action="store_true", help="also the records of earlier runs in the folder")
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        variants = {}
        for spec in a.data:
            name, _, js = spec.partition("=")
            try:
                variants[name] = json.loads(js) if js else {}
            except json.JSONDecodeError as exc:
                raise SystemExit(f"scaling: --data {spec!r}: the overrides are not JSON ({exc})") from exc
        prepare(a.out, variants)
    elif a.cmd == "run":
        try:
            failed = run_grid(a.bundle, a.grid, a.device, a.every, a.out, a.jobs, a.threads)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        print(table(a.out))
        if failed:
            return 1
    elif a.cmd == "point":
        run_point(a.bundle, a.point, a.device, a.every, a.out, a.threads)
    else:
        print(table(a.results, earlier=a.all))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
