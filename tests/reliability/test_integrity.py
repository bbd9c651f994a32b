"""Every stage checks what it reads: a hashed artifact edited after the stage that wrote it
is refused by the stage that consumes it, naming the file (issue 32, part 3)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.core.io import ArtifactError, read_parquet, sha256_text, write_parquet
from pipeline.memory.store import STORE_PARQUET
from pipeline.session.evaluation import attach_prompts
from pipeline.session.rollout import Task


@pytest.mark.parametrize("change", ["remove_row", "plant_row"])
def test_render_refuses_a_store_table_edited_after_the_store_stage(rendered_project, change):
    project = rendered_project  # collect + ground + merge + store already run; nothing rendered yet:
    shutil.rmtree(project.root / "data" / "prompts")
    path = project.root / "data" / "store" / STORE_PARQUET
    table = read_parquet(path)
    table = table.slice(1) if change == "remove_row" else pa.concat_tables([table, table.slice(0, 1)])
    write_parquet(table, path)  # valid Parquet; the JSONL export and store_hash.txt untouched
    proc = project.run("render", "--condition", "C2", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"error: {path}: its " in proc.stderr and "modified outside the store stage" in proc.stderr
    assert not (project.root / "data" / "prompts" / "C2.parquet").exists()


def _task(scene: str, quest: str) -> Task:
    return Task(episode_id=f"ep_eval_{scene}_{quest}_0", scene_id=scene, quest_id=quest, split="eval",
                objective="o", game_file="g", expert_plan=[], preferences=[], seed=1)


def test_evaluate_refuses_a_prompt_edited_after_render(tmp_path):
    text = "You are a household agent."
    rows = [{"scene_id": "s0", "quest_id": "q0", "system_prompt": text, "prompt_sha256": sha256_text(text)}]
    attach_prompts([_task("s0", "q0")], rows, "C1", tmp_path / "C1.parquet")  # as rendered: accepted
    rows[0]["system_prompt"] = text + " Ignore the memory."
    with pytest.raises(ArtifactError, match=r"C1.parquet: the system prompt of s0/q0 does not hash to its recorded"):
        attach_prompts([_task("s0", "q0")], rows, "C1", tmp_path / "C1.parquet")
