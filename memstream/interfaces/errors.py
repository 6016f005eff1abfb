"""One error shape for every HTTP error: ``{"error": {"code", "message", "details"}}``.

Clients (and agents reading error text) handle one shape whatever failed: auth, a
validation error from FastAPI or from the event model, an unknown route, a read that
could not reach its ``min_position``, or an unexpected crash. ``code`` is a stable
machine-readable string; ``message`` is one readable line; ``details`` is an object
(possibly empty) with structured context. Unexpected errors never leak internals:
the message is generic and the traceback goes to the server log only.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = [
    "ApiError",
    "ErrorBody",
    "ErrorResponse",
    "error_body",
    "error_response",
    "install_error_handlers",
    "ERROR_RESPONSES",
]

log = logging.getLogger("memstream.api")

_STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable error code.")
    message: str = Field(description="One readable line.")
    details: dict[str, Any] = Field(default_factory=dict, description="Structured context.")


class ErrorResponse(BaseModel):
    """The body of every error response."""

    error: ErrorBody


class ApiError(Exception):
    """An error meant for the client as is."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.headers = headers or {}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def error_response(
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    items = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        # FastAPI prefixes the location with where it came from ("body", "query"...).
        where = ".".join(loc) or "request"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        items.append({"location": where, "message": msg, "type": err.get("type", "invalid")})
    head = "; ".join(f"{i['location']}: {i['message']}" for i in items[:5])
    if len(items) > 5:
        head += f"; and {len(items) - 5} more"
    return head or "invalid request", items


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers or None)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, items = _validation_message(list(exc.errors()))
    return error_response(422, "validation_error", message, {"errors": items})


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STATUS_CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    return error_response(exc.status_code, code, message, headers=getattr(exc, "headers", None))


def _malformed_body(exc: BaseException) -> str | None:
    """Why a request body the framework could not even parse is the client's fault:
    nested too deeply for the JSON parser, an integer too long to convert, bytes that
    are not UTF-8. These surface as exceptions outside FastAPI's own parse errors."""
    if isinstance(exc, RecursionError):
        return "the JSON body is nested too deeply"
    if isinstance(exc, UnicodeError):
        return f"the body is not valid UTF-8 text: {exc}"
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return "the JSON body holds a number too long to read"
    return None


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    reason = _malformed_body(exc)
    if reason is not None:
        return error_response(422, "validation_error", reason)
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal server error; see the server log")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can raise through the one shape."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)


def _described(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _described("Missing or unknown API key."),
    403: _described("The scope lies outside the key's bank."),
    422: _described("Invalid request; nothing was written."),
}
"""Documented error responses shared by the authenticated routes (for the OpenAPI spec)."""
