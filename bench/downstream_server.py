"""A downstream MCP server of the project's own, for the MCP gateway's tests and bench.

Small tools with the shapes argument rules care about, over stdio or streamable HTTP:

    python bench/downstream_server.py                      # stdio
    python bench/downstream_server.py --http 127.0.0.1:PORT

`echo` answers its text; `query` takes SQL (and runs nothing); `push` takes a branch; `sleep`
waits; `crash` ends the process (a downstream that dies). With `DOWNSTREAM_DESCRIBE=v2` in its
environment `echo` describes itself otherwise: a re-described tool ("rug pull"). With
`DOWNSTREAM_TOKEN` set, an HTTP request without `Authorization: Bearer <token>` is refused (a
downstream credential the gateway holds). Not part of the product.
"""

from __future__ import annotations

import argparse
import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("downstream", log_level="WARNING")

ECHO = (
    "Echo the text back (re-described)."
    if os.environ.get("DOWNSTREAM_DESCRIBE") == "v2"
    else "Echo the text back."
)


@server.tool(description=ECHO)
def echo(text: str) -> str:
    return text


@server.tool(description="Run a read-only SQL query (this one runs nothing).")
def query(sql: str) -> str:
    return f"{len(sql)} characters of SQL"


@server.tool(description="Push a branch (this one pushes nothing).")
def push(branch: str) -> str:
    return f"pushed {len(branch)}-character branch name"


@server.tool(description="Wait some seconds.")
async def sleep(seconds: float) -> str:
    await anyio.sleep(seconds)
    return "slept"


@server.tool(description="End this server's process.")
def crash() -> str:
    os._exit(3)


@server.prompt(description="A greeting.")
def greet(name: str) -> str:
    return f"Hello, {name}."


@server.resource("note://first", description="A note.")
def first_note() -> str:
    return "the first note"


def _guarded(app: object, token: str) -> object:
    async def guard(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})  # type: ignore[operator]
                await send({"type": "http.response.body", "body": b"no"})  # type: ignore[operator]
                return
        await app(scope, receive, send)  # type: ignore[operator]

    return guard


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", default=None, help="HOST:PORT")
    args = parser.parse_args()
    if args.http is None:
        server.run("stdio")
        return
    import uvicorn

    host, _, port = args.http.rpartition(":")
    app = server.streamable_http_app(host=host)
    token = os.environ.get("DOWNSTREAM_TOKEN")
    served = _guarded(app, token) if token else app
    config = uvicorn.Config(served, host=host, port=int(port), log_level="warning")  # type: ignore[arg-type]
    anyio.run(uvicorn.Server(config).serve)
    sys.exit(0)


if __name__ == "__main__":
    main()
