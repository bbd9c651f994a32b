"""The committed checkpoint and its model card (:mod:`pipeline.policy.checkpoint`), and the one in git.

- publishing: a new model gets its files and a card listing their sha256; a rebuild with the
  same bytes writes nothing (the card keeps the first build's provenance); other bytes replace
  the files and the card, saying which changed;
- verifying: the files against their card (or the card at a git revision), every difference named;
- the committed ``models/policy``: loadable by ``from_pretrained``, its card the Hub's form, its
  files byte-identical to the sha256 the card lists (what ``make model`` checks a rebuild against).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.policy.checkpoint import (CARD, CheckpointError, card_meta, differences, file_digests, parse_card,
                                        publish, read_card, verify)

ROOT = Path(__file__).resolve().parents[1]
TRAINING = {"model": {"architecture": "LlamaForCausalLM", "parameters": 1234},
            "incontext": {"oracle_first_step": 0.5, "tasks": 8}, "demos": {"episodes": 3},
            "dagger": {"rounds": [{"round": 0}, {"round": 1}]}}


def _meta(commit: str = "abc") -> dict:
    return card_meta(recipe={"hidden_size": 128, "epochs": 4}, world={"seed": 0, "env": "household"},
                     training=TRAINING, data={"demos/turns.parquet": "f" * 64},
                     built={"commit": commit, "machine": "AMD EPYC", "level": "x86-64-v4", "date": "2026-12-02"})


def _built(folder: Path, weights: bytes = b"weights") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def test_a_new_model_is_published_with_a_card_listing_every_file(tmp_path):
    built, dest = _built(tmp_path / "built"), tmp_path / "models" / "policy"
    out = publish(built, dest, _meta())
    assert not out.identical and out.changes == (f"{dest / CARD}: the checkpoint has no model card",)
    assert sorted(p.name for p in dest.iterdir()) == [CARD, "config.json", "model.safetensors"]
    text = (dest / CARD).read_text()
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["library_name"] == "transformers" and front["pipeline_tag"] == "text-generation"
    card = read_card(dest)
    assert card["files"] == file_digests(built) and card["parameters"] == 1234 and card["dagger_rounds"] == 2
    assert card["built"]["commit"] == "abc" and card["size_bytes"] == len(b"weights") + len('{"model_type": "llama"}')
    assert "| `hidden_size` | 128 |" in text and "| incontext | oracle_first_step | 0.50 |" in text
    assert verify(dest) == []


def test_a_byte_identical_rebuild_writes_nothing_and_other_bytes_replace_the_card(tmp_path):
    built, dest = _built(tmp_path / "built"), tmp_path / "policy"
    publish(built, dest, _meta("first"))
    card_text = (dest / CARD).read_text()
    again = publish(_built(tmp_path / "again"), dest, _meta("second"))
    assert again.identical and again.changes == () and (dest / CARD).read_text() == card_text  # first provenance kept
    other = publish(_built(tmp_path / "other", b"new weights"), dest, _meta("third"))
    assert not other.identical and len(other.changes) == 1 and other.changes[0].startswith("model.safetensors: sha256")
    assert read_card(dest)["built"]["commit"] == "third" and (dest / "model.safetensors").read_bytes() == b"new weights"


def test_verify_names_every_file_that_differs_from_the_card(tmp_path):
    dest = tmp_path / "policy"
    publish(_built(tmp_path / "built"), dest, _meta())
    (dest / "model.safetensors").write_bytes(b"tampered")
    (dest / "extra.bin").write_bytes(b"x")
    (dest / "config.json").unlink()
    diffs = verify(dest)
    assert [d.split(":")[0] for d in diffs] == ["config.json", "extra.bin", "model.safetensors"]
    assert "missing" in diffs[0] and "not listed" in diffs[1] and "the card lists" in diffs[2]
    assert differences({"a": "1"}, {"files": {"a": "1"}}) == []


@pytest.mark.parametrize("text,match", [
    ("# no front matter\n", "expected a model card opening with YAML front matter"),
    ("---\nlibrary_name: transformers\n---\n", "expected `pipeline: files:`"),
    ("---\npipeline: [\n---\n", "not valid YAML"),
])
def test_a_card_without_its_file_list_is_refused_naming_it(text, match):
    with pytest.raises(CheckpointError, match=match):
        parse_card(text, "models/policy/README.md")


def test_the_committed_checkpoint_loads_and_matches_its_card():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ROOT / "models" / "policy"
    card = read_card(path)
    assert verify(path) == [], "models/policy differs from the sha256 its card lists"
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == card["parameters"] and tok.chat_template
    assert card["recipe"] == yaml.safe_load((ROOT / "models" / "params.yaml").read_text())["policy"]


def test_verify_against_a_git_revision_reads_the_committed_card():
    tracked = subprocess.run(["git", "ls-files", "models/policy"], cwd=ROOT, capture_output=True, text=True).stdout
    if not tracked.strip():
        pytest.skip("models/policy is not committed in this checkout")
    done = subprocess.run([sys.executable, "-m", "pipeline.policy.checkpoint", "verify", "--against", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0 and "byte-identical to the card committed at HEAD" in done.stdout, done.stderr
