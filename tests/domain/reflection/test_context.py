"""Choosing and formatting past lessons within a token budget."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.domain.events import Rating
from memstream.domain.reflection.context import (
    ReflectionRecord,
    build_context,
    estimate_tokens,
    format_context,
    select_context,
)
from tests.domain.reflection.helpers import T0


def record(i: int, subject: str = "AAPL", *, text: str | None = None) -> ReflectionRecord:
    return ReflectionRecord(
        reflection_id=f"r{i:03d}",
        decision_id=f"d{i}",
        outcome_id=f"o{i}",
        subject=subject,
        rating=Rating.buy,
        decision_text=text or f"decision {i} on {subject}",
        raw_return=0.01 * i,
        alpha=0.005 * i,
        correct=True,
        content=f"Reflection number {i} on {subject}. Lesson: lesson {i}.",
        occurred_at=T0 + timedelta(days=i),
    )


def test_select_context_takes_five_same_and_three_other_newest_first() -> None:
    records = [record(i) for i in range(8)] + [record(10 + i, f"S{i}") for i in range(6)]
    same, other = select_context(reversed(records), "AAPL")
    assert [r.reflection_id for r in same] == ["r007", "r006", "r005", "r004", "r003"]
    assert [r.reflection_id for r in other] == ["r015", "r014", "r013"]


def test_select_context_counts_a_repeated_reflection_once() -> None:
    same, _ = select_context([record(1), record(1), record(2)], "AAPL")
    assert [r.reflection_id for r in same] == ["r002", "r001"]


def test_format_context_shows_decision_outcome_and_reflection_for_the_subject() -> None:
    ctx = build_context([record(1), record(2), record(3, "MSFT")], "AAPL", 2000)
    assert ctx.text.index("Reflection number 2") < ctx.text.index("Reflection number 1")
    assert "Decision: decision 2 on AAPL" in ctx.text
    assert "alpha +1.0%" in ctx.text and "(right)" in ctx.text
    assert "MSFT (buy): Reflection number 3" in ctx.text
    assert "decision 3 on MSFT" not in ctx.text  # other subjects: reflection only
    assert [r.reflection_id for r in ctx.same_subject] == ["r002", "r001"]
    assert ctx.omitted == 0 and ctx.token_estimate <= 2000


def test_format_context_drops_older_entries_first_when_the_budget_is_tight() -> None:
    records = [record(i) for i in range(5)]
    full = build_context(records, "AAPL", 10_000)
    tight = build_context(records, "AAPL", full.token_estimate // 2)
    assert tight.token_estimate <= full.token_estimate // 2
    kept = [r.reflection_id for r in tight.same_subject]
    assert kept == [r.reflection_id for r in full.same_subject][: len(kept)]
    assert tight.omitted == 5 - len(kept) > 0


def test_format_context_shortens_a_long_decision_before_dropping_the_entry() -> None:
    long_text = "word " * 2000
    rec = record(1, text=long_text)
    full = format_context("AAPL", [rec], [], 10_000)
    assert "Decision: word word" in full.text
    ctx = format_context("AAPL", [rec], [], full.token_estimate - 10)
    assert ctx.same_subject == (rec,)
    assert "Decision:" not in ctx.text and ctx.truncated_fields == 1


def test_format_context_with_no_room_is_empty() -> None:
    ctx = build_context([record(1)], "AAPL", 3)
    assert ctx.text == "" and ctx.empty and ctx.omitted == 1


@settings(max_examples=60, deadline=None)
@given(budget=st.integers(min_value=0, max_value=1500), n_same=st.integers(0, 7), n_other=st.integers(0, 5))
def test_context_never_exceeds_its_budget(budget: int, n_same: int, n_other: int) -> None:
    records = [record(i) for i in range(n_same)] + [record(20 + i, f"X{i}") for i in range(n_other)]
    ctx = build_context(records, "AAPL", budget)
    assert ctx.token_estimate <= budget
    assert estimate_tokens(ctx.text) == ctx.token_estimate
    same, other = select_context(records, "AAPL")
    assert list(ctx.same_subject) == same[: len(ctx.same_subject)]
    assert list(ctx.other_subjects) == other[: len(ctx.other_subjects)]


def test_estimate_tokens_counts_non_ascii_one_each() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("日本語") == 3
