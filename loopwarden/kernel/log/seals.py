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
import re
from dataclasses import dataclass
from typing import Any

from loopwarden.canonical import canonical_bytes, sha256_digest
from loopwarden.errors import SealError
from loopwarden.kernel.log.keys import Keyring, Signer

PAYLOAD_TYPE = "application/vnd.loopwarden.receipt+json; version=1"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 Pre-Authentication Encoding: `DSSEv1 SP LEN(type) SP type SP LEN(body) SP body`."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


_SAFE_KEY_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def envelope_bytes(payload: bytes, key_id: str, signature: bytes) -> bytes:
    """The RFC 8785 bytes of a one-signature DSSE envelope, from a fixed template.

    Equal to `canonical_bytes` of the envelope object (the keys are already in JCS order and
    every value is base64 or a plain id, which JCS leaves unescaped) at a fraction of the cost;
    a key id outside that alphabet falls back to the general canonicalizer.
    """
    payload_b64 = base64.b64encode(payload).decode("ascii")
    sig_b64 = base64.b64encode(signature).decode("ascii")
    if not _SAFE_KEY_ID.fullmatch(key_id):
        return canonical_bytes(
            {
                "payload": payload_b64,
                "payloadType": PAYLOAD_TYPE,
                "signatures": [{"keyid": key_id, "sig": sig_b64}],
            }
        )
    return (
        f'{{"payload":"{payload_b64}","payloadType":"{PAYLOAD_TYPE}",'
        f'"signatures":[{{"keyid":"{key_id}","sig":"{sig_b64}"}}]}}'
    ).encode("ascii")


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

    Raises `SealError` if the body cannot be canonicalized, does not read back as the same
    canonical bytes, or the fresh signature does not verify under the signer's own public key
    (the seal is checked before it can be committed).
    """
    payload = canonical_bytes(body, exact=True)  # what we sign must read back as itself
    message = pae(PAYLOAD_TYPE, payload)
    signature = signer.sign(message)
    if not signer.verifies(message, signature):
        raise SealError("a freshly made receipt signature did not verify; nothing was committed")
    envelope = envelope_bytes(payload, signer.key_id, signature)
    digest = sha256_digest(envelope)
    return Sealed(envelope, digest, receipt_id_for(digest), signer.key_id)


@dataclass(frozen=True)
class Envelope:
    """A one-signature DSSE envelope, decoded but not verified."""

    envelope: dict[str, Any]
    payload_type: str
    payload: bytes
    key_id: str
    signature: bytes


def parse_envelope(raw: bytes) -> Envelope | None:
    """The one envelope parser: the DSSE fields of `raw`, or None if it is not an envelope with
    exactly one signature and string fields. Never raises."""
    try:
        envelope = json.loads(raw)
        signatures = envelope["signatures"]
        if not isinstance(signatures, list) or len(signatures) != 1:
            return None
        fields = (
            envelope["payload"],
            envelope["payloadType"],
            signatures[0]["keyid"],
            signatures[0]["sig"],
        )
        if not all(isinstance(f, str) for f in fields):
            return None
        payload = base64.b64decode(fields[0], validate=True)
        signature = base64.b64decode(fields[3], validate=True)
    except (ValueError, KeyError, TypeError, IndexError, RecursionError, binascii.Error):
        return None
    return Envelope(envelope, fields[1], payload, fields[2], signature)


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


def open_envelope(
    envelope_bytes: bytes, keyring: Keyring | None, *, canonical: bool = True
) -> Opened:
    """Parse and verify an envelope. Never raises, whatever the bytes: every defect is a problem.

    Problem codes: `envelope_malformed`, `payload_type_mismatch`, `unknown_key`,
    `signature_invalid`, `payload_malformed`, `not_canonical`. With `keyring=None` the
    signature is not checked (the caller checks it elsewhere, see `signature_problem`); with
    `canonical=False` the RFC 8785 re-serialization check is skipped.
    """
    parsed = parse_envelope(envelope_bytes)
    if parsed is None:
        return Opened({}, b"", {}, None, ("envelope_malformed",))
    problems: list[str] = []
    if parsed.payload_type != PAYLOAD_TYPE:
        problems.append("payload_type_mismatch")
    if keyring is not None:
        problems.extend(signature_problem(keyring, parsed))
    body = _parse_body(parsed.payload)
    if body is None:
        problems.append("payload_malformed")
        body = {}
    elif canonical and not _is_canonical(body, parsed.payload):
        problems.append("not_canonical")
    return Opened(parsed.envelope, parsed.payload, body, parsed.key_id, tuple(problems))


def signature_problem(keyring: Keyring, parsed: Envelope) -> tuple[str, ...]:
    """Only the signature check of a parsed envelope: `()`, `("unknown_key",)` or
    `("signature_invalid",)`."""
    if parsed.key_id not in keyring:
        return ("unknown_key",)
    if not keyring.verify(
        parsed.key_id, pae(parsed.payload_type, parsed.payload), parsed.signature
    ):
        return ("signature_invalid",)
    return ()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_body(payload: bytes) -> dict[str, Any] | None:
    """The JSON object in `payload`, or None."""
    try:
        body = json.loads(payload, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def _is_canonical(body: dict[str, Any], payload: bytes) -> bool:
    try:
        return canonical_bytes(body) == payload
    except (SealError, RecursionError):
        return False
