"""How pending decisions meet the outcomes seen so far (the pure part of
``services.pending_view``); the log read itself runs against the real stack in
``tests/interfaces/console/test_console_scope.py``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from memstream.domain.access import ReadScope
from memstream.domain.events import DecisionRecorded, OutcomeObserved, build_event
from memstream.services.log_reads.pending import in_scope, pair_outcomes

T0 = datetime(2026, 1, 5, 12, tzinfo=timezone.utc)


def _scope(agent: str) -> dict[str, str]:
    return {"team_id": "t", "user_id": "u", "agent_id": agent}


def _decision(did: str, agent: str = "a", subject: str = "ACME", horizon: int = 5, days: int = 30) -> DecisionRecorded:
    event = build_event(DecisionRecorded, scope=_scope(agent), decision_id=did, subject=subject, rating="buy",
                        decision_text=f"text {did}", horizon_days=horizon, deadline=T0 + timedelta(days=days), occurred_at=T0)
    assert isinstance(event, DecisionRecorded)
    return event


def _outcome(oid: str, agent: str = "a", subject: str = "ACME", horizon: int = 5, decision_id: str | None = None) -> OutcomeObserved:
    event = build_event(OutcomeObserved, scope=_scope(agent), outcome_id=oid, subject=subject, raw_return=0.01,
                        horizon_days=horizon, decision_id=decision_id, occurred_at=T0 + timedelta(days=1))
    assert isinstance(event, OutcomeObserved)
    return event


def test_each_decision_gets_its_agents_outcomes_on_its_subject_with_the_reflectors_verdict() -> None:
    d1, d2 = _decision("d1", days=40), _decision("d2", days=10)
    outcomes = [
        _outcome("short", horizon=2, decision_id="d1"),  # names d1, too short
        _outcome("wide", horizon=5),  # subject-wide: settles both
        _outcome("other-agent", agent="b", horizon=5),
        _outcome("other-subject", subject="BETA", horizon=5),
        _outcome("for-d2", horizon=5, decision_id="d2"),
        _outcome("wide", horizon=5),  # seen twice: counted once
    ]
    got = pair_outcomes([(d1, "p:0:1"), (d2, "p:0:2"), (d1, "p:0:3")], outcomes)
    assert [p.decision.decision_id for p in got] == ["d2", "d1"]  # soonest deadline first, d1 once
    by = {p.decision.decision_id: {o.outcome.outcome_id: o for o in p.outcomes} for p in got}
    assert set(by["d1"]) == {"short", "wide"} and set(by["d2"]) == {"wide", "for-d2"}
    assert not by["d1"]["short"].settles and "covers 2 of 5 horizon days" in by["d1"]["short"].reason
    assert by["d1"]["wide"].settles and got[1].settled


def test_a_decision_without_outcomes_is_pending_and_unsettled() -> None:
    (only,) = pair_outcomes([(_decision("d1"), "p:0:1")], [])
    assert only.outcomes == () and not only.settled


def test_in_scope_is_the_space_and_the_pinned_agent() -> None:
    d = _decision("d1", agent="a")
    assert in_scope(d, ReadScope("t", "u", None)) and in_scope(d, ReadScope("t", "u", "a"))
    assert not in_scope(d, ReadScope("t", "u", "b"))
    assert not in_scope(d, ReadScope("t", "other", None)) and not in_scope(d, ReadScope("other", "u", None))
