"""Deterministic keys and ids: a reflection or expiry emitted twice carries the same ids,
so every reader can drop the copy."""

from __future__ import annotations

import uuid

from memstream.domain.events import Scope

__all__ = [
    "decision_key",
    "subject_key",
    "reflection_id_for",
    "reflection_event_id",
    "expiry_event_id",
    "provider_outcome_id",
    "provider_outcome_event_id",
]

# A namespace for every deterministic id derived here (uuid5 of a readable name).
_NAMESPACE = uuid.UUID("8d5a3c52-4f0e-5b8a-9a57-6d656d737472")


def _space_parts(scope: Scope) -> str:
    # "|" cannot occur in an Identifier, so the joined key is unambiguous (unlike the
    # record key "team/user", whose ids may themselves hold "/").
    return f"{scope.team_id}|{scope.user_id}"


def decision_key(scope: Scope, decision_id: str) -> str:
    """The reflector's key for a decision: a decision id belongs to its scope (team,
    user and agent), so another agent reusing it names another decision, and can
    neither answer for this one nor make its later write a duplicate."""
    return f"{_space_parts(scope)}|{scope.agent_id}|{decision_id}"


def subject_key(scope: Scope, subject: str) -> str:
    """The key that groups a subject's decisions and outcomes within one memory space;
    the reflector partitions its work by it so both meet on one partition."""
    return f"{_space_parts(scope)}|{subject}"


def reflection_id_for(scope: Scope, decision_id: str) -> str:
    """The one reflection id a decision can ever have (``refl-`` + 32 hex digits)."""
    return "refl-" + uuid.uuid5(_NAMESPACE, "reflection:" + decision_key(scope, decision_id)).hex


def reflection_event_id(scope: Scope, decision_id: str) -> uuid.UUID:
    """The event id of a decision's ``MemoryReflected``: a retried emission is a copy."""
    return uuid.uuid5(_NAMESPACE, "MemoryReflected:" + decision_key(scope, decision_id))


def expiry_event_id(scope: Scope, decision_id: str) -> uuid.UUID:
    """The event id of a decision's ``DecisionExpired``."""
    return uuid.uuid5(_NAMESPACE, "DecisionExpired:" + decision_key(scope, decision_id))


def provider_outcome_id(source: str, scope: Scope, decision_id: str) -> str:
    """The outcome id an outcome provider gives the outcome it computes for a decision,
    so polling the provider again yields the same outcome, not a second one."""
    return f"{source}-" + uuid.uuid5(_NAMESPACE, f"outcome:{source}:" + decision_key(scope, decision_id)).hex


def provider_outcome_event_id(source: str, scope: Scope, decision_id: str) -> uuid.UUID:
    return uuid.uuid5(_NAMESPACE, f"OutcomeObserved:{source}:" + decision_key(scope, decision_id))
