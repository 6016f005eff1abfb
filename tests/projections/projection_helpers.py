"""Builders shared by the projection tests: positioned events by hand (no Kafka needed
to test the projector), a counting embedder wrapper, and a few scopes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from memstream.domain.embedding import encode_vector
from memstream.domain.events import (
    EmbeddingPayload,
    Entity,
    EventBase,
    MemoryAdded,
    MemoryLinked,
    Scope,
)
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.projections.embedders.factory import Embedder, LocalEmbedder

__all__ = [
    "DIM",
    "EVENTS_TOPIC",
    "T0",
    "CountingEmbedder",
    "positioned",
    "memory",
    "link",
    "carried",
]

DIM = 32
EVENTS_TOPIC = "test.events"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


class CountingEmbedder:
    """Wraps an embedder and records every ``embed`` call (how many, which texts)."""

    def __init__(self, inner: Embedder | None = None) -> None:
        self.inner = inner or LocalEmbedder(DIM)
        self.model_id = self.inner.model_id
        self.dim = self.inner.dim
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return self.inner.embed(texts)


def positioned(
    events: Iterable[EventBase], *, topic: str = EVENTS_TOPIC, partition: int = 0, start: int = 0
) -> list[PositionedEvent]:
    """Events at consecutive offsets from ``start``, as the worker would read them."""
    return [
        PositionedEvent(position=LogPosition(topic=topic, partition=partition, offset=start + i), event=e)
        for i, e in enumerate(events)
    ]


def memory(scope: Scope, memory_id: str, content: str, **fields: Any) -> MemoryAdded:
    fields.setdefault("occurred_at", T0)
    fields.setdefault("recorded_at", T0)
    if "entities" in fields:
        fields["entities"] = tuple(
            e if isinstance(e, Entity) else Entity(name=e[0], kind=e[1]) for e in fields["entities"]
        )
    return MemoryAdded(scope=scope, memory_id=memory_id, content=content, **fields)


def link(scope: Scope, src: str, dst: str, relation: str, **fields: Any) -> MemoryLinked:
    fields.setdefault("occurred_at", T0 + timedelta(seconds=1))
    return MemoryLinked(scope=scope, from_memory_id=src, to_memory_id=dst, relation=relation, **fields)


def carried(vector: Sequence[float], model: str) -> EmbeddingPayload:
    return EmbeddingPayload(model=model, dim=len(vector), data=encode_vector(list(vector)))
