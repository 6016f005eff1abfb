"""Arrow schemas of the LanceDB tables the projector writes, and their merge keys.

Every table leads with ``pk``, a single string key that ``merge_insert`` joins on:

* it is scoped: ``team_id|user_id|<id>`` (``|`` cannot occur in an identifier, so the
  key is unambiguous). Two tenants that happen to choose the same memory id can never
  overwrite each other's rows;
* it is a *leading* column and is never given a scalar index. lancedb #3177 / #3515
  (and lance #7596) silently updated nothing when the merge key had a scalar index, in
  particular when it was not a leading field; an unindexed leading key keeps upserts
  on the plain hash-join path. ``tests/projections`` keeps a regression test;
* upserts always write whole rows (never a partial schema), the other trigger of those
  bugs.

Times are ``timestamp[us, UTC]``. JSON-shaped fields (``metadata``, ``provenance``) are
JSON strings, so DuckDB and every Arrow consumer read them without a nested schema.
"""

from __future__ import annotations

from functools import lru_cache

import pyarrow as pa

__all__ = [
    "TIMESTAMP",
    "KEY_SEPARATOR",
    "TABLE_NAMES",
    "MEMORIES",
    "MESSAGES",
    "LINKS",
    "ENTITIES",
    "REFLECTIONS",
    "DECISIONS",
    "POSITIONS",
    "ENTITY_TYPE",
    "memories_schema",
    "messages_schema",
    "links_schema",
    "entities_schema",
    "reflections_schema",
    "decisions_schema",
    "positions_schema",
    "schema_for",
    "scoped_key",
    "DIGEST_COLUMNS",
    "UNCOMPRESSED",
]

TIMESTAMP = pa.timestamp("us", tz="UTC")
KEY_SEPARATOR = "|"

MEMORIES = "memories"
MESSAGES = "messages"
LINKS = "links"
ENTITIES = "entities"
REFLECTIONS = "reflections"
DECISIONS = "decisions"
POSITIONS = "positions"
TABLE_NAMES: tuple[str, ...] = (
    MEMORIES,
    MESSAGES,
    LINKS,
    ENTITIES,
    REFLECTIONS,
    DECISIONS,
    POSITIONS,
)

ENTITY_TYPE = pa.struct([pa.field("name", pa.string()), pa.field("kind", pa.string())])


def scoped_key(team_id: str, user_id: str, *parts: str) -> str:
    """``team|user|part...``: the ``pk`` of a row that belongs to one memory space."""
    return KEY_SEPARATOR.join((team_id, user_id, *parts))


def _log_fields() -> list[pa.Field]:
    """Where the row's latest event was read: provenance back to the log."""
    return [
        pa.field("log_topic", pa.string()),
        pa.field("log_partition", pa.int32()),
        pa.field("log_offset", pa.int64()),
        pa.field("event_id", pa.string()),
    ]


def _scope_fields() -> list[pa.Field]:
    return [
        pa.field("team_id", pa.string(), nullable=False),
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("agent_id", pa.string(), nullable=False),
    ]


def memories_schema(dim: int) -> pa.Schema:
    """One row per memory (L1). ``vector`` is the embedding of ``content`` made by
    ``embedding_model``; ``entity_keys`` holds the normalised entity names for filters;
    ``superseded_by`` / ``canonical_id`` / ``status`` are the view derived from links."""
    if dim < 1:
        raise ValueError("embedding dimension must be positive")
    return pa.schema(
        [
            pa.field("pk", pa.string(), nullable=False),
            pa.field("memory_id", pa.string(), nullable=False),
            *_scope_fields(),
            pa.field("session_id", pa.string()),
            pa.field("content", pa.string(), nullable=False),
            pa.field("content_hash", pa.string(), nullable=False),
            pa.field("memory_type", pa.string(), nullable=False),
            pa.field("priority", pa.int32(), nullable=False),
            pa.field("scene", pa.string()),
            pa.field("timestamp", TIMESTAMP),
            pa.field("timestamp_start", TIMESTAMP),
            pa.field("timestamp_end", TIMESTAMP),
            pa.field("source_message_ids", pa.list_(pa.string())),
            pa.field("entities", pa.list_(ENTITY_TYPE)),
            pa.field("entity_keys", pa.list_(pa.string())),
            pa.field("metadata", pa.string()),
            pa.field("provenance", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
            pa.field("embedding_model", pa.string(), nullable=False),
            pa.field("created_at", TIMESTAMP, nullable=False),
            pa.field("recorded_at", TIMESTAMP, nullable=False),
            pa.field("superseded_by", pa.string()),
            pa.field("canonical_id", pa.string()),
            pa.field("status", pa.string(), nullable=False),
            *_log_fields(),
        ]
    )


def messages_schema() -> pa.Schema:
    """One row per L0 conversation turn: the evidence memories point back to."""
    return pa.schema(
        [
            pa.field("pk", pa.string(), nullable=False),
            pa.field("message_id", pa.string(), nullable=False),
            *_scope_fields(),
            pa.field("session_id", pa.string()),
            pa.field("role", pa.string(), nullable=False),
            pa.field("speaker", pa.string()),
            pa.field("content", pa.string(), nullable=False),
            pa.field("content_hash", pa.string(), nullable=False),
            pa.field("metadata", pa.string()),
            pa.field("occurred_at", TIMESTAMP, nullable=False),
            pa.field("recorded_at", TIMESTAMP, nullable=False),
            *_log_fields(),
        ]
    )


def links_schema() -> pa.Schema:
    """One row per ``MemoryLinked`` (keyed by link id within the space). ``from_pk`` /
    ``to_pk`` are the scoped keys of both ends, so the projector derives the view of
    every memory a batch touches, across all spaces, with one query."""
    return pa.schema(
        [
            pa.field("pk", pa.string(), nullable=False),
            pa.field("link_id", pa.string(), nullable=False),
            *_scope_fields(),
            pa.field("from_memory_id", pa.string(), nullable=False),
            pa.field("to_memory_id", pa.string(), nullable=False),
            pa.field("from_pk", pa.string(), nullable=False),
            pa.field("to_pk", pa.string(), nullable=False),
            pa.field("relation", pa.string(), nullable=False),
            pa.field("decided_by", pa.string(), nullable=False),
            pa.field("reason", pa.string()),
            pa.field("provenance", pa.string()),
            pa.field("occurred_at", TIMESTAMP, nullable=False),
            pa.field("recorded_at", TIMESTAMP, nullable=False),
            *_log_fields(),
        ]
    )


def entities_schema() -> pa.Schema:
    """One row per (memory, entity): entity -> memory ids per space. ``name_key`` is the
    normalised name (``memstream.domain.content.normalize_content``)."""
    return pa.schema(
        [
            pa.field("pk", pa.string(), nullable=False),
            pa.field("team_id", pa.string(), nullable=False),
            pa.field("user_id", pa.string(), nullable=False),
            pa.field("name_key", pa.string(), nullable=False),
            pa.field("name", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("memory_id", pa.string(), nullable=False),
            pa.field("memory_pk", pa.string(), nullable=False),
            pa.field("agent_id", pa.string(), nullable=False),
            pa.field("occurred_at", TIMESTAMP, nullable=False),
            *_log_fields(),
        ]
    )


def reflections_schema() -> pa.Schema:
    """One row per ``MemoryReflected``: a lesson bound to a decision and its outcome."""
    return pa.schema(
        [
            pa.field("pk", pa.string(), nullable=False),
            pa.field("reflection_id", pa.string(), nullable=False),
            *_scope_fields(),
            pa.field("session_id", pa.string()),
            pa.field("decision_id", pa.string(), nullable=False),
            pa.field("outcome_id", pa.string(), nullable=False),
            pa.field("subject", pa.string(), nullable=False),
            pa.field("rating", pa.string(), nullable=False),
            pa.field("decision_text", pa.string()),
            pa.field("raw_return", pa.float64()),
            pa.field("alpha", pa.float64()),
            pa.field("correct", pa.bool_()),
            pa.field("content", pa.string(), nullable=False),
            pa.field("content_hash", pa.string(), nullable=False),
            pa.field("lesson", pa.string()),
            pa.field("templated", pa.bool_(), nullable=False),
            pa.field("provenance", pa.string()),
            pa.field("occurred_at", TIMESTAMP, nullable=False),
            pa.field("recorded_at", TIMESTAMP, nullable=False),
            *_log_fields(),
        ]
    )


def decisions_schema() -> pa.Schema:
    """The decision ledger: one row per decision id, combined from ``DecisionRecorded``
    (status ``pending``), ``DecisionExpired`` (``expired``: no outcome by the deadline,
    recorded loudly) and ``MemoryReflected`` (``reflected``). Status precedence is
    reflected > expired > pending whatever order the events arrive in, so a late
    outcome that was still reflected is not shown as expired."""
    return pa.schema(
        [
            pa.field("pk", pa.string(), nullable=False),
            pa.field("decision_id", pa.string(), nullable=False),
            *_scope_fields(),
            pa.field("subject", pa.string(), nullable=False),
            pa.field("rating", pa.string()),
            pa.field("decision_text", pa.string()),
            pa.field("horizon_days", pa.int32()),
            pa.field("deadline", TIMESTAMP),
            pa.field("status", pa.string(), nullable=False),
            pa.field("reason", pa.string()),
            pa.field("outcome_id", pa.string()),
            pa.field("reflection_id", pa.string()),
            pa.field("decided_at", TIMESTAMP),
            pa.field("settled_at", TIMESTAMP),
            *_log_fields(),
        ]
    )


def positions_schema() -> pa.Schema:
    """The next offset to read per (topic, partition), written after the rows it covers."""
    return pa.schema(
        [
            pa.field("pk", pa.string(), nullable=False),
            pa.field("topic", pa.string(), nullable=False),
            pa.field("partition", pa.int32(), nullable=False),
            pa.field("next_offset", pa.int64(), nullable=False),
            pa.field("updated_at", TIMESTAMP, nullable=False),
        ]
    )


@lru_cache(maxsize=64)
def schema_for(table: str, dim: int) -> pa.Schema:
    """The schema of one table (memories depends on the embedding dimension)."""
    builders = {
        MEMORIES: lambda: memories_schema(dim),
        MESSAGES: messages_schema,
        LINKS: links_schema,
        ENTITIES: entities_schema,
        REFLECTIONS: reflections_schema,
        DECISIONS: decisions_schema,
        POSITIONS: positions_schema,
    }
    try:
        build = builders[table]
    except KeyError:
        raise ValueError(f"unknown table {table!r}") from None
    return _uncompressed_strings(build())


UNCOMPRESSED = {b"lance-encoding:compression": b"none"}
"""Field metadata asking Lance to store a column without general compression."""


def _uncompressed_strings(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its string columns stored uncompressed (:data:`UNCOMPRESSED`):
    Lance's default string compression (FSST) cost more CPU than the rest of a row
    (figures in docs/benchmarks-history.md). The metadata is stored when a table is created; a
    table created without it keeps compressing, and reads either the same way."""
    return pa.schema(
        [f.with_metadata(UNCOMPRESSED) if pa.types.is_string(f.type) else f for f in schema],
        metadata=schema.metadata,
    )


DIGEST_COLUMNS: dict[str, tuple[str, ...]] = {
    MEMORIES: (
        "pk",
        "content_hash",
        "memory_type",
        "priority",
        "embedding_model",
        "superseded_by",
        "canonical_id",
        "status",
        "event_id",
    ),
    MESSAGES: ("pk", "content_hash", "role", "event_id"),
    LINKS: ("pk", "from_memory_id", "to_memory_id", "relation", "event_id"),
    ENTITIES: ("pk", "kind"),
    REFLECTIONS: ("pk", "content_hash", "decision_id", "outcome_id", "event_id"),
    DECISIONS: ("pk", "status", "outcome_id", "reflection_id"),
    POSITIONS: ("pk", "next_offset"),
}
"""What a replay must reproduce exactly, per table (see ``LanceStore.table_digest``):
keys, content hashes and the derived view; not wall-clock fields such as
``positions.updated_at``."""
