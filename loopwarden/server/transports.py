"""Running the server: stdio (default) or streamable HTTP under uvicorn, loopback by default."""

from __future__ import annotations

import logging
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Mount

from loopwarden.server.runtime import Runtime
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


def with_dashboard(app: Starlette, runtime: Runtime, security: TransportSecuritySettings) -> None:
    """Mount the operator dashboard at `/` beside `/mcp` (which is matched first), reading the
    runtime's store, under the same Host and Origin rules as `/mcp`."""
    from loopwarden.dashboard.app import Dashboard, build_dashboard

    settings = runtime.settings
    dashboard = Dashboard(
        lambda: runtime.store,
        db=settings.db_path,
        keys_home=settings.home,
        security=security,
        clock=runtime.clock,
    )
    app.router.routes.append(Mount("/", app=build_dashboard(dashboard)))


async def serve_http(server: MCPServer, settings: Settings, runtime: Runtime | None = None) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp until SIGINT/SIGTERM, and with `runtime`
    (the server's, from `app.build`) the dashboard at http://HOST:PORT/."""
    assert settings.http is not None
    host, port = settings.http
    security = transport_security(host, settings.allowed_hosts)
    app = server.streamable_http_app(transport_security=security, host=host)
    if runtime is not None:
        with_dashboard(app, runtime, security)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on"
    )
    await uvicorn.Server(config).serve()
