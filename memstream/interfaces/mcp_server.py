"""Memory as a tool: an MCP server bound to one memory bank.

The model gets five tools — ``add_memory``, ``query_memory``, ``record_decision``,
``get_lessons``, ``get_memory`` — and never sees a scope parameter. The bank (team,
user, agent) is pinned when the server is built, so whatever bank, team or user id a
model writes into the arguments is ignored (the argument models drop unknown keys),
and one bank can never read or write another's memories.

``add_memory``'s description starts with the auto-trigger line: it tells the model to
call the tool on its own, without being asked, when the user reveals something durable
— limited to what the bank's description says belongs in it. This is the
memory-as-plugin pattern: the bank becomes a pair of tools the model uses unprompted.

Writes are durable before a tool answers (the Kafka ack). Reads wait, bounded by
``read_wait_max_s``, until the projection has applied this server's own latest write,
so a model that adds a memory and then queries finds it (read-your-writes); if the
worker lags beyond the bound the answer says so instead of failing.

Served over stdio by ``memstream mcp --bank NAME`` and over streamable HTTP at ``/mcp``
inside the API server (which passes its shared :class:`MemoryService`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Annotated, Any, TypeVar

from aiokafka.errors import KafkaError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

from memstream.banks import Bank
from memstream.domain.access import client_content_problem, system_claim
from memstream.domain.events import (
    CURRENT_SCHEMA_VERSIONS,
    MAX_MEMORY_CHARS,
    DecisionRecorded,
    EventBase,
    EventValidationError,
    MemoryAdded,
    MemoryType,
    Provenance,
    parse_event,
)
from memstream.domain.log import LogPosition
from memstream.domain.reflection import parse_rating
from memstream.interfaces.service import (
    MemoryService,
    PositionNotReached,
    check_request_values,
    default_deadline,
    lessons_payload,
    memory_payload,
    search_filters,
    search_hit_payload,
)
from memstream.settings import Settings
from memstream.streams.serializer import EncodeError

__all__ = [
    "AUTO_TRIGGER",
    "build_mcp_server",
    "add_memory_description",
    "AddMemoryResult",
    "QueryResult",
    "DecisionResult",
    "LessonsResult",
]

E = TypeVar("E", bound=EventBase)

AUTO_TRIGGER = (
    "Call this tool on your own, without being asked, whenever the user reveals a durable "
    "fact, preference or instruction worth remembering in later conversations."
)


def add_memory_description(bank: Bank) -> str:
    """The ``add_memory`` description: the auto-trigger line first, then the bank's scope."""
    return (
        f"{AUTO_TRIGGER}\n"
        f'Memory bank "{bank.name}": {bank.description}\n'
        "Only store what belongs in this bank. Store one self-contained statement per call "
        '(e.g. "Alice prefers aisle seats"), not small talk, and never secrets such as '
        "passwords or keys. The memory is saved durably before the tool answers."
    )


class AddMemoryResult(BaseModel):
    memory_id: str
    event_id: str
    position: str = Field(description="Log position topic:partition:offset of the write.")
    content: str = Field(description="The content as stored (after the bank's template).")
    bank: str


class QueryResult(BaseModel):
    memories: list[dict[str, Any]]
    up_to_date: bool = Field(description="False when the latest writes may not be visible yet.")
    note: str | None = None


class DecisionResult(BaseModel):
    decision_id: str
    event_id: str
    position: str
    deadline: datetime


class LessonsResult(BaseModel):
    subject: str
    context: dict[str, Any]
    up_to_date: bool
    note: str | None = None


class _State:
    """What the tools close over: the bank, the service, this server's latest writes."""

    def __init__(
        self, bank: Bank, settings: Settings, service: MemoryService | None, live: Callable[[], Bank] | None = None
    ):
        self.bank = bank
        self.live = live
        self.settings = settings
        self.service = service
        # Highest acknowledged offset per (topic, partition) written through this server,
        # for topics the projection applies (the memory log).
        self.written: dict[tuple[str, int], int] = {}

    def current_bank(self) -> Bank:
        """The bank as the registry declares it now (``live``), else as built: a bank
        moved to another team or removed takes effect on the next tool call."""
        if self.live is None:
            return self.bank
        try:
            return self.live()
        except LookupError:
            raise ToolError(f"bank {self.bank.name!r} is no longer declared; nothing was done") from None

    def require(self) -> MemoryService:
        if self.service is None:
            raise ToolError("the memory service is not running")
        return self.service

    def remember(self, position: LogPosition) -> None:
        service = self.require()
        if position.topic != service.topics.events:
            return
        key = (position.topic, position.partition)
        self.written[key] = max(self.written.get(key, -1), position.offset)

    async def append(self, cls: type[E], raw: dict[str, Any]) -> tuple[E, LogPosition]:
        """Validate ``raw`` as a ``cls`` event and write it (durable once this returns);
        every failure is a tool error the model can read, and nothing is written."""
        service = self.require()
        try:
            event = parse_event(raw)
            if not isinstance(event, cls):
                raise EventValidationError(f"type: expected {cls.__name__}, got {event.type}")
            claim = system_claim(event)
            if claim is not None:
                raise ToolError(f"forbidden, nothing was saved: {claim}")
            problem = client_content_problem(event)
            if problem is not None:
                raise ToolError(f"refused by the quality gate, nothing was saved: {problem}")
            position = await service.append(event, interface="mcp")
        except (EventValidationError, EncodeError) as exc:
            raise _reject(exc) from None
        except KafkaError as exc:
            raise ToolError(f"could not save, Kafka did not acknowledge ({type(exc).__name__}); try again") from None
        self.remember(position)
        return event, position

    async def catch_up(self) -> str | None:
        """Wait for this server's own writes to be projected; a note when they are not."""
        service = self.require()
        wanted = [LogPosition(topic=t, partition=p, offset=o) for (t, p), o in self.written.items()]
        try:
            await service.wait_for(wanted)
        except PositionNotReached as exc:
            return (
                f"recent writes may be missing: {exc}. The memory worker may be busy or "
                "stopped; try again shortly."
            )
        return None


def _check(**values: str) -> None:
    """Ids a tool call names, checked as events check them."""
    try:
        check_request_values(**values)
    except ValueError as exc:
        raise ToolError(f"invalid input: {exc}") from None


def _reject(exc: Exception) -> ToolError:
    reason = exc.reason if isinstance(exc, EventValidationError) else str(exc)
    return ToolError(f"invalid input, nothing was saved: {reason}")


def build_mcp_server(
    bank: Bank,
    settings: Settings,
    *,
    service: MemoryService | None = None,
    clock: Callable[[], datetime] | None = None,
    live: Callable[[], Bank] | None = None,
) -> MCPServer:
    """An MCP server whose tools read and write ``bank`` only.

    With ``service`` (the API server's), the server uses it and owns nothing; without
    one, the server starts its own service in its lifespan (stdio use) and stops it on
    exit. ``clock`` supplies "now" for templates and default deadlines. ``live``
    returns the bank as the registry declares it at the moment of each tool call (the
    API server passes its registry's; raises ``LookupError`` once it is removed):
    every call reads and writes the bank's current scope, never the one at start-up.
    """
    now: Callable[[], datetime] = clock or (lambda: datetime.now(timezone.utc))
    state = _State(bank, settings, service, live)
    owns_service = service is None

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        if not owns_service:
            yield {}
            return
        own = MemoryService(settings, client_id=f"memstream-mcp-{bank.name}")
        await own.start()
        state.service = own
        try:
            yield {}
        finally:
            state.service = None
            await own.stop()

    server: MCPServer = MCPServer(
        name=f"memstream-{bank.name}",
        title=f"memstream memory bank {bank.name}",
        instructions=(
            f'Long-term memory bank "{bank.name}": {bank.description} '
            "Use add_memory proactively for durable facts, preferences and instructions; "
            "use query_memory before answering questions that may depend on them."
        ),
        lifespan=lifespan,
        log_level="WARNING",
    )

    async def add_memory(
        content: Annotated[str, Field(description="The memory: one self-contained statement.", max_length=MAX_MEMORY_CHARS)],
        memory_type: Annotated[
            MemoryType | None,
            Field(description="persona (who the user is, preferences), episodic (what happened), "
                  "instruction (how to behave), or a work_* type."),
        ] = None,
        priority: Annotated[int, Field(ge=0, le=100, description="Importance 0-100.")] = 50,
        scene: Annotated[str | None, Field(max_length=500, description="Optional context or topic.")] = None,
    ) -> AddMemoryResult:
        state.require()
        bank = state.current_bank()
        if not content.strip():
            # Checked before the template: a template would make blank content look full.
            raise ToolError("invalid input, nothing was saved: content is empty")
        stored = bank.render_memory(content, now())
        raw = {
            "type": "MemoryAdded",
            "schema_version": CURRENT_SCHEMA_VERSIONS["MemoryAdded"],
            "scope": bank.scope.model_dump(),
            "memory_id": uuid.uuid4().hex,
            "content": stored,
            "memory_type": (memory_type or bank.default_memory_type).value,
            "priority": priority,
            "scene": scene,
            "producer": f"mcp:{bank.name}",
            "provenance": Provenance(method="agent", note=f"mcp add_memory, bank {bank.name}").model_dump(),
        }
        event, position = await state.append(MemoryAdded, {k: v for k, v in raw.items() if v is not None})
        return AddMemoryResult(
            memory_id=event.memory_id,
            event_id=str(event.event_id),
            position=str(position),
            content=event.content,
            bank=bank.name,
        )

    async def query_memory(
        query: Annotated[str, Field(min_length=1, max_length=2000, description="What to look for, in natural language.")],
        k: Annotated[int, Field(ge=1, le=50, description="How many memories to return.")] = 5,
        memory_types: Annotated[list[MemoryType] | None, Field(description="Only these types.")] = None,
        session_id: Annotated[str | None, Field(description="Only memories from this session.")] = None,
    ) -> QueryResult:
        service = state.require()
        bank = state.current_bank()
        note = await state.catch_up()
        try:
            filters = search_filters(
                memory_types=[t.value for t in memory_types or []],
                session_id=session_id,
            )
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        hits = await service.search(bank.access.read_scope(), query, k, filters, interface="mcp")
        return QueryResult(
            memories=[search_hit_payload(h, explain=False) for h in hits],
            up_to_date=note is None,
            note=note,
        )

    async def record_decision(
        subject: Annotated[str, Field(min_length=1, max_length=128, description="What the decision is about, e.g. a ticker.")],
        rating: Annotated[str, Field(min_length=1, max_length=200, description="buy, overweight, hold, underweight or sell (free text holding one is read leniently).")],
        decision_text: Annotated[str, Field(min_length=1, max_length=MAX_MEMORY_CHARS, description="The decision and its reasoning.")],
        horizon_days: Annotated[int, Field(ge=1, le=3650, description="Days until the outcome should be judged.")] = 5,
    ) -> DecisionResult:
        state.require()
        bank = state.current_bank()
        try:
            parsed_rating = parse_rating(rating)
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        at = now()
        deadline = default_deadline(at, horizon_days)
        raw = {
            "type": "DecisionRecorded",
            "schema_version": CURRENT_SCHEMA_VERSIONS["DecisionRecorded"],
            "scope": bank.scope.model_dump(),
            "decision_id": uuid.uuid4().hex,
            "subject": subject,
            "rating": parsed_rating.value,
            "decision_text": decision_text,
            "horizon_days": horizon_days,
            "deadline": deadline.isoformat(),
            "occurred_at": at.isoformat(),
            "producer": f"mcp:{bank.name}",
        }
        event, position = await state.append(DecisionRecorded, raw)
        return DecisionResult(
            decision_id=event.decision_id,
            event_id=str(event.event_id),
            position=str(position),
            deadline=event.deadline,
        )

    async def get_lessons(
        subject: Annotated[str, Field(min_length=1, max_length=128, description="The subject, e.g. a ticker.")],
        budget_tokens: Annotated[int, Field(ge=50, le=20_000, description="Rough size limit of the context.")] = 800,
    ) -> LessonsResult:
        service = state.require()
        bank = state.current_bank()
        if not subject.strip():
            raise ToolError("subject is empty")
        _check(subject=subject)
        note = await state.catch_up()
        context = await service.lessons(bank.access.read_scope(), subject, budget_tokens)
        return LessonsResult(
            subject=subject, context=lessons_payload(context), up_to_date=note is None, note=note
        )

    async def get_memory(
        memory_id: Annotated[str, Field(min_length=1, max_length=128, description="A memory_id from query_memory.")],
    ) -> dict[str, Any]:
        service = state.require()
        bank = state.current_bank()
        _check(memory_id=memory_id)
        note = await state.catch_up()
        found = await service.get_memory(bank.access.read_scope(), memory_id)
        if found is None:
            raise ToolError(
                f"no memory {memory_id!r} in bank {bank.name!r}"
                + (f" ({note})" if note else "")
            )
        return memory_payload(found)

    server.add_tool(
        add_memory,
        description=add_memory_description(bank),
        annotations=ToolAnnotations(title="Remember", destructive_hint=False, idempotent_hint=False),
    )
    server.add_tool(
        query_memory,
        description=(
            f'Search the memory bank "{bank.name}" ({bank.description}) with hybrid '
            "(semantic + keyword) search. Use it before answering anything that may depend "
            "on what the user told you before. Newer memories outrank superseded ones."
        ),
        annotations=ToolAnnotations(title="Recall", read_only_hint=True),
    )
    server.add_tool(
        record_decision,
        description=(
            "Record a decision whose outcome is not known yet (e.g. a rating on a ticker). "
            "When the outcome arrives, a short lesson is reflected from it; read lessons with "
            "get_lessons before deciding on the same subject again."
        ),
        annotations=ToolAnnotations(title="Record decision", destructive_hint=False),
    )
    server.add_tool(
        get_lessons,
        description=(
            "Lessons learned from past decisions on a subject (what was decided, what "
            "happened, what to do differently), sized to a token budget. Call it before a "
            "new decision on that subject."
        ),
        annotations=ToolAnnotations(title="Lessons", read_only_hint=True),
    )
    server.add_tool(
        get_memory,
        description="One memory by id, with its history (what superseded it), links and provenance.",
        annotations=ToolAnnotations(title="Memory details", read_only_hint=True),
    )
    return server
