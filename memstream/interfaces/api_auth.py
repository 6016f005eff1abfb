"""Who is calling: the API key from the request headers, checked against the live
bank registry and the per-key rate limit. Keys are never logged: they travel only in
headers, and only their hash is compared."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from memstream.banks import BankConfigError, Principal, RegistrySource
from memstream.interfaces.errors import ApiError
from memstream.interfaces.ratelimit import RateLimiter

__all__ = ["present_key", "authenticate", "principal_of", "Caller", "MinPosition", "WaitS"]

log = logging.getLogger("memstream.api")

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer msk_...`")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="The same API key in `X-API-Key`.")


def present_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def authenticate(source: RegistrySource, raw_key: str | None, limiter: RateLimiter | None = None) -> Principal:
    if raw_key is None:
        raise ApiError(
            401,
            "unauthorized",
            "missing API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        registry = source.current()
    except BankConfigError as exc:
        log.error("bank configuration unusable: %s", exc)
        raise ApiError(503, "unavailable", "the bank configuration cannot be read; see the server log") from None
    principal = registry.authenticate(raw_key)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown API key", headers={"WWW-Authenticate": "Bearer"})
    if limiter is not None:
        wait = limiter.take(principal.key_id)
        if wait > 0:
            raise ApiError(
                429, "too_many_requests",
                f"this key is over its rate limit ({limiter.rate:g}/s, burst {limiter.burst:g}); retry later",
                {"retry_after_s": round(wait, 3)}, headers={"Retry-After": RateLimiter.retry_after(wait)},
            )
    return principal


async def principal_of(
    request: Request,
    _b: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    _k: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    """The caller, from the key in the request headers (the two security schemes above
    are declared for the OpenAPI spec; the header parsing is ours, so a malformed
    header gives our 401 rather than a framework 403)."""
    return authenticate(request.app.state.registry, present_key(request.headers), request.app.state.limiter)


Caller = Annotated[Principal, Depends(principal_of)]
MinPosition = Annotated[
    list[str],
    Query(
        description="Wait until the projection has applied this log position "
        "(topic:partition:offset from a write); repeatable.",
    ),
]
WaitS = Annotated[
    float | None,
    Query(ge=0, description="Longest wait for min_position, in seconds (capped by the server's read_wait_max_s)."),
]
