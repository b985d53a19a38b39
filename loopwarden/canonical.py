"""Canonical bytes and digests: the single place where values become the bytes we hash and sign.

RFC 8785 (JSON Canonicalization Scheme) via the `rfc8785` package. Serialization failures raise
`SealError`: we never hash "nothing".
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

from loopwarden.errors import SealError

DIGEST_PREFIX = "sha256:"


def canonical_bytes(value: Any) -> bytes:
    """Return the RFC 8785 bytes of a JSON-native value (dict, list, str, int, float, bool, None).

    Raises `SealError` for values JCS cannot represent (NaN, infinities, non-string keys, integers
    beyond IEEE-754 precision, arbitrary objects) and for empty output.
    """
    try:
        data = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise SealError(f"value cannot be canonicalized: {exc}") from exc
    if not data:
        raise SealError("canonicalization produced no bytes")
    return data


def sha256_digest(data: bytes) -> str:
    """`sha256:` + lowercase hex of SHA-256 over `data`."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """Digest of the canonical bytes of a JSON-native value."""
    return sha256_digest(canonical_bytes(value))
