"""Grounding knowledge from typed user feedback (seed 000): capture, generation, files, merging.

One episode's life cycle, as in seed 000 ("Step별 피드백 수집" -> "에피소드 종료 시")::

    >>> gfm = GroundingFileManager(1)
    >>> _ = gfm.append_step_feedback(1, "go east", "Success", {"spatial": "kitchen is green"})
    >>> gfm.get_stacked_grounding()["spatial"]
    ['[ Step1 - Success ] : kitchen is green']
    >>> final = generate_final_grounding(gfm.get_stacked_grounding(), timestamp="2026-01-27T00:00:00+00:00")
    >>> final["spatial_grounding"]
    {'content': 'kitchen is green.'}
    >>> _ = gfm.save_final_grounding(final)   # with out_dir=...: writes the episode files

Merging many files for a system prompt (seed 000 "여러 파일 병합 기능")::

    merged = merge_grounding_json_files("a.json,b.json")        # or ["a.json", "b.json"]
    text = render_grounding_to_markdown(merged)                   # H3 -> H4, "- c1\\n\\n- c2"
    content = merge_grounding_files(["a.json", "notes.txt"]).content   # JSON Markdown + TXT text

File layout written by :func:`write_grounding_files` (no wall-clock time in any name, so
reruns give the same paths and bytes)::

    <out>/episode_<id>/grounding_episode_<id>.json   expr_info, grounding_per_step,
    <out>/episode_<id>/grounding_episode_<id>.txt    stacked_grounding, final_grounding / Markdown
    <out>/grounding_latest.{json,txt}                the newest episode (seed: grounding/grounding_latest.*)

Modules: :mod:`~pipeline.grounding.common` (keys, formats, errors),
:mod:`~pipeline.grounding.feedback` (``feedback : <type>: <text>`` lines),
:mod:`~pipeline.grounding.capture` (step feedback, :class:`GroundingFileManager`),
:mod:`~pipeline.grounding.generate` (extractive and llm ``final_grounding``),
:mod:`~pipeline.grounding.merge` (merging files, Markdown) and
:mod:`~pipeline.grounding.files` (writing an episode's files).
"""

from pipeline.grounding.capture import GroundingFileManager, feedback_from_lines, validate_final_grounding
from pipeline.grounding.common import (
    CONFIGURED_NAME,
    CONTENT_JOINER,
    FINAL_KEYS,
    SAFE_NAME_RE,
    SECTION_TITLES,
    TEXT_JOINER,
    GroundingError,
    GroundingMergeError,
    empty_stacked,
    stacked_entry,
    strip_step_prefix,
)
from pipeline.grounding.files import (
    episode_dir_name,
    episode_file_stem,
    replace_dir,
    write_grounding_files,
    write_latest_files,
)
from pipeline.grounding.generate import (
    empty_final_grounding,
    extract_statements,
    extractive_final_grounding,
    generate_final_grounding,
    generate_grounding,
    grounding_timestamp,
    llm_grounding_prompt,
    parse_llm_grounding,
)
from pipeline.grounding.merge import (
    MergedGrounding,
    escapes_root,
    grounding_content,
    merge_grounding_docs,
    merge_grounding_files,
    merge_grounding_json_files,
    render_episode_text,
    render_grounding_to_markdown,
    scene_grounding_content,
    shift_markdown_headers,
    split_grounding_paths,
)

__all__ = [
    "CONFIGURED_NAME", "CONTENT_JOINER", "FINAL_KEYS", "GroundingError", "GroundingFileManager",
    "GroundingMergeError", "MergedGrounding", "SAFE_NAME_RE", "SECTION_TITLES", "TEXT_JOINER",
    "empty_final_grounding", "empty_stacked", "episode_dir_name", "episode_file_stem",
    "escapes_root", "extract_statements", "extractive_final_grounding", "feedback_from_lines",
    "generate_final_grounding", "generate_grounding", "grounding_content", "grounding_timestamp",
    "llm_grounding_prompt", "merge_grounding_docs", "merge_grounding_files", "merge_grounding_json_files",
    "parse_llm_grounding", "render_episode_text", "render_grounding_to_markdown", "replace_dir",
    "scene_grounding_content", "shift_markdown_headers", "split_grounding_paths", "stacked_entry",
    "strip_step_prefix", "validate_final_grounding", "write_grounding_files", "write_latest_files",
]
