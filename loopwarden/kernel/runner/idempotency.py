"""Idempotency keys: a repeated mutating call returns the original result; the same key with
other arguments is refused. Records are per principal and key, kept forever."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from loopwarden.canonical import sha256_digest
from loopwarden.kernel.store.reader import Rows
from loopwarden.kernel.store.store import Txn


def request_digest(operation: str, request: BaseModel) -> str:
    """What an idempotency key is bound to: the operation and every argument but the key.

    Not a signed artifact, only compared with itself: pydantic's JSON (fields in declaration
    order, deterministic) is enough, and several times cheaper than RFC 8785 on the hot path.
    """
    text = request.model_dump_json(exclude={"idempotency_key"})
    return sha256_digest(f"{operation}\n{text}".encode())


@dataclass(frozen=True)
class Prior:
    """What a principal's key was first used for."""

    operation: str
    request_digest: str
    response: str

    def repeats(self, operation: str, digest: str) -> bool:
        """True for the same call again; False for a conflicting reuse of the key."""
        return self.operation == operation and self.request_digest == digest


def prior(reader: Rows, principal: str, key: str) -> Prior | None:
    record = reader.idempotency(principal, key)
    if record is None:
        return None
    return Prior(record.operation, record.request_digest, record.response)


def remember(
    tx: Txn, principal: str, key: str, operation: str, digest: str, result: BaseModel
) -> None:
    tx.remember(principal, key, operation, digest, result.model_dump_json())
