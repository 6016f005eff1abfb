"""The event model: the immutable, ADD-only facts that are memstream's source of truth.

Every event is a frozen pydantic model with an envelope (id, type, schema version,
times, a required scope) and a typed body. Nothing here touches Kafka or LanceDB:
the serializer in ``memstream.streams`` turns these into records and back, calling
:func:`parse_event` as the single read path (which upcasts old schema versions).

Validation is strict on purpose: the log is kept forever and replayed by every
projection, so a malformed event accepted once is a problem forever. What is checked,
with the one-line reason :class:`EventValidationError` carries:

* the ``type`` must be one of :data:`EVENT_TYPES`; the ``scope`` (at least a
  ``team_id``) is required; unknown fields are rejected;
* times are ISO 8601 strings (or ``datetime`` objects) *with* a UTC offset; naive
  times, numbers (epoch seconds or milliseconds are ambiguous) and times that leave the
  representable range once converted to UTC are rejected; all times are stored in UTC;
* ids (:data:`Identifier`) are 1..128 characters of ``[A-Za-z0-9_.:@/+=-]``;
* text is bounded and clean: ``MAX_MESSAGE_CHARS`` (32,000) characters for an L0
  conversation turn, ``MAX_MEMORY_CHARS`` (8,000) for a memory, reflection or decision
  text. Content must hold a non-whitespace character. Multi-line text may hold tab,
  newline and carriage return but no other C0 control character (U+0000..U+001F: NUL
  and friends break other languages' readers and terminals, and never carry meaning
  in a memory); one-line fields (names, labels) hold no control character at all.
  Nothing is silently stripped: an event is stored exactly as sent or refused, so its
  content hash is the producer's. Unpaired UTF-16 surrogates are refused everywhere
  (they cannot be encoded as UTF-8);
* numbers are JSON numbers, not strings or booleans (an integral float such as ``50.0``
  is accepted for an integer); floats are finite; ``priority`` is 0..100;
* memory types are the seven of :class:`MemoryType`, case-insensitive, with the legacy
  names mapped (``preference`` -> ``persona``, ``episode`` -> ``episodic``,
  ``instruct`` -> ``instruction``);
* embeddings are base64 of exactly ``dim`` little-endian float32 values, all finite;
* ``metadata`` is a JSON object (no NaN or infinities, no non-JSON values; Python
  tuples are stored as lists, as JSON will read them back).

Producers build events with the constructors (``event_id`` and times default to fresh
values); readers of the log call ``parse_event(raw, require_envelope=True)`` so that a
record without its own ``event_id`` or ``occurred_at`` is refused instead of being given
a different one on every replay.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Union

from annotated_types import Ge, Le
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    JsonValue,
    Strict,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic.types import AllowInfNan
from pydantic_core import core_schema

from memstream.domain.content import content_hash
from memstream.domain.embedding import EmbeddingCodecError, decode_array, encode_vector
from memstream.domain.upcasting import upcast

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_MEMORY_CHARS",
    "EVENT_CLASSES",
    "EVENT_TYPES",
    "CURRENT_SCHEMA_VERSIONS",
    "WIRE_REQUIRED_FIELDS",
    "Identifier",
    "UtcDatetime",
    "Scope",
    "MemoryType",
    "LinkRelation",
    "Rating",
    "EntityKind",
    "Entity",
    "lenient_entity_kind",
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
    "has_lone_surrogate",
    "describe_validation_error",
    "Name",
]

MAX_MESSAGE_CHARS = 32_000
"""Longest L0 conversation turn (``MessageObserved.content``), in Unicode code points."""
MAX_MEMORY_CHARS = 8_000
"""Longest memory, reflection or decision text, in Unicode code points."""

_IDENTIFIER_PATTERN = r"^[A-Za-z0-9_.:@/+=\-]+$"
Identifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=_IDENTIFIER_PATTERN),
]
"""An id: 1..128 characters of letters, digits and ``_.:@/+=-`` (no spaces, no controls)."""

# --- small reusable value rules -------------------------------------------------------

# C0 controls except tab, LF, CR, plus lone surrogates (unencodable as UTF-8).
_BAD_MULTILINE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")
_BAD_ONE_LINE = re.compile("[\x00-\x1f\ud800-\udfff]")
# The same sets as JSON Schema (ECMA-262 and Python ``re`` read these escapes alike).
_BAD_MULTILINE_JS = "[\\u0000-\\u0008\\u000B\\u000C\\u000E-\\u001F\\uD800-\\uDFFF]"
_BAD_ONE_LINE_JS = "[\\u0000-\\u001F\\uD800-\\uDFFF]"


def _show(value: Any, limit: int = 60) -> str:
    """A short, one-line rendering of untrusted input for error messages."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # e.g. an int too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad_character(value: str, multiline: bool) -> str | None:
    match = (_BAD_MULTILINE if multiline else _BAD_ONE_LINE).search(value)
    if match is None:
        return None
    code = ord(match.group())
    if 0xD800 <= code <= 0xDFFF:
        return f"holds an unpaired surrogate U+{code:04X} at position {match.start()} (not valid Unicode)"
    allowed = (
        "only tab, newline and carriage return are allowed"
        if multiline
        else "a one-line field allows no control characters"
    )
    return f"holds control character U+{code:04X} at position {match.start()} ({allowed})"


@dataclass(frozen=True)
class _Text:
    """A string rule: length bound, no forbidden characters, optionally non-blank.

    A marker for ``Annotated[str, _Text(...)]``: it adds one validator and publishes
    the same constraints in the JSON Schema, so the schema and the model agree.
    """

    max_chars: int
    multiline: bool = True
    required: bool = True
    per_item: bool = True
    """False: the rule is checked by the enclosing tuple's validator (:meth:`check_all`),
    all items at once; the item's schema still publishes the rule."""

    def __call__(self, value: str) -> str:
        if self.required and not value.strip():
            raise ValueError("is empty (it needs at least one non-whitespace character)")
        if len(value) > self.max_chars:
            raise ValueError(f"is {len(value)} characters; the limit is {self.max_chars}")
        problem = _bad_character(value, self.multiline)
        if problem:
            raise ValueError(problem)
        return value

    def check_all(self, values: tuple[str, ...]) -> tuple[str, ...]:
        """The rule over every item, in a few C-level passes over the whole tuple;
        only a tuple that fails is walked item by item for the message. Provenance
        lists carry dozens of refs per event, and a Python call per ref was a fifth of
        the projector's decoding of a memory event (measured)."""
        if not values:
            return values
        bad = _BAD_MULTILINE if self.multiline else _BAD_ONE_LINE
        if (
            max(map(len, values)) <= self.max_chars
            and bad.search("".join(values)) is None
            and (not self.required or all(map(str.strip, values)))
        ):
            return values
        for index, value in enumerate(values):
            try:
                self(value)
            except ValueError as exc:
                raise ValueError(f"item {index} {exc}") from None
        return values

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        if not self.per_item:
            return handler(source)
        return core_schema.no_info_after_validator_function(self, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        js = handler(schema)
        js["maxLength"] = self.max_chars
        if self.required:
            js["minLength"] = 1
            js["pattern"] = "\\S"
        js["not"] = {"pattern": _BAD_MULTILINE_JS if self.multiline else _BAD_ONE_LINE_JS}
        return js


@dataclass(frozen=True)
class _SchemaExtra:
    """Adds documentation-only keywords to a type's JSON Schema."""

    extra: tuple[tuple[str, Any], ...]

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        js = handler(schema)
        js.update(dict(self.extra))
        return js


# Field types of the models (text fields: limit, one-line or not, blank allowed or not).
MessageText = Annotated[str, _Text(MAX_MESSAGE_CHARS)]
MemoryText = Annotated[str, _Text(MAX_MEMORY_CHARS)]
OptionalMemoryText = Annotated[str, _Text(MAX_MEMORY_CHARS, required=False)]
Note = Annotated[str, _Text(2000, required=False)]
Scene = Annotated[str, _Text(500, required=False)]
Name = Annotated[str, _Text(200, multiline=False)]
Label = Annotated[str, _Text(200, multiline=False, required=False)]
Ref = Annotated[str, _Text(512, multiline=False)]
_REF_ITEM = _Text(512, multiline=False, per_item=False)
Refs = Annotated[tuple[Annotated[str, _REF_ITEM], ...], AfterValidator(_REF_ITEM.check_all)]
"""A tuple of refs, checked as a whole (same rule as :data:`Ref`)."""
ShortText = Annotated[str, _Text(512, multiline=False, required=False)]


def _number_input(value: Any) -> Any:
    """Numbers must arrive as numbers: ``"50"`` or ``true`` for a priority is a producer
    bug worth reporting, not a value to coerce. Integral floats (``50.0``, as some JSON
    libraries write them) and numpy scalars are accepted."""
    if isinstance(value, (bool, str, bytes, bytearray)):
        raise ValueError(f"must be a number, got {type(value).__name__}")
    return value


Number = BeforeValidator(_number_input)
"""Put it *last* in ``Annotated[...]``: it still runs first, and the bounds before it stay
in the JSON Schema as ``minimum``/``maximum``."""
StrictBool = Annotated[bool, Strict()]
FiniteFloat = Annotated[float, AllowInfNan(False), Number]
"""A JSON number (ints accepted), never a string or boolean, never NaN or infinite."""


def _datetime_input(value: Any) -> Any:
    """Refuse numbers and numeric strings: pydantic would read them as epoch seconds or
    milliseconds by magnitude, and a guess is not a fact worth keeping forever."""
    if isinstance(value, (bool, int, float)) or (
        isinstance(value, str) and _NUMERIC.fullmatch(value.strip())
    ):
        raise ValueError(
            "must be an ISO 8601 date-time with a UTC offset (e.g. 2025-01-31T09:30:00Z), not a number"
        )
    return value


_NUMERIC = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError("is out of the representable range once converted to UTC") from None


UtcDatetime = Annotated[AwareDatetime, BeforeValidator(_datetime_input), AfterValidator(_to_utc)]
"""A timezone-aware time, stored in UTC; naive times and numbers are refused."""


def _json_items(value: Any) -> Iterator[Any]:
    """Every node of a JSON tree (objects' keys included), depth first, without
    recursion: a tree nested a thousand levels deep must not overflow the stack."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def has_lone_surrogate(value: Any) -> bool:
    """Whether a string anywhere in a JSON tree (keys included) holds an unpaired UTF-16
    surrogate: not valid Unicode, and not encodable as UTF-8. The model refuses such
    text; the serializer checks decoded record bodies with the same walk."""
    return any(isinstance(item, str) and _SURROGATE.search(item) for item in _json_items(value))


def _check_json_tree(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """pydantic's ``JsonValue`` admits NaN, infinities and lone surrogates; JSON does not.

    The C encoder refuses both (a non-finite number; a lone surrogate once encoded to
    UTF-8) and walks a small tree several times faster than the generator below, which
    then runs only for a refused or very deep tree, to find the reason.
    """
    if not value:
        return value
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
        return value
    except (ValueError, UnicodeEncodeError, RecursionError, TypeError):
        pass
    for item in _json_items(value):
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError("holds a non-finite number (JSON has no NaN or Infinity)")
        elif isinstance(item, str):
            if _SURROGATE.search(item):
                raise ValueError("holds an unpaired surrogate (not valid Unicode)")
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_TUPLE_DEPTH = 64


def _tuples_to_lists(value: Any, depth: int = 0) -> Any:
    """Python callers may build metadata with tuples; JSON reads them back as arrays, so
    they are stored as lists from the start (an event equals its own round trip)."""
    if depth > _MAX_TUPLE_DEPTH:
        return value  # far deeper than any sane metadata; validation reports it
    if isinstance(value, tuple):
        return [_tuples_to_lists(v, depth + 1) for v in value]
    if isinstance(value, list) and any(isinstance(v, (tuple, list, dict)) for v in value):
        return [_tuples_to_lists(v, depth + 1) for v in value]
    if isinstance(value, dict) and any(isinstance(v, (tuple, list, dict)) for v in value.values()):
        return {k: _tuples_to_lists(v, depth + 1) for k, v in value.items()}
    return value


JsonObject = Annotated[
    dict[str, JsonValue], AfterValidator(_check_json_tree), BeforeValidator(_tuples_to_lists)
]
"""A JSON object: string keys, JSON values, finite numbers."""


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (naive datetimes are rejected everywhere).

    Only used as the default of an envelope's times when a producer builds an event;
    domain logic never reads the clock (it takes ``now`` as an argument).
    """
    return datetime.now(timezone.utc)


_IDS_PER_DRAW = 256
_random_ids: list[bytes] = []


def _forget_random_ids() -> None:
    _random_ids.clear()


# A forked child must not hand out the ids its parent drew (both would use them).
os.register_at_fork(after_in_child=_forget_random_ids)


def new_event_id() -> uuid.UUID:
    """A fresh random (version 4) event id, the idempotency key of an event.

    The randomness is drawn from the OS 256 ids at a time. ``uuid.uuid4()`` makes one
    ``getrandom`` call per id, and that call releases the interpreter lock: a thread
    building a batch of events, with other threads busy, may wait to get the lock back
    after every id (py-spy put a sixth of the worker's samples in ``uuid4`` during a
    bulk extraction; the ingest's wall time did not measurably change). ``list.pop``
    is atomic, so threads never share an id; a refill racing another only draws more
    than needed.
    """
    try:
        raw = _random_ids.pop()
    except IndexError:
        pool = os.urandom(16 * _IDS_PER_DRAW)
        _random_ids.extend(pool[i : i + 16] for i in range(16, len(pool), 16))
        raw = pool[:16]
    return uuid.UUID(bytes=raw, version=4)


class EventValidationError(ValueError):
    """An event that cannot be accepted; ``reason`` is one readable line."""

    def __init__(self, reason: str) -> None:
        reason = _one_line(reason)
        super().__init__(reason)
        self.reason = reason


def _one_line(text: str) -> str:
    """Escape control characters so a reason always prints as one line."""
    return _BAD_ONE_LINE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else "?", text)


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
                f"unknown memory type {_show(value)} (allowed: {allowed}; legacy: "
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


_ENTITY_KIND_ALIASES = {"organisation": "organization", "org": "organization", "location": "place"}


def lenient_entity_kind(v: Any) -> Any:
    """An extractor's entity kind as one of :class:`EntityKind`'s values: case and
    spacing ignored, a few aliases mapped, anything else ``other``. Non-strings are
    passed on unchanged (for the enum check to refuse)."""
    if isinstance(v, str):
        k = v.strip().lower()
        k = _ENTITY_KIND_ALIASES.get(k, k)
        return k if k in EntityKind.__members__ else "other"
    return v


_BASE64_PATTERN = "^[A-Za-z0-9+/]*={0,2}$"


class EmbeddingPayload(_Frozen):
    """A vector on the wire: little-endian float32, base64, with its model and dimension,
    so a replay never needs to re-embed."""

    model: Name
    dim: Annotated[int, Ge(1), Le(8192), Number]
    data: Annotated[str, _SchemaExtra((("pattern", _BASE64_PATTERN),))]

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
    content_hash: Annotated[str, _SchemaExtra((("pattern", "^(sha256:[0-9a-f]{64})?$"),))] = ""
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
                f"content_hash {_show(self.content_hash, 80)} does not match the normalised "
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

# --- error messages -------------------------------------------------------------------

_MAX_ERRORS_SHOWN = 3
_ISO_EXAMPLE = "e.g. 2025-01-31T09:30:00Z"


def _explain(err: Any) -> str:
    """One pydantic error -> a short human sentence (the field path is added by the caller)."""
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    value = err.get("input")
    msg = str(err.get("msg", "invalid"))
    if kind == "missing":
        return "missing"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "timezone_aware":
        return f"needs a UTC offset (naive date-times are ambiguous), {_ISO_EXAMPLE}"
    if kind in ("datetime_parsing", "datetime_from_date_parsing", "datetime_type", "datetime_object_invalid"):
        return f"is not an ISO 8601 date-time, {_ISO_EXAMPLE}"
    if kind in ("uuid_parsing", "uuid_type", "uuid_version"):
        return "is not a UUID"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        bound = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">", "less_than": "<"}[kind]
        limit = next(iter(ctx.values()), "?")
        return f"must be {bound} {limit}, got {_show(value, 40)}"
    if kind == "string_too_long":
        size = len(value) if isinstance(value, str) else "?"
        return f"is {size} characters; the limit is {ctx.get('max_length')}"
    if kind == "string_too_short":
        return "is empty"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == _IDENTIFIER_PATTERN:
        return "is not an id (1-128 characters of letters, digits and _.:@/+=-; no spaces or control characters)"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer, got {type(value).__name__}"
    if kind in ("float_type", "float_parsing"):
        if isinstance(value, int) and not isinstance(value, bool):
            return "is out of range for a 64-bit float"
        return f"must be a number, got {type(value).__name__}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false, got {type(value).__name__}"
    if kind in ("string_type",):
        return f"must be a string, got {type(value).__name__}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a JSON object, got {type(value).__name__}"
    if kind in ("tuple_type", "list_type"):
        return f"must be a JSON array, got {type(value).__name__}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind in ("recursion_loop", "recursion_depth_exceeded"):
        return "is nested too deeply"
    if kind == "invalid_key":
        return "field names must be strings"
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


_MAX_LOC_PARTS = 4


def _location(loc: tuple[Any, ...]) -> str:
    """``("metadata", "a", "dict", ...)`` -> ``metadata.a.dict...``: short, one line."""
    parts = []
    for part in loc[:_MAX_LOC_PARTS]:
        text = part if isinstance(part, str) else str(part) if isinstance(part, int) else _show(part)
        parts.append(text if len(text) <= 60 else text[:57] + "...")
    tail = "..." if len(loc) > _MAX_LOC_PARTS else ""
    return ".".join(parts) + tail or "event"


def describe_validation_error(exc: ValidationError) -> str:
    """pydantic's report as the one line memstream shows everywhere: the first problems,
    each as ``field.path: short sentence`` (used for events, and by the interfaces for
    any input checked with this module's types)."""
    errors = exc.errors()
    parts = [f"{_location(tuple(e.get('loc', ())))}: {_explain(e)}" for e in errors[:_MAX_ERRORS_SHOWN]]
    more = len(errors) - _MAX_ERRORS_SHOWN
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_event(raw: Any, *, require_envelope: bool = False) -> EventBase:
    """The one read path for events: check the type, upcast an older schema version to
    the current one, then validate. Raises :class:`EventValidationError` (one line) and
    nothing else, whatever ``raw`` is.

    With ``require_envelope`` (the path for records read back from the log) the
    event must carry its own ``event_id`` and ``occurred_at``, and a missing
    ``recorded_at`` is taken to equal ``occurred_at``: filled in by the reader they
    would differ on every read, and a replay must rebuild exactly the same view. The
    default (lenient) path is for producers building a new event, where the defaults
    are assigned once, before the event is written.
    """
    if not isinstance(raw, dict):
        raise EventValidationError(f"event must be a JSON object, got {type(raw).__name__}")
    etype = raw.get("type")
    if not isinstance(etype, str) or etype not in EVENT_TYPES:
        raise EventValidationError(
            f"unknown event type {_show(etype)} (known: {', '.join(sorted(EVENT_TYPES))})"
        )
    if "scope" not in raw or raw["scope"] is None or raw["scope"] == {}:
        raise EventValidationError("scope: missing (every event needs a scope with a team_id)")
    try:
        upgraded = upcast(raw, CURRENT_SCHEMA_VERSIONS[etype])
    except ValueError as exc:
        raise EventValidationError(str(exc)) from None
    if require_envelope:
        for name in ("event_id", "occurred_at"):
            if upgraded.get(name) is None:
                raise EventValidationError(f"{name}: missing (a record on the log must carry its own)")
        if upgraded.get("recorded_at") is None:
            upgraded = {**upgraded, "recorded_at": upgraded["occurred_at"]}
    try:
        return EVENT_TYPES[etype].model_validate(upgraded)
    except ValidationError as exc:
        raise EventValidationError(describe_validation_error(exc)) from None
    except RecursionError:
        raise EventValidationError("event is nested too deeply") from None
