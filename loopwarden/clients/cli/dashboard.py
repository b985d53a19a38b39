"""`loopwarden dashboard`: the operator dashboard alone, for a local store, on loopback."""

from __future__ import annotations

from typing import Annotated

import anyio
import typer

from loopwarden.clients import admin, render
from loopwarden.clients.cli.common import EXIT_USAGE, Home, fail, run
from loopwarden.server.settings import DB_NAME, resolve_home

DEFAULT_PORT = 8766


def dashboard(
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Loopback port (0: any free port).")
    ] = DEFAULT_PORT,
    home: Home = None,
) -> None:
    """Serve the operator dashboard for the local store on http://127.0.0.1:PORT/ (loopback
    only; sign in with an operator token: loopwarden token create --agent NAME --role operator)."""
    # The web stack loads only here: every other command starts without it.
    from loopwarden.dashboard.standalone import LOOPBACK, bind, serve, standalone_app
    from loopwarden.server.transports import configure_logging, transport_security

    configure_logging()
    path = resolve_home(home)

    async def preflight() -> None:  # refuse a damaged store with a clear message before serving
        async with admin.open_store(path):
            pass

    run(preflight)
    try:
        sock = bind(port)
    except OSError as exc:
        fail(f"cannot listen on {LOOPBACK}:{port}: {exc.strerror}", EXIT_USAGE)
    app = standalone_app(
        lambda: admin.open_store(path),
        db=path / DB_NAME,
        keys_home=path,
        security=transport_security(LOOPBACK),
    )
    url = f"http://{LOOPBACK}:{sock.getsockname()[1]}/"
    print(f"loopwarden dashboard on {url}", flush=True)
    render.err.print(
        "sign in with an operator token (mint one: loopwarden token create --agent NAME --role operator)"
    )
    anyio.run(serve, app, sock)
