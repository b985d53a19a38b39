"""Verifier keys (C2SP signed-note `vkey`s) and the key hashes signature lines carry.

    <key name>+<hex(32-bit key hash)>+<base64(signature type || public key)>

Two signature types are used: `0x01`, Ed25519 over the note text (how loopwarden signs its
checkpoints, under the log's origin as the key name), and `0x04`, a timestamped Ed25519
cosignature (tlog-cosignature: how a witness signs). The key hash is
SHA-256(name || 0x0A || type || public key)[:4] for both.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

ED25519 = 0x01
COSIGNATURE_V1 = 0x04


def key_hash(name: str, kind: int, public_key: bytes) -> bytes:
    """The 4-byte key hash of a signed-note key (the vkey's hex part, a signature's prefix)."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public_key).digest()[:4]


def valid_name(name: str) -> bool:
    """A signed-note key name: non-empty, no Unicode space, no `+`, no control character."""
    return bool(name) and "+" not in name and not any(c.isspace() or ord(c) < 0x20 for c in name)


@dataclass(frozen=True)
class VerifierKey:
    """A parsed vkey: key name, signature type and 32-byte Ed25519 public key."""

    name: str
    kind: int
    public_key: bytes

    @property
    def key_hash(self) -> bytes:
        return key_hash(self.name, self.kind, self.public_key)

    def __str__(self) -> str:
        material = base64.b64encode(bytes([self.kind]) + self.public_key).decode("ascii")
        return f"{self.name}+{self.key_hash.hex()}+{material}"


def parse_vkey(text: str, *, kind: int | None = None) -> VerifierKey:
    """Parse a vkey; `ValueError` with the reason if it is not one, if its hash does not match
    its name and key, if its type is not an Ed25519 one, or is not `kind` when given."""
    parts = text.strip().split("+", 2)  # the base64 key may hold a `+` itself
    if len(parts) != 3:
        raise ValueError("a verifier key is NAME+HASH+KEY")
    name, hash_hex, material_b64 = parts
    if not valid_name(name):
        raise ValueError(f"{name!r} is not a signed-note key name")
    try:
        hashed = bytes.fromhex(hash_hex)
        material = base64.b64decode(material_b64, validate=True)
    except (ValueError, binascii.Error):
        raise ValueError("a verifier key's hash is hex and its key base64") from None
    if len(hash_hex) != 8 or len(hashed) != 4:
        raise ValueError("a verifier key's hash is 8 hex digits")
    if len(material) != 33 or material[0] not in (ED25519, COSIGNATURE_V1):
        raise ValueError("only Ed25519 keys (signature types 0x01 and 0x04) are supported")
    vkey = VerifierKey(name, material[0], material[1:])
    if vkey.key_hash != hashed:
        raise ValueError("the verifier key's hash does not match its name and key")
    if kind is not None and vkey.kind != kind:
        raise ValueError(f"expected a signature type 0x{kind:02x} verifier key")
    return vkey
