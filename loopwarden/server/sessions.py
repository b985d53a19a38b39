"""Streamable-HTTP sessions per principal: a limit for each token holder, and the sessions of a
revoked or expired token closed.

The MCP SDK's session manager has one global cap (10,000 sessions by default): one token could
fill it and every other client got HTTP 503 until the idle timeout. `SessionLimits` wraps the
manager without changing it. It sits in front of it, after authentication, and counts the
sessions each principal holds (open, or being opened): a request that would open another one
beyond the principal's limit is answered HTTP 429 with a JSON-RPC error naming the principal
and its limit, and never reaches the manager, so no one else is affected. It learns a session's
id from the manager's answer and its end from the manager's own table (a DELETE, the idle
timeout, a crash all end it there). `sweep` terminates the sessions whose token is no longer
live (revoked or expired); `run` sweeps every `SWEEP_SECONDS` while the server runs.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopwarden.server.chores import every

log = logging.getLogger("loopwarden.server")

SWEEP_SECONDS = 1.0
LiveTokens = Callable[[set[str]], set[str]]  # of these token ids, the ones still live (sync)


@dataclass(frozen=True)
class Holder:
    """Who holds a session: the principal's key (role and id), its id, and the token."""

    key: str
    name: str
    token_id: str | None


def holder_of(scope: Scope, launch: str | None) -> Holder | None:
    """The request's holder: its verified token's principal, or (no auth) the launch principal.
    None for a request without a verified token (the SDK answers it 401)."""
    user = scope.get("user")
    if isinstance(user, AuthenticatedUser):
        access = user.access_token
        roles = sorted(s.removeprefix("role:") for s in access.scopes if s.startswith("role:"))
        # A static token's id is swept when it is revoked; a JWT (`oauth.py`) is checked on
        # every request, so its session has no store token to sweep.
        token_id = access.token if access.token.startswith("tok-") else None
        return Holder(f"{','.join(roles)}:{access.client_id}", access.client_id, token_id)
    if launch is not None and "user" not in scope:
        return Holder(f"launch:{launch}", launch, None)
    return None


@dataclass(eq=False)
class SessionLimits:
    """The per-principal session table in front of one SDK session manager: at most `limit`
    sessions per holder (a refusal says that an idle one closes after `idle_seconds`), the
    sessions of tokens `live_tokens` no longer names swept, and `launch` the id of the launch
    principal, who holds the sessions when there is no auth."""

    manager: StreamableHTTPSessionManager
    _: KW_ONLY
    limit: int
    idle_seconds: float
    live_tokens: LiveTokens
    launch: str | None = None
    _sessions: dict[str, Holder] = field(default_factory=dict, init=False)
    _opening: Counter[str] = field(default_factory=Counter, init=False)

    def _open(self, session_id: str) -> StreamableHTTPServerTransport | None:
        # The manager keeps no public list of its sessions; this one read of its table is the
        # whole coupling (pinned by tests/test_sessions.py against the SDK version in use).
        return self.manager._server_instances.get(session_id)

    def open_sessions(self) -> int:
        """Sessions admitted and still open (the `mcp_sessions` gauge)."""
        return sum(1 for session_id in list(self._sessions) if self._open(session_id) is not None)

    def held(self, key: str) -> int:
        """Sessions `key` holds now (ended ones forgotten) plus those it is opening."""
        for session_id in [s for s, h in self._sessions.items() if h.key == key]:
            if self._open(session_id) is None:
                del self._sessions[session_id]
        return sum(1 for h in self._sessions.values() if h.key == key) + self._opening[key]

    async def sweep(self) -> int:
        """Forget the sessions that ended, and terminate every session whose token is revoked
        or expired; returns how many were terminated."""
        for session_id in [s for s in self._sessions if self._open(s) is None]:
            del self._sessions[session_id]
        tokens = {h.token_id for h in self._sessions.values() if h.token_id is not None}
        if not tokens:
            return 0
        live = await anyio.to_thread.run_sync(self.live_tokens, tokens)
        closed = 0
        for session_id, holder in list(self._sessions.items()):
            if holder.token_id is None or holder.token_id in live:
                continue
            del self._sessions[session_id]
            transport = self._open(session_id)
            if transport is not None:  # ends its server task, which discards it from the manager
                await transport.terminate()
                closed += 1
        if closed:
            log.warning("closed %d session(s) of revoked or expired tokens", closed)
        return closed

    async def run(self) -> None:
        """Sweep every `SWEEP_SECONDS` until cancelled; a failed sweep is logged and retried."""
        await every(SWEEP_SECONDS, self.sweep, "session sweep")

    async def admit(
        self, app: ASGIApp, holder: Holder, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Serve a request that would open a session, if `holder` is under its limit."""
        if self.held(holder.key) >= self.limit:
            await self.sweep()  # a revoked token of the same principal may be holding the slots
        if self.held(holder.key) >= self.limit:
            log.warning("refused a new session for %r: at its limit of %d", holder.name, self.limit)
            await self._refusal(holder)(scope, receive, send)
            return
        self._opening[holder.key] += 1

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                headers = dict(message.get("headers", []))
                session_id = headers.get(MCP_SESSION_ID_HEADER.encode())
                if session_id is not None:
                    self._sessions[session_id.decode()] = holder
            await send(message)

        try:
            await app(scope, receive, watch)
        finally:
            self._opening[holder.key] -= 1

    def _refusal(self, holder: Holder) -> JSONResponse:
        message = (
            f"too many open sessions for {holder.name!r}: limit {self.limit} per principal. "
            f"Close one (HTTP DELETE with its {MCP_SESSION_ID_HEADER}) or wait: a session with "
            f"no request in flight closes after {self.idle_seconds:g} s idle"
        )
        error: dict[str, Any] = {"code": -32000, "message": message}
        return JSONResponse(
            {"jsonrpc": "2.0", "id": None, "error": error},
            status_code=429,
            headers={"Retry-After": str(max(1, round(self.idle_seconds)))},
        )


class SessionGate:
    """ASGI middleware: requests that would open a session (a POST to the MCP path without a
    session id) go through `SessionLimits.admit`; everything else passes untouched."""

    def __init__(self, app: ASGIApp, limits: SessionLimits, path: str = "/mcp") -> None:
        self.app = app
        self.limits = limits
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == self.path:
            names = {name for name, _ in scope["headers"]}
            holder = holder_of(scope, self.limits.launch)
            if MCP_SESSION_ID_HEADER.encode() not in names and holder is not None:
                await self.limits.admit(self.app, holder, scope, receive, send)
                return
        await self.app(scope, receive, send)
