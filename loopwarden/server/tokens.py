"""Bearer tokens: minted once, stored only as SHA-256 hashes, revoked by id.

A token maps to one principal (agent id and role). No MCP import here, so the admin CLI can
mint and revoke tokens without loading the SDK.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from loopwarden.errors import NotFound
from loopwarden.ledger.store import Txn
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
