"""The scope rule and the client/system split (``memstream.domain.access``), pure."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from memstream.domain.access import AccessScope, ReadScope, read_scope_of, system_claim
from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MessageObserved,
    OutcomeObserved,
    Rating,
    Scope,
)

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
S = Scope(team_id="acme", user_id="ana", agent_id="planner")


def test_keys_read_within_their_scope_only() -> None:
    team = AccessScope(team_id="acme")
    user = AccessScope(team_id="acme", user_id="ana")
    agent = AccessScope(team_id="acme", user_id="ana", agent_id="planner")
    assert team.read_scope("ana") == ReadScope("acme", "ana", None)
    assert team.read_scope("ana", "spy") == ReadScope("acme", "ana", "spy")
    assert user.read_scope() == ReadScope("acme", "ana", None)
    assert agent.read_scope() == ReadScope("acme", "ana", "planner")
    with pytest.raises(PermissionError):
        agent.read_scope(agent_id="spy")
    with pytest.raises(PermissionError):
        user.read_scope("bob")
    assert agent.allows(S) and not agent.allows(S.model_copy(update={"agent_id": "spy"}))
    assert team.allows(S) and not team.allows(Scope(team_id="beta"))
    assert read_scope_of(S) == ReadScope("acme", "ana", None)
    assert ReadScope.pinned(S).covers("acme", "ana", "planner")
    assert not ReadScope.pinned(S).covers("acme", "ana", "spy")


@pytest.mark.parametrize(
    "event",
    [
        MessageObserved(scope=S, message_id="m", content="hi"),
        MemoryAdded(scope=S, memory_id="x", content="c", producer="memstream-sdk"),
        MemoryAdded(scope=S, memory_id="x", content="c", producer="api:bank"),
        MemoryLinked(scope=S, from_memory_id="a", to_memory_id="b", relation="supersedes", decided_by="agent"),
        MemoryLinked(scope=S, from_memory_id="a", to_memory_id="b", relation="duplicates", decided_by="rule"),
        DecisionRecorded(scope=S, decision_id="d", subject="AAPL", rating=Rating.buy, decision_text="t", deadline=T0),
        OutcomeObserved(scope=S, outcome_id="o", subject="AAPL", raw_return=0.1, horizon_days=5),
    ],
)
def test_client_events(event: object) -> None:
    assert system_claim(event) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "event",
    [
        MemoryReflected(scope=S, reflection_id="r", decision_id="d", outcome_id="o", subject="AAPL",
                        rating=Rating.buy, content="lesson"),
        DecisionExpired(scope=S, decision_id="d", subject="AAPL", deadline=T0),
        MemoryLinked(scope=S, from_memory_id="a", to_memory_id="b", relation="supersedes", decided_by="llm"),
        MemoryAdded(scope=S, memory_id="x", content="c", producer="extractor"),
        MemoryAdded(scope=S, memory_id="x", content="c", producer="memstream-extractor"),
        MemoryAdded(scope=S, memory_id="x", content="c", producer="Memstream.Reflector"),
        MessageObserved(scope=S, message_id="m", content="hi", producer="projector"),
    ],
)
def test_system_events(event: object) -> None:
    assert system_claim(event)  # type: ignore[arg-type]
