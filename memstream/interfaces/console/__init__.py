"""The web console at ``/console``: server-rendered pages (Jinja2) and a few static
files shipped in the package, no CDN and no Node toolchain (docs/console.md).

It authenticates with the API's keys (a cookie, checked exactly as a header key is)
and reads through the API's service with the key's read scope; the operations pages
need the operator token instead."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from memstream.interfaces.console import routes_auth, routes_ledger, routes_memory, routes_ops
from memstream.interfaces.console.pages import render
from memstream.interfaces.console.session import ConsoleError, NeedLogin, ensure_operator_token, operator_token_path
from memstream.settings import Settings
from memstream.streams.log_tail import LogTail

__all__ = ["mount_console", "ensure_operator_token", "operator_token_path"]

STATIC = Path(__file__).parent / "static"


def mount_console(app: FastAPI, settings: Settings) -> None:
    """Add the console's pages and static files to the API (not to its OpenAPI spec)."""
    app.state.settings = settings
    app.state.console_samples = deque(maxlen=routes_ops.SAMPLES)
    app.state.console_log = LogTail(settings.broker, client_id="memstream-console")  # dead letters, pending decisions
    for module in (routes_auth, routes_memory, routes_ledger, routes_ops):
        app.include_router(module.router, include_in_schema=False)
    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")
    app.add_exception_handler(NeedLogin, _to_login)
    app.add_exception_handler(ConsoleError, _error_page)


async def _to_login(request: Request, exc: Exception) -> Response:
    return RedirectResponse("/console/login", status_code=303)


async def _error_page(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ConsoleError)
    return render(request, "error.html", {"status": exc.status, "message": exc.message}, status=exc.status)
