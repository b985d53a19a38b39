"""MACs over the rows the server acts on that no signature covers: each loop's anchor (its row,
with the root of its state tree), the Merkle log's frontier, bearer tokens, idempotency records.

The key is a secret kept in the key directory (`keys/integrity.key`, 0600), never in the
database: a database writer can change rows, but cannot make a changed row's MAC verify. Each
MAC is HMAC-SHA256 over a domain-separated encoding of the row's values, so a MAC made for one
kind of row or one key never verifies for another.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from loopwarden.errors import IntegrityError

SECRET_BYTES = 32
LOOP_MAC = "loopwarden.loop/v1"
LOG_MAC = "loopwarden.log/v1"
RECORD_MAC = "loopwarden.idempotency/v1"
TOKEN_MAC = "loopwarden.token/v1"
POOL_MAC = "loopwarden.pool/v1"
POOL_USAGE_MAC = "loopwarden.pool-usage/v1"
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode


class Integrity:
    """The MAC key of one data home."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"an integrity secret is {SECRET_BYTES} bytes")
        self._secret = secret

    def mac(self, kind: str, values: Iterable[object]) -> bytes:
        return hmac.digest(self._secret, _ENCODE([kind, *values]).encode(), "sha256")

    def valid(self, kind: str, values: Iterable[object], mac: object) -> bool:
        return isinstance(mac, bytes) and hmac.compare_digest(self.mac(kind, values), mac)

    def check(self, kind: str, values: Iterable[object], mac: object, what: str) -> None:
        """`IntegrityError` naming `what` unless `mac` is this key's MAC over `values`."""
        if not self.valid(kind, values, mac):
            raise IntegrityError(
                f"{what} was changed outside loopwarden (its MAC does not verify); nothing was "
                "sealed. Run `loopwarden verify` for a full audit."
            )
