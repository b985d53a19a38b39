"""Receipts stored as their parts (`kernel/sql/envelopes.py`): the journal keeps a
receipt's payload (deflated), key id and signature in binary, and every read builds the
envelope back byte for byte — what was signed and hashed into the Merkle tree is what a
verifier sees. An envelope its parts cannot rebuild is kept whole; stored parts edited outside
loopwarden are findings, never a crash; a store of the previous version is packed in place."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import zlib
from pathlib import Path

import pytest
from conftest import BUILDER
from support import ENVELOPE_PARTS, raw_sql_url, stored_envelope
from test_store import open_test_loop, work_one

from loopwarden.audit.database import audit
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.keys import KeyStore, Signer
from loopwarden.kernel.log.seals import seal
from loopwarden.kernel.sql import envelopes
from loopwarden.kernel.sql.envelopes import (
    DEFLATED,
    MAX_INFLATED,
    RAW,
    deflated,
    inflated,
    packed,
    unpacked,
)
from loopwarden.kernel.sql.upgrades import UPGRADES
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS

pytestmark = [pytest.mark.anyio]


# --- the format ------------------------------------------------------------------------------


def test_the_deflate_dictionary_is_the_one_every_stored_payload_was_written_with():
    # Every DEFLATED payload in every store inflates only against these bytes: an edit to the
    # dictionary must be a new format byte, never a change to this one.
    digest = hashlib.sha256(envelopes.DICTIONARY).hexdigest()
    assert digest == "3671e6ffe17ff22a6bb2025876de5d73ec56c08c6f40ad4b3437851c6252856b"


def _sealed(body: dict) -> bytes:
    signer = Signer.generate()
    return seal(body, signer).envelope


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "tool.admitted", "loop_id": "L1", "seq": 7, "data": {"tool": "shell.run"}},
        {"kind": "loop.opened", "objective": 'café ✓ \u2028 "quoted"', "seq": 1},
        {"kind": "x", "blob": base64.b64encode(bytes(range(256)) * 40).decode()},  # 13 KB
        {},
    ],
    ids=["tool-call", "non-ascii", "large", "empty"],
)
def test_a_sealed_envelope_is_stored_as_its_parts_and_read_back_byte_for_byte(body):
    envelope = _sealed(body)
    parts = packed(envelope)
    assert parts.envelope == b"" and parts.key_id and len(parts.signature or b"") == 64
    assert parts.payload is not None and parts.payload[0] in (RAW, DEFLATED)
    assert unpacked(*parts) == envelope


def test_a_payload_deflate_cannot_shrink_is_stored_raw_and_read_back():
    tiny = b"{}"
    stored = deflated(tiny)
    assert stored == bytes([RAW]) + tiny
    assert inflated(stored) == tiny


@pytest.mark.parametrize(
    "envelope",
    [
        b'{"payload": "e30=", "payloadType": "x", "signatures": []}',  # not a template envelope
        b"not json at all",
        b"",
    ],
    ids=["another-shape", "not-json", "empty"],
)
def test_an_envelope_its_parts_cannot_rebuild_is_kept_whole(envelope):
    assert packed(envelope) == (envelope, None, None, None)
    assert unpacked(*packed(envelope)) == envelope


def test_non_canonical_base64_or_spacing_is_kept_whole_not_normalised():
    good = _sealed({"kind": "k"})
    document = json.loads(good)
    spaced = json.dumps(document).encode()  # the same fields, other bytes
    padded = good.replace(b'=="', b'=\\u003d"')  # a JSON escape: the same string
    for other in (spaced, padded):
        assert other != good
        assert unpacked(*packed(other)) == other


@pytest.mark.parametrize(
    "parts",
    [
        (b"", b"\x01garbage that is not deflate", "k", bytes(64)),
        (b"", b"\x07unknown format", "k", bytes(64)),
        (b"", b"", "k", bytes(64)),
        (b"", None, None, None),
        (b"", deflated(b"{}"), "k\ud800", bytes(64)),  # a key id JSON cannot carry
    ],
    ids=["bad-deflate", "unknown-format", "empty-payload", "no-parts", "unencodable-key-id"],
)
def test_parts_that_build_no_envelope_read_back_as_an_empty_one_without_raising(parts):
    assert unpacked(*parts) == b""


def test_text_where_bytes_belong_is_read_as_its_bytes():
    envelope = _sealed({"kind": "k"})
    assert unpacked(envelope.decode(), None, None, None) == envelope
    parts = packed(envelope)
    assert unpacked("", memoryview(parts.payload), parts.key_id, bytearray(parts.signature)) == (
        envelope
    )


def test_a_payload_past_the_inflation_bound_is_stored_raw_and_a_planted_bomb_reads_as_nothing():
    big = b"x" * (MAX_INFLATED + 1)
    assert deflated(big)[0] == RAW and inflated(deflated(big)) == big
    # Deflate's own format, made by hand: 64 MiB of zeros in about 64 KB of stored bytes.
    squeeze = zlib.compressobj(9, zlib.DEFLATED, -11, 4, zdict=envelopes.DICTIONARY)
    bomb = bytes([DEFLATED]) + squeeze.compress(bytes(64 * 1024 * 1024)) + squeeze.flush()
    assert len(bomb) < 128 * 1024
    assert inflated(bomb) is None
    assert unpacked(b"", bomb, "k", bytes(64)) == b""


def test_a_deflated_payload_with_bytes_after_its_end_is_refused():
    stored = deflated(json.dumps({"kind": "tool.admitted", "seq": 3}).encode())
    assert stored[0] == DEFLATED
    assert inflated(stored + b"tail") is None


# --- a store -----------------------------------------------------------------------------------


async def _worked(home: Path, store_url: str, turns: int = 3) -> list[bytes]:
    """A store with a loop and `turns` completed turns; its envelopes in leaf order."""
    keys = KeyStore(home)
    store = await Store.open(
        store_url, keys.load_signer(), keyring=keys.keyring(), key_dir=home, kinds=KINDS
    )
    try:
        await open_test_loop(store, turns)
        for n in range(turns):
            assert await work_one(store, BUILDER, "L1", f"k{n}")
        await store.integrate()
        return await store.read(lambda r: [row.envelope for row in r.iter_journal()])
    finally:
        await store.close()


async def _reopened(home: Path, store_url: str) -> Store:
    keys = KeyStore(home)
    return await Store.open(
        store_url, keys.load_signer(), keyring=keys.keyring(), key_dir=home, kinds=KINDS
    )


def _rows(backend: str, store_url: str) -> list[tuple]:
    if backend == "sqlite":
        conn = sqlite3.connect(store_url)
    else:
        from loopwarden.kernel.sql.postgres import connect

        conn = connect(store_url)  # type: ignore[assignment]
    try:
        return [
            tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
            for row in conn.execute(
                f"SELECT leaf_index, digest, {ENVELOPE_PARTS} FROM journal ORDER BY leaf_index"
            ).fetchall()
        ]
    finally:
        conn.close()


@pytest.mark.backends
async def test_a_store_keeps_every_receipt_as_its_parts_and_proves_the_same_bytes(
    home, backend, store_url
):
    envelopes_read = await _worked(home, store_url)
    rows = _rows(backend, store_url)
    assert len(rows) == len(envelopes_read) == 8  # opened, 3 × (claimed, reported), completed
    for (_, digest, whole, payload, key_id, signature), envelope in zip(
        rows, envelopes_read, strict=True
    ):
        assert whole == b"" and key_id and len(signature) == 64
        assert stored_envelope(whole, payload, key_id, signature) == envelope
        assert "sha256:" + hashlib.sha256(envelope).hexdigest() == digest
        assert len(payload) + len(signature) < len(envelope) / 2
    store = await _reopened(home, store_url)
    try:
        leaves = await store.read(lambda r: [r.node(0, i) for i in range(len(rows))])
        assert leaves == [merkle.leaf_hash(e) for e in envelopes_read]
        report = await store.read(lambda r: audit(r, store.keyring, workers=0))
        assert report.findings == [], [f.as_dict() for f in report.findings]
    finally:
        await store.close()


@pytest.mark.backends
async def test_a_version_8_store_is_packed_in_place_and_reads_back_every_envelope_unchanged(
    home, backend, store_url
):
    before = await _worked(home, store_url)
    version = (
        "PRAGMA user_version = 8"
        if backend == "sqlite"
        else "UPDATE meta SET value = '8' WHERE key = 'schema_version'"
    )
    later = sorted((v for v in UPGRADES if v > 8), reverse=True)
    taken_back = [step.reverted() for v in later for step in reversed(UPGRADES[v])]
    raw_sql_url(backend, store_url, *taken_back, version)
    with pytest.raises(Exception, match="payload"):  # version 8 had no parts columns
        _rows(backend, store_url)
    # One envelope whose bytes the template does not give (spacing an old tool wrote, say):
    # the upgrade keeps it whole and the audit judges exactly those bytes.
    spaced = json.dumps(json.loads(before[2])).encode()
    raw_sql_url(
        backend,
        store_url,
        f"UPDATE journal SET envelope = {_hex(backend, spaced)} WHERE leaf_index = 2",
    )
    store = await _reopened(home, store_url)
    try:
        after = await store.read(lambda r: [row.envelope for row in r.iter_journal()])
        assert after == [*before[:2], spaced, *before[3:]]
        report = await store.read(lambda r: audit(r, store.keyring, workers=0))
        # The spaced bytes are what the audit judges: their digest is not the row's, the next
        # receipt's prev names the original, and the Merkle tree hashed the original.
        found = {(f.code, f.leaf_index) for f in report.findings}
        assert found == {
            ("digest_mismatch", 2),
            ("prev_mismatch", 3),
            ("frontier_mismatch", None),
            ("node_mismatch", None),
        }, found
    finally:
        await store.close()
    rows = _rows(backend, store_url)
    assert [r[2] for r in rows] == [b"", b"", spaced, *[b""] * (len(rows) - 3)]
    assert all(r[3] is None for r in rows if r[0] == 2)


def _hex(backend: str, value: bytes) -> str:
    return f"x'{value.hex()}'" if backend == "sqlite" else f"'\\x{value.hex()}'::bytea"


@pytest.mark.backends
async def test_stored_parts_edited_outside_loopwarden_are_findings(home, backend, store_url):
    before = await _worked(home, store_url)
    document = json.loads(before[3])
    body = json.loads(base64.b64decode(document["payload"]))
    body["principal"]["id"] = "someone-else"
    forged = deflated(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
    garbage = bytes([DEFLATED]) + b"garbage"
    raw_sql_url(
        backend,
        store_url,
        f"UPDATE journal SET payload = {_hex(backend, forged)} WHERE leaf_index = 3",
        f"UPDATE journal SET payload = {_hex(backend, garbage)} WHERE leaf_index = 5",
    )
    rows = _rows(backend, store_url)
    assert stored_envelope(*rows[5][2:]) == b""
    store = await _reopened_unchecked(home, store_url)
    try:
        report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    finally:
        await store.close()
    found = {(f.code, f.leaf_index) for f in report.findings}
    assert ("signature_invalid", 3) in found, found
    assert ("envelope_malformed", 5) in found, found


async def _reopened_unchecked(home: Path, store_url: str) -> Store:
    keys = KeyStore(home)
    return await Store.open(
        store_url,
        keys.load_signer(),
        keyring=keys.keyring(),
        key_dir=home,
        check=False,
        kinds=KINDS,
    )
