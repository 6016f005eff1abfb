"""The HTTP API's operations endpoints: health and Prometheus metrics (no key)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from memstream import __version__
from memstream import metrics
from memstream.interfaces.api_models import Health
from memstream.interfaces.service import MemoryService

__all__ = ["ops_router"]


def ops_router(log_registry: CollectorRegistry, log_state: metrics.LogStateCollector) -> APIRouter:
    """Health and metrics; ``log_state`` (in ``log_registry``) is refreshed from the
    service on every scrape."""
    router = APIRouter()

    @router.get("/healthz", response_model=Health, responses={503: {"model": Health, "description": "Kafka or the store is unreachable."}},
             tags=["ops"], summary="Liveness and dependencies")
    async def healthz(request: Request) -> JSONResponse:
        service: MemoryService | None = request.app.state.service
        kafka = service is not None and await service.kafka_reachable()
        store = service is not None and service.has_store
        ok = kafka and store
        body = Health(status="ok" if ok else "degraded", kafka=kafka, store=store, version=__version__)
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @router.get("/metrics", tags=["ops"], summary="Prometheus metrics",
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
    async def get_metrics(request: Request) -> Response:
        service: MemoryService | None = request.app.state.service
        if service is not None:
            log_state.update(await service.log_snapshot())
        return Response(metrics.render(log_registry), media_type=metrics.CONTENT_TYPE)

    return router
