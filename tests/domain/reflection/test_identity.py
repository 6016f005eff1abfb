"""Deterministic, tenant-scoped ids."""

from __future__ import annotations

from memstream.domain.events import Scope
from memstream.domain.reflection.identity import (
    decision_key,
    expiry_event_id,
    provider_outcome_id,
    reflection_event_id,
    reflection_id_for,
    subject_key,
)
from tests.domain.reflection.helpers import SCOPE


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
