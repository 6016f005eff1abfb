"""The HTTP API: write events, search and read memories, under tenant-bound API keys.

Shape of the contract (the committed spec is ``docs/openapi.json``; regenerate it with
``python -m memstream.interfaces.api --openapi > docs/openapi.json``):

* **Auth**: ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. A key is bound to
  one memory bank (:mod:`memstream.banks`). No key or an unknown key: 401. A scope
  outside the key's bank (another team, or another user/agent when the bank pins
  one): 403. A key of team A never reads or writes team B.
* **Writes** (``POST /v1/events``, ``/v1/memories``, ``/v1/messages``,
  ``/v1/decisions``) answer 202 only after Kafka acknowledged the event (durable), with
  ``{event_id, position}``: ``position`` is ``topic:partition:offset``. An invalid body
  is a 422 with the reason, and nothing is written.
* **Reads** (``GET /v1/search``, ``/v1/memories/{id}``, ``/v1/lessons``) are eventually
  consistent. Pass a write's ``position`` as ``min_position`` and the read waits
  (at most ``read_wait_max_s``) until the projection has applied it; if it has not by
  then the answer is a 409 ``position_not_reached`` (with ``Retry-After``), never
  silently stale data.
* **Errors** all have one shape: ``{"error": {"code", "message", "details"}}``.
* ``GET /healthz`` and ``GET /metrics`` (Prometheus) need no key; MCP over streamable
  HTTP is served at ``/mcp`` for the bank of the presented key; the web console at
  ``/console`` (``memstream.interfaces.console``; ``MEMSTREAM_API_CONSOLE=false``: off).

Keys are never logged: they travel only in headers, and only their hash is compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from memstream import __version__
from memstream.banks import RegistrySource
from memstream import metrics
from memstream.interfaces import routes_read, routes_write
from memstream.interfaces.asgi import BodyLimit, McpEndpoint
from memstream.interfaces.console import mount_console
from memstream.interfaces.errors import ErrorResponse, install_error_handlers
from memstream.interfaces.lean_writes import LeanWrites
from memstream.interfaces.mcp_http import McpServers
from memstream.interfaces.ratelimit import RateLimiter
from memstream.interfaces.routes_ops import ops_router
from memstream.interfaces.service import MemoryService
from memstream.memory_release import MMAP_THRESHOLD_BYTES, RELEASE_EVERY_S, pin_mmap_threshold, release_every
from memstream.settings import Settings

__all__ = ["create_api", "openapi_spec", "main"]

log = logging.getLogger("memstream.api")


def create_api(settings: Settings, *, registry: RegistrySource | None = None) -> FastAPI:
    """The FastAPI application. Construction does no I/O (so the spec can be generated
    offline); the lifespan loads the banks, starts the producer, opens the store
    read-only and starts one MCP session manager per bank.

    What handlers share lives on ``app.state``: ``registry`` (the banks), ``limiter``
    (per-key rate limit), ``service`` (the :class:`MemoryService`, None outside the
    lifespan) and ``mcp_servers`` (:class:`McpServers`, per bank, None outside the lifespan)."""
    source = registry or RegistrySource(settings)
    log_registry = CollectorRegistry(auto_describe=True)
    log_state = metrics.LogStateCollector()
    log_registry.register(log_state)
    log_registry.register(metrics.SearchCacheCollector(lambda: _search_cache_stats(app)))
    app = FastAPI(
        title="memstream",
        version=__version__,
        summary="Long-term memory for fleets of LLM agents: events on Kafka, views in LanceDB.",
        lifespan=_lifespan(settings, source),
        responses={500: {"model": ErrorResponse, "description": "Unexpected error."}},
    )
    app.state.registry = source
    app.state.limiter = RateLimiter(settings.api.rate_per_s, settings.api.rate_burst)
    app.state.service = None
    app.state.mcp_servers = None
    install_error_handlers(app)
    app.add_middleware(LeanWrites, api=app)  # inside the body limit
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_body_bytes)
    app.router.routes.append(Route("/mcp", endpoint=McpEndpoint(app), methods=["GET", "POST", "DELETE"], include_in_schema=False))
    app.include_router(routes_write.router)
    app.include_router(routes_read.router)
    app.include_router(ops_router(log_registry, log_state))
    if settings.api.console:
        mount_console(app, settings)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _search_cache_stats(app: FastAPI) -> dict[str, int] | None:
    service = app.state.service
    return service.search_cache.stats() if service is not None else None


def _lifespan(
    settings: Settings, source: RegistrySource
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the service and one MCP server per bank, put on
    ``app.state`` while the app serves."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        banks = source.current()  # fail fast on a broken bank file
        service = MemoryService(settings, client_id="memstream-api")
        async with AsyncExitStack() as stack:
            await service.start()
            stack.push_async_callback(service.stop)
            servers = McpServers(settings, source, service)
            stack.push_async_callback(servers.close)
            for name in sorted(banks.banks):  # the banks declared now; later ones at their first request
                await servers.get(name)
            app.state.service = service
            app.state.mcp_servers = servers
            if getattr(app.state, "console_log", None) is not None:  # the console's log reader, started at its first page
                stack.push_async_callback(app.state.console_log.close)
            pin_mmap_threshold(MMAP_THRESHOLD_BYTES)
            releasing = asyncio.create_task(release_every(RELEASE_EVERY_S), name="release-memory")
            stack.callback(releasing.cancel)
            log.info(
                "API ready: %d bank(s) [%s], topics %s*, store %s",
                len(servers.names), ", ".join(servers.names) or "none", settings.broker.topic_prefix, settings.storage.root,
            )
            try:
                yield
            finally:
                app.state.service = None
                app.state.mcp_servers = None

    return lifespan


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The spec, with the event schemas every ``POST /v1/events`` body may take and
    without FastAPI's own 422 shape (ours is ``ErrorResponse``)."""
    if app.openapi_schema:
        return app.openapi_schema
    spec = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes,
        description=(__doc__ or "").split("\n\n", 1)[1].strip() if __doc__ else None,
    )
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in routes_write.EVENT_SCHEMA.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    for name in ("HTTPValidationError", "ValidationError"):
        if not _referenced(spec, name, exclude=name):
            schemas.pop(name, None)
    app.openapi_schema = spec
    return spec


def _referenced(spec: dict[str, Any], name: str, *, exclude: str) -> bool:
    ref = f"#/components/schemas/{name}"
    pruned = {k: v for k, v in spec.get("components", {}).get("schemas", {}).items() if k != exclude}
    return ref in json.dumps(spec.get("paths", {})) or ref in json.dumps(pruned)


def openapi_spec(settings: Settings | None = None) -> dict[str, Any]:
    """The OpenAPI document (no I/O)."""
    return create_api(settings or Settings()).openapi()


def main(argv: list[str] | None = None) -> int:
    """``python -m memstream.interfaces.api --openapi`` prints the spec (sorted, stable)."""
    parser = argparse.ArgumentParser(prog="python -m memstream.interfaces.api")
    parser.add_argument("--openapi", action="store_true", help="print the OpenAPI spec as JSON and exit")
    args = parser.parse_args(argv)
    if not args.openapi:
        parser.error("nothing to do: pass --openapi (run the server with `memstream api`)")
    sys.stdout.write(json.dumps(openapi_spec(), indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
