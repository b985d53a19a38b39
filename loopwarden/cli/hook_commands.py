"""`loopwarden hook install HOST` (and, for `--help`, the hook handlers `loopwarden hook HOST`,
which `entry.py` runs without loading this CLI)."""

from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from loopwarden import hosts
from loopwarden.cli.common import EXIT_USAGE, Options, fail, shared_options
from loopwarden.clients import admin, render
from loopwarden.errors import LoopwardenError
from loopwarden.hosts.host import Place, Trust
from loopwarden.hosts.install import TOKEN_VARIABLE, Target, merged, settings_path
from loopwarden.hosts.servers import loopwarden_servers
from loopwarden.kernel.sql.location import STORE_ENV, parse_location
from loopwarden.kernel.store.homes import home_source
from loopwarden.policy.lint import unworkable

app = typer.Typer(
    no_args_is_help=True,
    help="Agent-host hooks: decide tool calls before they run.",
)
NOTES = {
    "cursor": "Cursor support is built from the @cursor/sdk hook code; check it in your editor."
}
HTTP_HELP = (
    "Send each event to this loopwarden serve --http (http://HOST:PORT) with an observer token "
    "(LOOPWARDEN_OBSERVER_TOKEN): Claude Code posts it itself (an http hook), every other host "
    "runs a command that forwards it."
)
IN_PROCESS_HELP = (
    "A hook that opens the store and decides in its own process for every event, instead of "
    "forwarding it to the home's local hook server (slower; no background process)."
)


def program() -> tuple[str, ...]:
    """How a host should start this loopwarden: its absolute path, else this interpreter."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "loopwarden" and argv0.exists():
        return (str(argv0.resolve()),)
    return (sys.executable, "-m", "loopwarden")


def read_file(path: Path) -> str | None:
    """A file's text for a host's trust check, or None if it cannot be read."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def place_of(scope: str, project: Path | None) -> Place:
    """Where hooks go: the scope, the project (default: the current directory), the user's home
    directory and this environment."""
    kind: Literal["project", "user"] = "project" if scope == "project" else "user"
    return Place(kind, (project or Path.cwd()).resolve(), Path.home(), dict(os.environ))


def close_to(name: str, known: list[str]) -> str:
    """' (did you mean X?)' for the nearest of `known`, or nothing."""
    near = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def loop_problems(
    home: Path | None, store: str | None, loop_id: str, agent: str
) -> tuple[list[str], list[str]]:
    """(what makes the hooks speak for nothing, what weakens them) about `agent` in `loop_id`,
    read from the store: a missing store or loop, an agent the policy does not admit; a policy
    that does not observe hosts."""
    try:
        with admin.open_reader(home, store=store) as reader:
            loop = reader.loop_row(loop_id)
            if loop is None:
                near = close_to(loop_id, [row.loop_id for row in reader.loops()])
                return [f"there is no loop {loop_id!r} in the store{near}"], []
            policy = reader.policy(loop.policy_digest)
    except LoopwardenError as exc:
        return [exc.message], []
    problems, warnings = [], []
    if not policy.admits_agent(agent):
        near = close_to(agent, list(policy.agents))
        problems.append(f"loop {loop_id}'s policy does not admit agent {agent!r}{near}")
    if loop.status.closed:
        problems.append(
            f"loop {loop_id} is {loop.status}: nothing more can be claimed or reported in it; "
            "point the hooks at an active loop"
        )
    if policy.observe_mode == "off":
        warnings.append(
            f"loop {loop_id}'s policy has no [observe] mode: its hooks will let every call "
            "through unrecorded. To turn them on: `loopwarden loop policy "
            f'{loop_id} > policy.json`, add "observe": {{"mode": "enforce"}} (and allow the '
            f'tools the host uses, e.g. "shell.run"; `loopwarden policy check policy.json` '
            f"says what is missing), then `loopwarden loop set-policy {loop_id} --policy "
            "policy.json`"
        )
    warnings += [f"loop {loop_id}'s policy: {note}" for note in unworkable(policy)]
    return problems, warnings


@app.command("install")
@shared_options("home", "store", "json")
def install(
    host: Annotated[str, typer.Argument(help=f"One of: {', '.join(hosts.NAMES)}.")],
    loop: Annotated[str, typer.Option("--loop", help="The loop the agent works on.")],
    agent: Annotated[str, typer.Option("--agent", help="The agent the host runs.")],
    scope: Annotated[
        str, typer.Option("--scope", help="project (the current directory) or user.")
    ] = "project",
    http: Annotated[str | None, typer.Option("--http", help=HTTP_HELP)] = None,
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
    in_process: Annotated[bool, typer.Option("--in-process", help=IN_PROCESS_HELP)] = False,
    *,
    options: Options,
) -> None:
    """Install loopwarden's hooks into a host's settings file.

    Merges the entries into the project's or the user's settings (other hooks are kept;
    running it again replaces loopwarden's entries), with blocking on failure where the host
    allows it. --print shows the result instead of writing it.

    The hook command forwards each event to the home's local hook server, which it starts on
    first use and which exits when idle (docs/hooks.md); --in-process writes one that opens
    the store itself for every event (slower), --http one that goes to a running server.

    The loop and the agent must exist in the store (exit 2 otherwise). Then it says whether
    the host trusts the hooks there (Codex: project and hook trust; Gemini CLI: trusted
    folders) and what to do if not; `loopwarden hook doctor` checks it all again later.
    """
    home, store, json_out = options.home, options.store, options.json_out
    _check_options(host, scope, store, json_out, in_process=in_process, http=http)
    warnings = _loop_checked(home, store, loop, agent, http, json_out)
    place = place_of(scope, project)
    servers, said = server_names(host, place, home_source(home)[0], server_name)
    target = Target(
        host=host,
        loop_id=loop,
        agent=agent,
        program=program(),
        home=home_source(home)[0],
        servers=servers,
        http=http,
        store=store,
        in_process=in_process,
    )
    where = settings_path(host, scope, place.project, place.user_home)
    text = json.dumps(_merged_settings(where, target, json_out), indent=2) + "\n"
    if print_only:
        sys.stdout.write(text)
        return
    _write(where, text)
    trust = hosts.get(host).trust(place, read_file)
    _report(target, where, trust, [said, *warnings, *_notes(target)], json_out)


def _loop_checked(
    home: Path | None, store: str | None, loop: str, agent: str, http: str | None, json_out: bool
) -> list[str]:
    """The warnings about the loop and agent an install names; exit 2 if this machine's store
    lacks them and the hooks use it (with `--http` the server's store decides)."""
    problems, warnings = loop_problems(home, store, loop, agent)
    if problems and http is None:
        fail("; ".join(problems), EXIT_USAGE, as_json=json_out, error="not_found")
    if problems:  # the server's store decides; this machine's may be another, or none
        warnings = [f"not checked against the server's store: {problems[0]}"]
    return warnings


def server_names(
    host: str, place: Place, home: Path, given: list[str] | None
) -> tuple[tuple[str, ...], str]:
    """The MCP server names whose loopwarden tools the hooks let through, and a line saying
    where they come from: those given (`--server-name`), else those the host's MCP
    configuration runs loopwarden under for this home, else `loopwarden`."""
    if given:
        return tuple(
            given
        ), f"loopwarden's own tools pass under the server name(s) {', '.join(given)}"
    found = loopwarden_servers(hosts.get(host).mcp_files, place, read_file, home)
    if found:
        names = tuple(f.name for f in found)
        where = ", ".join(sorted({str(f.file) for f in found}))
        return names, (
            f"loopwarden's own tools pass under the server name(s) {', '.join(names)}, which "
            f"run `loopwarden serve` in {where}"
        )
    return ("loopwarden",), (
        f"no MCP server in {hosts.get(host).title}'s configuration runs `loopwarden serve` for "
        "this home yet: loopwarden's own tools pass under the name 'loopwarden'. Add the server "
        "under that name, or install again with --server-name NAME once it is added"
    )


def _report(target: Target, where: Path, trust: Trust, warnings: list[str], json_out: bool) -> None:
    """What was installed, whether the host will run it (loudly, when it will not), and what
    the operator must still do."""
    if json_out:
        render.emit_json(
            {"settings": str(where), "host": target.host, "trusted": trust.trusted,
             "trust": trust.detail, "fix": trust.fix, "warnings": warnings}
        )  # fmt: skip
        return
    title = hosts.get(target.host).title
    render.console.print(f"installed loopwarden's {target.host} hooks in {render.safe(str(where))}")
    if trust.trusted is False:
        render.err.print(
            f"[bold red]WARNING: {title} will NOT run these hooks:[/bold red] "
            f"{render.safe(trust.detail)}\n[bold]to fix:[/bold] {render.safe(trust.fix)}"
        )
    elif trust.trusted is None:
        render.err.print(
            f"[yellow]note:[/yellow] {render.safe(trust.detail)}; {render.safe(trust.fix)}"
        )
    for warning in warnings:
        render.err.print(f"[yellow]note:[/yellow] {render.safe(warning)}")


def _notes(target: Target) -> list[str]:
    """What the operator must still do for the installed hooks to work as meant."""
    notes = [NOTES[target.host]] if target.host in NOTES else []
    if target.http is not None:
        notes.append(
            f"the hooks send ${TOKEN_VARIABLE}: export it in the host's environment "
            f"(loopwarden token create --agent {target.agent} --role observer)"
        )
    return notes


def _check_options(
    host: str, scope: str, store: str | None, json_out: bool, *, in_process: bool, http: str | None
) -> None:
    if host not in hosts.NAMES:
        known = ", ".join(hosts.NAMES)
        message = f"unknown host {host!r}{close_to(host, list(hosts.NAMES))}; use one of {known}"
        fail(message, EXIT_USAGE, as_json=json_out)
    if scope not in ("project", "user"):
        fail("--scope is project or user", EXIT_USAGE, as_json=json_out)
    if in_process and http is not None:
        fail("--in-process and --http exclude each other", EXIT_USAGE, as_json=json_out)
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
    return location.has_password


def _write(path: Path, text: str) -> None:
    """Write a settings file whole or not at all (a crash mid-write never leaves half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staged.write_text(text)
    os.replace(staged, path)


@app.command("stop")
@shared_options("home", "store", "json")
def stop(*, options: Options) -> None:
    """Stop the home's local hook server.

    The server the installed hooks start on first use (the next hook event starts it again); it
    also exits by itself after $LOOPWARDEN_HOOK_IDLE seconds (600) without an event. Says so
    when none runs.
    """
    from loopwarden.clients import hook_local

    place = hook_local.place_of({"home": options.home, "store": options.store})
    try:
        pid = hook_local.ask(place, "stop")
    except (OSError, ValueError) as exc:
        fail(f"the hook server at {place.socket} does not answer ({exc})", as_json=options.json_out)
    if options.json_out:
        render.emit_json({"socket": place.socket, "stopped": pid is not None, "pid": pid})
    elif pid is None:
        render.console.print(f"no local hook server runs for {render.safe(place.home)}")
    else:
        render.console.print(
            f"stopped the local hook server (pid {pid}) of {render.safe(place.home)}"
        )


@app.command("server", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def server(ctx: typer.Context) -> None:
    """Run the home's local hook server (the hooks start it).

    See docs/hooks.md. --home, --store and --idle SECONDS ($LOOPWARDEN_HOOK_IDLE, else 600): it serves the home's
    hook events on hooks/server-VERSION.sock and exits when idle or when the store is gone.
    """
    from loopwarden.server.hook_socket import main

    raise typer.Exit(main(ctx.args))


def _handler(host: str) -> Any:
    def run(ctx: typer.Context) -> None:
        from loopwarden.clients.hook_command import main

        raise typer.Exit(main([host, *ctx.args]))

    run.__doc__ = f"""Answer one {host} hook event.

    The event on stdin, for --agent in --loop (and --home, --store, --server-name); the answer on
    stdout and in the exit code, as {host} expects. Hosts run this; see docs/hooks.md.
    """
    return run


for _host in hosts.NAMES:
    app.command(
        _host,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(_handler(_host))
