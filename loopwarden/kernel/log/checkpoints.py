"""Signed checkpoints in C2SP form (tlog-checkpoint body inside a signed note).

    <origin>\n<tree size>\n<base64 root hash>\n
    \n
    — <origin> <base64(key hash[4] || Ed25519 signature[64])>\n
    — <witness name> <base64(cosignature)>\n        (any number: tlog-cosignature)

The log signs under its origin as the key name (tlog-checkpoint: the key name SHOULD match the
origin; tlog-policy: a log's vkey name MUST), so the key hash is the first four bytes of
SHA-256(origin || 0x0A || 0x01 || public key), as the signed-note spec defines for Ed25519.
Which loopwarden key signed is told by that hash. Checkpoints signed before loopwarden 0.x
named the key id instead; they still open. Signature lines from keys that are not the log's
(witness cosignatures, unknown keys) are ignored here, as the signed-note spec requires: they
are the witnesses' business (`loopwarden/witnesses/`).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from loopwarden.kernel.log.keys import SIG_PREFIX, Keyring, Signer, note_key_hash

MAX_SIGNATURES = 64
"""Signature lines a checkpoint may carry (signed-note: verifiers MUST accept at least 16)."""


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    return f"{origin}\n{size}\n{base64.b64encode(root).decode('ascii')}\n"


def sign_checkpoint(origin: str, size: int, root: bytes, signer: Signer) -> str:
    """The full signed note for (origin, size, root), signed under the origin's key name."""
    body = checkpoint_body(origin, size, root)
    signature = signer.sign(body.encode())
    blob = note_key_hash(origin, signer.public_key) + signature
    return f"{body}\n{SIG_PREFIX}{origin} {base64.b64encode(blob).decode('ascii')}\n"


def cosigned_note(note: str, lines: list[str]) -> str:
    """A checkpoint's note with witnesses' cosignature lines (each ending in a newline) after
    its signatures; a line the note holds already is not added twice."""
    return note + "".join(line for line in dict.fromkeys(lines) if line not in note)


@dataclass(frozen=True)
class NoteParts:
    """A signed note split as the signed-note spec splits it: the text (ending in a newline)
    and each signature line's key name and decoded blob, in order."""

    text: str
    signatures: tuple[tuple[str, bytes], ...]


def split_note(note: str) -> NoteParts:
    """Split a signed note; `ValueError` if it is not one (the text is separated from the
    signatures by the last blank line; every signature line is `— <name> <base64>`; names have
    no spaces and no `+`; no control characters but newlines)."""
    if not note.endswith("\n") or any(ord(c) < 0x20 and c != "\n" for c in note):
        raise ValueError("not a signed note")
    cut = note.rfind("\n\n")
    if cut < 0:
        raise ValueError("not a signed note")
    text, lines = note[: cut + 1], note[cut + 2 :].split("\n")[:-1]
    if not lines or len(lines) > MAX_SIGNATURES:
        raise ValueError("a signed note has 1 to 64 signature lines")
    signatures = []
    for line in lines:
        if not line.startswith(SIG_PREFIX):
            raise ValueError("a signature line starts with an em dash and a space")
        parts = line[len(SIG_PREFIX) :].split(" ")
        if len(parts) != 2 or not parts[0] or "+" in parts[0] or any(c.isspace() for c in parts[0]):
            raise ValueError("a signature line is a key name and a signature")
        blob = base64.b64decode(parts[1], validate=True)
        if len(blob) < 5:
            raise ValueError("a signature is a key hash and a signature")
        signatures.append((parts[0], blob))
    return NoteParts(text, tuple(signatures))


def parse_checkpoint_text(text: str) -> tuple[str, int, bytes]:
    """(origin, size, root) of a checkpoint's note text; `ValueError` if it is not one."""
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
        raise ValueError("a checkpoint is at least three non-empty lines")
    origin, size_text, root_text = lines[0], lines[1], lines[2]
    root = base64.b64decode(root_text, validate=True)
    if not size_text.isdigit() or str(int(size_text)) != size_text or len(root) != 32:
        raise ValueError("bad size or root")
    return origin, int(size_text), root


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    key_id: str | None
    verified: bool
    problem: str | None = None


def _log_key(name: str, key_hash: bytes, origin: str, keyring: Keyring) -> str | None:
    """The trusted key a signature line names: under the origin (by its key hash), or under a
    key id (checkpoints signed before the origin was the key name)."""
    for key_id, public in keyring.public_keys().items():
        if name == origin and key_hash == note_key_hash(origin, public):
            return key_id
        if name == key_id and key_hash == note_key_hash(key_id, public):
            return key_id
    return None


def open_checkpoint(note: str, keyring: Keyring) -> Checkpoint:
    """Parse a signed checkpoint and verify the log's signature. Never raises.

    Problems: `checkpoint_malformed`, `unknown_key` (no signature line from a trusted log key),
    `signature_invalid` (a line whose name and key hash are a trusted key's does not verify:
    the whole note is rejected, as signed-note advises). Other lines are ignored.
    """
    try:
        parts = split_note(note)
        origin, size, root = parse_checkpoint_text(parts.text)
    except (ValueError, binascii.Error):
        return Checkpoint("", 0, b"", None, False, "checkpoint_malformed")
    message = parts.text.encode()
    verified: str | None = None
    for name, blob in parts.signatures:
        key_id = _log_key(name, blob[:4], origin, keyring)
        if key_id is None:
            continue
        if len(blob) != 68:
            return Checkpoint("", 0, b"", None, False, "checkpoint_malformed")
        if not keyring.verify(key_id, message, blob[4:]):
            return Checkpoint(origin, size, root, key_id, False, "signature_invalid")
        verified = verified or key_id
    if verified is None:
        names = [name for name, _ in parts.signatures]
        return Checkpoint(origin, size, root, names[0] if names else None, False, "unknown_key")
    return Checkpoint(origin, size, root, verified, True)
