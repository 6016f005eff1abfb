"""The topic catalogue: names (from a configurable prefix), partitions and retention.

``memstream.events`` and ``memstream.messages`` are the source of truth: kept forever
(``retention.ms=-1``, ``cleanup.policy=delete`` so nothing is compacted away).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memstream.domain.events import (
    DecisionRecorded,
    EventBase,
    MessageObserved,
    OutcomeObserved,
)
from memstream.settings import Settings

__all__ = ["TopicSpec", "Topics", "topic_for"]

_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Topics:
    """Resolved topic names for one deployment."""

    prefix: str = "memstream."
    partitions: int = 3
    replication_factor: int = 1

    @classmethod
    def from_settings(cls, settings: Settings) -> "Topics":
        return cls(settings.topic_prefix, settings.partitions, settings.replication_factor)

    @property
    def messages(self) -> str:
        return f"{self.prefix}messages"

    @property
    def events(self) -> str:
        return f"{self.prefix}events"

    @property
    def pending_reflections(self) -> str:
        return f"{self.prefix}pending-reflections"

    @property
    def outcomes(self) -> str:
        return f"{self.prefix}outcomes"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}dead-letter"

    def catalogue(self) -> list[TopicSpec]:
        """Every topic memstream needs. All keep their data forever: pending decisions
        must never be dropped by retention, and dead letters are evidence."""
        rf, p = self.replication_factor, self.partitions
        return [
            TopicSpec(self.events, p, rf, dict(_FOREVER)),
            TopicSpec(self.messages, p, rf, dict(_FOREVER)),
            TopicSpec(self.pending_reflections, p, rf, dict(_FOREVER)),
            TopicSpec(self.outcomes, p, rf, dict(_FOREVER)),
            TopicSpec(self.dead_letter, 1, rf, dict(_FOREVER)),
        ]


def topic_for(event: EventBase, topics: Topics) -> str:
    """Where an event belongs by default: turns feed the extractor, decisions and
    outcomes feed the reflector, everything else (memories, links, reflections,
    expiries) is a memory-log event that the projector turns into views."""
    if isinstance(event, MessageObserved):
        return topics.messages
    if isinstance(event, DecisionRecorded):
        return topics.pending_reflections
    if isinstance(event, OutcomeObserved):
        return topics.outcomes
    return topics.events
