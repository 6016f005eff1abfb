"""A reflection written from the numbers alone, when no LLM is configured."""

from __future__ import annotations

from dataclasses import dataclass

from memstream.domain.events import DecisionRecorded, OutcomeObserved
from memstream.domain.reflection.outcomes import HOLD_BAND, direction_correct, performance
from memstream.domain.reflection.ratings import rating_direction
from memstream.domain.reflection.wording import pct, snippet

__all__ = ["TemplatedReflection", "templated_reflection"]

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
    numbers = f"a raw return of {pct(outcome.raw_return)}"
    if alpha is not None:
        numbers += f" and an alpha of {pct(alpha)} against the benchmark"
    else:
        numbers += " (no benchmark was given, so it is judged against cash)"
    first = (
        f"The {rating.value.upper()} call on {subject} was {verdict}: over "
        f"{decision.horizon_days} trading days it showed {numbers}."
    )
    reasoning = snippet(decision.decision_text, 120)
    if correct is True:
        second = f'The recorded reasoning ("{reasoning}") held up on direction.'
    elif correct is False:
        second = f'The recorded reasoning ("{reasoning}") did not hold up: {subject} moved against it.'
    else:
        second = f'The recorded reasoning ("{reasoning}") cannot be checked without a measured return.'
    direction = rating_direction(rating)
    gap = pct(abs(measure))
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
            f"{subject} moved {pct(measure)} against the benchmark, beyond the {hold_band:.0%} "
            "hold band; look for the catalyst that justified a directional call"
        )
    lesson = lesson[0].upper() + lesson[1:] + "."
    content = f"{first} {second} Lesson: {lesson}"
    return TemplatedReflection(content=content, lesson=lesson, correct=correct)
