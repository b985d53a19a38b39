"""Running the server: stdio (default) or streamable HTTP under uvicorn, loopback by default."""

from __future__ import annotations

import errno
import logging
import socket
import sys
from collections.abc import Sequence

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.middleware import Middleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from loopwarden.auth.oauth import BearerGate, metadata_routes
from loopwarden.clock import system_clock
from loopwarden.errors import AddressInUse, BindFailed
from loopwarden.kernel.store.store import snapshot
from loopwarden.observe import NOBODY, Observer
from loopwarden.server.connections import ConnectionGuard, connection_ceiling, guarded_protocol
from loopwarden.server.hook_route import HookFront, HookRoute
from loopwarden.server.model_route import ModelFront, ModelRoute
from loopwarden.server.sessions import SessionGate, SessionLimits
from loopwarden.server.settings import Settings, is_loopback, url_host

LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


def configure_logging(level: int = logging.WARNING) -> None:
    """Logs go to stderr only: on stdio, stdout is the protocol."""
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("mcp", "httpx2", "httpcore2", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def transport_security(host: str, extra: tuple[str, ...] = ()) -> TransportSecuritySettings:
    """DNS-rebinding protection stays on: loopback names always, the bind host if remote, and
    every `--allowed-host` (the names remote clients use to reach this server)."""
    hosts, origins = list(LOOPBACK_HOSTS), list(LOOPBACK_ORIGINS)
    for name in ([] if is_loopback(host) else [host]) + list(extra):
        hosts.append(f"{url_host(name)}:*")
        origins += [f"http://{url_host(name)}:*", f"https://{url_host(name)}:*"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


async def serve_stdio(server: MCPServer) -> None:
    await server.run_stdio_async()


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to HOST:PORT for `serve_http`, bound before the server says it serves.

    A busy port is a `LoopwardenError` with code `address_in_use` (any other bind failure:
    `bind_failed`), raised here rather than after a "serving on" line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP, and without it every response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        where = f"{url_host(host)}:{port}"
        if exc.errno == errno.EADDRINUSE:
            message = f"address in use: {where} (another server is listening there)"
            raise AddressInUse(message) from None
        raise BindFailed(f"cannot listen on {where}: {exc.strerror}") from None
    return sock


class TraceHeader:
    """Continue the W3C trace of a request's `traceparent` header: the MCP SDK's span of a
    call (`tools/call claim`) nests under it when the request's `_meta` carries none (the SDK
    prefers `_meta`). Requests of a 2025-11-25 session are handled by the session's own task,
    which began with the session's first request: they continue that request's trace."""

    def __init__(self, app: ASGIApp, observer: Observer) -> None:
        self.app, self.observer = app, observer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        header = None
        if scope["type"] == "http":
            header = next((v for k, v in scope["headers"] if k == b"traceparent"), None)
        if header is None or not self.observer.tracing:
            await self.app(scope, receive, send)
            return
        with self.observer.continuing(header.decode("latin-1")):
            await self.app(scope, receive, send)


async def serve_http(
    server: MCPServer,
    settings: Settings,
    sock: socket.socket | None = None,
    mounts: Sequence[BaseRoute] = (),
    observer: Observer = NOBODY,
) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp until SIGINT/SIGTERM (on `sock` if given,
    a socket from `listen`), within `settings.limits` (sessions per principal, idle sessions,
    connections, read timeouts), with `mounts` (the dashboard) beside `/mcp`, which is matched
    first."""
    assert settings.http is not None
    host, port = settings.http
    limits = settings.limits
    security = transport_security(host, settings.allowed_hosts)
    app = server.streamable_http_app(
        transport_security=security, host=host, session_idle_timeout=limits.session_idle_seconds
    )
    if settings.oauth is not None:  # a resource server: RFC 9728 metadata, 401/403 answers
        app.router.routes.extend(metadata_routes(settings.oauth))
        app.user_middleware.append(Middleware(BearerGate, settings=settings.oauth))
    app.router.routes.extend(mounts)
    sessions = SessionLimits(
        server.session_manager,
        limit=limits.sessions_per_principal,
        idle_seconds=limits.session_idle_seconds,
        live_tokens=lambda ids: live_tokens(settings, ids),
        launch=None if settings.principal is None else settings.principal.id,
    )
    app.user_middleware.append(Middleware(SessionGate, limits=sessions))  # after authentication
    app.user_middleware.insert(0, Middleware(TraceHeader, observer=observer))  # outermost
    observer.gauge(
        "mcp_sessions", "Open MCP sessions over streamable HTTP.", sessions.open_sessions
    )
    guard = ConnectionGuard(
        per_address=limits.connections_per_address,
        total=connection_ceiling(limits.connections_per_address),
        header_seconds=limits.header_seconds,
        body_seconds=limits.body_seconds,
    )
    config = uvicorn.Config(
        with_fronts(app, mounts),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        http=guarded_protocol(guard),
    )
    async with anyio.create_task_group() as group:
        group.start_soon(sessions.run)
        await uvicorn.Server(config).serve(sockets=[sock] if sock is not None else None)
        group.cancel_scope.cancel()


def with_fronts(app: ASGIApp, mounts: Sequence[BaseRoute]) -> ASGIApp:
    """`app` behind the short way of every hook route among `mounts` (`hook_route.HookFront`:
    a hook event skips the middleware of `/mcp`)."""
    for route in mounts:
        if isinstance(route, HookRoute):
            app = HookFront(app, route.hooks)
        elif isinstance(route, ModelRoute):
            app = ModelFront(app, route.gateway)
    return app


def live_tokens(settings: Settings, ids: set[str]) -> set[str]:
    """Of the token ids `ids`, those neither revoked nor expired now (a read-only snapshot)."""
    now = system_clock()
    with snapshot(settings.location) as reader:
        return {t.token_id for t in reader.tokens() if t.token_id in ids and t.live_at(now)}
