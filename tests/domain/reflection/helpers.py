"""Shared builders for the reflection tests: a decision and its outcome."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from memstream.domain.events import DecisionRecorded, OutcomeObserved, Rating, Scope

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
