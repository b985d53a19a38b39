"""What every dashboard response and request goes through, before any page runs.

- Host and Origin are checked with the same rules and the same settings as `/mcp` (the MCP
  SDK's DNS-rebinding protection: loopback names, the bind host, every `--allowed-host`): a
  foreign Host is 421, a foreign Origin 403.
- A state-changing request must be a small urlencoded form (64 KiB at most); its CSRF token is
  checked by the page (`pages.py`), against the session's.
- Every response carries a strict Content-Security-Policy (scripts, styles and fetches from
  this origin only: no inline script or style, no framing, forms post only here), and is
  neither cached nor sniffed.
"""

from __future__ import annotations

from mcp.server.transport_security import (
    RequestBodyLimitMiddleware,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_FORM_BYTES = 64 * 1024
CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
SAFE_METHODS = {"GET", "HEAD"}
FORM_TYPE = "application/x-www-form-urlencoded"


class Guard:
    """ASGI middleware for the dashboard app: request checks first, headers on every response."""

    def __init__(self, app: ASGIApp, security: TransportSecuritySettings) -> None:
        self.app = RequestBodyLimitMiddleware(app, MAX_FORM_BYTES)
        self.origin_check = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refused = await self.origin_check.validate_request(request, is_post=False)
        if refused is None and request.method not in SAFE_METHODS:
            if request.method != "POST":
                refused = PlainTextResponse("method not allowed", status_code=405)
            elif request.headers.get("content-type", "").split(";")[0].strip() != FORM_TYPE:
                refused = PlainTextResponse("a form post is expected", status_code=415)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
                if "cache-control" not in headers:
                    headers["cache-control"] = "no-store"
            await send(message)

        if refused is not None:
            await refused(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)
