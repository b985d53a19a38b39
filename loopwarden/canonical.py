"""Canonical bytes and digests: the single place where values become the bytes we hash and sign.

RFC 8785 (JSON Canonicalization Scheme). The `rfc8785` package is the reference; most values
take a fast path through the C JSON encoder, which writes exactly the same bytes for every value
in a domain checked first (see `_plain`); anything outside it goes to `rfc8785`. Property tests
hold the two to the same bytes for every code point and for floats in and out of the domain.
Serialization failures raise `SealError`: we never hash "nothing".
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

from loopwarden.errors import SealError

DIGEST_PREFIX = "sha256:"
MAX_EXACT_INT = 2**53 - 1
"""The largest integer JCS (an IEEE-754 double) represents exactly."""

_FIXED_LOW, _FIXED_HIGH = 1e-4, 1e16
"""Non-integral floats in [1e-4, 1e16) print the same digits in Python and ECMAScript, without
an exponent (Python switches to one outside this range, ECMAScript only below 1e-6 / at 1e21)."""

_ENCODE = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode


class _Outside(Exception):
    """A value outside the fast path's domain: the reference canonicalizer decides."""


def _plain(value: Any) -> Any:
    """`value` as the C encoder must see it to write RFC 8785's bytes, or `_Outside`.

    The domain: exact `dict` / `list` / `tuple` / `str` / `bool` / `None` / `int` / `float`
    (subclasses such as enums go to the reference); object keys that are ASCII strings (so that
    sorting by code point is sorting by UTF-16 unit); integers within ±(2⁵³−1); integral floats
    within that range, written as the integer (ECMAScript writes `30`, Python `30.0`); other
    floats with 1e-4 ≤ |f| < 1e16. Strings need no check: both escape `"`, `\\` and the C0
    controls alike (the short escapes, else `\\u00xx` in lowercase) and write the rest as is
    (a lone surrogate fails UTF-8 encoding in both).
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -MAX_EXACT_INT <= value <= MAX_EXACT_INT:
            return value
        raise _Outside
    if kind is float:
        if value.is_integer():
            if -MAX_EXACT_INT <= value <= MAX_EXACT_INT:
                return int(value)
        elif _FIXED_LOW <= abs(value) < _FIXED_HIGH:  # False for NaN and the infinities
            return value
        raise _Outside
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str or not key.isascii():
                raise _Outside
            out[key] = _plain(item)
        return out
    if kind is list or kind is tuple:
        return [_plain(item) for item in value]
    raise _Outside


def canonical_bytes(value: Any, *, exact: bool = False) -> bytes:
    """Return the RFC 8785 bytes of a JSON-native value (dict, list, str, int, float, bool, None).

    Raises `SealError` for values JCS cannot represent (NaN, infinities, non-string keys, integers
    beyond IEEE-754 precision, lone surrogates, arbitrary objects) and for empty output. With
    `exact` (what is signed must verify as signed), also for bytes that would not read back as
    themselves: JCS writes the float 2.0**53 as `9007199254740992`, an integer beyond IEEE-754
    precision. Values in the fast path's domain read back by construction; others are re-read.
    """
    try:
        return _ENCODE(_plain(value)).encode("utf-8")
    except (_Outside, RecursionError, UnicodeEncodeError):
        pass
    data = _reference(value)
    if exact and _reread(data) != data:
        raise SealError("the value does not survive a JSON round trip as the same bytes")
    return data


def _reference(value: Any) -> bytes:
    try:
        data: bytes = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise SealError(f"value cannot be canonicalized: {exc}") from exc
    if not data:
        raise SealError("canonicalization produced no bytes")
    return data


def _reread(data: bytes) -> bytes | None:
    """The canonical bytes of `data` read back, or None if they cannot be made."""
    try:
        return canonical_bytes(json.loads(data))
    except (SealError, ValueError, RecursionError):
        return None


def sha256_digest(data: bytes) -> str:
    """`sha256:` + lowercase hex of SHA-256 over `data`."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """Digest of the canonical bytes of a JSON-native value."""
    return sha256_digest(canonical_bytes(value))
