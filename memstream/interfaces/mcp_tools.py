"""The five tools of a bank's MCP server and what they share (see ``mcp_server``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any, TypeVar

from aiokafka.errors import KafkaError
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from memstream.banks import Bank
from memstream.domain.access import client_content_problem, system_claim
from memstream.domain.events import (
    MAX_MEMORY_CHARS,
    DecisionRecorded,
    EventBase,
    EventValidationError,
    MemoryAdded,
    MemoryType,
    Provenance,
    build_event,
)
from memstream.domain.log import LogPosition
from memstream.domain.reflection import parse_rating
from memstream.interfaces.service import (
    MemoryService,
    PositionNotReached,
    RerankUnavailable,
    check_request_values,
    default_deadline,
    lessons_payload,
    memory_payload,
    search_filters,
    search_hit_payload,
)
from memstream.settings import Settings
from memstream.codec.wire import EncodeError

__all__ = ["BankTools", "AddMemoryResult", "QueryResult", "DecisionResult", "LessonsResult"]

E = TypeVar("E", bound=EventBase)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class AddMemoryResult(BaseModel):
    memory_id: str
    event_id: str
    position: str = Field(description="Log position topic:partition:offset of the write.")
    content: str = Field(description="The content as stored (after the bank's template).")
    bank: str
    duplicate: bool = Field(default=False, description="True: this memory was already stored; nothing new was saved.")


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


def _check(**values: str) -> None:
    """Ids a tool call names, checked as events check them."""
    try:
        check_request_values(**values)
    except ValueError as exc:
        raise ToolError(f"invalid input: {exc}") from None


def _reject(exc: Exception) -> ToolError:
    reason = exc.reason if isinstance(exc, EventValidationError) else str(exc)
    return ToolError(f"invalid input, nothing was saved: {reason}")


class BankTools:
    """The tools of one bank's MCP server (each method is one tool; its parameters are
    what the model sees), with what they share: the bank, the service, the clock and
    this server's latest writes."""

    def __init__(
        self,
        bank: Bank,
        settings: Settings,
        service: MemoryService | None,
        live: Callable[[], Bank] | None = None,
        clock: Callable[[], datetime] | None = None,
    ):
        self.bank = bank
        self.now: Callable[[], datetime] = clock or _utc_now
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
            event = build_event(cls, **raw)
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

    # ---------------------------------------------------------------- the tools
    async def add_memory(
        self,
        content: Annotated[str, Field(description="The memory: one self-contained statement.", max_length=MAX_MEMORY_CHARS)],
        memory_type: Annotated[
            MemoryType | None,
            Field(description="persona (who the user is, preferences), episodic (what happened), "
                  "instruction (how to behave), or a work_* type."),
        ] = None,
        priority: Annotated[int, Field(ge=0, le=100, description="Importance 0-100.")] = 50,
        scene: Annotated[str | None, Field(max_length=500, description="Optional context or topic.")] = None,
    ) -> AddMemoryResult:
        service = self.require()
        bank = self.current_bank()
        if not content.strip():
            # Checked before the template: a template would make blank content look full.
            raise ToolError("invalid input, nothing was saved: content is empty")
        stored = bank.render_memory(content, self.now())
        # The same content in the bank's scope is the same memory (the id follows from both).
        memory_id = service.content_memory_id(bank.scope, stored)
        owner = await service.memory_owner(bank.scope, memory_id)
        found = await service.stored_memory(bank.scope, memory_id) if owner == bank.scope.agent_id else None
        if found is not None:
            return AddMemoryResult(
                memory_id=memory_id, event_id=found[0], position=str(found[1]), content=stored, bank=bank.name, duplicate=True
            )
        raw = {
            "scope": bank.scope.model_dump(),
            "memory_id": memory_id,
            "content": stored,
            "memory_type": (memory_type or bank.default_memory_type).value,
            "priority": priority,
            "scene": scene,
            "producer": f"mcp:{bank.name}",
            "provenance": Provenance(method="agent", note=f"mcp add_memory, bank {bank.name}").model_dump(),
        }
        event, position = await self.append(MemoryAdded, raw)
        return AddMemoryResult(
            memory_id=event.memory_id,
            event_id=str(event.event_id),
            position=str(position),
            content=event.content,
            bank=bank.name,
        )

    async def query_memory(
        self,
        query: Annotated[str, Field(min_length=1, max_length=2000, description="What to look for, in natural language.")],
        k: Annotated[int, Field(ge=1, le=50, description="How many memories to return.")] = 5,
        memory_types: Annotated[list[MemoryType] | None, Field(description="Only these types.")] = None,
        session_id: Annotated[str | None, Field(description="Only memories from this session.")] = None,
        rerank: Annotated[bool, Field(description="Let the configured cross-encoder reranker order the top results.")] = False,
    ) -> QueryResult:
        service = self.require()
        bank = self.current_bank()
        note = await self.catch_up()
        try:
            filters = search_filters(
                memory_types=[t.value for t in memory_types or []],
                session_id=session_id,
            )
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        try:
            hits = await service.search(bank.access.read_scope(), query, k, filters, interface="mcp", rerank=rerank)
        except RerankUnavailable as exc:
            raise ToolError(str(exc)) from None
        return QueryResult(
            memories=[search_hit_payload(h, explain=False) for h in hits],
            up_to_date=note is None,
            note=note,
        )

    async def record_decision(
        self,
        subject: Annotated[str, Field(min_length=1, max_length=128, description="What the decision is about, e.g. a ticker.")],
        rating: Annotated[str, Field(min_length=1, max_length=200, description="buy, overweight, hold, underweight or sell (free text holding one is read leniently).")],
        decision_text: Annotated[str, Field(min_length=1, max_length=MAX_MEMORY_CHARS, description="The decision and its reasoning.")],
        horizon_days: Annotated[int, Field(ge=1, le=3650, description="Days until the outcome should be judged.")] = 5,
    ) -> DecisionResult:
        self.require()
        bank = self.current_bank()
        try:
            parsed_rating = parse_rating(rating)
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        at = self.now()
        deadline = default_deadline(at, horizon_days)
        raw = {
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
        event, position = await self.append(DecisionRecorded, raw)
        return DecisionResult(
            decision_id=event.decision_id,
            event_id=str(event.event_id),
            position=str(position),
            deadline=event.deadline,
        )

    async def get_lessons(
        self,
        subject: Annotated[str, Field(min_length=1, max_length=128, description="The subject, e.g. a ticker.")],
        budget_tokens: Annotated[int, Field(ge=50, le=20_000, description="Rough size limit of the context.")] = 800,
    ) -> LessonsResult:
        service = self.require()
        bank = self.current_bank()
        if not subject.strip():
            raise ToolError("subject is empty")
        _check(subject=subject)
        note = await self.catch_up()
        context = await service.lessons(bank.access.read_scope(), subject, budget_tokens)
        return LessonsResult(
            subject=subject, context=lessons_payload(context), up_to_date=note is None, note=note
        )

    async def get_memory(
        self,
        memory_id: Annotated[str, Field(min_length=1, max_length=128, description="A memory_id from query_memory.")],
    ) -> dict[str, Any]:
        service = self.require()
        bank = self.current_bank()
        _check(memory_id=memory_id)
        note = await self.catch_up()
        found = await service.get_memory(bank.access.read_scope(), memory_id)
        if found is None:
            raise ToolError(
                f"no memory {memory_id!r} in bank {bank.name!r}"
                + (f" ({note})" if note else "")
            )
        return memory_payload(found)
