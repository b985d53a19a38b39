"""loopwarden as an OAuth 2.1 resource server, beside its static tokens (settings: `identity.py`).

- `IssuerKeys`: the authorization server's metadata (RFC 8414, else OpenID Connect discovery)
  and signing keys (JWKS), fetched over HTTP and cached: the keys are fetched again after
  `jwks_cache_seconds`, or at once (at most every `REFETCH_SECONDS`) when a token names a key id
  the cache lacks, so a key rotated in works at once and one rotated out stops at the next fetch.
  An issuer that does not answer stalls no one: one fetch at a time serves every request that
  waits for it (single flight); a failed fetch is remembered for `FAILURE_BACKOFF_SECONDS`
  (requests meanwhile are answered at once, never queued behind another try); and once keys
  were fetched, a server that runs the refresh in the background (`running`) answers from the
  last good key set while it refreshes, for at most `jwks_stale_seconds` past the cache's life.
  Past that bound, or with no keys ever fetched, a JWT is refused (fail closed).
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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from loopwarden.auth.bearer import StoreTokenVerifier
from loopwarden.auth.identity import OAuthSettings
from loopwarden.auth.tokens import TOKEN_PREFIX
from loopwarden.clock import Clock, system_clock
from loopwarden.principals import PRINCIPAL_ID_PATTERN

log = logging.getLogger("loopwarden.server")

REFETCH_SECONDS = 10.0  # the least time between two JWKS fetches for unknown key ids
FAILURE_BACKOFF_SECONDS = 10.0  # after a failed fetch, no other before this
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
        self._failed_at = float("-inf")  # the last fetch that failed
        self._failure = "the issuer's keys were never fetched"
        self._flight: anyio.Event | None = None  # set when the fetch in flight ends
        self._group: anyio.abc.TaskGroup | None = None  # where `running` refreshes
        self.fetches = 0  # JWKS fetches so far (the cache's cost, for tests and operators)
        self.attempts = 0  # fetches tried, failed ones included

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

    @asynccontextmanager
    async def running(self) -> AsyncIterator[IssuerKeys]:
        """Refresh in the background while the block runs: a request that finds the cached
        keys stale (but within `jwks_stale_seconds`) is answered from them at once while the
        fetch runs in this task group, instead of waiting for it."""
        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield self
            finally:
                self._group = None
                group.cancel_scope.cancel()

    async def key_set(self, kid: str | None) -> KeySet:
        """The keys to check a token naming `kid` with (module docstring): fetched again when
        stale or lacking `kid`; `IssuerUnavailable` (never a wait behind another request's
        failure) when there are none fit to use."""
        now = self._now()
        keys = self._keys
        age = now - self._fetched_at
        missing = keys is not None and kid is not None and not _has(keys, kid)
        stale = age >= self.settings.jwks_cache_seconds
        due = keys is None or stale or (missing and now - self._missed_at >= REFETCH_SECONDS)
        if due and now - self._failed_at >= FAILURE_BACKOFF_SECONDS:
            if missing:
                self._missed_at = now
            serve_stale = keys is not None and not missing and self._group is not None
            flight = self._flight
            if flight is None:
                flight = self._flight = anyio.Event()
                if serve_stale:
                    assert self._group is not None
                    self._group.start_soon(self._refresh, flight)
                else:
                    await self._refresh(flight)
            elif not serve_stale:
                await flight.wait()  # one fetch serves every waiter
        return self._usable()

    def _usable(self) -> KeySet:
        """The cached keys if they may still be used: fetched, and not older than the cache's
        life plus `jwks_stale_seconds` (fail closed past it)."""
        keys = self._keys
        if keys is None:
            raise IssuerUnavailable(self._failure)
        age = self._now() - self._fetched_at
        bound = self.settings.jwks_cache_seconds + self.settings.jwks_stale_seconds
        if age >= bound:
            raise IssuerUnavailable(
                f"the last good key set is {age:.0f} s old, past the {bound:g} s allowed, and "
                f"the issuer does not answer ({self._failure})"
            )
        return keys

    async def _refresh(self, flight: anyio.Event) -> None:
        """One fetch for everyone waiting on `flight`; a failure is remembered (and logged
        when it changes), never raised: the waiters judge what is left (`_usable`)."""
        try:
            self.attempts += 1
            with anyio.fail_after(FETCH_SECONDS * 3):  # metadata, then keys: each times out too
                await self._fetch()
            if self._failed_at != float("-inf"):
                log.warning("the issuer's keys are fetched again: JWTs are checked against them")
            self._failed_at = float("-inf")
        except (IssuerUnavailable, TimeoutError) as exc:
            failure = str(exc) or "timed out"
            if failure != self._failure or self._failed_at == float("-inf"):
                log.error(
                    "cannot fetch the issuer's keys (%s); retrying in %g s%s",
                    failure,
                    FAILURE_BACKOFF_SECONDS,
                    ", answering from the last good key set meanwhile" if self._keys else "",
                )
            self._failed_at, self._failure = self._now(), failure
        finally:
            self._flight = None
            flight.set()

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
    # Pydantic's URL type writes a bare origin with a trailing slash ("https://idp.example/"),
    # which is not the issuer a client then finds in the issuer's own metadata (RFC 8414 asks
    # for the same string): the document names the issuer and the resource exactly as set.
    document = {
        **metadata.model_dump(mode="json", exclude_none=True),
        "resource": settings.resource,
        "authorization_servers": [settings.issuer],
    }

    async def handle(request: Request) -> Response:
        return JSONResponse(document, headers={"Cache-Control": "public, max-age=3600"})

    endpoint = cors_middleware(handle, ["GET", "OPTIONS"])
    paths = dict.fromkeys([urlsplit(metadata_url(settings)).path, ROOT_METADATA])
    return [Route(path, endpoint=endpoint, methods=["GET", "OPTIONS"]) for path in paths]
