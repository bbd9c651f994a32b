"""``SignatureBuilder.build``: the coarse query signature of seed 001 section 1.2.

The signature keeps only language, structure (negation / contrast / irony), the number
of game entities named, and a length bucket; the raw text is read, never kept::

    >>> sig = SignatureBuilder().build("Put Apple_2 in Fridge_0 but do not open Cabinet_0")
    >>> sig.language, sig.detected_structure, sig.contrast_marker, sig.num_aspects, sig.length_bucket
    ('en', ['negation', 'contrast'], 'but', 3, 'short')
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from pipeline.core.facts import SEED_ENTITY_NAME
from pipeline.memory.schemas import InputSignatureV1_1

SHORT_MAX = 50  # short: fewer than 50 characters
MEDIUM_MAX = 200  # medium: fewer than 200 characters; long otherwise


def entity_regex(pattern: str = SEED_ENTITY_NAME) -> re.Pattern:
    """The regex of a world's entity names in an objective (``FactReader.entity_pattern``;
    the seeds' ``Apple_2`` by default). Lookarounds instead of ``\\b`` because Korean particles
    attach directly ("Apple_2를") and ``\\w`` covers Hangul."""
    return re.compile(rf"(?<![A-Za-z0-9_])(?:{pattern})(?![0-9])")


# Game entities named like seed 004: Apple_2, Fridge_0, Key_1 (when no world says otherwise).
ENTITY_RE = entity_regex()

_HANGUL_RE = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7a3]")
_LATIN_RE = re.compile(r"[A-Za-z]")

# English patterns: whole words, case-insensitive. Longer alternatives first so that
# "no longer" is preferred to "no".
_EN_NEGATION = re.compile(
    r"\b(?:no longer|not|never|don't|dont|doesn't|didn't|isn't|aren't|wasn't|weren't|won't|"
    r"can't|cannot|couldn't|shouldn't|mustn't|nothing|nowhere|neither|nor|without|no)\b",
    re.IGNORECASE,
)
# Korean negation: 않 (-지 않다), 없 (없다), 못 (못 하다), 안 as its own word (안 열다), and the
# prohibitive -지 마(라/세요). "안" inside words (안방) is not a negation, hence the spaces.
_KO_NEGATION = re.compile(r"않|없|못|(?:^|\s)안(?=\s)|지\s?마(?:라|세요|시오|십시오)?(?=$|[\s.,!?])")

_EN_CONTRAST = re.compile(
    r"\b(?:on the other hand|nevertheless|nonetheless|however|although|even though|though|"
    r"whereas|instead|rather than|but|except)\b",
    re.IGNORECASE,
)
# Korean contrast: conjunctive adverbs and the connective ending -지만 (열었지만).
_KO_CONTRAST = re.compile(r"그렇지만|하지만|그러나|그런데|반면에|반면|대신에|대신|지만")

_EN_IRONY = re.compile(
    r"\b(?:yeah right|oh great|oh sure|as if|just what i needed|thanks a lot|how wonderful|"
    r"what a surprise|big surprise|obviously|so-called|sure thing)\b|/s\b|\blol\b",
    re.IGNORECASE,
)
_KO_IRONY = re.compile(r"퍽이나|참\s?잘|잘\s?한다|잘했네|잘\s?하는\s?짓|대단하네|대단하다\s?정말|고맙기도|역시나|그럼 그렇지|ㅋㅋ|ㅎㅎ")


def detect_language(text: str, entity_re: re.Pattern = ENTITY_RE) -> str:
    """``ko`` if Hangul letters outnumber Latin ones (entity names ignored), ``en`` if Latin, else ``other``."""
    rest = entity_re.sub(" ", text)
    hangul = len(_HANGUL_RE.findall(rest))
    latin = len(_LATIN_RE.findall(rest))
    if hangul and hangul >= latin:
        return "ko"
    if latin:
        return "en"
    if hangul:
        return "ko"
    return "other"


def count_entities(text: str, entities: Optional[Iterable[str]] = None, entity_re: re.Pattern = ENTITY_RE) -> int:
    """Distinct game entities named in ``text`` (case-insensitive).

    Args:
        text: The objective.
        entities: Known entity names of the scene (rooms included); when given, every one
            that occurs in the text counts, in addition to the names ``entity_re`` finds.
        entity_re: The world's entity names (:func:`entity_regex`; ``Name_N`` by default).
    """
    found = {m.lower() for m in entity_re.findall(text)}
    if entities:
        low = text.lower()
        for name in entities:
            n = str(name).lower()
            if n and re.search(r"(?<![a-z0-9_])" + re.escape(n) + r"(?![a-z0-9_])", low):
                found.add(n)
    return len(found)


def length_bucket(text: str) -> str:
    """``short`` (< 50 characters), ``medium`` (< 200) or ``long``, on the text as given."""
    n = len(text)
    if n < SHORT_MAX:
        return "short"
    if n < MEDIUM_MAX:
        return "medium"
    return "long"


def _first(patterns: Iterable[re.Pattern], text: str) -> Optional[re.Match]:
    best = None
    for p in patterns:
        m = p.search(text)
        if m and (best is None or m.start() < best.start()):
            best = m
    return best


class SignatureBuilder:
    """Builds :class:`InputSignatureV1_1` from a text by patterns (English and Korean).

    Patterns of both languages are always tried: objectives mix Latin entity names with
    Korean sentences, and a Korean marker in a mostly-Latin text still marks structure.

    Args:
        entity_pattern: The world's entity names (its ``FactReader.entity_pattern``); None:
            the seeds' ``Name_N`` (``Apple_2``).
    """

    def __init__(self, entity_pattern: Optional[str] = None) -> None:
        self.entity_re = ENTITY_RE if entity_pattern is None else entity_regex(entity_pattern)

    def build(
        self,
        raw_text: str,
        language: Optional[str] = None,
        num_aspects: Optional[int] = None,
        *,
        entities: Optional[Iterable[str]] = None,
    ) -> InputSignatureV1_1:
        """Signature of ``raw_text``; the text itself is not kept.

        Args:
            raw_text: The query text (here: the task's objective).
            language: ``ko`` | ``en`` | ``other``; detected from the script when None.
            num_aspects: Number of aspects; when None, the distinct game entities named.
            entities: Known entity names used when counting aspects.

        Returns:
            The validated signature.
        """
        if not isinstance(raw_text, str):
            raise TypeError(f"SignatureBuilder.build: raw_text must be str, got {type(raw_text).__name__}")
        lang = language if language is not None else detect_language(raw_text, self.entity_re)
        neg = _first((_EN_NEGATION, _KO_NEGATION), raw_text)
        contrast = _first((_EN_CONTRAST, _KO_CONTRAST), raw_text)
        irony = _first((_EN_IRONY, _KO_IRONY), raw_text)
        structure = [name for name, m in (("negation", neg), ("contrast", contrast), ("irony", irony)) if m]
        marker = contrast.group(0).strip().lower()[:32] if contrast else None
        return InputSignatureV1_1(
            language=lang,
            detected_structure=structure or ["none"],
            contrast_marker=marker,
            has_negation=neg is not None,
            num_aspects=count_entities(raw_text, entities, self.entity_re) if num_aspects is None else num_aspects,
            length_bucket=length_bucket(raw_text),
        )
