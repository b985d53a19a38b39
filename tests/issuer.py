"""A small, real OAuth 2.1 / OpenID Connect authorization server for the tests, on loopback.

Built on joserfc (the JWTs and the JWK set) and Starlette, served by uvicorn in a thread:

- metadata at `/.well-known/oauth-authorization-server` and `/.well-known/openid-configuration`
  (issuer, endpoints, `S256`, `authorization_response_iss_parameter_supported`);
- `GET /jwks`: the current signing keys (`rotate()` replaces them: the old key id disappears);
  `jwks_status` makes it fail, `jwks_hang` makes it hang (an outage, as a client sees one);
- `POST /token`: `client_credentials` (a registered client and its secret → an access token for
  the requested `resource`, its `sub` the client's subject) and `authorization_code` with PKCE
  (`S256` checked against the verifier; a code works once) → an access token and an ID token;
- `GET /authorize`: no login page: it signs in `login_as` (the test says who) and redirects with
  `code`, `state` and `iss`;
- `POST /register`: dynamic client registration (public clients), as MCP clients use it;
- `mint(...)`: any token the tests want to present (expired, for another audience, by another
  key), signed like the real ones.

Requests are counted by path (`seen`), so a test can tell how far a client went.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import uvicorn
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from support import free_port

LIFETIME = 600


def new_key() -> ECKey:
    return ECKey.generate_key(
        "P-256", parameters={"kid": secrets.token_hex(6), "alg": "ES256", "use": "sig"}
    )


@dataclass
class Client:
    secret: str | None = None  # None: a public client (PKCE only)
    subject: str | None = None  # client credentials: the `sub` its tokens carry
    scope: str = ""  # client credentials: the scopes when it asks for none
    redirect_uris: list[str] = field(default_factory=list)


@dataclass
class Issuer:
    """The authorization server's state; `start()` serves it, `stop()` ends it."""

    port: int = field(default_factory=free_port)
    key: ECKey = field(default_factory=new_key)
    clients: dict[str, Client] = field(default_factory=dict)
    users: dict[str, str] = field(default_factory=dict)  # user → the scopes it is granted
    login_as: str | None = None
    seen: Counter[str] = field(default_factory=Counter)
    codes: dict[str, dict[str, Any]] = field(default_factory=dict)
    retired: list[ECKey] = field(default_factory=list)
    jwks_status: int = 200  # anything else: `GET /jwks` answers that status, no keys
    jwks_hang: threading.Event | None = None  # `GET /jwks` waits until this event is set

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rotate(self) -> ECKey:
        """A new signing key; the old one leaves the JWKS (and is returned)."""
        old, self.key = self.key, new_key()
        self.retired.append(old)
        return old

    def mint(self, key: ECKey | None = None, **claims: Any) -> str:
        """A JWT with the issuer's defaults (iss, iat, exp in LIFETIME s), `claims` on top
        (a value None removes that claim), signed by `key` (default: the current one)."""
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": self.url,
            "iat": now,
            "exp": now + LIFETIME,
            "jti": secrets.token_hex(8),
        }
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        signer = key or self.key
        return jwt.encode({"alg": "ES256", "kid": signer.kid, "typ": "at+jwt"}, body, signer)

    # --- endpoints ---------------------------------------------------------------------------

    def metadata(self, request: Request) -> Response:
        self.seen[request.url.path] += 1
        return JSONResponse(
            {
                "issuer": self.url,
                "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token",
                "registration_endpoint": f"{self.url}/register",
                "jwks_uri": f"{self.url}/jwks",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "client_credentials"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_post", "none"],
                "scopes_supported": ["openid", "loopwarden:agent", "loopwarden:operator"],
                "authorization_response_iss_parameter_supported": True,
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["ES256"],
            }
        )

    def jwks(self, request: Request) -> Response:
        self.seen["/jwks"] += 1
        hang = self.jwks_hang
        if hang is not None:  # an issuer that takes the request and does not answer
            hang.wait(timeout=120)
        if self.jwks_status != 200:
            return Response(status_code=self.jwks_status)
        return JSONResponse(KeySet([self.key]).as_dict(private=False))

    async def register(self, request: Request) -> Response:
        self.seen["/register"] += 1
        body = await request.json()
        client_id = "dyn-" + secrets.token_hex(6)
        self.clients[client_id] = Client(redirect_uris=list(body.get("redirect_uris", [])))
        return JSONResponse(
            {"client_id": client_id, **body, "token_endpoint_auth_method": "none"}, status_code=201
        )

    def authorize(self, request: Request) -> Response:
        self.seen["/authorize"] += 1
        q = request.query_params
        client = self.clients.get(q.get("client_id", ""))
        if client is None or q.get("redirect_uri") not in client.redirect_uris:
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        if q.get("response_type") != "code" or q.get("code_challenge_method") != "S256":
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        user = self.login_as
        if user is None or user not in self.users:
            return RedirectResponse(
                f"{q['redirect_uri']}?{urlencode({'error': 'access_denied', 'state': q.get('state', ''), 'iss': self.url})}"
            )
        code = secrets.token_urlsafe(16)
        self.codes[code] = {
            "client_id": q["client_id"],
            "redirect_uri": q["redirect_uri"],
            "challenge": q.get("code_challenge", ""),
            "resource": q.get("resource"),
            "nonce": q.get("nonce"),
            "user": user,
            "scope": " ".join(
                s
                for s in q.get("scope", "").split()
                if s in self.users[user].split() or s == "openid"
            ),
        }
        params = {"code": code, "state": q.get("state", ""), "iss": self.url}
        return RedirectResponse(f"{q['redirect_uri']}?{urlencode(params)}", status_code=302)

    async def token(self, request: Request) -> Response:
        self.seen["/token"] += 1
        form = dict(await request.form())
        grant = form.get("grant_type")
        if grant == "client_credentials":
            return self._client_credentials(form)
        if grant == "authorization_code":
            return self._code(form)
        return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)

    def _client_credentials(self, form: dict[str, Any]) -> Response:
        client = self.clients.get(str(form.get("client_id", "")))
        if client is None or client.secret is None or form.get("client_secret") != client.secret:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        scope = str(form.get("scope") or client.scope)
        access = self.mint(
            sub=client.subject or form["client_id"],
            aud=form.get("resource"),
            scope=scope,
            client_id=form["client_id"],
        )
        return JSONResponse(
            {"access_token": access, "token_type": "Bearer", "expires_in": LIFETIME, "scope": scope}
        )

    def _code(self, form: dict[str, Any]) -> Response:
        grant = self.codes.pop(str(form.get("code", "")), None)  # a code works once
        if (
            grant is None
            or grant["client_id"] != form.get("client_id")
            or grant["redirect_uri"] != form.get("redirect_uri")
        ):
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        client = self.clients[grant["client_id"]]
        if client.secret is not None and form.get("client_secret") != client.secret:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        verifier = str(form.get("code_verifier", ""))
        challenge = (
            base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
            .rstrip(b"=")
            .decode()
        )
        if not verifier or challenge != grant["challenge"]:
            return JSONResponse(
                {"error": "invalid_grant", "error_description": "PKCE"}, status_code=400
            )
        resource = form.get("resource") or grant["resource"]
        access = self.mint(
            sub=grant["user"], aud=resource, scope=grant["scope"], client_id=grant["client_id"]
        )
        id_token = self.mint(sub=grant["user"], aud=grant["client_id"], nonce=grant["nonce"])
        return JSONResponse(
            {
                "access_token": access,
                "id_token": id_token,
                "token_type": "Bearer",
                "expires_in": LIFETIME,
                "scope": grant["scope"],
            }
        )

    # --- serving -----------------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/.well-known/oauth-authorization-server", self.metadata),
                Route("/.well-known/openid-configuration", self.metadata),
                Route("/jwks", self.jwks),
                Route("/register", self.register, methods=["POST"]),
                Route("/authorize", self.authorize),
                Route("/token", self.token, methods=["POST"]),
            ]
        )

    def start(self) -> Issuer:
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 120  # a hang guard (a thread that is alive starts)
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test issuer did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
