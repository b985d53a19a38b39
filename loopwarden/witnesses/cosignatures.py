"""Witness cosignatures of checkpoints, C2SP tlog-cosignature v1 (Ed25519, signature type 0x04).

A cosignature is a signed-note signature line on the checkpoint:

    — <witness name> base64(key hash[4] || timestamp[8, big-endian] || Ed25519 signature[64])

signed over `cosignature/v1\\ntime <timestamp>\\n` followed by the checkpoint's note text. It
says: as of that time, the consistent tree head of the largest size the witness has seen for
the log of that origin has this root.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

import nacl.exceptions
import nacl.signing

from loopwarden.kernel.log.keys import SIG_PREFIX
from loopwarden.witnesses.vkeys import COSIGNATURE_V1, VerifierKey, valid_name

BLOB = 4 + 8 + 64
MAX_TIMESTAMP = 2**63 - 1


def signed_message(text: str, timestamp: int) -> bytes:
    """What a v1 cosignature signs: the header line, the time line, the checkpoint's text."""
    return f"cosignature/v1\ntime {timestamp}\n{text}".encode()


@dataclass(frozen=True)
class Cosigner:
    """A witness's signing key under its name (`loopwarden witness serve`)."""

    name: str
    signing_key: nacl.signing.SigningKey

    def __post_init__(self) -> None:
        if not valid_name(self.name):
            raise ValueError(f"{self.name!r} is not a signed-note key name")

    @property
    def vkey(self) -> VerifierKey:
        return VerifierKey(self.name, COSIGNATURE_V1, bytes(self.signing_key.verify_key))

    def cosign(self, text: str, timestamp: int) -> str:
        """The cosignature line (ending in a newline) on the checkpoint whose note text is
        `text`, at POSIX time `timestamp` (never 0: tlog-witness forbids omitting it)."""
        if not 0 < timestamp <= MAX_TIMESTAMP:
            raise ValueError("a cosignature's timestamp is a positive POSIX time")
        signature = self.signing_key.sign(signed_message(text, timestamp)).signature
        blob = self.vkey.key_hash + struct.pack(">Q", timestamp) + signature
        return f"{SIG_PREFIX}{self.name} {base64.b64encode(blob).decode('ascii')}\n"


@dataclass(frozen=True)
class Cosignature:
    """A cosignature line read against a witness's key: its timestamp, and whether it
    verifies over the checkpoint text it was checked with."""

    witness: VerifierKey
    timestamp: int
    verified: bool


def matches(vkey: VerifierKey, name: str, blob: bytes) -> bool:
    """Whether a signature line (`name`, decoded `blob`) claims to be `vkey`'s: the name and
    the key hash both match (signed-note: a line matching only one is someone else's)."""
    return name == vkey.name and blob[:4] == vkey.key_hash


def check(vkey: VerifierKey, text: str, blob: bytes) -> Cosignature:
    """Check a cosignature `blob` that `matches` `vkey` against the checkpoint `text`."""
    if len(blob) != BLOB or vkey.kind != COSIGNATURE_V1:
        return Cosignature(vkey, 0, False)
    (timestamp,) = struct.unpack(">Q", blob[4:12])
    if timestamp > MAX_TIMESTAMP:
        return Cosignature(vkey, timestamp, False)
    try:
        nacl.signing.VerifyKey(vkey.public_key).verify(signed_message(text, timestamp), blob[12:])
    except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
        return Cosignature(vkey, timestamp, False)
    return Cosignature(vkey, timestamp, True)
