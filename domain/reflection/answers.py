"""A model's reflection read into content and lesson, and the fields its prompt is filled with."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memstream.domain.events import DecisionRecorded, OutcomeObserved
from memstream.domain.reflection.outcomes import direction_correct, performance
from memstream.domain.reflection.wording import pct
from memstream.domain.repair import JSONRepairError, repair_json

__all__ = [
    "ParsedReflection",
    "ReflectionTextError",
    "parse_reflection_text",
    "REFLECTION_ANSWER_SCHEMA",
    "parse_reflection_answer",
    "reflection_prompt_fields",
]

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
        "raw_return": pct(outcome.raw_return),
        "benchmark_return": pct(outcome.benchmark_return) if outcome.benchmark_return is not None else "unknown",
        "alpha": pct(alpha) if alpha is not None else "unknown (no benchmark)",
        "window": (
            f"{outcome.window_start.date()} to {outcome.window_end.date()}"
            if outcome.window_start is not None and outcome.window_end is not None
            else f"{outcome.horizon_days} trading days"
        ),
        "direction_verdict": {True: "right", False: "wrong", None: "unknown"}[correct],
    }
