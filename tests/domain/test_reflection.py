"""The pure reflection rules: ratings, settling, expiry, correctness, templated text,
deterministic ids, and the choice and formatting of injected lessons."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.domain.events import DecisionRecorded, OutcomeObserved, Rating, Scope
from memstream.domain.reflection import (
    HOLD_BAND,
    RatingParseError,
    ReflectionRecord,
    ReflectionTextError,
    build_context,
    covers_horizon,
    decision_key,
    direction_correct,
    estimate_tokens,
    expiry_due,
    expiry_event_id,
    format_context,
    match_outcome,
    parse_rating,
    parse_reflection_answer,
    parse_reflection_text,
    provider_outcome_id,
    rating_direction,
    reflection_event_id,
    reflection_id_for,
    reflection_prompt_fields,
    select_context,
    subject_key,
    templated_reflection,
)

T0 = datetime(2024, 3, 4, 21, 0, tzinfo=timezone.utc)  # a Monday evening
SCOPE = Scope(team_id="acme", user_id="ana", agent_id="trader")


def decision(**kw: object) -> DecisionRecorded:
    fields: dict[str, object] = {
        "scope": SCOPE,
        "occurred_at": T0,
        "decision_id": "d1",
        "subject": "AAPL",
        "rating": Rating.buy,
        "decision_text": "Services revenue keeps compounding; buy ahead of the launch.",
        "horizon_days": 5,
        "deadline": T0 + timedelta(days=14),
    }
    fields.update(kw)
    return DecisionRecorded(**fields)  # type: ignore[arg-type]


def outcome(**kw: object) -> OutcomeObserved:
    fields: dict[str, object] = {
        "scope": SCOPE,
        "occurred_at": T0 + timedelta(days=8),
        "outcome_id": "o1",
        "decision_id": "d1",
        "subject": "AAPL",
        "raw_return": 0.05,
        "benchmark_return": 0.02,
        "alpha": 0.03,
        "horizon_days": 5,
    }
    fields.update(kw)
    return OutcomeObserved(**fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------- ratings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("buy", Rating.buy),
        ("  SELL ", Rating.sell),
        ("Strong Buy", Rating.buy),
        ("**Overweight**", Rating.overweight),
        ("outperform", Rating.overweight),
        ("equal weight", Rating.hold),
        ("Neutral", Rating.hold),
        ("underperform", Rating.underweight),
        ("Rating: Underweight\nThe margins are thinning.", Rating.underweight),
        ("Analysis...\nFINAL TRANSACTION PROPOSAL: **SELL**", Rating.sell),
        ("Recommendation - hold.", Rating.hold),
        ("Rating: buy. On reflection, Rating: hold", Rating.hold),  # the last label wins
        ("We would buy more on any dip.", Rating.buy),
        ("Despite the sell-off we hold the position.", Rating.hold),  # "sell-off" is no rating
        ("buyback announced; we keep a HOLD", Rating.hold),
    ],
)
def test_parse_rating_is_lenient(text: str, expected: Rating) -> None:
    assert parse_rating(text) is expected


@pytest.mark.parametrize(
    "text",
    ["", "   ", "the weather is nice", "buy or sell, hard to say", "add to the trim list"],
)
def test_parse_rating_refuses_to_guess(text: str) -> None:
    with pytest.raises(RatingParseError):
        parse_rating(text)


def test_parse_rating_passes_enum_values_through() -> None:
    assert parse_rating(Rating.overweight) is Rating.overweight


def test_rating_direction() -> None:
    assert [rating_direction(r) for r in Rating] == [1, 1, 0, -1, -1]


# ------------------------------------------------------------------ settling


def test_full_horizon_outcome_settles() -> None:
    verdict = match_outcome(decision(), outcome())
    assert verdict.settles and bool(verdict)


def test_partial_horizon_does_not_settle() -> None:
    verdict = match_outcome(decision(horizon_days=5), outcome(horizon_days=1))
    assert not verdict
    assert "1 of 5" in verdict.reason


def test_longer_horizon_covers() -> None:
    assert covers_horizon(decision(horizon_days=5), outcome(horizon_days=10))


def test_window_too_short_for_the_horizon_does_not_cover() -> None:
    short = outcome(window_start=T0, window_end=T0 + timedelta(days=2), horizon_days=5)
    assert not covers_horizon(decision(), short)
    full = outcome(window_start=T0, window_end=T0 + timedelta(days=7), horizon_days=5)
    assert covers_horizon(decision(), full)


def test_outcome_never_crosses_memory_spaces() -> None:
    other = Scope(team_id="globex", user_id="ana")
    assert not match_outcome(decision(), outcome(scope=other))
    # another agent of the same space is the same space
    same_space = Scope(team_id="acme", user_id="ana", agent_id="risk")
    assert match_outcome(decision(), outcome(scope=same_space))


def test_outcome_for_another_decision_or_subject_does_not_settle() -> None:
    assert not match_outcome(decision(), outcome(decision_id="d2"))
    assert not match_outcome(decision(), outcome(subject="MSFT"))


def test_subject_wide_outcome_must_describe_the_time_after_the_decision() -> None:
    d = decision()
    on_time = outcome(decision_id=None, window_start=T0 + timedelta(days=1), window_end=T0 + timedelta(days=8))
    assert match_outcome(d, on_time)
    too_early = outcome(decision_id=None, window_start=T0 - timedelta(days=3), window_end=T0 + timedelta(days=5))
    assert not match_outcome(d, too_early)
    too_late = outcome(decision_id=None, window_start=T0 + timedelta(days=9), window_end=T0 + timedelta(days=16))
    assert not match_outcome(d, too_late)
    observed_before = outcome(decision_id=None, occurred_at=T0 - timedelta(hours=1))
    assert not match_outcome(d, observed_before)
    observed_after = outcome(decision_id=None, occurred_at=T0 + timedelta(days=8))
    assert match_outcome(d, observed_after)


def test_expiry_is_due_at_the_deadline() -> None:
    d = decision(deadline=T0 + timedelta(days=3))
    assert not expiry_due(d, T0 + timedelta(days=3) - timedelta(microseconds=1))
    assert expiry_due(d, T0 + timedelta(days=3))
    assert expiry_due(d, T0 + timedelta(days=30))
    with pytest.raises(ValueError):
        expiry_due(d, datetime(2030, 1, 1))


# --------------------------------------------------------------- correctness


@pytest.mark.parametrize(
    ("rating", "alpha", "expected"),
    [
        (Rating.buy, 0.03, True),
        (Rating.buy, -0.01, False),
        (Rating.overweight, 0.001, True),
        (Rating.sell, -0.02, True),
        (Rating.underweight, 0.02, False),
        (Rating.hold, HOLD_BAND, True),
        (Rating.hold, -0.01, True),
        (Rating.hold, 0.05, False),
    ],
)
def test_direction_correct(rating: Rating, alpha: float, expected: bool) -> None:
    assert direction_correct(rating, alpha) is expected


def test_direction_falls_back_to_raw_return_then_unknown() -> None:
    assert direction_correct(Rating.buy, None, 0.04) is True
    assert direction_correct(Rating.sell, None, 0.04) is False
    assert direction_correct(Rating.buy, None, None) is None


# ----------------------------------------------------------------- templated


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


def test_prompt_fields_are_formatted_text() -> None:
    fields = reflection_prompt_fields(decision(), outcome())
    assert fields["alpha"] == "+3.0%" and fields["raw_return"] == "+5.0%"
    assert fields["direction_verdict"] == "right"
    assert fields["decided_at"] == "2024-03-04"
    assert all(isinstance(v, str) for v in fields.values())


# ------------------------------------------------------------ model answers


def test_parse_reflection_answer_reads_repaired_json() -> None:
    answer = (
        '```json\n{"reflection": "The buy was right with an alpha of +3.0%. The services thesis held.",'
        ' "lesson": "Lesson: weigh recurring revenue highly.",}\n```'
    )
    parsed = parse_reflection_answer(answer)
    assert parsed.content.endswith("Lesson: weigh recurring revenue highly.")
    assert parsed.lesson == "weigh recurring revenue highly."
    assert parsed.sentences == 3


def test_parse_reflection_answer_accepts_plain_prose() -> None:
    parsed = parse_reflection_answer("The call was right. Lesson: keep it simple.")
    assert parsed.lesson == "keep it simple."


@pytest.mark.parametrize(
    "answer",
    ["", "Sorry, I cannot help with that.", '{"verdict": "right"}', "[1, 2]", '{"reflection": ""}'],
)
def test_parse_reflection_answer_rejects_unusable_answers(answer: str) -> None:
    with pytest.raises(ReflectionTextError):
        parse_reflection_answer(answer)


def test_parse_reflection_text_cleans_markup_and_keeps_four_sentences() -> None:
    text = "- One.\n- Two.\n**Three.** Four. Five. Lesson: six."
    parsed = parse_reflection_text(text)
    assert parsed.sentences == 4
    assert parsed.content == "One. Two. Three. Lesson: six."
    assert parsed.lesson == "six."


# -------------------------------------------------------------------- ids


def test_ids_are_deterministic_and_tenant_scoped() -> None:
    other = Scope(team_id="globex", user_id="ana")
    assert reflection_id_for(SCOPE, "d1") == reflection_id_for(SCOPE, "d1")
    assert reflection_id_for(SCOPE, "d1") != reflection_id_for(other, "d1")
    assert reflection_id_for(SCOPE, "d1") != reflection_id_for(SCOPE, "d2")
    assert reflection_event_id(SCOPE, "d1") != expiry_event_id(SCOPE, "d1")
    assert provider_outcome_id("prices", SCOPE, "d1") == provider_outcome_id("prices", SCOPE, "d1")
    long_id = "x" * 128
    assert len(reflection_id_for(SCOPE, long_id)) <= 128
    assert len(provider_outcome_id("prices", SCOPE, long_id)) <= 128
    # "|" cannot occur in ids, so keys cannot collide across the parts
    assert decision_key(Scope(team_id="a/b", user_id="c"), "d") != decision_key(
        Scope(team_id="a", user_id="b/c"), "d"
    )
    assert subject_key(SCOPE, "AAPL") == "acme|ana|AAPL"


# ------------------------------------------------------------------ context


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
