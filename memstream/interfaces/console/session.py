"""Who is looking at the console: the API key or the operator token in a cookie, and
the CSRF check every form post passes.

The key is the API's own credential, checked exactly as a header key is
(``api_auth.authenticate``: the live bank registry, the per-key rate limit), so a
console page sees what the key's bank sees and nothing more. Cookies are HttpOnly
(no script reads them) and SameSite=Strict (no other site's page sends them); a form
post must also carry the token of the double-submit ``msc_csrf`` cookie.

The operator token (``<home>/operator.token``, 0600) opens the operations pages; it
grants no memory space.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from fastapi import Request
from fastapi.responses import Response

from memstream.banks import Principal
from memstream.interfaces.api_auth import authenticate
from memstream.interfaces.errors import ApiError
from memstream.settings import Settings

__all__ = [
    "KEY_COOKIE",
    "OPERATOR_COOKIE",
    "CSRF_COOKIE",
    "ConsoleError",
    "NeedLogin",
    "principal",
    "is_operator",
    "require_operator",
    "operator_token_path",
    "ensure_operator_token",
    "matches_operator_token",
    "csrf_token",
    "check_csrf",
    "set_cookie",
]

KEY_COOKIE = "msc_key"
OPERATOR_COOKIE = "msc_op"
CSRF_COOKIE = "msc_csrf"
COOKIE_PATH = "/console"


class ConsoleError(Exception):
    """A page that cannot be shown, with the status and one line for the person."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NeedLogin(Exception):
    """No usable credential: the page sends the browser to the login form."""


def principal(request: Request) -> Principal:
    """The bank of the key in the session cookie; :class:`NeedLogin` without a valid one."""
    key = request.cookies.get(KEY_COOKIE)
    if not key:
        raise NeedLogin()
    try:
        return authenticate(request.app.state.registry, key, request.app.state.limiter)
    except ApiError as exc:
        if exc.status == 401:
            raise NeedLogin() from None
        raise ConsoleError(exc.status, exc.message) from None


def operator_token_path(settings: Settings) -> Path:
    return settings.api.console_operator_token_file or (settings.home / "operator.token")


def ensure_operator_token(settings: Settings) -> Path:
    """The operator token file, created (0600, 256 random bits) when absent."""
    path = operator_token_path(settings)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: never over a token written meanwhile; 0600 from the first byte
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
    return path


def matches_operator_token(settings: Settings, presented: str | None) -> bool:
    """Whether ``presented`` is the operator token (constant time); False when the
    file is missing, empty or readable by others than its owner."""
    if not presented:
        return False
    path = operator_token_path(settings)
    try:
        if path.stat().st_mode & 0o077:
            return False  # a token others can read is no credential
        token = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return False
    return bool(token) and hmac.compare_digest(token.encode(), presented.strip().encode())


def is_operator(request: Request) -> bool:
    return matches_operator_token(request.app.state.settings, request.cookies.get(OPERATOR_COOKIE))


def require_operator(request: Request) -> None:
    """Operator pages answer 403 to anyone without the operator token (a key is not one)."""
    if not is_operator(request):
        if not request.cookies.get(KEY_COOKIE) and not request.cookies.get(OPERATOR_COOKIE):
            raise NeedLogin()
        raise ConsoleError(403, "this page needs the operator token (log in with it; see docs/console.md)")


def csrf_token(request: Request) -> str:
    """The double-submit token of this browser: its cookie, or a new one (set on the
    response by :func:`set_cookie` when the page renders)."""
    token = request.cookies.get(CSRF_COOKIE)
    if token and len(token) >= 32:
        return token
    new = getattr(request.state, "new_csrf", None)
    if new is None:
        new = request.state.new_csrf = secrets.token_urlsafe(32)
    return str(new)


def check_csrf(request: Request, submitted: str | None) -> None:
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not submitted or not hmac.compare_digest(cookie.encode(), submitted.encode()):
        raise ConsoleError(403, "the form's CSRF token does not match this browser's; reload the page and try again")


def set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    response.set_cookie(
        name, value, httponly=True, samesite="strict", path=COOKIE_PATH,
        secure=request.url.scheme == "https",
    )
