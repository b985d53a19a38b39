"""`loopwarden serve` (the MCP server) and `loopwarden demo`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from loopwarden.clients import admin, render
from loopwarden.clients.cli.common import EXIT_OK, EXIT_USAGE, EXIT_VERIFY, Home, Json, fail, run
from loopwarden.errors import LoopwardenError

if TYPE_CHECKING:
    from loopwarden.server.settings import Settings


def serve(
    agent: Annotated[
        str | None, typer.Option(help="The principal this server speaks for (stdio, --no-auth).")
    ] = None,
    role: Annotated[str | None, typer.Option(help="agent (default) or operator.")] = None,
    http: Annotated[
        str | None, typer.Option(help="Serve streamable HTTP on HOST:PORT (path /mcp).")
    ] = None,
    home: Home = None,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="HTTP on loopback only: every request is --agent.")
    ] = False,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow a non-loopback --http bind.")
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            metavar="NAME",
            help="A Host name clients use for a remote bind (repeat).",
        ),
    ] = None,
) -> None:
    """Run the MCP server (stdio by default).

    Logs go to stderr; on stdio, stdout is the protocol. With --http, streamable HTTP at /mcp
    with bearer tokens (`loopwarden token create`).
    """
    # The SDK loads only here: every other command starts without it.
    from loopwarden.server.settings import Settings
    from loopwarden.server.transports import configure_logging

    configure_logging()
    try:
        settings = Settings.create(
            home=home,
            agent=agent,
            role=role,
            http=http,
            no_auth=no_auth,
            allow_remote=allow_remote,
            allowed_hosts=tuple(allowed_host or ()),
        )
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE)

    _run(settings)


def _run(settings: Settings) -> None:
    """Bind (HTTP), check the store, then serve until stopped."""
    from loopwarden.server.app import build_server
    from loopwarden.server.settings import url_host
    from loopwarden.server.transports import listen, serve_http, serve_stdio

    sock = None
    if settings.http is not None:  # bind first: a busy port fails before anything is said
        try:
            sock = listen(*settings.http)
        except LoopwardenError as exc:
            fail(exc.message)

    async def preflight() -> None:  # refuse a damaged store with a clear message before serving
        async with admin.open_store(settings.home):
            pass

    run(preflight)
    server = build_server(settings)
    if settings.http is None:
        anyio.run(serve_stdio, server)
    else:
        host, port = settings.http
        render.err.print(
            f"loopwarden serving streamable HTTP on http://{url_host(host)}:{port}/mcp "
            f"(home {settings.home})"
        )
        anyio.run(serve_http, server, settings, sock)


def demo(home: Home = None, json_out: Json = False) -> None:
    """Run the end-to-end demonstration, then audit it.

    Each agent talks to its own server over a real MCP stdio connection. Without --home the
    demo works in a temporary directory and removes it at the end.
    """
    from loopwarden.clients.demo import run_demo

    ok = anyio.run(run_demo, home, json_out)
    raise typer.Exit(EXIT_OK if ok else EXIT_VERIFY)
