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
    model_config = ConfigDict(frozen=True)

    topic: str
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)

    def __str__(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    @classmethod
    def parse(cls, text: str) -> "LogPosition":
        """Inverse of ``str()``: ``topic:partition:offset`` (topic names hold no colon)."""
        topic, partition, offset = text.rsplit(":", 2)
        return cls(topic=topic, partition=int(partition), offset=int(offset))


class PositionedEvent(BaseModel):
    """A decoded event together with the log position it was read from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    position: LogPosition
    event: EventBase
