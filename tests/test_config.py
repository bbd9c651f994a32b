"""Config route: conf/ composes to the committed params.yaml; stale params fail loudly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

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
    conf.write_text(conf.read_text().replace("top_p: 0.9 ", "top_p: 0.8 "))
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
        ("condition.C1.memory_mode=maybe", "condition.C1.memory_mode"),
        ("env.max_steps=many", "env.max_steps"),
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
        ("env.heldout_scenes", 8, "env.heldout_scenes=8"),
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
