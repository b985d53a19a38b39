"""How the journal stores a receipt envelope: its parts in binary, not the envelope's text.

A receipt's envelope is DSSE JSON: the payload and the signature base64-encoded inside it
(`receipts.envelope_bytes`). Its bytes are a function of three parts — the canonical payload,
the key id and the 64-byte signature — so the journal stores those (`packed`), and every read
builds the envelope back (`unpacked`): the bytes a verifier, an export or a bundle sees are the
ones that were signed and hashed into the Merkle tree, byte for byte.

The payload is stored deflated against a fixed dictionary of the receipt schema's own keys and
values (`DICTIONARY`): a tool call's two receipts take about 230 bytes of payload each instead
of about 900 of base64 text. The dictionary is part of the stored format and never changes; the
payload's first byte names its format (`RAW` or `DEFLATED`), so a later format can join without
rewriting a row.

An envelope that is not exactly what the template gives for its parts (a hand edit, another
tool's envelope, a store damaged before an upgrade) is kept whole in the `envelope` column and
read back as it is, so the audit judges exactly what is stored; a packed row leaves that column
empty. Nothing here raises on stored bytes: parts that do not build an envelope read back as an
empty one, which the audit reports (it matches no digest and parses as no envelope).
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from loopwarden.errors import SealError
from loopwarden.kernel.log.seals import PAYLOAD_TYPE, envelope_bytes, parse_envelope

RAW = 0
"""Payload format: the canonical bytes as they are."""
DEFLATED = 1
"""Payload format: raw deflate (2 KiB window) against `DICTIONARY`."""

MAX_INFLATED = 16 * 1024 * 1024
"""The largest payload stored `DEFLATED`; a larger one is stored `RAW`. So no stored payload
ever needs more than this to inflate, and a reader refuses to: a few kilobytes a database
writer planted that would inflate to gigabytes read as no envelope, not as an exhausted
memory."""

_WINDOW = -11  # raw deflate, no zlib header: the format byte says what it is
_MEMORY = 4  # a small compressor state: most of the cost of a small payload is setting it up
_LEVEL = 6

DICTIONARY = (
    b'{"approval_id":"appr-","approved":true,"artifact_digest":"sha256:","expires_at":"'
    b'","reason":"","closed_turns":[],"detail":"","idempotency_key":"","kind":"loop.stopped'
    b'","loop.completed","loop.opened","objective":"","policy":{"agents":["*"],"budgets":{"'
    b'max_turns":,"claims":{"lease_seconds":,"tools":{"allow":["fs.*","shell.run"],"todos":'
    b'[{"depends_on":[],"id":"","title":""}]"approval.requested","approval.decided","pools":[]'
    b',"claim.refused","turn.refused","tool.refused","enforced":true,"command_denied","tool_denied'
    b'","policy_violation","loop_not_active","message":"","code":"","evidence":[{"kind":"test'
    b'","summary":""}],"outcome":"completed","tool_calls_before":0,"tool_calls_charged":,"'
    b'tools_used":[{"count":1,"name":"fs.read"},{"count":1,"name":"fs.write"}],"usage":{"'
    b'cost_usd":0.0,"input_tokens":,"model_calls":1,"output_tokens":,"tool_calls":,"'
    b'wall_seconds":},"closes_turn":true,"kind":"turn.reported","approval_ids":[],"'
    b'allowed_tools":["fs.read","fs.write"],"approval_tools":[],"fence":1,"lease_expires_at":"'
    b'2026-01-01T00:00:00.000000Z","kind":"turn.claimed","host.attached","role":"agent"},"'
    b'{"at":"2026-01-01T00:00:00.000000Z","data":{"charged":false,"enforced":false,"errored":'
    b'false,"host":"claude-code","host_tool":"Bash","input_digest":"sha256:","response_digest'
    b'":"sha256:","session_id":"","tool":"shell.run","tool_use_id":"toolu_"},"decision":{"'
    b'effect":"allow","reasons":[]},"kind":"tool.admitted","kind":"tool.observed","loop_id":"'
    b'","policy_digest":"sha256:","prev":"sha256:","principal":{"id":"","role":"observer"},"'
    b'schema":"loopwarden.receipt/v1","seq":,"todo_id":"","turn_id":"turn-'
)
"""The deflate dictionary of `DEFLATED` payloads: the receipt schema's keys and common values,
the most frequent (a tool call's receipts) last, where deflate reaches them cheapest. Part of
every stored payload: never edit it (a new dictionary is a new format byte)."""


class Parts(NamedTuple):
    """An envelope as the journal stores it, in the columns' order."""

    envelope: bytes  # the whole envelope when it is not rebuilt from the rest, else empty
    payload: bytes | None  # format byte + payload
    key_id: str | None
    signature: bytes | None


def packed(envelope: object) -> Parts:
    """The stored parts of `envelope` (bytes, or a stored value the database returns): its
    payload, key id and signature when the template builds exactly these bytes back from them,
    else the envelope itself."""
    envelope = _bytes(envelope)
    found = parse_envelope(envelope)
    if (
        found is not None
        and found.payload_type == PAYLOAD_TYPE
        and envelope_bytes(found.payload, found.key_id, found.signature) == envelope
    ):
        return Parts(b"", deflated(found.payload), found.key_id, found.signature)
    return Parts(envelope, None, None, None)


def unpacked(envelope: object, payload: object, key_id: object, signature: object) -> bytes:
    """The envelope a row's parts store (values as the database returns them)."""
    whole = _bytes(envelope)
    if whole or payload is None or key_id is None or signature is None:
        return whole
    body = inflated(_bytes(payload))
    if body is None:
        return b""
    try:
        return envelope_bytes(body, str(key_id), _bytes(signature))
    except (SealError, ValueError, TypeError, UnicodeError):  # a key id no envelope can carry
        return b""


def deflated(payload: bytes) -> bytes:
    if len(payload) > MAX_INFLATED:
        return bytes([RAW]) + payload
    squeeze = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WINDOW, _MEMORY, zdict=DICTIONARY)
    small = squeeze.compress(payload) + squeeze.flush()
    if len(small) >= len(payload):
        return bytes([RAW]) + payload
    return bytes([DEFLATED]) + small


def inflated(stored: bytes) -> bytes | None:
    """A stored payload's canonical bytes, or None if they cannot be read."""
    if not stored:
        return None
    if stored[0] == RAW:
        return stored[1:]
    if stored[0] != DEFLATED:
        return None
    try:
        grow = zlib.decompressobj(_WINDOW, zdict=DICTIONARY)
        body = grow.decompress(stored[1:], MAX_INFLATED + 1)
        if len(body) > MAX_INFLATED or grow.unconsumed_tail:
            return None  # more than loopwarden ever deflates: not its payload
        body += grow.flush()
    except zlib.error:
        return None
    whole = grow.eof and not grow.unused_data and len(body) <= MAX_INFLATED
    return body if whole else None


def _bytes(value: object) -> bytes:
    # A hand edit may leave TEXT where bytes belong; the audit must see bytes either way.
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return str(value).encode("utf-8", "surrogatepass")
