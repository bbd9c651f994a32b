"""``stream`` stage: the streaming protocol, memory that grows while the eval tasks are played.

    python -m pipeline.stages.stream             # what `dvc repro stream` runs
    dvc exp run -S 'experiment.stream.conditions=[C0,C1,C2,C2_silent,C2_placebo,C2_oracle]'
    python -m pipeline.core.config compose experiment=stream && dvc repro stream
    dvc plots show metrics/stream_success.csv    # success by stream position, a line per condition

Each condition of ``experiment.stream.conditions`` is one stream over the eval tasks
(:mod:`pipeline.session.stream`): each house's tasks in one seeded order, the same for every
condition, every episode entering that condition's own grounding and episodic store before the
house's next task is rendered (with the ``render`` stage's evidence checks) and played by the
``reader`` (and, with ``experiment.stream.model``, by the experiment's agent). No condition
(the default): the frozen protocol is the experiment's, and the stage writes empty outputs.

Reads ``data/games`` (and with ``experiment.stream.start=collect`` ``data/episodes`` and
``data/grounding``: the collected memory each stream starts from); writes
``data/stream/steps.parquet`` (one row per agent, condition and task: its position, the store's
hash and size and the grounding's episodes when its prompt was rendered, the entries retrieved and
injected, the block, the outcome; a stream replays and diffs from it), ``metrics/stream.json`` (per window, all positions and each
stream's second half: success per condition, and the experiment's comparison families, paired, with
exact and Holm p and the MDE; the memory-induced errors, C2 lost where C1 won after an advisory;
``workers`` and ``wall_time_s``) and ``metrics/stream_success.csv`` / ``stream_turns.csv`` for
``dvc plots``. Each stream's grounding documents, merges and finished rounds are scratch
(``.checkpoints/stream/<agent>/<key>/<condition>/``, removed once the outputs are written): a killed
run resumes each stream from its last finished round. Fails when C2_silent's stream shows a prompt C1's does not (``experiment.identical_prompts``).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa

from pipeline.agents import plays_with_model, reads_prompt
from pipeline.analysis.stream import ROW_FIELDS, stream_csv, stream_summary
from pipeline.conditions import block_length_for
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError
from pipeline.core.io import atomic_dir, atomic_write_json, atomic_write_text, write_parquet
from pipeline.envs import fact_reader, world_words
from pipeline.llm.backends import BackendError
from pipeline.session.evaluation import reader_config
from pipeline.session.experience import curve_workers
from pipeline.session.stream import check_identical_streams, play_streams
from pipeline.stages.common import pin_numerics, run_stage

STEP_SCHEMA = pa.schema([
    ("agent", pa.string()), ("condition", pa.string()), ("position", pa.int32()), ("length", pa.int32()),
    ("scene_id", pa.string()), ("quest_id", pa.string()), ("scene_split", pa.string()),
    ("success", pa.bool_()), ("turns", pa.int32()),
    ("store_entries", pa.int32()), ("store_hash", pa.string()), ("grounding_episodes", pa.int32()),
    ("retrieved_entry_ids", pa.list_(pa.string())), ("injected_entry_ids", pa.list_(pa.string())),
    ("gate_reason", pa.string()), ("prompt_sha256", pa.string()), ("memory_block", pa.string()),
])


def streams(cfg: Config, root: Path, _args: object) -> None:
    """Play every stream of ``experiment.stream``, write the steps and the summaries (module docstring)."""
    s = cfg.experiment.stream
    conditions = [str(c) for c in s.conditions]
    unknown = [c for c in conditions if c not in cfg.condition]
    if unknown:
        raise ConfigError(f"experiment.stream.conditions: {', '.join(unknown)} not configured "
                          f"(condition: {', '.join(cfg.condition)})")
    plays_agent = bool(s.model) and reads_prompt(cfg.agent)
    pin_numerics(cfg, runs_model=plays_agent and plays_with_model(cfg.agent))
    t0 = time.perf_counter()
    out = root / cfg.paths.stream
    rows, workers = [], {}
    scratch = root / cfg.paths.checkpoints / "stream"
    agents = [("reader", True)] + ([(str(cfg.agent.name), False)] if plays_agent else [])
    with atomic_dir(out) as tmp:
        for name, reader in agents if conditions else []:
            n = curve_workers(reader_config(cfg) if reader else cfg, len(conditions))
            workers[name] = n
            # each stream's grounding documents, merges and finished rounds: scratch, outside the
            # outputs (their index files name the folder they are in)
            played = play_streams(cfg, root, conditions=conditions, start=s.start, work_dir=scratch / name,
                                  length=block_length_for(cfg, root), words=world_words(cfg), facts=fact_reader(cfg),
                                  reader=reader, workers=n)
            differ = check_identical_streams(played, cfg.experiment.identical_prompts)
            if differ:
                raise ConfigError(f"stream [{name}]: streams that must show the same prompts do not:\n  "
                                  + "\n  ".join(differ[:10]) + (f"\n  ... ({len(differ)} in all)" if len(differ) > 10 else ""))
            for cond, steps in played.items():
                for st in steps:
                    p = st.prompt_row
                    rows.append({"agent": name, "condition": cond, "position": st.position, "length": st.length,
                                 "scene_id": st.task.scene_id, "quest_id": st.task.quest_id,
                                 "scene_split": str(p.get("scene_split") or ""), "success": bool(st.episode["is_correct"]),
                                 "turns": int(st.episode["num_turns"]), "store_entries": st.store_entries,
                                 "store_hash": p.get("store_hash"), "grounding_episodes": st.grounding_episodes,
                                 "retrieved_entry_ids": list(p.get("retrieved_entry_ids") or []),
                                 "injected_entry_ids": list(p.get("injected_entry_ids") or []),
                                 "gate_reason": p.get("gate_reason"), "prompt_sha256": p.get("prompt_sha256"),
                                 "memory_block": str(p.get("memory_block") or "")})
        write_parquet(pa.Table.from_pylist(rows, schema=STEP_SCHEMA), tmp / "steps.parquet",
                      sort_by=["agent", "condition", "scene_id", "position"])
    shutil.rmtree(scratch, ignore_errors=True)  # the outputs are written: nothing left to resume
    summary = stream_summary(rows, cfg)
    metrics_dir = root / cfg.paths.metrics
    # The run's own measures (never in data/stream/): the processes and the wall time.
    atomic_write_json(metrics_dir / "stream.json", {
        "conditions": conditions, "start": str(s.start), "fields": list(ROW_FIELDS), "points": summary["points"],
        "paired": summary["paired"], "degradations": summary["degradations"], "workers": workers, "wall_time_s": round(time.perf_counter() - t0, 3)})
    for value in ("success", "turns"):
        atomic_write_text(metrics_dir / f"stream_{value}.csv",
                          stream_csv(rows, agent="reader", value=value, conditions=conditions))
    if not conditions:
        print("stream: no condition in experiment.stream.conditions: the frozen protocol only (empty outputs)")
    for p in summary["paired"]:
        if p["family"] == "checks":
            continue
        x = p["success"]
        print(f"stream [{p['agent']}] {p['window']}: {p['treatment']} - {p['control']} {x['diff']['value']:+.2f} "
              f"(b={x['table']['b']}, c={x['table']['c']}, p={x['p_value']:.3g}, Holm {p['p_holm']:.3g})")


def main(argv: list[str] | None = None) -> int:
    return run_stage("stream", streams, argv, doc=__doc__, expected=(BackendError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
