"""The servers file: the downstream MCP servers an operator puts behind the gateway.

The shape is the one clients keep (Claude Desktop's `claude_desktop_config.json`, Claude
Code's `.mcp.json`): `mcpServers` maps a name to `command`/`args`/`env`/`cwd` (stdio) or
`url`/`headers` (streamable HTTP, `"type": "http"`), so such a file can be pointed at as it is
or imported (`loopwarden gateway import`). A `gateway` object holds loopwarden's own settings:

    {"mcpServers": {"fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]},
                    "tickets": {"type": "http", "url": "https://tickets.internal/mcp",
                                "headers": {"Authorization": "Bearer ${TICKETS_TOKEN}"}}},
     "gateway": {"loop": "release", "call_timeout_seconds": 60, "pins": "servers.pins.json"}}

Secrets are references, resolved in the gateway's process when a server starts and never
written anywhere: `${NAME}` (an environment variable of the gateway), `${NAME:-default}`, and
`${file:/run/secrets/token}` (a file's content, its trailing newline dropped). A reference that
cannot be resolved makes that server unavailable with an error naming the reference, never an
empty value. An entry that is loopwarden itself (a client config that also launches it), is
`disabled`, uses the old SSE transport or has a name the gateway cannot namespace is skipped,
and `gateway check` says why.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loopwarden.errors import InvalidInput, LoopwardenError, clip, describe_validation
from loopwarden.kernel.state.events import ID_PATTERN

MAX_FILE = 4 * 1024 * 1024
MAX_SERVERS = 200
SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_)){0,47}$")
"""A downstream's name: its tools are `<name>__<tool>` to the agent and `mcp.<name>.<tool>` to
the policy, so no double underscore, and it does not end with one."""
REFERENCE = re.compile(r"\$\{([^}]{1,300})\}")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
KNOWN_KEYS = frozenset(
    {"type", "command", "args", "env", "cwd", "url", "headers", "disabled", "timeout"}
)


class ServersFileError(InvalidInput):
    """The servers file cannot be read or is not a servers file."""


class SecretUnavailable(LoopwardenError, code="secret_unavailable"):
    """A secret reference of a server's entry cannot be resolved (the message names the
    reference, never a value)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerOptions(_Strict):
    """The gateway's settings for one server (in `gateway.servers.<name>`)."""

    call_timeout_seconds: float | None = Field(default=None, gt=0, le=3600)
    start_timeout_seconds: float | None = Field(default=None, gt=0, le=600)


class GatewaySettings(_Strict):
    """The servers file's `gateway` object."""

    loop: str | None = Field(default=None, pattern=ID_PATTERN, description="The loop served.")
    call_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    start_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    list_ttl_seconds: float = Field(
        default=60.0, ge=0, le=86400, description="How long a downstream's tool list is reused."
    )
    pins: str | None = Field(default=None, description="The pins file (beside this file).")
    servers: dict[str, ServerOptions] = Field(default_factory=dict)


@dataclass(frozen=True)
class StdioSpec:
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True)
class HttpSpec:
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Server:
    """One downstream server as declared: references unresolved (`resolved()` resolves them)."""

    name: str
    transport: Literal["stdio", "http"]
    spec: StdioSpec | HttpSpec
    call_timeout_seconds: float
    start_timeout_seconds: float
    ignored: tuple[str, ...] = ()  # keys of the entry the gateway does not use

    def resolved(self, environ: Mapping[str, str] | None = None) -> StdioSpec | HttpSpec:
        """The spec with every `${…}` reference resolved; `SecretUnavailable` if one cannot be."""
        env = os.environ if environ is None else environ
        spec = self.spec
        if isinstance(spec, StdioSpec):
            return StdioSpec(
                command=resolve(spec.command, env, self.name),
                args=tuple(resolve(a, env, self.name) for a in spec.args),
                env={k: resolve(v, env, self.name) for k, v in spec.env.items()},
                cwd=resolve(spec.cwd, env, self.name) if spec.cwd else None,
            )
        return HttpSpec(
            url=resolve(spec.url, env, self.name),
            headers={k: resolve(v, env, self.name) for k, v in spec.headers.items()},
        )

    @property
    def where(self) -> str:
        """What the server is, for status lines: its program or its URL's origin, no secret."""
        spec = self.spec
        if isinstance(spec, StdioSpec):
            return f"stdio: {Path(spec.command).name}"
        match = re.match(r"^(https?://[^/?#@]*@)?(https?://)?([^/?#]*)", spec.url)
        origin = match.group(3) if match else ""
        scheme = "https" if spec.url.startswith("https") else "http"
        return f"http: {scheme}://{origin.split('@')[-1]}" if origin else "http"


@dataclass(frozen=True)
class ServersFile:
    path: Path
    servers: dict[str, Server]
    settings: GatewaySettings
    skipped: tuple[tuple[str, str], ...] = ()  # (name, why) of entries not served

    @property
    def pins_path(self) -> Path:
        """Where pins are kept: `gateway.pins` (relative to this file), else
        `<this file's stem>.pins.json` beside it."""
        if self.settings.pins:
            pins = Path(self.settings.pins).expanduser()
            return pins if pins.is_absolute() else self.path.parent / pins
        return self.path.with_name(f"{self.path.stem}.pins.json")


def resolve(text: str, env: Mapping[str, str], server: str) -> str:
    """`text` with its `${…}` references resolved (module docstring)."""

    def one(match: re.Match[str]) -> str:
        ref = match.group(1)
        if ref.startswith("file:"):
            path = Path(ref[5:]).expanduser()
            try:
                return path.read_text().removesuffix("\n").removesuffix("\r")
            except (OSError, UnicodeDecodeError):
                raise SecretUnavailable(
                    f"server {server!r}: the secret file of ${{file:…}} cannot be read "
                    f"({clip(str(path))})"
                ) from None
        name, _, default = ref.partition(":-")
        if not ENV_NAME.fullmatch(name):
            raise SecretUnavailable(
                f"server {server!r}: {clip(repr('${' + ref + '}'))} is no reference"
            )
        value = env.get(name)
        if value is None:
            if ":-" in ref:
                return default
            raise SecretUnavailable(
                f"server {server!r}: the environment variable {name} is not set"
            )
        return value

    return REFERENCE.sub(one, text)


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} is a list of strings")
    return tuple(value)


def _string_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{what} maps names to strings")
    return dict(value)


def is_loopwarden(entry: Mapping[str, Any]) -> bool:
    """Whether a client's server entry launches loopwarden itself (not served: a gateway in
    front of itself would call itself)."""
    command = entry.get("command")
    if not isinstance(command, str):
        return False
    words = [Path(command).name, *(a for a in entry.get("args") or () if isinstance(a, str))]
    return any(Path(w).name in ("loopwarden", "loopwarden.exe") for w in words[:3]) and (
        "serve" in words or Path(command).name.startswith("loopwarden")
    )


def _server(name: str, entry: Any, settings: GatewaySettings) -> Server | str:
    """One entry as a `Server`, or why it is skipped."""
    if not SERVER_NAME_RE.fullmatch(name):
        return "its name is not 1-48 letters, digits, '-' and single '_' (the gateway names its tools <name>__<tool>)"
    if not isinstance(entry, dict):
        return "its entry is not an object"
    if entry.get("disabled") is True:
        return "it is disabled"
    if is_loopwarden(entry):
        return "it is loopwarden itself"
    kind = entry.get("type")
    if kind is None:
        kind = "http" if "url" in entry and "command" not in entry else "stdio"
    options = settings.servers.get(name, ServerOptions())
    timeouts = {
        "call_timeout_seconds": options.call_timeout_seconds or settings.call_timeout_seconds,
        "start_timeout_seconds": options.start_timeout_seconds or settings.start_timeout_seconds,
    }
    ignored = tuple(sorted(k for k in entry if k not in KNOWN_KEYS))
    try:
        if kind == "stdio":
            command = entry.get("command")
            if not isinstance(command, str) or not command:
                return "a stdio server needs a command"
            spec: StdioSpec | HttpSpec = StdioSpec(
                command=command,
                args=_strings(entry.get("args", []), "args"),
                env=_string_map(entry.get("env", {}), "env"),
                cwd=entry["cwd"] if isinstance(entry.get("cwd"), str) else None,
            )
            return Server(name, "stdio", spec, ignored=ignored, **timeouts)
        if kind in ("http", "streamable-http", "streamableHttp"):
            url = entry.get("url")
            if not isinstance(url, str) or not url.startswith(("http://", "https://", "${")):
                return "an http server needs an http(s) url"
            spec = HttpSpec(url=url, headers=_string_map(entry.get("headers", {}), "headers"))
            return Server(name, "http", spec, ignored=ignored, **timeouts)
    except ValueError as exc:
        return str(exc)
    if kind == "sse":
        return "it uses the SSE transport, which the gateway does not speak (use streamable HTTP)"
    return f"its type {clip(repr(kind))} is not stdio or http"


def parse_servers(text: str, path: Path) -> ServersFile:
    """A servers file from its text; `ServersFileError` saying what is wrong with it."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ServersFileError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers"), dict):
        raise ServersFileError(f"{path}: no mcpServers object (the shape MCP clients keep)")
    try:
        settings = GatewaySettings.model_validate(document.get("gateway") or {})
    except ValidationError as exc:
        raise ServersFileError(f"{path}: gateway: {describe_validation(exc)}") from None
    entries = document["mcpServers"]
    if len(entries) > MAX_SERVERS:
        raise ServersFileError(f"{path}: more than {MAX_SERVERS} servers")
    unknown = sorted(set(settings.servers) - set(entries))
    if unknown:
        raise ServersFileError(f"{path}: gateway.servers names no server {unknown[0]!r}")
    servers, skipped = {}, []
    for name, entry in entries.items():
        made = _server(str(name), entry, settings)
        if isinstance(made, Server):
            servers[made.name] = made
        else:
            skipped.append((str(name), made))
    return ServersFile(path, servers, settings, tuple(skipped))


def load_servers(path: Path) -> ServersFile:
    """The servers file at `path` (`ServersFileError` if it cannot be read or parsed)."""
    try:
        if path.stat().st_size > MAX_FILE:
            raise ServersFileError(f"{path}: larger than {MAX_FILE} bytes")
        text = path.read_text()
    except OSError as exc:
        raise ServersFileError(f"cannot read the servers file {path}: {exc.strerror}") from None
    return parse_servers(text, path.resolve())


# --- import ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Imported:
    document: dict[str, Any]
    moved: tuple[str, ...]  # secret files written (`server.NAME`), values never shown
    skipped: tuple[tuple[str, str], ...]


def import_config(source: Path, secrets_dir: Path) -> Imported:
    """A servers file made from a client's config: its servers (loopwarden itself, disabled and
    unusable entries left out), every literal env value and header value moved to a file of its
    own in `secrets_dir` (0600, the directory 0700) and replaced by a `${file:…}` reference."""
    parsed = load_servers(source)
    document = json.loads(source.read_text())
    out: dict[str, Any] = {}
    moved: list[str] = []
    for name in parsed.servers:
        entry = {k: v for k, v in document["mcpServers"][name].items() if k in KNOWN_KEYS}
        entry.pop("disabled", None)
        for key in ("env", "headers"):
            values = entry.get(key)
            if not isinstance(values, dict):
                continue
            kept = {}
            for var, value in values.items():
                if REFERENCE.fullmatch(value) or not value:
                    kept[var] = value
                    continue
                secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{name}.{var}")
                target = secrets_dir / safe
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as secret:
                    secret.write(value)
                kept[var] = "${file:" + str(target) + "}"
                moved.append(safe)
            entry[key] = kept
        out[name] = entry
    return Imported({"mcpServers": out, "gateway": {}}, tuple(moved), parsed.skipped)
