"""`loopwarden gateway check | status | pin | unpin | import`: the MCP gateway's servers file,
its downstream servers' health and the pins of their tools (docs/mcp-gateway.md).

None of them opens the store: `status` and `pin` start each downstream server (as the gateway
would, its secrets resolved in this process) and list its tools. Exit 0 ok, 1 a server failed or
a tool changed since it was pinned (`status`), 2 the file is not a servers file.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer

from loopwarden.cli.common import EXIT_REFUSED, EXIT_USAGE, Options, fail, run, shared_options
from loopwarden.clients import render
from loopwarden.clock import system_clock
from loopwarden.errors import LoopwardenError
from loopwarden.mcp_gateway.pins import Pins, tool_digest
from loopwarden.mcp_gateway.servers_file import (
    REFERENCE,
    HttpSpec,
    SecretUnavailable,
    ServersFile,
    import_config,
    load_servers,
    resolve,
)

TYPE_CHECKING = False  # the MCP client loads only when a command starts a server
if TYPE_CHECKING:
    from loopwarden.mcp_gateway.downstream import Downstream

app = typer.Typer(no_args_is_help=True, help="The MCP gateway: servers file, health, tool pins.")

ServersPath = Annotated[Path, typer.Argument(metavar="FILE", help="The servers file.")]
Names = Annotated[
    list[str] | None,
    typer.Argument(metavar="[SERVER | SERVER__TOOL]...", help="What to pin (default: all)."),
]


def _load(path: Path, json_out: bool) -> ServersFile:
    try:
        return load_servers(path)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE, as_json=json_out, error=exc.code)


def _references(servers: ServersFile) -> dict[str, list[str]]:
    """Each server's `${…}` references that do not resolve here (names, never values)."""
    out: dict[str, list[str]] = {}
    for name, server in servers.servers.items():
        spec = server.spec
        texts = (
            [*spec.headers.values(), spec.url]
            if isinstance(spec, HttpSpec)
            else [spec.command, *spec.args, *spec.env.values(), spec.cwd or ""]
        )
        missing = []
        for text in texts:
            for match in REFERENCE.finditer(text):
                try:
                    resolve(match.group(0), os.environ, name)
                except SecretUnavailable:
                    secret_file = match.group(1).startswith("file:")
                    missing.append("${file:…}" if secret_file else match.group(0))
        if missing:
            out[name] = missing
    return out


@app.command("check")
@shared_options("json", "home")
def gateway_check(file: ServersPath, *, options: Options) -> None:
    """Check a servers file without starting any server.

    The servers it serves, those it skips and why, the secret references that do not resolve
    here, and where the pins are kept. Starts nothing.
    """
    servers = _load(file, options.json_out)
    unresolved = _references(servers)
    out: dict[str, Any] = {
        "file": str(servers.path),
        "loop": servers.settings.loop,
        "pins": str(servers.pins_path),
        "servers": [
            {
                "server": s.name,
                "transport": s.transport,
                "where": s.where,
                "call_timeout_seconds": s.call_timeout_seconds,
                "ignored_keys": list(s.ignored),
                "unresolved": unresolved.get(s.name, []),
            }
            for s in servers.servers.values()
        ],
        "skipped": [{"server": name, "why": why} for name, why in servers.skipped],
    }
    if options.json_out:
        render.emit_json(out)
        return
    render.console.print(f"servers file {render.safe(str(servers.path))}")
    render.console.print(
        f"  loop: {servers.settings.loop or '(none: --loop or the Loopwarden-Loop header)'}"
    )
    render.console.print(f"  pins: {render.safe(str(servers.pins_path))}")
    for server in out["servers"]:
        render.console.print(
            f"  [green]serves[/green] {server['server']} ({render.safe(server['where'])})"
        )
        if server["ignored_keys"]:
            render.console.print(f"    ignored keys: {', '.join(server['ignored_keys'])}")
        for ref in server["unresolved"]:
            render.console.print(f"    [yellow]unresolved here:[/yellow] {render.safe(ref)}")
    for skipped in out["skipped"]:
        render.console.print(
            f"  [yellow]skips[/yellow] {render.safe(skipped['server'])}: {render.safe(skipped['why'])}"
        )


@asynccontextmanager
async def _started(servers: ServersFile) -> AsyncIterator[dict[str, Downstream]]:
    from loopwarden.mcp_gateway.downstream import Downstream  # the MCP client: only here

    downstreams = {name: Downstream(server, list_ttl=0) for name, server in servers.servers.items()}
    async with anyio.create_task_group() as group:
        for downstream in downstreams.values():
            downstream.attach(group.start_soon)
        try:
            yield downstreams
        finally:
            for downstream in downstreams.values():
                await downstream.stop()
            group.cancel_scope.cancel()


async def _survey(servers: ServersFile) -> list[dict[str, Any]]:
    """Each server started and listed: health, and each tool's digest and pin status."""
    from loopwarden.mcp_gateway.downstream import DownstreamError  # the MCP client

    pins = Pins(servers.pins_path)
    report: list[dict[str, Any]] = []
    async with _started(servers) as downstreams:

        async def one(downstream: Downstream) -> None:
            entry: dict[str, Any] = {"server": downstream.name, "where": downstream.server.where}
            try:
                tools = await downstream.tools(fresh=True)
            except DownstreamError as exc:
                entry.update(health="failed", error=exc.message, tools=[])
                report.append(entry)
                return
            listed = []
            for tool in tools:
                name = str(tool.get("name", ""))
                digest = tool_digest(tool)
                status, pinned = pins.status(downstream.name, name, digest)
                listed.append(
                    {"tool": name, "digest": digest, "status": status, "pinned_digest": pinned}
                )
            pinned_away = sorted(
                set(pins.read().get(downstream.name, {})) - {t["tool"] for t in listed}
            )
            entry.update(
                health="ready", protocol=downstream.protocol, tools=listed, missing=pinned_away
            )
            report.append(entry)

        async with anyio.create_task_group() as group:
            for downstream in downstreams.values():
                group.start_soon(one, downstream)
    return sorted(report, key=lambda e: e["server"])


@app.command("status")
@shared_options("json", "home")
def gateway_status(file: ServersPath, *, options: Options) -> None:
    """Start each server and list its tools and their pins.

    Health, and for each tool whether it is pinned, unpinned (hidden until pinned) or changed (refused until pinned
    again). Exit 1 if a server failed or a tool changed.
    """
    servers = _load(file, options.json_out)
    report = run(_survey, servers, as_json=options.json_out)
    bad = any(
        e["health"] != "ready" or any(t["status"] == "changed" for t in e["tools"]) for e in report
    )
    if options.json_out:
        render.emit_json(
            {"file": str(servers.path), "pins": str(servers.pins_path), "servers": report}
        )
    else:
        for entry in report:
            color = "green" if entry["health"] == "ready" else "red"
            render.console.print(
                f"[{color}]{entry['health']:7}[/{color}] {entry['server']} ({render.safe(entry['where'])})"
            )
            if entry.get("error"):
                render.console.print(f"  {render.safe(entry['error'])}")
            for tool in entry["tools"]:
                mark = {"pinned": "green", "unpinned": "yellow", "changed": "red"}[tool["status"]]
                render.console.print(
                    f"  [{mark}]{tool['status']:8}[/{mark}] {render.safe(tool['tool'])}  {tool['digest'][:19]}…"
                )
            for gone in entry.get("missing", []):
                render.console.print(
                    f"  [yellow]gone    [/yellow] {render.safe(gone)} (pinned, no longer listed)"
                )
    if bad:
        raise typer.Exit(EXIT_REFUSED)


def _wanted(names: list[str] | None, servers: ServersFile) -> dict[str, set[str] | None]:
    """Server → the tools named (None: all of them)."""
    if not names:
        return dict.fromkeys(servers.servers)
    out: dict[str, set[str] | None] = {}
    for name in names:
        server, sep, tool = name.partition("__")
        if server not in servers.servers:
            fail(f"the servers file serves no server {server!r}", EXIT_USAGE)
        if not sep:
            out[server] = None
        elif out.get(server, set()) is not None:
            out.setdefault(server, set()).add(tool)  # type: ignore[union-attr]
    return out


@app.command("pin")
@shared_options("json", "home")
def gateway_pin(file: ServersPath, names: Names = None, *, options: Options) -> None:
    """Pin tool descriptions as they are now.

    Each named tool (every tool of a named server; with no name, every tool of every server) to the digest of its name, description
    and input schema. A tool whose description changes later is refused until pinned again.
    """
    servers = _load(file, options.json_out)
    wanted = _wanted(names, servers)
    sub = ServersFile(
        servers.path, {n: s for n, s in servers.servers.items() if n in wanted}, servers.settings
    )
    report = run(_survey, sub, as_json=options.json_out)
    digests: dict[tuple[str, str], str] = {}
    failed = []
    for entry in report:
        if entry["health"] != "ready":
            failed.append(entry)
            continue
        tools = wanted.get(entry["server"])
        listed = {t["tool"] for t in entry["tools"]}
        for tool in tools or ():
            if tool not in listed:
                fail(
                    f"server {entry['server']!r} lists no tool {tool!r}",
                    EXIT_USAGE,
                    as_json=options.json_out,
                )
        for tool in entry["tools"]:
            if tools is None or tool["tool"] in tools:
                digests[(entry["server"], tool["tool"])] = tool["digest"]
    try:
        changed = Pins(servers.pins_path).pin(digests, "operator", system_clock())
    except LoopwardenError as exc:
        fail(exc.message, as_json=options.json_out, error=exc.code)
    out = {
        "pins": str(servers.pins_path),
        "pinned": len(digests),
        "changed": changed,
        "failed": [{"server": e["server"], "error": e.get("error")} for e in failed],
    }
    if options.json_out:
        render.emit_json(out)
    else:
        render.console.print(
            f"pinned {len(digests)} tool(s) ({changed} new or changed) in {render.safe(str(servers.pins_path))}"
        )
        for entry in failed:
            render.console.print(
                f"[red]not pinned:[/red] {entry['server']}: {render.safe(entry.get('error') or '')}"
            )
    if failed:
        raise typer.Exit(EXIT_REFUSED)


@app.command("unpin")
@shared_options("json", "home")
def gateway_unpin(
    file: ServersPath,
    name: Annotated[str, typer.Argument(metavar="SERVER | SERVER__TOOL")],
    *,
    options: Options,
) -> None:
    """Forget the pins of a server or one tool (then hidden)."""
    servers = _load(file, options.json_out)
    server, sep, tool = name.partition("__")
    try:
        gone = Pins(servers.pins_path).unpin(server, tool if sep else None)
    except LoopwardenError as exc:
        fail(exc.message, as_json=options.json_out, error=exc.code)
    if options.json_out:
        render.emit_json({"unpinned": gone})
    else:
        render.console.print(f"unpinned {gone} tool(s)")


@app.command("import")
@shared_options("json", "home")
def gateway_import(
    source: Annotated[
        Path, typer.Argument(metavar="CLIENT_CONFIG", help="e.g. claude_desktop_config.json.")
    ],
    output: Annotated[
        Path, typer.Option("-o", "--output", metavar="FILE", help="The servers file to write.")
    ],
    secrets_dir: Annotated[
        Path | None,
        typer.Option(
            "--secrets-dir",
            metavar="DIR",
            help="Where secret values go (default: the home's gateway-secrets).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE.")] = False,
    *,
    options: Options,
) -> None:
    """Make a servers file from a client's MCP config.

    Its servers (not loopwarden itself), each literal env and header value moved to a secret file (0600) and referenced as ${file:…}.
    Remove the servers from the client's config afterwards: the client reaches them through
    loopwarden only.
    """
    from loopwarden.kernel.store.homes import resolve_home

    if output.exists() and not force:
        fail(
            f"{output} already exists; pass --force to overwrite it",
            EXIT_USAGE,
            as_json=options.json_out,
        )
    where = secrets_dir or resolve_home(options.home) / "gateway-secrets"
    try:
        imported = import_config(source, where)
        output.write_text(json.dumps(imported.document, indent=2) + "\n")
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE, as_json=options.json_out, error=exc.code)
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}", as_json=options.json_out)
    out: dict[str, Any] = {
        "file": str(output),
        "servers": sorted(imported.document["mcpServers"]),
        "secrets_moved": list(imported.moved),
        "secrets_dir": str(where) if imported.moved else None,
        "skipped": [{"server": n, "why": w} for n, w in imported.skipped],
    }
    if options.json_out:
        render.emit_json(out)
    else:
        _print_imported(out)


def _print_imported(out: dict[str, Any]) -> None:
    """What `gateway import` wrote, for a person (`out` is its JSON answer)."""
    output = render.safe(out["file"])
    render.console.print(f"wrote {output}: {', '.join(out['servers']) or 'no server'}")
    if out["secrets_moved"]:
        render.console.print(
            f"  {len(out['secrets_moved'])} secret value(s) moved to "
            f"{render.safe(out['secrets_dir'])} (0600)"
        )
    for skipped in out["skipped"]:
        render.console.print(
            f"  skipped {render.safe(skipped['server'])}: {render.safe(skipped['why'])}"
        )
    render.console.print(f"next: loopwarden gateway pin {output}")
