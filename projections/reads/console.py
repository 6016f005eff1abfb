"""The web console's paged reads: one page of a space's decisions, lessons or
timeline, the turns around a memory's evidence, the spaces a team-wide key may open.

Every read starts from the isolation predicate of ``store/filters`` (the space, and
the agent when the read is pinned), asks LanceDB for one page in order (``order_by``
with ``limit``/``offset``) and selects only the columns the page shows: a page never
loads a space whole, whatever its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.query import ColumnOrdering

from memstream.domain.access import AccessScope, ReadScope
from memstream.domain.reflection.context import OTHER_SUBJECT_LIMIT, SAME_SUBJECT_LIMIT
from memstream.projections.schema import DECISIONS, LINKS, MEMORIES, MESSAGES, REFLECTIONS
from memstream.projections.store import chunked, in_list, json_or_none, quote, space_where

__all__ = [
    "TIMELINE_KINDS",
    "Cursor",
    "TimelineWindow",
    "ordered_page",
    "decisions_page",
    "ledger_statuses",
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
    # the view learns of a decision when it is settled (reflected or expired)
    "decision": (DECISIONS, "settled_at", ("decision_id", "subject", "rating", "status", "agent_id")),
    "lesson": (REFLECTIONS, "occurred_at", ("reflection_id", "subject", "lesson", "content", "agent_id")),
}
"""What a timeline holds: the events the views keep, each with the time it happened."""


def ts_literal(value: datetime) -> str:
    """A timestamp literal for a LanceDB filter (UTC, microseconds)."""
    return "TIMESTAMP " + quote(value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def ordered_page(
    store: Any, table: str, where: str, columns: Sequence[str], order: str | tuple[str, ...], *,
    descending: bool = True, limit: int = 50, offset: int = 0,
) -> list[dict[str, Any]]:
    """One page of ``table`` under ``where`` (which the caller starts with a scope
    predicate), ordered by ``order`` (a column, or columns: the later break ties) in
    the engine; ``limit + 1`` rows are asked so the caller knows whether another page
    follows."""
    orders = (order,) if isinstance(order, str) else order
    q = store.table(table).search().where(where).select(list(dict.fromkeys([*columns, *orders])))
    q = q.order_by([ColumnOrdering(column_name=o, ascending=not descending) for o in orders])
    return list(q.limit(limit + 1).offset(offset).to_arrow().to_pylist())


def decisions_page(store: Any, scope: ReadScope, status: str | None, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """Decisions of the view's ledger (pending ones soonest deadline first; others the
    latest settled first: the view learns of most decisions when they are settled)."""
    where = space_where(scope) + (f" AND status = {quote(status)}" if status else "")
    columns = ("decision_id", "agent_id", "subject", "rating", "decision_text", "horizon_days", "deadline",
               "status", "reason", "outcome_id", "reflection_id", "decided_at", "settled_at")
    if status == "pending":
        return ordered_page(store, DECISIONS, where, columns, "deadline", descending=False, limit=limit, offset=offset)
    return ordered_page(store, DECISIONS, where, columns, ("settled_at", "decision_id"), limit=limit, offset=offset)


def ledger_statuses(store: Any, scope: ReadScope, decision_ids: Sequence[str]) -> dict[tuple[str, str], str]:
    """``(agent, decision id) -> status`` of the named decisions the view's ledger holds
    in the scope (read by id: as many rows as ids, never the space)."""
    found: dict[tuple[str, str], str] = {}
    for ids in chunked(sorted(set(decision_ids))):
        rows = (store.table(DECISIONS).search().where(f"{space_where(scope)} AND {in_list('decision_id', ids)}")
                .select(["agent_id", "decision_id", "status"]).limit(None).to_arrow().to_pylist())
        found.update({(r["agent_id"], r["decision_id"]): r["status"] for r in rows})
    return found


def lessons_page(store: Any, scope: ReadScope, subject: str | None, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """Lessons (reflections) of the space, newest first, with the outcome behind each."""
    where = space_where(scope) + (f" AND subject = {quote(subject)}" if subject else "")
    columns = ("reflection_id", "agent_id", "decision_id", "outcome_id", "subject", "rating", "decision_text",
               "raw_return", "alpha", "correct", "content", "lesson", "templated", "provenance", "occurred_at")
    rows = ordered_page(store, REFLECTIONS, where, columns, ("occurred_at", "reflection_id"), limit=limit, offset=offset)
    for r in rows:
        r["provenance"] = json_or_none(r.get("provenance"))
    _injection(store, scope, rows[:limit])
    return rows


def _injection(store: Any, scope: ReadScope, rows: list[dict[str, Any]]) -> None:
    """Where each lesson goes now, by the rule ``/v1/lessons`` applies for a read in
    ``scope`` (``select_context``): the newest lessons on the decision's subject, and
    the newest on other subjects. A lesson's rank on its subject needs only the lessons
    above it, all as new as the page's oldest: one read of three columns of those."""
    if not rows:
        return
    base = space_where(scope)
    order = ("occurred_at", "reflection_id")  # select_context's order, ties included
    newest = {r["reflection_id"] for r in ordered_page(store, REFLECTIONS, base, ("reflection_id",), order,
                                                          limit=OTHER_SUBJECT_LIMIT)[:OTHER_SUBJECT_LIMIT]}
    since = ts_literal(min(r["occurred_at"] for r in rows))
    newer: dict[str, list[tuple[datetime, str]]] = {}
    for subjects in chunked(list(dict.fromkeys(r["subject"] for r in rows))):
        found = (store.table(REFLECTIONS).search().where(f"{base} AND {in_list('subject', subjects)} AND occurred_at >= {since}")
                 .select(["subject", "reflection_id", "occurred_at"]).limit(None).to_arrow().to_pylist())
        for x in found:
            newer.setdefault(x["subject"], []).append((x["occurred_at"], x["reflection_id"]))
    for r in rows:
        mine = (r["occurred_at"], r["reflection_id"])
        above = sum(1 for other in newer.get(r["subject"], ()) if other > mine)
        r["same_rank"] = above + 1 if above < SAME_SUBJECT_LIMIT else None
        r["other_subjects"] = r["reflection_id"] in newest


def session_context(
    store: Any, owner: ReadScope, turn: dict[str, Any], *, before: int = 3, after: int = 3,
) -> list[dict[str, Any]]:
    """The turns of ``turn``'s session around it (``before`` earlier ones, the turn and
    ``after`` later ones), oldest first, within ``owner``'s rows. Turns are ordered by
    time, then by log offset: the turns of a session often share one time (a whole
    session stamped with its date), and a space's turns share one partition."""
    session_id = turn.get("session_id")
    base = space_where(owner) + (f" AND session_id = {quote(session_id)}" if session_id else " AND session_id IS NULL")
    at, offset = ts_literal(turn["occurred_at"]), int(turn.get("log_offset") or 0)
    columns = ("message_id", "role", "speaker", "content", "occurred_at")
    order = ("occurred_at", "log_offset")
    earlier = ordered_page(store, MESSAGES, f"{base} AND (occurred_at < {at} OR (occurred_at = {at} AND log_offset < {offset}))",
                           columns, order, limit=before)[:before]
    later = ordered_page(store, MESSAGES, f"{base} AND (occurred_at > {at} OR (occurred_at = {at} AND log_offset >= {offset}))",
                         columns, order, descending=False, limit=after)[: after + 1]
    return list(reversed(earlier)) + later


@dataclass(frozen=True)
class Cursor:
    """Where a timeline page ends: the last event shown, in the timeline's total order
    (time, kind, id; newest first). The next page holds what comes after it."""

    at: datetime
    kind: str
    id: str

    def __str__(self) -> str:
        return f"{self.at.astimezone(timezone.utc).isoformat()}|{self.kind}|{self.id}"

    @classmethod
    def parse(cls, text: str) -> "Cursor":
        """Raises ValueError for anything but ``<iso time>|<kind>|<id>``."""
        at, kind, ident = text.split("|", 2)
        when = datetime.fromisoformat(at)
        if kind not in TIMELINE_KINDS or when.tzinfo is None:
            raise ValueError(f"not a timeline cursor: {text!r}")
        return cls(when, kind, ident)


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
    next: Cursor | None
    """Where the next (older) page starts; None on the last page."""


def _after(kind: str, time_col: str, id_col: str, cursor: Cursor | None) -> str:
    """The rows of ``kind`` after ``cursor`` in the timeline's order (keyset paging: a
    deep page reads as few rows as the first)."""
    if cursor is None:
        return ""
    at = ts_literal(cursor.at)
    if kind < cursor.kind:
        return f" AND {time_col} <= {at}"
    if kind > cursor.kind:
        return f" AND {time_col} < {at}"
    return f" AND ({time_col} < {at} OR ({time_col} = {at} AND {id_col} < {quote(cursor.id)}))"


def _bucket_counts(times: Any, start: datetime, width_us: int, buckets: int) -> np.ndarray:
    """Events per bucket of a timestamp column (vectorised: no Python per row)."""
    micros = pc.cast(pc.cast(times, pa.timestamp("us", tz="UTC")), pa.int64()).to_numpy(zero_copy_only=False)
    start_us = int(start.timestamp() * 1_000_000)
    index = np.clip((micros - start_us) // max(width_us, 1), 0, buckets - 1)
    return np.bincount(index, minlength=buckets)


def timeline_window(
    store: Any, scope: ReadScope, start: datetime, end: datetime, *,
    buckets: int = 24, count_cap: int = 20_000, limit: int = 50, cursor: Cursor | None = None,
) -> TimelineWindow:
    """The space's events between ``start`` and ``end``. Counting reads one time column
    of at most ``count_cap`` rows per kind; the page reads ``limit`` rows per kind after
    ``cursor``, however deep."""
    width_us = int((end - start) / buckets / timedelta(microseconds=1))
    counts = [{kind: 0 for kind in TIMELINE_KINDS} for _ in range(buckets)]
    capped = False
    events: list[dict[str, Any]] = []
    for kind, (table, col, columns) in TIMELINE_KINDS.items():
        where = f"{space_where(scope)} AND {col} >= {ts_literal(start)} AND {col} < {ts_literal(end)}"
        times = store.table(table).search().where(where).select([col]).limit(count_cap + 1).to_arrow().column(col)
        capped = capped or len(times) > count_cap
        for i, n in enumerate(_bucket_counts(times.slice(0, count_cap), start, width_us, buckets)):
            counts[i][kind] = int(n)
        ident = columns[0]
        rows = ordered_page(store, table, where + _after(kind, col, ident, cursor), columns, (col, ident), limit=limit)
        events += [{"kind": kind, "at": row[col], "id": row[ident], **row} for row in rows]
    events.sort(key=lambda e: (e["at"], e["kind"], e["id"]), reverse=True)
    page = events[:limit]
    last = page[-1] if page else None
    more = len(events) > limit and last is not None
    return TimelineWindow(start, end, counts, capped, page, Cursor(last["at"], last["kind"], last["id"]) if more and last else None)


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
