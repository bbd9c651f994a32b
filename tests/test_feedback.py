"""Feedback lines (seed 000): parse, format, classify, unknown types."""

from __future__ import annotations

import logging

import pytest

from pipeline.grounding.feedback import (
    FeedbackFormatError,
    UnknownFeedbackType,
    classify_feedback_lines,
    format_feedback_line,
    parse_feedback_line,
)
from pipeline.core.schemas import FEEDBACK_TYPES


@pytest.mark.parametrize(
    "line, expected",
    [
        ("feedback : spatial: kitchen is green", ("spatial", "kitchen is green")),
        ("Feedback:Spatial:kitchen is green", ("spatial", "kitchen is green")),
        ("  FEEDBACK  :  User Preference :  Close containers after use.  ",
         ("user_preference", "Close containers after use.")),
        ("feedback : user-preference: tidy", ("user_preference", "tidy")),
        ("feedback : procedural: Open Cabinet_0 first: then take.", ("procedural", "Open Cabinet_0 first: then take.")),
        ("feedback : general: 부엌은 초록색이다", ("general", "부엌은 초록색이다")),
        ("feedback：spatial：厨房是绿色的", ("spatial", "厨房是绿色的")),
    ],
)
def test_parse_tolerant_prefix_and_type(line, expected):
    assert parse_feedback_line(line) == expected


@pytest.mark.parametrize("line", ["spatial: kitchen is green", "feedback : spatial", "feedback : spatial:   ",
                                  "feedback :: text", "", "feedbacks : spatial: x"])
def test_parse_malformed_names_the_line(line):
    with pytest.raises(FeedbackFormatError) as err:
        parse_feedback_line(line)
    assert repr(line) in str(err.value)


def test_unknown_type_reject_and_keep(caplog):
    line = "feedback : colour: kitchen is green"
    with pytest.raises(UnknownFeedbackType, match="colour"):
        parse_feedback_line(line, unknown="reject")
    with caplog.at_level(logging.WARNING, logger="pipeline.grounding.feedback"):
        assert parse_feedback_line(line, unknown="keep") == ("general", "colour: kitchen is green")
    assert repr(line) in caplog.text
    with pytest.raises(ValueError, match="grounding.unknown_type"):
        parse_feedback_line(line, unknown="ignore")


def test_format_roundtrip_and_errors():
    for t in FEEDBACK_TYPES:
        line = format_feedback_line(t, "Key_1 is on\nTable_0  in the Kitchen.")
        assert line == f"feedback : {t}: Key_1 is on Table_0 in the Kitchen."
        assert parse_feedback_line(line) == (t, "Key_1 is on Table_0 in the Kitchen.")
    with pytest.raises(ValueError, match="colour"):
        format_feedback_line("colour", "x")
    with pytest.raises(ValueError, match="empty"):
        format_feedback_line("general", "  ")


def test_classify_joins_by_type_and_handles_unknown():
    lines = ["feedback : spatial: a", "", "feedback : general: g", "feedback : Spatial: b", "feedback : mood: happy"]
    out = classify_feedback_lines(lines)
    assert list(out) == list(FEEDBACK_TYPES)
    assert out == {"user_preference": None, "spatial": "a; b", "procedural": None, "general": "g; mood: happy"}
    with pytest.raises(UnknownFeedbackType):
        classify_feedback_lines(lines, unknown="reject")
    with pytest.raises(FeedbackFormatError, match="turns.jsonl:4"):
        classify_feedback_lines(["not feedback"], where="turns.jsonl:4")
    assert classify_feedback_lines([]) == {t: None for t in FEEDBACK_TYPES}
