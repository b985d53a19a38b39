"""Running the server: stdio (default) or streamable HTTP under uvicorn, loopback by default."""

from __future__ import annotations

import errno
import logging
import socket
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from loopwarden.errors import LoopwardenError
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
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        where = f"{url_host(host)}:{port}"
        if exc.errno == errno.EADDRINUSE:
            message = f"address in use: {where} (another server is listening there)"
            raise LoopwardenError(message, code="address_in_use") from None
        raise LoopwardenError(
            f"cannot listen on {where}: {exc.strerror}", code="bind_failed"
        ) from None
    return sock


async def serve_http(
    server: MCPServer, settings: Settings, sock: socket.socket | None = None
) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp until SIGINT/SIGTERM (on `sock` if given,
    a socket from `listen`)."""
    assert settings.http is not None
    host, port = settings.http
    app = server.streamable_http_app(
        transport_security=transport_security(host, settings.allowed_hosts), host=host
    )
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on"
    )
    await uvicorn.Server(config).serve(sockets=[sock] if sock is not None else None)
