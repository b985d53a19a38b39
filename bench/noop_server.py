"""A bench-only launcher: the loopwarden server plus a `noop` tool, served like `loopwarden serve`.

The no-op is the transport floor: a tool made like the governance tools (`make_tool`: the
request model's schema, arguments parsed by that model, a pydantic result as structured output)
that does no governance work and touches no store. It exists only here, never in the product.

    python -m bench.noop_server --agent builder --home DIR              # stdio
    python -m bench.noop_server --http 127.0.0.1:PORT --home DIR         # HTTP, bearer tokens
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations

from loopwarden.clock import Clock, system_clock
from loopwarden.kernel.runner.results import Model
from loopwarden.kernel.state.events import LoopId
from loopwarden.server.app import build_server
from loopwarden.server.settings import Settings
from loopwarden.server.tools import GovernedTool, make_tool, success_result
from loopwarden.server.transports import configure_logging, serve_http, serve_stdio


class NoopRequest(Model):
    loop_id: LoopId


class NoopResult(Model):
    ok: bool
    loop_id: str


class NoopTool(GovernedTool):
    async def run(
        self, arguments: dict[str, Any], context: Any, convert_result: bool = False
    ) -> CallToolResult:
        context.request_context.lifespan_context  # noqa: B018 - reach the runtime like every tool
        request = NoopRequest.model_validate(self.fn_metadata.pre_parse_json(arguments))
        return success_result(NoopResult(ok=True, loop_id=request.loop_id))


def add_noop(server: MCPServer) -> MCPServer:
    """Register `noop`, made like the governance tools."""
    hints = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    tool = make_tool(
        NoopTool, "noop", "Do nothing (benchmark floor).", NoopRequest, NoopResult, hints
    )
    server._tool_manager._tools["noop"] = tool
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
