"""Bearer tokens for streamable HTTP: minted once, stored only as SHA-256 hashes.

A token maps to one principal (agent id and role). The verifier looks the hash up on every
request, so a revoked token stops working at once. Tokens are never logged or stored in clear.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from loopwarden.errors import Forbidden, NotFound
from loopwarden.ledger.reader import TokenRow
from loopwarden.ledger.store import Store, Txn
from loopwarden.principals import Principal

TOKEN_PREFIX = "lw_"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_id_for(hashed: str) -> str:
    return "tok-" + hashed[:12]


@dataclass(frozen=True)
class IssuedToken:
    token: str  # shown once, never stored
    token_id: str
    agent: str
    role: str


def issue_token(tx: Txn, principal: Principal) -> IssuedToken:
    """Mint a token for `principal` and store its hash. Returns the clear token exactly once."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    hashed = token_hash(token)
    tx.add_token(hashed, token_id_for(hashed), principal.id, principal.role)
    return IssuedToken(token, token_id_for(hashed), principal.id, principal.role)


def revoke_token(tx: Txn, token_id: str) -> None:
    """Revoke by id; `NotFound` if no live token has this id."""
    if not tx.revoke_token(token_id):
        raise NotFound(f"no live token with id {token_id!r}")


class StoreTokenVerifier:
    """The MCP SDK's `TokenVerifier`: a valid, unrevoked token → an `AccessToken` for its principal.

    `store` returns the open store, or None while the server starts or stops (then every token
    is refused).
    """

    def __init__(self, store: Callable[[], Store | None]) -> None:
        self._store = store

    async def verify_token(self, token: str) -> AccessToken | None:
        store = self._store()
        if store is None or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
            return None
        hashed = token_hash(token)
        row: TokenRow | None = await store.read(lambda r: r.token(hashed))
        if row is None or row.revoked_at is not None:
            return None
        return AccessToken(token=row.token_id, client_id=row.agent, scopes=[f"role:{row.role}"])


def principal_from_token() -> Principal:
    """The principal of the current HTTP request's verified bearer token."""
    access = get_access_token()
    if access is None:
        raise Forbidden("this request carries no verified bearer token")
    role = "operator" if "role:operator" in access.scopes else "agent"
    return Principal(id=access.client_id, role=role)
