"""The one place that wires everything: settings → runtime (store, keys) → MCP server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from pydantic import AnyHttpUrl

from loopwarden import __version__
from loopwarden.clock import Clock, system_clock
from loopwarden.server.auth import StoreTokenVerifier
from loopwarden.server.resources import register_resources
from loopwarden.server.runtime import Runtime
from loopwarden.server.settings import Settings, url_host
from loopwarden.server.tools import build_tools

INSTRUCTIONS = """\
loopwarden governs this agent loop. Protocol: quota(loop_id) to check you may run a turn →
claim(loop_id) to get a todo under a lease (turn_id, fence, allowed_tools) → work on that todo
using only allowed tools (request_approval for approval-gated ones) → update(turn_id, fence,
outcome, tools_used, usage, evidence, summary, idempotency_key) → follow the returned route
(continue, wait, user_action_required, stop). Every call is checked against the loop's policy
and sealed as a signed receipt; refusals are final for that call. projection(loop_id) shows the
state and who must act next; the loop-operator prompt explains the protocol in full."""


def build_server(settings: Settings, *, clock: Clock = system_clock) -> MCPServer:
    """The MCP server for `settings`. The store opens when the server starts (lifespan) and
    closes when it stops."""
    return build(settings, clock=clock)[0]


def build(settings: Settings, *, clock: Clock = system_clock) -> tuple[MCPServer, Runtime]:
    """The MCP server and the runtime that holds its store (what an HTTP dashboard reads)."""
    runtime = Runtime(settings=settings, clock=clock)

    @asynccontextmanager
    async def lifespan(server: MCPServer) -> AsyncIterator[Runtime]:
        async with runtime.open():
            yield runtime

    verifier, auth = None, None
    if settings.auth and settings.http is not None:
        host, port = settings.http
        verifier = StoreTokenVerifier(lambda: runtime.store)
        issuer = AnyHttpUrl(f"http://{url_host(host)}:{port}")
        auth = AuthSettings(issuer_url=issuer, resource_server_url=None)
    server = MCPServer(
        "loopwarden",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        tools=build_tools(),
        log_level="WARNING",
        token_verifier=verifier,
        auth=auth,
    )
    register_resources(server, runtime)
    return server, runtime
