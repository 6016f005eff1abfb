"""The console's entry: the login form (an API key or the operator token), logout,
and the spaces the key may open."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from memstream.interfaces.api_auth import authenticate
from memstream.interfaces.console.pages import render, service_of
from memstream.interfaces.console.session import (
    KEY_COOKIE,
    OPERATOR_COOKIE,
    check_csrf,
    is_operator,
    matches_operator_token,
    principal,
    set_cookie,
)
from memstream.interfaces.errors import ApiError
from memstream.projections.reads import team_spaces

__all__ = ["router"]

router = APIRouter()


@router.get("/console")
@router.get("/console/")
async def index(request: Request) -> Response:
    if request.cookies.get(KEY_COOKIE):
        return RedirectResponse("/console/spaces", status_code=303)
    if is_operator(request):
        return RedirectResponse("/console/ops", status_code=303)
    return RedirectResponse("/console/login", status_code=303)


@router.get("/console/login")
async def login_form(request: Request) -> Response:
    return render(request, "login.html", {"error": None})


@router.post("/console/login")
async def login(request: Request, credential: str = Form(""), csrf: str = Form("")) -> Response:
    check_csrf(request, csrf)
    value = credential.strip()
    if matches_operator_token(request.app.state.settings, value):
        response = RedirectResponse("/console/ops", status_code=303)
        set_cookie(request, response, OPERATOR_COOKIE, value)
        return response
    try:
        authenticate(request.app.state.registry, value or None, request.app.state.limiter)
    except ApiError as exc:
        message = "unknown API key" if exc.status == 401 else exc.message
        return render(request, "login.html", {"error": message}, status=401 if exc.status == 401 else exc.status)
    response = RedirectResponse("/console/spaces", status_code=303)
    set_cookie(request, response, KEY_COOKIE, value)
    return response


@router.post("/console/logout")
async def logout(request: Request, csrf: str = Form("")) -> Response:
    check_csrf(request, csrf)
    response = RedirectResponse("/console/login", status_code=303)
    for name in (KEY_COOKIE, OPERATOR_COOKIE):
        response.delete_cookie(name, path="/console")
    return response


@router.get("/console/spaces")
async def spaces(request: Request) -> Response:
    who = principal(request)
    access = who.access
    if access.user_id is not None:
        users = [access.user_id]
    else:
        service = service_of(request)
        users = await asyncio.to_thread(team_spaces, service.store, access)
    return render(request, "spaces.html", {"users": users, "access": access}, principal=who)
