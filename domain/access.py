"""The one scope rule: what a caller may read and write, and what a read is confined to.

memstream's isolation has three levels. A *memory space* is a team and a user (one
Kafka key, one partition); an *agent* narrows within it. Two types carry the rule
(docs/security.md describes the model in words):

* :class:`AccessScope` is what a key (a bank) may touch: one team, optionally one user
  and one agent. ``None`` means "any within the level above". A write's scope must lie
  inside it (:meth:`AccessScope.allows`); a read is confined to the
  :class:`ReadScope` it resolves to (:meth:`AccessScope.read_scope`).
* :class:`ReadScope` is what one read may see: a memory space, and optionally one
  agent in it. Every lookup of the projections (search, a memory by id, its source
  turns, links, entities, lessons, the extractor's dedup and candidate recall) takes
  one and filters by all of it. A plain event :class:`Scope` given to a read means the
  user's whole space (:func:`read_scope_of`); an agent-pinned key, an MCP bank with an
  agent and the extractor working on an agent's turns pass a pinned one.

The rule is pure (no I/O); the projections turn a :class:`ReadScope` into their filter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from memstream.domain.events import (
    DecisionRecorded,
    EventBase,
    Identifier,
    MemoryAdded,
    MemoryLinked,
    OutcomeObserved,
    Scope,
)
from memstream.domain.gate.quality import GateRule, injection_reason

__all__ = [
    "AccessScope",
    "ReadScope",
    "read_scope_of",
    "agent_pin",
    "owner_allows",
    "SYSTEM_EVENT_TYPES",
    "system_claim",
    "is_system_producer",
    "client_content_problem",
    "client_texts",
    "memory_texts",
    "memory_content_problem",
]

SYSTEM_EVENT_TYPES = frozenset({"MemoryReflected", "DecisionExpired", "SubjectForgotten"})
"""Event types only the worker writes (its reflector)."""
_SYSTEM_PRODUCER = re.compile(r"^\s*(memstream\s*[-.:/_ ]\s*)?(extractor|reflector|projector|worker)\b", re.IGNORECASE)


@dataclass(frozen=True)
class ReadScope:
    """What one read may see: the space ``team_id``/``user_id``, and only the rows of
    ``agent_id`` when it is set (``None``: every agent of the space)."""

    team_id: str
    user_id: str
    agent_id: str | None = None

    @classmethod
    def pinned(cls, scope: Scope) -> "ReadScope":
        """The rows of ``scope``'s own agent only (a lookup made on that agent's behalf)."""
        return cls(scope.team_id, scope.user_id, scope.agent_id)

    @property
    def space(self) -> str:
        return f"{self.team_id}/{self.user_id}"

    def covers(self, team_id: str, user_id: str, agent_id: str | None) -> bool:
        """Whether a row owned by (team, user, agent) is visible to this read."""
        return (
            team_id == self.team_id
            and user_id == self.user_id
            and (self.agent_id is None or agent_id == self.agent_id)
        )


def read_scope_of(scope: Scope | ReadScope) -> ReadScope:
    """A read's scope: itself, or for an event :class:`Scope` the user's whole space
    (its ``agent_id`` is a writer's default, not a read restriction)."""
    if isinstance(scope, ReadScope):
        return scope
    return ReadScope(scope.team_id, scope.user_id, None)


def agent_pin(scope: Scope | ReadScope) -> str | None:
    """The agent a read is confined to, if any."""
    return scope.agent_id if isinstance(scope, ReadScope) else None


class AccessScope(BaseModel):
    """What a bank (and so a key) may touch: one team, optionally one user and agent.

    ``None`` for user or agent means "any within the team"; the *default* scope used
    for writes that name no scope fills those with ``"default"``.
    """

    model_config = ConfigDict(frozen=True)

    team_id: Identifier
    user_id: Identifier | None = None
    agent_id: Identifier | None = None

    def allows(self, scope: Scope) -> bool:
        """True when ``scope`` (a write's, or a row's owner) lies inside this access scope."""
        return owner_allows(self, scope.team_id, scope.user_id, scope.agent_id)

    def default_scope(self) -> Scope:
        """The scope for a write that names none."""
        return Scope(
            team_id=self.team_id,
            user_id=self.user_id or "default",
            agent_id=self.agent_id or "default",
        )

    def resolve(self, user_id: str | None = None, agent_id: str | None = None) -> Scope:
        """The scope a request names, defaulted from this access scope. Raises
        ``PermissionError`` when the request names a user or agent outside it."""
        if self.user_id is not None and user_id is not None and user_id != self.user_id:
            raise PermissionError(f"this key is bound to user {self.user_id!r}")
        if self.agent_id is not None and agent_id is not None and agent_id != self.agent_id:
            raise PermissionError(f"this key is bound to agent {self.agent_id!r}")
        return Scope(
            team_id=self.team_id,
            user_id=user_id or self.user_id or "default",
            agent_id=agent_id or self.agent_id or "default",
        )

    def read_scope(self, user_id: str | None = None, agent_id: str | None = None) -> ReadScope:
        """The scope of a read this key makes: the named (or the key's) user's space,
        confined to the key's agent when it pins one (else to ``agent_id`` if named).
        Raises ``PermissionError`` for a user or agent outside the key's."""
        scope = self.resolve(user_id, agent_id)
        return ReadScope(scope.team_id, scope.user_id, self.agent_id or agent_id)

    def describe(self) -> str:
        parts = [f"team {self.team_id!r}"]
        if self.user_id is not None:
            parts.append(f"user {self.user_id!r}")
        if self.agent_id is not None:
            parts.append(f"agent {self.agent_id!r}")
        return ", ".join(parts)


def owner_allows(access: AccessScope, team_id: str, user_id: str, agent_id: str | None) -> bool:
    """Whether a caller with ``access`` may touch a row (or event) owned by
    (team, user, agent): the team matches, and the user and agent where it pins them."""
    if team_id != access.team_id:
        return False
    if access.user_id is not None and user_id != access.user_id:
        return False
    if access.agent_id is not None and agent_id != access.agent_id:
        return False
    return True


def system_claim(event: EventBase) -> str | None:
    """Why ``event`` is a *system* event, which only the worker may write, or ``None``
    for a client event (turns, memories, client links, decisions, outcomes).

    System: lessons (``MemoryReflected``) and expiries (``DecisionExpired``), judgment
    links (``decided_by: llm``), and any event whose ``producer`` names the worker's
    extractor, reflector or projector. Keys and SDK producers write client events only;
    the worker's records carry its producer identity (docs/security.md)."""
    if event.type in SYSTEM_EVENT_TYPES:
        return f"{event.type} events are written by the worker's reflector only"
    if isinstance(event, MemoryLinked) and event.decided_by == "llm":
        return "links decided by an LLM (decided_by: llm) are the worker's judgment links only"
    if event.producer and is_system_producer(event.producer):
        return f"producer {event.producer[:60]!r} names a part of the worker; clients cannot claim it"
    return None


def is_system_producer(producer: str) -> bool:
    """Whether a ``producer`` field names a part of the worker (extractor, reflector,
    projector, worker; with or without a ``memstream`` prefix)."""
    return _SYSTEM_PRODUCER.match(producer) is not None


def client_content_problem(event: EventBase) -> str | None:
    """Why a client event may not be stored, or ``None``: one of its texts that can
    reach a prompt (:func:`client_texts`) trips the quality gate's ``prompt_injection``
    rule. Turns are not refused here: they stay as evidence and the extractor's gate
    keeps them out of memory. Every path a client writes through asks this (HTTP, MCP,
    the SDK, and every consumer of Kafka for a record the worker did not sign)."""
    return _first_injection(client_texts(event))


def client_texts(event: EventBase) -> Iterator[tuple[str, str]]:
    """``(field, text)`` of every text of a client event that a prompt may quote: a
    memory's content, scene and metadata (search and MCP tools return them to agents),
    a decision's text (the reflection prompt and every lesson quote it), a link's
    reason and an outcome's source. Turns (``MessageObserved``) are not listed."""
    if isinstance(event, MemoryAdded):
        yield from memory_texts(event.content, event.scene, event.metadata)
    elif isinstance(event, DecisionRecorded):
        yield "decision_text", event.decision_text
    elif isinstance(event, MemoryLinked):
        if event.reason:
            yield "reason", event.reason
    elif isinstance(event, OutcomeObserved):
        yield "source", event.source


def memory_texts(content: str, scene: str | None, metadata: Mapping[str, Any] | None) -> Iterator[tuple[str, str]]:
    """The texts of a memory a prompt may quote (also read from the projector's fast
    path, which has the values but no event): content, scene, and every string of
    its metadata, keys included."""
    yield "content", content
    if scene:
        yield "scene", scene
    if metadata:
        stack: list[Any] = [metadata]
        while stack:  # no recursion: metadata may nest deeply
            item = stack.pop()
            if isinstance(item, str):
                yield "metadata", item
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)


def memory_content_problem(content: str, scene: str | None, metadata: Mapping[str, Any] | None) -> str | None:
    """:func:`client_content_problem` of a memory given by its values."""
    return _first_injection(memory_texts(content, scene, metadata))


def _first_injection(texts: Iterable[tuple[str, str]]) -> str | None:
    for name, text in texts:
        reason = injection_reason(text)
        if reason is not None:
            return f"{GateRule.prompt_injection.value}: {name}: {reason}"
    return None
