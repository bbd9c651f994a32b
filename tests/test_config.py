"""Config route: conf/ composes to the committed params.yaml; stale params fail loudly.

The schema (``pipeline/core/conf_schema.py``) is the one home of the defaults: every field
has a docstring, and no YAML file under ``conf/`` restates a value it would inherit.
"""

from __future__ import annotations

import ast
import dataclasses
import shutil
import typing
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from pipeline.core import conf_schema
from pipeline.core import config as C

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A copy of the config route (conf/, params.yaml, dvc.yaml, plugin) in a temp dir."""
    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, tmp_path / name)
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_committed_params_yaml_is_in_sync_with_conf():
    C.check(ROOT)  # the same check `dvc repro` runs (stage check_params)


def test_compose_matches_dvc_compose_byte_for_byte(repo: Path):
    from dvc.utils.hydra import compose_and_dump

    out = repo / "dvc_params.yaml"
    compose_and_dump(out, str(repo / "conf"), None, "config", str(repo), [])
    assert C.compose_text(repo) == out.read_text(encoding="utf-8")


def test_stale_params_fail_naming_the_key(repo: Path):
    conf = repo / "conf" / "sampling" / "default.yaml"
    conf.write_text(conf.read_text() + "top_p: 0.8  # an option changing the schema default (0.9)\n")
    with pytest.raises(C.ConfigError, match=r"sampling\.top_p: params\.yaml=0\.9 conf=0\.8"):
        C.check(repo)
    C.compose(repo)  # the documented fix
    C.check(repo)


def test_structural_change_is_stale(repo: Path):
    p = repo / "params.yaml"
    data = yaml.safe_load(p.read_text())
    del data["env"]["max_steps"]
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(C.ConfigError, match=r"env\.max_steps \(missing from params\.yaml\)"):
        C.check(repo)


def test_inside_dvc_exp_run_overrides_are_accepted_and_recorded(repo: Path, monkeypatch):
    # What DVC writes for `dvc exp run -S ...`: the composed text, no record.
    (repo / "params.yaml").write_text(C.compose_text(repo, ["agent=rag", "sampling.temperature=0.3"]))
    with pytest.raises(C.ConfigError, match="stale"):
        C.check(repo)
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "0" * 40)
    C.check(repo)  # composed by DVC for this experiment: structure matches conf/
    C.check(repo, record=True)  # the check_params stage records what the experiment changed
    monkeypatch.delenv("DVC_EXP_BASELINE_REV")
    C.check(repo, use_stamp=False)  # after `dvc exp apply`: conf/ + the record
    assert "agent.name" in (repo / "params.overrides.yaml").read_text()


@pytest.mark.parametrize(
    "override, key",
    [
        ("sampling.temperature=abc", "sampling.temperature"),
        ("agent.temperature=0.5", "agent.temperature"),
        ("agent.name=foo", "agent.name"),
        ("condition.C1.kind=maybe", "condition.C1.kind"),
        ("env.max_steps=many", "env.max_steps"),
        ("agent.on_backend_error=maybe", "agent.on_backend_error"),  # closed sets are StrEnums: refused at compose
        ("model.structured_output=xml", "model.structured_output"),
    ],
)
def test_bad_override_names_the_key(repo: Path, override: str, key: str):
    with pytest.raises(C.ConfigError) as err:
        C.compose_text(repo, [override])
    assert key in str(err.value)


@pytest.mark.parametrize("override, group", [("condition=[C1,C9]", "condition/C9"), ("agent=foo", "agent/foo")])
def test_unknown_group_option_names_it(repo: Path, override: str, group: str):
    with pytest.raises(C.ConfigError, match=group):
        C.compose_text(repo, [override])


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("sampling.temperature", 0.0, "> 0"),
        ("sampling.top_p", 1.5, "in \\(0, 1\\]"),
        ("user.feedback_prob", 2.0, "in \\[0, 1\\]"),
        ("memory.topk", 5, "in \\[1, 3\\]"),
        ("env.heldout_scenes", 12, "env.heldout_scenes=12"),
        ("model.prompt_cache_mb", -1, ">= 0"),
        ("model.prompt_cache_mb", "lots", "or auto"),
    ],
)
def test_range_validation_names_key_and_value(key: str, value, expected: str):
    cfg = OmegaConf.load(ROOT / "params.yaml")
    OmegaConf.update(cfg, key, value)
    with pytest.raises(C.ConfigError, match=expected) as err:
        C.validate(cfg)
    assert key in str(err.value)


def test_comparisons_must_name_selected_conditions():
    cfg = OmegaConf.load(ROOT / "params.yaml")
    cfg.experiment.comparisons = [["C2", "C7"]]
    with pytest.raises(C.ConfigError, match="C7"):
        C.validate(cfg)


def test_an_online_memory_must_name_a_selected_condition():
    """Refused at check_params, before collect plays a game (not only when the online loop starts)."""
    cfg = OmegaConf.load(ROOT / "params.yaml")
    cfg.grounding.online_memory = "C9"
    with pytest.raises(C.ConfigError, match=r"grounding.online_memory='C9': expected null or a selected condition \(C0, "):
        C.validate(cfg)
    cfg.grounding.online_memory = "C2"
    C.validate(cfg)


def test_dvc_config_enables_hydra_with_the_plugin_path():
    text = (ROOT / ".dvc" / "config").read_text()
    assert "enabled = true" in text and "plugins_path = ." in text


def test_config_hash_depends_only_on_named_subtrees():
    cfg = C.load_params(ROOT, check_stale=False)
    h = C.config_hash(cfg, "env")
    cfg2 = cfg.copy()
    cfg2.sampling.temperature = 0.123
    assert C.config_hash(cfg2, "env") == h
    cfg2.env.max_steps = cfg.env.max_steps + 1
    assert C.config_hash(cfg2, "env") != h


@pytest.mark.parametrize("group", ["agent", "env", "model", "sampling", "user"])
def test_every_group_option_composes_over_its_base(repo: Path, group: str):
    """Each option says only what differs from its base (defaults list); all compose and validate."""
    default = yaml.safe_load(C.compose_text(repo))
    for option in sorted(p.stem for p in (repo / "conf" / group).glob("*.yaml")):
        composed = yaml.safe_load(C.compose_text(repo, [f"{group}={option}"]))
        C.validate(OmegaConf.create(composed))
        assert set(composed[group]) == set(default[group]), option
        if group == "env":
            assert composed["env"]["name"] == option and composed["env"]["reward"] == default["env"]["reward"]


def test_closed_set_refusal_lists_the_allowed_values(repo: Path):
    """DVC's compose (the plugin's schema) refuses a value outside a StrEnum with the key and the choices."""
    with pytest.raises(C.ConfigError, match=r"expected one of \[record, fail\].*full_key: agent\.on_backend_error"):
        C.compose_text(repo, ["agent.on_backend_error=retry"])


def _is_dataclass_def(node: ast.ClassDef) -> bool:
    return any((d.id if isinstance(d, ast.Name) else getattr(d, "attr", None)) == "dataclass"
               for d in (dec.func if isinstance(dec, ast.Call) else dec for dec in node.decorator_list))


def test_every_schema_field_has_a_docstring():
    """Each field of each schema dataclass has its docstring (a string literal) right under it: its one home."""
    tree = ast.parse(Path(conf_schema.__file__).read_text(encoding="utf-8"))
    missing = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and _is_dataclass_def(n)):
        for stmt, after in zip(cls.body, [*cls.body[1:], None]):
            if isinstance(stmt, ast.AnnAssign):
                is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                doc = after.value.value if is_doc else None
                if not (isinstance(doc, str) and doc.strip()):
                    missing.append(f"{cls.name}.{stmt.target.id}")
    assert not missing, f"schema fields without a docstring under them: {missing}"


def _package(path: Path, conf: Path) -> list[str]:
    """Where a conf/ file's keys land: its group's path, or the root for ``# @package _global_``."""
    if path.read_text(encoding="utf-8").lstrip().startswith("# @package _global_"):
        return []
    return list(path.relative_to(conf).parent.parts)


def _inherited(path: Path, conf: Path, top: bool = True) -> dict:
    """What ``path`` extends, as a plain dict from the root: the same group's options its own
    ``defaults:`` list names (``- household``), merged in order; the schema comes under them."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    out = OmegaConf.create()
    if top and not _package(path, conf) and path.parent != conf:  # a global variant (experiment=...) lands
        out = _primary_options(conf, _overrides(path))  # on the primary config's group options
    for entry in doc.get("defaults") or []:
        base = path.with_name(f"{entry}.yaml") if isinstance(entry, str) and "@" not in entry else None
        if base is not None and base.is_file():  # not _self_, not the primary config's `schema`
            out = OmegaConf.merge(out, _inherited(base, conf, top=False), _rooted(base, conf))
    return OmegaConf.to_container(out)


def _overrides(path: Path) -> set[str]:
    """The groups a variant overrides (``override /env: ...``), its own and those of what it extends."""
    found = set()
    for entry in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("defaults") or []:
        if isinstance(entry, dict):
            found |= {str(k).split("/")[-1] for k in entry}
        elif isinstance(entry, str) and "@" not in entry and path.with_name(f"{entry}.yaml").is_file():
            found |= _overrides(path.with_name(f"{entry}.yaml"))
    return found


def _primary_options(conf: Path, overridden: set[str]):
    """The group options conf/config.yaml chooses (``memory: default``), rooted, merged: what a
    global variant's keys land on, except the groups it overrides."""
    out = OmegaConf.create()
    for entry in yaml.safe_load((conf / "config.yaml").read_text(encoding="utf-8"))["defaults"]:
        if not isinstance(entry, dict):
            continue
        (group, option), = entry.items()
        if group in overridden or not isinstance(option, str) or not (conf / group / f"{option}.yaml").is_file():
            continue
        out = OmegaConf.merge(out, _rooted(conf / group / f"{option}.yaml", conf))
    return out


def _rooted(path: Path, conf: Path) -> dict:
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    doc.pop("defaults", None)
    for part in reversed(_package(path, conf)):
        doc = {part: doc}
    return doc


def _restated(node: dict, schema_cls: type, base: dict, prefix: str = "") -> list[str]:
    """Keys of ``node`` (YAML under ``schema_cls``) whose value is what they would get anyway:
    the schema default, or the value of the option the file extends (``base``)."""
    hints = typing.get_type_hints(schema_cls)
    inherited = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(schema_cls), base), enum_to_str=True)
    out = []
    for key, value in node.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        hint = hints.get(key)
        if hint is None:  # an unknown key fails the compose itself
            continue
        sub_base = base.get(key) or {}
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            out += _restated(value, hint, sub_base, dotted)
        elif typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1]):
            for name, sub in value.items():  # condition.<name>: each a ConditionConfig
                out += _restated(sub, typing.get_args(hint)[1], sub_base.get(name) or {}, f"{dotted}.{name}")
        elif _filled(hint, value) == inherited[key]:
            out.append(dotted)
    return out


def _filled(hint: typing.Any, value: typing.Any) -> typing.Any:
    """``value`` as the schema reads it: a list of dataclass items (``demos.advisory_variants``)
    with each item's missing fields filled in; any other value as it is."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is not list or not (args and dataclasses.is_dataclass(args[0])):
        return value
    if not isinstance(value, list):
        return value
    return [OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(args[0]), item), enum_to_str=True)
            for item in value]


def test_no_conf_file_restates_a_default():
    """A group option or variant says only what it changes: no key set to the schema default (or to the
    value of the option it extends). Delete the line; its doc lives in pipeline/core/conf_schema.py."""
    conf = ROOT / "conf"
    found = {}
    for path in sorted(conf.rglob("*.yaml")):
        # TrainConfig: the experiment's schema and the model pipeline's sections (demos, policy)
        restated = _restated(_rooted(path, conf), conf_schema.TrainConfig, _inherited(path, conf))
        if restated:
            found[path.relative_to(ROOT).as_posix()] = restated
    assert not found, f"conf/ files restating a default: {found}"


def test_restated_default_check_sees_one(tmp_path: Path):
    """The check above finds a restated schema default, nested or in a condition, and a restated base value."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "env" / "tiny.yaml").write_text((conf / "env" / "tiny.yaml").read_text()
                                            + "reward:\n  win: 1.0  # restated\nmin_quest_length: 2\n")
    (conf / "condition" / "C1.yaml").write_text("C1:\n  kind: none\n  description: no memory\n")
    (conf / "sampling" / "default.yaml").write_text("seed: ${seed}\ntop_k: 40\n")
    (conf / "sampling" / "greedy.yaml").write_text("defaults: [default, _self_]\ndo_sample: false\ntop_k: 40\n")
    tiny = conf / "env" / "tiny.yaml"
    assert _restated(_rooted(tiny, conf), conf_schema.Config, _inherited(tiny, conf)) == [
        "env.reward.win", "env.min_quest_length"]
    assert _restated(_rooted(conf / "condition" / "C1.yaml", conf), conf_schema.Config, {}) == ["condition.C1.kind"]
    greedy = conf / "sampling" / "greedy.yaml"
    assert _restated(_rooted(greedy, conf), conf_schema.Config, _inherited(greedy, conf)) == ["sampling.top_k"]


# --------------------------------------------------------------------------- checked before anything is touched


@pytest.mark.parametrize(
    "override, key",
    [
        ("env.train_quests_per_scene=-1", "env.train_quests_per_scene=-1: expected >= 0"),
        ("env.eval_quests_per_scene=-1", "env.eval_quests_per_scene=-1: expected >= 1"),
        ("policy.n_layer=0", "policy.n_layer=0: expected >= 1"),
        ("sampling.temperature=inf", "sampling.temperature=inf: expected > 0 and finite"),
        ("model.timeout_s=-1", "model.timeout_s=-1.0: expected a finite number > 0"),
        ("model.max_retries=-2", "model.max_retries=-2: expected >= 0"),
        ("policy.slip_prob=1.5", "policy.slip_prob=1.5: expected in [0, 1]"),
        ("agent.max_error_fraction=2", "agent.max_error_fraction=2.0: expected in [0, 1]"),
        ("user.preferences_per_scene=-1", "user.preferences_per_scene=-1: expected >= 0"),
        ("env.reward.win=nan", "env.reward.win=nan: expected a finite number"),
    ],
)
def test_out_of_range_values_are_refused_at_compose_naming_the_key(repo: Path, override: str, key: str):
    pipeline = C.MODEL if override.startswith("policy.") else C.EXPERIMENT  # the recipe: the model pipeline's
    params = repo / pipeline.params_file
    before = params.read_bytes() if params.exists() else None
    with pytest.raises(C.ConfigError) as err:
        C.compose(repo, [override], pipeline=pipeline)
    assert f"params key {key}" in str(err.value)
    assert (params.read_bytes() if params.exists() else None) == before  # nothing written


@pytest.mark.parametrize(
    "override, message",
    [
        ("workers=1000000", "workers=1000000: expected a number of processes from 1 to "),
        ("agent.worker_stall_s=0.001",
         "agent.worker_stall_s=0.001: expected 0 (wait for ever) or a finite number of seconds >= 60"),
        ("memory.max_message_chars=5000", "memory.max_message_chars=5000: expected in [1, 800]"),
        ("memory.store_splits=[trian]", "memory.store_splits=['trian']: expected splits among train | eval"),
        ("paths.grounding=../outside",
         "paths.grounding='../outside': expected a path inside the project, without '..'"),
        ("paths.store=data/../../x", "paths.store='data/../../x': expected a path inside the project, without '..'"),
        ("paths.eval=/home/someone", "paths.eval='/home/someone': expected a path relative to the project root "
                                     "(absolute ones only below the temp folder "),
        ("paths.episodes=.", "paths.episodes='.': expected a folder inside the project, not the project root itself"),
        ("model.gguf.out_dir=/", "model.gguf.out_dir='/': expected a path relative to the project root"),
    ],
    ids=["workers", "worker_stall_s", "max_message_chars", "store_splits", "paths-up", "paths-up-inside",
         "paths-absolute", "paths-root", "gguf-out_dir"],
)
def test_values_that_cannot_work_are_refused_at_compose_naming_key_value_and_expectation(repo: Path, override: str,
                                                                                        message: str):
    """Issue 66, findings 4 and 6: each was accepted, then one process per job, every worker killed at its start, a
    ValueError in demos / render, an empty store (C2 silently C1), or a folder outside the project replaced whole."""
    before = (repo / "params.yaml").read_bytes()
    with pytest.raises(C.ConfigError) as err:
        C.compose(repo, [override])
    assert f"params key {message}" in str(err.value)
    assert (repo / "params.yaml").read_bytes() == before  # nothing written


@pytest.mark.parametrize(
    "key, value",
    [("workers", 8), ("workers", 1), ("workers", "auto"), ("agent.worker_stall_s", 0.0),
     ("agent.worker_stall_s", 60.0), ("memory.max_message_chars", 1), ("memory.max_message_chars", 800),
     ("memory.store_splits", []), ("memory.store_splits", ["train", "eval"]), ("paths.grounding", "data/g/./x"),
     ("paths.checkpoints", ".checkpoints"), ("model.gguf.out_dir", "converted")],
)
def test_the_bounds_themselves_and_every_value_that_works_are_accepted(key: str, value):
    cfg = OmegaConf.load(ROOT / "params.yaml")
    OmegaConf.update(cfg, key, value)
    C.validate(cfg)


def test_a_scratch_folder_below_the_temp_folder_is_accepted_and_the_worker_cap_follows_the_cores(tmp_path, monkeypatch):
    """Tests and throw-away runs write outputs to absolute folders below the temp folder (tmp_path is one)."""
    import tempfile

    cfg = OmegaConf.load(ROOT / "params.yaml")
    OmegaConf.update(cfg, "paths.prompts", str(tmp_path / "prompts"))
    C.validate(cfg)
    OmegaConf.update(cfg, "paths.prompts", tempfile.gettempdir())  # the temp folder itself: refused
    with pytest.raises(C.ConfigError, match="paths.prompts="):
        C.validate(cfg)
    OmegaConf.update(cfg, "paths.prompts", "data/prompts")
    monkeypatch.setattr(conf_schema, "_usable_cores", lambda: 64)
    OmegaConf.update(cfg, "workers", 256)
    C.validate(cfg)
    OmegaConf.update(cfg, "workers", 257)
    with pytest.raises(C.ConfigError, match=r"workers=257: expected a number of processes from 1 to 256 "
                                            r"\(4 per core this process may use: 64; 8 on any machine\) or auto"):
        C.validate(cfg)
    monkeypatch.setattr(conf_schema, "_usable_cores", lambda: 1)
    OmegaConf.update(cfg, "workers", 8)  # a count any machine takes
    C.validate(cfg)


def test_the_schemas_bounds_are_the_ones_the_code_holds():
    from pipeline.core.parallel import available_cores
    from pipeline.memory.schemas import MAX_MESSAGE_CHARS

    assert conf_schema.MAX_MESSAGE_CHARS == MAX_MESSAGE_CHARS
    assert conf_schema._usable_cores() == available_cores()
    games = (ROOT / "pipeline" / "envs" / "household" / "games.py").read_text()
    assert '"split": "eval" if k < n_eval else "train"' in games and conf_schema.SPLITS == ("train", "eval")


KEY = "sk-proj-4f9Q2xY7Lm3Nq8Rt"  # what a key typed into the wrong field looks like (made up)


def test_a_key_in_api_key_env_is_refused_and_never_written(repo: Path):
    before = (repo / "params.yaml").read_bytes()
    with pytest.raises(C.ConfigError, match="model.api_key_env: expected the name of an environment variable") as err:
        C.compose(repo, [f"model.api_key_env={KEY}"])
    assert KEY not in str(err.value)
    assert (repo / "params.yaml").read_bytes() == before
    assert not (repo / "params.overrides.yaml").exists() or KEY not in (repo / "params.overrides.yaml").read_text()
    # `dvc exp run -S` writes params.yaml itself, then check_params runs: refused and blanked out
    (repo / "params.yaml").write_text(C.compose_text(repo, [f"model.api_key_env={KEY}"]))
    with pytest.raises(C.ConfigError, match="api_key_env") as err:
        C.check(repo, record=True)
    assert KEY not in str(err.value) and KEY not in (repo / "params.yaml").read_text()
    C.compose(repo, ["model.api_key_env=MY_SERVER_KEY"])  # a variable name is fine


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model=local", "model.name_or_path=models/missing"], "model.name_or_path='models/missing': expected an "
                                                               "existing model directory"),
        (["model=local", "model.name_or_path=conf"], "holds no config.json and weights"),
        (["model=local"], "model.name_or_path=None: expected a local model directory"),
        (["model=openai", "model.api_model=null"], "model.api_model=None: expected the model name"),
        (["model=openai", "model.base_url=null", "model.api_model=m"], "model.base_url=None: expected the endpoint"),
    ],
)
def test_check_params_refuses_a_model_source_that_is_not_there(repo: Path, overrides: list, message: str):
    (repo / "models").mkdir()
    C.compose(repo, ["agent=llm", *overrides])  # compose takes it (the model may come later) ...
    with pytest.raises(C.ConfigError) as err:
        C.check(repo, record=True)  # ... check_params, the first stage of every `dvc repro`, does not
    assert message in str(err.value)


def test_check_params_accepts_a_complete_model_directory(repo: Path):
    model = repo / "models" / "mine"
    model.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (model / name).write_text("{}")
    C.compose(repo, ["agent=llm", "model=local", "model.name_or_path=models/mine"])
    C.check(repo, record=True)
