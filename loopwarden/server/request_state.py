"""The keys the MCP SDK seals multi-round-trip `requestState` with, shared by every replica.

Under MCP 2026-07-28 a request that needs the human (an approval link, `elicitation.py`) returns
`input_required` with an opaque `requestState` that the client echoes on its retry, and the retry
may reach another replica. The SDK seals that state (AES-GCM, bound to the principal, the request
and a time window) under `RequestStateSecurity(keys=[...])`; every replica must hold the same
keys and the same server name. loopwarden derives its key from the home's integrity secret
(`keys/integrity.key`), which every replica of one store already shares, so nothing more is
configured: `HMAC-SHA256(secret, LABEL)`, a key of its own that reveals nothing of the secret.
`LOOPWARDEN_REQUEST_STATE_KEYS` (comma-separated, each at least 32 characters; the first seals,
all open) replaces it for a rotation.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from mcp.server.request_state import RequestStateSecurity

from loopwarden.errors import InvalidInput
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.server.settings import Settings, makes_no_store

ENV = "LOOPWARDEN_REQUEST_STATE_KEYS"
LABEL = b"loopwarden/mcp-request-state/v1"
AUDIENCE = "loopwarden"
MIN_KEY = 32


def request_state_keys(settings: Settings) -> list[bytes]:
    """The ring (sealing key first): from `ENV` if set, else derived from the integrity secret."""
    given = os.environ.get(ENV, "").strip()
    if given:
        keys = [k.strip().encode() for k in given.split(",") if k.strip()]
        if not keys or any(len(k) < MIN_KEY for k in keys):
            raise InvalidInput(f"{ENV}: each key must be at least {MIN_KEY} characters")
        return keys
    if makes_no_store(settings):  # it serves nothing, and makes nothing in a mistyped home
        return [os.urandom(MIN_KEY)]
    secret = KeyStore(settings.home).load_secret()
    return [hmac.new(secret, LABEL, hashlib.sha256).digest()]


def request_state_security(settings: Settings) -> RequestStateSecurity:
    """The SDK policy every replica of this store shares (same keys, same audience)."""
    return RequestStateSecurity(keys=request_state_keys(settings), audience=AUDIENCE)
