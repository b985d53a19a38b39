"""`loopwarden dashboard`: the dashboard alone, for a local store, on a loopback port.

The app opens the store when it starts and closes it when it stops (its lifespan); the caller
binds the socket first, so it can print the real URL (port 0 picks a free port) before serving.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Mount

from loopwarden.clock import Clock, system_clock
from loopwarden.dashboard.board import Dashboard
from loopwarden.dashboard.site import build_dashboard
from loopwarden.kernel.sql.location import Location
from loopwarden.kernel.store.store import Store

LOOPBACK = "127.0.0.1"


class LocalStore:
    """The store while the app runs (None before it starts and after it stops)."""

    def __init__(self) -> None:
        self.store: Store | None = None

    def __call__(self) -> Store | None:
        return self.store


def standalone_app(
    opened: Callable[[], AbstractAsyncContextManager[Store]],
    *,
    db: Location,
    keys_home: Path,
    security: TransportSecuritySettings,
    clock: Clock = system_clock,
) -> Starlette:
    local = LocalStore()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with opened() as store:
            local.store = store
            try:
                yield
            finally:
                local.store = None

    dashboard = Dashboard(local, db=db, keys_home=keys_home, security=security, clock=clock)
    return Starlette(routes=[Mount("/", app=build_dashboard(dashboard))], lifespan=lifespan)


async def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve `app` on the bound socket (`transports.listen`) until SIGINT/SIGTERM."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])
