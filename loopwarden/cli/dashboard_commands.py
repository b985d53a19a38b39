"""`loopwarden dashboard`: the operator dashboard alone, for a local store, on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import anyio
import typer

from loopwarden.cli.common import Options, fail, run, shared_options
from loopwarden.clients import admin, render
from loopwarden.errors import LoopwardenError
from loopwarden.kernel.sql.location import Location

DEFAULT_PORT = 8766


@shared_options("home", "store", "json")
def dashboard(
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Loopback port (0: any free port).")
    ] = DEFAULT_PORT,
    *,
    options: Options,
) -> None:
    """Serve the operator dashboard for a local store, on loopback.

    At http://127.0.0.1:PORT/; sign in with an operator token (loopwarden token create --agent
    NAME --role operator). With --json the URL is printed as {"url": ...}.
    """
    # The web stack loads only here: every other command starts without it.
    from loopwarden.dashboard.standalone import LOOPBACK, serve, standalone_app
    from loopwarden.server.transports import configure_logging, listen, transport_security

    configure_logging()
    json_out = options.json_out
    path, location = existing(options.home, options.store, json_out)

    async def preflight() -> None:  # refuse a damaged store with a clear message before serving
        async with admin.open_store(path, store=location.url, create=False):
            pass

    run(preflight, as_json=json_out)
    try:
        sock = listen(LOOPBACK, port)
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)
    app = standalone_app(
        lambda: admin.open_store(path, store=location.url, create=False),
        db=location,
        keys_home=path,
        security=transport_security(LOOPBACK),
    )
    url = f"http://{LOOPBACK}:{sock.getsockname()[1]}/"
    if json_out:
        render.emit_json({"url": url})
    else:
        print(f"loopwarden dashboard on {url}", flush=True)
    render.err.print(
        "sign in with an operator token (mint one: loopwarden token create --agent NAME --role operator)"
    )
    anyio.run(serve, app, sock)


def existing(home: Path | None, store: str | None, json_out: bool) -> tuple[Path, Location]:
    try:
        return admin.existing_store(home, store)
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)
