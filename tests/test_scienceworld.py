"""ScienceWorld through the project's seams: real episodes in a real JVM.

The tests that play need the ``scienceworld`` package and Java and are skipped, with the
reason, where either is missing (``make scienceworld`` installs both); the grammar, the
sentences and the answer to an ambiguous command are checked without them. The tiny
world is built once for the module (``sw_games``); most tests reuse a pool JVM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.envs.scienceworld.engine import missing
from reliability.helpers import pid_alive

needs_jvm = pytest.mark.skipif(missing() is not None, reason=f"ScienceWorld cannot run here: {missing()}")

ROOT = Path(__file__).resolve().parents[1]
SHOWN = ("scene", "agent_location", "agent_inventory", "visible_entities", "available_actions", "description",
         "objective", "admissible_commands", "admissible_actions", "step", "max_steps")


@pytest.fixture(scope="module")
def sw_cfg():
    from pipeline.core.config import compose_text, validate

    return validate(OmegaConf.create(compose_text(ROOT, ["env=scienceworld_tiny", "agent=react", "model=none"])))


@pytest.fixture(scope="module")
def sw_games(sw_cfg, tmp_path_factory):
    """The tiny ScienceWorld's variations, built once (one train, one eval of find-non-living-thing)."""
    from pipeline.envs import build_games

    return build_games(sw_cfg, tmp_path_factory.mktemp("sw_project"), progress=False)


def _row(games, split):
    return next(r for r in games.rows if r["split"] == split)


def _env(games, row, max_steps=30, fresh_jvm=False):
    """An env of the module's JVM pool (reused: seconds saved; the pipeline's default is a JVM per episode)."""
    from pipeline.envs.scienceworld.env import ScienceWorldTaskEnv

    return ScienceWorldTaskEnv(games.root / row["game_file"], scene_id=row["scene_id"], quest_id=row["quest_id"],
                               max_steps=max_steps, fresh_jvm=fresh_jvm)


def test_action_dicts_and_commands_say_the_same_thing():
    from pipeline.envs.scienceworld.commands import action_to_command, command_to_action

    for command in ("move metal pot to sink", "pour cup containing nothing in table into bowl", "look around",
                    "use thermometer in inventory on substance in metal pot", "use lighter", "go to door to kitchen",
                    "connect battery anode to blue wire terminal 1", "focus on red light bulb"):
        assert action_to_command(command_to_action(command)) == command
    assert command_to_action("pour cup containing nothing in table into bowl") == {
        "action": "pour", "target": "cup containing nothing in table", "receptacle": "bowl"}
    with pytest.raises(ValueError, match="no ScienceWorld verb"):
        command_to_action("reset task")


def test_descriptions_read_back_as_the_facts_they_were_written_from():
    from pipeline.core.facts import fact
    from pipeline.envs.scienceworld.text import describe, read_statements

    facts = (fact("here", "kitchen"), fact("at", "stove", "kitchen"), fact("active", "stove"),
             fact("in", "substance in metal pot", "metal pot"), fact("matter", "water", "liquid"),
             fact("closed", "door to hallway"), fact("exit", "kitchen", "hallway", "hallway"), fact("carried", "thermometer"))
    assert read_statements(describe(facts)) == facts
    assert "From the kitchen a door leads to the hallway." in describe(facts)  # a door, taken by the room's name
    assert read_statements("feedback : spatial: The metal pot is in the cupboard.") == (
        fact("in", "metal pot", "cupboard"),)


def test_an_ambiguous_command_gets_the_same_answer_whatever_the_engines_listing_order():
    from pipeline.envs.scienceworld.build import playable_gold
    from pipeline.envs.scienceworld.env import send

    class Server:
        def __init__(self, order):
            self.order, self.sent = order, []

        def step(self, command):
            self.sent.append(command)
            if len(self.sent) == 1:
                return "Ambiguous request: Please enter the number ...\n" + "\n".join(
                    f"{i}:\topen {d}" for i, d in enumerate(self.order)) + f"\n{len(self.order)}:\t"
            return f"answered {command}"

    class Sim:
        def __init__(self, order):
            self.server = Server(order)

    a, b = Sim(["door to kitchen", "door to greenhouse"]), Sim(["door to greenhouse", "door to kitchen"])
    assert send(a, "open door") == ("answered 1", True) and send(b, "open door") == ("answered 0", True)
    assert playable_gold(["open door", "0", "go to kitchen"]) == ["open door", "go to kitchen"]


@needs_jvm
def test_splits_come_from_the_engines_variation_lists(sw_cfg, sw_games):
    from pipeline.envs.scienceworld.engine import simulator

    with simulator() as sw:
        sw.load("find-non-living-thing", 0, "", generateGoldPath=False)
        lists = {"train": set(sw.get_variations_train()), "dev": set(sw.get_variations_dev())}
    assert sorted(r["split"] for r in sw_games.rows) == ["eval", "train"]
    for r in sw_games.rows:
        variation = r["scene_seed"]
        assert variation in lists["train" if r["split"] == "train" else "dev"], r
        assert (sw_games.root / r["game_file"]).is_file()
        assert r["quest_length"] == len(r["expert_plan"]) > 0
        assert r["objective"].startswith("Your task is to find")
    assert set(sw_games.scenes) == {"find-non-living-thing"}


@needs_jvm
def test_gold_sequence_as_action_dicts_wins_and_reward_is_the_score(sw_games):
    from pipeline.envs.scienceworld.commands import command_to_action

    row = _row(sw_games, "eval")
    env = _env(sw_games, row)
    obs = env.reset()
    assert set(SHOWN) <= set(obs) and obs["scene"] == "find-non-living-thing"
    total, info, done = 0.0, {}, False
    for command in row["expert_plan"]:
        obs, reward, done, info = env.step(command_to_action(command))
        total += reward
        assert info["valid"], (command, info["env_feedback"])
    assert done and info["won"] and not info["truncated"] and info["score"] == 100
    assert total == pytest.approx(1.0)


@needs_jvm
def test_the_step_cap_is_not_success(sw_games):
    from pipeline.envs.scienceworld.commands import command_to_action

    row = _row(sw_games, "eval")
    env = _env(sw_games, row, max_steps=2)
    env.reset()
    for command in row["expert_plan"][:2]:
        _, _, done, info = env.step(command_to_action(command))
    assert done and info["truncated"] and not info["won"]


@needs_jvm
def test_observation_is_seed_004s_shape_and_its_facts_read_back(sw_games):
    from pipeline.envs.scienceworld.commands import action_to_command
    from pipeline.envs.scienceworld.reader import ScienceWorldFactReader

    env = _env(sw_games, _row(sw_games, "train"))
    obs = env.reset()
    assert obs["agent_location"] and obs["visible_entities"] and obs["admissible_commands"]
    assert obs["admissible_commands"] == sorted(obs["admissible_commands"])
    # every admissible action dict says its command back (two-object commands included)
    pairs = [(a, a["command"]) for a in obs["admissible_actions"]]
    assert any("receptacle" in a for a, _ in pairs)
    assert all(action_to_command(a) == c for a, c in pairs)
    assert "look_around" in obs["available_actions"] and "focus_on" in obs["available_actions"]
    # the description is written from the facts, and the recorded turn reads them back
    seen = ScienceWorldFactReader().read_turn({"observation": obs}).seen
    assert seen == env.facts()
    assert env.facts()[0].pred == "here"


@needs_jvm
def test_invalid_actions_are_recorded_failed_steps(sw_games):
    env = _env(sw_games, _row(sw_games, "train"))
    env.reset()
    _, reward, done, info = env.step({"action": "fly", "target": "moon"})
    assert not info["valid"] and "unknown verb" in info["error"] and reward == 0.0 and not done
    _, _, _, info = env.step({"action": "pick_up", "target": "unicorn"})
    assert not info["valid"] and info["command"] is None
    _, _, _, info = env.step({"action": "move", "target": "table"})  # two-object verb without its second object
    assert not info["valid"] and "receptacle" in info["error"]


@needs_jvm
def test_simulated_user_gives_typed_hints_from_the_gold_and_the_tree(sw_cfg, sw_games):
    from pipeline.core.config import section
    from pipeline.core.conf_schema import UserConfig
    from pipeline.envs.scienceworld.user import SimulatedUser
    from pipeline.grounding.feedback import parse_feedback_line

    row = _row(sw_games, "eval")  # its gold starts in another room: the hint says where
    env = _env(sw_games, row)
    user = SimulatedUser(section(UserConfig, {"feedback_prob": 1.0}), sw_games.scenes[row["scene_id"]], row, seed=1)
    obs = env.reset()
    lines = []
    for step_id in range(1, 4):
        before = obs
        obs, _, _, info = env.step({"action": "look_around", "target": None})
        fb = user.step_feedback(step_id, before, {"action": "look_around"}, info)
        assert fb.status == "WiP"
        lines += fb.lines
    types = {parse_feedback_line(line)[0] for line in lines}
    assert "general" in types  # a repeated look around
    assert types & {"spatial", "procedural"}, lines  # the stall hint of step 2
    _, _, _, info = env.step({"action": "fly"})
    assert user.step_feedback(4, obs, {"action": "fly"}, info).status == "Failure"
    assert user.end_feedback(info) == (True, [])


@needs_jvm
def test_reader_follows_the_oracle_advisory_to_success(sw_cfg, sw_games):
    """The positive control's text (the gold sequence, in the oracle's advisory form) is worth a win."""
    from pipeline.agents import make_agent
    from pipeline.conditions.oracle import oracle_advisories

    row = _row(sw_games, "eval")
    messages = [a.message for a in oracle_advisories(row["expert_plan"], 2, 800, "k")]
    cfg = OmegaConf.merge(sw_cfg, {"agent": {"name": "reader"}})
    won = {}
    for name, prompt in (("oracle", "\n".join(messages)), ("none", "")):
        agent = make_agent(cfg, seed=0)
        agent.reset({"episode_id": "ep", "objective": row["objective"], "system_prompt": prompt, "seed": 0})
        env = _env(sw_games, row, max_steps=len(row["expert_plan"]) + 2)
        obs, done, info = env.reset(), False, {}
        while not done:
            obs, _, done, info = env.step(agent.act(obs).action)
        won[name] = info["won"]
    assert won == {"oracle": True, "none": False}


def _play_twice(cfg, games, tmp_path):
    from pipeline.envs.scienceworld.engine import shutdown
    from pipeline.session.collection import make_factories, write_collection
    from pipeline.session.rollout import play, tasks_from_manifest

    tasks = tasks_from_manifest(games.rows, split="train", master_seed=cfg.seed)
    out = []
    for k in range(2):
        if k == 1:
            shutdown()  # the second run in a fresh JVM: nothing carries over between JVMs
        env_for, agent_for, user_for = make_factories(cfg, games.root, games.scenes)
        records = play(tasks, make_env=env_for, make_agent=agent_for, make_user=user_for)
        write_collection(tmp_path / f"run{k}", records)
        out.append(tmp_path / f"run{k}")
    return out


@needs_jvm
def test_same_config_gives_byte_identical_episode_parquet(sw_cfg, sw_games, tmp_path):
    """A rule agent with epsilon draws (the agent's, the user's and the engine's dynamics), twice."""
    cfg = OmegaConf.merge(sw_cfg, {"agent": {"epsilon": 0.3}, "env": {"max_steps": 8}})
    a, b = _play_twice(cfg, sw_games, tmp_path)
    for name in ("episodes.parquet", "turns.parquet"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@needs_jvm
def test_factories_pick_scienceworld_by_env_name(sw_cfg, sw_games):
    from pipeline.envs import env_family, fact_reader, make_env
    from pipeline.envs.scienceworld.env import ScienceWorldTaskEnv
    from pipeline.envs.scienceworld.reader import ScienceWorldFactReader
    from pipeline.envs.scienceworld.user import SimulatedUser
    from pipeline.session.rollout import tasks_from_manifest
    from pipeline.users import make_user

    task = tasks_from_manifest(sw_games.rows, split="eval", master_seed=0)[0]
    assert env_family(sw_cfg) == "scienceworld"
    assert isinstance(make_env(sw_cfg, task, sw_games.root, sw_games.scenes), ScienceWorldTaskEnv)
    assert isinstance(fact_reader(sw_cfg), ScienceWorldFactReader)
    assert isinstance(make_user(sw_cfg, sw_games.scenes, task), SimulatedUser)


@needs_jvm
def test_an_interrupted_process_leaves_no_jvm(tmp_path):
    """Ctrl-C (SIGINT) in a process that runs an episode: it exits and its JVM is gone, reaped."""
    script = textwrap.dedent("""
        import sys, time
        sys.path.insert(0, %r)
        from pipeline.envs.scienceworld.engine import acquire, jvm_processes
        sw = acquire()
        sw.load("find-non-living-thing", 0, "")
        sw.server.step("look around")
        print(jvm_processes()[0].pid, flush=True)
        while True:
            sw.server.step("look around")
            time.sleep(0.05)
    """ % str(ROOT))
    # SIGINT at its default in the child: a parent that ignores it (a pytest-xdist worker does)
    # would pass SIG_IGN on, and Python then installs no KeyboardInterrupt handler.
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    jvm = int(proc.stdout.readline())
    assert pid_alive(jvm)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) != 0
    deadline = time.monotonic() + 15
    while pid_alive(jvm) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(jvm), f"JVM {jvm} still runs (or is a zombie) after its process was interrupted"


@needs_jvm
def test_shutdown_reaps_the_jvms_in_a_process_that_lives_on():
    from pipeline.envs.scienceworld.engine import acquire, jvm_processes, release, shutdown

    release(acquire())
    pids = [p.pid for p in jvm_processes()]
    assert pids
    shutdown()
    assert jvm_processes() == [] and not any(pid_alive(pid) for pid in pids)


@needs_jvm
def test_a_fresh_jvm_episode_stops_its_jvm_at_close(sw_games):
    from pipeline.envs.scienceworld.engine import jvm_processes

    before = {p.pid for p in jvm_processes()}
    env = _env(sw_games, _row(sw_games, "train"), fresh_jvm=True)
    env.reset()
    (mine,) = [p for p in jvm_processes() if p.pid not in before]
    env.close()
    assert mine.poll() is not None and not pid_alive(mine.pid)
    assert {p.pid for p in jvm_processes()} == before


@needs_jvm
def test_episodes_played_side_by_side_each_hold_their_own_simulator(sw_games):
    """A batch interleaves its episodes' steps: each holds a JVM of the pool from reset to close."""
    from pipeline.envs.scienceworld.commands import command_to_action
    from pipeline.envs.scienceworld.engine import jvm_processes

    rows = sorted(sw_games.rows, key=lambda r: r["quest_length"])
    envs = [_env(sw_games, r) for r in rows]
    for env in envs:
        env.reset()
    assert len(jvm_processes()) >= len(envs)
    infos = [{} for _ in envs]
    for k in range(max(len(r["expert_plan"]) for r in rows)):
        for i, (env, r) in enumerate(zip(envs, rows)):
            if k < len(r["expert_plan"]):
                infos[i] = env.step(command_to_action(r["expert_plan"][k]))[3]
    assert all(info["won"] for info in infos)
    held = len(jvm_processes())
    for env in envs:
        env.close()
    envs[0].reset()  # the next episode reuses an idle JVM: none started
    assert len(jvm_processes()) == held
    envs[0].close()


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until the SIGSTOP sent to ``pid`` took hold (state ``T`` in /proc; a short sleep without /proc)."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        time.sleep(0.5)
        return
    deadline = time.monotonic() + timeout
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T" and time.monotonic() < deadline:
        time.sleep(0.01)


# --------------------------------------------------------------------------- trust and limits (issue 43)


@needs_jvm
def test_the_gateway_and_its_callback_server_refuse_a_local_client_without_the_token():
    """Another local process connects to the JVM's port (and to our callback server's) without
    py4j's auth token: it can run nothing (no `System.getProperty`, no `Runtime.exec`)."""
    import socket

    from py4j.java_gateway import GatewayParameters, JavaGateway
    from py4j.protocol import Py4JError

    from pipeline.envs.scienceworld.engine import acquire, release

    sw = acquire()
    try:
        intruder = JavaGateway(gateway_parameters=GatewayParameters(port=sw._gateway.gateway_parameters.port,
                                                                    read_timeout=10))
        try:
            with pytest.raises(Py4JError, match="Authentication error"):
                intruder.jvm.java.lang.System.getProperty("user.name")
        finally:
            intruder.close()
        with socket.create_connection(("127.0.0.1", sw._gateway.get_callback_server().get_listening_port()),
                                      timeout=10) as s:
            s.sendall(b"c\nt\ngetName\ne\n")  # a py4j call command, no auth command first
            try:
                answer = s.recv(256)
            except ConnectionResetError:
                answer = b""
        assert answer == b"", answer  # the connection is dropped unanswered
        assert "find-non-living-thing" in sw.get_task_names()  # the rightful client still plays
    finally:
        release(sw)


@needs_jvm
def test_a_jvm_starts_with_the_configured_heap_limit():
    from pipeline.envs.scienceworld.engine import acquire, release

    sw = acquire(fresh=True, heap_mb=256)
    try:
        max_heap = sw._gateway.jvm.java.lang.Runtime.getRuntime().maxMemory()
        assert 128 * 2**20 < max_heap <= 256 * 2**20
    finally:
        release(sw, stop=True)


@needs_jvm
def test_a_gold_sequence_that_could_name_many_things_is_the_same_in_every_jvm():
    """find-non-living-thing's gold focuses on one of many things; which one followed the engine's hash-set
    order, different in each JVM, until every JVM got a constant identity hash (engine.JAVA_DETERMINISM)."""
    from pipeline.envs.scienceworld.engine import acquire, release

    golds = set()
    for _ in range(3):
        sw = acquire(fresh=True)
        try:
            sw.load("find-non-living-thing", 206, "noElectricalAction", generateGoldPath=True)
            golds.add(tuple(str(c) for c in sw.get_gold_action_sequence()))
        finally:
            release(sw, stop=True)
    assert len(golds) == 1, golds


@needs_jvm
@pytest.mark.timeout(120)
def test_a_wedged_simulator_times_out_fails_the_episode_and_is_replaced(sw_games):
    """SIGSTOP on the JVM mid-episode: the step raises within the call timeout (it used to block
    for ever), the JVM is killed and forgotten, and the next episode plays in a new one."""
    from pipeline.envs.scienceworld.commands import command_to_action
    from pipeline.envs.scienceworld.engine import EngineFailed, jvm_processes
    from pipeline.envs.scienceworld.env import ScienceWorldTaskEnv

    row = _row(sw_games, "eval")
    env = ScienceWorldTaskEnv(sw_games.root / row["game_file"], max_steps=30, fresh_jvm=False, call_timeout_s=5)
    before = {p.pid for p in jvm_processes()}
    env.reset()
    (jvm,) = [p for p in jvm_processes() if p.pid not in before] or [
        p for p in jvm_processes() if p is env._sw._gateway.java_process]
    os.kill(jvm.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(EngineFailed, match=r"step 1 .*no answer within env.scienceworld.call_timeout_s=5 s"):
        env.step(command_to_action(row["expert_plan"][0]))
    assert time.monotonic() - t0 < 30
    assert jvm.poll() is not None and not pid_alive(jvm.pid)  # killed and reaped, not left stopped
    assert jvm.pid not in {p.pid for p in jvm_processes()}
    obs, _, done, info = env.step(command_to_action(row["expert_plan"][0]))
    assert done and not info["valid"]  # the failed episode is over: nothing more is played in it
    env.reset()  # the next episode: a live JVM
    assert env._sw._gateway.java_process.poll() is None
    env.close()


@needs_jvm
@pytest.mark.timeout(120)
def test_a_call_on_a_wedged_jvm_fails_within_its_timeout_not_twice_it():
    """py4j asks the JVM whether a method's name is a field before its first call (``auto_field``) and
    swallows that lookup's timeout; the call then waited a timeout of its own: ~2x call_timeout_s
    (8.0 s for 4, measured; issue 66). The first unanswered command now ends the client: one wait."""
    from pipeline.envs.scienceworld.engine import EngineFailed, acquire, answering, discard

    sw = acquire(fresh=True, call_timeout_s=4)
    jvm = sw._gateway.java_process
    try:
        sw.get_task_names()  # a pooled connection, as mid-episode
        os.kill(jvm.pid, signal.SIGSTOP)
        _wait_stopped(jvm.pid)
        t0 = time.monotonic()
        with pytest.raises(EngineFailed, match=r"no answer within env.scienceworld.call_timeout_s=4 s"):
            with answering(sw, "a first call of getNumMoves"):
                sw.get_num_moves()  # a name this JVM was not asked for yet: a field lookup, then the call
        elapsed = time.monotonic() - t0
    finally:
        discard(sw)  # a no-op once answering discarded it
    assert 4 <= elapsed < 1.5 * 4, f"the call timeout of 4 s fired after {elapsed:.2f} s"
    assert jvm.poll() is not None and not pid_alive(jvm.pid)


@needs_jvm
@pytest.mark.timeout(60)
def test_a_jvm_that_missed_a_timeout_py4j_swallowed_never_goes_back_into_the_pool():
    """A field lookup that timed out raises nothing (py4j answers it as "not a field"); the JVM then
    answers again, late. It left a command unanswered past call_timeout_s: released, it is killed, not pooled."""
    from pipeline.envs.scienceworld.engine import acquire, discard, jvm_processes, release

    sw = acquire(fresh=True, call_timeout_s=2)
    jvm = sw._gateway.java_process
    try:
        sw.get_task_names()
        os.kill(jvm.pid, signal.SIGSTOP)
        _wait_stopped(jvm.pid)
        sw.server.getNumMoves  # noqa: B018 - the field lookup: 2 s without an answer, no exception
        os.kill(jvm.pid, signal.SIGCONT)
        release(sw)
        assert jvm.pid not in {p.pid for p in jvm_processes()}
        assert jvm.poll() is not None and not pid_alive(jvm.pid)
    finally:
        discard(sw)  # a no-op once release dropped it


@needs_jvm
@pytest.mark.timeout(60)
@pytest.mark.parametrize("behaviour", ["hangs", "exits"])
def test_a_java_that_prints_no_port_fails_the_start_within_start_timeout_s(sw_cfg, tmp_path, monkeypatch,
                                                                           behaviour):
    """A ``java`` that never prints its py4j port blocked ``acquire`` for ever (py4j reads the port with no
    timeout; issue 66): now the start fails loudly within ``env.scienceworld.start_timeout_s`` and that
    java is killed and reaped; one that exits at once fails at once, with its exit code."""
    from pipeline.envs.scienceworld.engine import EngineUnavailable, acquire, jvm_processes, limits

    assert limits(sw_cfg.env.scienceworld)["start_timeout_s"] == 120.0  # the config key, at its default
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    pid_file = tmp_path / "pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\n" + ("exec sleep 600\n" if behaviour == "hangs" else "exit 3\n"))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    before = {p.pid for p in jvm_processes()}
    t0 = time.monotonic()
    match = (r"printed no gateway port within env.scienceworld.start_timeout_s=3 s" if behaviour == "hangs" else
             r"java exited \(code 3\)")
    with pytest.raises(EngineUnavailable, match=match):
        acquire(fresh=True, call_timeout_s=5, start_timeout_s=3)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.5 * 3, f"acquire returned after {elapsed:.2f} s"
    pid = int(pid_file.read_text())
    assert not pid_alive(pid), f"the stalled java {pid} still runs (or is a zombie)"
    assert {p.pid for p in jvm_processes()} == before


def test_the_start_bound_is_range_checked_and_never_changes_what_an_episode_is(sw_cfg):
    """env.scienceworld.start_timeout_s decides how a run is supervised, not what its episodes are."""
    from pipeline.core.config import ConfigError, validate
    from pipeline.session.collection import collection_hash

    other = OmegaConf.merge(sw_cfg, {"env": {"scienceworld": {"start_timeout_s": 7}}})
    assert collection_hash(other) == collection_hash(sw_cfg)
    with pytest.raises(ConfigError, match=r"env.scienceworld.start_timeout_s=0.0: expected a finite number > 0"):
        validate(OmegaConf.merge(sw_cfg, {"env": {"scienceworld": {"start_timeout_s": 0}}}))


@needs_jvm
def test_an_error_the_engine_answers_with_passes_through_and_keeps_the_jvm():
    """Only a call without an answer discards a simulator: an error the JVM sent back is the caller's."""
    from py4j.protocol import Py4JError

    from pipeline.envs.scienceworld.engine import EngineFailed, acquire, answering, jvm_processes, release

    sw = acquire()
    try:
        with pytest.raises(Py4JError, match="noSuchMethod") as info:
            with answering(sw, "a test call"):
                sw.server.noSuchMethod()
        assert not isinstance(info.value, EngineFailed)
        assert sw._gateway.java_process in jvm_processes() and sw._gateway.java_process.poll() is None
    finally:
        release(sw)


@needs_jvm
def test_a_crashed_jvm_never_goes_back_into_the_pool():
    from pipeline.envs.scienceworld.engine import acquire, jvm_processes, release

    sw = acquire(fresh=True)
    proc = sw._gateway.java_process
    proc.kill()
    proc.wait(timeout=10)
    release(sw)  # an episode ends after its JVM crashed
    assert proc.pid not in {p.pid for p in jvm_processes()}
    again = acquire()
    try:
        assert again is not sw
        again.load("find-non-living-thing", 0, "", generateGoldPath=False)
        assert "hallway" in str(again.server.step("look around"))
    finally:
        release(again)
