"""The topic catalogue: names (from a configurable prefix), partitions and retention.

``memstream.events`` and ``memstream.messages`` are the source of truth: kept forever
(``retention.ms=-1``, ``cleanup.policy=delete`` so nothing is compacted away). With
sealing on they hold sealed records only; producers that cannot seal write plaintext
to ``memstream.ingress`` (finite retention), which the worker seals into them.
``memstream.keys`` holds the wrapped data keys, compacted so that a forgotten key
leaves the broker's disk within a bound (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memstream.domain.events import (
    DecisionRecorded,
    EventBase,
    MessageObserved,
    OutcomeObserved,
)
from memstream.settings import BrokerSettings

__all__ = ["KEYS_SEGMENT_MS", "SHORT_NAMES", "TopicSpec", "Topics", "topic_for", "topic_for_type", "keys_topic_config"]

SHORT_NAMES = ("events", "messages", "pending-reflections", "outcomes", "dead-letter", "ingress", "keys")
"""Every catalogue topic's name without the prefix (what commands accept)."""

_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
_WEEK_MS = 7 * 24 * 3600 * 1000
KEYS_SEGMENT_MS = 60_000
"""Segment roll of the key topic: a forgotten key leaves the broker's disk about a
minute later (docs/security.md), at the cost of a small segment a minute."""


def _finite(retention_ms: int) -> dict[str, str]:
    """Retention deletes whole segments, so segments roll at a seventh of it: a record
    is gone at most ``retention_ms`` plus a seventh (plus the broker's retention check,
    5 minutes by default) after it was written."""
    segment_ms = max(60_000, retention_ms // 7)
    return {"retention.ms": str(retention_ms), "segment.ms": str(segment_ms), "retention.bytes": "-1", "cleanup.policy": "delete"}


def keys_topic_config(segment_ms: int) -> dict[str, str]:
    """A tombstoned key is gone from disk once its segment rolled (at the next append
    after ``segment_ms``; the worker appends one), the cleaner ran (broker
    ``log.cleaner.backoff.ms``, 15 s by default) and the replaced files were deleted
    (``file.delete.delay.ms``)."""
    return {
        "cleanup.policy": "compact",
        "segment.ms": str(segment_ms),
        "max.compaction.lag.ms": str(segment_ms),
        "min.compaction.lag.ms": "0",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": str(10 * segment_ms),
        "file.delete.delay.ms": "1000",
    }


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
    ingress_retention_ms: int = _WEEK_MS
    keys_segment_ms: int = KEYS_SEGMENT_MS

    @classmethod
    def from_settings(cls, broker: BrokerSettings) -> "Topics":
        return cls(
            broker.topic_prefix,
            broker.partitions,
            broker.replication_factor,
            broker.ingress_retention_ms,
        )

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

    @property
    def ingress(self) -> str:
        return f"{self.prefix}ingress"

    @property
    def keys(self) -> str:
        return f"{self.prefix}keys"

    def resolve(self, name: str) -> str:
        """A topic argument as given on a command line: a catalogue short name
        (``ingress``, ``events``, ``dead_letter``...) gets the prefix; any other name
        is taken as the full topic name."""
        given = name.strip()
        short = given.replace("_", "-")
        if short in SHORT_NAMES:
            return f"{self.prefix}{short}"
        return given

    def kept_forever(self) -> list[str]:
        """The topics replay reads: sealed when sealing is on."""
        return [self.events, self.messages, self.pending_reflections, self.outcomes]

    def catalogue(self) -> list[TopicSpec]:
        """Every topic memstream needs. The log keeps its data forever (pending decisions
        must never be dropped by retention); the plaintext ingress and the dead letters
        (which keep a record's original bytes) only for ``ingress_retention_ms``."""
        rf, p = self.replication_factor, self.partitions
        return [
            *(TopicSpec(name, p, rf, dict(_FOREVER)) for name in self.kept_forever()),
            TopicSpec(self.dead_letter, 1, rf, _finite(self.ingress_retention_ms)),
            TopicSpec(self.ingress, p, rf, _finite(self.ingress_retention_ms)),
            TopicSpec(self.keys, 1, rf, keys_topic_config(self.keys_segment_ms)),
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


def topic_for_type(event_type: str, topics: Topics) -> str:
    """:func:`topic_for` by type name (for records that are not decoded, e.g. the
    sealer's ingress records)."""
    if event_type == "MessageObserved":
        return topics.messages
    if event_type == "DecisionRecorded":
        return topics.pending_reflections
    if event_type == "OutcomeObserved":
        return topics.outcomes
    return topics.events
