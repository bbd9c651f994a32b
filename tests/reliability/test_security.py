"""Security: no unpickling of untrusted code, paths confined to the project, API keys never
written anywhere, templates substituted and never evaluated."""

from __future__ import annotations

import ast
import builtins
import os
import secrets
from pathlib import Path

import pytest
import torch

from pipeline.session.episodes import EpisodeStore
from pipeline.core.io import ArtifactError

from .helpers import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- unpickling


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def test_torch_load_is_weights_only_and_nothing_else_unpickles_or_evaluates():
    files = sorted((ROOT / "pipeline").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    loads, bad = 0, []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for node, name in _calls(path):
            if name == "torch.load":
                loads += 1
                kw = {k.arg: k.value for k in node.keywords}
                if not (isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True):
                    bad.append(f"{rel}:{node.lineno} torch.load without weights_only=True")
            elif name in ("pickle.load", "pickle.loads", "cPickle.load", "dill.load", "joblib.load", "eval", "exec",
                          "yaml.unsafe_load", "yaml.full_load", "marshal.loads"):
                bad.append(f"{rel}:{node.lineno} {name}(...)")
            elif name == "yaml.load" and not any(k.arg == "Loader" and "Safe" in ast.unparse(k.value)
                                                 for k in node.keywords):
                bad.append(f"{rel}:{node.lineno} yaml.load without a SafeLoader")
    assert loads >= 2  # pipeline.session.episodes and pipeline.llm.tensors
    assert not bad, "\n".join(bad)


class _Payload:
    """Pickles as a call to ``exec``: what a malicious ``.pt`` does on an unrestricted load."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return builtins.exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",)


def test_a_malicious_pickle_in_a_pt_file_is_refused(tmp_path):
    from pipeline.llm.tensors import FORMAT, load_episode_tensors

    marker = tmp_path / "pwned.txt"
    store_dir = tmp_path / "episodes"
    pt = store_dir / "tensors" / "ep_evil.pt"
    pt.parent.mkdir(parents=True)
    torch.save({"format": FORMAT, "turns": [{"turn_index": 0, "generated_ids": _Payload(marker)}]}, pt)

    with pytest.raises(ArtifactError, match="ep_evil.pt"):
        EpisodeStore(store_dir).load_tensors("ep_evil")
    with pytest.raises(ArtifactError, match="ep_evil.pt"):
        load_episode_tensors(pt)
    with pytest.raises(ArtifactError):
        load_episode_tensors(pt, turn_index=0)
    assert not marker.exists()  # the payload never ran

    torch.load(pt, weights_only=False)  # the control: an unrestricted load does run it
    assert marker.read_text() == "pwned"


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize("path", ["../outside.json", "data/../../outside.json", "conf/../../../etc/passwd", ".."])
def test_grounding_paths_cannot_climb_out_of_the_project(tmp_path, path):
    from pipeline.grounding import GroundingError, grounding_content, merge_grounding_files

    root = tmp_path / "project"
    root.mkdir()
    (tmp_path / "outside.json").write_text('{"final_grounding": {"spatial_grounding": {"content": "secret"}}}')
    with pytest.raises(GroundingError, match="climbs out of the project root") as info:
        merge_grounding_files([path], root=root)
    assert repr(path) in str(info.value)
    with pytest.raises(GroundingError, match="climbs out"):
        grounding_content(f"notes.txt,{path}", root=root)


def test_grounding_paths_inside_or_explicitly_absolute_are_read(tmp_path):
    from pipeline.grounding import merge_grounding_files

    root = tmp_path / "project"
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "a.txt").write_text("Inside note.")
    outside = tmp_path / "shared_notes.txt"
    outside.write_text("Shared note.")
    merged = merge_grounding_files(["notes/../notes/a.txt", str(outside)], root=root)  # `..` that stays inside
    assert "Inside note." in merged.content and "Shared note." in merged.content


def test_merge_stage_names_an_escaping_configured_file(tmp_path):
    from pipeline.grounding import GroundingError
    from pipeline.grounding.scenes import merge_groundings

    with pytest.raises(GroundingError, match=r"grounding.files: grounding file '\.\./x\.txt' climbs out"):
        merge_groundings({"episodes": []}, "data/grounding", ["../x.txt"], root=tmp_path)


@pytest.mark.parametrize("path", ["../evil.txt", "conf/templates/../../../evil.txt"])
def test_template_paths_cannot_climb_out_of_the_project(tmp_path, path):
    from pipeline.prompts import PromptOrganizer, PromptTemplateError, load_template

    root = tmp_path / "project"
    root.mkdir()
    (tmp_path / "evil.txt").write_text("You obey $objective")
    with pytest.raises(PromptTemplateError, match="climbs out of the project root") as info:
        load_template(path, root)
    assert repr(path) in str(info.value)
    org = PromptOrganizer({"system_template": path}, root=root)
    with pytest.raises(PromptTemplateError, match="climbs out"):
        org.get_system_prompt(objective="x")
    assert load_template(tmp_path / "evil.txt", root) == "You obey $objective"  # explicit absolute path: allowed


# --------------------------------------------------------------------------- secrets


def _find(secret: str, root: Path) -> list[str]:
    hits = []
    needle = secret.encode()
    for p in root.rglob("*"):
        if p.is_file() and needle in p.read_bytes():
            hits.append(p.relative_to(root).as_posix())
    return hits


def _collect_with_key(project, server, key: str, *extra: str):
    project.configure("agent=llm", "model=openai", f"model.base_url={server.url}", "model.api_model=fake-model",
                      "model.timeout_s=2", "model.max_retries=1", "model.backoff_s=0.01", "model.logprobs=false",
                      "model.api_key_env=REL_TEST_API_KEY", *extra)
    # DVC would also see the environment: the key must come from it and go nowhere else.
    return project.run("collect", env={"REL_TEST_API_KEY": key}, check=False)


def test_the_api_key_is_read_from_the_environment_and_written_nowhere(project):
    key = "sk-reliability-" + secrets.token_hex(16)

    def script(n, body):  # some retried errors and a failed turn: the logging paths run too
        return "500" if n % 5 == 1 else "ok"

    with FakeOpenAI(script) as server:
        proc = _collect_with_key(project, server, key, "agent.batch_size=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert server.requests and all(h.get("Authorization") == f"Bearer {key}" for h, _ in server.requests)
    assert "retrying" in proc.stderr  # the warnings were logged
    assert key not in proc.stdout and key not in proc.stderr
    assert key not in (project.root / "params.yaml").read_text()
    assert _find(key, project.root) == []  # params, conf, data/, metrics/, checkpoints: every file
    assert (project.root / "data/episodes/turns.parquet").exists() and (project.root / "metrics/collect.json").exists()


def test_the_api_key_stays_out_of_logs_even_when_a_proxy_echoes_it(project):
    key = "sk-reliability-" + secrets.token_hex(16)
    with FakeOpenAI(lambda n, body: "echo" if n == 0 else "ok") as server:
        proc = _collect_with_key(project, server, key, "agent.batched=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert key not in proc.stderr and _find(key, project.root) == []


def test_the_key_is_not_in_the_backend_repr_or_the_config(tiny_cfg, monkeypatch):
    from omegaconf import OmegaConf

    from pipeline.llm.backends import make_backend

    key = "sk-" + secrets.token_hex(8)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    cfg = OmegaConf.merge(tiny_cfg, {"model": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1",
                                               "api_model": "m"}})
    backend = make_backend(cfg.model, cfg.sampling)
    assert key not in repr(backend) and key not in str(backend) and key not in OmegaConf.to_yaml(cfg)
    assert key not in repr(vars(backend).get("sampling"))


# --------------------------------------------------------------------------- templates

INJECTIONS = [
    "${__import__('os').system('touch PWNED')}",
    "$__import__('os').system('touch PWNED')",
    "{{ cycler.__init__.__globals__.os.system('touch PWNED') }}",
    "{0.__class__.__mro__}",
    "%(objective)s",
    "$memory[secret]",
    "${objective}",
    "`touch PWNED`",
]


@pytest.mark.parametrize("text", INJECTIONS)
def test_values_are_substituted_never_evaluated(text, tmp_path, monkeypatch):
    from pipeline.prompts import PromptOrganizer, render_turn_prompt, system_prompt_interp

    monkeypatch.chdir(tmp_path)
    memory = {"notes": text, "secret": "THE SECRET"}
    out = system_prompt_interp("Goal: $objective | Notes: $memory[notes] | $$", {"objective": text}, memory)
    assert out == f"Goal: {text} | Notes: {text} | $"  # inserted once, as written
    # The per-episode (frozen) prompt escapes what it inserts: the per-turn render cannot expand it.
    org = PromptOrganizer({"system_template": "t.txt"}, root=tmp_path)
    (tmp_path / "t.txt").write_text("Goal: $objective\nAt: $agent_location\nNotes: $memory[notes]\n")
    org.set_variables(objective=text)
    frozen = org.freeze_system_prompt()
    turn = render_turn_prompt(frozen, {"agent_location": text}, memory)
    assert turn == f"Goal: {text}\nAt: {text}\nNotes: {text}\n"
    assert "THE SECRET" not in turn
    assert not list(tmp_path.glob("PWNED*"))


def test_a_template_that_tries_to_evaluate_is_an_error_or_left_as_text(tmp_path, monkeypatch):
    from pipeline.prompts import PromptTemplateError, system_prompt_interp

    monkeypatch.chdir(tmp_path)
    template = "Hi ${__import__('os').system('touch PWNED')} and $objective"
    with pytest.raises(PromptTemplateError, match="invalid slot"):
        system_prompt_interp(template, {"objective": "x"})
    out = system_prompt_interp(template, {"objective": "x"}, strict=False)
    assert out == "Hi ${__import__('os').system('touch PWNED')} and x"
    assert not list(tmp_path.glob("PWNED*")) and not os.path.exists("PWNED")
