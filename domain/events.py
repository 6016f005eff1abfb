"""The event model: the immutable, ADD-only facts that are memstream's source of truth.

Every event is a frozen pydantic model with an envelope (id, type, schema version,
times, a required scope) and a typed body. Nothing here touches Kafka or LanceDB:
the serializer in ``memstream.streams`` turns these into records and back, calling
:func:`parse_event` as the single read path (which upcasts old schema versions).

Limits (documented in the README, enforced here so every boundary shares them):

* ``MAX_MESSAGE_CHARS`` (32,000) for an L0 conversation turn,
* ``MAX_MEMORY_CHARS`` (8,000) for a memory, reflection or decision text,
* ids are 1..128 characters of ``[A-Za-z0-9_.:@/+=-]`` (no whitespace, no control chars).
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timezone
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from memstream.domain.content import content_hash
from memstream.domain.embedding import EmbeddingCodecError, decode_vector
from memstream.domain.upcasting import upcast

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_MEMORY_CHARS",
    "EVENT_TYPES",
    "CURRENT_SCHEMA_VERSIONS",
    "Identifier",
    "Scope",
    "MemoryType",
    "LinkRelation",
    "Rating",
    "EntityKind",
    "Entity",
    "EmbeddingPayload",
    "Provenance",
    "EventBase",
    "MessageObserved",
    "MemoryAdded",
    "MemoryLinked",
    "DecisionRecorded",
    "OutcomeObserved",
    "MemoryReflected",
    "DecisionExpired",
    "Event",
    "EventValidationError",
    "parse_event",
    "utcnow",
    "new_event_id",
]

MAX_MESSAGE_CHARS = 32_000
MAX_MEMORY_CHARS = 8_000

Identifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@/+=\-]+$"),
]
ShortText = Annotated[str, StringConstraints(max_length=512)]


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (naive datetimes are rejected everywhere)."""
    return datetime.now(timezone.utc)


def new_event_id() -> uuid.UUID:
    return uuid.uuid4()


class EventValidationError(ValueError):
    """An event that cannot be accepted; ``reason`` is one readable line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)


class Scope(_Frozen):
    """Who a memory belongs to. ``team_id`` + ``user_id`` is one memory space (one
    Kafka key, one partition); ``agent_id`` narrows within it. "default" is allowed."""

    team_id: Identifier
    user_id: Identifier = "default"
    agent_id: Identifier = "default"

    @property
    def space(self) -> str:
        """The memory-space key: every event of one space shares it (and a partition)."""
        return f"{self.team_id}/{self.user_id}"


class MemoryType(StrEnum):
    """The seven memory types of the seed system MemoryCore."""

    persona = "persona"
    episodic = "episodic"
    instruction = "instruction"
    work_fact = "work_fact"
    work_task = "work_task"
    work_method = "work_method"
    work_artifact = "work_artifact"

    LEGACY: ClassVar[dict[str, str]]

    @classmethod
    def parse(cls, value: str) -> "MemoryType":
        """Lenient parse: case-insensitive, legacy names mapped; unknown names raise."""
        key = value.strip().lower().replace("-", "_").replace(" ", "_")
        key = _LEGACY_MEMORY_TYPES.get(key, key)
        try:
            return cls(key)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown memory type {value!r} (allowed: {allowed})") from None


_LEGACY_MEMORY_TYPES = {"preference": "persona", "episode": "episodic", "instruct": "instruction"}


class LinkRelation(StrEnum):
    same_entity = "same_entity"
    preference_update = "preference_update"
    narrative_continuation = "narrative_continuation"
    contradicts = "contradicts"
    supersedes = "supersedes"
    duplicates = "duplicates"


class Rating(StrEnum):
    """Five-level decision rating, most bullish first."""

    buy = "buy"
    overweight = "overweight"
    hold = "hold"
    underweight = "underweight"
    sell = "sell"


class EntityKind(StrEnum):
    person = "person"
    place = "place"
    organization = "organization"
    product = "product"
    other = "other"


class Entity(_Frozen):
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    kind: EntityKind = EntityKind.other

    @field_validator("kind", mode="before")
    @classmethod
    def _lenient_kind(cls, v: Any) -> Any:
        if isinstance(v, str):
            k = v.strip().lower()
            k = {"organisation": "organization", "org": "organization", "location": "place"}.get(k, k)
            return k if k in EntityKind.__members__ else "other"
        return v


class EmbeddingPayload(_Frozen):
    """A vector on the wire: little-endian float32, base64, with its model and dimension,
    so a replay never needs to re-embed."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    dim: Annotated[int, Field(ge=1, le=8192)]
    data: str

    @model_validator(mode="after")
    def _check_payload(self) -> "EmbeddingPayload":
        try:
            vec = decode_vector(self.data, self.dim)
        except EmbeddingCodecError as exc:
            raise ValueError(str(exc)) from None
        if not all(math.isfinite(x) for x in vec):
            raise ValueError("embedding holds NaN or infinite values")
        return self


class Provenance(_Frozen):
    """How a derived event came to be: which prompt, which model, from which inputs."""

    method: Literal["llm", "heuristic", "agent", "api", "rule", "template"] = "agent"
    prompt_id: str | None = None
    prompt_version: str | None = None
    prompt_sha256: str | None = None
    model: str | None = None
    input_refs: tuple[str, ...] = ()
    output_refs: tuple[str, ...] = ()
    latency_ms: float | None = None
    token_usage: dict[str, int] = Field(default_factory=dict)
    status: str = "ok"
    decisions: tuple[dict[str, Any], ...] = ()
    note: str | None = None


class EventBase(_Frozen):
    """The envelope every event carries."""

    type: str
    schema_version: int
    event_id: uuid.UUID = Field(default_factory=new_event_id)
    occurred_at: AwareDatetime = Field(default_factory=utcnow)
    recorded_at: AwareDatetime = Field(default_factory=utcnow)
    scope: Scope
    session_id: Identifier | None = None
    task_id: Identifier | None = None
    causation_id: Identifier | None = None
    correlation_id: Identifier | None = None
    producer: ShortText | None = None

    @field_validator("occurred_at", "recorded_at")
    @classmethod
    def _to_utc(cls, v: datetime) -> datetime:
        return v.astimezone(timezone.utc)


def _check_text(v: str, limit: int, what: str) -> str:
    if not v or not v.strip():
        raise ValueError(f"{what} is empty")
    if len(v) > limit:
        raise ValueError(f"{what} is {len(v)} characters; the limit is {limit}")
    return v


class MessageObserved(EventBase):
    """One L0 conversation turn, the raw evidence every memory points back to."""

    type: Literal["MessageObserved"] = "MessageObserved"
    schema_version: Literal[1] = 1
    message_id: Identifier
    role: Literal["user", "assistant", "system", "tool"] = "user"
    speaker: Annotated[str, StringConstraints(max_length=200)] | None = None
    content: str
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("content")
    @classmethod
    def _content(cls, v: str) -> str:
        return _check_text(v, MAX_MESSAGE_CHARS, "content")


class MemoryAdded(EventBase):
    """One atomic L1 memory. ``content_hash`` is computed from the content when absent and
    must match it when given (it is what exact dedup keys on)."""

    type: Literal["MemoryAdded"] = "MemoryAdded"
    schema_version: Literal[2] = 2
    memory_id: Identifier
    content: str
    content_hash: str = ""
    memory_type: MemoryType = MemoryType.episodic
    priority: Annotated[int, Field(ge=0, le=100)] = 50
    scene: Annotated[str, StringConstraints(max_length=500)] | None = None
    source_message_ids: tuple[Identifier, ...] = ()
    timestamp: AwareDatetime | None = None
    timestamp_start: AwareDatetime | None = None
    timestamp_end: AwareDatetime | None = None
    entities: tuple[Entity, ...] = ()
    metadata: dict[str, Any] = Field(default_factory=dict)
    embedding: EmbeddingPayload | None = None
    provenance: Provenance | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: str) -> str:
        return _check_text(v, MAX_MEMORY_CHARS, "content")

    @field_validator("memory_type", mode="before")
    @classmethod
    def _legacy_type(cls, v: Any) -> Any:
        return MemoryType.parse(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _derived(self) -> "MemoryAdded":
        expected = content_hash(self.content)
        if not self.content_hash:
            object.__setattr__(self, "content_hash", expected)
        elif self.content_hash != expected:
            raise ValueError("content_hash does not match the normalised content")
        if self.timestamp_start and self.timestamp_end and self.timestamp_end < self.timestamp_start:
            raise ValueError("timestamp_end is before timestamp_start")
        return self


class MemoryLinked(EventBase):
    """A relation between two memories; "update", "merge", "contradict" are these."""

    type: Literal["MemoryLinked"] = "MemoryLinked"
    schema_version: Literal[1] = 1
    link_id: Identifier = Field(default_factory=lambda: str(uuid.uuid4()))
    from_memory_id: Identifier
    to_memory_id: Identifier
    relation: LinkRelation
    decided_by: Literal["rule", "llm", "agent"] = "agent"
    reason: Annotated[str, StringConstraints(max_length=2000)] | None = None
    provenance: Provenance | None = None

    @model_validator(mode="after")
    def _not_self(self) -> "MemoryLinked":
        if self.from_memory_id == self.to_memory_id:
            raise ValueError("a memory cannot link to itself")
        return self


class DecisionRecorded(EventBase):
    """A decision whose outcome is not known yet (it waits for reflection)."""

    type: Literal["DecisionRecorded"] = "DecisionRecorded"
    schema_version: Literal[1] = 1
    decision_id: Identifier
    subject: Identifier
    rating: Rating
    decision_text: str
    horizon_days: Annotated[int, Field(ge=1, le=3650)] = 5
    deadline: AwareDatetime

    @field_validator("decision_text")
    @classmethod
    def _text(cls, v: str) -> str:
        return _check_text(v, MAX_MEMORY_CHARS, "decision_text")


class OutcomeObserved(EventBase):
    """What happened to a subject over a window; settles a decision when it covers the
    decision's whole horizon."""

    type: Literal["OutcomeObserved"] = "OutcomeObserved"
    schema_version: Literal[1] = 1
    outcome_id: Identifier
    decision_id: Identifier | None = None
    subject: Identifier
    raw_return: float
    benchmark_return: float | None = None
    alpha: float | None = None
    horizon_days: Annotated[int, Field(ge=0, le=3650)]
    window_start: AwareDatetime | None = None
    window_end: AwareDatetime | None = None
    source: ShortText = "producer"

    @model_validator(mode="after")
    def _finite(self) -> "OutcomeObserved":
        for name in ("raw_return", "benchmark_return", "alpha"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{name} is not a finite number")
        return self


class MemoryReflected(EventBase):
    """A short lesson (2-4 sentences) bound to a settled decision and its outcome."""

    type: Literal["MemoryReflected"] = "MemoryReflected"
    schema_version: Literal[1] = 1
    reflection_id: Identifier
    decision_id: Identifier
    outcome_id: Identifier
    subject: Identifier
    rating: Rating
    decision_text: str = ""
    raw_return: float | None = None
    alpha: float | None = None
    correct: bool | None = None
    content: str
    lesson: Annotated[str, StringConstraints(max_length=2000)] | None = None
    templated: bool = False
    provenance: Provenance | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: str) -> str:
        return _check_text(v, MAX_MEMORY_CHARS, "content")


class DecisionExpired(EventBase):
    """No outcome arrived by the deadline: the decision leaves the pending set, loudly."""

    type: Literal["DecisionExpired"] = "DecisionExpired"
    schema_version: Literal[1] = 1
    decision_id: Identifier
    subject: Identifier
    deadline: AwareDatetime
    reason: ShortText = "no outcome by the deadline"


Event = Annotated[
    Union[
        MessageObserved,
        MemoryAdded,
        MemoryLinked,
        DecisionRecorded,
        OutcomeObserved,
        MemoryReflected,
        DecisionExpired,
    ],
    Field(discriminator="type"),
]

EVENT_CLASSES: tuple[type[EventBase], ...] = (
    MessageObserved,
    MemoryAdded,
    MemoryLinked,
    DecisionRecorded,
    OutcomeObserved,
    MemoryReflected,
    DecisionExpired,
)
EVENT_TYPES: dict[str, type[EventBase]] = {
    c.model_fields["type"].default: c for c in EVENT_CLASSES
}
CURRENT_SCHEMA_VERSIONS: dict[str, int] = {
    name: cls.model_fields["schema_version"].default for name, cls in EVENT_TYPES.items()
}

_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)


def _format_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in EVENT_TYPES) or "event"
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_event(raw: Any) -> EventBase:
    """The one read path for events: check the type, upcast an older schema version to
    the current one, then validate. Raises :class:`EventValidationError` (one line)."""
    if not isinstance(raw, dict):
        raise EventValidationError(f"event must be a JSON object, got {type(raw).__name__}")
    etype = raw.get("type")
    if not isinstance(etype, str) or etype not in EVENT_TYPES:
        raise EventValidationError(
            f"unknown event type {etype!r} (known: {', '.join(sorted(EVENT_TYPES))})"
        )
    if "scope" not in raw or raw["scope"] in (None, {}):
        raise EventValidationError("scope: missing (every event needs a team_id)")
    try:
        upgraded = upcast(raw, CURRENT_SCHEMA_VERSIONS[etype])
    except ValueError as exc:
        raise EventValidationError(str(exc)) from None
    try:
        event: EventBase = _ADAPTER.validate_python(upgraded)
    except ValidationError as exc:
        raise EventValidationError(_format_error(exc)) from None
    return event
