"""Lessons for the next prompt: past reflections read from the projection, chosen and
formatted by the pure rules in :mod:`memstream.domain.reflection`.

``context_for(store, scope, subject, budget_tokens)`` is what an agent calls before a
new decision on ``subject``: the 5 most recent settled reflections on that subject
(each with its decision, outcome and reflection) and the 3 most recent on other
subjects (reflection only), newest first, as text that fits the token budget. The
SDK, the HTTP API, the MCP tool and ``memstream reflections context`` all call it.

Isolation: the read is always filtered by the memory space (team and user) through
:func:`memstream.projections.store.lance_store.space_where`, which refuses a missing scope; an
agent sees the lessons of its whole space unless ``same_agent`` (or a pinned
``ReadScope``, ``memstream.domain.access``) narrows it.

Reading: the same-subject rows of the space are few (one per settled decision on the
subject) and read whole. Other subjects may be many, so only their ids and times are
scanned, and the full rows of the newest few are fetched by key afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from memstream.domain.access import ReadScope
from memstream.domain.events import Rating, Scope
from memstream.domain.reflection import (
    OTHER_SUBJECT_LIMIT,
    SAME_SUBJECT_LIMIT,
    ReflectionContext,
    ReflectionRecord,
    build_context,
)
from memstream.projections.schema import REFLECTIONS
from memstream.projections.store import LanceStore, quote, space_where

__all__ = [
    "DEFAULT_BUDGET_TOKENS",
    "context_for",
    "list_reflections",
    "record_from_row",
]

DEFAULT_BUDGET_TOKENS = 800
"""Enough for the 8 entries at their usual length; callers pass their own budget."""

_COLUMNS = (
    "pk",
    "reflection_id",
    "decision_id",
    "outcome_id",
    "subject",
    "rating",
    "decision_text",
    "raw_return",
    "alpha",
    "correct",
    "content",
    "lesson",
    "templated",
    "occurred_at",
)


def _utc(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    raise TypeError(f"occurred_at is {type(value).__name__}, expected a datetime")


def record_from_row(row: Mapping[str, Any]) -> ReflectionRecord:
    """A ``reflections`` table row -> :class:`ReflectionRecord`."""
    return ReflectionRecord(
        reflection_id=row["reflection_id"],
        decision_id=row["decision_id"],
        outcome_id=row.get("outcome_id") or "",
        subject=row["subject"],
        rating=Rating(row["rating"]),
        decision_text=row.get("decision_text") or "",
        raw_return=row.get("raw_return"),
        alpha=row.get("alpha"),
        correct=row.get("correct"),
        content=row["content"],
        lesson=row.get("lesson"),
        templated=bool(row.get("templated")),
        occurred_at=_utc(row["occurred_at"]),
    )


def _where(scope: Scope | ReadScope, same_agent: bool) -> str:
    # same_agent pins an event scope to its agent; a ReadScope carries its own pin
    if same_agent and isinstance(scope, Scope):
        scope = ReadScope.pinned(scope)
    return space_where(scope)


def _newest_keys(rows: Iterable[Mapping[str, Any]], limit: int) -> list[str]:
    ordered = sorted(rows, key=lambda r: (r["occurred_at"], r["reflection_id"]), reverse=True)
    return [r["pk"] for r in ordered[:limit]]


def context_for(
    store: LanceStore,
    scope: Scope | ReadScope,
    subject: str,
    budget_tokens: int = DEFAULT_BUDGET_TOKENS,
    *,
    same_agent: bool = False,
    same_limit: int = SAME_SUBJECT_LIMIT,
    other_limit: int = OTHER_SUBJECT_LIMIT,
) -> ReflectionContext:
    """Past lessons for a new decision on ``subject``, formatted within the budget.

    Synchronous (LanceDB's sync API): call it from a thread when on an event loop.
    Raises :class:`memstream.projections.store.lance_store.ScopeRequiredError` without a scope.
    """
    if not subject or not subject.strip():
        raise ValueError("subject is empty")
    base = _where(scope, same_agent)
    same_rows = store.rows(REFLECTIONS, f"{base} AND subject = {quote(subject)}", _COLUMNS)
    other_index = store.rows(
        REFLECTIONS,
        f"{base} AND subject != {quote(subject)}",
        ["pk", "reflection_id", "occurred_at"],
    )
    records = [record_from_row(r) for r in same_rows.to_pylist()]
    keys = _newest_keys(other_index.to_pylist(), max(other_limit, 0))
    if keys:
        records += [record_from_row(r) for r in store.rows_by_keys(REFLECTIONS, keys, _COLUMNS).to_pylist()]
    return build_context(
        records, subject, budget_tokens, same_limit=same_limit, other_limit=other_limit
    )


def list_reflections(
    store: LanceStore,
    scope: Scope | ReadScope,
    *,
    subject: str | None = None,
    limit: int = 20,
    same_agent: bool = False,
) -> list[ReflectionRecord]:
    """The newest reflections of a space (optionally one subject), newest first."""
    where = _where(scope, same_agent)
    if subject is not None:
        where += f" AND subject = {quote(subject)}"
    index = store.rows(REFLECTIONS, where, ["pk", "reflection_id", "occurred_at"]).to_pylist()
    keys = _newest_keys(index, max(limit, 0))
    if not keys:
        return []
    rows = [record_from_row(r) for r in store.rows_by_keys(REFLECTIONS, keys, _COLUMNS).to_pylist()]
    return sorted(rows, key=lambda r: (r.occurred_at, r.reflection_id), reverse=True)
