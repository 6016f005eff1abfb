"""The two write routes an agent fleet calls all the time, ``POST /v1/memories`` and
``POST /v1/messages``, served without FastAPI's per-request machinery.

Why: under a steady stream of writes the API is bound to one core, and FastAPI's route
matching, dependency solving, body handling and response validation cost a write more
CPU than the write's own checks (docs/benchmarks-history.md). This ASGI middleware
(inside the body limit, outside FastAPI's routing) answers a well-formed request
itself: the body parsed and validated once, the key checked, then the same
``routes_write`` function the FastAPI route calls, and the answer written directly.

The contract stays FastAPI's: the routes are still declared there (the OpenAPI spec),
and any request the fast path is not sure of (another content type, a body that is not
JSON or does not validate) is handed to FastAPI with its body replayed, so every error
answer is the framework's own. A key is checked only after the body validated (a
request handed over is checked once, by FastAPI), as FastAPI does it: errors of the
key and of the scope answer in the one error shape.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope as AsgiScope, Send

from memstream.banks import Principal
from memstream.interfaces.api_auth import authenticate, present_key
from memstream.interfaces.api_models import MemoryIn, MessagesIn
from memstream.interfaces.errors import ApiError, error_response
from memstream.interfaces.routes_write import write_memory, write_messages

__all__ = ["LeanWrites"]

_Handler = Callable[[Any, Principal, Any], Awaitable[BaseModel]]
_ROUTES: dict[str, tuple[type[BaseModel], _Handler]] = {
    "/v1/memories": (MemoryIn, write_memory),
    "/v1/messages": (MessagesIn, write_messages),
}


class LeanWrites:
    """ASGI middleware: the fast path of the two write routes (see the module)."""

    def __init__(self, app: ASGIApp, api: Any) -> None:
        self.app = app
        self.api = api
        """The FastAPI application (its ``state``: banks, rate limiter, service)."""

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        plain = scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
        route = _ROUTES.get(scope["path"]) if plain else None
        if route is None:  # anything else, and the app mounted under a prefix: FastAPI's
            await self.app(scope, receive, send)
            return
        model, handler = route
        headers = Headers(scope=scope)
        body, tail = await _read_body(receive)
        parsed = _parsed(model, headers.get("content-type"), body)
        if parsed is None:  # FastAPI answers, its 4xx included
            await self.app(scope, _replay(body, tail, receive), send)
            return
        try:
            state = self.api.state
            principal = authenticate(state.registry, present_key(headers), state.limiter)
            accepted = await handler(self.api, principal, parsed)
        except ApiError as exc:
            response = error_response(exc.status, exc.code, exc.message, exc.details, exc.headers or None)
        else:
            status = 200 if getattr(accepted, "duplicate", False) else 202  # a duplicate wrote nothing
            response = JSONResponse(accepted.model_dump(mode="json"), status_code=status)
        await response(scope, receive, send)


def _parsed(model: type[BaseModel], content_type: str | None, body: bytes) -> BaseModel | None:
    """The body as ``model``, validated as FastAPI validates a JSON body; ``None``
    whenever FastAPI might answer otherwise (not ``application/json``, not JSON, not
    valid)."""
    if content_type is None or content_type.partition(";")[0].strip().lower() != "application/json":
        return None
    try:
        return model.model_validate(json.loads(body))
    except (ValueError, ValidationError, RecursionError):  # ValueError: JSON, UTF-8, long ints
        return None


async def _read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The request's body, and the message that ended it early (a disconnect)."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts), message
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts), None


def _replay(body: bytes, tail: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that gives the body read already, then what ``receive`` gives."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if tail is not None:
        pending = [{"type": "http.request", "body": body, "more_body": True}, tail]

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
