"""What every console page shares: the templates, rendering with the session's
context, the read scope of a page, and the form values it parses."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from memstream.banks import Principal
from memstream.domain.access import ReadScope
from memstream.interfaces.console.session import CSRF_COOKIE, ConsoleError, csrf_token, is_operator, set_cookie
from memstream.interfaces.errors import ApiError
from memstream.interfaces.guards import read_scope
from memstream.interfaces.service import MemoryService, check_request_values

__all__ = ["TEMPLATES", "render", "space_scope", "service_of", "parse_time", "page_number", "fmt_time", "PAGE_SIZE"]

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
PAGE_SIZE = 25


def fmt_time(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "" if value is None else str(value)


TEMPLATES.env.filters["when"] = fmt_time


def render(request: Request, name: str, context: dict[str, Any], status: int = 200,
           principal: Principal | None = None) -> Response:
    """A page (or fragment) with the session's context: the bank, the operator flag
    and the CSRF token its forms carry."""
    token = csrf_token(request)
    ctx = {"request": request, "principal": principal, "operator": is_operator(request), "csrf": token, **context}
    response = TEMPLATES.TemplateResponse(request, name, ctx, status_code=status)
    response.headers["Cache-Control"] = "no-store"
    if request.cookies.get(CSRF_COOKIE) != token:
        set_cookie(request, response, CSRF_COOKIE, token)
    return response


def space_scope(principal: Principal, user_id: str | None, agent_id: str | None = None) -> ReadScope:
    """The read scope of a page, resolved exactly as the API resolves a read's
    (``guards.read_scope``): a space outside the key's bank is a 403."""
    try:
        if agent_id:
            check_request_values(agent_id=agent_id)
        return read_scope(principal, None, user_id or None, agent_id or None)
    except ApiError as exc:
        raise ConsoleError(exc.status, exc.message) from None
    except ValueError as exc:
        raise ConsoleError(422, str(exc)) from None


def service_of(request: Request) -> MemoryService:
    service: MemoryService | None = request.app.state.service
    if service is None:
        raise ConsoleError(503, "the memory service is not running")
    return service


def parse_time(name: str, text: str | None) -> datetime | None:
    """A form's date or date-time (no offset: UTC); a clear 422 for anything else."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConsoleError(422, f"{name}: not a date or time ({text!r}); use e.g. 2025-01-31 or 2025-01-31T09:30") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def page_number(text: str | None) -> int:
    try:
        page = int(text or 1)
    except ValueError:
        raise ConsoleError(422, f"page: not a number ({text!r})") from None
    if not 1 <= page <= 10_000:
        raise ConsoleError(422, "page: between 1 and 10000")
    return page


def checked_id(name: str, value: str) -> str:
    try:
        check_request_values(**{name: value})
    except (ValueError, ValidationError) as exc:
        raise ConsoleError(422, str(exc)) from None
    return value
