"""`loopwarden hook install HOST` (and, for `--help`, the hook handlers `loopwarden hook HOST`,
which `entry.py` runs without loading this CLI)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from loopwarden.clients import admin, render
from loopwarden.clients.cli.common import EXIT_USAGE, Home, Json, Store, fail
from loopwarden.errors import LoopwardenError
from loopwarden.hooks.install import TOKEN_VARIABLE, Target, merged, settings_path
from loopwarden.ledger.storage.location import STORE_ENV, parse_location, redact
from loopwarden.policy.hosts import HOSTS

app = typer.Typer(
    no_args_is_help=True,
    help="Agent-host hooks: decide tool calls before they run.",
)
TRUST_NOTE = {
    "codex": "Codex runs new or changed hooks only once trusted: open /hooks in Codex and trust "
    "them (or start it with --dangerously-bypass-hook-trust).",
    "cursor": "Cursor support is built from the @cursor/sdk hook code; check it in your editor.",
}


def program() -> tuple[str, ...]:
    """How a host should start this loopwarden: its absolute path, else this interpreter."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "loopwarden" and argv0.exists():
        return (str(argv0.resolve()),)
    return (sys.executable, "-m", "loopwarden")


def _check_loop(home: Path | None, store: str | None, loop_id: str, agent: str) -> list[str]:
    """Warnings about the loop the hooks will speak for (it may be opened later)."""
    try:
        with admin.open_reader(home, store=store) as reader:
            loop = reader.loop_row(loop_id)
            if loop is None:
                return [f"there is no loop {loop_id!r} yet: open it before the agent runs"]
            policy = reader.policy(loop.policy_digest)
    except LoopwardenError as exc:
        return [exc.message]
    warnings = []
    if policy.observe_mode == "off":
        warnings.append(
            f"loop {loop_id}'s policy has no [observe] mode: its hooks will let every call "
            'through unrecorded (set mode = "record" or "enforce")'
        )
    if not policy.admits_agent(agent):
        warnings.append(f"loop {loop_id}'s policy does not admit agent {agent!r}")
    return warnings


@app.command("install")
def install(
    host: Annotated[str, typer.Argument(help=f"One of: {', '.join(HOSTS)}.")],
    loop: Annotated[str, typer.Option("--loop", help="The loop the agent works on.")],
    agent: Annotated[str, typer.Option("--agent", help="The agent the host runs.")],
    scope: Annotated[
        str, typer.Option("--scope", help="project (the current directory) or user.")
    ] = "project",
    http: Annotated[
        str | None,
        typer.Option("--http", help="Claude Code: post to this server (http://HOST:PORT) instead."),
    ] = None,
    server_name: Annotated[
        list[str] | None,
        typer.Option("--server-name", help="loopwarden's MCP server name in the host config."),
    ] = None,
    project: Annotated[
        Path | None, typer.Option("--project", help="The project directory (default: cwd).")
    ] = None,
    print_only: Annotated[
        bool, typer.Option("--print", help="Print the merged settings instead of writing them.")
    ] = False,
    home: Home = None,
    store: Store = None,
    json_out: Json = False,
) -> None:
    """Install loopwarden's hooks into a host's settings file.

    Merges the entries into the project's or the user's settings (other hooks are kept;
    running it again replaces loopwarden's entries), with blocking on failure where the host
    allows it. --print shows the result instead of writing it.
    """
    _check_options(host, scope, store, json_out)
    target = Target(
        host=host,
        loop_id=loop,
        agent=agent,
        program=program(),
        home=admin.home_source(home)[0],
        servers=tuple(server_name or ("loopwarden",)),
        http=http,
        store=store,
    )
    where = settings_path(host, scope, (project or Path.cwd()).resolve(), Path.home())
    text = json.dumps(_merged_settings(where, target, json_out), indent=2) + "\n"
    if print_only:
        sys.stdout.write(text)
        return
    _write(where, text)
    warnings = _check_loop(home, store, loop, agent) + _notes(target)
    if json_out:
        render.emit_json({"settings": str(where), "host": host, "warnings": warnings})
        return
    render.console.print(f"installed loopwarden's {host} hooks in {render.safe(str(where))}")
    for warning in warnings:
        render.err.print(f"[yellow]note:[/yellow] {render.safe(warning)}")


def _notes(target: Target) -> list[str]:
    """What the operator must still do for the installed hooks to work as meant."""
    notes = [TRUST_NOTE[target.host]] if target.host in TRUST_NOTE else []
    if target.http is not None:
        notes.append(
            f"the hooks send ${TOKEN_VARIABLE}: export it in the host's environment "
            f"(loopwarden token create --agent {target.agent} --role observer)"
        )
    return notes


def _check_options(host: str, scope: str, store: str | None, json_out: bool) -> None:
    if host not in HOSTS:
        fail(f"unknown host {host!r}; use one of {', '.join(HOSTS)}", EXIT_USAGE, as_json=json_out)
    if scope not in ("project", "user"):
        fail("--scope is project or user", EXIT_USAGE, as_json=json_out)
    if store is not None and _has_password(store, json_out):
        fail(
            "--store would write the URL's password into the host's settings: give a URL "
            f"without one (a ~/.pgpass entry, or PGPASSWORD in the host's environment), or set "
            f"{STORE_ENV} in the host's environment instead",
            EXIT_USAGE,
            as_json=json_out,
        )


def _merged_settings(where: Path, target: Target, json_out: bool) -> dict[str, Any]:
    """The host's settings at `where` (if any) with loopwarden's entries for `target`."""
    try:
        existing = json.loads(where.read_text()) if where.exists() else None
        return merged(existing, target)
    except json.JSONDecodeError as exc:
        fail(f"{where} is not JSON ({exc.msg}); fix it or move it aside", as_json=json_out)
    except LoopwardenError as exc:
        fail(f"{where}: {exc.message}", EXIT_USAGE, as_json=json_out, error=exc.code)


def _has_password(store: str, as_json: bool) -> bool:
    """Whether a store URL carries a password (a URL that is none is a usage error)."""
    try:
        location = parse_location(store)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE, as_json=as_json, error=exc.code)
    return location.backend == "postgresql" and redact(location.target) != location.target


def _write(path: Path, text: str) -> None:
    """Write a settings file whole or not at all (a crash mid-write never leaves half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staged.write_text(text)
    os.replace(staged, path)


def _handler(host: str) -> Any:
    def run(ctx: typer.Context) -> None:
        from loopwarden.clients.hook_command import main

        raise typer.Exit(main([host, *ctx.args]))

    run.__doc__ = f"""Answer one {host} hook event.

    The event on stdin, for --agent in --loop (and --home, --store, --server-name); the answer on
    stdout and in the exit code, as {host} expects. Hosts run this; see docs/hooks.md.
    """
    return run


for _host in HOSTS:
    app.command(
        _host,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(_handler(_host))
