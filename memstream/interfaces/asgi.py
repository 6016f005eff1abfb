"""The two ASGI pieces of the HTTP server that sit outside FastAPI's routing: MCP over
streamable HTTP at ``/mcp`` (per bank, behind the same keys) and the request body
limit."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope as AsgiScope, Send

from memstream.interfaces.api_auth import authenticate, present_key
from memstream.interfaces.errors import ApiError, error_body
from memstream.interfaces.mcp_http import McpServers

__all__ = ["McpEndpoint", "BodyLimit"]


class McpEndpoint:
    """ASGI endpoint at ``/mcp``: authenticates the key, then hands the request to the
    MCP server of the key's bank. Each bank has its own server (made at its first
    request, from the live registry: :mod:`memstream.interfaces.mcp_http`), so
    the scope is pinned by the key, never by anything inside the MCP messages; the key
    is checked against the live registry on every request, and each tool call reads
    its bank's current declaration (a moved or removed bank takes effect at once)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            principal = authenticate(self.app.state.registry, present_key(headers), self.app.state.limiter)
            servers: McpServers | None = getattr(self.app.state, "mcp_servers", None)
            server = await servers.get(principal.bank.name) if servers is not None else None
            if server is None:
                raise ApiError(503, "unavailable", "the server is starting or stopping; retry", headers={"Retry-After": "1"})
        except ApiError as exc:
            response = JSONResponse(
                error_body(exc.code, exc.message, exc.details), status_code=exc.status, headers=exc.headers or None
            )
            await response(scope, receive, send)
            return
        await server.session_manager.handle_request(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with a 413 in the one error shape, before
    they are read into memory (by ``Content-Length``) or as soon as a streamed body
    passes the limit."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            error_body("payload_too_large", f"request body is larger than {self.max_bytes} bytes"),
            status_code=413,
        )
        await response(scope, receive, send)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_large = int(value) > self.max_bytes
                except ValueError:
                    too_large = False
                if too_large:
                    await self._refuse(scope, receive, send)
                    return
        seen = 0
        started = False

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracked(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _BodyTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send)
