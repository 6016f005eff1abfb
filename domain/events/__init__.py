"""The event model: the immutable, ADD-only facts that are memstream's source of truth.

Every event is a frozen pydantic model (:mod:`.models`) with an envelope (id, type,
schema version, times, a required scope) and a typed body whose fields use the value
rules of :mod:`.values`. Writers build events with :func:`build_event` (one
constructor for every event type); readers call :func:`parse_event`, the single read
path, which upcasts older schema versions (``memstream.domain.upcasting``) and then
validates. Nothing here touches Kafka or LanceDB: ``memstream.codec`` maps events to
bytes and back.

Validation is strict because the log is kept forever and replayed by every projection:

* the ``type`` must be one of :data:`EVENT_TYPES`; the ``scope`` (at least a
  ``team_id``) is required; unknown fields are rejected;
* times are ISO 8601 with a UTC offset (naive times and numbers are refused) and are
  stored in UTC; ids are 1..128 characters of ``[A-Za-z0-9_.:@/+=-]``;
* text is bounded (``MAX_MESSAGE_CHARS`` for a turn, ``MAX_MEMORY_CHARS`` for a memory,
  reflection or decision), non-blank where required, free of C0 controls other than
  tab/newline/return in multi-line text and of any control in one-line fields, and of
  unpaired surrogates; nothing is silently stripped;
* numbers are JSON numbers (not strings or booleans), floats finite, ``priority`` 0..100;
* memory types are the seven of :class:`MemoryType`, case-insensitive, legacy names
  mapped; embeddings are base64 of exactly ``dim`` finite little-endian float32 values;
* ``metadata`` is a JSON object (finite numbers; tuples stored as lists).
"""

from memstream.domain.events.models import (
    CURRENT_SCHEMA_VERSIONS,
    EVENT_CLASSES,
    EVENT_TYPES,
    WIRE_REQUIRED_FIELDS,
    DecisionExpired,
    SubjectForgotten,
    DecisionRecorded,
    EmbeddingPayload,
    Entity,
    EntityKind,
    Event,
    EventBase,
    LinkRelation,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MemoryType,
    MessageObserved,
    OutcomeObserved,
    Provenance,
    Rating,
    Scope,
    lenient_entity_kind,
)
from memstream.domain.events.parsing import build_event, describe_validation_error, parse_event
from memstream.domain.events.values import (
    IDENTIFIER_PATTERN,
    JSON_TYPE_VALIDATORS,
    MAX_MEMORY_CHARS,
    MAX_MESSAGE_CHARS,
    EventValidationError,
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
    Ref,
    Refs,
    Scene,
    SchemaNote,
    ShortText,
    StrictBool,
    TextRule,
    UtcDatetime,
    has_lone_surrogate,
    new_event_id,
    utcnow,
)

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
    "SubjectForgotten",
    "Event",
    "EventValidationError",
    "parse_event",
    "build_event",
    "utcnow",
    "new_event_id",
    "has_lone_surrogate",
    "describe_validation_error",
    "Name",
]
