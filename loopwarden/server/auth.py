"""Bearer-token authentication for streamable HTTP (tokens themselves: `tokens.py`).

The verifier looks the token's hash up on every request, so a revoked or expired token stops
working at once. Tokens are never logged or stored in clear.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from loopwarden.clock import format_time, parse_time
from loopwarden.errors import Forbidden
from loopwarden.ledger.storage.reader import TokenRow
from loopwarden.ledger.storage.store import Store
from loopwarden.principals import ROLES, Principal
from loopwarden.server.tokens import TOKEN_PREFIX, token_hash, token_problem

log = logging.getLogger("loopwarden.server")


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
        problem = token_problem(row, format_time(store.clock()), store.integrity)
        if problem == "forged" and row is not None:  # worth an operator's look
            log.error(
                "refusing token %s: its MAC does not verify (run loopwarden verify)", row.token_id
            )
        if problem is not None or row is None:
            return None
        # The token id as `subject`: a session belongs to the token that opened it (the SDK
        # refuses it to any other), so revoking that token can close exactly its sessions.
        return AccessToken(
            token=row.token_id,
            client_id=row.agent,
            subject=row.token_id,
            scopes=[f"role:{row.role}"],
            expires_at=_epoch(row.expires_at),
        )


def _epoch(when: str | None) -> int | None:
    return None if when is None else int(parse_time(when).timestamp())


def principal_from_token() -> Principal:
    """The principal of the current HTTP request's verified bearer token."""
    access = get_access_token()
    if access is None:
        raise Forbidden("this request carries no verified bearer token")
    roles = [role for role in ROLES if f"role:{role}" in access.scopes]
    if len(roles) != 1 or access.client_id is None:
        raise Forbidden("this request's token names no single role")
    return Principal(id=access.client_id, role=roles[0])
