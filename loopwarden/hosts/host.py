"""What an agent host is: the `Host` each host module declares, and the parts hosts share.

A host's hooks send events (JSON on stdin, or an HTTP body) and read answers (stdout and the
exit code, or an HTTP response). A `Host` declares its events once (`events`: each one's phase
and the hook installed for it), reads one event into the host-neutral `Event` (`read`), writes
one answer (`reply`: a decision; `failure`: what a hook that could not decide says, which blocks
before a tool runs), maps a reply onto HTTP (`http`), merges its hook entries into its settings
file (`install`) and tells whether it trusts them (`trust`). It decides nothing: the `hook`
operation does.

Its data is read by the policy layer and the judge: the default tool-name table (`names`), the
tools that carry a shell command line and where (`shell`), the host-internal tools
(`internal`). Nothing here does I/O (`trust` is handed the files it asks for) or imports more
than the standard library and the base modules, so the forwarder (standard library only) can
load a host to answer a failure in that host's blocking form.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from loopwarden.errors import InvalidInput

Phase = Literal["session", "pre", "post", "stop"]

MAX_EVENT = 32 * 1024 * 1024  # bytes of one event (a Write of a large file carries it whole)
MAX_ID = 200  # characters kept of a host's ids (session, subagent)


class MalformedEvent(InvalidInput):
    """An event this host does not send (or one loopwarden cannot read): answered fail-closed."""


@dataclass(frozen=True)
class Event:
    """One hook event in the host-neutral form the `hook` operation takes. `agent_id` and
    `agent_type` name the subagent that made a tool call, on hosts that say so."""

    phase: Phase
    session_id: str
    tool_use_id: str | None = None
    host_tool: str | None = None
    input_digest: str | None = None
    command: str | None = None
    shell: str = "bash"  # the language of `command`: "bash" or "powershell"
    response_digest: str | None = None
    errored: bool = False
    duration_ms: float | None = None
    stop_active: bool = False
    agent_id: str | None = None
    agent_type: str | None = None
    arguments: dict[str, Any] | None = None  # an MCP tool's input, for argument rules


@dataclass(frozen=True)
class Reply:
    """What the hook process prints on stdout and stderr, and its exit code (the HTTP hook
    returns `stdout` as its body)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


@dataclass(frozen=True)
class Hook:
    """How an installed hook calls loopwarden: the command line, or for a host with `http`
    hooks of its own, the URL to post to and the variable holding the observer token."""

    command: str
    url: str | None = None
    token_variable: str = "LOOPWARDEN_OBSERVER_TOKEN"


@dataclass(frozen=True)
class Place:
    """Where hooks are installed: the scope, the project directory, the user's home directory
    and the environment (the installer's: the host's own may differ)."""

    scope: Literal["project", "user"]
    project: Path
    user_home: Path
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class On:
    """One hook event a host sends: the phase loopwarden reads it as, and the hook the installer
    adds for it (the event's matcher if it has one, the timeout in seconds, the host's other
    settings for it), or none (`installed=False`: read if a person installs it)."""

    phase: Phase
    matcher: str | None = None
    timeout: int = 30
    extra: Mapping[str, Any] = field(default_factory=dict)
    installed: bool = True


@dataclass(frozen=True)
class McpFile:
    """Where a host keeps MCP servers: a file of the project (`scope="project"`) or of the
    user's home, JSON or TOML, the servers under the key `table`; `per_project`: under
    `projects[<absolute project path>]` too (Claude Code's local scope in `~/.claude.json`)."""

    scope: Literal["project", "user"]
    path: str
    table: str = "mcpServers"
    toml: bool = False
    per_project: bool = False


Files = Callable[[Path], str | None]
"""Reads a file for `Host.trust`: its text, or None if there is none."""


@dataclass(frozen=True)
class Trust:
    """Whether the host will run hooks installed at a place: True, False, or None when
    loopwarden cannot tell; `detail` says why, `fix` what to do when it is not True."""

    trusted: bool | None
    detail: str
    fix: str = ""


def json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    """sha256 of the RFC 8785 bytes of a JSON value (an input or a response); a value JCS
    cannot represent is digested as its JSON text."""
    # Imported here: the forwarder loads hosts to answer failures and never digests.
    from loopwarden.canonical import digest_of
    from loopwarden.errors import SealError

    try:
        return digest_of(value)
    except SealError:
        return digest_of(json.dumps(value, sort_keys=True, default=str))


def field_of(event: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """`event[name]`, which must be of `kind`; `MalformedEvent` if it is missing or not."""
    value = event.get(name)
    if not isinstance(value, kind):
        raise MalformedEvent(
            f"the event's {name!r} is missing or not a {getattr(kind, '__name__', kind)}"
        )
    return value


def session_of(event: Mapping[str, Any]) -> str:
    session = field_of(event, "session_id", str)
    if not session:
        raise MalformedEvent("the event's 'session_id' is empty")
    return str(session)[:MAX_ID]


def optional_id(event: Mapping[str, Any], name: str) -> str | None:
    """A host id the event may carry (`agent_id`, `tool_use_id`), cut to `MAX_ID`; None if it
    is absent, empty or not a string."""
    value = event.get(name)
    return value[:MAX_ID] if isinstance(value, str) and value else None


def duration_of(event: Mapping[str, Any], name: str) -> float | None:
    """The event's `name` (a call's duration in milliseconds) as a float, None if it is not a
    number."""
    value = event.get(name)
    return float(value) if isinstance(value, int | float) else None


def argv_line(argv: list[str]) -> str:
    """An argv quoted back into the line that runs it: the command reader reads `bash -lc
    SCRIPT` (how Codex runs commands) as bash does, any flag cluster, any shell."""
    return shlex.join(argv)


def hook_entry_is_ours(entry: Any, host: str) -> bool:
    """Whether one hook entry in a settings file is loopwarden's for `host`: a command running
    `loopwarden … hook HOST`, or an `http` hook posting to `/hooks/HOST`."""
    if not isinstance(entry, dict):
        return False
    command = str(entry.get("command", ""))
    url = str(entry.get("url", ""))
    return (f" hook {host} " in f" {command} " and "loopwarden" in command) or (
        f"/hooks/{host}" in url
    )


class Host:
    """One agent host. A host module subclasses this, fills in the class attributes,
    `outcome`, `blocking_failure` and `reply`, overrides what its host does differently, and
    exports `HOST`."""

    name: ClassVar[str]  # as the CLI, the receipts and `[observe.names.<name>]` spell it
    title: ClassVar[str]  # as people call it
    events: ClassVar[Mapping[str, On]]  # the hook events loopwarden handles, in install order
    ids: ClassVar[tuple[str, ...]] = ("tool_use_id",)  # the ids its tool events carry
    names: ClassVar[Mapping[str, str]]  # host tool → policy name (documented in docs/hooks.md)
    shell: ClassVar[Mapping[str, str]]  # shell tools → the key of `tool_input` with the line
    dialects: ClassVar[Mapping[str, str]] = {}  # shell tools whose line is not bash → language
    internal: ClassVar[frozenset[str]] = frozenset()  # host tools acting on nothing outside it
    settings_file: ClassVar[str]  # relative to the project (project scope) or the user's home
    mcp_files: ClassVar[tuple[McpFile, ...]] = ()  # where it keeps MCP servers (`servers.py`)
    http_hooks: ClassVar[bool] = False  # it can post events itself (else: a command forwards)

    @property
    def subagents(self) -> bool:
        """Whether its events name the subagent that made a call (`agent_id`, `agent_type`)."""
        return "agent_id" in self.ids

    @property
    def pre_events(self) -> frozenset[str]:
        """The events that guard a tool call (a failure to answer one blocks the call)."""
        return frozenset(name for name, on in self.events.items() if on.phase == "pre")

    def phase_of(self, event: Any) -> Phase | None:
        """The phase of an event read as JSON, or None if it is not one this host sends."""
        name = event.get("hook_event_name") if isinstance(event, dict) else None
        on = self.events.get(name) if isinstance(name, str) else None
        return on.phase if on is not None else None

    def read(self, event: dict[str, Any]) -> Event:
        """The host's event (a JSON object) as an `Event`; `MalformedEvent` if it is not one: a
        session start or a stop read whole (`opening`), a tool call by `tool_event`."""
        phase, session, whole = self.opening(event)
        return whole if whole is not None else self.tool_event(event, phase, session)

    def opening(self, event: dict[str, Any]) -> tuple[Phase, str, Event | None]:
        """The event's phase and session, and the whole `Event` for a session start or a stop
        (`stop_hook_active` says the host blocked this stop once), which hosts read alike;
        `MalformedEvent` for an event this host does not send."""
        name = field_of(event, "hook_event_name", str)
        session = session_of(event)
        on = self.events.get(name)
        if on is None:
            raise MalformedEvent(f"loopwarden does not handle {name!r} events")
        phase = on.phase
        if phase == "session":
            return phase, session, Event("session", session)
        if phase == "stop":
            active = bool(event.get("stop_hook_active"))
            return phase, session, Event("stop", session, stop_active=active)
        return phase, session, None

    def tool_event(self, event: dict[str, Any], phase: Phase, session: str) -> Event:
        """A tool call's `Event`, before it runs or after (with what came of it: `outcome`):
        the fields hosts read alike, and the ids the host's events carry (`ids`)."""
        common = {
            **self.tool_fields(event, session, self.tool_name(event)),
            **{name: optional_id(event, name) for name in self.ids},
        }
        if phase == "pre":
            return Event("pre", **common)
        return Event("post", **common, **self.outcome(event))

    def tool_name(self, event: dict[str, Any]) -> str:
        """The host's name of the tool called: the event's `tool_name`."""
        return str(field_of(event, "tool_name", str))

    def outcome(self, event: dict[str, Any]) -> dict[str, Any]:
        """The `Event` fields of what a tool call came to (`response_digest`, `errored`,
        `duration_ms`), read from the event after it."""
        raise NotImplementedError

    def tool_fields(self, event: dict[str, Any], session: str, tool: str) -> dict[str, Any]:
        """The `Event` fields of a call of `tool` that hosts read alike: the session, the tool,
        the digest of its `tool_input`, and the command line a shell tool carries with that
        line's language."""
        tool_input = event.get("tool_input", {})
        mcp = tool.startswith("mcp__") and isinstance(tool_input, dict)
        return {
            "session_id": session,
            "host_tool": tool,
            "input_digest": digest(tool_input),
            "command": self.shell_line(tool, tool_input),
            "shell": self.dialects.get(tool, "bash"),
            # what argument rules judge (`[[tools.arguments]]`), never stored: MCP tools only
            "arguments": tool_input if mcp else None,
        }

    def shell_line(self, tool: str, tool_input: Any) -> str | None:
        """The command line a shell tool's input carries (a string, or an argv list as one
        line), or None for a tool that is no shell tool or an input without one."""
        key = self.shell.get(tool)
        if key is None or not isinstance(tool_input, dict):
            return None
        value = tool_input.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return argv_line(value)
        return None

    def reply(self, phase: Phase, block: bool, message: str) -> Reply:
        """The answer to a decided event: `block` the call (or the stop), saying `message`."""
        raise NotImplementedError

    def failure(self, phase: Phase | None, message: str) -> Reply:
        """The answer when no decision could be made: a block before a tool runs (and when the
        phase is unknown: `blocking_failure`), otherwise exit 1 with the reason on stderr, which
        reports without blocking (a stop blocked on every failure could never end)."""
        if phase in (None, "pre"):
            return self.blocking_failure(message)
        return Reply(stderr=f"loopwarden: {message}\n", exit_code=1)

    def blocking_failure(self, message: str) -> Reply:
        """The answer that blocks a tool call no decision could be made for."""
        raise NotImplementedError

    def http(self, reply: Reply) -> tuple[int, str]:
        """`reply` as an HTTP status and body, for hooks posted by a bridge (the forwarder, or
        `curl`) that turns them back into stdout and an exit code: 200 with stdout, 200 with
        the deny document of a blocking failure, 500 with stderr for any other failure."""
        if reply.exit_code in (0, 2):
            return 200, reply.stdout
        return 500, reply.stderr

    def hooks(self, hook: Hook) -> dict[str, Any]:
        """Per event loopwarden installs (`On.installed`), the one entry (matcher group) it
        installs."""
        return {
            name: self.group(hook, name, on) for name, on in self.events.items() if on.installed
        }

    def group(self, hook: Hook, name: str, on: On) -> dict[str, Any]:
        """The matcher group of one event: its matcher if it has one, and loopwarden's hook."""
        matcher = {"matcher": on.matcher} if on.matcher else {}
        return {**matcher, "hooks": [self.entry(hook, name, on)]}

    def entry(self, hook: Hook, name: str, on: On) -> dict[str, Any]:
        """Loopwarden's hook for one event: an `http` hook where the host posts events itself
        and a URL is given, else a command; then the event's timeout and other settings."""
        settings = {"timeout": on.timeout, **on.extra}
        if hook.url is not None and self.http_hooks:
            return {
                "type": "http",
                "url": hook.url,
                "headers": {"Authorization": f"Bearer ${hook.token_variable}"},
                "allowedEnvVars": [hook.token_variable],
                **settings,
            }
        return {"type": "command", "command": hook.command, **settings}

    def install(self, settings: dict[str, Any], hook: Hook) -> dict[str, Any]:
        """`settings` (a copy of a settings file's JSON object, its `hooks` an object) with
        loopwarden's hooks in place: in each event, loopwarden's earlier hooks taken out (and
        groups left empty by that dropped), then loopwarden's group appended; every other hook
        kept as it was."""
        hooks = settings.setdefault("hooks", {})
        for event, group in self.hooks(hook).items():
            kept = []
            existing = hooks.get(event)
            for entry in existing if isinstance(existing, list) else []:
                if isinstance(entry, dict) and isinstance(entry.get("hooks"), list):
                    inner = [h for h in entry["hooks"] if not hook_entry_is_ours(h, self.name)]
                    if not inner:
                        continue
                    entry = {**entry, "hooks": inner}
                kept.append(entry)
            hooks[event] = [*kept, group]
        return settings

    def trust(self, place: Place, files: Files) -> Trust:
        """Whether this host runs hooks installed at `place` (the default: it has no trust
        state of its own that gates them)."""
        return Trust(True, f"{self.title} has no trust setting that gates its hooks")
