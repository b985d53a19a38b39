"""`POST /hooks/{host}?loop=ID`: a host's `http` hook (Claude Code's `type: "http"`, or the
forwarder a command-only host runs), answered with the same decisions and receipts as the
command hook.

The request passes the rules every route has: the Host and Origin headers of `/mcp` (the MCP
SDK's DNS-rebinding protection, with the same settings) and a JSON body (`Content-Type:
application/json`), so a web page cannot post an event across sites. The caller is the agent an
`observer` token is bound to (`loopwarden token create --agent NAME --role observer`); no other
token is taken, and the loop comes from the hook's URL, never from the event. Every failure
before a tool runs, a refused request included, is answered as a block (a non-2xx answer would
let the tool run), seals nothing, and is logged.

Hosts post every tool call here, twice, so the route takes the short way through the server:
`HookFront` answers `POST /hooks/{host}` ahead of the MCP app's middleware (its authentication,
sessions, error pages and router, none of which a hook event uses) with the same plain ASGI
application the route runs (`Hooks`), which does everything a hook needs itself: the Host,
Origin and Content-Type checks, the body read within `MAX_EVENT` bytes, the observer token
(through the server's verified tokens, `verified.py`), the caller's `traceparent`, and a block
for any fault. The connection limits and timeouts of `connections.py` apply as before (they
sit in the HTTP protocol, under every application). Any other method or path goes on to the
app, which answers it as before (`GET /hooks/claude-code`: 405).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from loopwarden import hosts
from loopwarden.hosts import ANSWER_HEADER
from loopwarden.hosts.handle import failure, handle
from loopwarden.hosts.host import MAX_EVENT, Reply
from loopwarden.kernel.state.events import ID_PATTERN
from loopwarden.server.runtime import Runtime

log = logging.getLogger("loopwarden.server")
OBSERVER_SCOPE = "role:observer"
PREFIX = "/hooks/"
REFUSED = {  # what the transport check's refusals mean, for the model and the log
    400: "the hook request is not JSON (Content-Type must be application/json)",
    403: "the hook request's Origin is not allowed (a cross-site request)",
    421: "the hook request's Host is not allowed (serve --allowed-host NAME for a remote name)",
}
UNDECIDED = "loopwarden could not decide this event; it is blocked"
_ANSWER = ANSWER_HEADER.lower().encode()


class Disconnected(Exception):
    """The client went away before its event was read whole."""


class TooLarge(Exception):
    """The event is larger than `MAX_EVENT` bytes."""


async def read_body(scope: Scope, receive: Receive) -> bytes:
    """The request's body, refused (`TooLarge`) as soon as it is known to exceed `MAX_EVENT`
    bytes — from its Content-Length, or while it arrives — without reading the rest."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > MAX_EVENT:
            raise TooLarge()
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_EVENT:
            raise TooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    length = (b"content-length", str(len(body)).encode())
    await send({"type": "http.response.start", "status": status, "headers": [length, *headers]})
    await send({"type": "http.response.body", "body": body})


class Hooks:
    """`POST /hooks/{host}` as a plain ASGI application (see the module docstring)."""

    def __init__(self, runtime: Runtime, security: TransportSecuritySettings) -> None:
        self.runtime = runtime
        self.transport = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """As the route's application: the host from the route's path parameters."""
        await self.serve(scope["path_params"]["host"], scope, receive, send)

    async def serve(self, host: str, scope: Scope, receive: Receive, send: Send) -> None:
        if host not in hosts.NAMES:
            await _send(send, 404, f"unknown host {host!r}".encode(), [])
            return
        try:
            reply = await self._reply(host, scope, receive)
        except Disconnected:
            return
        except Exception as exc:  # fail closed, and never a traceback to the host
            log.error("hook on %s failed unexpectedly", host, exc_info=exc)
            reply = failure(host, b"", UNDECIDED)
        status, body = hosts.get(host).http(reply)
        # The answer header is what the forwarder takes as an answer, and only that.
        headers = [(b"content-type", b"application/json"), (_ANSWER, host.encode())]
        await _send(send, status, body.encode(), headers)

    async def _reply(self, host: str, scope: Scope, receive: Receive) -> Reply:
        request = Request(scope)
        refused = await self.transport.validate_request(request, is_post=True)
        if refused is not None:
            reason = REFUSED.get(refused.status_code, "the hook request is refused")
            log.warning("hook refused: %s", reason)
            return failure(host, b"", reason)
        try:
            raw = await read_body(scope, receive)
        except TooLarge:
            return failure(host, b"", f"the event is larger than {MAX_EVENT} bytes")
        return await self._answer(request, host, raw)

    async def _answer(self, request: Request, host: str, raw: bytes) -> Reply:
        query = parse_qsl(request.scope["query_string"].decode("latin-1"), keep_blank_values=True)
        loop_id = next((v for k, v in query if k == "loop"), "")
        if not re.fullmatch(ID_PATTERN, loop_id):
            return failure(host, raw, "the hook URL names no loop (?loop=ID)")
        try:
            agent = await self._agent(request)
        except PermissionError as exc:
            log.warning("hook refused: %s", exc)
            return failure(host, raw, str(exc))
        store = self.runtime.store
        if store is None:
            return failure(host, raw, "the server is starting or stopping")
        servers = [v for k, v in query if k == "server"] or ["loopwarden"]
        trace = request.headers.get("traceparent")
        with self.runtime.observer.continuing(trace):  # the caller's trace
            return await handle(store, host, raw, loop_id=loop_id, agent=agent, servers=servers)

    async def _agent(self, request: Request) -> str:
        """The agent the request speaks for, or raises `PermissionError` saying why not."""
        runtime = self.runtime
        if not runtime.settings.auth:
            assert runtime.settings.principal is not None
            return runtime.settings.principal.id  # --no-auth: loopback only, one principal
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise PermissionError("the hook request carries no bearer token")
        access = await runtime.tokens.verify_token(token.strip())
        if access is None or access.client_id is None:
            raise PermissionError("the hook's token is not valid (unknown, revoked or expired)")
        if OBSERVER_SCOPE not in access.scopes:
            raise PermissionError(
                "hooks take an observer token (loopwarden token create --role observer)"
            )
        return access.client_id


class HookRoute(Route):
    """The route `/hooks/{host}` in the app's router (where a method other than POST gets its
    405), carrying the `Hooks` application that `HookFront` puts ahead of the app."""

    def __init__(self, runtime: Runtime, security: TransportSecuritySettings) -> None:
        self.hooks = Hooks(runtime, security)
        super().__init__(PREFIX + "{host}", self.hooks, methods=["POST"])


class HookFront:
    """ASGI: `POST /hooks/{host}` straight to `hooks`; everything else to `app`."""

    def __init__(self, app: ASGIApp, hooks: Hooks) -> None:
        self.app = app
        self.hooks = hooks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            host = path[len(PREFIX) :]
            if path.startswith(PREFIX) and host and "/" not in host and not scope.get("root_path"):
                await self.hooks.serve(host, scope, receive, send)
                return
        await self.app(scope, receive, send)


def hook_route(runtime: Runtime, security: TransportSecuritySettings) -> HookRoute:
    """The route, checking Host, Origin and Content-Type under `security` (that of `/mcp`);
    `serve_http` also puts its application ahead of the app's middleware (`HookFront`)."""
    return HookRoute(runtime, security)
