"""Sealing receipts: RFC 8785 canonical body → DSSE envelope signed with Ed25519.

DSSE (https://github.com/secure-systems-lab/dsse): the signature covers
`PAE(payloadType, payload)`, never the raw JSON, so a payload cannot be re-read as another type.
The envelope itself is canonicalized (RFC 8785) and those bytes are the Merkle leaf, the
receipt's digest and the input of the next receipt's `prev`.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from loopwarden.canonical import canonical_bytes, sha256_digest
from loopwarden.errors import SealError
from loopwarden.ledger.keys import Keyring, Signer

PAYLOAD_TYPE = "application/vnd.loopwarden.receipt+json; version=1"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 Pre-Authentication Encoding: `DSSEv1 SP LEN(type) SP type SP LEN(body) SP body`."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def receipt_id_for(digest: str) -> str:
    """A receipt's id is derived from its envelope digest: `rcpt-` + 24 hex digits."""
    return "rcpt-" + digest.removeprefix("sha256:")[:24]


@dataclass(frozen=True)
class Sealed:
    """A signed receipt: canonical envelope bytes and what is derived from them."""

    envelope: bytes
    digest: str
    receipt_id: str
    key_id: str


def seal(body: dict[str, Any], signer: Signer) -> Sealed:
    """Canonicalize, sign and self-verify one receipt body.

    Raises `SealError` if the body cannot be canonicalized or the fresh signature does not verify
    under the signer's own public key (the seal is checked before it can be committed).
    """
    payload = canonical_bytes(body)
    signature = signer.sign(pae(PAYLOAD_TYPE, payload))
    if not Keyring({signer.key_id: signer.public_key}).verify(
        signer.key_id, pae(PAYLOAD_TYPE, payload), signature
    ):
        raise SealError("a freshly made receipt signature did not verify; nothing was committed")
    envelope = canonical_bytes(
        {
            "payload": base64.b64encode(payload).decode("ascii"),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [
                {"keyid": signer.key_id, "sig": base64.b64encode(signature).decode("ascii")}
            ],
        }
    )
    digest = sha256_digest(envelope)
    return Sealed(envelope, digest, receipt_id_for(digest), signer.key_id)


@dataclass(frozen=True)
class Opened:
    """An envelope taken apart: what it says, and whether its signature holds."""

    envelope: dict[str, Any]
    payload: bytes
    body: dict[str, Any]
    key_id: str | None
    problems: tuple[str, ...]

    @property
    def verified(self) -> bool:
        return not self.problems


def open_envelope(envelope_bytes: bytes, keyring: Keyring) -> Opened:
    """Parse and verify an envelope. Never raises: every defect is a problem code.

    Problem codes: `envelope_malformed`, `payload_type_mismatch`, `unknown_key`,
    `signature_invalid`, `payload_malformed`, `not_canonical`.
    """
    problems: list[str] = []
    try:
        envelope = json.loads(envelope_bytes)
        payload = base64.b64decode(envelope["payload"], validate=True)
        signatures = envelope["signatures"]
        payload_type = envelope["payloadType"]
        if not isinstance(signatures, list) or len(signatures) != 1:
            raise ValueError("exactly one signature expected")
        key_id = signatures[0]["keyid"]
        signature = base64.b64decode(signatures[0]["sig"], validate=True)
    except (ValueError, KeyError, TypeError, IndexError, binascii.Error):
        return Opened({}, b"", {}, None, ("envelope_malformed",))
    if payload_type != PAYLOAD_TYPE:
        problems.append("payload_type_mismatch")
    if key_id not in keyring:
        problems.append("unknown_key")
    elif not keyring.verify(key_id, pae(payload_type, payload), signature):
        problems.append("signature_invalid")
    try:
        body = json.loads(payload)
        if not isinstance(body, dict):
            raise ValueError("body is not an object")
        if canonical_bytes(body) != payload:
            problems.append("not_canonical")
    except (ValueError, SealError):
        body = {}
        problems.append("payload_malformed")
    return Opened(envelope, payload, body, key_id, tuple(problems))
