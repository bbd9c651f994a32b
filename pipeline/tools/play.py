"""Interactive session: watch the agent play one quest and give it typed feedback (seed 000).

    python -m pipeline.tools.play                          # asks for an episode number
    python -m pipeline.tools.play --episode 3 --scene scene_00 agent=rag env.max_steps=15
    printf '1\\nfeedback : spatial: Apple_2 is in Fridge_0\\n\\n' | python -m pipeline.tools.play

Seed 000's flow: the person enters an episode number; the grounding files given by
``grounding.files`` plus this session folder's ``grounding_latest.json`` are merged and
shown (the llm agent gets them in its system prompt); the agent (``agent`` config) acts
step by step in a TextWorld quest (episode number ``n`` picks the n-th quest of the
split, cyclically, unless ``--quest`` names one). After each step the person types
``feedback : <type>: <text>`` lines (types: user_preference, spatial, procedural,
general), ``status : Failure`` to override the step's status, an empty line to go on, or
``quit`` to end the episode. At the end the grounding is generated and written as the
pipeline writes it::

    <out>/episode_<n>/grounding_episode_<n>.json|.txt
    <out>/grounding_latest.json|.txt

ready to be merged into the next run (list the file in ``grounding.files``). Needs the
``games`` stage's output (``dvc repro games``). Trailing ``key=value`` arguments are Hydra
overrides of ``conf/``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

from omegaconf import OmegaConf

from pipeline.agents import plays_with_model
from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError, compose_text, project_root, validate
from pipeline.core.io import ArtifactError, read_json, read_parquet
from pipeline.core.numerics import NumericsError, pin
from pipeline.core.schemas import FEEDBACK_TYPES, STATUSES
from pipeline.core.seeding import task_seed
from pipeline.envs.common import step_status
from pipeline.grounding import (
    GroundingError,
    GroundingFileManager,
    feedback_from_lines,
    grounding_content,
    render_episode_text,
    split_grounding_paths,
)
from pipeline.grounding.episodes import make_generate as grounding_generator
from pipeline.session.collection import make_factories
from pipeline.session.rollout import Task, tasks_from_manifest

DEFAULT_OUT = "outputs/play"
_STATUS_RE = re.compile(r"^\s*status\s*[:：]\s*(\S+)\s*$", re.IGNORECASE)


class Console:
    """Line input/output of the session (stdin/stdout by default; EOF ends the input)."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None):
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.closed = False

    def say(self, text: str = "") -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def ask(self, prompt: str) -> str | None:
        """One line without its newline, or ``None`` once the input has ended."""
        if self.closed:
            return None
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            self.closed = True
            self.stdout.write("\n")
            return None
        return line.rstrip("\r\n")


def ask_episode_number(console: Console) -> int:
    """Seed 000's first step: "사용자가 Episode 번호 입력" (re-asked until valid)."""
    while True:
        answer = console.ask("Episode number: ")
        if answer is None:
            raise GroundingError("no episode number given (input ended)")
        if answer.strip().isdigit() and int(answer) >= 1:
            return int(answer)
        console.say(f"error: {answer.strip()!r} is not an episode number (an integer >= 1)")


def ask_step_feedback(console: Console, step_id: int, status: str, unknown_type: str) -> tuple[dict, str, bool]:
    """Read one step's feedback lines until an empty line.

    Returns:
        ``(feedback by type, status, quit)``: feedback as ``append_step_feedback`` takes
        it, the status (possibly overridden by a ``status : <S>`` line), and whether the
        person typed ``quit``.
    """
    texts: dict[str, list[str]] = {t: [] for t in FEEDBACK_TYPES}
    while True:
        line = console.ask(f"[step {step_id} | {status}] feedback> ")
        if line is None or not line.strip():
            break
        if line.strip().lower() in ("quit", "exit", "q"):
            return _joined(texts), status, True
        m = _STATUS_RE.match(line)
        if m:
            if m.group(1) in STATUSES:
                status = m.group(1)
            else:
                console.say(f"error: status {m.group(1)!r}: expected one of {' | '.join(STATUSES)}")
            continue
        try:
            parsed = feedback_from_lines([line], unknown_type, where=f"step {step_id}")
        except ValueError as exc:  # rejected by grounding.unknown_type=reject: say so, ask again
            console.say(f"error: {exc}; the line was not recorded")
            continue
        for t, text in parsed.items():
            if text:
                texts[t].append(text)
    return _joined(texts), status, False


def _joined(texts: dict[str, list[str]]) -> dict[str, str | None]:
    # Several remarks of one type in one step are joined as pipeline.grounding.feedback does.
    return {t: ("; ".join(v) if v else None) for t, v in texts.items()}


def _describe(obs: dict) -> str:
    inv = ", ".join(obs.get("agent_inventory") or []) or "nothing"
    seen = ", ".join(obs.get("visible_entities") or []) or "nothing"
    return f"  at {obs.get('agent_location')}; carrying {inv}; sees {seen}"


def run_session(cfg: Config, root: Path, console: Console, *, episode: int | None = None, split: str = "train",
                scene: str | None = None, quest: str | None = None, out_dir: Path | None = None,
                make_generate: Callable[[Any], Callable[[str], str] | None] | None = None) -> list[Path]:
    """Play one episode with a person giving feedback; write and return its grounding files."""
    out_dir = out_dir or root / DEFAULT_OUT
    g = cfg.grounding
    games = root / cfg.paths.games
    manifest = read_parquet(games / "manifest.parquet").to_pylist()
    scenes = read_json(games / "scenes.json")
    n, task = _pick_task(cfg, console, manifest, games, episode=episode, split=split, scene=scene, quest=quest)
    files = _grounding_in_effect(cfg, out_dir)
    console.say(f"Episode {n}: scene {task.scene_id}, quest {task.quest_id}, agent {cfg.agent.name}")
    console.say(f"Objective: {task.objective}")
    previous = grounding_content(files, root=root) if files else ""
    console.say("Grounding in effect:\n" + (previous if previous else "  (none)"))

    make_env, make_agent_for, _ = make_factories(cfg, root, scenes)
    env = make_env(task)
    agent = make_agent_for(task)
    agent.reset({"episode_id": task.episode_id, "scene_id": task.scene_id, "quest_id": task.quest_id,
                 "objective": task.objective, "seed": task.seed, "system_prompt": None})
    gfm = GroundingFileManager(n, out_dir=out_dir, save_format=g.save_format, unknown_type=g.unknown_type,
                               expr_info={"scene_id": task.scene_id, "quest_id": task.quest_id,
                                          "objective": task.objective, "agent": str(cfg.agent.name)},
                               latest_dirs=[out_dir])
    try:
        step_id, info = _play_steps(console, env, agent, task, gfm, g.unknown_type)
    finally:
        env.close()
    verdict = "won" if info.get("won") else "not won"
    console.say(f"\nEpisode over after {step_id} steps ({verdict}).")
    return _save_grounding(cfg, console, gfm, out_dir, make_generate)


def _pick_task(cfg: Config, console: Console, manifest: list[dict], games: Path, *, episode: int | None,
               split: str, scene: str | None, quest: str | None) -> tuple[int, Task]:
    """The episode number (asked when not given) and its task: the n-th matching quest, cyclically."""
    tasks = [t for t in tasks_from_manifest(manifest, split=split, master_seed=cfg.seed)
             if (scene is None or t.scene_id == scene) and (quest is None or t.quest_id == quest)]
    if not tasks:
        raise GroundingError(f"no {split} quest matches scene={scene!r} quest={quest!r} in "
                             f"{games / 'manifest.parquet'}")
    n = episode if episode is not None else ask_episode_number(console)
    task = tasks[(n - 1) % len(tasks)]
    task.episode_id = str(n)
    task.seed = task_seed(cfg.seed, task.scene_id, task.quest_id, "play", n)
    return n, task


def _grounding_in_effect(cfg: Config, out_dir: Path) -> list[str]:
    """``grounding.files`` plus this folder's latest grounding; written back into ``cfg``.

    Seed 000: the earlier grounding (configured files + this folder's latest) goes into
    the system prompt; the llm agent reads grounding.files, so the list is extended there.
    """
    g = cfg.grounding
    files = split_grounding_paths(g.files if isinstance(g.files, str) else list(g.files or []))
    latest = out_dir / "grounding_latest.json"
    if latest.exists() and str(latest) not in files:
        files.append(str(latest))
    cfg.grounding.files = files
    return files


def _play_steps(console: Console, env: Any, agent: Any, task: Task, gfm: GroundingFileManager,
                unknown: str) -> tuple[int, dict]:
    """The agent acts until the episode ends or the person quits; ``(steps played, last info)``."""
    obs = env.reset()
    plan_len = len(task.expert_plan)
    done, step_id, info = False, 0, {}
    while not done:
        step_id += 1
        console.say(f"\n--- Step {step_id} ---\n{_describe(obs)}")
        step = agent.act(obs)
        obs, _, done, info = env.step(step.action)
        if step.reasoning:
            console.say(f"  agent thinks: {step.reasoning}")
        console.say(f"  agent does: {info.get('command') or step.action}")
        console.say(f"  game says: {info.get('env_feedback', '')}")
        status = step_status(info, plan_len)
        if info.get("expert_plan") is not None:
            plan_len = len(info["expert_plan"])
        feedback, status, quit_ = ask_step_feedback(console, step_id, status, unknown)
        gfm.append_step_feedback(step_id, info.get("command") or str(step.action), status, feedback)
        if quit_:
            break
    return step_id, info


def _save_grounding(cfg: Config, console: Console, gfm: GroundingFileManager, out_dir: Path,
                    make_generate: Callable[[Any], Callable[[str], str] | None] | None) -> list[Path]:
    """Generate the episode's final grounding, write its files and show them."""
    g = cfg.grounding
    generate = make_generate(cfg) if make_generate is not None else None
    final = gfm.generate_final_grounding(g.generator, generate=generate, timestamp=g.timestamp)
    paths = gfm.save_final_grounding(final)
    if gfm.expr_info.get("fallback_reason"):
        console.say(f"(llm grounding fell back to extractive: {gfm.expr_info['fallback_reason']})")
    text = render_episode_text(gfm.to_dict())
    console.say("Grounding of this episode:\n" + (text if text else "  (no feedback given)"))
    for p in paths:
        console.say(f"wrote {p}")
    console.say(f"Use it in the next run: add {out_dir / 'grounding_latest.json'} to grounding.files")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.play", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episode", type=int, default=None, help="episode number (asked when omitted)")
    parser.add_argument("--split", default="train", choices=("train", "eval"), help="quests to play")
    parser.add_argument("--scene", default=None, help="only quests of this scene")
    parser.add_argument("--quest", default=None, help="only this quest id")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"session folder (default {DEFAULT_OUT})")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. agent=rag env.max_steps=10")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        root = project_root()
        cfg = validate(OmegaConf.create(compose_text(root, args.overrides)))
        if plays_with_model(cfg.agent) or cfg.grounding.generator == "llm":
            pin(cfg.numerics)  # before anything loads torch: the numerics the stages use
        if args.episode is not None and args.episode < 1:
            raise GroundingError(f"--episode={args.episode}: expected an integer >= 1")
        out = Path(args.out)
        run_session(cfg, root, Console(), episode=args.episode, split=args.split, scene=args.scene,
                    quest=args.quest, out_dir=out if out.is_absolute() else root / out,
                    make_generate=grounding_generator)
    except (ConfigError, ArtifactError, GroundingError, NumericsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: nothing written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
