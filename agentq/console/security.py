"""Who may use the console: the one token printed at start, a session cookie, CSRF.

The console listens on loopback only, yet any web page the operator visits can send
requests to 127.0.0.1 and DNS rebinding can give a hostile page that origin's name.
So every request needs the session cookie that only the printed URL's token grants
(403 otherwise), the Host header must be a loopback name, and a state-changing POST
must also carry the page's CSRF token in a header (which a cross-site form cannot
set) with a JSON body and a matching Origin.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from typing import Final

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp

COOKIE: Final = "agentq_console"
CSRF_HEADER: Final = "x-csrf-token"
LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "[::1]")
# Scripts and styles come from the console's own static files only: task data drawn
# into the page can never become code, even if a renderer forgot to escape it.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


STATIC_CACHE: Final = "private, max-age=31536000, immutable"


class Gate:
    """The token, the sessions it opened, and their CSRF tokens (in memory, per run)."""

    def __init__(self, *, token: str | None = None, allow_actions: bool = False) -> None:
        self.token = token or secrets.token_urlsafe(32)
        self.allow_actions = allow_actions
        self._secret = secrets.token_bytes(32)
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    def token_ok(self, supplied: str) -> bool:
        return hmac.compare_digest(supplied.encode(), self.token.encode())

    def open_session(self) -> str:
        session = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions.add(session)
        return session

    def session(self, cookie: str | None) -> str | None:
        if not cookie:
            return None
        with self._lock:
            # compare_digest against each: a set lookup would leak timing only on hash
            # collisions, but the sessions are few and this keeps the rule simple.
            supplied = cookie.encode("utf-8", "replace")  # bytes: str must be ASCII here
            known = [s for s in self._sessions if hmac.compare_digest(s.encode(), supplied)]
        return known[0] if known else None

    def csrf(self, session: str) -> str:
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()

    def post_refusal(self, request: Request, session: str) -> str | None:
        """Why a state-changing request is refused (None: it may go on)."""
        supplied = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(supplied.encode(), self.csrf(session).encode()):
            return "missing or wrong CSRF token"
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return "actions take a JSON body"
        origin = request.headers.get("origin")
        if origin is not None and origin != f"http://{request.headers.get('host', '')}":
            return "cross-origin request"
        return None


def cookie_name(request: Request) -> str:
    # Browsers share cookies across the ports of one host: a name per port lets two
    # consoles (two stages) run side by side without signing each other out.
    return f"{COOKIE}_{request.url.port or 80}"


def forbidden(request: Request, reason: str) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": "forbidden", "detail": reason}, status_code=403)
    body = (
        "<!doctype html><meta charset=utf-8><title>agentq console: forbidden</title>"
        "<h1>403 Forbidden</h1><p>Open the URL that <code>agentq console</code> printed "
        "(it carries the token).</p>"
    )
    return HTMLResponse(body, status_code=403)


class GateMiddleware(BaseHTTPMiddleware):
    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        super().__init__(app)
        self.gate = gate

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await self._guarded(request, call_next)
        if (
            response.status_code == 200
            and request.url.path.startswith("/static/")
            and request.query_params.get("v")
        ):
            # The console's own scripts and styles, named by a hash of their content
            # (`?v=`): a page load reuses them instead of asking again. Data is never
            # cached (no-store below).
            response.headers["Cache-Control"] = STATIC_CACHE
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def _guarded(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        host = request.headers.get("host", "").rsplit(":", 1)[0]
        if host not in LOOPBACK_HOSTS:
            return forbidden(request, "the console answers loopback names only")
        supplied = request.query_params.get("token")
        if supplied is not None:
            if not self.gate.token_ok(supplied):
                return forbidden(request, "wrong token")
            # Trade the token for a cookie and drop it from the address bar (and from
            # the history), to a relative location so nothing can redirect elsewhere.
            rest = request.url.remove_query_params("token")
            # One leading slash: "//host/..." would be a redirect to another site.
            location = "/" + rest.path.lstrip("/") + (f"?{rest.query}" if rest.query else "")
            response = RedirectResponse(location, status_code=303)
            response.set_cookie(cookie_name(request), self.gate.open_session(), httponly=True,
                                samesite="strict", path="/")  # fmt: skip
            return response
        session = self.gate.session(request.cookies.get(cookie_name(request)))
        if session is None:
            return forbidden(request, "missing or wrong token")
        request.state.session = session
        if request.method not in ("GET", "HEAD"):
            refusal = self.gate.post_refusal(request, session)
            if refusal is not None:
                return forbidden(request, refusal)
        return await call_next(request)
