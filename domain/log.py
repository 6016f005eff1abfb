"""Positions in the log: where an event was read from, so views can store how far they got.

A projection stores, per (topic, partition), the *next* offset to read. Applying the
records below that offset again must change nothing (idempotence), so a restart from
the stored position converges to the same state as an uninterrupted run.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from memstream.domain.events import EventBase

__all__ = ["LogPosition", "PositionedEvent"]


class LogPosition(BaseModel):
    """One record's place in the log: topic, partition, offset."""

    model_config = ConfigDict(frozen=True)

    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)

    def __str__(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    @classmethod
    def parse(cls, text: str) -> "LogPosition":
        """Inverse of ``str()``: ``topic:partition:offset`` (Kafka topic names hold no
        colon). Raises ``ValueError`` naming the expected form."""
        parts = text.rsplit(":", 2)
        if len(parts) != 3 or not parts[0] or not all(p.isascii() and p.isdigit() for p in parts[1:]):
            raise ValueError(f"log position {text[:80]!r} is not topic:partition:offset")
        return cls(topic=parts[0], partition=int(parts[1]), offset=int(parts[2]))


class PositionedEvent(BaseModel):
    """A decoded event together with the log position it was read from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    position: LogPosition
    event: EventBase
