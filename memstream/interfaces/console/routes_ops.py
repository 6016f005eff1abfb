"""Operations, for the operator token only: the worker's lag, throughput and
freshness, dead letters with their reasons, and forgetting a subject with a
confirmation step and its completion per partition (each a shard of the view)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from memstream.domain.log import LogPosition
from memstream.interfaces.console.pages import PAGE_SIZE, checked_id, page_number, render, service_of
from memstream.interfaces.console.session import ConsoleError, check_csrf, require_operator
from memstream.services.log_reads import forget_positions, progress, recent_dead_letters
from memstream.streams.sealing.forget import forget

__all__ = ["router", "SAMPLES"]

router = APIRouter()

SAMPLES = 60
"""Status samples kept for the throughput chart (one per refresh of the page)."""


@router.get("/console/ops")
async def ops_page(request: Request) -> Response:
    require_operator(request)
    return render(request, "ops.html", {"status": await _status(request)})


@router.get("/console/ops/status")
async def ops_status_fragment(request: Request) -> Response:
    require_operator(request)
    return render(request, "_ops_status.html", {"status": await _status(request)})


async def _status(request: Request) -> dict[str, Any]:
    """Lag per partition from the log snapshot the metrics export, throughput from
    the change of the stored positions between refreshes, freshness from the last
    positions commit."""
    service = service_of(request)
    snap = await service.log_snapshot()
    samples: deque[tuple[float, int]] = request.app.state.console_samples
    applied = sum(v for (t, _), v in snap.positions.items() if t in snap.projected_topics)
    samples.append((time.monotonic(), applied))
    rates = [max(0.0, (b[1] - a[1]) / (b[0] - a[0])) for a, b in zip(samples, list(samples)[1:]) if b[0] > a[0]]
    lag = sorted(snap.lag().items())
    updated = await asyncio.to_thread(_last_commit, service)
    return {
        "error": snap.error, "lag": lag, "total_lag": sum(v for _, v in lag), "peak_lag": max((v for _, v in lag), default=0) or 1,
        "dead_letters": snap.dead_letters(), "rates": rates, "peak_rate": max(rates, default=0.0) or 1.0,
        "freshness_s": (datetime.now(timezone.utc) - updated).total_seconds() if updated else None,
    }


def _last_commit(service: Any) -> datetime | None:
    try:
        table = service.store.positions_table()
    except Exception:  # noqa: BLE001 - a status page shows what it can
        return None
    times = [t for t in table.column("updated_at").to_pylist() if t is not None] if table.num_rows else []
    return max(times) if times else None


@router.get("/console/ops/dead-letters")
async def dead_letters_page(request: Request) -> Response:
    require_operator(request)
    page = page_number(request.query_params.get("page"))
    try:
        found = await recent_dead_letters(request.app.state.settings, request.app.state.console_log,
                                          limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE)
    except Exception as exc:  # noqa: BLE001 - Kafka down or not allowed: said on the page
        raise ConsoleError(503, f"cannot read the dead-letter topic: {type(exc).__name__}: {exc}") from None
    return render(request, "dead_letters.html", {"d": found, "page": page})


def _subject(team: str, user: str) -> tuple[str, str | None]:
    team, user = team.strip(), user.strip()
    if not team:
        raise ConsoleError(422, "team: required")
    checked_id("subject", team)
    if user:
        checked_id("subject", user)
    return team, user or None


@router.get("/console/ops/forget")
async def forget_form(request: Request) -> Response:
    require_operator(request)
    return render(request, "forget.html", {"stage": "form", "team": "", "user": ""})


@router.post("/console/ops/forget")
async def forget_post(
    request: Request, team: str = Form(""), user: str = Form(""), confirm: str = Form(""),
    step: str = Form("review"), csrf: str = Form(""),
) -> Response:
    require_operator(request)
    check_csrf(request, csrf)
    team_id, user_id = _subject(team, user)
    what = f"{team_id}/{user_id}" if user_id else team_id
    if step != "confirm" or confirm.strip() != what:
        wrong = step == "confirm"
        return render(request, "forget.html", {"stage": "confirm", "team": team_id, "user": user_id or "",
                                               "what": what, "wrong": wrong}, status=422 if wrong else 200)
    settings = request.app.state.settings
    try:
        report = await forget(settings.streams, team_id, user_id)
    except Exception as exc:  # noqa: BLE001 - e.g. no master key, Kafka refused: said on the page
        raise ConsoleError(503, f"the forget did not run: {type(exc).__name__}: {exc}") from None
    query = urlencode([("team", team_id), ("user", user_id or ""), *(("pos", str(x)) for x in report.positions),
                       ("said", "done" if report.forgotten else "none")])
    return RedirectResponse(f"/console/ops/forget/status?{query}", status_code=303)


@router.get("/console/ops/forget/status")
async def forget_status_page(request: Request) -> Response:
    require_operator(request)
    return render(request, "forget.html", {"stage": "status", **await _forget_state(request)})


@router.get("/console/ops/forget/status/fragment")
async def forget_status_fragment(request: Request) -> Response:
    require_operator(request)
    return render(request, "_forget_status.html", await _forget_state(request))


async def _forget_state(request: Request) -> dict[str, Any]:
    p = request.query_params
    team_id, user_id = _subject(p.get("team", ""), p.get("user", ""))
    try:
        positions = [LogPosition.parse(x) for x in p.getlist("pos")]
    except ValueError as exc:
        raise ConsoleError(422, f"pos: {exc}") from None
    settings = request.app.state.settings
    if not positions:
        positions = await forget_positions(settings, team_id, user_id)
    state = await progress(settings, positions)
    rows = [{"position": str(x), "projected": state.projected.get((x.topic, x.partition), 0),
             "applied": state.projected.get((x.topic, x.partition), 0) > x.offset} for x in positions]
    return {"team": team_id, "user": user_id or "", "state": state, "rows": rows, "said": p.get("said"),
            "query": str(request.url.query)}
