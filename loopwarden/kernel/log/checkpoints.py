"""Signed checkpoints in C2SP form (tlog-checkpoint body inside a signed note).

    <origin>\n<tree size>\n<base64 root hash>\n
    \n
    — <key name> <base64(key hash[4] || Ed25519 signature[64])>\n

The key name is the loopwarden key id; the key hash is the first four bytes of
SHA-256(key name || 0x0A || 0x01 || public key), as the signed-note spec defines for Ed25519.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from loopwarden.kernel.log.keys import SIG_PREFIX, Keyring, Signer, note_key_hash


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    return f"{origin}\n{size}\n{base64.b64encode(root).decode('ascii')}\n"


def sign_checkpoint(origin: str, size: int, root: bytes, signer: Signer) -> str:
    """The full signed note for (origin, size, root)."""
    body = checkpoint_body(origin, size, root)
    signature = signer.sign(body.encode())
    blob = note_key_hash(signer.key_id, signer.public_key) + signature
    return f"{body}\n{SIG_PREFIX}{signer.key_id} {base64.b64encode(blob).decode('ascii')}\n"


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    key_id: str | None
    verified: bool
    problem: str | None = None


def open_checkpoint(note: str, keyring: Keyring) -> Checkpoint:
    """Parse a signed checkpoint and verify its signature. Never raises.

    Problems: `checkpoint_malformed`, `unknown_key`, `signature_invalid`.
    """
    body, sep, signatures = note.partition("\n\n")
    lines = body.split("\n")
    try:
        if not sep or len(lines) < 3:
            raise ValueError("not a signed note")
        origin, size_text, root_text = lines[0], lines[1], lines[2]
        size = int(size_text)
        root = base64.b64decode(root_text, validate=True)
        if size < 0 or len(root) != 32 or str(size) != size_text:
            raise ValueError("bad size or root")
        sig_lines = [line for line in signatures.split("\n") if line]
        if len(sig_lines) != 1 or not sig_lines[0].startswith(SIG_PREFIX):
            raise ValueError("exactly one signature line expected")
        name, blob_text = sig_lines[0][len(SIG_PREFIX) :].split(" ")
        blob = base64.b64decode(blob_text, validate=True)
        if len(blob) != 68:
            raise ValueError("bad signature blob")
    except (ValueError, binascii.Error):
        return Checkpoint("", 0, b"", None, False, "checkpoint_malformed")
    message = (body + "\n").encode()
    if name not in keyring:
        return Checkpoint(origin, size, root, name, False, "unknown_key")
    public = keyring.public_keys()[name]
    ok = blob[:4] == note_key_hash(name, public) and keyring.verify(name, message, blob[4:])
    return Checkpoint(origin, size, root, name, ok, None if ok else "signature_invalid")
