"""Decisions and lessons, and a space's timeline: paged reads of the views, each in
the key's read scope (``projections.console_reads``); pending decisions, which the
view does not hold, from the log (``services.pending_view``), as a fragment."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from fastapi import APIRouter, Request
from fastapi.responses import Response

from memstream.domain.reflection.context import OTHER_SUBJECT_LIMIT, SAME_SUBJECT_LIMIT
from memstream.interfaces.console.pages import PAGE_SIZE, checked_id, page_number, parse_time, render, service_of, space_scope
from memstream.interfaces.console.session import ConsoleError, principal
from memstream.projections.reads import TIMELINE_KINDS, Cursor, decisions_page, ledger_statuses, lessons_page, timeline_window
from memstream.services.log_reads import read_pending

__all__ = ["router"]

router = APIRouter()

_STATUSES = ("any", "pending", "expired", "reflected")
_DEFAULT_SPAN = timedelta(days=30)
_MIN_SPAN = timedelta(minutes=1)
_MAX_SPAN = timedelta(days=36_525)


@router.get("/console/ledger")
async def ledger_page(request: Request) -> Response:
    who = principal(request)
    p = request.query_params
    scope = space_scope(who, p.get("user_id"))
    status = p.get("status") or "any"
    if status not in _STATUSES:
        raise ConsoleError(422, f"status: one of {', '.join(_STATUSES)}")
    subject = p.get("subject") or None
    if subject:
        checked_id("subject", subject)
    dpage, lpage = page_number(p.get("dpage")), page_number(p.get("lpage"))
    store = service_of(request).store_for(scope)
    decisions = await asyncio.to_thread(decisions_page, store, scope, None if status == "any" else status, limit=PAGE_SIZE, offset=(dpage - 1) * PAGE_SIZE)
    lessons = await asyncio.to_thread(lessons_page, store, scope, subject, limit=PAGE_SIZE, offset=(lpage - 1) * PAGE_SIZE)
    return render(request, "ledger.html", {
        "scope": scope, "status": status, "statuses": _STATUSES, "subject": subject or "",
        "decisions": decisions[:PAGE_SIZE], "more_decisions": len(decisions) > PAGE_SIZE, "dpage": dpage,
        "lessons": lessons[:PAGE_SIZE], "more_lessons": len(lessons) > PAGE_SIZE, "lpage": lpage,
        "same_limit": SAME_SUBJECT_LIMIT, "other_limit": OTHER_SUBJECT_LIMIT,
    }, principal=who)


@router.get("/console/ledger/pending")
async def pending_fragment(request: Request) -> Response:
    """The space's pending decisions with their horizon and the outcomes seen so far:
    the decisions of the log the view has not settled (expired or reflected)."""
    who = principal(request)
    p = request.query_params
    scope = space_scope(who, p.get("user_id"))
    page = page_number(p.get("ppage"))
    service = service_of(request)
    try:
        found = await read_pending(request.app.state.settings, request.app.state.console_log, service.producer.keys if service.producer else None, scope)
    except Exception as exc:  # noqa: BLE001 - Kafka down or not allowed (ACL mode): said on the page
        raise ConsoleError(503, f"cannot read the decisions in the log: {type(exc).__name__}: {exc}") from None
    ids = [d.decision.decision_id for d in found.decisions]
    done = await asyncio.to_thread(ledger_statuses, service.store_for(scope), scope, ids)
    pending = [d for d in found.decisions if done.get((d.decision.scope.agent_id, d.decision.decision_id), "pending") == "pending"]
    start = (page - 1) * PAGE_SIZE
    fragment = request.headers.get("X-Console-Fragment") == "1"  # the page's script; else a whole page
    return render(request, "_pending.html" if fragment else "pending.html", {
        "scope": scope, "pending": pending[start : start + PAGE_SIZE], "total": len(pending), "ppage": page,
        "more": len(pending) > start + PAGE_SIZE, "truncated": found.truncated, "now": datetime.now(timezone.utc),
    }, principal=who)


@router.get("/console/timeline")
async def timeline_page(request: Request) -> Response:
    who = principal(request)
    p = request.query_params
    scope = space_scope(who, p.get("user_id"))
    end = parse_time("end", p.get("end")) or datetime.now(timezone.utc)
    start = parse_time("start", p.get("start")) or end - _DEFAULT_SPAN
    if not _MIN_SPAN <= end - start <= _MAX_SPAN:
        raise ConsoleError(422, "the window must span between one minute and a hundred years, start before end")
    try:
        cursor = Cursor.parse(p["after"]) if p.get("after") else None
    except ValueError as exc:
        raise ConsoleError(422, f"after: {exc}") from None
    store = service_of(request).store_for(scope)
    window = await asyncio.to_thread(timeline_window, store, scope, start, end, limit=PAGE_SIZE, cursor=cursor)
    span = end - start
    mid = start + span / 2
    zoom = {
        "in": (mid - span / 4, mid + span / 4),
        "out": (max(mid - span, end - _MAX_SPAN), min(mid + span, mid + _MAX_SPAN / 2)),
        "earlier": (start - span / 2, end - span / 2),
        "later": (start + span / 2, end + span / 2),
    }
    peak = max((sum(b.values()) for b in window.buckets), default=0) or 1
    return render(request, "timeline.html", {
        "scope": scope, "w": window, "zoom": zoom, "peak": peak, "kinds": list(TIMELINE_KINDS), "first": cursor is None,
        "bucket_width": span / len(window.buckets),
    }, principal=who)
