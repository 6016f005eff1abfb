"""The one map from events to LanceDB rows.

A row is built from the event's :func:`~memstream.codec.values.event_values`: every
column of a table's Arrow schema whose name is a field of the event (the scope's ids
included) is copied from it (JSON-shaped fields as canonical JSON text), and only the
columns listed in ``DERIVED`` (keys, log positions, the vector, the derived view) are
computed here. The map is checked at import: a column that is neither a field nor
derived stops it. So adding a field to an event and a column of the same name to its
table is all a new stored field takes; ``tests/projections/projector/test_rows.py`` checks that
every field is stored or listed in :data:`UNSTORED_FIELDS`.

Memories come two ways, the same rows either way: one event at a time
(:func:`memory_row`) or column by column from the fast path's values
(:func:`memories_table`, for a whole batch without a dict per row).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import UnionType
from typing import Any, Union, get_args, get_origin

import numpy as np
import pyarrow as pa
from pydantic import BaseModel

from memstream.codec.batch import PositionedMemories
from memstream.codec.values import Values, ValuesRecord, event_values, tuples_of, value_names
from memstream.domain.content import content_hash, normalize_content
from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    EventBase,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MessageObserved,
)
from memstream.projections.schema import ENTITIES, LINKS, MEMORIES, MESSAGES, REFLECTIONS, schema_for, scoped_key

__all__ = [
    "DERIVED",
    "UNSTORED_FIELDS",
    "Position",
    "View",
    "canonical_json",
    "unique_entities",
    "entity_row",
    "memory_pk",
    "memory_row",
    "decision_update",
    "message_row",
    "link_row",
    "reflection_row",
    "memories_table",
    "arrow_table",
]

Position = tuple[str, int, int]
View = tuple[str | None, str | None, str]
ACTIVE: View = (None, None, "active")

_LOG = ("log_topic", "log_partition", "log_offset")
DERIVED: dict[str, tuple[str, ...]] = {
    MEMORIES: ("pk", "entities", "entity_keys", "vector", "embedding_model", "created_at",
               "superseded_by", "canonical_id", "status", *_LOG),
    MESSAGES: ("pk", "content_hash", *_LOG),
    LINKS: ("pk", "from_pk", "to_pk", *_LOG),
    REFLECTIONS: ("pk", "content_hash", "decision_text", *_LOG),
}
"""Columns computed here, per table; every other column is the event field of its name."""

UNSTORED_FIELDS: dict[str, frozenset[str]] = {
    MEMORIES: frozenset({"type", "schema_version", "task_id", "causation_id", "correlation_id", "producer",
                         "occurred_at", "embedding"}),
    MESSAGES: frozenset({"type", "schema_version", "task_id", "causation_id", "correlation_id", "producer"}),
    LINKS: frozenset({"type", "schema_version", "session_id", "task_id", "causation_id", "correlation_id",
                      "producer"}),
    REFLECTIONS: frozenset({"type", "schema_version", "task_id", "causation_id", "correlation_id", "producer"}),
}
"""Event fields a table does not keep (``occurred_at`` of a memory is ``created_at``;
its vector is ``vector``)."""

_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def canonical_json(value: Any) -> str:
    """Canonical JSON (sorted keys), so equal metadata always stores equal text."""
    if not value:
        return "{}" if isinstance(value, dict) else _ENCODER.encode(value)
    return _ENCODER.encode(value)


def _structured(cls: type[EventBase], name: str) -> bool:
    """Whether field ``name`` holds a JSON object (stored as JSON text)."""
    info = cls.model_fields.get(name)
    if info is None:
        return False
    ann = info.annotation
    options = [a for a in get_args(ann) if a is not type(None)] if get_origin(ann) in (Union, UnionType) else [ann]
    return any(get_origin(a) is dict or a is dict or (isinstance(a, type) and issubclass(a, BaseModel)) for a in options)


@dataclass(frozen=True)
class _Columns:
    """Which columns of ``table`` are copied from an event of ``cls`` (``json``: as
    canonical JSON text)."""

    copied: tuple[str, ...]
    json: tuple[str, ...]


def _columns(table: str, cls: type[EventBase]) -> _Columns:
    names = set(value_names(cls))  # type: ignore[arg-type]  # classes are hashable
    derived = DERIVED[table]
    copied, as_json = [], []
    for f in schema_for(table, 1):
        if f.name in derived:
            continue
        if f.name not in names:
            raise TypeError(f"column {table}.{f.name} is neither a field of {cls.__name__} nor derived in projections.rows")
        copied.append(f.name)
        if pa.types.is_string(f.type) and _structured(cls, f.name):
            as_json.append(f.name)
    return _Columns(tuple(copied), tuple(as_json))


_COLUMNS = {
    MEMORIES: _columns(MEMORIES, MemoryAdded),
    MESSAGES: _columns(MESSAGES, MessageObserved),
    LINKS: _columns(LINKS, MemoryLinked),
    REFLECTIONS: _columns(REFLECTIONS, MemoryReflected),
}


def _copied(table: str, values: Values) -> dict[str, Any]:
    cols = _COLUMNS[table]
    row = {name: values[name] for name in cols.copied}
    for name in cols.json:
        value = row[name]
        row[name] = None if value is None else canonical_json(value)
    return row


def _log(position: Position) -> dict[str, Any]:
    return {"log_topic": position[0], "log_partition": position[1], "log_offset": position[2]}


def unique_entities(entities: Iterable[Mapping[str, str]]) -> tuple[list[dict[str, str]], list[str]]:
    """A memory's entities once each by normalised name (first spelling kept), as the
    ``entities`` column and the ``entity_keys`` filter column."""
    out: list[dict[str, str]] = []
    keys: list[str] = []
    for entity in entities:
        key = normalize_content(entity["name"])
        if key and key not in keys:
            keys.append(key)
            out.append({"name": entity["name"], "kind": entity["kind"]})
    return out, keys


def memory_pk(values: Values) -> str:
    return scoped_key(values["team_id"], values["user_id"], values["memory_id"])


def memory_row(values: Values, position: Position, model: str, view: View = ACTIVE) -> dict[str, Any]:
    """One ``memories`` row (without its vector) of a ``MemoryAdded``'s values."""
    entities, keys = unique_entities(values["entities"])
    return {
        **_copied(MEMORIES, values),
        "pk": memory_pk(values),
        "entities": entities,
        "entity_keys": keys,
        "embedding_model": model,
        "created_at": values["occurred_at"],
        "superseded_by": view[0],
        "canonical_id": view[1],
        "status": view[2],
        **_log(position),
    }


def message_row(event: MessageObserved, position: Position) -> dict[str, Any]:
    """One ``messages`` row of a turn."""
    values = event_values(event)
    return {
        **_copied(MESSAGES, values),
        "pk": scoped_key(values["team_id"], values["user_id"], values["message_id"]),
        "content_hash": content_hash(event.content),
        **_log(position),
    }


def link_row(event: MemoryLinked, position: Position) -> dict[str, Any]:
    """One ``links`` row; ``from_pk``/``to_pk`` are the scoped keys of both ends. A
    link id belongs to its agent (the key holds it): another agent reusing the id
    writes its own row and never replaces this one."""
    values = event_values(event)
    team, user = values["team_id"], values["user_id"]
    return {
        **_copied(LINKS, values),
        "pk": scoped_key(team, user, values["agent_id"], values["link_id"]),
        "from_pk": scoped_key(team, user, values["from_memory_id"]),
        "to_pk": scoped_key(team, user, values["to_memory_id"]),
        **_log(position),
    }


def reflection_row(event: MemoryReflected, position: Position) -> dict[str, Any]:
    """One ``reflections`` row (an empty decision text is stored as null)."""
    values = event_values(event)
    return {
        **_copied(REFLECTIONS, values),
        "pk": scoped_key(values["team_id"], values["user_id"], values["reflection_id"]),
        "content_hash": content_hash(event.content),
        "decision_text": values["decision_text"] or None,
        **_log(position),
    }


def decision_update(
    event: DecisionRecorded | DecisionExpired | MemoryReflected, position: Position, *, status: str, **fields: Any
) -> dict[str, Any]:
    """One event's update of a decision's ledger row: the key and identity every
    decision event carries, plus the ``fields`` this event type knows (merged into the
    stored row by the plan writer: a later event fills what it knows). A decision id
    belongs to its agent, as in the reflector (``decision_key``)."""
    scope = event.scope
    return {
        "pk": scoped_key(scope.team_id, scope.user_id, scope.agent_id, event.decision_id),
        "decision_id": event.decision_id,
        "team_id": scope.team_id,
        "user_id": scope.user_id,
        "agent_id": scope.agent_id,
        "subject": event.subject,
        **fields,
        "status": status,
        **_log(position),
        "event_id": str(event.event_id),
    }


def entity_row(memory_pk: str, key: str, entity: Mapping[str, str], memory: Mapping[str, Any]) -> dict[str, Any]:
    """One ``entities`` row: the entity ``key`` named by the memory row ``memory``."""
    return {
        "pk": f"{memory_pk}|{key}",
        "team_id": memory["team_id"],
        "user_id": memory["user_id"],
        "name_key": key,
        "name": entity["name"],
        "kind": entity["kind"],
        "memory_id": memory["memory_id"],
        "memory_pk": memory_pk,
        "agent_id": memory["agent_id"],
        "occurred_at": memory["created_at"],
        "log_topic": memory["log_topic"],
        "log_partition": memory["log_partition"],
        "log_offset": memory["log_offset"],
        "event_id": memory["event_id"],
    }


def _vector_column(matrix: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    flat = np.ascontiguousarray(matrix, dtype=np.float32).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.float32()), dim)


def memories_table(
    memories: PositionedMemories, picks: Mapping[str, int], views: Mapping[str, View], *, dim: int
) -> tuple[pa.Table, pa.Table]:
    """The ``memories`` rows of ``picks`` (pk -> row of ``memories``) with their derived
    ``views`` (default: active), and the ``entities`` rows they name, column by column."""
    pks = list(picks)
    idx = list(picks.values())
    rows = [memories.fields[i] for i in idx]
    positions = [memories.positions[i] for i in idx]
    cols = _COLUMNS[MEMORIES]
    # One C-level transpose of the copied values (a list comprehension per column costs
    # more than the rest of the table).
    table = zip(*tuples_of(type(rows[0]), cols.copied)(rows)) if rows else ([] for _ in cols.copied)  # type: ignore[arg-type]  # classes are hashable
    columns: dict[str, Any] = {name: list(values) for name, values in zip(cols.copied, table)}
    for name in cols.json:
        columns[name] = [None if v is None else canonical_json(v) for v in columns[name]]
    ents, keys, owners = _entity_columns(rows)
    view = [views.get(pk, ACTIVE) for pk in pks]
    columns.update(
        pk=pks,
        entities=ents,
        entity_keys=keys,
        vector=_vector_column(memories.vectors[idx], dim),
        embedding_model=[memories.model] * len(rows),
        created_at=[r.occurred_at for r in rows],
        superseded_by=[v[0] for v in view],
        canonical_id=[v[1] for v in view],
        status=[v[2] for v in view],
        log_topic=[p[0] for p in positions],
        log_partition=[p[1] for p in positions],
        log_offset=[p[2] for p in positions],
    )
    entity_columns = {
        "pk": [f"{pks[j]}|{key}" for j, key, _ in owners],
        "name_key": [key for _, key, _ in owners],
        "name": [e["name"] for _, _, e in owners],
        "kind": [e["kind"] for _, _, e in owners],
        "memory_pk": [pks[j] for j, _, _ in owners],
        "occurred_at": [rows[j].occurred_at for j, _, _ in owners],
        **{name: [columns[name][j] for j, _, _ in owners]
           for name in ("team_id", "user_id", "memory_id", "agent_id", "log_topic", "log_partition",
                        "log_offset", "event_id")},
    }
    return _from_columns(schema_for(MEMORIES, dim), columns), _from_columns(schema_for(ENTITIES, dim), entity_columns)


def _entity_columns(rows: list[ValuesRecord]) -> tuple[list[list[dict[str, str]]], list[list[str]], list[tuple[int, str, dict[str, str]]]]:
    """Each row's unique entities and keys, and (row, key, entity) of every entity row."""
    ents: list[list[dict[str, str]]] = []
    keys: list[list[str]] = []
    owners: list[tuple[int, str, dict[str, str]]] = []
    for j, row in enumerate(rows):
        found = row.entities
        if not found:
            ents.append([])
            keys.append([])
            continue
        e, k = unique_entities(found)
        ents.append(e)
        keys.append(k)
        owners.extend((j, key, entity) for key, entity in zip(k, e))
    return ents, keys, owners


def _from_columns(schema: pa.Schema, columns: Mapping[str, Any]) -> pa.Table:
    """A table of ``schema`` from one list (or Arrow array) per column."""
    arrays = [
        col if isinstance(col, pa.Array) else pa.array(col, type=f.type)
        for f, col in ((f, columns[f.name]) for f in schema)
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def arrow_table(name: str, dim: int, rows: list[dict[str, Any]], vectors: np.ndarray | None = None) -> pa.Table:
    """Rows (dicts) as an Arrow table of exactly the table's schema (keys outside the
    schema are ignored); the vector column comes from a float32 matrix in one piece."""
    schema = schema_for(name, dim)
    if "vector" not in schema.names:
        return pa.Table.from_pylist(rows, schema=schema)
    if vectors is None or vectors.shape != (len(rows), dim):
        raise ValueError("vector matrix does not match the rows")
    at = schema.get_field_index("vector")
    base = pa.Table.from_pylist(rows, schema=schema.remove(at))
    return base.add_column(at, schema.field(at), _vector_column(vectors, dim))
