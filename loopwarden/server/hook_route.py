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
"""

from __future__ import annotations

import logging
import re

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loopwarden import hosts
from loopwarden.hooks.handle import failure, handle
from loopwarden.hosts import ANSWER_HEADER
from loopwarden.hosts.host import MAX_EVENT, Reply
from loopwarden.ledger.state.events import ID_PATTERN
from loopwarden.server.auth import StoreTokenVerifier
from loopwarden.server.runtime import Runtime

log = logging.getLogger("loopwarden.server")
OBSERVER_SCOPE = "role:observer"
REFUSED = {  # what the transport check's refusals mean, for the model and the log
    400: "the hook request is not JSON (Content-Type must be application/json)",
    403: "the hook request's Origin is not allowed (a cross-site request)",
    421: "the hook request's Host is not allowed (serve --allowed-host NAME for a remote name)",
}


async def _agent(request: Request, runtime: Runtime) -> str:
    """The agent the request speaks for, or raises `PermissionError` saying why not."""
    if not runtime.settings.auth:
        assert runtime.settings.principal is not None
        return runtime.settings.principal.id  # --no-auth: loopback only, one principal
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise PermissionError("the hook request carries no bearer token")
    access = await StoreTokenVerifier(lambda: runtime.store).verify_token(token.strip())
    if access is None or access.client_id is None:
        raise PermissionError("the hook's token is not valid (unknown, revoked or expired)")
    if OBSERVER_SCOPE not in access.scopes:
        raise PermissionError(
            "hooks take an observer token (loopwarden token create --role observer)"
        )
    return access.client_id


def hook_route(runtime: Runtime, security: TransportSecuritySettings) -> Route:
    """The route, checking Host, Origin and Content-Type under `security` (that of `/mcp`)."""
    transport = TransportSecurityMiddleware(security)

    async def endpoint(request: Request) -> Response:
        host = request.path_params["host"]
        if host not in hosts.NAMES:
            return Response(f"unknown host {host!r}", status_code=404)
        refused = await transport.validate_request(request, is_post=True)
        raw = await request.body() if refused is None else b""
        if refused is not None:
            reason = REFUSED.get(refused.status_code, "the hook request is refused")
            log.warning("hook refused: %s", reason)
            reply = failure(host, b"", reason)
        elif len(raw) > MAX_EVENT:
            reply = failure(host, b"", f"the event is larger than {MAX_EVENT} bytes")
        else:
            reply = await _answer(request, runtime, host, raw)
        status, body = hosts.get(host).http(reply)
        headers = {ANSWER_HEADER: host}  # what the forwarder takes as an answer, and only that
        return Response(body, status_code=status, media_type="application/json", headers=headers)

    return Route("/hooks/{host}", endpoint, methods=["POST"])


async def _answer(request: Request, runtime: Runtime, host: str, raw: bytes) -> Reply:
    loop_id = request.query_params.get("loop", "")
    if not re.fullmatch(ID_PATTERN, loop_id):
        return failure(host, raw, "the hook URL names no loop (?loop=ID)")
    try:
        agent = await _agent(request, runtime)
    except PermissionError as exc:
        log.warning("hook refused: %s", exc)
        return failure(host, raw, str(exc))
    store = runtime.store
    if store is None:
        return failure(host, raw, "the server is starting or stopping")
    servers = request.query_params.getlist("server") or ["loopwarden"]
    with runtime.observer.continuing(request.headers.get("traceparent")):  # the caller's trace
        return await handle(store, host, raw, loop_id=loop_id, agent=agent, servers=servers)
