"""Bearer tokens: minted once, stored only as SHA-256 hashes, revoked by id.

A token maps to one principal (agent id and role). No MCP import here, so the admin CLI can
mint and revoke tokens without loading the SDK.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from loopwarden.errors import NotFound
from loopwarden.kernel.log.integrity import TOKEN_MAC, Integrity
from loopwarden.kernel.store.reader import TokenRow
from loopwarden.kernel.store.store import Txn
from loopwarden.principals import Principal

TOKEN_PREFIX = "lw_"
GATEWAY_TOKEN_PREFIX = "lwm_"
"""A model gateway token's prefix: no edge but the gateway takes it (they take `lw_` only)."""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_id_for(hashed: str) -> str:
    return "tok-" + hashed[:12]


def token_problem(row: TokenRow | None, now: datetime, integrity: Integrity) -> str | None:
    """Why a stored token admits nobody at `now`: `unknown`, `revoked`, `expired`, or `forged`
    (a row whose MAC fails: not written by loopwarden, or edited since). None if it admits its
    holder. The one check behind every edge that takes a token (MCP over HTTP, the dashboard)."""
    if row is None:
        return "unknown"
    if row.revoked_at is not None:
        return "revoked"
    if not row.live_at(now):
        return "expired"
    if not integrity.valid(TOKEN_MAC, row.mac_values(), row.mac):
        return "forged"
    return None


@dataclass(frozen=True)
class IssuedToken:
    token: str  # shown once, never stored
    token_id: str
    agent: str
    role: str
    expires_at: datetime | None = None
    loop_id: str | None = None


def issue_token(
    tx: Txn, principal: Principal, lifetime: timedelta | None = None, loop_id: str | None = None
) -> IssuedToken:
    """Mint a token for `principal` and store its hash. Returns the clear token exactly once.

    With a `lifetime` the token expires that long after now: from then on it is refused like a
    revoked one (and the server closes its sessions). With a `loop_id` it is a model gateway
    token (`model_gateway/credentials.py`): an `observer` for one agent in that one loop, with
    its own prefix, which every other edge refuses."""
    prefix = TOKEN_PREFIX
    if loop_id is not None:
        if principal.role != "observer":
            raise ValueError("a token bound to a loop is a model gateway token: role observer")
        prefix = GATEWAY_TOKEN_PREFIX
    token = prefix + secrets.token_urlsafe(32)
    hashed = token_hash(token)
    expires_at = tx.now + lifetime if lifetime is not None else None
    tx.add_token(
        hashed, token_id_for(hashed), principal.id, principal.role, expires_at, loop_id=loop_id
    )
    return IssuedToken(
        token, token_id_for(hashed), principal.id, principal.role, expires_at, loop_id
    )


def revoke_token(tx: Txn, token_id: str) -> None:
    """Revoke by id; `NotFound` if no live token has this id."""
    if not tx.revoke_token(token_id):
        raise NotFound(f"no live token with id {token_id!r}")
