"""Offline inclusion proofs in the C2SP tlog-proof format.

    c2sp.org/tlog-proof@v1
    [extra <base64>]
    index <leaf index>
    <base64 hash>                  (the RFC 6962 inclusion proof, the leaf's sibling first)
    (an empty line)
    <the checkpoint, verbatim: a signed note, its witnesses' cosignatures included>

A loopwarden bundle carries one per receipt (`audit/bundles.py`): with the receipt's envelope
as the logged entry (the leaf hash is RFC 6962's over its bytes), any tlog-proof verifier
checks it. The extra line is not used: a bundle keeps the envelope beside the proof.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

HEADER = "c2sp.org/tlog-proof@v1"


@dataclass(frozen=True)
class TlogProof:
    index: int
    proof: tuple[bytes, ...]
    checkpoint: str
    extra: bytes | None = None


def format_proof(index: int, proof: list[bytes], checkpoint: str) -> str:
    """The tlog-proof text for leaf `index` with its inclusion `proof` in `checkpoint`."""
    lines = [HEADER, f"index {index}", *(base64.b64encode(h).decode("ascii") for h in proof)]
    return "\n".join(lines) + "\n\n" + checkpoint


def parse_proof(text: str) -> TlogProof:
    """Parse a tlog-proof; `ValueError` if it is not one (the checkpoint is not checked)."""
    head, sep, checkpoint = text.partition("\n\n")
    if not sep:
        raise ValueError("no empty line before the checkpoint")
    lines = head.split("\n")
    if lines[0] != HEADER:
        raise ValueError(f"the first line is {HEADER}")
    rest = lines[1:]
    extra = None
    try:
        if rest and rest[0].startswith("extra "):
            extra = base64.b64decode(rest.pop(0)[6:], validate=True)
        if not rest or not rest[0].startswith("index "):
            raise ValueError("no index line")
        number = rest.pop(0)[6:]
        if not number.isascii() or not number.isdigit() or str(int(number)) != number:
            raise ValueError("the index is a decimal with no leading zeroes")
        proof = tuple(base64.b64decode(line, validate=True) for line in rest)
    except binascii.Error:
        raise ValueError("a line is not base64") from None
    if any(len(h) != 32 for h in proof):
        raise ValueError("a proof line is not a SHA-256 hash")
    return TlogProof(int(number), proof, checkpoint, extra)
