"""Settling, expiry and whether a call was right."""

from __future__ import annotations

from datetime import timedelta

import pytest

from memstream.domain.events import Rating, Scope
from memstream.domain.reflection.outcomes import HOLD_BAND, covers_horizon, direction_correct, match_outcome
from tests.domain.reflection.helpers import T0, decision, outcome


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


def test_outcome_never_crosses_memory_spaces_or_agents() -> None:
    other = Scope(team_id="globex", user_id="ana")
    assert not match_outcome(decision(), outcome(scope=other))
    # another agent of the same space never judges this agent's call
    other_agent = Scope(team_id="acme", user_id="ana", agent_id="risk")
    verdict = match_outcome(decision(), outcome(scope=other_agent))
    assert not verdict and verdict.reason == "outcome belongs to another agent"
    assert match_outcome(decision(), outcome(scope=decision().scope))


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
