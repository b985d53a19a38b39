"""`loopwarden serve` (the MCP server) and `loopwarden demo`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer

from loopwarden.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VERIFY,
    Home,
    Json,
    Store,
    fail,
    run,
)
from loopwarden.clients import admin, render
from loopwarden.errors import InvalidInput, LoopwardenError

if TYPE_CHECKING:
    from loopwarden.server.settings import Settings


# The HTTP limits (server/settings.py HttpLimits); each flag's default is the limit's.
Sessions = Annotated[
    int | None, typer.Option(help="HTTP: open MCP sessions per token holder (default 16).")
]
IdleTimeout = Annotated[
    float | None, typer.Option(help="HTTP: seconds before an idle session closes (300).")
]
Connections = Annotated[
    int | None, typer.Option(help="HTTP: connections per client address (default 64).")
]
HeaderTimeout = Annotated[
    float | None, typer.Option(help="HTTP: seconds to send a request head (default 10).")
]
BodyTimeout = Annotated[
    float | None, typer.Option(help="HTTP: seconds to send a request body (default 30).")
]


def _given(metavar: str, help: str) -> Any:
    """A flag that takes a value named `metavar` (a URL, a FILE, …)."""
    return typer.Option(metavar=metavar, help=help)


# OAuth and approval links (auth/identity.py, server/elicitation.py).
OAuthIssuer = Annotated[
    str | None, _given("URL", "HTTP: accept JWT access tokens from this OAuth issuer.")
]
Resource = Annotated[
    str | None, _given("URL", "HTTP with OAuth: this server's /mcp URL (the audience).")
]
OAuthConfig = Annotated[
    str | None, _given("FILE", "HTTP: OAuth settings, an [oauth] table in TOML.")
]
PublicUrl = Annotated[
    str | None, _given("URL", "The dashboard as users reach it (approval links).")
]
ApprovalWebhook = Annotated[
    str | None, _given("URL", "POST each new approval's link here (e.g. a chat hook).")
]

# The receipt stream's webhook sink (exports/targets.py, exports/sink.py).
ExportWebhook = Annotated[
    str | None,
    _given("URL", "POST every receipt, signed, to this URL (or $LOOPWARDEN_EXPORT_WEBHOOK)."),
]
ExportSecretFile = Annotated[
    Path | None,
    _given("FILE", "The webhook's HMAC secret (or $LOOPWARDEN_EXPORT_SECRET), 16 bytes or more."),
]
ExportName = Annotated[
    str | None, _given("NAME", "The webhook sink's name, its cursor's key (webhook).")
]
ExportLease = Annotated[
    float | None,
    _given("SECONDS", "How long a sender's lease lives (120): one replica sends at a time."),
]


# The model gateway (model_gateway/, docs/model-gateway.md).
ModelUpstream = Annotated[
    list[str] | None,
    typer.Option(
        "--model-upstream",
        metavar="PROVIDER=URL",
        help="HTTP: where the model gateway sends a provider's calls (repeat; default: the "
        "provider's public API).",
    ),
]
ModelPrices = Annotated[
    Path | None,
    _given(
        "FILE", "HTTP: model prices over the shipped table (else the home's model-prices.toml)."
    ),
]
ModelTimeout = Annotated[
    float | None,
    _given(
        "SECONDS", "HTTP: how long a model upstream may stay silent before the call ends (300)."
    ),
]


Agent = Annotated[
    str | None, typer.Option(help="The principal this server speaks for (stdio, --no-auth).")
]
Role = Annotated[str | None, typer.Option(help="agent (default) or operator.")]
Http = Annotated[str | None, typer.Option(help="Serve streamable HTTP on HOST:PORT (path /mcp).")]
NoAuth = Annotated[
    bool, typer.Option("--no-auth", help="HTTP on loopback only: every request is --agent.")
]
AllowRemote = Annotated[
    bool, typer.Option("--allow-remote", help="Allow a non-loopback --http bind.")
]
AllowedHost = Annotated[
    list[str] | None,
    typer.Option(
        "--allowed-host", metavar="NAME", help="A Host name clients use for a remote bind (repeat)."
    ),
]
Otel = Annotated[
    bool, typer.Option("--otel", help="Export OpenTelemetry traces (OTEL_* variables).")
]
GatewayFile = Annotated[
    Path | None,
    _given("FILE", "Also serve these downstream MCP servers, governed (an mcpServers file)."),
]
WitnessFile = Annotated[
    Path | None,
    _given(
        "FILE", "Submit every checkpoint to the witnesses of this tlog-policy file (with URLs)."
    ),
]
GatewayLoop = Annotated[
    str | None, _given("ID", "With --gateway: the loop its calls count against.")
]


def serve(
    agent: Agent = None,
    role: Role = None,
    http: Http = None,
    home: Home = None,
    store: Store = None,
    no_auth: NoAuth = False,
    allow_remote: AllowRemote = False,
    allowed_host: AllowedHost = None,
    max_sessions_per_principal: Sessions = None,
    session_idle_timeout: IdleTimeout = None,
    max_connections_per_address: Connections = None,
    header_timeout: HeaderTimeout = None,
    body_timeout: BodyTimeout = None,
    oauth_issuer: OAuthIssuer = None,
    resource: Resource = None,
    oauth_config: OAuthConfig = None,
    public_url: PublicUrl = None,
    approval_webhook: ApprovalWebhook = None,
    otel: Otel = False,
    export_webhook: ExportWebhook = None,
    export_secret_file: ExportSecretFile = None,
    export_name: ExportName = None,
    export_lease: ExportLease = None,
    gateway: GatewayFile = None,
    witness: WitnessFile = None,
    loop: GatewayLoop = None,
    model_upstream: ModelUpstream = None,
    model_prices: ModelPrices = None,
    model_timeout: ModelTimeout = None,
) -> None:
    """Run the MCP server (stdio by default).

    Logs go to stderr; on stdio, stdout is the protocol. With --http, streamable HTTP at /mcp
    with bearer tokens (`loopwarden token create`). With --gateway FILE, the MCP servers the
    file declares are served too, each call decided and sealed (docs/mcp-gateway.md).
    """
    from loopwarden.server.transports import configure_logging

    configure_logging()
    _run(_settings(locals()))


def _run(settings: Settings) -> None:
    """Bind (HTTP), check the store, then serve until stopped."""
    # The SDK loads only here: every other command starts without it.
    from loopwarden.model_gateway.gateway import ModelGateway
    from loopwarden.server.app import build
    from loopwarden.server.hook_route import hook_route
    from loopwarden.server.metrics_route import metrics_route
    from loopwarden.server.model_route import model_route
    from loopwarden.server.mounts import dashboard_mount
    from loopwarden.server.settings import makes_no_store, url_host
    from loopwarden.server.transports import listen, serve_http, serve_stdio, transport_security

    sock = None
    if settings.http is not None:  # bind first: a busy port fails before anything is said
        try:
            sock = listen(*settings.http)
        except LoopwardenError as exc:
            fail(exc.message)

    async def preflight() -> None:  # refuse a damaged store with a clear message before serving
        async with admin.open_store(settings.home, store=settings.location.url):
            pass

    if not makes_no_store(settings):  # an agent's stdio server on no store says so instead
        run(preflight)
    server, runtime = build(settings)
    if settings.http is None:
        anyio.run(serve_stdio, server)
    else:
        host, port = settings.http
        base = f"http://{url_host(host)}:{port}"
        where = f"home {settings.home}"
        if settings.location.file is None:  # a server's store: its URL, without its password
            where += f", store {settings.location}"
        render.err.print(f"loopwarden serving streamable HTTP on {base}/mcp ({where})")
        if settings.oauth is not None:
            render.err.print(
                f"OAuth resource {settings.oauth.resource} (issuer {settings.oauth.issuer})"
            )
        render.err.print(f"operator dashboard on {base}/ (sign in with an operator token)")
        render.err.print(f"host hooks on {base}/hooks/HOST?loop=ID (observer tokens)")
        security = transport_security(host, settings.allowed_hosts)  # /mcp's, on every route
        render.err.print(f"metrics on {base}/metrics (operator tokens)")
        if settings.gateway is not None:
            served = ", ".join(settings.gateway.servers) or "none"
            render.err.print(
                f"MCP gateway for {served} (the Loopwarden-Loop header names the loop)"
            )
        if settings.export is not None:
            export = settings.export
            render.err.print(f"receipts exported to {export.origin} (sink {export.name})")
        if settings.witnesses is not None:
            named = ", ".join(settings.witnesses.witnesses)
            render.err.print(f"checkpoints submitted to the witnesses {named}")
        assert settings.model is not None
        gateway = ModelGateway(lambda: runtime.store, settings.model)
        render.err.print(f"model gateway on {base}/model/PROVIDER/ (gateway tokens)")
        routes = [hook_route(runtime, security), metrics_route(runtime), model_route(gateway)]
        mounts = [*routes, dashboard_mount(runtime, security)]
        anyio.run(serve_http, server, settings, sock, mounts, runtime.observer)


LIMIT_FLAGS = {
    "sessions_per_principal": "max_sessions_per_principal",
    "session_idle_seconds": "session_idle_timeout",
    "connections_per_address": "max_connections_per_address",
    "header_seconds": "header_timeout",
    "body_seconds": "body_timeout",
}
"""Each HTTP limit (`HttpLimits.create`'s parameters) and the `serve` flag that sets it."""


def _settings(flags: dict[str, Any]) -> Settings:
    """`serve`'s flags as validated settings; a bad one exits 2 naming it."""
    from loopwarden.auth.identity import oauth_settings
    from loopwarden.exports.targets import export_target
    from loopwarden.model_gateway.gateway_config import gateway_settings
    from loopwarden.server.settings import HttpLimits, Settings

    try:
        oauth = oauth_settings(flags["oauth_issuer"], flags["resource"], flags["oauth_config"])
        limits = HttpLimits.create(**{limit: flags[flag] for limit, flag in LIMIT_FLAGS.items()})
        settings = Settings.create(
            home=flags["home"],
            store=flags["store"],
            agent=flags["agent"],
            role=flags["role"],
            http=flags["http"],
            no_auth=flags["no_auth"],
            allow_remote=flags["allow_remote"],
            allowed_hosts=tuple(flags["allowed_host"] or ()),
            limits=limits,
            oauth=oauth,
            public_url=flags["public_url"],
            approval_webhook=flags["approval_webhook"],
        )
        export = export_target(
            flags["export_webhook"],
            flags["export_secret_file"],
            flags["export_name"],
            os.environ,
            flags["export_lease"],
        )
        witnesses = None
        if flags["witness"] is not None:
            from loopwarden.witnesses.witness_policy import load_policy

            witnesses = load_policy(flags["witness"], urls=True)
        model = gateway_settings(
            settings.home, flags["model_upstream"], flags["model_prices"], flags["model_timeout"]
        )
        servers = None
        if flags["gateway"] is not None:
            from loopwarden.mcp_gateway.servers_file import load_servers

            servers = load_servers(flags["gateway"])
        elif flags["loop"] is not None:
            raise InvalidInput("--loop goes with --gateway FILE")
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE)
    return dataclasses.replace(
        settings,
        otel=flags["otel"],
        export=export,
        gateway=servers,
        gateway_loop=flags["loop"],
        witnesses=witnesses,
        model=model,
    )


def demo(home: Home = None, json_out: Json = False) -> None:
    """Run the end-to-end demonstration, then audit it.

    Each agent talks to its own server over a real MCP stdio connection. Without --home the
    demo works in a temporary directory and removes it at the end; a --home that already holds
    a database is refused (exit 1), since the demo opens its loops under fixed ids.
    """
    from loopwarden.clients.demo import run_demo

    ok = run(run_demo, home, json_out, as_json=json_out)
    raise typer.Exit(EXIT_OK if ok else EXIT_VERIFY)
