"""Positions in the log: where an event was read from, so views can store how far they got.

A projection stores, per (topic, partition), the *next* offset to read. Applying the
records below that offset again must change nothing (idempotence), so a restart from
the stored position converges to the same state as an uninterrupted run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from memstream.domain.events import EventBase

__all__ = ["LogPosition", "PositionedEvent", "MemoryAddedFields", "PositionedMemories"]


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


class MemoryAddedFields(NamedTuple):
    """The values of a valid ``MemoryAdded`` event as the model holds them (times in
    UTC, ``event_id`` as canonical text, defaults filled in), without the model
    object: what the fast read path (``memstream.streams.fast_decode``) produces."""

    event_id: str
    occurred_at: datetime
    recorded_at: datetime
    team_id: str
    user_id: str
    agent_id: str
    session_id: str | None
    memory_id: str
    content: str
    content_hash: str
    memory_type: str
    priority: int
    scene: str | None
    source_message_ids: list[str]
    timestamp: datetime | None
    timestamp_start: datetime | None
    timestamp_end: datetime | None
    entities: list[tuple[str, str]]
    """``(name, kind)``, the kind as the model maps it."""
    metadata: dict[str, Any]
    provenance: dict[str, Any] | None
    """As the model dumps it (``model_dump(mode="json")``), defaults included."""
    embedding_data: bytes
    """The vector as little-endian float32 bytes (``dim * 4``); empty when the event
    carries no vector (the reader embeds its content)."""


@dataclass
class PositionedMemories:
    """``MemoryAdded`` events read on the fast path, column-friendly: row ``i`` is
    ``fields[i]`` read at ``positions[i]`` (topic, partition, offset), with the
    finite vector ``vectors[i]`` of embedding model ``model``.

    ``unembedded`` lists the rows whose event carried no vector: their row of
    ``vectors`` is zeros until the reader embeds the content and fills it in."""

    model: str
    positions: list[tuple[str, int, int]] = field(default_factory=list)
    fields: list[MemoryAddedFields] = field(default_factory=list)
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    unembedded: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.positions)

    @classmethod
    def concat(cls, parts: "list[PositionedMemories]") -> "PositionedMemories | None":
        """Several batches' memories as one (``None`` when there are none)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        if len({p.model for p in parts}) != 1:
            raise ValueError("memories of different embedding models cannot be merged")
        positions: list[tuple[str, int, int]] = []
        fields: list[MemoryAddedFields] = []
        unembedded: list[int] = []
        for p in parts:
            unembedded.extend(len(positions) + i for i in p.unembedded)
            positions.extend(p.positions)
            fields.extend(p.fields)
        return cls(
            model=parts[0].model,
            positions=positions,
            fields=fields,
            vectors=np.concatenate([p.vectors for p in parts]),
            unembedded=unembedded,
        )
