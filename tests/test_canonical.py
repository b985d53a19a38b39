"""The canonicalizer's fast path writes exactly the bytes of the `rfc8785` reference.

`canonical_bytes` sends most values through the C JSON encoder after a domain check, and the
rest to `rfc8785`. Every test here compares the two byte for byte (or both refuse): every code
point, in strings and in keys; floats of every exponent, in and out of the domain, and at its
edges; integers at the IEEE-754 limit; random nested values; and every receipt body release
0.1.0 signed. And timestamps keep the one form receipts carry.
"""

from __future__ import annotations

import json
import math
import sqlite3
import struct
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden import canonical
from loopwarden.canonical import MAX_EXACT_INT, canonical_bytes
from loopwarden.clock import format_time, parse_time
from loopwarden.errors import SealError
from loopwarden.kernel.log.seals import parse_envelope

RELEASE_DB = Path(__file__).parent / "fixtures" / "release-0.1.0" / "loopwarden.db"


def reference(value: Any) -> bytes | None:
    """What `rfc8785` writes, or None where it refuses."""
    try:
        return rfc8785.dumps(value)
    except (ValueError, TypeError):  # CanonicalizationError and UnicodeEncodeError are ValueErrors
        return None


def ours(value: Any) -> bytes | None:
    try:
        return canonical_bytes(value)
    except SealError:
        return None


def same(value: Any) -> None:
    expected = reference(value)
    assert ours(value) == expected, f"{value!r}: ours {ours(value)!r}, rfc8785 {expected!r}"


def fast(value: Any) -> bool:
    """Whether `value` takes the fast path (the reference is not consulted): it is in the
    domain, and its bytes encode (a lone surrogate passes the domain check, not the encoding)."""
    try:
        canonical._ENCODE(canonical._plain(value)).encode("utf-8")
    except (canonical._Outside, UnicodeEncodeError):
        return False
    return True


# --- code points ------------------------------------------------------------------------------

CHUNK = 4096
SURROGATES = range(0xD800, 0xE000)


def test_every_code_point_is_escaped_or_written_exactly_as_the_reference_does():
    # Each chunk of code points is one string; one differing byte anywhere fails its chunk.
    checked = 0
    for start in range(0, sys.maxunicode + 1, CHUNK):
        chars = [chr(c) for c in range(start, min(start + CHUNK, sys.maxunicode + 1))]
        text = "".join(c for c in chars if ord(c) not in SURROGATES)
        if not text:
            continue
        assert fast(text) and fast([text]) and fast({"k": text})
        for value in (text, [text], {"k": text}):
            expected = reference(value)
            assert expected is not None
            assert canonical_bytes(value) == expected, f"code points from U+{start:04X}"
        checked += len(text)
    assert checked == sys.maxunicode + 1 - len(SURROGATES)


def test_every_ascii_code_point_as_a_key_sorts_and_escapes_as_the_reference():
    value = {chr(c): c for c in range(128)}
    assert fast(value)
    assert canonical_bytes(value) == rfc8785.dumps(value)
    pairs = {chr(c) + chr(d): 0 for c in range(32, 128, 7) for d in range(0, 128, 5)}
    assert canonical_bytes(pairs) == rfc8785.dumps(pairs)


def test_lone_surrogates_are_refused_like_the_reference_refuses_them():
    for c in SURROGATES:
        for value in (chr(c), "a" + chr(c) + "b", {"k": chr(c)}, {chr(c): 1}):
            assert reference(value) is None
            with pytest.raises(SealError):
                canonical_bytes(value)


def test_keys_outside_ascii_go_to_the_reference_which_sorts_them_by_utf16_units():
    # U+FF61 sorts before U+1F600 by code point but after it by UTF-16 unit (0xD83D).
    value = {"\U0001f600": 1, "\uff61": 2, "é": 3, "a": 4}
    assert not fast(value)
    assert canonical_bytes(value) == rfc8785.dumps(value)
    assert canonical_bytes(value).index("\uff61".encode()) > canonical_bytes(value).index(
        "\U0001f600".encode()
    )


# --- numbers ----------------------------------------------------------------------------------

EDGES = [
    0.0,
    -0.0,
    1e-4,
    math.nextafter(1e-4, 0),
    math.nextafter(1e-4, 1),
    1e-6,
    1e-7,
    5e-324,
    2.2250738585072014e-308,
    1e16,
    math.nextafter(1e16, 0),
    1e21,
    math.nextafter(1e21, 0),
    1.7976931348623157e308,
    float(MAX_EXACT_INT),
    float(MAX_EXACT_INT + 1),
    float(2**53 + 2),
    0.1,
    0.5,
    30.0,
    12.5,
    0.0123,
    123456789.123,
    4503599627370495.5,
    math.nan,
    math.inf,
]


@pytest.mark.parametrize("number", EDGES + [-x for x in EDGES], ids=repr)
def test_floats_at_the_edges_of_the_domain_match_the_reference(number):
    same(number)
    same({"x": number, "y": [number]})


def test_integers_at_the_ieee_limit_match_the_reference_or_are_refused_with_it():
    for n in (0, 1, -1, MAX_EXACT_INT, -MAX_EXACT_INT, MAX_EXACT_INT + 1, -MAX_EXACT_INT - 1):
        same(n)
        same([n, {"n": n}])
    assert ours(MAX_EXACT_INT + 1) is None and ours(-(2**53)) is None


def test_the_fast_path_takes_the_numbers_receipts_carry():
    # If these went to the reference, every property below would pass without testing anything.
    assert fast({"cost_usd": 0.0123, "wall_seconds": 30.0, "tokens": 4200, "zero": 0.0})
    assert not fast(1e-5) and not fast(1e16) and not fast(math.nan) and not fast(2**53)


@settings(max_examples=3000, deadline=None)
@given(bits=st.integers(min_value=0, max_value=2**64 - 1))
def test_a_float_of_any_bit_pattern_matches_the_reference(bits):
    (number,) = struct.unpack("<d", struct.pack("<Q", bits))
    same(number)


@settings(max_examples=1500, deadline=None)
@given(number=st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True))
def test_any_float_matches_the_reference(number):
    same(number)
    same([number, -number])


@settings(max_examples=1000, deadline=None)
@given(
    number=st.one_of(
        st.floats(min_value=1e-4, max_value=MAX_EXACT_INT),
        st.floats(min_value=-MAX_EXACT_INT, max_value=-1e-4),
        st.integers(min_value=-MAX_EXACT_INT, max_value=MAX_EXACT_INT).map(float),
    )
)
def test_floats_inside_the_domain_take_the_fast_path_and_match(number):
    assert fast(number)
    assert canonical_bytes(number) == rfc8785.dumps(number)


@settings(max_examples=500, deadline=None)
@given(number=st.integers(min_value=-(2**60), max_value=2**60))
def test_any_integer_matches_the_reference(number):
    same(number)


# --- nested values ----------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**54), max_value=2**54),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(exclude_categories=()), max_size=12),
)
KEYS = st.one_of(
    st.text(st.characters(max_codepoint=127, exclude_categories=()), max_size=8),
    st.text(st.characters(exclude_categories=()), max_size=4),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(KEYS, inner, max_size=5),
    ),
    max_leaves=30,
)


@settings(max_examples=700, deadline=None)
@given(value=VALUES)
def test_any_nested_value_matches_the_reference_byte_for_byte(value):
    same(value)


@settings(max_examples=300, deadline=None)
@given(value=VALUES)
def test_exact_canonical_bytes_read_back_as_themselves_and_the_fast_path_always_does(value):
    # What seal() signs (`exact=True`) must read back as the same bytes, or the receipt could
    # never verify. The fast path's domain guarantees it without the re-read.
    try:
        data = canonical_bytes(value, exact=True)
    except SealError:
        assert not fast(value)
        return
    assert canonical_bytes(json.loads(data)) == data
    assert data == reference(value)


@pytest.mark.parametrize("number", [2.0**53, 1e16, -1e17, 1e20], ids=repr)
def test_exact_refuses_integral_floats_the_reference_writes_as_unsafe_integers(number):
    assert reference(number) is not None  # the reference writes digits ...
    assert ours(number) == reference(number)
    with pytest.raises(SealError, match="round trip"):  # ... that read back as another value
        canonical_bytes({"x": number}, exact=True)
    assert canonical_bytes(1e21, exact=True) == b"1e+21"  # an exponent reads back as a float


def test_values_of_other_types_go_to_the_reference():
    from enum import IntEnum, StrEnum

    class Colour(StrEnum):
        RED = "red"

    class Level(IntEnum):
        HIGH = 3

    for value in ({"c": Colour.RED}, [Level.HIGH], object(), {1: "x"}, b"x", {"s": {1}}):
        assert not fast(value)
        same(value)


def test_a_value_nested_too_deep_fails_as_it_did_with_the_reference():
    deep: Any = []
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    with pytest.raises(RecursionError):
        rfc8785.dumps(deep)
    with pytest.raises(RecursionError):
        canonical_bytes(deep)


# --- receipts signed before the fast path ----------------------------------------------------


def test_every_receipt_release_0_1_0_signed_is_its_body_s_canonical_bytes():
    conn = sqlite3.connect(f"file:{RELEASE_DB}?mode=ro", uri=True)
    try:
        envelopes = [bytes(r[0]) for r in conn.execute("SELECT envelope FROM journal")]
    finally:
        conn.close()
    assert len(envelopes) == 32
    taken = 0
    for raw in envelopes:
        parsed = parse_envelope(raw)
        assert parsed is not None
        body = json.loads(parsed.payload)
        assert canonical_bytes(body) == parsed.payload
        assert canonical_bytes(json.loads(raw)) == raw
        taken += fast(body)
    assert taken == len(envelopes)


# --- timestamps -------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(
    when=st.datetimes(
        min_value=datetime(1000, 1, 2),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7))]),
    )
)
def test_receipt_timestamps_render_as_strftime_renders_them(when):
    # format_time renders with isoformat (faster); every signed `at` must keep its exact form.
    assert format_time(when) == when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert parse_time(format_time(when)) == when
