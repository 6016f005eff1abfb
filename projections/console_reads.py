"""The web console's paged reads: one page of a space's decisions, lessons or
timeline, the turns around a memory's evidence, the spaces a team-wide key may open.

Every read starts from the isolation predicate of ``store_filters`` (the space, and
the agent when the read is pinned), asks LanceDB for one page in order (``order_by``
with ``limit``/``offset``) and selects only the columns the page shows: a page never
loads a space whole, whatever its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from lancedb.query import ColumnOrdering

from memstream.domain.access import AccessScope, ReadScope
from memstream.projections.schema import DECISIONS, LINKS, MEMORIES, MESSAGES, REFLECTIONS
from memstream.projections.store_filters import quote, space_where
from memstream.projections.store_tables import json_or_none

__all__ = [
    "TIMELINE_KINDS",
    "TimelineWindow",
    "ordered_page",
    "decisions_page",
    "lessons_page",
    "session_context",
    "timeline_window",
    "team_spaces",
    "ts_literal",
]

TIMELINE_KINDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # kind -> (table, time column, columns shown)
    "memory": (MEMORIES, "created_at", ("memory_id", "memory_type", "content", "agent_id", "status")),
    "link": (LINKS, "occurred_at", ("link_id", "relation", "from_memory_id", "to_memory_id", "agent_id")),
    "decision": (DECISIONS, "decided_at", ("decision_id", "subject", "rating", "status", "agent_id")),
    "lesson": (REFLECTIONS, "occurred_at", ("reflection_id", "subject", "lesson", "content", "agent_id")),
}
"""What a timeline holds: the events the views keep, each with the time it happened."""


def ts_literal(value: datetime) -> str:
    """A timestamp literal for a LanceDB filter (UTC, microseconds)."""
    return "TIMESTAMP " + quote(value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def ordered_page(
    store: Any, table: str, where: str, columns: Sequence[str], order: str, *,
    descending: bool = True, limit: int = 50, offset: int = 0,
) -> list[dict[str, Any]]:
    """One page of ``table`` under ``where`` (which the caller starts with a scope
    predicate), ordered by ``order`` in the engine; ``limit + 1`` rows are asked so the
    caller knows whether another page follows."""
    q = store.table(table).search().where(where).select(list(dict.fromkeys([*columns, order])))
    q = q.order_by([ColumnOrdering(column_name=order, ascending=not descending)])
    return list(q.limit(limit + 1).offset(offset).to_arrow().to_pylist())


def decisions_page(store: Any, scope: ReadScope, status: str | None, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """Decisions of the space (pending ones soonest deadline first; others newest first)."""
    where = space_where(scope) + (f" AND status = {quote(status)}" if status else "")
    columns = ("decision_id", "agent_id", "subject", "rating", "decision_text", "horizon_days", "deadline",
               "status", "reason", "outcome_id", "reflection_id", "decided_at", "settled_at")
    if status == "pending":
        return ordered_page(store, DECISIONS, where, columns, "deadline", descending=False, limit=limit, offset=offset)
    return ordered_page(store, DECISIONS, where, columns, "decided_at", limit=limit, offset=offset)


def lessons_page(store: Any, scope: ReadScope, subject: str | None, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """Lessons (reflections) of the space, newest first, with the outcome behind each."""
    where = space_where(scope) + (f" AND subject = {quote(subject)}" if subject else "")
    columns = ("reflection_id", "agent_id", "decision_id", "outcome_id", "subject", "rating", "decision_text",
               "raw_return", "alpha", "correct", "content", "lesson", "templated", "provenance", "occurred_at")
    rows = ordered_page(store, REFLECTIONS, where, columns, "occurred_at", limit=limit, offset=offset)
    for r in rows:
        r["provenance"] = json_or_none(r.get("provenance"))
    return rows


def session_context(
    store: Any, owner: ReadScope, session_id: str | None, around: datetime, *, before: int = 3, after: int = 3,
) -> list[dict[str, Any]]:
    """The turns of a session around ``around`` (``before`` earlier ones, the turn at
    that time and ``after`` later ones), oldest first, within ``owner``'s rows."""
    base = space_where(owner) + (f" AND session_id = {quote(session_id)}" if session_id else " AND session_id IS NULL")
    columns = ("message_id", "role", "speaker", "content", "occurred_at")
    earlier = ordered_page(store, MESSAGES, f"{base} AND occurred_at < {ts_literal(around)}", columns,
                           "occurred_at", limit=before)[:before]
    later = ordered_page(store, MESSAGES, f"{base} AND occurred_at >= {ts_literal(around)}", columns,
                         "occurred_at", descending=False, limit=after)[: after + 1]
    return list(reversed(earlier)) + later


@dataclass(frozen=True)
class TimelineWindow:
    """One zoom level of a space's timeline: counts per bucket of each kind, and one
    page of the events in the window, newest first."""

    start: datetime
    end: datetime
    buckets: list[dict[str, int]]
    capped: bool
    """True when a kind holds more events in the window than were counted: zoom in."""
    events: list[dict[str, Any]]
    has_more: bool


def timeline_window(
    store: Any, scope: ReadScope, start: datetime, end: datetime, *,
    buckets: int = 24, count_cap: int = 20_000, limit: int = 50, offset: int = 0,
) -> TimelineWindow:
    """The space's events between ``start`` and ``end``. Counting reads one time column
    of at most ``count_cap`` rows per kind; the page reads ``limit`` rows per kind."""
    width = (end - start) / buckets
    counts = [{kind: 0 for kind in TIMELINE_KINDS} for _ in range(buckets)]
    capped = False
    events: list[dict[str, Any]] = []
    for kind, (table, col, columns) in TIMELINE_KINDS.items():
        where = f"{space_where(scope)} AND {col} >= {ts_literal(start)} AND {col} < {ts_literal(end)}"
        times = store.table(table).search().where(where).select([col]).limit(count_cap + 1).to_arrow()
        capped = capped or times.num_rows > count_cap
        for t in times.column(col).to_pylist()[:count_cap]:
            i = min(int((t - start) / width), buckets - 1) if width.total_seconds() > 0 else 0
            counts[i][kind] += 1
        for row in ordered_page(store, table, where, columns, col, limit=offset + limit):
            events.append({"kind": kind, "at": row[col], **row})
    events.sort(key=lambda e: (e["at"], e["kind"]), reverse=True)
    return TimelineWindow(start, end, counts, capped, events[offset : offset + limit], len(events) > offset + limit)


def team_spaces(store: Any, access: AccessScope, *, limit: int = 200) -> list[str]:
    """The users of the key's team that hold memories this key may read (its agent's
    only when the key is pinned to one), first ``limit`` in name order. Each shard of a
    sharded set holds its own spaces."""
    where = f"team_id = {quote(access.team_id)}"
    if access.user_id is not None:
        where += f" AND user_id = {quote(access.user_id)}"
    if access.agent_id is not None:
        where += f" AND agent_id = {quote(access.agent_id)}"
    users: set[str] = set()
    for part in getattr(store, "shards", {0: store}).values():
        users.update(part.table(MEMORIES).search().where(where).select(["user_id"]).limit(None).to_arrow()
                     .column("user_id").to_pylist())
    return sorted(users)[:limit]
