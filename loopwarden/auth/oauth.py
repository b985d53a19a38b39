"""loopwarden as an OAuth 2.1 resource server, beside its static tokens (settings: `identity.py`).

- `IssuerKeys`: the authorization server's metadata (RFC 8414, else OpenID Connect discovery)
  and signing keys (JWKS), fetched over HTTP and cached: the keys are fetched again after
  `jwks_cache_seconds`, or at once (at most every `REFETCH_SECONDS`) when a token names a key id
  the cache lacks, so a key rotated in works at once and one rotated out stops at the next fetch.
- `JwtVerifier`: a JWT access token is accepted only with a valid signature by one of those keys
  (asymmetric algorithms only), `iss` = the issuer, `aud` naming this resource, not expired, not
  before its `nbf`, and an identity claim naming a valid (and, with `agents`, a known) principal;
  anything else is refused (HTTP 401). Its scopes must name exactly one loopwarden role, else
  the request is forbidden (HTTP 403, `insufficient_scope`). The JOSE work is joserfc's.
- `BearerVerifier`: `lw_…` tokens go to the store's `StoreTokenVerifier`, the rest to the JWT
  verifier: the SDK's one `TokenVerifier`.
- `BearerGate`: the answers of `/mcp` to a request without an accepted token (401) or without a
  single role (403), each with `WWW-Authenticate: Bearer resource_metadata=…, scope=…`.
- `metadata_routes`: RFC 9728 protected resource metadata at `/.well-known/oauth-protected-
  resource` + the resource's path, and at the root.

Tokens are never logged or kept: an accepted JWT is known by a digest of it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from mcp.server.auth.handlers.metadata import ProtectedResourceMetadataHandler
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from loopwarden.auth.bearer import StoreTokenVerifier
from loopwarden.auth.identity import OAuthSettings
from loopwarden.auth.tokens import TOKEN_PREFIX
from loopwarden.clock import Clock, system_clock
from loopwarden.principals import PRINCIPAL_ID_PATTERN

log = logging.getLogger("loopwarden.server")

REFETCH_SECONDS = 10.0  # the least time between two JWKS fetches for unknown key ids
FETCH_SECONDS = 10.0
MAX_DOCUMENT = 256 * 1024  # bytes of a metadata or JWKS document
MAX_TOKEN = 16 * 1024
ROOT_METADATA = "/.well-known/oauth-protected-resource"
ROLE_PREFIX = "role:"


class IssuerUnavailable(Exception):
    """The issuer's metadata or keys could not be fetched or were not valid (the reason)."""


def discovery_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata may be, in the MCP specification's order (RFC 8414 with path
    insertion, OpenID Connect with path insertion, OpenID Connect appended)."""
    parts = urlsplit(issuer)
    origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
    if not path:
        return [
            f"{origin}/.well-known/oauth-authorization-server",
            f"{origin}/.well-known/openid-configuration",
        ]
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}/.well-known/openid-configuration{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    ]


class IssuerKeys:
    """One issuer's metadata and signing keys, cached (see the module docstring)."""

    def __init__(self, settings: OAuthSettings, *, clock: Clock = system_clock) -> None:
        self.settings = settings
        self._clock = clock
        self._metadata: dict[str, Any] | None = None
        self._keys: KeySet | None = None
        self._fetched_at = float("-inf")
        self._missed_at = float("-inf")  # the last fetch made for a key id the cache lacked
        self._lock = anyio.Lock()
        self.fetches = 0  # JWKS fetches so far (the cache's cost, for tests and operators)

    def _now(self) -> float:
        return self._clock().timestamp()

    async def _get(self, url: str) -> dict[str, Any]:
        try:
            async with httpx2.AsyncClient(timeout=FETCH_SECONDS, follow_redirects=False) as http:
                response = await http.get(url, headers={"Accept": "application/json"})
        except httpx2.HTTPError as exc:
            raise IssuerUnavailable(f"{url}: {type(exc).__name__}") from None
        if response.status_code != 200 or len(response.content) > MAX_DOCUMENT:
            raise IssuerUnavailable(f"{url}: HTTP {response.status_code}")
        try:
            document = json.loads(response.content)
        except ValueError:
            raise IssuerUnavailable(f"{url}: not JSON") from None
        if not isinstance(document, dict):
            raise IssuerUnavailable(f"{url}: not a JSON object")
        return document

    async def metadata(self) -> dict[str, Any]:
        """The issuer's metadata document, whose `issuer` must be exactly the configured one."""
        if self._metadata is not None:
            return self._metadata
        problems = []
        for url in discovery_urls(self.settings.issuer):
            try:
                document = await self._get(url)
            except IssuerUnavailable as exc:
                problems.append(str(exc))
                continue
            if document.get("issuer") != self.settings.issuer:
                raise IssuerUnavailable(f"{url} names another issuer: {document.get('issuer')!r}")
            self._metadata = document
            return document
        raise IssuerUnavailable("no metadata: " + "; ".join(problems))

    async def key_set(self, kid: str | None) -> KeySet:
        """The cached keys, fetched again when stale, or when they lack `kid` (at most once
        every `REFETCH_SECONDS` for such misses, so unknown key ids cannot flood the issuer)."""
        async with self._lock:
            now = self._now()
            stale = now - self._fetched_at >= self.settings.jwks_cache_seconds
            missing = self._keys is not None and kid is not None and not _has(self._keys, kid)
            if missing and now - self._missed_at >= REFETCH_SECONDS:
                self._missed_at = now
                await self._fetch()
            elif self._keys is None or stale:
                await self._fetch()
            assert self._keys is not None
            return self._keys

    async def _fetch(self) -> None:
        uri = self.settings.jwks_uri or (await self.metadata()).get("jwks_uri")
        if not isinstance(uri, str):
            raise IssuerUnavailable("the issuer's metadata has no jwks_uri")
        document = await self._get(uri)
        try:
            keys = KeySet.import_key_set(document)  # type: ignore[arg-type]
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            raise IssuerUnavailable(f"{uri}: not a JWK set ({exc})") from None
        self._keys, self._fetched_at = keys, self._now()
        self.fetches += 1


def _has(keys: KeySet, kid: str) -> bool:
    return any(key.kid == kid for key in keys.keys)


def granted_scopes(claims: dict[str, Any]) -> set[str]:
    """A token's scopes: `scope` (space-separated, RFC 9068) or `scp` (a list)."""
    scope, scp = claims.get("scope"), claims.get("scp")
    found = set(scope.split()) if isinstance(scope, str) else set()
    if isinstance(scp, list):
        found |= {s for s in scp if isinstance(s, str)}
    return found


class JwtVerifier:
    """JWT access tokens for this resource (see the module docstring)."""

    def __init__(self, settings: OAuthSettings, *, clock: Clock = system_clock) -> None:
        self.settings = settings
        self.keys = IssuerKeys(settings, clock=clock)
        self._clock = clock

    async def claims(self, token: str, audience: str) -> dict[str, Any] | None:
        """The claims of `token` if it is a valid JWT from the issuer for `audience`, else None
        (the reason logged, never the token)."""
        if len(token) > MAX_TOKEN or token.count(".") != 2:
            return None
        try:
            header = json.loads(_b64_segment(token.split(".")[0]))
            kid = header.get("kid") if isinstance(header, dict) else None
            keys = await self.keys.key_set(kid if isinstance(kid, str) else None)
            decoded = jwt.decode(token, keys, algorithms=self.settings.algorithms)
            registry = jwt.JWTClaimsRegistry(
                now=lambda: int(self._clock().timestamp()),
                leeway=self.settings.leeway_seconds,
                iss={"essential": True, "value": self.settings.issuer},
                aud={"essential": True, "value": audience},
                exp={"essential": True},
            )
            registry.validate(decoded.claims)
        except IssuerUnavailable as exc:
            log.error("refusing a JWT: the issuer's keys are unavailable (%s)", exc)
            return None
        except (JoseError, ValueError, TypeError) as exc:
            log.info("refusing a JWT: %s", getattr(exc, "error", type(exc).__name__))
            return None
        return dict(decoded.claims)

    def identity(self, claims: dict[str, Any]) -> str | None:
        """The principal the identity claim names, if valid and (with `agents`) known."""
        value = claims.get(self.settings.identity_claim)
        if not isinstance(value, str) or not re.fullmatch(PRINCIPAL_ID_PATTERN, value):
            return None
        if self.settings.agents is not None and value not in self.settings.agents:
            return None
        return value

    async def verify_token(self, token: str) -> AccessToken | None:
        """The SDK's `TokenVerifier`: an accepted JWT → its principal (`role:…` scope only when
        its scopes name exactly one role; the gate forbids the rest), else None."""
        claims = await self.claims(token, self.settings.resource)
        who = None if claims is None else self.identity(claims)
        if claims is None or who is None:
            if claims is not None:
                log.info(
                    "refusing a JWT: its %s claim names no known principal",
                    self.settings.identity_claim,
                )
            return None
        roles = self.settings.roles_for(granted_scopes(claims))
        return AccessToken(
            token="jwt:" + hashlib.sha256(token.encode()).hexdigest()[:16],
            client_id=who,
            subject=claims.get("sub") if isinstance(claims.get("sub"), str) else None,
            scopes=[ROLE_PREFIX + roles[0]] if len(roles) == 1 else [],
            expires_at=int(claims["exp"]),
            resource=self.settings.resource,
            claims={"iss": self.settings.issuer, "roles": roles},
        )


def _b64_segment(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


class BearerVerifier:
    """Static `lw_…` tokens through the store, every other bearer token through the JWTs."""

    def __init__(self, static: StoreTokenVerifier, jwts: JwtVerifier) -> None:
        self.static = static
        self.jwts = jwts

    async def verify_token(self, token: str) -> AccessToken | None:
        if token.startswith(TOKEN_PREFIX):
            return await self.static.verify_token(token)
        return await self.jwts.verify_token(token)


def metadata_url(settings: OAuthSettings) -> str:
    return str(build_resource_metadata_url(AnyHttpUrl(settings.resource)))


def challenge(settings: OAuthSettings, error: str | None = None, description: str = "") -> str:
    """The `WWW-Authenticate` value for a 401 or 403 from `/mcp`."""
    parts = [f'resource_metadata="{metadata_url(settings)}"', f'scope="{settings.scopes["agent"]}"']
    if error is not None:
        parts = [f'error="{error}"', f'error_description="{description}"', *parts]
    return "Bearer " + ", ".join(parts)


class BearerGate:
    """ASGI middleware after authentication: `/mcp` answers 401 to a request with no accepted
    token and 403 to one whose token names no single role; other paths pass untouched."""

    def __init__(self, app: ASGIApp, settings: OAuthSettings, path: str = "/mcp") -> None:
        self.app = app
        self.settings = settings
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        user = scope.get("user")
        if not isinstance(user, AuthenticatedUser):
            sent = any(name == b"authorization" for name, _ in scope["headers"])
            error = ("invalid_token", "the access token is not valid here") if sent else None
            await _refuse(
                send,
                401,
                challenge(self.settings, *error) if error else challenge(self.settings),
                error,
            )
            return
        access = user.access_token
        if not any(s.startswith(ROLE_PREFIX) for s in access.scopes):
            roles = (access.claims or {}).get("roles") or []
            several = "more than one loopwarden role" if len(roles) > 1 else "no loopwarden role"
            description = f"the token names {several}; it needs exactly one of " + " ".join(
                self.settings.scopes.values()
            )
            error = ("insufficient_scope", description)
            await _refuse(send, 403, challenge(self.settings, *error), error)
            return
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, header: str, error: tuple[str, str] | None) -> None:
    code, description = error or ("invalid_token", "authentication required")
    body = json.dumps({"error": code, "error_description": description}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", header.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def metadata_routes(settings: OAuthSettings) -> list[Route]:
    """RFC 9728 protected resource metadata, at the path-inserted URL and at the root."""
    metadata = ProtectedResourceMetadata(
        resource=AnyHttpUrl(settings.resource),
        authorization_servers=[AnyHttpUrl(settings.issuer)],
        scopes_supported=[settings.scopes["agent"]],
        resource_name="loopwarden",
    )
    endpoint = cors_middleware(
        ProtectedResourceMetadataHandler(metadata).handle, ["GET", "OPTIONS"]
    )
    paths = dict.fromkeys([urlsplit(metadata_url(settings)).path, ROOT_METADATA])
    return [Route(path, endpoint=endpoint, methods=["GET", "OPTIONS"]) for path in paths]
