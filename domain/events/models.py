"""The event models: an envelope every event carries and one frozen model per event type.

Constructors fill ``event_id`` and the times with fresh values; readers of the log go
through :func:`memstream.domain.events.parse_event`, which refuses records without
their own (see ``WIRE_REQUIRED_FIELDS``).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Union

from annotated_types import Ge, Le
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.types import AllowInfNan

from memstream.domain.content import content_hash
from memstream.domain.embedding import EmbeddingCodecError, decode_array, encode_vector
from memstream.domain.events.values import (
    FiniteFloat,
    Identifier,
    JsonObject,
    Label,
    MemoryText,
    MessageText,
    Name,
    Note,
    Number,
    OptionalMemoryText,
    Refs,
    Scene,
    SchemaNote,
    ShortText,
    StrictBool,
    UtcDatetime,
    new_event_id,
    show,
    utcnow,
)

class _Frozen(BaseModel):
    # ``ser_json_inf_nan``: a non-finite number (only in a model built without
    # validation) is written as a bare ``NaN`` token the serializer can see and refuse,
    # never silently as ``null``.
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        str_strip_whitespace=False,
        hide_input_in_errors=True,
        ser_json_inf_nan="constants",
    )


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
        """Lenient parse: case-insensitive, ``-`` or space for ``_``, legacy names mapped
        (``preference``, ``episode``, ``instruct``); unknown names raise ``ValueError``."""
        if not isinstance(value, str):
            raise ValueError(f"memory type must be a string, got {type(value).__name__}")
        key = value.strip().lower().replace("-", "_").replace(" ", "_")
        key = _LEGACY_MEMORY_TYPES.get(key, key)
        try:
            return cls(key)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise ValueError(
                f"unknown memory type {show(value)} (allowed: {allowed}; legacy: "
                "preference, episode, instruct)"
            ) from None


_LEGACY_MEMORY_TYPES = {"preference": "persona", "episode": "episodic", "instruct": "instruction"}
MemoryType.LEGACY = dict(_LEGACY_MEMORY_TYPES)


class LinkRelation(StrEnum):
    """How two memories relate; the projection derives the current view from these."""

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
    """Coarse entity kinds; anything else an extractor reports is kept as ``other``."""

    person = "person"
    place = "place"
    organization = "organization"
    product = "product"
    other = "other"


class Entity(_Frozen):
    """A named thing a memory mentions (the projection indexes memories by entity)."""

    name: Name
    kind: EntityKind = EntityKind.other

    @field_validator("kind", mode="before")
    @classmethod
    def _lenient_kind(cls, v: Any) -> Any:
        return lenient_entity_kind(v)


_ENTITY_KINDS = frozenset(EntityKind.__members__)
_ENTITY_KIND_ALIASES = {"organisation": "organization", "org": "organization", "location": "place"}


def lenient_entity_kind(v: Any) -> Any:
    """An extractor's entity kind as one of :class:`EntityKind`'s values: case and
    spacing ignored, a few aliases mapped, anything else ``other``. Non-strings are
    passed on unchanged (for the enum check to refuse)."""
    if isinstance(v, str):
        k = v.strip().lower()
        k = _ENTITY_KIND_ALIASES.get(k, k)
        return k if k in _ENTITY_KINDS else "other"
    return v


_BASE64_PATTERN = "^[A-Za-z0-9+/]*={0,2}$"


class EmbeddingPayload(_Frozen):
    """A vector on the wire: little-endian float32, base64, with its model and dimension,
    so a replay never needs to re-embed."""

    model: Name
    dim: Annotated[int, Ge(1), Le(8192), Number]
    data: Annotated[str, SchemaNote((("pattern", _BASE64_PATTERN),))]

    @model_validator(mode="after")
    def _check_payload(self) -> "EmbeddingPayload":
        try:
            arr = decode_array(self.data, self.dim)
        except EmbeddingCodecError as exc:
            raise ValueError(str(exc)) from None
        # One float sum instead of a check per component: float32 values cannot
        # overflow a double sum, so it is non-finite exactly when one value is.
        if not math.isfinite(float(arr.sum(dtype="float64"))):
            raise ValueError("embedding holds NaN or infinite values")
        return self

    @classmethod
    def from_vector(cls, model: str, values: Sequence[float]) -> "EmbeddingPayload":
        """Encode ``values`` (rounded to float32) as a payload of ``model``."""
        return cls(model=model, dim=len(values), data=encode_vector(values))

    def to_vector(self) -> list[float]:
        """The float32 values, exactly as encoded."""
        return [float(x) for x in self.to_array()]

    def to_array(self) -> Any:
        """The values as a read-only little-endian float32 numpy array."""
        # Validated when the payload was built: decoding again is one C call (cheaper
        # than caching it on a pydantic model, whose private attributes are slow).
        return decode_array(self.data, self.dim)


class Provenance(_Frozen):
    """How a derived event came to be: which prompt, which model, from which inputs."""

    method: Literal["llm", "heuristic", "agent", "api", "rule", "template"] = "agent"
    prompt_id: Label | None = None
    prompt_version: Label | None = None
    prompt_sha256: Label | None = None
    model: Label | None = None
    input_refs: Refs = ()
    output_refs: Refs = ()
    latency_ms: Annotated[float, AllowInfNan(False), Ge(0), Number] | None = None
    token_usage: dict[Label, Annotated[int, Ge(0), Number]] = Field(default_factory=dict)
    status: Label = "ok"
    decisions: tuple[JsonObject, ...] = ()
    note: Note | None = None


WIRE_REQUIRED_FIELDS: tuple[str, ...] = ("type", "schema_version", "event_id", "occurred_at", "scope")
"""Envelope fields a record on the wire must carry (the published JSON Schemas require
them): an event id and time filled in by the *reader* would differ on every replay."""


class EventBase(_Frozen):
    """The envelope every event carries."""

    type: str
    schema_version: int
    event_id: uuid.UUID = Field(
        default_factory=new_event_id,
        description="Unique id; the idempotency key (a retried send reuses it).",
    )
    occurred_at: UtcDatetime = Field(
        default_factory=utcnow, description="When it happened in the world (with a UTC offset)."
    )
    recorded_at: UtcDatetime = Field(
        default_factory=utcnow, description="When it was recorded (defaults to occurred_at on the wire)."
    )
    scope: Scope
    session_id: Identifier | None = None
    task_id: Identifier | None = None
    causation_id: Identifier | None = None
    correlation_id: Identifier | None = None
    producer: ShortText | None = None


class MessageObserved(EventBase):
    """One L0 conversation turn, the raw evidence every memory points back to."""

    type: Literal["MessageObserved"] = "MessageObserved"
    schema_version: Literal[1] = 1
    message_id: Identifier
    role: Literal["user", "assistant", "system", "tool"] = "user"
    speaker: Label | None = None
    content: MessageText
    metadata: JsonObject = Field(default_factory=dict)


class MemoryAdded(EventBase):
    """One atomic L1 memory. ``content_hash`` is computed from the content when absent and
    must match it when given (it is what exact dedup keys on)."""

    type: Literal["MemoryAdded"] = "MemoryAdded"
    schema_version: Literal[2] = 2
    memory_id: Identifier
    content: MemoryText
    content_hash: Annotated[str, SchemaNote((("pattern", "^(sha256:[0-9a-f]{64})?$"),))] = ""
    memory_type: MemoryType = MemoryType.episodic
    priority: Annotated[int, Ge(0), Le(100), Number] = 50
    scene: Scene | None = None
    source_message_ids: tuple[Identifier, ...] = ()
    timestamp: UtcDatetime | None = None
    timestamp_start: UtcDatetime | None = None
    timestamp_end: UtcDatetime | None = None
    entities: tuple[Entity, ...] = ()
    metadata: JsonObject = Field(default_factory=dict)
    embedding: EmbeddingPayload | None = None
    provenance: Provenance | None = None

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
            raise ValueError(
                f"content_hash {show(self.content_hash, 80)} does not match the normalised "
                f"content ({expected})"
            )
        if self.timestamp_start and self.timestamp_end and self.timestamp_end < self.timestamp_start:
            raise ValueError("timestamp_end is before timestamp_start")
        return self


class MemoryLinked(EventBase):
    """A relation between two memories; "update", "merge", "contradict" are these."""

    type: Literal["MemoryLinked"] = "MemoryLinked"
    schema_version: Literal[1] = 1
    link_id: Identifier = Field(default_factory=lambda: str(new_event_id()))
    from_memory_id: Identifier
    to_memory_id: Identifier
    relation: LinkRelation
    decided_by: Literal["rule", "llm", "agent"] = "agent"
    reason: Note | None = None
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
    decision_text: MemoryText
    horizon_days: Annotated[int, Ge(1), Le(3650), Number] = 5
    deadline: UtcDatetime


class OutcomeObserved(EventBase):
    """What happened to a subject over a window; settles a decision when it covers the
    decision's whole horizon."""

    type: Literal["OutcomeObserved"] = "OutcomeObserved"
    schema_version: Literal[1] = 1
    outcome_id: Identifier
    decision_id: Identifier | None = None
    subject: Identifier
    raw_return: FiniteFloat
    benchmark_return: FiniteFloat | None = None
    alpha: FiniteFloat | None = None
    horizon_days: Annotated[int, Ge(0), Le(3650), Number]
    window_start: UtcDatetime | None = None
    window_end: UtcDatetime | None = None
    source: ShortText = "producer"

    @model_validator(mode="after")
    def _window(self) -> "OutcomeObserved":
        if self.window_start and self.window_end and self.window_end < self.window_start:
            raise ValueError("window_end is before window_start")
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
    decision_text: OptionalMemoryText = ""
    raw_return: FiniteFloat | None = None
    alpha: FiniteFloat | None = None
    correct: StrictBool | None = None
    content: MemoryText
    lesson: Note | None = None
    templated: StrictBool = False
    provenance: Provenance | None = None


class DecisionExpired(EventBase):
    """No outcome arrived by the deadline: the decision leaves the pending set, loudly."""

    type: Literal["DecisionExpired"] = "DecisionExpired"
    schema_version: Literal[1] = 1
    decision_id: Identifier
    subject: Identifier
    deadline: UtcDatetime
    reason: ShortText = "no outcome by the deadline"


class SubjectForgotten(EventBase):
    """A data subject (one user's memory space) was forgotten: the keys named here are
    tombstoned and every projection deletes the space's rows (``whole_team``: every
    space of the team). Written unsealed: it holds ids only (docs/security.md)."""

    type: Literal["SubjectForgotten"] = "SubjectForgotten"
    schema_version: Literal[1] = 1
    whole_team: StrictBool = False
    key_ids: tuple[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")], ...] = ()


Event = Annotated[
    Union[
        MessageObserved,
        MemoryAdded,
        MemoryLinked,
        DecisionRecorded,
        OutcomeObserved,
        MemoryReflected,
        DecisionExpired,
        SubjectForgotten,
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
    SubjectForgotten,
)
EVENT_TYPES: dict[str, type[EventBase]] = {
    c.model_fields["type"].default: c for c in EVENT_CLASSES
}
CURRENT_SCHEMA_VERSIONS: dict[str, int] = {
    name: cls.model_fields["schema_version"].default for name, cls in EVENT_TYPES.items()
}
