"""The HTTP API's writes: any event, and the shortcuts for a memory, conversation
turns and a decision. Each answers 202 only after Kafka acknowledged the event."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import TypeAdapter

from memstream.banks import Principal
from memstream.domain.events import (
    DecisionRecorded,
    Event,
    EventValidationError,
    MemoryAdded,
    MessageObserved,
    Scope,
    build_event,
)
from memstream.interfaces.api_auth import Caller
from memstream.interfaces.api_models import (
    Accepted,
    DecisionAccepted,
    DecisionIn,
    MemoryAccepted,
    MemoryIn,
    MessagesAccepted,
    MessagesIn,
    ScopeIn,
)
from memstream.interfaces.api_requests import append, event_from, rating, service_in, service_of, utc
from memstream.interfaces.errors import ERROR_RESPONSES, ApiError, ErrorResponse
from memstream.interfaces.guards import check_client_event, check_owners, forbidden, write_scope
from memstream.interfaces.service import default_deadline
from memstream.streams.producers.producer import ProduceError
from memstream.codec.wire import EncodeError

__all__ = ["router", "EVENT_SCHEMA", "write_memory", "write_messages"]

router = APIRouter()

EVENT_SCHEMA: dict[str, Any] = TypeAdapter(Event).json_schema(ref_template="#/components/schemas/{model}")


def _scope_of(principal: Principal, scope: ScopeIn | None) -> Scope:
    if scope is None:
        return write_scope(principal, None, None, None)
    return write_scope(principal, scope.team_id, scope.user_id, scope.agent_id)


@router.post(
    "/v1/events",
    status_code=202,
    response_model=Accepted,
    responses={**ERROR_RESPONSES, 200: {"model": MemoryAccepted, "description": "A duplicate: this scope already holds this content (written without a memory_id); nothing was written."},
                     409: {"model": ErrorResponse, "description": "The memory id belongs to another agent."}},
    tags=["write"],
    summary="Append any event (validated; upcast from older schema versions)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {k: v for k, v in EVENT_SCHEMA.items() if k != "$defs"}}},
        }
    },
)
async def post_event(request: Request, principal: Caller) -> Accepted:
    try:
        raw = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(422, "validation_error", f"body is not JSON: {exc}") from None
    except RecursionError:
        raise ApiError(422, "validation_error", "the JSON body is nested too deeply") from None
    if not isinstance(raw, dict):
        raise ApiError(422, "invalid_event", f"event must be a JSON object, got {type(raw).__name__}")
    if raw.get("scope") in (None, {}):
        raw["scope"] = principal.access.default_scope().model_dump()
    raw.setdefault("producer", f"api:{principal.bank.name}")
    event = event_from(raw)
    if not principal.access.allows(event.scope):
        raise forbidden(principal, f"scope {event.scope.model_dump()}")
    check_client_event(event)
    service = service_of(request)
    await check_owners(service, principal, event)
    return await append(service, event)

@router.post("/v1/memories", status_code=202, response_model=MemoryAccepted,
          responses={**ERROR_RESPONSES, 200: {"model": MemoryAccepted, "description": "A duplicate: this scope already holds this content (written without a memory_id); nothing was written."},
                     409: {"model": ErrorResponse, "description": "The memory id belongs to another agent."}},
          tags=["write"],
          summary="Add one memory (a MemoryAdded event)")
async def post_memory(body: MemoryIn, request: Request, response: Response, principal: Caller) -> MemoryAccepted:
    # served by ``lean_writes`` at run time; declared here for the spec and as the fallback
    accepted = await write_memory(request.app, principal, body)
    if accepted.duplicate:
        response.status_code = 200
    return accepted


async def write_memory(app: Any, principal: Principal, body: MemoryIn) -> MemoryAccepted:
    """``POST /v1/memories`` once the body is valid and the caller known. Without a
    ``memory_id`` the id follows from the content and the exact scope: a memory the
    view already holds is answered as a duplicate (nothing written); one written again
    before it is projected gets the same id, which the projection folds into one row."""
    scope = _scope_of(principal, body.scope)
    running = getattr(app.state, "service", None)  # None: service_in answers 503 below, after the input checks
    raw = body.model_dump(exclude={"scope"}, exclude_none=True, mode="json")
    raw.update(
        scope=scope.model_dump(),
        memory_id=body.memory_id or (running.content_memory_id(scope, body.content) if running else uuid.uuid4().hex),
        producer=f"api:{principal.bank.name}",
        provenance={"method": "api", "note": f"POST /v1/memories, bank {principal.bank.name}"},
    )
    for name in ("source_message_ids", "entities", "metadata"):
        if not raw.get(name):
            raw.pop(name, None)
    event = event_from(raw, MemoryAdded)
    check_client_event(event)
    service = service_in(app)
    if body.memory_id is None and await service.memory_owner(event.scope, event.memory_id) == event.scope.agent_id:
        stored = await service.stored_memory(event.scope, event.memory_id)  # a duplicate: the rare path reads its row
        if stored is not None:
            return MemoryAccepted(memory_id=event.memory_id, event_id=stored[0], position=str(stored[1]), duplicate=True)
    await check_owners(service, principal, event)
    accepted = await append(service, event)
    return MemoryAccepted(memory_id=raw["memory_id"], event_id=accepted.event_id, position=accepted.position)


@router.post("/v1/messages", status_code=202, response_model=MessagesAccepted, responses=ERROR_RESPONSES, tags=["write"],
          summary="Append conversation turns (MessageObserved) for the extractor")
async def post_messages(body: MessagesIn, request: Request, principal: Caller) -> MessagesAccepted:
    # served by ``lean_writes`` at run time; declared here for the spec and as the fallback
    return await write_messages(request.app, principal, body)


async def write_messages(app: Any, principal: Principal, body: MessagesIn) -> MessagesAccepted:
    """``POST /v1/messages`` once the body is valid and the caller known."""
    scope = _scope_of(principal, body.scope)
    events = []
    for i, turn in enumerate(body.messages):
        raw = turn.model_dump(exclude_none=True, mode="json")
        if not raw.get("metadata"):
            raw.pop("metadata", None)
        raw.update(
            scope=scope.model_dump(),
            message_id=turn.message_id or uuid.uuid4().hex,
            producer=f"api:{principal.bank.name}",
        )
        if body.session_id is not None:
            raw["session_id"] = body.session_id
        try:
            events.append(build_event(MessageObserved, **raw))
        except EventValidationError as exc:
            raise ApiError(422, "invalid_event", f"messages.{i}: {exc.reason}") from None
    service = service_in(app)
    try:
        positions = await service.append_many(events, interface="api")
    except EncodeError as exc:
        raise ApiError(422, "invalid_event", str(exc)) from None
    except ProduceError as exc:
        raise ApiError(503, "unavailable", f"Kafka did not acknowledge every turn: {exc}") from None
    accepted = [Accepted(event_id=str(e.event_id), position=str(p)) for e, p in zip(events, positions)]
    return MessagesAccepted(events=accepted, position=accepted[-1].position)

@router.post("/v1/decisions", status_code=202, response_model=DecisionAccepted, responses=ERROR_RESPONSES, tags=["write"],
          summary="Record a pending decision (DecisionRecorded) for reflection")
async def post_decision(body: DecisionIn, request: Request, principal: Caller) -> DecisionAccepted:
    scope = _scope_of(principal, body.scope)
    occurred = body.occurred_at or datetime.now(timezone.utc)
    raw = body.model_dump(exclude={"scope"}, exclude_none=True, mode="json")
    raw.update(
        scope=scope.model_dump(),
        decision_id=body.decision_id or uuid.uuid4().hex,
        rating=rating(body.rating),
        occurred_at=occurred.isoformat(),
        deadline=utc(body.deadline or default_deadline(occurred, body.horizon_days)),
        producer=f"api:{principal.bank.name}",
    )
    event = event_from(raw, DecisionRecorded)
    assert isinstance(event, DecisionRecorded)
    check_client_event(event)
    accepted = await append(service_of(request), event)
    return DecisionAccepted(decision_id=raw["decision_id"], deadline=event.deadline, **accepted.model_dump())
