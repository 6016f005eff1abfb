"""Reflection rules: when a decision is settled or expired, whether it was right, what a
reflection says without an LLM, and which past lessons go into a new prompt.

This is the pure half of deferred reflection (the pattern of TradingAgents' memory log,
made event-sourced). The reflector in :mod:`memstream.streams.reflector` keeps state
and talks to Kafka and the LLM; every *decision* it makes is a function here, so the
rules are unit-testable without a broker, a clock or a network. Nothing here reads the
wall clock: every function that needs "now" takes it as an argument.

The rules fix the anchor's known faults:

* an outcome settles a decision only when it covers the decision's whole horizon
  (:func:`match_outcome`): a 5-trading-day call is never judged on 1 day of data;
* an outcome is matched to decisions of the same memory space (team and user) and
  subject, so every pending subject can be resolved and no tenant's outcome settles
  another tenant's decision;
* a decision with no outcome by its deadline expires (:func:`expiry_due`); nothing
  stays pending forever.

Identity is deterministic (:func:`reflection_id_for`, :func:`reflection_event_id`,
:func:`expiry_event_id`, :func:`provider_outcome_id`): a reflection or expiry emitted
twice (a retry after a crash) carries the same ids, so every reader can drop the copy.

Token estimate (:func:`estimate_tokens`): ``ceil(ascii_chars / 4) + non_ascii_chars``.
Four characters per token is the usual figure for English with OpenAI's BPE
vocabularies; scripts outside ASCII (CJK, emoji, accented words split into pieces)
take about one token per character or more, so they count one each. The estimate errs
high, which is the safe side for a budget.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from memstream.domain.events import DecisionRecorded, OutcomeObserved, Rating, Scope
from memstream.domain.repair import JSONRepairError, repair_json

__all__ = [
    "HOLD_BAND",
    "SUBJECT_WINDOW_SLACK_DAYS",
    "SAME_SUBJECT_LIMIT",
    "OTHER_SUBJECT_LIMIT",
    "DECISION_SNIPPET_CHARS",
    "RatingParseError",
    "parse_rating",
    "rating_direction",
    "decision_key",
    "subject_key",
    "reflection_id_for",
    "reflection_event_id",
    "expiry_event_id",
    "provider_outcome_id",
    "provider_outcome_event_id",
    "OutcomeMatch",
    "covers_horizon",
    "match_outcome",
    "expiry_due",
    "performance",
    "direction_correct",
    "TemplatedReflection",
    "templated_reflection",
    "ParsedReflection",
    "ReflectionTextError",
    "parse_reflection_text",
    "REFLECTION_ANSWER_SCHEMA",
    "parse_reflection_answer",
    "reflection_prompt_fields",
    "ReflectionRecord",
    "ReflectionContext",
    "estimate_tokens",
    "select_context",
    "format_context",
    "build_context",
]

HOLD_BAND = 0.02
"""A ``hold`` is right when the subject stayed within +/- 2 % of the benchmark (alpha)
over the horizon; outside the band a directional call would have been better."""

SUBJECT_WINDOW_SLACK_DAYS = 4
"""A subject-wide outcome (one without ``decision_id``) whose window is given settles
a decision only if the window starts on the decision's day or up to this many calendar
days later (a decision taken on a Friday evening is measured from Monday's close)."""

SAME_SUBJECT_LIMIT = 5
OTHER_SUBJECT_LIMIT = 3
DECISION_SNIPPET_CHARS = 280
"""Decision texts can be long reports; the context shows this many characters of each."""

# A namespace for every deterministic id derived here (uuid5 of a readable name).
_NAMESPACE = uuid.UUID("8d5a3c52-4f0e-5b8a-9a57-6d656d737472")

# --------------------------------------------------------------------------- ratings

_SYNONYMS: dict[str, Rating] = {
    "buy": Rating.buy,
    "strong buy": Rating.buy,
    "long": Rating.buy,
    "go long": Rating.buy,
    "overweight": Rating.overweight,
    "over weight": Rating.overweight,
    "outperform": Rating.overweight,
    "accumulate": Rating.overweight,
    "moderate buy": Rating.overweight,
    "add": Rating.overweight,
    "hold": Rating.hold,
    "neutral": Rating.hold,
    "market perform": Rating.hold,
    "equal weight": Rating.hold,
    "equal-weight": Rating.hold,
    "equalweight": Rating.hold,
    "wait": Rating.hold,
    "underweight": Rating.underweight,
    "under weight": Rating.underweight,
    "underperform": Rating.underweight,
    "reduce": Rating.underweight,
    "trim": Rating.underweight,
    "moderate sell": Rating.underweight,
    "sell": Rating.sell,
    "strong sell": Rating.sell,
    "short": Rating.sell,
    "go short": Rating.sell,
}

# Words that name a rating when they stand alone in running text. Short verbs such as
# "add", "trim", "wait", "long" and "short" are too common in prose to count there;
# they are accepted only as the whole answer or after a label.
_PROSE_WORDS = (
    "strong buy",
    "strong sell",
    "moderate buy",
    "moderate sell",
    "overweight",
    "underweight",
    "outperform",
    "underperform",
    "market perform",
    "equal weight",
    "equal-weight",
    "accumulate",
    "buy",
    "hold",
    "sell",
    "neutral",
)
_PROSE_RE = re.compile(
    r"(?<![\w-])(" + "|".join(re.escape(w).replace(r"\ ", r"[\s_]+") for w in _PROSE_WORDS) + r")(?![\w-])",
    re.IGNORECASE,
)
_LABEL_RE = re.compile(
    r"(?:final\s+(?:transaction\s+)?(?:proposal|decision|rating|recommendation|call|answer)"
    r"|rating|recommendation|decision|verdict|action|call|stance|position)"
    r"\s*(?:is|was|of)?\s*[:=\-\u2013\u2014]+\s*[*_`\"'\[(]*\s*"
    r"([A-Za-z][A-Za-z _-]{1,20}?)\s*[*_`\"'\])]*\s*(?=$|[\s.,;!?)\]])",
    re.IGNORECASE | re.MULTILINE,
)
_NORMALISE_WS = re.compile(r"[\s_]+")


class RatingParseError(ValueError):
    """Text in which no single 5-level rating can be found; ``reason`` is one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _synonym(text: str) -> Rating | None:
    key = _NORMALISE_WS.sub(" ", text.strip().strip("*_`\"'.!:;,()[]").lower()).strip()
    return _SYNONYMS.get(key)


def parse_rating(value: str | Rating) -> Rating:
    """Read a 5-level rating from an enum value, a word, or a model's free text.

    Lenient, but it never guesses between two answers. In order:

    1. the whole text is a rating or a synonym ("Buy", "STRONG SELL", "outperform",
       "equal weight", "neutral", "**Hold**");
    2. a labelled answer, the last one winning: "Rating: Overweight",
       "FINAL TRANSACTION PROPOSAL: **SELL**", "Recommendation - hold";
    3. rating words in prose ("we would buy here"): accepted when they all name the
       same rating; "buy or sell" raises. Compounds such as "sell-off" or
       "buyback" and short verbs ("add", "trim") do not count in prose.

    Raises :class:`RatingParseError` when nothing (or something ambiguous) is found.
    """
    if isinstance(value, Rating):
        return value
    if not isinstance(value, str) or not value.strip():
        raise RatingParseError("rating is empty")
    whole = _synonym(value)
    if whole is not None:
        return whole
    labelled = [r for m in _LABEL_RE.finditer(value) if (r := _synonym(m.group(1))) is not None]
    if labelled:
        return labelled[-1]
    found = {r for m in _PROSE_RE.finditer(value) if (r := _synonym(m.group(1))) is not None}
    if len(found) == 1:
        return found.pop()
    snippet = " ".join(value.split())[:60]
    if not found:
        raise RatingParseError(
            f"no rating found in {snippet!r} (expected one of: buy, overweight, hold, underweight, sell)"
        )
    names = ", ".join(sorted(r.value for r in found))
    raise RatingParseError(f"ambiguous rating in {snippet!r}: mentions {names}")


def rating_direction(rating: Rating) -> int:
    """+1 for a bullish call (buy, overweight), -1 for a bearish one, 0 for hold."""
    return {
        Rating.buy: 1,
        Rating.overweight: 1,
        Rating.hold: 0,
        Rating.underweight: -1,
        Rating.sell: -1,
    }[Rating(rating)]


# -------------------------------------------------------------------------- identity


def _space_parts(scope: Scope) -> str:
    # "|" cannot occur in an Identifier, so the joined key is unambiguous (unlike the
    # record key "team/user", whose ids may themselves hold "/").
    return f"{scope.team_id}|{scope.user_id}"


def decision_key(scope: Scope, decision_id: str) -> str:
    """The reflector's key for a decision: decision ids are unique within a memory
    space, not across tenants, so the space is part of the key."""
    return f"{_space_parts(scope)}|{decision_id}"


def subject_key(scope: Scope, subject: str) -> str:
    """The key that groups a subject's decisions and outcomes within one memory space;
    the reflector partitions its work by it so both meet on one partition."""
    return f"{_space_parts(scope)}|{subject}"


def reflection_id_for(scope: Scope, decision_id: str) -> str:
    """The one reflection id a decision can ever have (``refl-`` + 32 hex digits)."""
    return "refl-" + uuid.uuid5(_NAMESPACE, "reflection:" + decision_key(scope, decision_id)).hex


def reflection_event_id(scope: Scope, decision_id: str) -> uuid.UUID:
    """The event id of a decision's ``MemoryReflected``: a retried emission is a copy."""
    return uuid.uuid5(_NAMESPACE, "MemoryReflected:" + decision_key(scope, decision_id))


def expiry_event_id(scope: Scope, decision_id: str) -> uuid.UUID:
    """The event id of a decision's ``DecisionExpired``."""
    return uuid.uuid5(_NAMESPACE, "DecisionExpired:" + decision_key(scope, decision_id))


def provider_outcome_id(source: str, scope: Scope, decision_id: str) -> str:
    """The outcome id an outcome provider gives the outcome it computes for a decision,
    so polling the provider again yields the same outcome, not a second one."""
    return f"{source}-" + uuid.uuid5(_NAMESPACE, f"outcome:{source}:" + decision_key(scope, decision_id)).hex


def provider_outcome_event_id(source: str, scope: Scope, decision_id: str) -> uuid.UUID:
    return uuid.uuid5(_NAMESPACE, f"OutcomeObserved:{source}:" + decision_key(scope, decision_id))


# -------------------------------------------------------------------------- settling


@dataclass(frozen=True)
class OutcomeMatch:
    """Whether an outcome settles a decision, and in words why (or why not)."""

    settles: bool
    reason: str

    def __bool__(self) -> bool:
        return self.settles


def covers_horizon(decision: DecisionRecorded, outcome: OutcomeObserved) -> bool:
    """True when the outcome measures at least the decision's whole horizon.

    Horizons count trading days. When the outcome gives its window, the window must
    also span at least ``horizon_days`` calendar days: trading days are a subset of
    calendar days, so a shorter calendar span cannot hold the horizon.
    """
    if outcome.horizon_days < decision.horizon_days:
        return False
    if outcome.window_start is not None and outcome.window_end is not None:
        if outcome.window_end - outcome.window_start < timedelta(days=decision.horizon_days):
            return False
    return True


def match_outcome(decision: DecisionRecorded, outcome: OutcomeObserved) -> OutcomeMatch:
    """Decide whether ``outcome`` settles ``decision``.

    Rules, in order:

    1. same memory space (team and user): an outcome never crosses tenants;
    2. same subject;
    3. an outcome naming a ``decision_id`` settles that decision only;
    4. the outcome covers the whole horizon (:func:`covers_horizon`);
    5. a subject-wide outcome (no ``decision_id``) must describe the time after the
       decision: its window, when given, starts on the decision's day or up to
       :data:`SUBJECT_WINDOW_SLACK_DAYS` later; without a window, it must have been
       observed after the decision was taken.
    """
    d_scope, o_scope = decision.scope, outcome.scope
    if (d_scope.team_id, d_scope.user_id) != (o_scope.team_id, o_scope.user_id):
        return OutcomeMatch(False, "outcome belongs to another memory space")
    if outcome.subject != decision.subject:
        return OutcomeMatch(False, f"outcome is for {outcome.subject}, not {decision.subject}")
    if outcome.decision_id is not None and outcome.decision_id != decision.decision_id:
        return OutcomeMatch(False, f"outcome is for decision {outcome.decision_id}")
    if not covers_horizon(decision, outcome):
        return OutcomeMatch(
            False,
            f"outcome covers {outcome.horizon_days} of {decision.horizon_days} horizon days",
        )
    if outcome.decision_id is None:
        decided = decision.occurred_at
        if outcome.window_start is not None:
            start_day = outcome.window_start.date()
            first, last = decided.date(), decided.date() + timedelta(days=SUBJECT_WINDOW_SLACK_DAYS)
            if not first <= start_day <= last:
                return OutcomeMatch(
                    False,
                    f"outcome window starts {start_day}, outside {first}..{last} for this decision",
                )
        elif outcome.occurred_at < decided:
            return OutcomeMatch(False, "outcome was observed before the decision was taken")
    return OutcomeMatch(True, "outcome covers the whole horizon")


def expiry_due(decision: DecisionRecorded, now: datetime) -> bool:
    """True once ``now`` has reached the decision's deadline (``now`` must be aware)."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now >= decision.deadline


# ---------------------------------------------------------------------- correctness


def performance(outcome: OutcomeObserved) -> tuple[float, str]:
    """The number a call is judged on and its name: the alpha against the benchmark
    when known (computed from the benchmark return when only that is given), else the
    raw return."""
    if outcome.alpha is not None:
        return outcome.alpha, "alpha"
    if outcome.benchmark_return is not None:
        return outcome.raw_return - outcome.benchmark_return, "alpha"
    return outcome.raw_return, "raw return"


def direction_correct(
    rating: Rating,
    alpha: float | None,
    raw_return: float | None = None,
    *,
    hold_band: float = HOLD_BAND,
) -> bool | None:
    """Was the call's direction right?

    Bullish calls (buy, overweight) are right when the subject beat the benchmark
    (alpha > 0), bearish ones (underweight, sell) when it lagged (alpha < 0), a hold
    when ``|alpha| <= hold_band``. Without an alpha the raw return stands in (the call
    is then judged against cash); with neither, the answer is ``None`` (unknown).
    """
    measure = alpha if alpha is not None else raw_return
    if measure is None or not math.isfinite(measure):
        return None
    direction = rating_direction(rating)
    if direction > 0:
        return measure > 0
    if direction < 0:
        return measure < 0
    return abs(measure) <= hold_band


# --------------------------------------------------------------- templated reflection


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _snippet(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1].rsplit(" ", 1)[0] or flat[: limit - 1]
    return cut.rstrip(" ,;:.") + "\u2026"


@dataclass(frozen=True)
class TemplatedReflection:
    content: str
    lesson: str
    correct: bool | None


def templated_reflection(
    decision: DecisionRecorded, outcome: OutcomeObserved, *, hold_band: float = HOLD_BAND
) -> TemplatedReflection:
    """A reflection written from the numbers alone (no LLM): three sentences, saying
    whether the direction was right (citing the alpha), whether the recorded reasoning
    held, and one lesson. Used when no LLM is configured; marked ``templated``."""
    rating = decision.rating
    subject = decision.subject
    measure, basis = performance(outcome)
    alpha = measure if basis == "alpha" else None
    correct = direction_correct(rating, alpha, outcome.raw_return, hold_band=hold_band)
    verdict = {True: "right", False: "wrong", None: "not judgeable"}[correct]
    numbers = f"a raw return of {_pct(outcome.raw_return)}"
    if alpha is not None:
        numbers += f" and an alpha of {_pct(alpha)} against the benchmark"
    else:
        numbers += " (no benchmark was given, so it is judged against cash)"
    first = (
        f"The {rating.value.upper()} call on {subject} was {verdict}: over "
        f"{decision.horizon_days} trading days it showed {numbers}."
    )
    reasoning = _snippet(decision.decision_text, 120)
    if correct is True:
        second = f'The recorded reasoning ("{reasoning}") held up on direction.'
    elif correct is False:
        second = f'The recorded reasoning ("{reasoning}") did not hold up: {subject} moved against it.'
    else:
        second = f'The recorded reasoning ("{reasoning}") cannot be checked without a measured return.'
    direction = rating_direction(rating)
    gap = _pct(abs(measure))
    if correct is None:
        lesson = f"record a benchmark and return with each {subject} outcome so the call can be judged"
    elif direction > 0 and correct:
        lesson = f"similar bullish evidence on {subject} paid off by {gap}; give it the same weight next time"
    elif direction > 0:
        lesson = (
            f"before rating {subject} {rating.value} again, require evidence that it can beat "
            f"the benchmark, since it lagged by {gap}"
        )
    elif direction < 0 and correct:
        lesson = f"the bearish warning signs on {subject} were borne out by {gap}; weigh them the same way next time"
    elif direction < 0:
        lesson = (
            f"{subject} outperformed by {gap}; test the bear case against momentum and "
            f"catalysts before rating it {rating.value} again"
        )
    elif correct:
        lesson = f"{subject} stayed within {hold_band:.0%} of the benchmark, so a neutral stance fit"
    else:
        lesson = (
            f"{subject} moved {_pct(measure)} against the benchmark, beyond the {hold_band:.0%} "
            "hold band; look for the catalyst that justified a directional call"
        )
    lesson = lesson[0].upper() + lesson[1:] + "."
    content = f"{first} {second} Lesson: {lesson}"
    return TemplatedReflection(content=content, lesson=lesson, correct=correct)


# ------------------------------------------------------------------ LLM reflections


class ReflectionTextError(ValueError):
    """A model answer that is not a usable reflection (empty, or far too long)."""


@dataclass(frozen=True)
class ParsedReflection:
    content: str
    lesson: str
    sentences: int


_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_LESSON_RE = re.compile(r"\blesson\s*[:\-\u2013\u2014]\s*(.+)", re.IGNORECASE | re.DOTALL)
_MARKUP = re.compile(r"^\s*(?:[-*>#]+|\d+[.)])\s*", re.MULTILINE)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


def parse_reflection_text(text: str, *, max_chars: int = 2000) -> ParsedReflection:
    """Clean a model's reflection into plain prose and find its lesson.

    Strips code fences, list and heading markers, bold markers and line breaks; the
    lesson is the sentence after "Lesson:" when present, else the last sentence. More
    than four sentences are cut to the first four (the prompt asks for 2-4); an empty
    answer or one still over ``max_chars`` raises :class:`ReflectionTextError`, which
    the reflector treats like any LLM failure (retry later).
    """
    if not isinstance(text, str):
        raise ReflectionTextError("reflection is not text")
    cleaned = _FENCE.sub("", text.strip())
    cleaned = _MARKUP.sub("", cleaned).replace("**", "").replace("__", "")
    cleaned = " ".join(cleaned.split())
    if not cleaned:
        raise ReflectionTextError("reflection is empty")
    sentences = [s.strip() for s in _SENTENCE_SPLIT.split(cleaned) if s.strip()]
    if len(sentences) > 4:
        lesson_at = next(
            (i for i, s in enumerate(sentences) if _LESSON_RE.search(s)), None
        )
        kept = sentences[:3] + [sentences[lesson_at]] if lesson_at is not None and lesson_at > 3 else sentences[:4]
        sentences = kept
        cleaned = " ".join(sentences)
    if len(cleaned) > max_chars:
        raise ReflectionTextError(f"reflection is {len(cleaned)} characters; the limit is {max_chars}")
    match = _LESSON_RE.search(cleaned)
    if match:
        lesson = _SENTENCE_SPLIT.split(match.group(1).strip())[0].strip()
    else:
        lesson = sentences[-1]
    return ParsedReflection(content=cleaned, lesson=lesson, sentences=len(sentences))


REFLECTION_ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reflection": {"type": "string"},
        "lesson": {"type": "string"},
    },
    "required": ["reflection", "lesson"],
    "additionalProperties": False,
}
"""The JSON the reflection prompt asks for (structured output where the endpoint has it)."""


def parse_reflection_answer(text: str, *, max_chars: int = 2000) -> ParsedReflection:
    """Read a model's reflection answer: ``{"reflection": ..., "lesson": ...}``.

    The JSON is repaired first (:func:`memstream.domain.repair.repair_json`: fences,
    trailing commas, truncation). When the ``reflection`` text lacks its lesson
    sentence, the given ``lesson`` is appended as "Lesson: ...". An answer that holds no
    JSON object at all is read as plain prose (a model that ignored the format still
    wrote a usable reflection). Raises :class:`ReflectionTextError` (a ``ValueError``,
    so the LLM call is retried) when nothing usable is there.
    """
    if not isinstance(text, str) or not text.strip():
        raise ReflectionTextError("reflection is empty")
    try:
        value = repair_json(text).value
    except JSONRepairError:
        return _enough(parse_reflection_text(text, max_chars=max_chars))
    if not isinstance(value, dict):
        raise ReflectionTextError("the answer is JSON but not an object with a reflection")
    body = value.get("reflection")
    if not isinstance(body, str) or not body.strip():
        raise ReflectionTextError('the answer has no "reflection" text')
    lesson = value.get("lesson")
    lesson = " ".join(lesson.split()) if isinstance(lesson, str) else ""
    lesson = _LESSON_PREFIX.sub("", lesson).strip()
    if lesson and not _LESSON_RE.search(body) and lesson.rstrip(".!?") not in body:
        body = f"{body.strip()} Lesson: {lesson}"
    parsed = _enough(parse_reflection_text(body, max_chars=max_chars))
    if lesson:
        return ParsedReflection(content=parsed.content, lesson=lesson, sentences=parsed.sentences)
    return parsed


def _enough(parsed: ParsedReflection) -> ParsedReflection:
    # A one-sentence answer is a refusal or a fragment more often than a reflection.
    if parsed.sentences < 2:
        raise ReflectionTextError(
            f"reflection has {parsed.sentences} sentence; 2 to 4 are needed: {parsed.content[:80]!r}"
        )
    return parsed


_LESSON_PREFIX = re.compile(r"^\s*lesson\s*[:\-\u2013\u2014]\s*", re.IGNORECASE)


def reflection_prompt_fields(decision: DecisionRecorded, outcome: OutcomeObserved) -> dict[str, str]:
    """The values a reflection prompt is filled with, all already formatted as text,
    so the prompt cannot misread a number (returns are shown as signed percentages)."""
    measure, basis = performance(outcome)
    alpha = measure if basis == "alpha" else None
    correct = direction_correct(decision.rating, alpha, outcome.raw_return)
    return {
        "subject": decision.subject,
        "rating": decision.rating.value,
        "horizon_days": str(decision.horizon_days),
        "decided_at": decision.occurred_at.date().isoformat(),
        "decision_text": decision.decision_text,
        "raw_return": _pct(outcome.raw_return),
        "benchmark_return": _pct(outcome.benchmark_return) if outcome.benchmark_return is not None else "unknown",
        "alpha": _pct(alpha) if alpha is not None else "unknown (no benchmark)",
        "window": (
            f"{outcome.window_start.date()} to {outcome.window_end.date()}"
            if outcome.window_start is not None and outcome.window_end is not None
            else f"{outcome.horizon_days} trading days"
        ),
        "direction_verdict": {True: "right", False: "wrong", None: "unknown"}[correct],
    }


# --------------------------------------------------------------------------- context


@dataclass(frozen=True)
class ReflectionRecord:
    """One settled reflection as the context builder needs it (a row of the
    projection's ``reflections`` table)."""

    reflection_id: str
    decision_id: str
    subject: str
    rating: Rating
    content: str
    occurred_at: datetime
    decision_text: str = ""
    outcome_id: str = ""
    raw_return: float | None = None
    alpha: float | None = None
    correct: bool | None = None
    lesson: str | None = None
    templated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "reflection_id": self.reflection_id,
            "decision_id": self.decision_id,
            "outcome_id": self.outcome_id,
            "subject": self.subject,
            "rating": Rating(self.rating).value,
            "decision_text": self.decision_text,
            "raw_return": self.raw_return,
            "alpha": self.alpha,
            "correct": self.correct,
            "content": self.content,
            "lesson": self.lesson,
            "templated": self.templated,
            "occurred_at": self.occurred_at.isoformat(),
        }


@dataclass(frozen=True)
class ReflectionContext:
    """Past lessons formatted for a prompt.

    ``same_subject`` and ``other_subjects`` are the records actually rendered into
    ``text`` (newest first); ``omitted`` counts selected records left out because the
    budget was spent.
    """

    subject: str
    text: str
    same_subject: tuple[ReflectionRecord, ...] = ()
    other_subjects: tuple[ReflectionRecord, ...] = ()
    token_estimate: int = 0
    budget_tokens: int = 0
    omitted: int = 0
    truncated_fields: int = 0

    @property
    def empty(self) -> bool:
        return not self.same_subject and not self.other_subjects

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "text": self.text,
            "same_subject": [r.to_dict() for r in self.same_subject],
            "other_subjects": [r.to_dict() for r in self.other_subjects],
            "token_estimate": self.token_estimate,
            "budget_tokens": self.budget_tokens,
            "omitted": self.omitted,
        }


def estimate_tokens(text: str) -> int:
    """``ceil(ascii_chars / 4) + non_ascii_chars`` (see the module docstring)."""
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    return math.ceil(ascii_chars / 4) + (len(text) - ascii_chars)


def _newest_first(records: Iterable[ReflectionRecord]) -> list[ReflectionRecord]:
    # Ties (same timestamp) break on the id so the order is total and reproducible.
    return sorted(records, key=lambda r: (r.occurred_at, r.reflection_id), reverse=True)


def select_context(
    records: Iterable[ReflectionRecord],
    subject: str,
    *,
    same_limit: int = SAME_SUBJECT_LIMIT,
    other_limit: int = OTHER_SUBJECT_LIMIT,
) -> tuple[list[ReflectionRecord], list[ReflectionRecord]]:
    """The ``same_limit`` most recent reflections on ``subject`` and the
    ``other_limit`` most recent on any other subject, each newest first. A reflection
    seen twice (same id) counts once."""
    unique: dict[str, ReflectionRecord] = {}
    for record in records:
        unique.setdefault(record.reflection_id, record)
    ordered = _newest_first(unique.values())
    same = [r for r in ordered if r.subject == subject][: max(same_limit, 0)]
    other = [r for r in ordered if r.subject != subject][: max(other_limit, 0)]
    return same, other


def _outcome_phrase(record: ReflectionRecord) -> str:
    parts = []
    if record.raw_return is not None:
        parts.append(f"return {_pct(record.raw_return)}")
    if record.alpha is not None:
        parts.append(f"alpha {_pct(record.alpha)}")
    verdict = {True: "right", False: "wrong", None: "unjudged"}[record.correct]
    return (", ".join(parts) + f" ({verdict})") if parts else f"({verdict})"


def _render_same(record: ReflectionRecord, *, with_decision: bool) -> str:
    head = (
        f"- {record.occurred_at.date().isoformat()} {Rating(record.rating).value.upper()} "
        f"{record.subject}: {_outcome_phrase(record)}"
    )
    lines = [head]
    if with_decision and record.decision_text.strip():
        lines.append(f"  Decision: {_snippet(record.decision_text, DECISION_SNIPPET_CHARS)}")
    lines.append(f"  Reflection: {' '.join(record.content.split())}")
    return "\n".join(lines)


def _render_other(record: ReflectionRecord) -> str:
    return (
        f"- {record.occurred_at.date().isoformat()} {record.subject} "
        f"({Rating(record.rating).value}): {' '.join(record.content.split())}"
    )


def format_context(
    subject: str,
    same: Sequence[ReflectionRecord],
    other: Sequence[ReflectionRecord],
    budget_tokens: int,
) -> ReflectionContext:
    """Render the selected reflections as prompt text within ``budget_tokens``.

    Same-subject entries come first (decision, outcome and reflection each), then the
    other subjects (reflection only), each group newest first. Entries are added in
    that order while the estimate stays within the budget; a same-subject entry that
    does not fit is retried without its decision text. The first entry of a group that
    still does not fit ends that group, so an older lesson never displaces a newer one.
    A budget too small for any entry gives empty text.
    """
    budget = max(int(budget_tokens), 0)
    same_header = f"Past decisions on {subject} and what they taught (newest first):"
    other_header = "Lessons from other subjects (newest first):"
    blocks: list[str] = []
    kept_same: list[ReflectionRecord] = []
    kept_other: list[ReflectionRecord] = []
    shortened = 0

    def fits(extra: str) -> bool:
        candidate = "\n".join([*blocks, extra]) if blocks else extra
        return estimate_tokens(candidate) <= budget

    for record in same:
        header = [same_header] if not kept_same else []
        full = "\n".join([*header, _render_same(record, with_decision=True)])
        short = "\n".join([*header, _render_same(record, with_decision=False)])
        if fits(full):
            blocks.append(full)
        elif fits(short):
            blocks.append(short)
            shortened += 1
        else:
            break
        kept_same.append(record)
    for record in other:
        prefix: list[str] = []
        if not kept_other:
            prefix = ([""] if blocks else []) + [other_header]
        block = "\n".join([*prefix, _render_other(record)])
        if not fits(block):
            break
        blocks.append(block)
        kept_other.append(record)
    text = "\n".join(blocks)
    used = estimate_tokens(text) if text else 0
    omitted = (len(same) - len(kept_same)) + (len(other) - len(kept_other))
    return ReflectionContext(
        subject=subject,
        text=text,
        same_subject=tuple(kept_same),
        other_subjects=tuple(kept_other),
        token_estimate=used,
        budget_tokens=budget,
        omitted=omitted,
        truncated_fields=shortened,
    )


def build_context(
    records: Iterable[ReflectionRecord],
    subject: str,
    budget_tokens: int,
    *,
    same_limit: int = SAME_SUBJECT_LIMIT,
    other_limit: int = OTHER_SUBJECT_LIMIT,
) -> ReflectionContext:
    """:func:`select_context` then :func:`format_context`."""
    same, other = select_context(records, subject, same_limit=same_limit, other_limit=other_limit)
    return format_context(subject, same, other, budget_tokens)
