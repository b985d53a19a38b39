"""A bench-only launcher: the loopwarden server plus a `noop` tool, served like `loopwarden serve`.

The no-op is the transport floor: it goes through the same SDK path as the governance tools
(argument validation, a pydantic result as structured output) and does no governance work.
It exists only here, never in the product.

    python -m bench.noop_server --agent builder --home DIR              # stdio
    python -m bench.noop_server --http 127.0.0.1:PORT --home DIR         # HTTP, bearer tokens
"""

from __future__ import annotations

import argparse
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, ConfigDict, Field

from loopwarden.clock import Clock, system_clock
from loopwarden.ledger.events import ID_PATTERN
from loopwarden.server.app import build_server
from loopwarden.server.settings import Settings
from loopwarden.server.tools import strict
from loopwarden.server.transports import configure_logging, serve_http, serve_stdio


class NoopResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    loop_id: str


async def noop(
    loop_id: Annotated[str, Field(description="Any loop id.", pattern=ID_PATTERN)], ctx: Context
) -> NoopResult:
    """Do nothing (benchmark floor)."""
    ctx.request_context.lifespan_context  # noqa: B018 - reach the runtime like every real tool
    return NoopResult(ok=True, loop_id=loop_id)


def add_noop(server: MCPServer) -> MCPServer:
    """Register `noop` built exactly like the governance tools (strict, structured output)."""
    # `MCPServer.add_tool` returns nothing; the manager's returns the Tool to make strict.
    strict(server._tool_manager.add_tool(noop, name="noop", structured_output=True))
    return server


def build_noop_server(settings: Settings, *, clock: Clock = system_clock) -> MCPServer:
    return add_noop(build_server(settings, clock=clock))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_server")
    parser.add_argument("--agent")
    parser.add_argument("--role")
    parser.add_argument("--http")
    parser.add_argument("--home", required=True)
    parser.add_argument("--no-auth", action="store_true")
    args = parser.parse_args()
    configure_logging()
    settings = Settings.create(
        home=args.home, agent=args.agent, role=args.role, http=args.http, no_auth=args.no_auth
    )
    server = build_noop_server(settings)
    if settings.http is None:
        anyio.run(serve_stdio, server)
    else:
        anyio.run(serve_http, server, settings)


if __name__ == "__main__":
    main()
