"""What a search returns (:class:`SearchResult`, :class:`ScoreParts`) and the columns
it reads to build one."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from memstream.domain.events import Scope
from memstream.projections.schema import scoped_key

__all__ = [
    "RESULT_COLUMNS",
    "READ_COLUMNS",
    "LIST_COLUMNS",
    "ScoreParts",
    "SearchResult",
    "Reranker",
    "to_result",
    "rows_of",
    "shared",
]

RESULT_COLUMNS: tuple[str, ...] = (
    "pk",
    "memory_id",
    "team_id",
    "user_id",
    "agent_id",
    "session_id",
    "content",
    "content_hash",
    "memory_type",
    "priority",
    "scene",
    "timestamp",
    "timestamp_start",
    "timestamp_end",
    "source_message_ids",
    "entities",
    "entity_keys",
    "created_at",
    "superseded_by",
    "canonical_id",
    "status",
)
READ_COLUMNS: tuple[str, ...] = tuple(c for c in RESULT_COLUMNS if c not in ("pk", "team_id", "user_id"))
"""What search reads of a memory row: :data:`RESULT_COLUMNS` but the key and the space,
which every row read in a space has by construction (see :func:`rows_of`) and which
would cost a column read each, in every list and lookup."""
LIST_COLUMNS: tuple[str, ...] = ("memory_id", "session_id", "source_message_ids")
"""What :func:`search`'s two lists read when the space's cache is expected to hold the
candidates' rows: enough to plan the reads of their sessions and source turns. Half
the cost of reading whole rows with the lists (docs/benchmarks-history.md)."""


@dataclass(frozen=True)
class ScoreParts:
    """Why a result ranks where it does. ``vector``: cosine similarity (None when the
    vector search did not retrieve it); ``text``: BM25 score (None when full text did
    not); ``fused``: normalised weighted RRF; ``recency``: ``0.5 ** (age/half-life)``;
    ``supersession``: penalty factor (1.0 when current); ``entity``: the entity boost;
    ``final``: the score after the successor cap (before any reranker); ``context``:
    the score received from neighbouring turns; ``prior``: the speaker and time prior
    (1.0 = none). See ``memstream.domain.ranking`` 5-8. ``priority``: the factor of
    the memory's priority (``memstream.domain.priority``; 1.0 at priority 50)."""

    vector: float | None
    text: float | None
    fused: float
    recency: float
    supersession: float
    entity: float
    final: float
    context: float = 0.0
    prior: float = 1.0
    priority: float = 1.0
    rerank: float | None = None
    """The reranker's relevance score, when a reranker ordered this result."""


@dataclass(frozen=True)
class SearchResult:
    memory_id: str
    content: str
    memory_type: str
    priority: int
    source_message_ids: tuple[str, ...]
    team_id: str
    user_id: str
    agent_id: str
    session_id: str | None
    timestamp: datetime | None
    timestamp_start: datetime | None
    timestamp_end: datetime | None
    created_at: datetime
    superseded_by: str | None
    canonical_id: str | None
    status: str
    entities: tuple[tuple[str, str], ...]
    scene: str | None
    content_hash: str
    score: float
    parts: ScoreParts


Reranker = Callable[[str, list[SearchResult]], list[SearchResult]]


def rows_of(table: pa.Table, scope: Scope) -> list[dict[str, Any]]:
    """The row dicts of a read of :data:`READ_COLUMNS` in the scope's space, with the
    columns it leaves out: ``team_id`` / ``user_id``, the space's (every row read under
    the space's prefilter or by its scoped keys has them), and ``pk``,
    ``scoped_key(team_id, user_id, memory_id)`` (how every memory row is keyed, see
    ``memstream.projections.schema``).

    Values that many rows repeat are one shared object (:func:`shared`): a serving
    process keeps tens of thousands of these rows (``cache``), and the repeats
    were most of a row's memory (docs/benchmarks-history.md). Lists are
    tuples, and an entity is a read-only mapping: rows are never changed."""
    team, user = scope.team_id, scope.user_id
    names = table.column_names
    columns = [_compact(name, table.column(name).to_pylist()) for name in names]
    ids = columns[names.index("memory_id")]
    names = [*names, "pk", "team_id", "user_id"]
    columns += [[scoped_key(team, user, m) for m in ids], [team] * len(ids), [user] * len(ids)]
    return [dict(zip(names, values)) for values in zip(*columns)]


def _compact(name: str, values: list[Any]) -> list[Any]:
    """A column's values with repeats shared (column by column, which keeps
    :func:`rows_of` as fast as Arrow's own ``to_pylist``)."""
    if name in _REPEATED:
        return [shared(v) if v else v for v in values]
    if name in _REPEATED_LISTS:
        return [tuple(map(shared, v)) if v is not None else v for v in values]
    if name == "entities":
        return [tuple(map(_entity, v)) if v else v for v in values]
    return values


_REPEATED = frozenset(("agent_id", "session_id", "memory_type", "scene", "status"))
_REPEATED_LISTS = frozenset(("source_message_ids", "entity_keys"))
_ENTITIES_MAX = 65_536
_entities: dict[tuple[str, str], Mapping[str, str]] = {}


def shared(value: str) -> str:
    """The one object for an equal string that other rows or turns may hold too (kept
    only while something holds it)."""
    return sys.intern(value)


def _entity(entity: Mapping[str, str]) -> Mapping[str, str]:
    key = (entity["name"], entity["kind"])
    one = _entities.get(key)
    if one is None:
        if len(_entities) >= _ENTITIES_MAX:
            _entities.clear()  # the rows holding the old ones keep them
        one = _entities[key] = MappingProxyType({k: shared(v) if v else v for k, v in zip(("name", "kind"), key)})
    return one


def to_result(row: Mapping[str, Any], score: float, parts: ScoreParts) -> SearchResult:
    return SearchResult(
        memory_id=row["memory_id"],
        content=row["content"],
        memory_type=row["memory_type"],
        priority=int(row["priority"]),
        source_message_ids=tuple(row.get("source_message_ids") or ()),
        team_id=row["team_id"],
        user_id=row["user_id"],
        agent_id=row["agent_id"],
        session_id=row.get("session_id"),
        timestamp=row.get("timestamp"),
        timestamp_start=row.get("timestamp_start"),
        timestamp_end=row.get("timestamp_end"),
        created_at=row["created_at"],
        superseded_by=row.get("superseded_by"),
        canonical_id=row.get("canonical_id"),
        status=row.get("status") or "active",
        entities=tuple((e["name"], e["kind"]) for e in (row.get("entities") or ())),
        scene=row.get("scene"),
        content_hash=row["content_hash"],
        score=score,
        parts=parts,
    )
