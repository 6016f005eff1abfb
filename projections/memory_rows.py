"""Rows of the ``memories`` and ``entities`` tables, built column by column from
``MemoryAdded`` events the fast read path decoded.

Why apart from the projector's per-event handlers: building a dict per row and
letting Arrow convert the dicts costs ~25 µs of interpreter time per memory; building
each column from one list (and the vector column from one float32 matrix) costs a
few. The rows are the same as the handlers build (``tests/projections`` compares the
two paths table for table).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from memstream.domain.content import normalize_content
from memstream.domain.log import PositionedMemories
from memstream.projections.schema import ENTITIES, MEMORIES, schema_for

__all__ = ["unique_entities", "entity_row", "canonical_json", "memories_table"]

_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)

View = tuple[str | None, str | None, str]
_ACTIVE: View = (None, None, "active")


def canonical_json(value: Any) -> str:
    """Canonical JSON (sorted keys), so equal metadata always stores equal text."""
    if not value:
        return "{}" if isinstance(value, dict) else _ENCODER.encode(value)
    return _ENCODER.encode(value)


def unique_entities(entities: Iterable[tuple[str, str]]) -> tuple[list[dict[str, str]], list[str]]:
    """A memory's entities once each by normalised name (first spelling kept), as the
    ``entities`` column and the ``entity_keys`` filter column."""
    out: list[dict[str, str]] = []
    keys: list[str] = []
    for name, kind in entities:
        key = normalize_content(name)
        if key and key not in keys:
            keys.append(key)
            out.append({"name": name, "kind": kind})
    return out, keys


def entity_row(
    memory_pk: str, key: str, entity: Mapping[str, str], memory: Mapping[str, Any]
) -> dict[str, Any]:
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


def memories_table(
    memories: PositionedMemories,
    picks: Mapping[str, int],
    views: Mapping[str, View],
    *,
    dim: int,
) -> tuple[pa.Table, pa.Table]:
    """The ``memories`` rows of ``picks`` (pk -> row of ``memories``) with their derived
    ``views`` (default: active), and the ``entities`` rows they name."""
    pks = list(picks)
    idx = list(picks.values())
    n = len(idx)
    rows = [memories.fields[i] for i in idx]
    positions = [memories.positions[i] for i in idx]
    (event_id, occurred_at, recorded_at, team_id, user_id, agent_id, session_id, memory_id,
     content, content_hash, memory_type, priority, scene, source_ids, timestamp, start, end,
     entities, metadata, provenance, _data) = (list(c) for c in zip(*rows)) if n else ([],) * 21
    ents: list[list[dict[str, str]]] = []
    keys: list[list[str]] = []
    # The entities rows, column by column (a row per memory and entity): the memory's
    # values repeated once per entity it names.
    owners: list[int] = []
    ent_keys: list[str] = []
    ent_names: list[str] = []
    ent_kinds: list[str] = []
    for j, found in enumerate(entities):
        if not found:
            ents.append([])
            keys.append([])
            continue
        e, k = unique_entities(found)
        ents.append(e)
        keys.append(k)
        owners.extend([j] * len(k))
        ent_keys.extend(k)
        ent_names.extend(x["name"] for x in e)
        ent_kinds.extend(x["kind"] for x in e)
    view = [views.get(pk, _ACTIVE) for pk in pks]
    schema = schema_for(MEMORIES, dim)
    ts = schema.field("created_at").type
    matrix = np.ascontiguousarray(memories.vectors[idx], dtype=np.float32)
    columns: dict[str, Any] = {
        "pk": pks,
        "memory_id": memory_id,
        "team_id": team_id,
        "user_id": user_id,
        "agent_id": agent_id,
        "session_id": session_id,
        "content": content,
        "content_hash": content_hash,
        "memory_type": memory_type,
        "priority": priority,
        "scene": scene,
        "timestamp": pa.array(timestamp, ts),
        "timestamp_start": pa.array(start, ts),
        "timestamp_end": pa.array(end, ts),
        "source_message_ids": source_ids,
        "entities": ents,
        "entity_keys": keys,
        "metadata": [canonical_json(m) for m in metadata],
        "provenance": [None if p is None else canonical_json(p) for p in provenance],
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1), type=pa.float32()), dim),
        "embedding_model": [memories.model] * n,
        "created_at": pa.array(occurred_at, ts),
        "recorded_at": pa.array(recorded_at, ts),
        "superseded_by": [v[0] for v in view],
        "canonical_id": [v[1] for v in view],
        "status": [v[2] for v in view],
        "log_topic": [p[0] for p in positions],
        "log_partition": [p[1] for p in positions],
        "log_offset": [p[2] for p in positions],
        "event_id": event_id,
    }
    entity_columns: dict[str, Any] = {
        "pk": [f"{pks[j]}|{key}" for j, key in zip(owners, ent_keys)],
        "team_id": [team_id[j] for j in owners],
        "user_id": [user_id[j] for j in owners],
        "name_key": ent_keys,
        "name": ent_names,
        "kind": ent_kinds,
        "memory_id": [memory_id[j] for j in owners],
        "memory_pk": [pks[j] for j in owners],
        "agent_id": [agent_id[j] for j in owners],
        "occurred_at": pa.array([occurred_at[j] for j in owners], ts),
        "log_topic": [positions[j][0] for j in owners],
        "log_partition": [positions[j][1] for j in owners],
        "log_offset": [positions[j][2] for j in owners],
        "event_id": [event_id[j] for j in owners],
    }
    return _from_columns(schema, columns), _from_columns(schema_for(ENTITIES, dim), entity_columns)


def _from_columns(schema: pa.Schema, columns: Mapping[str, Any]) -> pa.Table:
    """A table of ``schema`` from one list (or Arrow array) per column."""
    arrays = [
        col if isinstance(col, pa.Array) else pa.array(col, type=f.type)
        for f, col in ((f, columns[f.name]) for f in schema)
    ]
    return pa.Table.from_arrays(arrays, schema=schema)
