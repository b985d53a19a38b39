"""`POST /hooks/{host}?loop=ID`: a host's `http` hook (Claude Code's `type: "http"`), answered
with the same decisions and receipts as the command hook.

The caller is the agent an `observer` token is bound to (`loopwarden token create --agent NAME
--role observer`); no other token is taken, and the loop comes from the hook's URL, never from
the event. Every failure before a tool runs is answered as a block (a non-2xx answer would let
the tool run), and logged.
"""

from __future__ import annotations

import logging
import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loopwarden.hooks.handle import handle, read_event
from loopwarden.hooks.protocols import MAX_EVENT, PROTOCOLS, Reply
from loopwarden.ledger.state.events import ID_PATTERN
from loopwarden.server.auth import StoreTokenVerifier
from loopwarden.server.runtime import Runtime

log = logging.getLogger("loopwarden.server")
OBSERVER_SCOPE = "role:observer"


def _failure(host: str, raw: bytes, message: str) -> Reply:
    try:
        phase = read_event(host, raw).phase
    except Exception:
        phase = None
    return PROTOCOLS[host].failure(phase, message)


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


def hook_route(runtime: Runtime) -> Route:
    async def endpoint(request: Request) -> Response:
        host = request.path_params["host"]
        if host not in PROTOCOLS:
            return Response(f"unknown host {host!r}", status_code=404)
        protocol = PROTOCOLS[host]
        raw = await request.body()
        if len(raw) > MAX_EVENT:
            reply = _failure(host, b"", f"the event is larger than {MAX_EVENT} bytes")
        else:
            reply = await _answer(request, runtime, host, raw)
        status, body = protocol.http(reply)
        return Response(body, status_code=status, media_type="application/json")

    return Route("/hooks/{host}", endpoint, methods=["POST"])


async def _answer(request: Request, runtime: Runtime, host: str, raw: bytes) -> Reply:
    loop_id = request.query_params.get("loop", "")
    if not re.fullmatch(ID_PATTERN, loop_id):
        return _failure(host, raw, "the hook URL names no loop (?loop=ID)")
    try:
        agent = await _agent(request, runtime)
    except PermissionError as exc:
        log.warning("hook refused: %s", exc)
        return _failure(host, raw, str(exc))
    store = runtime.store
    if store is None:
        return _failure(host, raw, "the server is starting or stopping")
    servers = request.query_params.getlist("server") or ["loopwarden"]
    return await handle(store, host, raw, loop_id=loop_id, agent=agent, servers=servers)
