"""The HTTP API's reads: search, one memory, lessons. Eventually consistent; a
``min_position`` makes a read wait for the write it names (409 when it does not
arrive in time, never silently stale)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from memstream.interfaces.api_auth import Caller, MinPosition, WaitS
from memstream.interfaces.api_models import SearchOut
from memstream.interfaces.api_requests import check_ids, positions, service_of, wait_for_positions
from memstream.interfaces.errors import ERROR_RESPONSES, ApiError, ErrorResponse
from memstream.interfaces.guards import read_scope
from memstream.interfaces.service import (
    RerankUnavailable,
    lessons_payload,
    memory_payload,
    search_filters,
    search_hit_payload,
)

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/search", response_model=SearchOut, responses={**ERROR_RESPONSES, 409: {"model": ErrorResponse, "description": "min_position not reached in time."}},
         tags=["read"], summary="Hybrid (vector + full-text) search in one memory space")
async def get_search(
    request: Request,
    principal: Caller,
    q: Annotated[str, Query(min_length=1, max_length=2000, description="The query text.")],
    k: Annotated[int, Query(ge=1, le=100)] = 10,
    memory_type: Annotated[list[str], Query(description="Only these memory types (repeatable).")] = [],  # noqa: B006
    session_id: Annotated[str | None, Query()] = None,
    user_id: Annotated[str | None, Query(description="Defaults to the bank's user (or 'default').")] = None,
    agent_id: Annotated[str | None, Query(description="Only memories of this agent.")] = None,
    team_id: Annotated[str | None, Query(description="Must be the key's team if given.")] = None,
    time_from: Annotated[datetime | None, Query(description="Only memories at or after this time (ISO 8601 with offset).")] = None,
    time_to: Annotated[datetime | None, Query(description="Only memories at or before this time.")] = None,
    entity: Annotated[str | None, Query(max_length=200, description="Only memories naming this entity.")] = None,
    include_superseded: Annotated[bool, Query(description="False drops superseded memories and duplicates.")] = True,
    explain: Annotated[bool, Query(description="Include the score parts of every result.")] = False,
    rerank: Annotated[bool, Query(description="Let the configured cross-encoder reranker (MEMSTREAM_EMBEDDINGS_RERANK_URL) order the top results.")] = False,
    min_position: MinPosition = [],  # noqa: B006
    wait_s: WaitS = None,
) -> SearchOut:
    if agent_id is not None:
        check_ids(agent_id=agent_id)
    scope = read_scope(principal, team_id, user_id, agent_id)
    try:
        filters = search_filters(
            memory_types=memory_type,
            session_id=session_id,
            agent_id=scope.agent_id,
            time_from=time_from,
            time_to=time_to,
            include_superseded=include_superseded,
            entity=entity,
        )
    except ValueError as exc:
        raise ApiError(422, "validation_error", str(exc)) from None
    service = service_of(request)
    await wait_for_positions(service, positions(min_position), wait_s)
    try:
        hits = await service.search(scope, q, k, filters, interface="api", rerank=rerank)
    except RerankUnavailable as exc:
        raise ApiError(400, "rerank_unavailable", str(exc)) from None
    return SearchOut(
        results=[search_hit_payload(h, explain=explain) for h in hits],
        scope={"team_id": scope.team_id, "user_id": scope.user_id},
    )

@router.get("/v1/memories/{memory_id}", responses={**ERROR_RESPONSES, 404: {"model": ErrorResponse, "description": "No such memory in this space."},
         409: {"model": ErrorResponse, "description": "min_position not reached in time."}},
         tags=["read"], summary="One memory with its history, links and provenance")
async def get_memory(
    request: Request,
    principal: Caller,
    memory_id: Annotated[str, Path(min_length=1, max_length=128)],
    user_id: Annotated[str | None, Query()] = None,
    team_id: Annotated[str | None, Query()] = None,
    min_position: MinPosition = [],  # noqa: B006
    wait_s: WaitS = None,
) -> dict[str, Any]:
    scope = read_scope(principal, team_id, user_id)
    check_ids(memory_id=memory_id)
    service = service_of(request)
    await wait_for_positions(service, positions(min_position), wait_s)
    found = await service.get_memory(scope, memory_id)
    if found is None:
        raise ApiError(404, "not_found", f"no memory {memory_id!r} in {scope.team_id}/{scope.user_id}")
    return memory_payload(found)

@router.get("/v1/lessons", responses={**ERROR_RESPONSES, 409: {"model": ErrorResponse, "description": "min_position not reached in time."}},
         tags=["read"], summary="Lessons from past decisions on a subject, within a token budget")
async def get_lessons(
    request: Request,
    principal: Caller,
    subject: Annotated[str, Query(min_length=1, max_length=128)],
    budget: Annotated[int, Query(ge=50, le=20_000, description="Token budget of the context text.")] = 800,
    user_id: Annotated[str | None, Query()] = None,
    team_id: Annotated[str | None, Query()] = None,
    min_position: MinPosition = [],  # noqa: B006
    wait_s: WaitS = None,
) -> dict[str, Any]:
    scope = read_scope(principal, team_id, user_id)
    if not subject.strip():
        raise ApiError(422, "validation_error", "query.subject: is empty")
    check_ids(subject=subject)
    service = service_of(request)
    await wait_for_positions(service, positions(min_position), wait_s)
    context = await service.lessons(scope, subject, budget)
    return lessons_payload(context)
