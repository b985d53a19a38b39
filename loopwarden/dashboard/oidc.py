"""Operators sign into the dashboard with OpenID Connect when an issuer is configured
(`[oauth] dashboard_client_id`, `auth/identity.py`); the token sign-in stays beside it.

`GET /login/oidc` sends the browser to the issuer's authorization endpoint (authorization code
flow with PKCE `S256`, a fresh `state` and `nonce`, `resource` = this server's `/mcp`, scope
`openid` and the operator scope). The sign-in in progress (state, PKCE verifier, nonce, where to
go back, when it began) is kept in the browser's own cookie, sealed (AES-256-GCM, a JWE with a
key derived from the home's integrity secret, so any replica opens it) rather than in a table
on the server: no one else's requests can evict it, and there is nothing to fill.
`GET /login/oidc/callback` opens that cookie, checks the `state` against it and the `iss` of the answer
against the issuer (RFC 9207), redeems the code at the token endpoint with the PKCE verifier,
and signs in only if the access token passes the same checks `/mcp` makes (`JwtVerifier`:
signature, issuer, this audience, expiry, identity claim) and names the operator role, and the
ID token is for this client with the login's `nonce`. The session is the dashboard's own (idle
and lifetime limits); the IdP's tokens are not kept.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import httpx2
from joserfc import jwe
from joserfc.errors import JoseError
from joserfc.jwk import OctKey
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from loopwarden.auth.oauth import IssuerUnavailable, JwtVerifier, granted_scopes
from loopwarden.clock import Clock, format_time, parse_time, system_clock
from loopwarden.dashboard.operator_sessions import COOKIE, next_page
from loopwarden.principals import Principal

log = logging.getLogger("loopwarden.dashboard")

STATE_COOKIE = "lw_oidc"
PENDING_SECONDS = 600  # a login must come back within this
SEAL_LABEL = b"loopwarden/oidc-login-state/v1"  # the sealing key: HMAC(integrity secret, this)
SEALING = {"alg": "dir", "enc": "A256GCM"}
MAX_COOKIE = 2048  # characters of a state cookie worth opening
TOKEN_SECONDS = 10.0
CONTINUE = (  # `url` is `next_page`'s: `/` or an approval's page
    '<!doctype html><meta http-equiv="refresh" content="0;url={url}">'
    '<title>Signed in</title><p>Signed in. <a href="{url}">Continue</a>.</p>'
)


def challenge_of(verifier: str) -> str:
    """PKCE `S256`: base64url(SHA-256(verifier)), unpadded."""
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sealing_key(secret: bytes) -> bytes:
    """The key sign-in cookies are sealed with: derived from the home's integrity secret (every
    replica of a store shares it), revealing nothing of it."""
    return hmac.new(secret, SEAL_LABEL, hashlib.sha256).digest()


@dataclass(frozen=True)
class Pending:
    """A sign-in in progress, as its sealed cookie carries it."""

    state: str
    verifier: str
    nonce: str
    back: str
    started: datetime

    def sealed(self, key: OctKey) -> str:
        fields = {**asdict(self), "started": format_time(self.started)}
        return jwe.encrypt_compact(SEALING, json.dumps(fields).encode(), key)

    @staticmethod
    def opened(cookie: str | None, key: OctKey) -> Pending | None:
        """The sign-in a cookie carries, or None for one that is not ours, unchanged."""
        if not cookie or len(cookie) > MAX_COOKIE:
            return None
        try:
            fields = json.loads(jwe.decrypt_compact(cookie, key).plaintext or b"")
            return Pending(**{**fields, "started": parse_time(fields["started"])})
        except (JoseError, ValueError, TypeError, KeyError):
            return None


class LoginRefused(Exception):
    """Why a callback signs nobody in (shown on the sign-in page)."""


class OidcLogin:
    """The dashboard's OIDC client (see the module docstring)."""

    def __init__(
        self,
        jwts: JwtVerifier,
        *,
        client_id: str,
        client_secret: str | None,
        redirect_uri: str,
        seal_key: bytes,
        clock: Clock = system_clock,
    ) -> None:
        self.jwts = jwts
        self.settings = jwts.settings
        self.client_id = client_id
        self.client_secret = client_secret
        self.redirect_uri = redirect_uri
        self._clock = clock
        self._key = OctKey.import_key(seal_key)

    async def start(self, back: str) -> tuple[str, str]:
        """The authorization URL to send the browser to, and the sealed sign-in for its
        cookie (`Pending`): nothing is kept on the server."""
        endpoint = (await self.jwts.keys.metadata()).get("authorization_endpoint")
        if not isinstance(endpoint, str):
            raise IssuerUnavailable("the issuer's metadata has no authorization_endpoint")
        state, nonce, verifier = (
            secrets.token_urlsafe(24),
            secrets.token_urlsafe(24),
            secrets.token_urlsafe(48),
        )
        pending = Pending(state, verifier, nonce, back, self._clock())
        query = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": f"openid {self.settings.scopes['operator']}",
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge_of(verifier),
            "code_challenge_method": "S256",
            "resource": self.settings.resource,
        }
        return f"{endpoint}?{urlencode(query)}", pending.sealed(self._key)

    async def finish(self, params: dict[str, str], cookie: str | None) -> tuple[Principal, str]:
        """The operator a callback signs in and where to send them; `LoginRefused` otherwise.
        The sign-in is the one sealed in this browser's cookie, and the answer's `state` must
        be its own."""
        state = params.get("state", "")
        pending = Pending.opened(cookie, self._key)
        if (
            pending is None
            or not state
            or not hmac.compare_digest(state.encode(), pending.state.encode())
            or not timedelta(0)
            <= self._clock() - pending.started
            <= timedelta(seconds=PENDING_SECONDS)
        ):
            raise LoginRefused("That sign-in expired or was not started here; try again.")
        if "iss" in params and params["iss"] != self.settings.issuer:
            raise LoginRefused("That answer came from another identity provider.")
        if "error" in params or "code" not in params:
            raise LoginRefused("The identity provider did not sign you in.")
        tokens = await self._redeem(params["code"], pending.verifier)
        return self._principal(await self._checked(tokens, pending.nonce)), pending.back

    async def _redeem(self, code: str, verifier: str) -> dict[str, Any]:
        endpoint = (await self.jwts.keys.metadata()).get("token_endpoint")
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.redirect_uri,
            "client_id": self.client_id,
            "code_verifier": verifier,
            "resource": self.settings.resource,
        }
        if self.client_secret is not None:
            form["client_secret"] = self.client_secret
        try:
            async with httpx2.AsyncClient(timeout=TOKEN_SECONDS, follow_redirects=False) as http:
                response = await http.post(str(endpoint), data=form)
            tokens = response.json() if response.status_code == 200 else None
        except (httpx2.HTTPError, ValueError) as exc:
            log.warning("OIDC token request failed: %s", type(exc).__name__)
            tokens = None
        if not isinstance(tokens, dict):
            raise LoginRefused("The identity provider did not redeem the sign-in; try again.")
        return tokens

    async def _checked(self, tokens: dict[str, Any], nonce: str) -> dict[str, Any]:
        access, id_token = tokens.get("access_token"), tokens.get("id_token")
        if not isinstance(access, str) or not isinstance(id_token, str):
            raise LoginRefused("The identity provider sent no access token and ID token.")
        claims = await self.jwts.claims(access, self.settings.resource)
        identity = await self.jwts.claims(id_token, self.client_id)
        if claims is None or identity is None or identity.get("nonce") != nonce:
            raise LoginRefused("The identity provider's tokens did not verify.")
        if identity.get("sub") != claims.get("sub"):
            raise LoginRefused("The ID token and the access token name different people.")
        return claims

    def _principal(self, claims: dict[str, Any]) -> Principal:
        who = self.jwts.identity(claims)
        roles = self.settings.roles_for(granted_scopes(claims))
        if who is None:
            raise LoginRefused("Your identity is not one this server knows.")
        if roles != ["operator"]:
            raise LoginRefused(
                f"The dashboard is for operators: your token needs the {self.settings.scopes['operator']} scope (alone)."
            )
        return Principal(id=who, role="operator")


def _secure(login: OidcLogin) -> bool:
    return login.redirect_uri.startswith("https://")


async def start_page(d: Any, login: OidcLogin, request: Request) -> Response:
    """`GET /login/oidc`: to the identity provider, the sealed sign-in in a cookie."""
    try:
        url, sealed = await login.start(next_page(request.query_params.get("next", "")))
    except IssuerUnavailable as exc:
        log.error("OIDC sign-in unavailable: %s", exc)
        page: Response = d.error_page(
            503, "the identity provider cannot be reached; sign in with a token"
        )
        return page
    response = RedirectResponse(url, status_code=303)
    # Lax, not strict: the callback is a top-level navigation from the identity provider.
    response.set_cookie(
        STATE_COOKIE, sealed, httponly=True, samesite="lax", path="/login",
        secure=_secure(login), max_age=PENDING_SECONDS,
    )  # fmt: skip
    return response


async def callback_page(d: Any, login: OidcLogin, request: Request) -> Response:
    """`GET /login/oidc/callback`: the checked answer opens a session, or the sign-in page
    says why not."""
    try:
        who, back = await login.finish(
            dict(request.query_params), request.cookies.get(STATE_COOKIE)
        )
    except (LoginRefused, IssuerUnavailable) as exc:
        message = (
            str(exc)
            if isinstance(exc, LoginRefused)
            else "The identity provider cannot be reached."
        )
        refused: Response = d.render(
            "login.html", 403, message=message, error=True, csrf="", who=None, next="/", oidc=True
        )
        return refused
    session = d.sessions.create(None, who)
    session.say("ok", f"Signed in as {who.id} (identity provider).")
    # A page of ours moves on: after a cross-site redirect chain a SameSite=Strict session
    # cookie would not be sent, and the operator would land on the sign-in page again.
    response = HTMLResponse(CONTINUE.format(url=back))
    response.set_cookie(
        COOKIE,
        session.session_id,
        httponly=True,
        samesite="strict",
        path="/",
        secure=_secure(login),
    )
    response.delete_cookie(STATE_COOKIE, path="/login")
    return response


def routes(d: Any) -> list[Route]:
    """`/login/oidc` and its callback, for a dashboard with an OIDC client (else none)."""
    login: OidcLogin | None = d.oidc
    if login is None:
        return []

    async def start(request: Request) -> Response:
        return await start_page(d, login, request)

    async def callback(request: Request) -> Response:
        return await callback_page(d, login, request)

    return [
        Route("/login/oidc", start, methods=["GET"]),
        Route("/login/oidc/callback", callback, methods=["GET"]),
    ]
