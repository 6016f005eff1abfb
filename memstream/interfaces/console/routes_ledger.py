"""Decisions and lessons, and a space's timeline: paged reads of the views, each in
the key's read scope (``projections.console_reads``)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from fastapi import APIRouter, Request
from fastapi.responses import Response

from memstream.interfaces.console.pages import PAGE_SIZE, checked_id, page_number, parse_time, render, service_of, space_scope
from memstream.interfaces.console.session import ConsoleError, principal
from memstream.projections.console_reads import TIMELINE_KINDS, decisions_page, lessons_page, timeline_window

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
    page = page_number(p.get("page"))
    store = service_of(request).store_for(scope)
    window = await asyncio.to_thread(
        timeline_window, store, scope, start, end, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE,
    )
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
        "scope": scope, "w": window, "zoom": zoom, "peak": peak, "kinds": list(TIMELINE_KINDS), "page": page,
        "bucket_width": span / len(window.buckets),
    }, principal=who)
