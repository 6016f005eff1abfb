"""The typed front door of the producer SDK: one method per event a client writes
(a memory, a turn, a decision, an outcome), each building its event with
:func:`~memstream.domain.events.build_event` and sending it through the producer's
durable path (:class:`memstream.streams.producers.producer.MemstreamProducer`)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from memstream.domain.events import (
    DecisionRecorded,
    EventBase,
    EventValidationError,
    MemoryAdded,
    MessageObserved,
    OutcomeObserved,
    Scope,
    build_event,
)
from memstream.domain.extraction.dedup import content_memory_id
from memstream.domain.log import LogPosition
from memstream.domain.reflection import RatingParseError, parse_rating

__all__ = ["Sent", "TypedWrites"]

E = TypeVar("E", bound=EventBase)


@dataclass(frozen=True)
class Sent(Generic[E]):
    """An event the broker acknowledged, and where it landed (for read-your-writes:
    a view that reached ``position`` holds the event)."""

    event: E
    position: LogPosition

    def __str__(self) -> str:
        """``topic:partition:offset``, what a log line about a write wants to show."""
        return str(self.position)


def _scope_input(scope: Scope | Mapping[str, Any]) -> Scope | dict[str, Any]:
    """A Scope, or a plain mapping that validation turns into one (with the same
    one-line errors as any other field)."""
    return scope if isinstance(scope, Scope) else dict(scope)


def _new_id() -> str:
    return uuid.uuid4().hex


class TypedWrites:
    """The typed writes of :class:`~memstream.streams.producers.producer.MemstreamProducer`
    (which provides ``send``, ``client_id`` and the key that derives a memory's id)."""

    client_id: str
    _id_key: bytes | None

    async def send(self, event: EventBase, *, topic: str | None = None) -> LogPosition:
        raise NotImplementedError

    def _build(self, cls: type[E], scope: Scope | Mapping[str, Any], fields: dict[str, Any]) -> E:
        given = {k: v for k, v in fields.items() if v is not None}  # None: the model's default
        return build_event(cls, **{"scope": _scope_input(scope), "producer": self.client_id, **given})

    async def _send_built(self, event: E, topic: str | None) -> Sent[E]:
        return Sent(event=event, position=await self.send(event, topic=topic))

    async def add_memory(
        self,
        scope: Scope | Mapping[str, Any],
        content: str,
        *,
        memory_id: str | None = None,
        topic: str | None = None,
        **fields: Any,
    ) -> Sent[MemoryAdded]:
        """Write one memory (``MemoryAdded``); ``fields`` are any of its other fields
        (``memory_type``, ``priority``, ``scene``, ``entities``, ``metadata``, ...).
        Raises :class:`~memstream.domain.events.EventValidationError` for bad input."""
        if memory_id is None and self._id_key is not None:  # the same content in one scope: one memory
            with contextlib.suppress(ValueError):  # a bad scope: building the event says why
                memory_id = content_memory_id(Scope.model_validate(_scope_input(scope)), content, self._id_key)
        event = self._build(MemoryAdded, scope, {"memory_id": memory_id or _new_id(), "content": content, **fields})
        return await self._send_built(event, topic)

    async def observe_message(
        self,
        scope: Scope | Mapping[str, Any],
        message_id: str,
        content: str,
        *,
        role: str = "user",
        speaker: str | None = None,
        session_id: str | None = None,
        topic: str | None = None,
        **fields: Any,
    ) -> Sent[MessageObserved]:
        """Write one conversation turn (``MessageObserved``) for the extractor."""
        event = self._build(
            MessageObserved,
            scope,
            {
                "message_id": message_id,
                "content": content,
                "role": role,
                "speaker": speaker,
                "session_id": session_id,
                **fields,
            },
        )
        return await self._send_built(event, topic)

    async def record_decision(
        self,
        scope: Scope | Mapping[str, Any],
        decision_id: str,
        subject: str,
        rating: str,
        decision_text: str,
        deadline: datetime,
        *,
        horizon_days: int = 5,
        topic: str | None = None,
        **fields: Any,
    ) -> Sent[DecisionRecorded]:
        """Write a pending decision (``DecisionRecorded``) that waits for its outcome.

        ``rating`` is read leniently ("Strong Buy", "Rating: Overweight", "neutral"; see
        :func:`memstream.domain.reflection.parse_rating`); the event carries the exact
        5-level value."""
        try:
            rating = parse_rating(rating).value
        except RatingParseError as exc:
            raise EventValidationError(f"rating: {exc.reason}") from None
        event = self._build(
            DecisionRecorded,
            scope,
            {
                "decision_id": decision_id,
                "subject": subject,
                "rating": rating,
                "decision_text": decision_text,
                "deadline": deadline,
                "horizon_days": horizon_days,
                **fields,
            },
        )
        return await self._send_built(event, topic)

    async def observe_outcome(
        self,
        scope: Scope | Mapping[str, Any],
        outcome_id: str,
        subject: str,
        raw_return: float,
        horizon_days: int,
        *,
        decision_id: str | None = None,
        benchmark_return: float | None = None,
        topic: str | None = None,
        **fields: Any,
    ) -> Sent[OutcomeObserved]:
        """Write an observed outcome (``OutcomeObserved``); settles matching decisions."""
        event = self._build(
            OutcomeObserved,
            scope,
            {
                "outcome_id": outcome_id,
                "subject": subject,
                "raw_return": raw_return,
                "horizon_days": horizon_days,
                "decision_id": decision_id,
                "benchmark_return": benchmark_return,
                **fields,
            },
        )
        return await self._send_built(event, topic)
