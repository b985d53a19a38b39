"""Who an OAuth authorization server says a caller is: the resource server's configuration.

`serve --http --oauth-issuer URL --resource URL` (or `--oauth-config FILE`, a TOML file with an
`[oauth]` table of the same keys, flags winning) makes loopwarden an OAuth 2.1 resource server
beside its static tokens: access tokens are JWTs from `issuer`, for the audience `resource` (this
server's `/mcp` URL), whose scopes name one loopwarden role and whose `identity_claim` names the
principal. Identity comes from the verified token only, never from a tool argument. The
dashboard's operators may sign in through the same issuer (OIDC, authorization code + PKCE) when
`dashboard_client_id` is set. No I/O here beyond reading the file, and no SDK import.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from loopwarden.errors import InvalidInput
from loopwarden.principals import PRINCIPAL_ID_PATTERN, ROLES, Role

DEFAULT_SCOPES: dict[Role, str] = {role: f"loopwarden:{role}" for role in ROLES}
DEFAULT_ALGORITHMS = ("RS256", "PS256", "ES256", "EdDSA")
CLIENT_SECRET_ENV = "LOOPWARDEN_OIDC_CLIENT_SECRET"  # the dashboard client's secret, if any
LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def checked_url(url: str, what: str) -> str:
    """`url`, unchanged (an issuer identifier and an audience compare as exact strings), if it
    is an absolute https URL (http only on loopback) with no query or fragment; `ValueError`
    naming `what` otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an absolute http(s) URL (got {url!r})")
    if parts.scheme == "http" and parts.hostname not in LOOPBACK:
        raise ValueError(f"{what} must use https unless it is on loopback (got {url!r})")
    if parts.query or parts.fragment:
        raise ValueError(f"{what} must have no query or fragment (got {url!r})")
    return url


Url = Annotated[str, Field(min_length=8, max_length=2000)]


class OAuthSettings(BaseModel):
    """The resource server's OAuth configuration (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: Url = Field(description="The authorization server's issuer identifier.")
    resource: Url = Field(description="This server's /mcp URL: the audience its tokens carry.")
    identity_claim: str = Field(default="sub", pattern=r"^[A-Za-z0-9_.:/-]{1,64}$")
    scopes: dict[Role, str] = Field(default_factory=lambda: dict(DEFAULT_SCOPES))
    agents: list[Annotated[str, Field(pattern=PRINCIPAL_ID_PATTERN)]] | None = Field(
        default=None, description="The principals tokens may name; unset: any valid id."
    )
    jwks_uri: Url | None = Field(default=None, description="Else from the issuer's metadata.")
    algorithms: list[str] = Field(default_factory=lambda: list(DEFAULT_ALGORITHMS), min_length=1)
    leeway_seconds: int = Field(default=30, ge=0, le=300)
    jwks_cache_seconds: float = Field(default=300.0, gt=0, le=86_400)
    jwks_stale_seconds: float = Field(
        default=900.0,
        ge=0,
        le=86_400,
        description="How long past the cache's life the last good keys answer while the "
        "issuer's key set cannot be fetched; then JWTs are refused.",
    )
    dashboard_client_id: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("issuer", "resource", "jwks_uri")
    @classmethod
    def _url(cls, value: str | None, info: object) -> str | None:
        name = getattr(info, "field_name", "url")
        return None if value is None else checked_url(value, name)

    @field_validator("algorithms")
    @classmethod
    def _algorithms(cls, value: list[str]) -> list[str]:
        if "none" in {a.lower() for a in value} or any(a.startswith("HS") for a in value):
            raise ValueError("algorithms must be asymmetric (no 'none', no HS*)")
        return value

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: dict[Role, str]) -> dict[Role, str]:
        if len(set(value.values())) != len(value):
            raise ValueError("each role needs a scope of its own")
        for scope in value.values():
            if not re.fullmatch(r"[!#-\[\]-~]{1,128}", scope):
                raise ValueError(f"not a valid OAuth scope: {scope!r}")
        return value

    @property
    def client_secret(self) -> str | None:
        """The dashboard client's secret, from the environment only (never from a file)."""
        return os.environ.get(CLIENT_SECRET_ENV) or None

    def roles_for(self, granted: set[str]) -> list[Role]:
        """The roles whose scopes are among `granted` (a principal needs exactly one)."""
        return [role for role, scope in self.scopes.items() if scope in granted]


def oauth_settings(
    issuer: str | None = None, resource: str | None = None, config: str | Path | None = None
) -> OAuthSettings | None:
    """The OAuth settings `serve`'s flags ask for (None: no OAuth); `InvalidInput` naming the
    problem for a missing or bad value, an unreadable file, or an unknown key."""
    values: dict[str, object] = {}
    if config is not None:
        try:
            document = tomllib.loads(Path(config).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidInput(f"cannot read the OAuth config {config}: {exc}") from None
        table = document.get("oauth")
        if not isinstance(table, dict) or set(document) != {"oauth"}:
            raise InvalidInput(f"the OAuth config {config} must hold one [oauth] table")
        values.update(table)
    values.update({k: v for k, v in (("issuer", issuer), ("resource", resource)) if v})
    if not values:
        return None
    missing = [name for name in ("issuer", "resource") if name not in values]
    if missing:
        raise InvalidInput(
            f"OAuth needs --oauth-issuer and --resource (missing: {', '.join(missing)})"
        )
    try:
        return OAuthSettings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "oauth"
        raise InvalidInput(f"OAuth setting {where}: {first['msg']}") from None
