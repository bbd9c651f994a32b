"""The config route: ``conf/`` (Hydra) -> ``params.yaml`` (committed) -> stages.

Two pipelines, each with its own top-level config and params file (:data:`PIPELINES`): the
experiment (``conf/config.yaml`` -> ``params.yaml``, ``dvc.yaml``) and the model pipeline that
builds the default checkpoint (``conf/train.yaml`` -> ``models/params.yaml``,
``models/dvc.yaml``; every command below takes ``--pipeline model``).

``dvc repro`` never recomposes ``params.yaml``; ``dvc exp run`` does, through Hydra.
This module composes exactly as DVC does (it calls DVC's own ``compose_and_dump``),
checks that ``params.yaml`` is not stale, and loads + validates it for the stages::

    python -m pipeline.core.config compose          # regenerate params.yaml from conf/
    python -m pipeline.core.config check            # fail loudly if params.yaml is stale
    python -m pipeline.core.config compose agent=rag  # compose with Hydra overrides (recorded)
    python -m pipeline.core.config compose --keep-overrides  # conf/ edited after `dvc exp apply`

params.yaml is in sync when it is what ``conf/`` composes to with the overrides recorded
in ``params.overrides.yaml`` (:mod:`pipeline.core.overrides`). Inside a ``dvc exp run``
(DVC sets ``DVC_EXP_BASELINE_REV``) params.yaml was just composed by DVC with the
experiment's overrides, so the check verifies its structure and validates it, and the
``check_params`` stage records the overrides, so that after ``dvc exp apply`` a plain
``dvc repro`` accepts the experiment's params.yaml.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import re
import sys
import tempfile
import typing
import urllib.parse
from enum import Enum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline.core import conf_schema
from pipeline.core.conf_schema import AgentName, Backend, Config, GroundingGenerator, ModelConfig, TrainConfig
from pipeline.core import overrides as recorded
from pipeline.core.io import atomic_write_text

PARAMS_FILE = "params.yaml"
CONF_DIR = "conf"
CONFIG_NAME = "config"


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """One of the project's pipelines: where its config is composed from and written to.

    Attributes:
        name: ``experiment`` | ``model`` (a stage's ``--pipeline``).
        config_name: the top-level config under ``conf/`` (``conf/<config_name>.yaml``).
        params_file: the composed params, relative to the project root (committed).
        overrides_file: the record of what a compose's overrides changed, beside it.
        schema: the typed schema it is validated against.
    """

    name: str
    config_name: str
    params_file: str
    overrides_file: str
    schema: type


EXPERIMENT = Pipeline("experiment", CONFIG_NAME, PARAMS_FILE, recorded.OVERRIDES_FILE, Config)
MODEL = Pipeline("model", "train", "models/params.yaml", "models/params.overrides.yaml", TrainConfig)
PIPELINES = {p.name: p for p in (EXPERIMENT, MODEL)}


# The check_params stage's constant output: the first dependency of every other stage, so
# DVC runs the check (and stops on a stale params.yaml) before it touches any output.
CHECKED_FILE = "params_checked"
CHECKED_TEXT = "params.yaml passed the stale check against conf/\n"


class ConfigError(ValueError):
    """A bad config value or a stale params.yaml (the message names the key)."""


# What OmegaConf's "Invalid value ..., expected one of [...]" cannot say about a closed set.
_REFUSED_HINTS = {"numerics.mkl_cbwr": "MKL's other branches exist on Intel CPUs only"}


def project_root(start: str | os.PathLike | None = None) -> Path:
    """The folder holding ``dvc.yaml`` and ``conf/``, searched upward from ``start`` (or cwd).

    ``DVC_ROOT`` is only a fallback: for queued experiments DVC points it at the *parent*
    repository while the stage runs in a temporary copy, and outputs must go to the copy.
    """
    here = Path(start or os.getcwd()).resolve()
    for cand in (here, *here.parents):
        if (cand / "dvc.yaml").exists() and (cand / CONF_DIR).is_dir():
            return cand
    env_root = os.environ.get("DVC_ROOT")
    if env_root and start is None and (Path(env_root) / CONF_DIR).is_dir():
        return Path(env_root)
    return here


def compose_text(root: Path, overrides: Iterable[str] = (), *, pipeline: Pipeline = EXPERIMENT) -> str:
    """Compose ``conf/<pipeline.config_name>.yaml`` with DVC's own function and return the YAML text it writes."""
    # deferred: heavy (Hydra + DVC, ~0.15 s); a stage whose check is stamped never composes
    from dvc.utils.hydra import compose_and_dump
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / PARAMS_FILE
        try:
            compose_and_dump(out, str(root / CONF_DIR), None, pipeline.config_name, str(root), list(overrides))
        except Exception as exc:  # Hydra's errors already name the key / group
            raise ConfigError(f"cannot compose {root / CONF_DIR}: {_hydra_message(exc)}") from exc
        return out.read_text(encoding="utf-8")


def _hydra_message(exc: BaseException) -> str:
    parts = [str(exc)]
    cause = exc.__cause__
    while cause is not None:
        parts.append(str(cause))
        cause = cause.__cause__
    return " | ".join(p.strip().replace("\n", " ") for p in parts if p.strip())


def compose(root: Path | None = None, overrides: Iterable[str] = (), *, keep_overrides: bool = False,
            pipeline: Pipeline = EXPERIMENT) -> Path:
    """Regenerate ``params.yaml`` (``pipeline.params_file``) exactly as ``dvc exp run`` would, then validate it.

    Records what the given Hydra overrides changed (:mod:`pipeline.core.overrides`), so
    the stale check accepts the result. ``keep_overrides`` re-applies the overrides
    already recorded (after an edit of ``conf/`` on top of an applied experiment).
    """
    root = root or project_root()
    if not (root / CONF_DIR).is_dir():
        _require_project(root)
    kept = recorded.hydra_overrides(recorded.read(root, pipeline.overrides_file)) if keep_overrides else []
    text = compose_text(root, [*kept, *overrides], pipeline=pipeline)
    base = yaml.safe_load(compose_text(root, pipeline=pipeline)) if (overrides or kept) else None
    validate(OmegaConf.create(text), schema=pipeline.schema)
    path = atomic_write_text(root / pipeline.params_file, text)
    recorded.write(root, recorded.diff(base, yaml.safe_load(text)) if base is not None else [],
                   pipeline.overrides_file)
    return path


def _leaf_diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain containers."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            key = f"{prefix}.{k}" if prefix else str(k)
            if k not in a:
                out.append(f"{key} (missing from params.yaml)")
            elif k not in b:
                out.append(f"{key} (not in conf/)")
            else:
                out.extend(_leaf_diff(a[k], b[k], key))
        return out
    return [] if a == b else [f"{prefix}: params.yaml={json.dumps(a)} conf={json.dumps(b)}"]


def _keys(d: Any, prefix: str = "") -> set[str]:
    if not isinstance(d, dict):
        return set()
    out = set()
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.add(key)
        if isinstance(v, dict) and key.split(".")[0] != "condition":
            out |= _keys(v, key)
    return out


def _stamp_path(root: Path, params_text: str, params: Any, pipeline: Pipeline = EXPERIMENT) -> Path:
    """Where a passed check of exactly these inputs is remembered.

    The name is a hash of everything the check reads: params.yaml's bytes, every file of
    ``conf/`` and ``hydra_plugins/``, the schema and this module's source, the versions
    of DVC / Hydra / OmegaConf, and whether a ``dvc exp run`` is composing. Same inputs,
    same verdict: a stage then skips the Hydra compose (most of its start-up time).
    """
    h = hashlib.sha256()

    def add(name: str, data: bytes) -> None:
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)

    add(pipeline.params_file, params_text.encode("utf-8"))
    record = root / pipeline.overrides_file
    add(pipeline.overrides_file, record.read_bytes() if record.is_file() else b"")
    for sub in (CONF_DIR, "hydra_plugins"):
        folder = root / sub
        if folder.is_dir():
            for f in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                add(f.relative_to(root).as_posix(), f.read_bytes())
    for mod in (conf_schema.__file__, __file__):
        add(Path(mod).name, Path(mod).read_bytes())
    for pkg in ("dvc", "hydra-core", "omegaconf"):
        try:
            add(pkg, version(pkg).encode())
        except PackageNotFoundError:
            add(pkg, b"?")
    add("exp_run", b"1" if os.environ.get("DVC_EXP_BASELINE_REV") else b"0")
    ckpt = params.get("paths", {}).get("checkpoints") if isinstance(params, dict) else None
    folder = root / (ckpt if isinstance(ckpt, str) and ckpt else ".checkpoints") / "params_check"
    return folder / h.hexdigest()[:32]


def _require_project(root: Path) -> None:
    """Raise when ``root`` is no project root (a stage or check started outside the project)."""
    if not ((root / "dvc.yaml").is_file() and (root / CONF_DIR).is_dir()):
        raise ConfigError(f"{root} is not inside the project: no folder from here up holds dvc.yaml and {CONF_DIR}/; "
                          "run the command from the project's root (or a folder below it)")


def _remember(stamp: Path | None) -> None:
    if stamp is None:
        return
    try:  # only a shortcut: a read-only checkout just recomposes next time
        atomic_write_text(stamp, "params.yaml in sync with conf/\n")
    except Exception:  # noqa: BLE001 - never fail a check over its cache
        pass


def check(root: Path | None = None, *, use_stamp: bool = True, record: bool = False,
          pipeline: Pipeline = EXPERIMENT) -> None:
    """Raise :class:`ConfigError` when params.yaml (``pipeline.params_file``) is stale against conf/.

    params.yaml is in sync when it is what conf/ composes to, with the overrides recorded
    in ``params.overrides.yaml`` applied (:mod:`pipeline.core.overrides`: an applied
    ``dvc exp``, or ``compose key=value``). Inside a ``dvc exp run`` (DVC just composed
    params.yaml with the experiment's overrides) only its structure is checked, and
    ``record=True`` (the check_params stage) records what the experiment changed.

    A passed check is remembered (a stamp under ``<paths.checkpoints>/params_check/``
    named by the hash of every input, :func:`_stamp_path`), so the stages after
    ``check_params`` skip the Hydra compose; ``use_stamp=False`` always recomposes.
    """
    root = root or project_root()
    params_path = root / pipeline.params_file
    if not params_path.exists():
        _require_project(root)
        raise ConfigError(f"{params_path} is missing: run `{_compose_command(pipeline)}`")
    current = params_path.read_text(encoding="utf-8")
    try:
        params = yaml.safe_load(current)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{params_path} is not valid YAML: {exc}") from exc
    # DVC composes only the experiment's params.yaml on `dvc exp run` (.dvc/config: conf/config.yaml)
    in_exp = bool(os.environ.get("DVC_EXP_BASELINE_REV")) and pipeline is EXPERIMENT
    stamp = _stamp_path(root, current, params, pipeline) if use_stamp and not record else None
    if stamp is not None and stamp.is_file():
        return
    _refuse_key_in_key_env(root, params, pipeline)
    _refuse_credentials_in_base_url(root, params, pipeline)
    typed = validate(OmegaConf.create(params), schema=pipeline.schema)
    if pipeline is EXPERIMENT:  # the model pipeline builds its model
        check_model_source(typed, root)
    expected = compose_text(root, pipeline=pipeline)
    composed = yaml.safe_load(expected)
    if in_exp:
        # dvc exp run composed params.yaml with the experiment's overrides just now.
        missing = _keys(composed) ^ _keys(params)
        if missing:
            raise ConfigError(
                f"{params_path} does not have the structure conf/ composes to; differing keys: "
                + ", ".join(sorted(missing)[:10])
            )
        if record:
            recorded.write(root, recorded.diff(composed, params), pipeline.overrides_file)
        _remember(stamp)
        return
    try:
        kept = recorded.read(root, pipeline.overrides_file)
    except recorded.OverridesError as exc:
        raise ConfigError(str(exc)) from exc
    patched = recorded.apply(composed, kept)
    if current == expected or params == patched:
        if record and not (root / pipeline.overrides_file).exists():
            recorded.write(root, [], pipeline.overrides_file)
        _remember(stamp)
        return
    diffs = _leaf_diff(params, patched)
    shown = "; ".join(diffs[:8]) + (f"; ... ({len(diffs)} in all)" if len(diffs) > 8 else "")
    with_record = (f" with the overrides recorded in {pipeline.overrides_file} ({recorded.describe(kept)})"
                   if kept else "")
    keep = (f" `{_compose_command(pipeline)} --keep-overrides` recomposes it with them "
            "(plain `compose`: conf/ alone)." if kept else
            f" Run `{_compose_command(pipeline)}` and commit {pipeline.params_file}.")
    exp = " For an experiment: `dvc exp run -S key=value`." if pipeline is EXPERIMENT else ""
    raise ConfigError(
        f"{params_path} is stale against {root / CONF_DIR}{with_record} ({shown or 'formatting differs'}). "
        f"`dvc repro` never recomposes it:{keep}{exp}"
    )


def _compose_command(pipeline: Pipeline) -> str:
    return "python -m pipeline.core.config compose" + ("" if pipeline is EXPERIMENT else f" --pipeline {pipeline.name}")


# What `model.api_key_env` must look like: the *name* of an environment variable, never a key.
ENV_VAR_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_REFUSED_KEY = "REFUSED_NOT_AN_ENV_VAR_NAME"


def _key_env_error(value: Any) -> ConfigError:
    # The value is not shown: a string that is no variable name is most likely the key itself.
    return ConfigError(f"params key model.api_key_env: expected the name of an environment variable "
                       f"({ENV_VAR_NAME.pattern}, e.g. OPENAI_API_KEY), got a {len(str(value))}-character value that "
                       "is not one (not shown: it may be the key itself); put the key in that variable, never in "
                       "the config")


# The credentials of a URL's authority (`http://user:pass@host`), wherever a URL stands in a text.
_URL_CREDENTIALS = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/\s?#]*@")


def redact_url(text: Any) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``: what is logged,
    cached or written of a URL goes through it.

    >>> redact_url("POST http://user:s3cret@proxy:8000/v1/chat/completions failed")
    'POST http://***@proxy:8000/v1/chat/completions failed'
    """
    return _URL_CREDENTIALS.sub(r"\1***@", str(text))


def url_secrets(url: Any) -> tuple[str, ...]:
    """The credentials of ``url`` (its ``user:pass`` part, the password as written and decoded),
    longest first: what to scrub from other text, such as a server's or a library's error message."""
    parts = urllib.parse.urlsplit(str(url))
    userinfo, at, _ = parts.netloc.rpartition("@")
    if not at:
        return ()
    found = {userinfo, parts.password or "", urllib.parse.unquote(parts.password or "")}
    return tuple(sorted((x for x in found if x), key=len, reverse=True))


def _url_credentials_error(url: Any) -> ConfigError:
    return ConfigError(f"params key model.base_url={redact_url(url)!r}: expected a URL without credentials "
                       "(user:password@): params.yaml and dvc.lock would keep them; put the API key in the "
                       "environment variable model.api_key_env names")


def _refuse_credentials_in_base_url(root: Path, params: Any, pipeline: Pipeline = EXPERIMENT) -> None:
    """Refuse a ``model.base_url`` with credentials, and blank them out of ``params.yaml`` and
    ``params.overrides.yaml`` (``dvc exp run -S`` writes params.yaml before any check runs)."""
    value = (params.get("model") or {}).get("base_url") if isinstance(params, dict) else None
    secrets = url_secrets(value) if value else ()
    if not secrets:
        return
    for name in (pipeline.params_file, pipeline.overrides_file):
        path = root / name
        if path.is_file() and secrets[0] in (text := path.read_text(encoding="utf-8")):
            atomic_write_text(path, text.replace(secrets[0], "***"))
    raise ConfigError(f"{_url_credentials_error(value)} (they were replaced by *** in {pipeline.params_file})")


def _refuse_key_in_key_env(root: Path, params: Any, pipeline: Pipeline = EXPERIMENT) -> None:
    """Refuse a ``model.api_key_env`` that is no variable name, and blank it out of
    ``params.yaml`` and ``params.overrides.yaml`` (``dvc exp run -S`` writes params.yaml
    before any check runs): a key typed into the wrong field must not be committed."""
    value = (params.get("model") or {}).get("api_key_env") if isinstance(params, dict) else None
    if value is None or ENV_VAR_NAME.match(str(value)):
        return
    for name in (pipeline.params_file, pipeline.overrides_file):
        path = root / name
        if path.is_file() and str(value) in (text := path.read_text(encoding="utf-8")):
            atomic_write_text(path, text.replace(str(value), _REFUSED_KEY))
    raise ConfigError(f"{_key_env_error(value)} (its value was replaced by {_REFUSED_KEY} in {pipeline.params_file})")


def _model_needed(cfg: Config) -> bool:
    """Whether a stage of this config runs the model (the llm agent, the llm grounding writer)."""
    return cfg.agent.name == AgentName.llm or cfg.grounding.generator == GroundingGenerator.llm


def check_model_source(cfg: Config, root: Path) -> None:
    """Check that the configured model can be reached, before any stage runs.

    ``check_params`` calls it (through :func:`check`), so a bad model setting stops
    ``dvc repro`` before DVC deletes any stage's outputs. Only when a stage runs the model
    (:func:`_model_needed`); a model the DAG builds itself (``model.gguf.file``: the
    ``convert`` stage) is not looked for. The default, ``model=policy``, is the committed
    checkpoint ``models/policy``, checked like any local directory.

    - ``model.backend=transformers``: ``model.name_or_path`` is set and is a directory
      holding a model (``config.json`` and weights) and a tokenizer. A name that is no
      local path (``org/name`` whose ``org`` is not a folder here) is taken as a hub id.
    - ``model.backend=openai``: ``model.base_url`` (``http(s)://...``) and
      ``model.api_model`` are set.

    Raises:
        ConfigError: naming the key and what is missing.
    """
    m = cfg.model
    if not _model_needed(cfg):
        return
    if m.backend == Backend.openai:
        _require(bool(m.base_url) and str(m.base_url).startswith(("http://", "https://")), "model.base_url",
                 redact_url(m.base_url) if m.base_url else m.base_url,
                 "the endpoint's URL up to /v1 (http://host:port/v1) with model.backend=openai")
        _require(bool(m.api_model), "model.api_model", m.api_model,
                 "the model name the endpoint serves with model.backend=openai")
        return
    if m.gguf.file:
        return  # built by the convert stage
    _require(bool(m.name_or_path), "model.name_or_path", m.name_or_path,
             "a local model directory with agent=llm (model=policy: the committed checkpoint models/policy)")
    name = str(m.name_or_path)
    path = Path(name) if Path(name).is_absolute() else root / name
    parts = Path(name).parts
    hub_id = (not path.exists() and not name.startswith((".", "/", "~")) and len(parts) == 2
              and not (root / parts[0]).exists())
    if hub_id:
        return
    _require(path.is_dir(), "model.name_or_path", name, f"an existing model directory ({path} does not exist)")
    files = {p.name for p in path.iterdir()}
    weights = any(f.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")) for f in files)
    _require("config.json" in files and weights, "model.name_or_path", name,
             f"a model directory: {path} holds no config.json and weights (*.safetensors or *.bin)")
    _require(bool({"tokenizer.json", "tokenizer_config.json", "tokenizer.model"} & files), "model.name_or_path",
             name, f"a model directory with its tokenizer: {path} holds no tokenizer.json / tokenizer_config.json")


def _require(cond: bool, key: str, value: Any, expected: str) -> None:
    if not cond:
        raise ConfigError(f"params key {key}={value!r}: expected {expected}")


def validate(cfg: DictConfig, *, schema: type = Config) -> DictConfig:
    """Type-check against the schema (``Config``: the experiment's; ``TrainConfig``: the model
    pipeline's) and check ranges; returns the typed config."""
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), cfg)
    except Exception as exc:
        hint = _REFUSED_HINTS.get(getattr(exc, "full_key", None) or "")
        raise ConfigError(f"invalid params: {_hydra_message(exc)}" + (f" ({hint})" if hint else "")) from exc
    _check_ranges(schema, typed)
    if schema is Config:  # the model pipeline evaluates no condition
        _check_conditions(typed)
    _check_model_secrets(typed.model)
    return typed


def _check_ranges(schema: type, section: DictConfig, prefix: str = "") -> None:
    """Run the range checks the schema declares (:mod:`pipeline.core.conf_schema`: each field's
    ``checks``, then the section's ``cross_checks``) on a typed section and the sections below
    it, in schema order; the first that fails raises."""
    hints = _hints(schema)
    for f in dataclasses.fields(schema):
        for check in f.metadata.get(conf_schema.CHECKS, ()):
            _refuse(prefix + f.name, section[f.name], check)
        if dataclasses.is_dataclass(hints[f.name]):
            _check_ranges(hints[f.name], section[f.name], f"{prefix}{f.name}.")
    for name, expected in getattr(schema, "cross_checks", lambda _: ())(section):
        if expected is not None:
            raise ConfigError(f"params key {prefix}{name}={_shown(section[name])!r}: expected {expected}")


def _refuse(key: str, value: Any, check: conf_schema.Check) -> None:
    shown = _shown(value)
    expected = check(shown)
    if expected is not None:
        raise ConfigError(f"params key {key}={shown!r}: expected {expected}")


def _shown(value: Any) -> Any:
    """A value as a check reads it and the error shows it: a list's items, an enum's name."""
    if isinstance(value, ListConfig):
        return list(value)
    return str(value) if isinstance(value, Enum) else value


@functools.cache
def _hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def _check_model_secrets(m: ModelConfig) -> None:
    """No key in ``model.api_key_env``, no credentials in ``model.base_url`` (their messages never show them)."""
    if not ENV_VAR_NAME.match(m.api_key_env):
        raise _key_env_error(m.api_key_env)
    if m.base_url and url_secrets(m.base_url):
        raise _url_credentials_error(m.base_url)


def _check_conditions(typed: Config) -> None:
    """At least one condition; every compared condition defined (here, not in the schema: it reads conf/condition/);
    the online loop's memory, a selected condition (its block is built while ``collect`` plays, so a typo would
    otherwise surface only there, after the games)."""
    _require(len(typed.condition) >= 1, "condition", list(typed.condition), "at least one condition")
    online = typed.grounding.online_memory
    _require(online is None or online in typed.condition, "grounding.online_memory", online,
             f"null or a selected condition ({', '.join(typed.condition)})")
    known = set(typed.condition) | {p.stem for p in (project_root() / CONF_DIR / "condition").glob("*.yaml")}
    x = typed.experiment
    for key, pairs in (("experiment.comparisons", x.comparisons), ("experiment.positive_controls", x.positive_controls),
                       ("experiment.checks", x.checks)):
        for pair in pairs:
            _require(len(pair) == 2, key, list(pair), "pairs [treatment, control]")
            for name in pair:  # a known but unselected condition is skipped by `compare`
                _require(name in known, key, name, f"a condition defined in conf/condition/ ({', '.join(sorted(known))})")


def load_params(root: Path | None = None, *, check_stale: bool = True, pipeline: Pipeline = EXPERIMENT) -> DictConfig:
    """Load, validate and (by default) staleness-check ``params.yaml`` (``pipeline.params_file``) for a stage."""
    root = root or project_root()
    if check_stale:
        check(root, pipeline=pipeline)
    path = root / pipeline.params_file
    try:
        raw = OmegaConf.load(path)
    except FileNotFoundError as exc:
        _require_project(root)
        raise ConfigError(f"{path} is missing: run `{_compose_command(pipeline)}`") from exc
    return validate(raw, schema=pipeline.schema)


def config_hash(cfg: DictConfig | dict, *keys: str, ignore: Iterable[str] = ()) -> str:
    """Stable short hash of the given config subtrees (all of it when no keys), without the
    dotted keys in ``ignore``."""
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True) if isinstance(cfg, DictConfig) else cfg
    part = {k: _select(container, k) for k in keys} if keys else container
    part = json.loads(json.dumps(part, default=str)) if ignore else part  # a copy to prune
    for dotted in ignore:
        *parents, leaf = dotted.split(".")
        node = part
        for k in parents:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    blob = json.dumps(part, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def config_subtrees(cfg: DictConfig, keys: Sequence[str]) -> dict:
    """The plain values of ``keys`` (dotted) at their places in a nested dict: the hash reads
    these subtrees, not the whole config (what ``python -m pipeline.tools.deps record`` sees)."""
    out: dict = {}
    for dotted in keys:
        *parents, leaf = dotted.split(".")
        node: Any = cfg
        for part in [*parents, leaf]:
            node = node[part]
        value = OmegaConf.to_container(node, resolve=True, enum_to_str=True) if OmegaConf.is_config(node) else node
        into = out
        for part in parents:
            into = into.setdefault(part, {})
        into[leaf] = value
    return out


def _select(d: Any, dotted: str) -> Any:
    for k in dotted.split("."):
        d = d.get(k) if isinstance(d, dict) else None
    return d


def to_plain(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def section(schema_cls: type, values: Any = None) -> DictConfig:
    """A typed config section: the schema dataclass's defaults merged with ``values``.

    For code and tests that build one group by hand (``section(UserConfig, {"noise": 0.1})``);
    a stage gets its sections from :func:`load_params`. Unknown keys and wrong types raise.
    """
    try:
        return OmegaConf.merge(OmegaConf.structured(schema_cls), values or {})  # type: ignore[return-value]
    except Exception as exc:
        raise ConfigError(f"invalid {schema_cls.__name__}: {_hydra_message(exc)}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.core.config", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_compose = sub.add_parser("compose", help="regenerate params.yaml from conf/ (as dvc exp run does)")
    p_compose.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. agent=rag")
    p_compose.add_argument("--keep-overrides", action="store_true",
                           help=f"re-apply the overrides recorded in {recorded.OVERRIDES_FILE} (an applied dvc exp)")
    p_check = sub.add_parser("check", help="fail if params.yaml is stale against conf/")
    p_check.add_argument("--record", action="store_true",
                         help=f"the check_params stage: inside `dvc exp run` record the experiment's overrides in "
                              f"{recorded.OVERRIDES_FILE}; write <paths.checkpoints>/{CHECKED_FILE}")
    for p in (p_compose, p_check):
        p.add_argument("--pipeline", choices=list(PIPELINES), default=EXPERIMENT.name,
                       help=f"experiment: conf/config.yaml -> params.yaml (default); model: conf/{MODEL.config_name}.yaml "
                            f"-> {MODEL.params_file} (the model pipeline, `make model`)")
    args = parser.parse_args(argv)
    pipeline = PIPELINES[args.pipeline]
    try:
        if args.cmd == "compose":
            path = compose(overrides=args.overrides, keep_overrides=args.keep_overrides, pipeline=pipeline)
            kept = recorded.read(project_root(), pipeline.overrides_file)
            print(f"wrote {path}" + (f" (overrides: {recorded.describe(kept)})" if kept else ""))
        else:
            check(record=args.record, pipeline=pipeline)
            root = project_root()
            if args.record:  # the check_params stage's output every other stage depends on
                ckpt = OmegaConf.load(root / pipeline.params_file).paths.checkpoints
                atomic_write_text(root / ckpt / CHECKED_FILE, CHECKED_TEXT)
            kept = recorded.read(root, pipeline.overrides_file)
            print(f"{pipeline.params_file} is in sync with conf/" + (f" + overrides {recorded.describe(kept)}" if kept else ""))
    except (ConfigError, recorded.OverridesError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
