"""What every HTTP handler does around the service: find it on the app, parse an
event or a log position from the request, append and wait, each failure answered in
the one error shape."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from aiokafka.errors import KafkaError
from fastapi import Request

from memstream.domain.events import EventBase, EventValidationError, build_event, parse_event
from memstream.domain.log import LogPosition
from memstream.domain.reflection import parse_rating
from memstream.interfaces.api_models import Accepted
from memstream.interfaces.errors import ApiError
from memstream.interfaces.service import (
    MemoryService,
    PositionBeyondLog,
    PositionNotReached,
    UnknownTopicError,
    check_request_values,
)
from memstream.codec.wire import EncodeError

__all__ = ["utc", "event_from", "rating", "positions", "check_ids", "service_of", "service_in", "append", "wait_for_positions"]

log = logging.getLogger("memstream.api")


def utc(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def event_from(raw: dict[str, Any], cls: type[EventBase] | None = None) -> EventBase:
    """A client's event as sent (``parse_event``), or a new ``cls`` event built from
    ``raw`` (``build_event``, the one constructor)."""
    try:
        return parse_event(raw) if cls is None else build_event(cls, **raw)
    except EventValidationError as exc:
        raise ApiError(422, "invalid_event", exc.reason) from None


def rating(text: str) -> str:
    """Ratings are read leniently ("Strong Buy", "Rating: overweight"), as in the SDK."""
    try:
        return parse_rating(text).value
    except ValueError as exc:
        raise ApiError(422, "invalid_event", f"rating: {exc}") from None


def positions(values: list[str]) -> list[LogPosition]:
    out = []
    for text in values:
        try:
            out.append(LogPosition.parse(text))
        except ValueError:
            raise ApiError(
                422, "validation_error", f"min_position {text!r} is not topic:partition:offset"
            ) from None
    return out


def check_ids(**values: str) -> None:
    """Ids a read names in its path or query, checked as events check them (422)."""
    try:
        check_request_values(**values)
    except ValueError as exc:
        raise ApiError(422, "validation_error", str(exc)) from None


def service_of(request: Request) -> MemoryService:
    return service_in(request.app)


def service_in(app: Any) -> MemoryService:
    """The app's running service (503 while it starts or stops)."""
    service: MemoryService | None = getattr(app.state, "service", None)
    if service is None or service.producer is None:
        raise ApiError(503, "unavailable", "the API server is starting or stopping")
    return service


async def append(service: MemoryService, event: EventBase) -> Accepted:
    try:
        position = await service.append(event, interface="api")
    except EncodeError as exc:
        raise ApiError(422, "invalid_event", str(exc)) from None
    except KafkaError as exc:
        log.warning("Kafka did not acknowledge %s %s: %s", event.type, event.event_id, exc)
        raise ApiError(
            503, "unavailable", "Kafka did not acknowledge the event; it may not be written, retry (the event id makes a retry safe)",
            {"event_id": str(event.event_id)}, headers={"Retry-After": "1"},
        ) from None
    return Accepted(event_id=str(event.event_id), position=str(position))


async def wait_for_positions(service: MemoryService, positions: list[LogPosition], wait_s: float | None) -> None:
    try:
        await service.wait_for(positions, wait_s)
    except UnknownTopicError as exc:
        raise ApiError(422, "validation_error", f"min_position: {exc}") from None
    except PositionBeyondLog as exc:
        raise ApiError(
            409, "position_beyond_log", str(exc),
            {"requested": str(exc.requested), "end_offset": exc.end_offset},
        ) from None
    except PositionNotReached as exc:
        raise ApiError(
            409,
            "position_not_reached",
            str(exc),
            {"requested": str(exc.requested), "stored_offset": exc.reached, "waited_s": round(exc.waited_s, 3)},
            headers={"Retry-After": "1"},
        ) from None
