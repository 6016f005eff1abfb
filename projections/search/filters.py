"""Search filters and the LanceDB prefilter they become.

Isolation is a precondition, not a filter applied afterwards: every query carries the
memory space's predicate as a *prefilter* (applied before the nearest-neighbour or
BM25 top-k is taken), so another tenant's rows can neither be returned nor crowd out
this tenant's results. Values are quoted with ``memstream.projections.store.lance_store.quote``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from memstream.domain.content import normalize_content
from memstream.domain.events import MemoryType, Scope
from memstream.projections.store import in_list, quote, space_where

__all__ = ["SearchFilters", "build_where", "filter_parts"]


@dataclass(frozen=True)
class SearchFilters:
    """Narrow a search inside its memory space.

    ``time_from`` / ``time_to`` (inclusive, timezone-aware) keep a memory when its point
    time is in range, or its activity interval (``timestamp_start`` .. ``timestamp_end``;
    a missing end means still going on, a missing start means since ever) overlaps the
    range; a memory with neither is judged by ``created_at``. ``include_superseded=False`` drops superseded memories
    and duplicates (their rows stay; they are only not returned). ``entity`` keeps the
    memories that name the entity (normalised name)."""

    memory_types: tuple[MemoryType, ...] = ()
    time_from: datetime | None = None
    time_to: datetime | None = None
    session_id: str | None = None
    agent_id: str | None = None
    include_superseded: bool = True
    entity: str | None = None

    def __post_init__(self) -> None:
        for name in ("time_from", "time_to"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")
        if self.time_from and self.time_to and self.time_to < self.time_from:
            raise ValueError("time_to is before time_from")


def _ts(value: datetime) -> str:
    return "TIMESTAMP " + quote(value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def _time_where(lo: datetime | None, hi: datetime | None) -> str | None:
    if lo is None and hi is None:
        return None

    def bounds(col: str) -> list[str]:
        out = []
        if lo is not None:
            out.append(f"{col} >= {_ts(lo)}")
        if hi is not None:
            out.append(f"{col} <= {_ts(hi)}")
        return out

    point = " AND ".join(["timestamp IS NOT NULL", *bounds("timestamp")])
    interval_parts = ["(timestamp_start IS NOT NULL OR timestamp_end IS NOT NULL)"]
    if hi is not None:
        interval_parts.append(f"(timestamp_start IS NULL OR timestamp_start <= {_ts(hi)})")
    if lo is not None:
        interval_parts.append(f"(timestamp_end IS NULL OR timestamp_end >= {_ts(lo)})")
    interval = " AND ".join(interval_parts)
    fallback = " AND ".join(
        ["timestamp IS NULL", "timestamp_start IS NULL", "timestamp_end IS NULL", *bounds("created_at")]
    )
    return f"(({point}) OR ({interval}) OR ({fallback}))"


def build_where(scope: Scope | None, filters: SearchFilters | None = None) -> str:
    """The LanceDB prefilter for a scoped search: the space first, then the filters."""
    return " AND ".join([space_where(scope), *filter_parts(filters)])


def filter_parts(filters: SearchFilters | None) -> list[str]:
    """The predicates of ``filters`` alone (no space): what a lookup by scoped key
    adds so that it keeps exactly the rows the search's prefilter keeps."""
    parts: list[str] = []
    f = filters or SearchFilters()
    if f.memory_types:
        parts.append(in_list("memory_type", [MemoryType(t).value for t in f.memory_types]))
    if f.session_id is not None:
        parts.append(f"session_id = {quote(f.session_id)}")
    if f.agent_id is not None:
        parts.append(f"agent_id = {quote(f.agent_id)}")
    if not f.include_superseded:
        parts.append("superseded_by IS NULL AND canonical_id IS NULL")
    if f.entity is not None:
        key = normalize_content(f.entity)
        if not key:
            raise ValueError("entity filter is empty")
        parts.append(f"array_has(entity_keys, {quote(key)})")
    tw = _time_where(f.time_from, f.time_to)
    if tw:
        parts.append(tw)
    return parts

