"""Who the server speaks for and how it listens: resolved once, from flags and environment.

The data directory and the store are resolved by `kernel/store/homes.py`, below every edge.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from loopwarden.auth.identity import OAuthSettings, checked_url
from loopwarden.errors import InvalidInput
from loopwarden.exports.targets import ExportTarget
from loopwarden.kernel.sql.backends import Synchronous
from loopwarden.kernel.sql.location import Location, parse_location
from loopwarden.kernel.store.homes import DB_NAME, resolve_home, store_source, synchronous_mode
from loopwarden.mcp_gateway.servers_file import ServersFile
from loopwarden.model_gateway.gateway_config import GatewaySettings
from loopwarden.principals import Principal, principal
from loopwarden.witnesses.witness_policy import WitnessPolicy

SERVE_ROLES = ("agent", "operator")  # an observer speaks through hooks, not tools
DEFAULT_CHECKPOINT_EVERY = 256
LOOPBACK_NAMES = {"localhost"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """A host as it appears in a URL (IPv6 addresses in brackets)."""
    return f"[{host}]" if ":" in host else host


def parse_bind(text: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`) → (host, port); `InvalidInput` if malformed."""
    match = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d{1,5})", text.strip())
    if not match or not 0 < int(match.group(2)) < 65536:
        raise InvalidInput(f"--http expects HOST:PORT, e.g. 127.0.0.1:8765 (got {text!r})")
    return match.group(1), int(match.group(2))


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold of a streamable-HTTP server (docs/reliability.md has the
    attacks each limit answers). Build with `HttpLimits.create` to validate."""

    sessions_per_principal: int = 16  # open MCP sessions per token holder (agent id and role)
    session_idle_seconds: float = 300.0  # a session with no request in flight this long closes
    connections_per_address: int = 64  # TCP connections per client IP address
    header_seconds: float = 10.0  # to send a whole request head, from connecting or last answer
    body_seconds: float = 30.0  # to send a whole request body, from the end of its head

    @staticmethod
    def create(**values: float | None) -> HttpLimits:
        """Defaults for the values left None; `InvalidInput` naming the flag for a bad one."""
        defaults = HttpLimits()
        chosen = {k: getattr(defaults, k) if v is None else v for k, v in values.items()}
        for name, value in chosen.items():
            counted = name.endswith(("_principal", "_address"))
            if not (math.isfinite(value) and 0 < value <= LIMIT_CEILINGS[name]) or (
                counted and value != int(value)
            ):
                flag = "--" + LIMIT_FLAGS[name]
                raise InvalidInput(
                    f"{flag} must be a positive {'whole number' if counted else 'number of seconds'} "
                    f"up to {LIMIT_CEILINGS[name]:g} (got {value!r})"
                )
        return HttpLimits(**chosen)  # type: ignore[arg-type]


LIMIT_FLAGS = {
    "sessions_per_principal": "max-sessions-per-principal",
    "session_idle_seconds": "session-idle-timeout",
    "connections_per_address": "max-connections-per-address",
    "header_seconds": "header-timeout",
    "body_seconds": "body-timeout",
}
LIMIT_CEILINGS = {
    "sessions_per_principal": 10_000,
    "session_idle_seconds": 86_400,
    "connections_per_address": 100_000,
    "header_seconds": 3_600,
    "body_seconds": 3_600,
}


@dataclass(frozen=True)
class Settings:
    """Everything `serve` needs. Build with `Settings.create`."""

    home: Path
    principal: Principal | None = None  # stdio / --no-auth: every request is this principal
    http: tuple[str, int] | None = None
    auth: bool = True  # HTTP only: bearer tokens required
    allow_remote: bool = False
    allowed_hosts: tuple[str, ...] = ()  # extra Host names accepted (DNS-rebinding protection)
    synchronous: Synchronous = "full"
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    limits: HttpLimits = HttpLimits()
    store: Location | None = None  # None: the home's SQLite file
    oauth: OAuthSettings | None = None  # HTTP: JWT access tokens from an issuer, beside tokens
    public_url: str | None = None  # the dashboard as users reach it (approval links)
    approval_webhook: str | None = None  # new approvals are posted here, with their link
    otel: bool = False  # `serve --otel`: export traces even without an OTEL_* endpoint variable
    export: ExportTarget | None = None  # `--export-webhook`: the receipt stream's receiver
    witnesses: WitnessPolicy | None = None  # `--witness`: the witnesses checkpoints go to
    model: GatewaySettings | None = None  # the model gateway's (`serve --http`)
    gateway: ServersFile | None = None  # `--gateway FILE`: downstream MCP servers served too
    gateway_loop: str | None = None  # `--loop`: the loop the gateway serves (over the file's)

    @property
    def dashboard_url(self) -> str | None:
        """Where users reach the dashboard: `--public-url`, else the OAuth resource's origin,
        else the HTTP bind address; None on stdio without `--public-url`."""
        if self.public_url is not None:
            return self.public_url.rstrip("/")
        if self.oauth is not None:
            parts = urlsplit(self.oauth.resource)
            return f"{parts.scheme}://{parts.netloc}"
        if self.http is not None:
            return f"http://{url_host(self.http[0])}:{self.http[1]}"
        return None

    @property
    def db_path(self) -> Path:
        return self.home / DB_NAME

    @property
    def location(self) -> Location:
        """The store this server opens (`--store`, `LOOPWARDEN_STORE`, else the home's file)."""
        return self.store or parse_location(self.db_path)

    @staticmethod
    def create(
        *,
        home: str | Path | None = None,
        agent: str | None = None,
        role: str | None = None,
        http: str | None = None,
        no_auth: bool = False,
        allow_remote: bool = False,
        allowed_hosts: tuple[str, ...] = (),
        limits: HttpLimits | None = None,
        store: str | None = None,
        oauth: OAuthSettings | None = None,
        public_url: str | None = None,
        approval_webhook: str | None = None,
    ) -> Settings:
        """Validate a serve configuration. Identity comes from here (launch configuration),
        never from a tool argument: `--agent`/`LOOPWARDEN_AGENT`, `--role`/`LOOPWARDEN_ROLE`."""
        bind = parse_bind(http) if http else None
        if bind and not is_loopback(bind[0]) and not allow_remote:
            raise InvalidInput(
                f"refusing to listen on non-loopback address {bind[0]}; pass --allow-remote to mean it"
            )
        for name in allowed_hosts:
            if not re.fullmatch(r"[A-Za-z0-9.:\[\]-]{1,253}", name):
                raise InvalidInput(f"--allowed-host expects a host name or address (got {name!r})")
        if allowed_hosts and bind is None:
            raise InvalidInput("--allowed-host only applies to --http")
        if no_auth and bind is None:
            raise InvalidInput("--no-auth only applies to --http (stdio has no tokens)")
        if no_auth and bind is not None and not is_loopback(bind[0]):
            raise InvalidInput("--no-auth is only allowed on a loopback address")
        _check_identity(bind, no_auth, oauth, public_url, approval_webhook)
        agent = agent or os.environ.get("LOOPWARDEN_AGENT")
        chosen = role or os.environ.get("LOOPWARDEN_ROLE") or "agent"
        if chosen not in SERVE_ROLES:
            raise InvalidInput(f"role must be agent or operator (got {chosen!r})")
        who = None
        if bind is None or no_auth:
            if not agent:
                raise InvalidInput(
                    "who is this server for? pass --agent NAME (or set LOOPWARDEN_AGENT)"
                )
            who = principal(agent, chosen, SERVE_ROLES)
        synchronous = synchronous_mode()
        where = resolve_home(home)
        return Settings(
            home=where,
            store=store_source(store, where)[0],
            principal=who,
            http=bind,
            auth=bind is not None and not no_auth,
            allow_remote=allow_remote,
            allowed_hosts=tuple(allowed_hosts),
            synchronous=synchronous,
            limits=limits or HttpLimits(),
            oauth=oauth,
            public_url=public_url,
            approval_webhook=approval_webhook,
        )


def _check_identity(
    bind: tuple[str, int] | None,
    no_auth: bool,
    oauth: OAuthSettings | None,
    public_url: str | None,
    webhook: str | None,
) -> None:
    """`InvalidInput` for OAuth without authenticated HTTP, or a bad URL."""
    if oauth is not None and (bind is None or no_auth):
        raise InvalidInput(
            "OAuth (--oauth-issuer, --oauth-config) only applies to --http with tokens"
        )
    for flag, url in (("--public-url", public_url), ("--approval-webhook", webhook)):
        if url is not None:
            try:
                checked_url(url, flag)
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None


def makes_no_store(settings: Settings) -> bool:
    """Whether a server for `settings` must not make a store that is not there: one speaking
    for an agent over stdio (launched by its client with a home it was given: a mistyped home
    would give it an empty store that answers every loop `not_found`). An operator's server
    makes one (it opens the first loop), and so does one over HTTP (started before its tokens
    are minted)."""
    file = settings.location.file
    speaks_for = settings.principal.role if settings.principal is not None else None
    return (
        settings.http is None
        and speaks_for in ("agent", "observer")
        and file is not None
        and not file.exists()
    )
