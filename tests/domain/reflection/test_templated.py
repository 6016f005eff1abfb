"""The templated reflection."""

from __future__ import annotations

from memstream.domain.events import Rating
from memstream.domain.reflection.answers import parse_reflection_text
from memstream.domain.reflection.templated import templated_reflection
from tests.domain.reflection.helpers import decision, outcome


def test_templated_reflection_cites_the_numbers_and_ends_with_a_lesson() -> None:
    written = templated_reflection(decision(), outcome())
    assert written.correct is True
    assert "BUY call on AAPL was right" in written.content
    assert "+3.0%" in written.content and "+5.0%" in written.content
    assert written.content.endswith(written.lesson)
    assert written.content.count("Lesson:") == 1
    parsed = parse_reflection_text(written.content)
    assert 2 <= parsed.sentences <= 4


def test_templated_reflection_of_a_wrong_bearish_call() -> None:
    written = templated_reflection(decision(rating=Rating.sell), outcome(alpha=0.04))
    assert written.correct is False
    assert "wrong" in written.content and "+4.0%" in written.content


def test_templated_reflection_without_benchmark_is_judged_against_cash() -> None:
    written = templated_reflection(decision(), outcome(alpha=None, benchmark_return=None, raw_return=-0.02))
    assert written.correct is False
    assert "judged against cash" in written.content
