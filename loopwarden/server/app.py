"""The one place that wires everything: settings → runtime (store, keys) → MCP server."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from pydantic import AnyHttpUrl

from loopwarden import __version__
from loopwarden.auth.oauth import BearerVerifier, JwtVerifier
from loopwarden.clock import Clock, system_clock
from loopwarden.exports.sink import WebhookSink, sending
from loopwarden.mcp_gateway.proxy import Gateway
from loopwarden.observe import metrics_pushed, tracing_wanted, watching
from loopwarden.observe.observer import Observer
from loopwarden.server.elicitation import ApprovalLinks, with_approval_links
from loopwarden.server.notifications import ChangeFeed, CountingBus, subscribe_handlers
from loopwarden.server.request_state import request_state_security
from loopwarden.server.resources import register_resources
from loopwarden.server.runtime import Runtime
from loopwarden.server.settings import Settings, url_host
from loopwarden.server.tools import build_tools
from loopwarden.witnesses.submitter import Submitter, submitting

INSTRUCTIONS = """\
loopwarden governs this agent loop. Protocol: quota(loop_id) to check you may run a turn →
claim(loop_id) to get a todo under a lease (turn_id, fence, allowed_tools) → work on that todo
using only allowed tools (request_approval for approval-gated ones) → update(turn_id, fence,
outcome, tools_used, usage, evidence, summary, idempotency_key) → follow the returned route
(continue, wait, user_action_required, stop). Every call is checked against the loop's policy
and sealed as a signed receipt; refusals are final for that call. projection(loop_id) shows the
state and who must act next; the loop-operator prompt explains the protocol in full."""

GATEWAY_INSTRUCTIONS = """
This server is also a gateway: tools named SERVER__TOOL are other MCP servers' tools, each call
decided by the loop's policy before it runs and recorded (claim a turn first; a refusal says
why and what to do)."""


def build_server(settings: Settings, *, clock: Clock = system_clock) -> MCPServer:
    """The MCP server for `settings`. The store opens when the server starts (lifespan) and
    closes when it stops."""
    return build(settings, clock=clock)[0]


def build(settings: Settings, *, clock: Clock = system_clock) -> tuple[MCPServer, Runtime]:
    """The MCP server and the runtime that holds its store (what an HTTP dashboard reads)."""
    tracing = tracing_wanted(settings.otel, os.environ)
    observer = watching(
        tracing=tracing,
        metrics=settings.http is not None,
        version=__version__,
        pushed=metrics_pushed(os.environ),
    )
    runtime = Runtime(settings=settings, clock=clock, observer=observer)

    bus = CountingBus()
    feed = ChangeFeed(runtime, bus, clock=clock)
    links = ApprovalLinks(runtime, settings.dashboard_url, settings.approval_webhook)
    gateway = None
    if settings.gateway is not None:
        gateway = Gateway(
            settings.gateway,
            runtime,
            loop=settings.gateway_loop,
            dashboard_url=settings.dashboard_url,
            clock=clock,
        )
    runtime.gateway = gateway

    @asynccontextmanager
    async def lifespan(server: MCPServer) -> AsyncIterator[Runtime]:
        async with runtime.open(), feed.running(), links.running(), AsyncExitStack() as stack:
            if gateway is not None:
                await stack.enter_async_context(gateway.running())
            if runtime.jwts is not None:  # the issuer's keys refreshed in the background
                await stack.enter_async_context(runtime.jwts.keys.running())
            async with _feeds_out(settings, runtime, observer):
                yield runtime

    verifier, auth = _bearer_auth(settings, runtime, clock)
    server = MCPServer(
        "loopwarden",
        version=__version__,
        instructions=INSTRUCTIONS + (GATEWAY_INSTRUCTIONS if gateway is not None else ""),
        lifespan=lifespan,
        tools=with_approval_links(build_tools(), links),
        log_level="WARNING",
        token_verifier=verifier,
        auth=auth,
        request_state_security=request_state_security(settings),
        subscriptions=bus,
        # subscriptions/listen only to loops the caller may see; the gateway's downstream servers
        middleware=[feed, *([gateway] if gateway is not None else [])],
    )
    register_resources(server, runtime)
    subscribe_handlers(server, feed)
    observer.bound_names(lambda method, name: served_name(server, method, name))
    return server, runtime


@asynccontextmanager
async def _feeds_out(
    settings: Settings, runtime: Runtime, observer: Observer
) -> AsyncIterator[None]:
    """The SIEM sink and the witness client while the server runs (neither without a store,
    `runtime.missing`: nothing to send and no checkpoint to submit)."""
    export, store, witnesses = settings.export, runtime.store, settings.witnesses
    sink = (
        None if export is None or store is None else WebhookSink(store, export, observer=observer)
    )
    submitter = (
        None
        if witnesses is None or store is None
        else Submitter(store, witnesses, observer=observer)
    )
    async with sending(sink), submitting(submitter):
        yield


def _bearer_auth(
    settings: Settings, runtime: Runtime, clock: Clock
) -> tuple[TokenVerifier | None, AuthSettings | None]:
    """Who an HTTP request is: the store's static tokens, and JWTs from an OAuth issuer beside
    them when one is set (`runtime.jwts`); nothing over stdio."""
    if not settings.auth or settings.http is None:
        return None, None
    if settings.oauth is not None:
        runtime.jwts = JwtVerifier(settings.oauth, clock=clock)
        issuer = AnyHttpUrl(settings.oauth.issuer)
        return BearerVerifier(runtime.tokens, runtime.jwts), AuthSettings(
            issuer_url=issuer, resource_server_url=None
        )
    host, port = settings.http
    issuer = AnyHttpUrl(f"http://{url_host(host)}:{port}")
    return runtime.tokens, AuthSettings(issuer_url=issuer, resource_server_url=None)


def served_name(server: MCPServer, method: str, name: str) -> bool:
    """Whether `server` serves the tool (`tools/call`) or prompt (`prompts/get`) `name`: what a
    span may be named after (`telemetry.BoundedNames`). The MCP gateway's downstream tools are
    not among them (their calls are spans of their own, `loopwarden.gateway_call`)."""
    # MCPServer has no public lookup by name; its managers do (pinned by tests/test_small_findings.py).
    if method == "tools/call":
        return server._tool_manager.get_tool(name) is not None
    if method == "prompts/get":
        return server._prompt_manager.get_prompt(name) is not None
    return False
