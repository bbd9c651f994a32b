"""The committed default checkpoint: a trained model published with its model card, and verified.

The experiment plays ``models/policy`` (``model=policy``: ``paths.model``) as it plays any
user's model: a transformers directory that ``AutoModelForCausalLM.from_pretrained`` loads,
with a model card in the Hugging Face Hub's form, ``README.md``: YAML front matter (read by
code: every file's sha256, the recipe, the hashes of the training data, the probes' figures,
the commit and machine it was built on, its size) and a page written from it::

    python -m pipeline.policy.checkpoint verify                  # the files on disk vs their card
    python -m pipeline.policy.checkpoint verify --against HEAD   # ... vs the card committed at HEAD
    make model                                                   # rebuild it (models/dvc.yaml), then the line above

The model pipeline's last step (:mod:`pipeline.stages.checkpoint`) publishes what its
``policy`` step trained (:func:`publish`): a model whose files are byte-identical to those
the card lists leaves the checkpoint, and the card with the provenance of the build that
made it, untouched; a different one replaces the files and gets a new card. So a rebuild on
another machine changes no byte of the experiment's input unless the weights differ.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from pipeline.core.config import load_params, project_root
from pipeline.core.io import atomic_dir, atomic_write_bytes, atomic_write_text, sha256_file
from pipeline.core.revision import head_commit

CARD = "README.md"
FRONT = "---\n"
# The Hub's own metadata keys (huggingface.co/docs/hub/model-cards); the pipeline's under ``pipeline:``.
HUB_META = {"library_name": "transformers", "pipeline_tag": "text-generation",
            "tags": ["textworld", "text-adventure", "agent", "episodic-memory", "llama"]}


class CheckpointError(ValueError):
    """A checkpoint or card that cannot be read, or files that disagree with their card (names the file)."""


def file_digests(directory: Path) -> dict[str, str]:
    """``{file name: sha256}`` of every file of a checkpoint directory but its card, sorted by name."""
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no checkpoint directory there")
    out = {}
    for f in sorted(directory.iterdir()):
        if f.is_file() and f.name != CARD:
            out[f.name] = sha256_file(f)
    return out


def parse_card(text: str, where: str = CARD) -> dict[str, Any]:
    """The ``pipeline:`` block of a card's front matter.

    Raises:
        CheckpointError: no front matter, or no ``pipeline.files`` in it (names ``where``).
    """
    if not text.startswith(FRONT) or f"\n{FRONT}" not in text[len(FRONT):]:
        raise CheckpointError(f"{where}: expected a model card opening with YAML front matter between '---' lines")
    front = text[len(FRONT):text.index(f"\n{FRONT}", len(FRONT)) + 1]
    try:
        meta = yaml.safe_load(front) or {}
    except yaml.YAMLError as exc:
        raise CheckpointError(f"{where}: its front matter is not valid YAML: {exc}") from exc
    block = meta.get("pipeline") if isinstance(meta, dict) else None
    if not isinstance(block, dict) or not isinstance(block.get("files"), dict) or not block["files"]:
        raise CheckpointError(f"{where}: expected `pipeline: files:` (each file's sha256) in its front matter")
    return block


def read_card(directory: Path) -> dict[str, Any]:
    """The ``pipeline:`` block of ``directory/README.md`` (:func:`parse_card`)."""
    path = directory / CARD
    if not path.is_file():
        raise CheckpointError(f"{path}: the checkpoint has no model card")
    return parse_card(path.read_text(encoding="utf-8"), str(path))


def differences(digests: Mapping[str, str], card: Mapping[str, Any]) -> list[str]:
    """What differs between a directory's files and a card's list, one line each (empty: identical)."""
    listed = dict(card.get("files") or {})
    out = []
    for name in sorted(set(listed) | set(digests)):
        if name not in digests:
            out.append(f"{name}: listed by the card, missing")
        elif name not in listed:
            out.append(f"{name}: not listed by the card (sha256 {digests[name][:12]})")
        elif listed[name] != digests[name]:
            out.append(f"{name}: sha256 {digests[name][:12]}, the card lists {str(listed[name])[:12]}")
    return out


@dataclass(frozen=True)
class Published:
    """What :func:`publish` did: ``identical`` (nothing written) or ``replaced``, and the files' sha256."""

    identical: bool
    files: dict[str, str]
    changes: tuple[str, ...]


def publish(built: Path, dest: Path, meta: Mapping[str, Any]) -> Published:
    """Publish the model directory ``built`` at ``dest`` with a card written from ``meta``.

    When ``dest`` holds a card whose files are byte-identical to ``built``'s, nothing is
    written (the card keeps the provenance of the build that made those bytes). Otherwise
    ``dest`` is replaced whole (:func:`pipeline.core.io.atomic_dir`): ``built``'s files and a
    new card, ``meta`` plus every file's sha256 and size.

    Args:
        built: a ``save_pretrained`` directory (no card of its own).
        dest: the checkpoint directory (``paths.model``).
        meta: the card's ``pipeline:`` block but ``files`` (:func:`card_meta`).
    """
    files = file_digests(built)
    try:
        changes = differences(files, read_card(dest))
    except CheckpointError as exc:
        changes = [str(exc)]
    if not changes:
        return Published(True, files, ())
    size = sum((built / n).stat().st_size for n in files)
    block = {**meta, "files": files, "size_bytes": size}
    with atomic_dir(dest) as tmp:
        for name in files:
            atomic_write_bytes(tmp / name, (built / name).read_bytes())
        atomic_write_text(tmp / CARD, render_card(block))
    return Published(False, files, tuple(changes))


def card_meta(*, recipe: Mapping[str, Any], world: Mapping[str, Any], training: Mapping[str, Any],
              data: Mapping[str, str], built: Mapping[str, str]) -> dict[str, Any]:
    """A card's ``pipeline:`` block but its files.

    Args:
        recipe: the model pipeline's ``policy`` section (the recipe).
        world: what the demonstrations were played in (seed, world, its sizes).
        training: the ``policy`` step's ``training.json`` (model size, demonstrations, probes).
        data: ``{training data file: sha256}``.
        built: ``{"commit", "machine", "level", "date"}``.
    """
    model = dict(training.get("model") or {})
    probes = {k: training[k] for k in ("incontext", "episode_probe") if k in training}
    return {"name": "policy", "architecture": model.get("architecture"), "parameters": model.get("parameters"),
            "recipe": dict(recipe), "world": dict(world), "training_data": dict(data),
            "demonstrations": dict(training.get("demos") or {}), "probes": probes,
            "dagger_rounds": len((training.get("dagger") or {}).get("rounds") or []), "built": dict(built)}


def built_on(root: Path, machine: str, level: str) -> dict[str, str]:
    """The ``built`` entry of a card written now: the commit, the machine, its x86-64 level, today (UTC)."""
    return {"commit": head_commit(root, short=False), "machine": machine, "level": level,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")}


def _fmt(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def render_card(block: Mapping[str, Any]) -> str:
    """The card: the Hub's front matter with ``pipeline: block``, then a page written from it."""
    front = yaml.safe_dump({**HUB_META, "pipeline": dict(block)}, sort_keys=False, allow_unicode=True, width=100)
    b = block
    built = b.get("built") or {}
    teacher = (b.get("recipe") or {}).get("teacher", "expert")  # policy.teacher: who answered its training turns
    lines = [f"{FRONT}{front}{FRONT}", "# policy: the pipeline's default model", "",
             f"A {b.get('parameters'):,}-parameter {b.get('architecture')} trained on CPU by this project's model "
             f"pipeline (`make model`, `models/dvc.yaml`), from the {teacher}'s demonstrations in household text games "
             f"and its own episodes labelled by the {teacher} (DAgger). The experiment (`make repro`) plays it as "
             "`model=policy`, as it would play any user's model; it never trains it.", "",
             "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
             'model = AutoModelForCausalLM.from_pretrained("models/policy")',
             'tokenizer = AutoTokenizer.from_pretrained("models/policy")', "```", "",
             "## Built", "",
             f"At commit `{built.get('commit')}` on {built.get('machine')} ({built.get('level')}), "
             f"{built.get('date')}. `make model` rebuilds it and checks every file against the sha256 listed "
             "above (`python -m pipeline.policy.checkpoint verify --against HEAD`); "
             f"{b.get('size_bytes', 0) / 1e6:.1f} MB in {len(b.get('files') or {})} files.", "",
             "## Recipe", "", "The model pipeline's `policy` section (`conf/policy/`, `models/params.yaml`):", "",
             "| key | value |", "|---|---|"]
    lines += [f"| `{k}` | {_fmt(v)} |" for k, v in (b.get("recipe") or {}).items()]
    lines += ["", "## Data", "",
              "Played in the world below (the model pipeline's own games, built as the experiment's `games` stage "
              "builds them), never an eval quest's episode: the demonstrations are the train quests' and generated "
              "houses' (`docs/policy.md`).", "", "| world | value |", "|---|---|"]
    lines += [f"| `{k}` | {_fmt(v)} |" for k, v in (b.get("world") or {}).items()]
    lines += ["", "| training data | sha256 |", "|---|---|"]
    lines += [f"| `{k}` | `{v}` |" for k, v in (b.get("training_data") or {}).items()]
    probes = b.get("probes") or {}
    if probes:
        lines += ["", "## Probes (held-out generated houses)", "", "| probe | figure | value |", "|---|---|---|"]
        for probe, figs in probes.items():
            for k, v in (figs or {}).items():
                if not isinstance(v, (dict, list)):
                    lines.append(f"| {probe} | {k} | {_fmt(v)} |")
    lines += ["", "How the experiment measures it: `README.md` and `docs/policy.md` of the project.", ""]
    return "\n".join(lines)


def _card_at(root: Path, rev: str, rel: str) -> dict[str, Any]:
    try:
        text = subprocess.run(["git", "show", f"{rev}:{rel}/{CARD}"], cwd=root, capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CheckpointError(f"{rev}:{rel}/{CARD}: not in git ({getattr(exc, 'stderr', '') or exc})".strip()) from exc
    return parse_card(text, f"{rev}:{rel}/{CARD}")


def verify(directory: Path, *, card: Mapping[str, Any] | None = None) -> list[str]:
    """Differences between ``directory``'s files and ``card`` (its own card when None); empty: byte-identical."""
    return differences(file_digests(directory), read_card(directory) if card is None else card)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.policy.checkpoint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("verify", help="exit 1 unless the checkpoint's files are byte-identical to its card's list")
    p.add_argument("path", nargs="?", help="the checkpoint directory (default: paths.model of params.yaml)")
    p.add_argument("--against", metavar="REV", help="the card committed at this git revision (HEAD) instead of "
                                                     "the one on disk")
    args = parser.parse_args(argv)
    root = project_root()
    try:
        rel = args.path or str(load_params(root, check_stale=False).paths.model)
        directory = Path(rel) if Path(rel).is_absolute() else root / rel
        card = _card_at(root, args.against, Path(rel).as_posix()) if args.against else read_card(directory)
        diffs = verify(directory, card=card)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    against = f"the card committed at {args.against}" if args.against else f"{rel}/{CARD}"
    if diffs:
        print(f"{rel}: differs from {against}:\n  " + "\n  ".join(diffs), file=sys.stderr)
        print("A new recipe or code: review the new card (git diff), then commit the checkpoint with "
              "models/dvc.lock; else `git checkout -- <checkpoint>` restores the committed one.", file=sys.stderr)
        return 1
    files = card.get("files") or {}
    weights = next((n for n in files if n.endswith(".safetensors")), next(iter(files), ""))
    print(f"{rel}: byte-identical to {against} ({len(files)} files; {weights} sha256 {str(files.get(weights))[:16]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
