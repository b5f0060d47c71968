"""The console's door: the token, the same-origin rule for anything that is not a read, and
the CSRF token of its forms.

- Without a token (a console on loopback), a request must name a loopback host (``Host``):
  a page of another site whose name was rebound to 127.0.0.1 (DNS rebinding) is refused.
- With a token set, every request but the login page and the static files carries it:
  ``Authorization: Bearer <token>`` (scripts), or the cookie the login form sets (browsers;
  ``HttpOnly``, ``SameSite=Strict``). A page without it goes to the login form, an API call
  gets 401.
- A request that is not GET or HEAD coming from a browser page of another site is refused
  (403), writes allowed or not: its ``Origin`` (else its ``Referer``) must be the console's
  own. Scripts send neither and pass.
- Each form carries a CSRF token that must match the browser's ``bolide_csrf`` cookie
  (``check_csrf``, in the form's handler: the guard does not read bodies).
- Every answer tells browsers to run only the console's own files (``Content-Security-Policy``:
  a payload that slipped past escaping still could not run a script) and never to show it in
  another site's frame (``frame-ancestors``, ``X-Frame-Options``: a page that framed the
  console could make a user click its buttons, which the same-origin rule would let through).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bolide.console.settings import is_loopback

__all__ = [
    "CSRF_COOKIE",
    "SAFE_HEADERS",
    "SESSION_COOKIE",
    "Guard",
    "check_csrf",
    "csrf_token",
    "session_value",
]

SESSION_COOKIE = "bolide_console"
CSRF_COOKIE = "bolide_csrf"
_OPEN = ("/login", "/static/")  # reachable without the token
_READS = frozenset({"GET", "HEAD"})
#: Sent with every answer (see the module's docstring).
SAFE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


def session_value(token: str) -> str:
    """The login cookie's value: a digest of the token, so the cookie never holds it."""
    return hashlib.sha256(b"bolide-console-session:" + token.encode()).hexdigest()


def csrf_token(request: Request) -> str:
    """The CSRF token for the forms of this page: the browser's cookie, or a new one (the
    page's response sets it: ``Pages`` does)."""
    return request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)


def check_csrf(request: Request, sent: str | None) -> bool:
    """Whether a form's CSRF field matches the browser's cookie."""
    cookie = request.cookies.get(CSRF_COOKIE)
    return bool(cookie and sent and same_text(cookie, sent))


def same_text(a: str, b: str) -> bool:
    """``a == b`` in constant time (any characters)."""
    return hmac.compare_digest(a.encode(errors="surrogatepass"), b.encode(errors="surrogatepass"))


class Guard:
    """ASGI middleware in front of every route (``token``: the console's, or ``None``)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)

        async def send_safe(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *SAFE_HEADERS]
            await send(message)

        refusal = self.refusal(request)
        if refusal is not None:
            await refusal(scope, receive, send_safe)
            return
        await self.app(scope, receive, send_safe)

    def refusal(self, request: Request) -> Response | None:
        """The answer to a request the door does not let through, else ``None``."""
        path = request.scope["path"]  # as routed: never rebuilt from the Host header
        if self.token is None and not is_loopback(_hostname(request)):
            return _refused(path, 403, "this console answers loopback names only (no token)")
        if request.method not in _READS and not same_origin(request):
            return _refused(path, 403, "cross-site request refused")
        if self.token is None or path.startswith(_OPEN):
            return None
        if self.holds_token(request):
            return None
        if path.startswith("/api/"):
            return _refused(path, 401, "a token is needed (Authorization: Bearer ...)")
        return RedirectResponse("/login", status_code=303)

    def holds_token(self, request: Request) -> bool:
        token = self.token
        assert token is not None
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given:
            return same_text(given, token)
        return same_text(request.cookies.get(SESSION_COOKIE, ""), session_value(token))


def same_origin(request: Request) -> bool:
    """Whether a request names no other site as its origin (``Origin``, else ``Referer``)."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        referer = request.headers.get("referer")
        if referer is None:
            return origin is None  # a script (no Origin); an opaque "null" origin is refused
        origin = referer
    parts = urlsplit(origin)
    return bool(host) and parts.netloc == host and parts.scheme in ("http", "https")


def _hostname(request: Request) -> str:
    """The host a request names, without its port (``[::1]:8080`` gives ``::1``)."""
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _refused(path: str, status: int, why: str) -> Response:
    if path.startswith("/api/"):
        return JSONResponse({"error": why}, status_code=status)
    return Response(why, status_code=status, media_type="text/plain")
