"""The HTTP API: write events, search and read memories, under tenant-bound API keys.

Shape of the contract (the committed spec is ``docs/openapi.json``; regenerate it with
``python -m memstream.interfaces.api --openapi > docs/openapi.json``):

* **Auth**: ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. A key is bound to
  one memory bank (:mod:`memstream.banks`). No key or an unknown key: 401. A scope
  outside the key's bank (another team, or another user/agent when the bank pins
  one): 403. A key of team A never reads or writes team B.
* **Writes** (``POST /v1/events``, ``/v1/memories``, ``/v1/messages``,
  ``/v1/decisions``) answer 202 only after Kafka acknowledged the event (durable), with
  ``{event_id, position}``: ``position`` is ``topic:partition:offset``. An invalid body
  is a 422 with the reason, and nothing is written.
* **Reads** (``GET /v1/search``, ``/v1/memories/{id}``, ``/v1/lessons``) are eventually
  consistent. Pass a write's ``position`` as ``min_position`` and the read waits
  (at most ``read_wait_max_s``) until the projection has applied it; if it has not by
  then the answer is a 409 ``position_not_reached`` (with ``Retry-After``), never
  silently stale data.
* **Errors** all have one shape: ``{"error": {"code", "message", "details"}}``.
* ``GET /healthz`` and ``GET /metrics`` (Prometheus) need no key; MCP over streamable
  HTTP is served at ``/mcp`` for the bank of the presented key.

Keys are never logged: they travel only in headers, and only their hash is compared.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from aiokafka.errors import KafkaError
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from mcp.server.mcpserver import MCPServer
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.routing import Route
from starlette.types import Receive, Scope as AsgiScope, Send

from memstream import __version__
from memstream.banks import BankConfigError, Principal, RegistrySource
from memstream.domain.events import (
    MAX_MEMORY_CHARS,
    MAX_MESSAGE_CHARS,
    DecisionRecorded,
    Event,
    EventBase,
    EventValidationError,
    Scope,
    parse_event,
)
from memstream.domain.log import LogPosition
from memstream.domain.reflection import parse_rating
from memstream import metrics
from memstream.interfaces.errors import (
    ERROR_RESPONSES,
    ApiError,
    ErrorResponse,
    error_body,
    install_error_handlers,
)
from memstream.interfaces.guards import check_client_event, check_owners, forbidden, read_scope
from memstream.interfaces.mcp_server import build_mcp_server
from memstream.interfaces.ratelimit import RateLimiter
from memstream.interfaces.service import (
    MemoryService,
    PositionBeyondLog,
    PositionNotReached,
    UnknownTopicError,
    check_request_values,
    default_deadline,
    lessons_payload,
    memory_payload,
    search_filters,
    search_hit_payload,
)
from memstream.settings import Settings
from memstream.streams.producer import ProduceError
from memstream.streams.serializer import EncodeError

__all__ = ["create_api", "openapi_spec", "main"]

log = logging.getLogger("memstream.api")

# --- request and response models ---------------------------------------------------------


class ScopeIn(BaseModel):
    """A scope in a shortcut request. Omitted parts default from the key's bank."""

    model_config = ConfigDict(extra="forbid")

    team_id: str | None = None
    user_id: str | None = None
    agent_id: str | None = None


class EntityIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str = "other"


class MemoryIn(BaseModel):
    """``POST /v1/memories``: one memory, written as a ``MemoryAdded`` event."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(max_length=MAX_MEMORY_CHARS, description="The memory: one self-contained statement.")
    memory_id: str | None = Field(default=None, description="Your id for the memory; generated when omitted.")
    memory_type: str = Field(default="episodic", description="persona, episodic, instruction, work_fact, work_task, work_method or work_artifact.")
    priority: int = Field(default=50, ge=0, le=100)
    scene: str | None = None
    session_id: str | None = None
    task_id: str | None = None
    source_message_ids: list[str] = Field(default_factory=list)
    entities: list[EntityIn] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    timestamp: datetime | None = Field(default=None, description="When the remembered thing happened (ISO 8601 with offset).")
    timestamp_start: datetime | None = None
    timestamp_end: datetime | None = None
    occurred_at: datetime | None = None
    scope: ScopeIn | None = None


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str = Field(max_length=MAX_MESSAGE_CHARS)
    role: Literal["user", "assistant", "system", "tool"] = "user"
    message_id: str | None = Field(default=None, description="Generated when omitted.")
    speaker: str | None = None
    occurred_at: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class MessagesIn(BaseModel):
    """``POST /v1/messages``: conversation turns (L0) for the extractor, in order."""

    model_config = ConfigDict(extra="forbid")

    messages: list[MessageIn] = Field(min_length=1, max_length=500)
    session_id: str | None = None
    scope: ScopeIn | None = None


class DecisionIn(BaseModel):
    """``POST /v1/decisions``: a decision whose outcome is not known yet."""

    model_config = ConfigDict(extra="forbid")

    subject: str = Field(description="What the decision is about, e.g. a ticker.")
    rating: str = Field(description="buy, overweight, hold, underweight or sell.")
    decision_text: str = Field(max_length=MAX_MEMORY_CHARS)
    horizon_days: int = Field(default=5, ge=1, le=3650, description="Trading days until the outcome is judged.")
    deadline: datetime | None = Field(default=None, description="Expiry without an outcome; defaults from the horizon.")
    decision_id: str | None = None
    occurred_at: datetime | None = None
    session_id: str | None = None
    scope: ScopeIn | None = None


class Accepted(BaseModel):
    """A write Kafka acknowledged."""

    event_id: str
    position: str = Field(description="topic:partition:offset; pass as min_position to read your write.")


class MemoryAccepted(Accepted):
    memory_id: str


class DecisionAccepted(Accepted):
    decision_id: str
    deadline: datetime


class MessagesAccepted(BaseModel):
    events: list[Accepted]
    position: str = Field(description="Position of the last turn (all turns of one space share a partition).")


class SearchOut(BaseModel):
    results: list[dict[str, Any]]
    scope: dict[str, str]


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    kafka: bool
    store: bool
    version: str


# --- helpers -------------------------------------------------------------------------------


def _utc(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _resolve(principal: Principal, scope: ScopeIn | None) -> Scope:
    access = principal.access
    if scope is not None and scope.team_id is not None and scope.team_id != access.team_id:
        raise forbidden(principal, f"team {scope.team_id!r}")
    try:
        return access.resolve(
            scope.user_id if scope else None,
            scope.agent_id if scope else None,
        )
    except PermissionError as exc:
        raise forbidden(principal, str(exc)) from None
    except ValidationError as exc:  # a malformed id
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "scope"
        raise ApiError(422, "validation_error", f"{where}: {err.get('msg', 'invalid')}") from None


def _event(raw: dict[str, Any]) -> EventBase:
    try:
        return parse_event(raw)
    except EventValidationError as exc:
        raise ApiError(422, "invalid_event", exc.reason) from None


def _rating(text: str) -> str:
    """Ratings are read leniently ("Strong Buy", "Rating: overweight"), as in the SDK."""
    try:
        return parse_rating(text).value
    except ValueError as exc:
        raise ApiError(422, "invalid_event", f"rating: {exc}") from None


def _positions(values: list[str]) -> list[LogPosition]:
    out = []
    for text in values:
        try:
            out.append(LogPosition.parse(text))
        except ValueError:
            raise ApiError(
                422, "validation_error", f"min_position {text!r} is not topic:partition:offset"
            ) from None
    return out


def _check(**values: str) -> None:
    """Ids a read names in its path or query, checked as events check them (422)."""
    try:
        check_request_values(**values)
    except ValueError as exc:
        raise ApiError(422, "validation_error", str(exc)) from None


def _service(request: Request) -> MemoryService:
    service: MemoryService | None = getattr(request.app.state, "service", None)
    if service is None or service.producer is None:
        raise ApiError(503, "unavailable", "the API server is starting or stopping")
    return service


async def _append(service: MemoryService, event: EventBase) -> Accepted:
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


async def _wait(service: MemoryService, positions: list[LogPosition], wait_s: float | None) -> None:
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


# --- authentication ---------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer msk_...`")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="The same API key in `X-API-Key`.")


def _present_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def _authenticate(source: RegistrySource, raw_key: str | None, limiter: RateLimiter | None = None) -> Principal:
    if raw_key is None:
        raise ApiError(
            401,
            "unauthorized",
            "missing API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        registry = source.current()
    except BankConfigError as exc:
        log.error("bank configuration unusable: %s", exc)
        raise ApiError(503, "unavailable", "the bank configuration cannot be read; see the server log") from None
    principal = registry.authenticate(raw_key)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown API key", headers={"WWW-Authenticate": "Bearer"})
    if limiter is not None:
        wait = limiter.take(principal.key_id)
        if wait > 0:
            raise ApiError(
                429, "too_many_requests",
                f"this key is over its rate limit ({limiter.rate:g}/s, burst {limiter.burst:g}); retry later",
                {"retry_after_s": round(wait, 3)}, headers={"Retry-After": RateLimiter.retry_after(wait)},
            )
    return principal


async def principal_of(
    request: Request,
    _b: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    _k: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    """The caller, from the key in the request headers (the two security schemes above
    are declared for the OpenAPI spec; the header parsing is ours, so a malformed
    header gives our 401 rather than a framework 403)."""
    return _authenticate(request.app.state.registry, _present_key(request.headers), request.app.state.limiter)


Caller = Annotated[Principal, Depends(principal_of)]
MinPosition = Annotated[
    list[str],
    Query(
        description="Wait until the projection has applied this log position "
        "(topic:partition:offset from a write); repeatable.",
    ),
]
WaitS = Annotated[
    float | None,
    Query(ge=0, description="Longest wait for min_position, in seconds (capped by the server's read_wait_max_s)."),
]


# --- MCP over streamable HTTP ------------------------------------------------------------------


class _McpEndpoint:
    """ASGI endpoint at ``/mcp``: authenticates the key, then hands the request to the
    MCP server of the key's bank. Each bank has its own server (built at startup), so
    the scope is pinned by the key, never by anything inside the MCP messages; the key
    is checked against the live registry on every request, and each tool call reads
    its bank's current declaration (a moved or removed bank takes effect at once)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            principal = _authenticate(self.app.state.registry, _present_key(headers), self.app.state.limiter)
            servers: dict[str, MCPServer] = getattr(self.app.state, "mcp_servers", {})
            server = servers.get(principal.bank.name)
            if server is None:
                raise ApiError(
                    503,
                    "unavailable",
                    f"bank {principal.bank.name!r} was declared after the server started; restart it to serve MCP for it",
                )
        except ApiError as exc:
            response = JSONResponse(
                error_body(exc.code, exc.message, exc.details), status_code=exc.status, headers=exc.headers or None
            )
            await response(scope, receive, send)
            return
        await server.session_manager.handle_request(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class _BodyLimit:
    """Refuse request bodies over ``max_bytes`` with a 413 in the one error shape, before
    they are read into memory (by ``Content-Length``) or as soon as a streamed body
    passes the limit."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            error_body("payload_too_large", f"request body is larger than {self.max_bytes} bytes"),
            status_code=413,
        )
        await response(scope, receive, send)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_large = int(value) > self.max_bytes
                except ValueError:
                    too_large = False
                if too_large:
                    await self._refuse(scope, receive, send)
                    return
        seen = 0
        started = False

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracked(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _BodyTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send)


# --- the app ----------------------------------------------------------------------------------

_EVENT_SCHEMA: dict[str, Any] = TypeAdapter(Event).json_schema(ref_template="#/components/schemas/{model}")


def create_api(settings: Settings, *, registry: RegistrySource | None = None) -> FastAPI:
    """The FastAPI application. Construction does no I/O (so the spec can be generated
    offline); the lifespan loads the banks, starts the producer, opens the store
    read-only and starts one MCP session manager per bank."""
    source = registry or RegistrySource(settings)
    log_registry = CollectorRegistry(auto_describe=True)
    log_state = metrics.LogStateCollector()
    log_registry.register(log_state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        banks = source.current()  # fail fast on a broken bank file
        service = MemoryService(settings, client_id="memstream-api")
        async with AsyncExitStack() as stack:
            await service.start()
            stack.push_async_callback(service.stop)
            servers: dict[str, MCPServer] = {}
            for name, bank in sorted(banks.banks.items()):
                server = build_mcp_server(
                    bank, settings, service=service,
                    live=lambda name=name: source.current().bank(name),  # type: ignore[misc]
                )
                server.streamable_http_app(streamable_http_path="/mcp", host=settings.api_host)
                await stack.enter_async_context(server.session_manager.run())
                servers[name] = server
            app.state.service = service
            app.state.mcp_servers = servers
            log.info(
                "API ready: %d bank(s) [%s], topics %s*, store %s",
                len(servers), ", ".join(servers) or "none", settings.topic_prefix, settings.lance_dir,
            )
            try:
                yield
            finally:
                app.state.service = None
                app.state.mcp_servers = {}

    app = FastAPI(
        title="memstream",
        version=__version__,
        summary="Long-term memory for fleets of LLM agents: events on Kafka, views in LanceDB.",
        lifespan=lifespan,
        responses={500: {"model": ErrorResponse, "description": "Unexpected error."}},
    )
    app.state.registry = source
    app.state.limiter = RateLimiter(settings.api_rate_per_s, settings.api_rate_burst)
    app.state.service = None
    app.state.mcp_servers = {}
    install_error_handlers(app)
    app.add_middleware(_BodyLimit, max_bytes=settings.api_max_body_bytes)
    app.router.routes.append(Route("/mcp", endpoint=_McpEndpoint(app), methods=["GET", "POST", "DELETE"], include_in_schema=False))

    # --- writes ---------------------------------------------------------------------------

    @app.post(
        "/v1/events",
        status_code=202,
        response_model=Accepted,
        responses={**ERROR_RESPONSES, 409: {"model": ErrorResponse, "description": "The memory id belongs to another agent."}},
        tags=["write"],
        summary="Append any event (validated; upcast from older schema versions)",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {k: v for k, v in _EVENT_SCHEMA.items() if k != "$defs"}}},
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
        event = _event(raw)
        if not principal.access.allows(event.scope):
            raise forbidden(principal, f"scope {event.scope.model_dump()}")
        check_client_event(event)
        service = _service(request)
        await check_owners(service, principal, event)
        return await _append(service, event)

    @app.post("/v1/memories", status_code=202, response_model=MemoryAccepted,
              responses={**ERROR_RESPONSES, 409: {"model": ErrorResponse, "description": "The memory id belongs to another agent."}},
              tags=["write"],
              summary="Add one memory (a MemoryAdded event)")
    async def post_memory(body: MemoryIn, request: Request, principal: Caller) -> MemoryAccepted:
        scope = _resolve(principal, body.scope)
        raw = body.model_dump(exclude={"scope"}, exclude_none=True, mode="json")
        raw.update(
            type="MemoryAdded",
            scope=scope.model_dump(),
            memory_id=body.memory_id or uuid.uuid4().hex,
            producer=f"api:{principal.bank.name}",
            provenance={"method": "api", "note": f"POST /v1/memories, bank {principal.bank.name}"},
        )
        for name in ("source_message_ids", "entities", "metadata"):
            if not raw.get(name):
                raw.pop(name, None)
        event = _event(raw)
        check_client_event(event)
        service = _service(request)
        await check_owners(service, principal, event)
        accepted = await _append(service, event)
        return MemoryAccepted(memory_id=raw["memory_id"], **accepted.model_dump())

    @app.post("/v1/messages", status_code=202, response_model=MessagesAccepted, responses=ERROR_RESPONSES, tags=["write"],
              summary="Append conversation turns (MessageObserved) for the extractor")
    async def post_messages(body: MessagesIn, request: Request, principal: Caller) -> MessagesAccepted:
        scope = _resolve(principal, body.scope)
        events = []
        for i, turn in enumerate(body.messages):
            raw = turn.model_dump(exclude_none=True, mode="json")
            if not raw.get("metadata"):
                raw.pop("metadata", None)
            raw.update(
                type="MessageObserved",
                scope=scope.model_dump(),
                message_id=turn.message_id or uuid.uuid4().hex,
                producer=f"api:{principal.bank.name}",
            )
            if body.session_id is not None:
                raw["session_id"] = body.session_id
            try:
                events.append(parse_event(raw))
            except EventValidationError as exc:
                raise ApiError(422, "invalid_event", f"messages.{i}: {exc.reason}") from None
        service = _service(request)
        try:
            positions = await service.append_many(events, interface="api")
        except EncodeError as exc:
            raise ApiError(422, "invalid_event", str(exc)) from None
        except ProduceError as exc:
            raise ApiError(503, "unavailable", f"Kafka did not acknowledge every turn: {exc}") from None
        accepted = [Accepted(event_id=str(e.event_id), position=str(p)) for e, p in zip(events, positions)]
        return MessagesAccepted(events=accepted, position=accepted[-1].position)

    @app.post("/v1/decisions", status_code=202, response_model=DecisionAccepted, responses=ERROR_RESPONSES, tags=["write"],
              summary="Record a pending decision (DecisionRecorded) for reflection")
    async def post_decision(body: DecisionIn, request: Request, principal: Caller) -> DecisionAccepted:
        scope = _resolve(principal, body.scope)
        occurred = body.occurred_at or datetime.now(timezone.utc)
        raw = body.model_dump(exclude={"scope"}, exclude_none=True, mode="json")
        raw.update(
            type="DecisionRecorded",
            scope=scope.model_dump(),
            decision_id=body.decision_id or uuid.uuid4().hex,
            rating=_rating(body.rating),
            occurred_at=occurred.isoformat(),
            deadline=_utc(body.deadline or default_deadline(occurred, body.horizon_days)),
            producer=f"api:{principal.bank.name}",
        )
        event = _event(raw)
        assert isinstance(event, DecisionRecorded)
        accepted = await _append(_service(request), event)
        return DecisionAccepted(decision_id=raw["decision_id"], deadline=event.deadline, **accepted.model_dump())

    # --- reads ------------------------------------------------------------------------------

    @app.get("/v1/search", response_model=SearchOut, responses={**ERROR_RESPONSES, 409: {"model": ErrorResponse, "description": "min_position not reached in time."}},
             tags=["read"], summary="Hybrid (vector + full-text) search in one memory space")
    async def get_search(
        request: Request,
        principal: Caller,
        q: Annotated[str, Query(min_length=1, max_length=2000, description="The query text.")],
        k: Annotated[int, Query(ge=1, le=100)] = 10,
        memory_type: Annotated[list[str], Query(description="Only these memory types (repeatable).")] = [],  # noqa: B006
        session_id: Annotated[str | None, Query()] = None,
        user_id: Annotated[str | None, Query(description="Defaults to the bank's user (or 'default').")] = None,
        agent_id: Annotated[str | None, Query(description="Only memories of this agent.")] = None,
        team_id: Annotated[str | None, Query(description="Must be the key's team if given.")] = None,
        time_from: Annotated[datetime | None, Query(description="Only memories at or after this time (ISO 8601 with offset).")] = None,
        time_to: Annotated[datetime | None, Query(description="Only memories at or before this time.")] = None,
        entity: Annotated[str | None, Query(max_length=200, description="Only memories naming this entity.")] = None,
        include_superseded: Annotated[bool, Query(description="False drops superseded memories and duplicates.")] = True,
        explain: Annotated[bool, Query(description="Include the score parts of every result.")] = False,
        min_position: MinPosition = [],  # noqa: B006
        wait_s: WaitS = None,
    ) -> SearchOut:
        if agent_id is not None:
            _check(agent_id=agent_id)
        scope = read_scope(principal, team_id, user_id, agent_id)
        try:
            filters = search_filters(
                memory_types=memory_type,
                session_id=session_id,
                agent_id=scope.agent_id,
                time_from=time_from,
                time_to=time_to,
                include_superseded=include_superseded,
                entity=entity,
            )
        except ValueError as exc:
            raise ApiError(422, "validation_error", str(exc)) from None
        service = _service(request)
        await _wait(service, _positions(min_position), wait_s)
        hits = await service.search(scope, q, k, filters, interface="api")
        return SearchOut(
            results=[search_hit_payload(h, explain=explain) for h in hits],
            scope={"team_id": scope.team_id, "user_id": scope.user_id},
        )

    @app.get("/v1/memories/{memory_id}", responses={**ERROR_RESPONSES, 404: {"model": ErrorResponse, "description": "No such memory in this space."},
             409: {"model": ErrorResponse, "description": "min_position not reached in time."}},
             tags=["read"], summary="One memory with its history, links and provenance")
    async def get_memory(
        request: Request,
        principal: Caller,
        memory_id: Annotated[str, Path(min_length=1, max_length=128)],
        user_id: Annotated[str | None, Query()] = None,
        team_id: Annotated[str | None, Query()] = None,
        min_position: MinPosition = [],  # noqa: B006
        wait_s: WaitS = None,
    ) -> dict[str, Any]:
        scope = read_scope(principal, team_id, user_id)
        _check(memory_id=memory_id)
        service = _service(request)
        await _wait(service, _positions(min_position), wait_s)
        found = await service.get_memory(scope, memory_id)
        if found is None:
            raise ApiError(404, "not_found", f"no memory {memory_id!r} in {scope.team_id}/{scope.user_id}")
        return memory_payload(found)

    @app.get("/v1/lessons", responses={**ERROR_RESPONSES, 409: {"model": ErrorResponse, "description": "min_position not reached in time."}},
             tags=["read"], summary="Lessons from past decisions on a subject, within a token budget")
    async def get_lessons(
        request: Request,
        principal: Caller,
        subject: Annotated[str, Query(min_length=1, max_length=128)],
        budget: Annotated[int, Query(ge=50, le=20_000, description="Token budget of the context text.")] = 800,
        user_id: Annotated[str | None, Query()] = None,
        team_id: Annotated[str | None, Query()] = None,
        min_position: MinPosition = [],  # noqa: B006
        wait_s: WaitS = None,
    ) -> dict[str, Any]:
        scope = read_scope(principal, team_id, user_id)
        if not subject.strip():
            raise ApiError(422, "validation_error", "query.subject: is empty")
        _check(subject=subject)
        service = _service(request)
        await _wait(service, _positions(min_position), wait_s)
        context = await service.lessons(scope, subject, budget)
        return lessons_payload(context)

    # --- operations ---------------------------------------------------------------------------

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health, "description": "Kafka or the store is unreachable."}},
             tags=["ops"], summary="Liveness and dependencies")
    async def healthz(request: Request) -> JSONResponse:
        service: MemoryService | None = request.app.state.service
        kafka = service is not None and await service.kafka_reachable()
        store = service is not None and service.has_store
        ok = kafka and store
        body = Health(status="ok" if ok else "degraded", kafka=kafka, store=store, version=__version__)
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics",
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
    async def get_metrics(request: Request) -> Response:
        service: MemoryService | None = request.app.state.service
        if service is not None:
            log_state.update(await service.log_snapshot())
        return Response(metrics.render(log_registry), media_type=metrics.CONTENT_TYPE)

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        spec = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes,
            description=(__doc__ or "").split("\n\n", 1)[1].strip() if __doc__ else None,
        )
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in _EVENT_SCHEMA.get("$defs", {}).items():
            schemas.setdefault(name, schema)
        # FastAPI documents its own 422 shape by default; ours is ErrorResponse.
        for name in ("HTTPValidationError", "ValidationError"):
            if not _referenced(spec, name, exclude=name):
                schemas.pop(name, None)
        app.openapi_schema = spec
        return spec

    app.openapi = custom_openapi  # type: ignore[method-assign]
    return app


def _referenced(spec: dict[str, Any], name: str, *, exclude: str) -> bool:
    ref = f"#/components/schemas/{name}"
    pruned = {k: v for k, v in spec.get("components", {}).get("schemas", {}).items() if k != exclude}
    return ref in json.dumps(spec.get("paths", {})) or ref in json.dumps(pruned)


def openapi_spec(settings: Settings | None = None) -> dict[str, Any]:
    """The OpenAPI document (no I/O)."""
    return create_api(settings or Settings()).openapi()


def main(argv: list[str] | None = None) -> int:
    """``python -m memstream.interfaces.api --openapi`` prints the spec (sorted, stable)."""
    parser = argparse.ArgumentParser(prog="python -m memstream.interfaces.api")
    parser.add_argument("--openapi", action="store_true", help="print the OpenAPI spec as JSON and exit")
    args = parser.parse_args(argv)
    if not args.openapi:
        parser.error("nothing to do: pass --openapi (run the server with `memstream api`)")
    sys.stdout.write(json.dumps(openapi_spec(), indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
