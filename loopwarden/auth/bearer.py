"""Bearer-token authentication for streamable HTTP (tokens themselves: `tokens.py`).

A token is verified against its row (hash lookup, revocation, expiry, MAC) on first use; a
repeat request is answered from the verified tokens (`verified.py`) after a per-request check
that no token was minted or revoked since (one small read shared by concurrent requests) and
that the token has not expired by the store's clock, so a revoked or expired token stops
working at once. Tokens are never logged or stored in clear.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from loopwarden.auth.tokens import TOKEN_PREFIX, token_hash, token_problem
from loopwarden.auth.verified import Coalesced, Entry, VerifiedTokens
from loopwarden.errors import Forbidden
from loopwarden.kernel.store.reader import TokenRow
from loopwarden.kernel.store.store import Store
from loopwarden.principals import ROLES, Principal

log = logging.getLogger("loopwarden.server")


class StoreTokenVerifier:
    """The MCP SDK's `TokenVerifier`: a valid, unrevoked token → an `AccessToken` for its principal.

    `store` returns the open store, or None while the server starts or stops (then every token
    is refused). One verifier serves every route of a server (`Runtime.tokens`), so that what
    one route verified the others find."""

    def __init__(self, store: Callable[[], Store | None]) -> None:
        self._store = store
        self._verified = VerifiedTokens()
        self._of: Store | None = None  # the store the verified tokens were read from
        self.versions = Coalesced(self._read_version)

    async def _read_version(self) -> object:
        store = self._store()
        if store is None:
            raise LookupError("no store")
        return await store.read(lambda r: r.tokens_version(), snapshot=False)  # one statement

    async def verify_token(self, token: str) -> AccessToken | None:
        store = self._store()
        if store is None or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
            return None
        if store is not self._of:  # a store opened anew: nothing verified on another holds
            self._verified.clear()
            self._of = store
        hashed = token_hash(token)
        try:
            version = await self.versions()  # read after this request arrived
        except Exception:  # the store is closing or failing: refuse, as a failed row read does
            return None
        known = self._verified.get(hashed, store.clock(), version)
        if known is not None:
            return known
        access, expires = await self._check(store, hashed)
        if access is not None:
            self._verified.put(hashed, Entry(access, expires, version))
        return access

    async def _check(self, store: Store, hashed: str) -> tuple[AccessToken | None, datetime | None]:
        """The token's row verified: its principal and expiry, or (None, None)."""
        row: TokenRow | None = await store.read(lambda r: r.token(hashed))
        problem = token_problem(row, store.clock(), store.integrity)
        if problem == "forged" and row is not None:  # worth an operator's look
            log.error(
                "refusing token %s: its MAC does not verify (run loopwarden verify)", row.token_id
            )
        if problem is not None or row is None:
            return None, None
        expires = row.expires_at
        # The token id as `subject`: a session belongs to the token that opened it (the SDK
        # refuses it to any other), so revoking that token can close exactly its sessions.
        access = AccessToken(
            token=row.token_id,
            client_id=row.agent,
            subject=row.token_id,
            scopes=[f"role:{row.role}"],
            expires_at=None if expires is None else int(expires.timestamp()),
        )
        return access, expires


def principal_from_token() -> Principal:
    """The principal of the current HTTP request's verified bearer token."""
    access = get_access_token()
    if access is None:
        raise Forbidden("this request carries no verified bearer token")
    roles = [role for role in ROLES if f"role:{role}" in access.scopes]
    if len(roles) != 1 or access.client_id is None:
        raise Forbidden("this request's token names no single role")
    return Principal(id=access.client_id, role=roles[0])
