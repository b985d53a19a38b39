"""`loopwarden hook doctor HOST`: an installed hook set-up, checked end to end.

Reads the host's settings file where `hook install` wrote it and checks, in order: loopwarden's
hooks are there for every event it installs; the host trusts them there (Codex: project and
hook trust; Gemini CLI: trusted folders; `loopwarden/hosts`); the hook command resolves (an
executable, or on PATH); the store it names opens; the loop exists and its policy admits the
agent (and observes hosts); for the default command set-up, the home's local hook server
starts (if it is not running) and answers; for `--http` set-ups, the server answers and takes the observer
token in `$LOOPWARDEN_OBSERVER_TOKEN`, with no receipt sealed.

Exit codes: 0 every check passed (notes may remain), 1 a check failed (the hooks will not
work as meant; each failure says what to do), 2 a usage error.
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode, urlsplit

import typer

from loopwarden import hosts
from loopwarden.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, Json, fail
from loopwarden.cli.hook_commands import close_to, loop_problems, place_of, read_file
from loopwarden.clients import render
from loopwarden.hosts.host import Hook, Host, Place, hook_entry_is_ours
from loopwarden.hosts.install import TOKEN_VARIABLE, settings_path
from loopwarden.hosts.servers import loopwarden_servers

PROBE_SECONDS = 10.0


@dataclass(frozen=True)
class Check:
    """One finding: passed (True), failed (False) or a note (None), and what to do."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""


@dataclass
class Installed:
    """How loopwarden's installed hooks call it: a command line, or an http hook's URL."""

    events: set[str] = field(default_factory=set)
    command: str | None = None
    url: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _entries(host: Host, settings: dict[str, Any], event: str) -> list[dict[str, Any]]:
    """loopwarden's hook entries for `event` in a settings file (groups or flat entries)."""
    found = []
    for entry in settings.get("hooks", {}).get(event) or []:
        inner = entry.get("hooks") if isinstance(entry, dict) else None
        for hook in inner if isinstance(inner, list) else [entry]:
            if hook_entry_is_ours(hook, host.name):
                found.append(hook)
    return found


def _options(host: str, words: list[str]) -> dict[str, Any]:
    """The flags of a `… hook HOST --loop ID …` command line."""
    rest = words[words.index(host) + 1 :] if host in words else []
    options: dict[str, Any] = {"server_name": []}
    while rest:
        flag, value = rest.pop(0), rest.pop(0) if rest else ""
        if flag == "--in-process":
            options["in_process"] = True
            rest.insert(0, value)  # a flag without a value
            continue
        if flag == "--server-name":
            options["server_name"].append(value)
        elif flag in ("--loop", "--agent", "--home", "--store", "--server"):
            options[flag[2:]] = value
    return options


def installed(host: Host, settings: Any) -> Installed:
    """What of loopwarden's hooks a host's settings hold."""
    found = Installed()
    if not isinstance(settings, dict) or not isinstance(settings.get("hooks"), dict):
        return found
    for event in host.hooks(Hook(command="")):
        for hook in _entries(host, settings, event):
            found.events.add(event)
            found.command = found.command or hook.get("command")
            found.url = found.url or hook.get("url")
    if found.url:
        query = parse_qs(urlsplit(found.url).query)
        found.options = {
            "loop": (query.get("loop") or [""])[0],
            "server": found.url.split("/hooks/")[0],
            "server_name": query.get("server", []),
        }
    elif found.command:
        found.options = _options(host.name, shlex.split(found.command))
    return found


def _settings_check(host: Host, where: Path) -> tuple[Check, Installed]:
    text = read_file(where)
    reinstall = f"loopwarden hook install {host.name} --loop LOOP --agent AGENT"
    if text is None:
        return Check("settings", False, f"there is no {where}", reinstall), Installed()
    try:
        found = installed(host, json.loads(text))
    except ValueError as exc:
        return Check("settings", False, f"{where} is not JSON ({exc})", f"fix {where}"), Installed()
    wanted = set(host.hooks(Hook(command="")))
    missing = sorted(wanted - found.events)
    if not found.events:
        return Check("settings", False, f"{where} holds no loopwarden hook", reinstall), found
    if missing:
        detail = f"{where} lacks loopwarden's hooks for {', '.join(missing)}"
        return Check("settings", False, detail, reinstall), found
    return Check("settings", True, f"{where}: every event has loopwarden's hook"), found


def _command_check(found: Installed) -> Check:
    if found.command is None:
        return Check("command", True, f"{found.url}: the host posts events itself")
    words = shlex.split(found.command)
    program = shutil.which(words[0]) if words else None
    if program is None:
        return Check(
            "command",
            False,
            f"the hook command {words[0] if words else ''!r} does not resolve (not an "
            "executable, not on PATH)",
            "install loopwarden where the host can run it, then run hook install again",
        )
    return Check("command", True, f"the hook command runs {program}")


def _store_checks(found: Installed, home: Path | None) -> list[Check]:
    """The store the hooks decide on (the command's, else this machine's for an http set-up),
    and the loop and agent in it."""
    options = found.options
    loop, agent = options.get("loop") or "", options.get("agent")
    remote = options.get("server") is not None
    where = Path(options["home"]) if options.get("home") else home
    if agent is None:  # an http hook names its agent by the token only
        return [Check("loop", None, f"loop {loop}: the observer token names the agent")]
    problems, warnings = loop_problems(where, options.get("store"), loop, agent)
    if problems:
        return [Check("store", None if remote else False, problems[0], _fix(problems[0]))]
    checks = [Check("store", True, f"the store opens; loop {loop} admits agent {agent}")]
    return checks + [Check("observe", None, w) for w in warnings]


def _fix(problem: str) -> str:
    if "no loop" in problem or "does not admit" in problem:
        return "open the loop (loopwarden loop open) or run hook install with the right names"
    return "check --home / --store in the hook command (loopwarden hook install again)"


def probe(url: str, token: str) -> tuple[int, str]:
    """POST an empty event with `token` to a hook URL: the server checks the token and then
    answers that the event is not one (nothing is sealed). (status, body)."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname or "", parts.port, timeout=PROBE_SECONDS)
    try:
        connection.request(
            "POST",
            f"{parts.path}?{parts.query}",
            body=b"{}",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def _token_check(host: Host, found: Installed) -> Check | None:
    """For an http set-up, whether the server takes the observer token (None otherwise)."""
    server = found.options.get("server")
    if not server:
        return None
    token = os.environ.get(TOKEN_VARIABLE, "")
    fix = f"loopwarden token create --agent AGENT --role observer; export {TOKEN_VARIABLE}"
    if not token:
        return Check("token", False, f"${TOKEN_VARIABLE} is not set here", fix)
    query = urlencode([("loop", found.options.get("loop") or "")])
    try:
        status, body = probe(f"{server.rstrip('/')}/hooks/{host.name}?{query}", token)
    except OSError as exc:
        return Check("server", False, f"{server} cannot be reached ({exc})", "start serve --http")
    if status == 200 and "'hook_event_name'" in body:
        return Check("token", True, f"{server} takes the observer token")
    return Check("token", False, f"{server} refuses the token: {body[:200]}", fix)


def _local_check(found: Installed) -> Check | None:
    """For the default command set-up, whether its home's local hook server answers, or, if
    none runs, starts and answers (then it is stopped again: the first hook starts it). None
    for other set-ups."""
    options = found.options
    if found.command is None or options.get("server") or options.get("in_process"):
        return None
    from loopwarden.clients import hook_local

    words = shlex.split(found.command)
    place = hook_local.place_of(options)
    command = [*words[: words.index("hook")], "hook", "server", "--home", place.home]
    command += ["--store", place.store] if place.store else []
    see = (
        f"see {place.log_in_home} in the home ({place.home}); `loopwarden hook stop --home "
        f"{place.home}`, then run the doctor again"
    )
    try:
        answer = hook_local.ask(place, "ping")
        started = False
        if answer is None:
            why = hook_local.start(place, command)
            if why is not None:
                detail = f"the local hook server cannot be started ({why}): every hook is blocked"
                return Check("server", False, detail, see)
            answer, started = hook_local.ask(place, "ping"), True
        if answer is None:
            raise OSError("it stopped as it started")
        if started:
            hook_local.ask(place, "stop")
    except (OSError, ValueError) as exc:
        return Check("server", False, f"the local hook server does not answer ({exc})", see)
    pid, _, version = answer.partition(" ")
    how = "started, answered and was stopped again" if started else f"runs (pid {pid}) and answers"
    return Check("server", True, f"the local hook server (loopwarden {version}) {how}")


@dataclass(frozen=True)
class Where:
    """Where to look: the settings file's place."""

    place: Place
    settings: Path


def _names_check(host: Host, where: Where, found: Installed, home: Path | None) -> Check:
    """loopwarden's own tools pass under every server name the host runs it by: a name the
    hooks do not know would have each of its tools (claim included) refused."""
    lets = list(found.options.get("server_name") or ["loopwarden"])
    hook_home = Path(found.options["home"]) if found.options.get("home") else home
    runs = [f.name for f in loopwarden_servers(host.mcp_files, where.place, read_file, hook_home)]
    missing = [name for name in runs if name not in lets]
    if missing:
        flags = " ".join(f"--server-name {name}" for name in dict.fromkeys([*lets, *missing]))
        return Check(
            "names",
            False,
            f"the host runs loopwarden's server as {', '.join(missing)}, but the hooks let its "
            f"own tools through only as {', '.join(lets)}: claim and update would be refused",
            f"loopwarden hook install {host.name} --loop LOOP --agent AGENT {flags}",
        )
    if not runs:
        return Check("names", None, f"no MCP server of {host.title} runs `loopwarden serve` "
                     f"for this home; the hooks expect the name(s) {', '.join(lets)}")  # fmt: skip
    return Check("names", True, f"loopwarden's own tools pass as {', '.join(lets)}")


def checks(host: Host, where: Where, home: Path | None) -> list[Check]:
    """Every check of an installed set-up, in order; the later ones only once it is found."""
    settings, found = _settings_check(host, where.settings)
    trust = host.trust(where.place, read_file)
    done = [settings, Check("trust", trust.trusted, trust.detail, trust.fix)]
    if settings.ok is False and not found.events:
        return done
    done.append(_names_check(host, where, found, home))
    command = _command_check(found)
    done.append(command)
    stores = _store_checks(found, home)
    done += stores
    runs = command.ok is not False and all(c.ok is not False for c in stores)
    local = _local_check(found) if runs else None
    token = _token_check(host, found)
    return done + [c for c in (local, token) if c is not None]


def doctor(
    host: Annotated[str, typer.Argument(help=f"One of: {', '.join(hosts.NAMES)}.")],
    scope: Annotated[str, typer.Option("--scope", help="project or user.")] = "project",
    project: Annotated[
        Path | None, typer.Option("--project", help="The project directory (default: cwd).")
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option("--home", help="For http set-ups: this machine's data home, if any."),
    ] = None,
    json_out: Json = False,
) -> None:
    """Check an installed hook set-up end to end.

    Settings present for every event, the host's trust, the hook command on PATH, the store
    opening, the loop and agent in it, the local hook server answering, and for --http set-ups
    the server taking $LOOPWARDEN_OBSERVER_TOKEN (no receipt is sealed). Exit 0 when every check passed, 1 when
    one failed (each says what to do), 2 on a usage error.
    """
    if host not in hosts.NAMES:
        message = f"unknown host {host!r}{close_to(host, list(hosts.NAMES))}"
        fail(f"{message}; use one of {', '.join(hosts.NAMES)}", EXIT_USAGE, as_json=json_out)
    if scope not in ("project", "user"):
        fail("--scope is project or user", EXIT_USAGE, as_json=json_out)
    known = hosts.get(host)
    place = place_of(scope, project)
    where = Where(place, settings_path(host, scope, place.project, place.user_home))
    found = checks(known, where, home)
    failed = any(c.ok is False for c in found)
    if json_out:
        render.emit_json({"host": host, "ok": not failed, "checks": [c.__dict__ for c in found]})
    else:
        marks = {
            True: "[green]ok[/green]  ",
            False: "[red]FAIL[/red]",
            None: "[yellow]note[/yellow]",
        }
        for c in found:
            render.console.print(f"{marks[c.ok]} {c.name}: {render.safe(c.detail)}")
            if c.fix and c.ok is not True:
                render.console.print(f"      to fix: {render.safe(c.fix)}")
    raise typer.Exit(EXIT_REFUSED if failed else EXIT_OK)
