"""``AdvisoryBuilder``: retrieved store entries -> ``AdvisoryV1_1`` (seed 001 section 2.3).

An advisory states a principle learned from a past case, never the answer to the task
at hand. The type follows the past case's outcome:

=========================  ===============================================
successful_override        corrected by feedback, then succeeded
failed_override_warning    corrected but still failed (or failed anyway): a warning
consistency_anchor         succeeded without correction
=========================  ===============================================

A message carries, after the principle and the past case, the facts that case saw of its
scene (:func:`pipeline.memory.scene.scene_facts`: where objects and keys were, locked
containers and their keys, routes, containers found empty), stated as facts of that
scene, never as commands; as many whole facts as fit in the message bound.

Every message is checked for label hints (the query task's ground truth, or a run of
its expert commands) and dropped with a warning when one is found::

    builder = AdvisoryBuilder(max_message_chars=800)
    advisories, warnings = builder.build_many(hits, query_expert_plan=plan)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from pipeline.memory.schemas import (
    MAX_MESSAGE_CHARS,
    AdvisoryV1_1,
    EpisodicMemoryEntryV1_1,
    EvidenceV1_1,
)
from pipeline.core.facts import WorldWords
from pipeline.memory.knowledge import (HABITS_LEAD, HOUSE_LEAD, LESSONS_LEAD, StoreKnowledge, entry_facts,
                                       relevant_first)
from pipeline.memory.scene import clip, join_facts, split_scene_facts, whole_words

# Principle stated for each kind of failure (first tag found wins the principle_id).
PRINCIPLES = {
    "invalid_action": "Only choose actions that are admissible now; satisfy their preconditions (reach, open, unlock) first.",
    "examine_loop": "Do not examine the same thing again once it has told you what it holds.",
    "repeated_action": "Do not repeat an action that changed nothing; try a different one.",
    "failed_step": "When a step fails, change the plan instead of retrying it unchanged.",
    "goal_not_reached": "Move toward the goal; stop exploring once what you need is found.",
    "feedback_procedural": "Respect the order of steps: open before taking or putting, unlock before opening.",
    "feedback_spatial": "Use what is known about where things are before searching elsewhere.",
    "feedback_user_preference": WorldWords().preference_principle,  # a world's own: AdvisoryBuilder(words=)
    "feedback_general": "Act on the user's feedback as soon as it is given.",
    "no_progress": "When steps stop making progress, change the approach instead of searching on.",
}
DEFAULT_PRINCIPLE = ("direct_plan", "Keep to a short, direct plan toward the goal.")
MAX_PRINCIPLES = 2
# The past case's own text keeps at least this many characters when scene facts follow it.
MIN_CASE_CHARS_WITH_FACTS = 160
# How the scene facts are introduced: a won case's facts held on its way to the goal; a
# failed case's are what it observed.
FACTS_LEAD = {
    "successful_override": "Facts of that case's scene",
    "consistency_anchor": "Facts of that case's scene",
    "failed_override_warning": "Observed in that case's scene",
}


@dataclass
class Recall:
    """What the memory recalls for one query beyond each retrieved entry's own episode.

    With ``house``, an advisory from an entry of the house the agent is in states what
    *all* past visits of that house saw (:meth:`StoreKnowledge.house_facts`), and one from
    another house states none of that house's facts (they do not hold here); with
    ``lessons``, advisories go on with the placement lessons across houses
    (:meth:`StoreKnowledge.lessons`) and, in a house never visited (whose user the grounding
    has not heard), the habits of the other houses' users. What one advisory of a bundle stated, the next
    does not repeat (``stated``). Facts and lessons naming the objective's things (or their
    kinds) come first.

    ``unrelated``: the recall of a block built from other houses' entries, the same form
    with nothing this task can use: an entry's own (other) house stated as "this house", lessons only about kinds the
    objective does not name and that open nothing, no habits.

    Attributes:
        knowledge: the store's knowledge (:class:`~pipeline.memory.knowledge.StoreKnowledge`).
        scene: the house the agent is in (the query's scene id).
        words: the objective's names and their kinds (what "naming the task's things" means).
        house: state a house's facts over all its visits (``memory.facts=house``).
        lessons: state the lessons across houses (``memory.lessons``).
        unrelated: the recall of a block from other houses' entries (see above).
    """

    knowledge: StoreKnowledge
    scene: Optional[str]
    words: Sequence[str] = ()
    house: bool = True
    lessons: bool = True
    unrelated: bool = False
    stated: set[str] = field(default_factory=set)

    def items(self, entry: Mapping[str, Any]) -> list[tuple[str, str]]:
        """``(lead, item)`` pairs this entry's advisory may state, in order, none stated before."""
        scene = str((entry.get("provenance") or {}).get("scene_id") or "")
        out: list[tuple[str, str]] = []
        know = self.knowledge
        if self.house and (scene == self.scene or self.unrelated):
            n = know.visits.get(scene, 0)
            lead = HOUSE_LEAD.format(n=n, s="" if n == 1 else "s")
            facts = know.house_facts(scene)
            out += [(lead, f) for f in (facts if self.unrelated else relevant_first(facts, self.words))]
        elif not self.house:
            out += [("", f) for f in entry_facts(entry)]
        if self.lessons:
            exclude = self.scene if self.unrelated else None
            houses = len(know.houses(exclude))
            if not self.unrelated and not know.visits.get(str(self.scene)):
                # a house visited before has its own user's word (the grounding): habits are for a new one
                out += [(HABITS_LEAD, f"{text} ({n} of {total} houses)") for text, n, total in know.habits()]
            lessons = know.lessons(exclude)
            if self.unrelated:
                named = {w.lower() for w in self.words}
                lessons = [l for l in lessons if l.thing.lower() not in named and l.holder.lower() not in named
                           and l.thing not in know.unlocking_kinds()]
                texts = [l.text() for l in lessons]
            else:
                texts = relevant_first([l.text() for l in lessons], self.words)
            lead = LESSONS_LEAD.format(n=houses, s="" if houses == 1 else "s")
            out += [(lead, t) for t in texts]
        return [(lead, item) for lead, item in out if item not in self.stated]


def advisory_type_for(entry: dict[str, Any]) -> str:
    """The advisory type of a stored case (see the module docstring)."""
    won = bool(entry["evaluation"]["won"])
    corrected = bool(entry["correction"]["corrected"])
    if won and corrected:
        return "successful_override"
    if won:
        return "consistency_anchor"
    return "failed_override_warning"


def principles_for(entry: dict[str, Any], words: WorldWords | None = None) -> tuple[str, list[str]]:
    """``(principle_id, principle sentences)`` for the entry's risk tags (``words``: the
    world's own wording of the preference principle; None: the neutral one)."""
    principles = PRINCIPLES if words is None else {**PRINCIPLES, "feedback_user_preference": words.preference_principle}
    tags = list(entry["case_summary"].get("risk_tags") or [])
    found = [t for t in PRINCIPLES if t in tags]
    if "examine_loop" in found and "repeated_action" in found:
        found.remove("repeated_action")
    if not found:
        return "pr_" + DEFAULT_PRINCIPLE[0], [DEFAULT_PRINCIPLE[1]]
    return "pr_" + found[0], [principles[t] for t in found[:MAX_PRINCIPLES]]


def _tail(items: Sequence[tuple[str, str]], room: int) -> tuple[str, list[str]]:
    """`` Lead: a; b. Other lead: c.``: as many whole items as fit in ``room`` characters (grouped by lead)."""
    tail, used, lead_now = "", [], None
    for lead, item in items:
        if lead != lead_now:
            piece = (". " if used else " ") + (f"{lead}: " if lead else "") + item
        else:
            piece = "; " + item
        if len(tail) + len(piece) + 1 > room:  # 1: the final "."
            break
        tail += piece
        used.append(item)
        lead_now = lead
    return (tail + "." if used else ""), used


def compose_recalled(entry: dict[str, Any], advisory_type: str, recall: Recall, max_chars: int = MAX_MESSAGE_CHARS,
                     words: WorldWords | None = None) -> str:
    """The advisory text under a :class:`Recall`: the principle, the past case (at least
    :data:`MIN_CASE_CHARS_WITH_FACTS` of it when more follows), then what the recall states
    (house facts, habits, lessons; whole items within ``max_chars``). Marks what it stated."""
    _, principles = principles_for(entry, words)
    cs = entry["case_summary"]
    rationale, _ = split_scene_facts(cs["rationale_summary"])
    head, case = _head_case(advisory_type, " ".join(principles), cs["symptom"], rationale)
    items = recall.items(entry)
    if not items:
        return clip(f"{head} {case}", max_chars)
    room = max_chars - len(head) - 1 - min(len(case), MIN_CASE_CHARS_WITH_FACTS)
    tail, used = _tail(items, room)
    if not used:
        return clip(f"{head} {case}", max_chars)
    recall.stated.update(used)
    return f"{head} {clip(case, max_chars - len(head) - 1 - len(tail))}{tail}"


def _head_case(advisory_type: str, principle: str, symptom: str, rationale: str) -> tuple[str, str]:
    if advisory_type == "successful_override":
        return f"Principle: {principle}", f"A similar past case went wrong ({symptom}) and was fixed: {rationale}."
    if advisory_type == "failed_override_warning":
        return (f"Warning: {principle}",
                f"A similar past case failed ({symptom}); {rationale}. Do not repeat that pattern.")
    return f"Principle: {principle}", f"A similar past case succeeded this way: {rationale}."


def compose_message(entry: dict[str, Any], advisory_type: str, max_chars: int = MAX_MESSAGE_CHARS,
                    words: WorldWords | None = None) -> str:
    """The advisory text, at most ``max_chars``: principle first, then the past case as
    support, then the facts of its scene (whole facts, in the stored order).

    The facts take the room the case text does not need down to
    :data:`MIN_CASE_CHARS_WITH_FACTS`; the case text is clipped at a word boundary to
    what is left. Without facts (or when none fits) the message is the principle and the
    case, clipped to ``max_chars``.
    """
    _, principles = principles_for(entry, words)
    cs = entry["case_summary"]
    principle = " ".join(principles)
    symptom = cs["symptom"]
    rationale, facts = split_scene_facts(cs["rationale_summary"])
    head, case = _head_case(advisory_type, principle, symptom, rationale)
    text = f"{head} {case}"
    if not facts:
        return clip(text, max_chars)
    scene = str((entry.get("provenance") or {}).get("scene_id") or "")
    lead = f" {FACTS_LEAD[advisory_type]}{f' ({scene})' if scene else ''}: "
    room = max_chars - len(head) - 1 - len(lead) - 1  # 1: the space after head, 1: the final "."
    listed = join_facts(facts, room - min(len(case), MIN_CASE_CHARS_WITH_FACTS))
    if not listed:
        return clip(text, max_chars)
    tail = f"{lead}{listed}."
    # At least min(len(case), MIN_CASE_CHARS_WITH_FACTS) characters are left for the case.
    return f"{head} {clip(case, max_chars - len(head) - 1 - len(tail))}{tail}"


def _norm(text: str) -> str:
    return " ".join(text.lower().split())  # whitespace runs to one space (re.sub's \s+, several times faster)


def _contains(haystack: str, needle: str) -> bool:
    """``needle`` in ``haystack`` as a whole phrase (both lower case, :func:`_norm`)."""
    # a plain substring test first: most commands are not in most messages, and the regex costs far more
    return needle in haystack and whole_words((needle,)).search(haystack) is not None


def plan_object_commands(expert_plan: Sequence[str]) -> list[str]:
    """The distinct object commands of an expert plan, normalised (lower case, single
    spaces): single-word commands and navigation (``go west``) are left out."""
    commands: list[str] = []
    for c in expert_plan:
        c = _norm(str(c))
        if " " in c and not c.startswith("go ") and c not in commands:
            commands.append(c)
    return commands


def named_plan_commands(text: str, expert_plan: Sequence[str]) -> list[str]:
    """The object commands of ``expert_plan`` (:func:`plan_object_commands`) that ``text``
    names as whole phrases, case-insensitively, in plan order."""
    msg = _norm(text)
    return [c for c in plan_object_commands(expert_plan) if _contains(msg, c)]


def task_answer(task: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """``(expert_plan, ground_truth)`` of a query task: what the label-hint rule compares
    a text with (the advisories here, the gate in :mod:`pipeline.memory.injection`, the
    prompts' grounding and memory block in :mod:`pipeline.conditions.hints`).

    The plan is the manifest row's ``expert_plan`` (the planner's plan,
    :func:`pipeline.envs.household.planner.shortest_plan`, computed by the games stage),
    else its episode's ``ground_truth`` (the plan's commands joined by ``;``) split at
    ``;``. Nothing is planned here.

    Args:
        task: A manifest row (``expert_plan``, optionally ``ground_truth``).
    """
    plan = task.get("expert_plan")
    gt = task.get("ground_truth")
    if plan is None and gt:
        plan = [c.strip() for c in str(gt).split(";")]
    return [str(c) for c in (plan or [])], (str(gt) if gt else None)


def find_label_hints(
    message: str,
    *,
    ground_truth: Optional[str] = None,
    expert_plan: Sequence[str] = (),
    min_commands: int = 2,
) -> list[str]:
    """Label hints in ``message``: what it gives away of the query task's answer.

    A hint is the task's ground truth verbatim, or at least ``min(min_commands, n)`` of the
    ``n`` distinct object commands of its expert plan (whole-phrase, case-insensitive).
    Single-word commands (``look``, ``inventory``) and navigation (``go west``) are not
    counted: they describe the scene's map, which memory of a scene legitimately carries
    ("From the Kitchen, go north to reach the Bathroom"), not the task's answer.

    Returns:
        Descriptions of the hints found (empty: clean).
    """
    msg = _norm(message)
    hints = []
    gt = _norm(ground_truth or "")
    if gt and _contains(msg, gt):
        hints.append(f"ground truth {ground_truth!r}")
    commands = plan_object_commands(expert_plan)
    if commands:
        found = named_plan_commands(message, expert_plan)
        if found and len(found) >= min(min_commands, len(commands)):
            hints.append("expert command(s) " + ", ".join(repr(c) for c in found))
    return hints


#: Between advisories read together: no phrase runs across it (the injected block puts each
#: advisory's other fields between two messages, ``- advisory_type: ...``).
BUNDLE_SEPARATOR = "\n|\n"


def bundle_label_hints(
    messages: Sequence[str],
    *,
    ground_truth: Optional[str] = None,
    expert_plan: Sequence[str] = (),
    min_commands: int = 2,
) -> list[str]:
    """Label hints in advisories read together, as the model reads a memory block:
    :func:`find_label_hints` over all of ``messages``. Two advisories that each name one of
    a plan's object commands name two together, which is a hint at ``min_commands=2``
    though neither is one alone (the run of issue 42 had 5 such blocks of 204 and a later
    one 9). A message's own hint is one of the bundle's, so this check holds the
    per-message one."""
    return find_label_hints(BUNDLE_SEPARATOR.join(messages), ground_truth=ground_truth, expert_plan=expert_plan,
                            min_commands=min_commands)


def strength_for(advisory_type: str, relevance: float) -> str:
    """weak / moderate / strong from relevance; a failed case is at most moderate evidence."""
    level = "strong" if relevance >= 2 / 3 else "moderate" if relevance >= 1 / 3 else "weak"
    if advisory_type == "failed_override_warning" and level == "strong":
        level = "moderate"
    return level


class AdvisoryBuilder:
    """Turns retrieved entries into advisories with ids ``adv_000001``, ``adv_000002``, ...

    Args:
        max_message_chars: Message bound (at most 800, the schema's).
        label_hint_min_commands: Expert commands that make a message a label hint.
        start_id: First advisory number.
        words: The world's words (:func:`pipeline.envs.world_words`); None: world-neutral.
    """

    def __init__(self, max_message_chars: int = MAX_MESSAGE_CHARS, label_hint_min_commands: int = 2, start_id: int = 1,
                 words: WorldWords | None = None):
        if not 1 <= max_message_chars <= MAX_MESSAGE_CHARS:
            raise ValueError(f"memory.max_message_chars={max_message_chars}: expected 1..{MAX_MESSAGE_CHARS}")
        if label_hint_min_commands < 1:
            raise ValueError(f"memory.label_hint_min_commands={label_hint_min_commands}: expected >= 1")
        self.max_message_chars = max_message_chars
        self.label_hint_min_commands = label_hint_min_commands
        self.words = words
        self._next = start_id

    def _new_id(self) -> str:
        adv_id = f"adv_{self._next:06d}"
        self._next += 1
        return adv_id

    def build(self, entry: EpisodicMemoryEntryV1_1 | dict[str, Any], relevance: float,
              recall: Recall | None = None) -> AdvisoryV1_1:
        """One advisory from one entry (no label-hint check; see :meth:`build_many`); with a
        ``recall``, its message states what the recall adds (:func:`compose_recalled`)."""
        e = entry.model_dump() if isinstance(entry, EpisodicMemoryEntryV1_1) else entry
        adv_type = advisory_type_for(e)
        principle_id, _ = principles_for(e, self.words)
        relevance = min(1.0, max(0.0, float(relevance)))
        message = (compose_message(e, adv_type, self.max_message_chars, self.words) if recall is None
                   else compose_recalled(e, adv_type, recall, self.max_message_chars, self.words))
        return AdvisoryV1_1(
            advisory_id=self._new_id(),
            advisory_type=adv_type,
            message=message,
            strength=strength_for(adv_type, relevance),
            relevance_score=relevance,
            evidence=EvidenceV1_1(
                source_episode_ids=[e["provenance"]["episode_id"]],
                risk_tags=list(e["case_summary"].get("risk_tags") or []),
                principle_id=principle_id,
            ),
        )

    def build_many(
        self,
        hits: Iterable[Any],
        *,
        query_expert_plan: Sequence[str] = (),
        query_ground_truth: Optional[str] = None,
        recall: Recall | None = None,
    ) -> tuple[list[AdvisoryV1_1], list[str]]:
        """Advisories for retrieval hits (``RetrievalHit`` or ``(entry, relevance)``), label hints dropped.

        The hits are taken in order (most relevant first) and an advisory is dropped when it
        names the query task's answer alone, or together with the advisories kept before it
        (:func:`bundle_label_hints`): the advisories returned never name it, read together.
        ``recall``: what the memory states beyond each entry's episode (:class:`Recall`),
        shared by the hits in order so that no advisory repeats an earlier one.

        Returns:
            ``(advisories, warnings)``; a warning names each dropped advisory (not its hint).
        """
        advisories, warnings = [], []
        for hit in hits:
            entry, relevance = (hit.entry, hit.relevance) if hasattr(hit, "entry") else hit
            adv = self.build(entry, relevance, recall)
            answer = {"ground_truth": query_ground_truth, "expert_plan": query_expert_plan,
                      "min_commands": self.label_hint_min_commands}
            if bundle_label_hints([a.message for a in advisories] + [adv.message], **answer):
                # The hint itself is not repeated: warnings are shown to the model with the bundle.
                alone = find_label_hints(adv.message, **answer)  # only to word the warning
                source = adv.evidence.source_episode_ids[0]
                warnings.append(f"label_hint: {adv.advisory_id} from {source} dropped"
                                + ("" if alone else " (with the advisories before it)"))
                continue
            advisories.append(adv)
        return advisories, warnings
