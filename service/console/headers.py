"""Security headers on every response, and the Content-Security-Policies of the pages.

No page runs inline script: every script is a static file of this service (``script-src
'self'``). The console runs no inline style either; Swagger UI's React components set style
attributes, so ``/docs`` alone allows inline styles (never inline script). Nothing may frame the
service (``frame-ancestors 'none'``, and ``X-Frame-Options: DENY`` for older browsers).
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# JSON answers and static files: nothing to run, nothing to frame.
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)

DOCS_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; "
    "base-uri 'none'"
)

_FIXED = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
)


class SecurityHeadersMiddleware:
    """Add the fixed security headers, and ``API_CSP`` where a route set no policy of its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _FIXED:
                    headers[name] = value
                if "content-security-policy" not in headers:
                    headers["Content-Security-Policy"] = API_CSP
            await send(message)

        await self.app(scope, receive, send_with_headers)
