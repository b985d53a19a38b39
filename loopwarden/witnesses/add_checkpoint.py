"""The `add-checkpoint` request of C2SP tlog-witness, both ways.

    POST <submission prefix>/add-checkpoint

    old <size>\\n
    <base64 consistency proof hash>\\n        (0 to 63 lines, RFC 6962 §2.1.2)
    \\n
    <checkpoint: a signed note>

Answers: 200 with cosignature lines; 400 (old size above the checkpoint's, or malformed), 403
(no signature from a trusted log key, or one that fails), 404 (unknown origin), 409 (the old
size is not the witness's: the body is its size and a newline, `text/x.tlog.size`), 422 (a
consistency proof that does not verify, a same-size root that differs, a bad empty tree).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

PATH = "/add-checkpoint"
SIZE_TYPE = "text/x.tlog.size"
MAX_PROOF = 63
MAX_BODY = 64 * 1024


@dataclass(frozen=True)
class Submission:
    old: int
    proof: tuple[bytes, ...]
    note: str


def encode(old: int, proof: list[bytes], note: str) -> bytes:
    """The request body for a checkpoint `note` with a consistency proof from size `old`."""
    if len(proof) > MAX_PROOF:
        raise ValueError("a consistency proof has at most 63 hashes")
    lines = [f"old {old}\n", *(base64.b64encode(h).decode("ascii") + "\n" for h in proof)]
    return ("".join(lines) + "\n" + note).encode()


def _decimal(text: str) -> int:
    if not text.isascii() or not text.isdigit() or str(int(text)) != text:
        raise ValueError("a size is a decimal with no leading zeroes")
    return int(text)


def decode(body: bytes) -> Submission:
    """Parse a request body; `ValueError` (a 400) if it is not one."""
    if len(body) > MAX_BODY:
        raise ValueError("the request is too large")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the request is not UTF-8") from None
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise ValueError("no empty line before the checkpoint")
    lines = head.split("\n")
    if not lines[0].startswith("old "):
        raise ValueError("the first line is `old <size>`")
    old = _decimal(lines[0][4:])
    if len(lines) - 1 > MAX_PROOF:
        raise ValueError("more than 63 consistency proof lines")
    try:
        proof = tuple(base64.b64decode(line, validate=True) for line in lines[1:])
    except binascii.Error:
        raise ValueError("a proof line is not base64") from None
    if any(len(h) != 32 for h in proof):
        raise ValueError("a proof line is not a SHA-256 hash")
    return Submission(old, proof, note)


def parse_size(body: bytes) -> int:
    """A 409 answer's body: the witness's size and a newline; `ValueError` if not that."""
    text = body.decode("ascii", errors="replace")
    if not text.endswith("\n"):
        raise ValueError("a size answer ends in a newline")
    return _decimal(text[:-1])
