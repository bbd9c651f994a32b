"""SignatureBuilder.build (seed 001 section 1.2): language, structure, aspects, length buckets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pipeline.memory import InputSignatureV1_1, SignatureBuilder

B = SignatureBuilder()


@pytest.mark.parametrize(
    "text, structure, marker, negation",
    [
        ("Put Apple_2 in Fridge_0 and close it", ["none"], None, False),
        ("Do not open Cabinet_0", ["negation"], None, True),
        ("Never leave Fridge_0 open", ["negation"], None, True),
        ("Don't take Key_1", ["negation"], None, True),
        ("Apple_2 is no longer in Drawer_1", ["negation"], None, True),
        ("Open Drawer_1 but leave Cabinet_0 closed", ["contrast"], "but", False),
        ("Take Mug_0; however, close Fridge_0", ["contrast"], "however", False),
        ("Although Drawer_1 is locked, open it", ["contrast"], "although", False),
        ("Oh great, Fridge_0 is locked again", ["irony"], None, False),
        ("Yeah right, as if Key_1 opens Cabinet_0", ["irony"], None, False),
        ("Put Apple_2 in Fridge_0 but do not close it", ["negation", "contrast"], "but", True),
    ],
)
def test_english_structures(text, structure, marker, negation):
    sig = B.build(text)
    assert sig.language == "en"
    assert sig.detected_structure == structure
    assert sig.contrast_marker == marker
    assert sig.has_negation is negation


@pytest.mark.parametrize(
    "text, structure, marker, negation",
    [
        ("Apple_2를 Fridge_0에 넣고 닫으세요", ["none"], None, False),
        ("Cabinet_0을 열지 않았다", ["negation"], None, True),
        ("냉장고를 안 열었다", ["negation"], None, True),
        ("서랍을 못 열었다", ["negation"], None, True),
        ("열쇠가 없다", ["negation"], None, True),
        ("Key_1을 가져가지 마세요", ["negation"], None, True),
        ("Apple_2를 넣어라. 하지만 Fridge_0은 닫아라", ["contrast"], "하지만", False),
        ("그러나 Drawer_1은 잠겨 있다", ["contrast"], "그러나", False),
        ("Drawer_1을 열었지만 비어 있었다", ["contrast"], "지만", False),
        ("퍽이나 잘 열리겠다 Cabinet_0", ["irony"], None, False),
        ("또 잠겼네 ㅋㅋ 정말 대단하네", ["irony"], None, False),
        ("Fridge_0을 열었지만 Apple_2는 없었다", ["negation", "contrast"], "지만", True),
    ],
)
def test_korean_structures(text, structure, marker, negation):
    sig = B.build(text)
    assert sig.language == "ko"
    assert sig.detected_structure == structure
    assert sig.contrast_marker == marker
    assert sig.has_negation is negation


def test_korean_word_containing_an_is_not_negation():
    assert B.build("안방에 있는 Lamp_0을 켜라").detected_structure == ["none"]


@pytest.mark.parametrize(
    "text, lang",
    [
        ("Put Apple_2 in Fridge_0", "en"),
        ("Apple_2를 Fridge_0에 넣어라", "ko"),  # entity names are Latin; the sentence is Korean
        ("把苹果放进冰箱", "other"),
        ("1234 !!", "other"),
        ("", "other"),
    ],
)
def test_language_detection(text, lang):
    assert B.build(text).language == lang


def test_given_language_wins():
    assert B.build("Put Apple_2 in Fridge_0", language="ko").language == "ko"


def test_num_aspects_counts_distinct_entities():
    assert B.build("Take Apple_2, then put apple_2 in Fridge_0").num_aspects == 2
    assert B.build("Apple_2를 Fridge_0에 넣고 Drawer_1을 닫아라").num_aspects == 3
    assert B.build("Go somewhere").num_aspects == 0
    assert B.build("Go to the Kitchen", entities=["Kitchen", "Bedroom"]).num_aspects == 1
    assert B.build("Take Apple_2", num_aspects=7).num_aspects == 7


@pytest.mark.parametrize("n, bucket", [(49, "short"), (50, "medium"), (199, "medium"), (200, "long")])
@pytest.mark.parametrize("unit", ["a", "가"])
def test_length_bucket_boundaries(n, bucket, unit):
    text = unit * n  # characters, not bytes: a Hangul syllable is one character
    assert len(text) == n
    assert B.build(text).length_bucket == bucket


def test_raw_text_is_not_stored():
    text = "Put Apple_2 in Fridge_0 but do not close it"
    sig = B.build(text)
    assert text not in sig.model_dump_json()
    assert set(sig.model_dump()) == {"language", "detected_structure", "contrast_marker", "has_negation",
                                     "num_aspects", "length_bucket"}
    with pytest.raises(ValidationError, match="raw_text"):
        InputSignatureV1_1(**sig.model_dump(), raw_text=text)


@pytest.mark.parametrize(
    "field, value",
    [("language", "fr"), ("detected_structure", ["sarcasm"]), ("detected_structure", []),
     ("detected_structure", ["none", "negation"]), ("num_aspects", -1), ("length_bucket", "huge")],
)
def test_signature_bounds_name_the_field(field, value):
    good = B.build("Take Apple_2").model_dump()
    with pytest.raises(ValidationError, match=field):
        InputSignatureV1_1(**{**good, field: value})


def test_non_string_input_is_a_clear_error():
    with pytest.raises(TypeError, match="raw_text must be str"):
        B.build(None)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_any_text_gives_a_valid_signature(text):
    sig = B.build(text)
    assert sig.length_bucket == ("short" if len(text) < 50 else "medium" if len(text) < 200 else "long")
    assert sig.detected_structure == ["none"] or "none" not in sig.detected_structure
