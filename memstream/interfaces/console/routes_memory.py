"""Search with its score explanation, and one memory's story: its evidence in the
conversation, its links as a graph, its history. Both read through the API's
service (``MemoryService.search`` / ``get_memory``) with the key's read scope."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from memstream.domain.access import ReadScope
from memstream.domain.events import MemoryType
from memstream.interfaces.console.graph import link_graph
from memstream.interfaces.console.pages import checked_id, parse_time, render, service_of, space_scope
from memstream.interfaces.console.session import ConsoleError, principal
from memstream.interfaces.service import RerankUnavailable, search_filters, search_hit_payload
from memstream.projections.reads import session_context

__all__ = ["router", "EXPLAIN_PARTS"]

router = APIRouter()

EXPLAIN_PARTS = ("vector", "text", "fused", "recency", "supersession", "entity", "context", "prior", "priority", "rerank")
"""The score parts ``--explain`` shows, in the order the bars are drawn."""
_CONTEXT_TURNS = 2


@router.get("/console/search")
async def search_page(request: Request) -> Response:
    who = principal(request)
    p = request.query_params
    scope = space_scope(who, p.get("user_id"), p.get("agent_id"))
    form: dict[str, Any] = {
        "q": p.get("q", ""), "k": p.get("k", "10"), "types": p.getlist("memory_type"),
        "session_id": p.get("session_id", ""), "agent_id": p.get("agent_id", ""), "entity": p.get("entity", ""),
        "time_from": p.get("time_from", ""), "time_to": p.get("time_to", ""),
        "superseded": p.get("superseded", "include"), "rerank": p.get("rerank") == "on",
    }
    ctx: dict[str, Any] = {"scope": scope, "form": form, "types": [t.value for t in MemoryType],
                           "results": None, "parts": EXPLAIN_PARTS}
    if form["q"].strip():
        ctx["results"] = await _search(request, scope, form)
    return render(request, "search.html", ctx, principal=who)


async def _search(request: Request, scope: ReadScope, form: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        k = int(form["k"])
        if not 1 <= k <= 100:
            raise ValueError
    except ValueError:
        raise ConsoleError(422, "k: a number from 1 to 100") from None
    if len(form["q"]) > 2000:
        raise ConsoleError(422, "q: at most 2000 characters")
    try:
        filters = search_filters(
            memory_types=form["types"], session_id=form["session_id"] or None, agent_id=scope.agent_id,
            time_from=parse_time("time_from", form["time_from"]), time_to=parse_time("time_to", form["time_to"]),
            include_superseded=form["superseded"] != "exclude", entity=form["entity"] or None,
        )
    except ValueError as exc:
        raise ConsoleError(422, str(exc)) from None
    try:
        hits = await service_of(request).search(scope, form["q"], k, filters, interface="console", rerank=form["rerank"])
    except RerankUnavailable as exc:
        raise ConsoleError(400, str(exc)) from None
    results = [search_hit_payload(h, explain=True) for h in hits]
    top = max((r["score"] for r in results), default=0.0) or 1.0
    peaks = {n: max((abs(r["parts"].get(n) or 0.0) for r in results), default=0.0) or 1.0 for n in EXPLAIN_PARTS}
    for r in results:
        r["bar"] = max(0.0, min(1.0, r["score"] / top))
        # each part against its largest value on the page: bars compare results
        r["bars"] = [(n, r["parts"].get(n), min(1.0, abs(r["parts"].get(n) or 0.0) / peaks[n]))
                     for n in EXPLAIN_PARTS if r["parts"].get(n) is not None]
    return results


@router.get("/console/memories/{memory_id}")
async def memory_page(request: Request, memory_id: str) -> Response:
    who = principal(request)
    scope = space_scope(who, request.query_params.get("user_id"))
    checked_id("memory_id", memory_id)
    service = service_of(request)
    found = await service.get_memory(scope, memory_id)
    if found is None:
        raise ConsoleError(404, f"no memory {memory_id!r} in {scope.space} for this key")
    store = service.store_for(scope)
    others = {lk["to_memory_id"] for lk in found["links_out"]} | {lk["from_memory_id"] for lk in found["links_in"]}
    others |= set(found["history"]["predecessors"]) | set(found["history"]["successors"])
    ends = {r["memory_id"]: r for r in await asyncio.to_thread(store.get_memories, scope, sorted(others))}
    owner = ReadScope(found["team_id"], found["user_id"], found["agent_id"])  # evidence: the owner's turns only
    sources = {m["message_id"] for m in found["source_messages"]}
    conversations = []
    for turn in found["source_messages"][:5]:
        around = await asyncio.to_thread(session_context, store, owner, turn, before=_CONTEXT_TURNS, after=_CONTEXT_TURNS)
        conversations.append({"session_id": turn.get("session_id"), "turns": around})
    graph = link_graph(found, ends, found["links_out"], found["links_in"])
    return render(request, "memory.html", {
        "scope": scope, "m": found, "ends": ends, "graph": graph, "conversations": conversations, "sources": sources,
    }, principal=who)
