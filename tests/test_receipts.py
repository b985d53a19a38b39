"""Receipts (DSSE + Ed25519), canonical bytes (RFC 8785), signed-note checkpoints and key files."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import nacl.signing
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.canonical import DIGEST_PREFIX, canonical_bytes, digest_of, sha256_digest
from loopwarden.errors import KeyFileError, SealError
from loopwarden.kernel.log import keys as keys_module
from loopwarden.kernel.log.checkpoints import (
    SIG_PREFIX,
    checkpoint_body,
    note_key_hash,
    open_checkpoint,
    sign_checkpoint,
)
from loopwarden.kernel.log.keys import (
    Keyring,
    KeyStore,
    Signer,
    decode_public_key,
    key_id_for,
    public_key_b64,
)
from loopwarden.kernel.log.seals import PAYLOAD_TYPE, open_envelope, pae, receipt_id_for, seal

VECTOR_DIR = Path(__file__).parent / "vectors"
DSSE = json.loads((VECTOR_DIR / "dsse.json").read_text())
NOTES = json.loads((VECTOR_DIR / "signed_note.json").read_text())
DSSE_KEYS = DSSE["testvectors"]["keys"]
DSSE_VECTORS = DSSE["testvectors"]["vectors"]
NOTE_VECTORS = NOTES["vectors"]

BODY = {
    "schema": "loopwarden.receipt/1",
    "loop_id": "loop-1",
    "seq": 1,
    "kind": "loop.opened",
    "at": "2026-01-01T00:00:00.000000Z",
    "decision": {"effect": "allow", "reasons": []},
    "data": {"cost_usd": 0.25, "objective": "ship it ✓"},
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64_any(text: str) -> bytes:
    """DSSE allows the standard or the URL-safe alphabet."""
    if "-" in text or "_" in text:
        return base64.urlsafe_b64decode(text)
    return base64.b64decode(text, validate=True)


def _flip(data: bytes, position: int = 0) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer.from_seed(hashlib.sha256(b"loopwarden test signer").digest())


@pytest.fixture(scope="module")
def other_signer() -> Signer:
    return Signer.from_seed(hashlib.sha256(b"loopwarden other signer").digest())


@pytest.fixture(scope="module")
def keyring(signer: Signer, other_signer: Signer) -> Keyring:
    return Keyring({signer.key_id: signer.public_key, other_signer.key_id: other_signer.public_key})


# --- canonical bytes (RFC 8785) ---------------------------------------------------------------


def test_canonical_bytes_sorts_keys_and_uses_shortest_number_forms():
    value = {"b": [1.0, 1e21, 0.5, -0.0], "a": {"é": "\u2028", "A": None}, "c": True}
    assert canonical_bytes(value) == (
        '{"a":{"A":null,"é":"\u2028"},"b":[1,1e+21,0.5,0],"c":true}'.encode()
    )


def test_canonical_bytes_is_independent_of_key_insertion_order():
    forward = {"a": 1, "b": {"x": 1, "y": 2}}
    backward = {"b": {"y": 2, "x": 1}, "a": 1}
    assert canonical_bytes(forward) == canonical_bytes(backward)
    assert digest_of(forward) == digest_of(backward)


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        {"cost": math.nan},
        [1, math.inf],
        object(),
        {"when": b"bytes"},
        {1: "non-string key"},
        {"set": {1, 2}},
        2**53 + 1,
    ],
    ids=[
        "nan",
        "inf",
        "-inf",
        "nested-nan",
        "nested-inf",
        "object",
        "bytes",
        "int-key",
        "set",
        "int-beyond-ieee",
    ],
)
def test_canonical_bytes_raises_seal_error_for_values_jcs_cannot_represent(value):
    with pytest.raises(SealError):
        canonical_bytes(value)


def test_digest_is_prefixed_sha256_of_canonical_bytes():
    data = canonical_bytes(BODY)
    assert sha256_digest(data) == DIGEST_PREFIX + hashlib.sha256(data).hexdigest()
    assert digest_of(BODY) == sha256_digest(data)
    assert digest_of(BODY) != digest_of({**BODY, "seq": 2})


# --- PAE: the DSSE spec vector and the published Ed25519 test vectors -------------------------


def test_pae_reproduces_the_dsse_spec_example():
    spec = DSSE["spec_example"]
    encoded = pae(spec["payloadType"], base64.b64decode(spec["payload_b64"]))
    assert encoded == spec["pae_text"].encode()
    assert encoded.hex() == spec["pae_hex"]


def test_dsse_spec_example_ecdsa_signature_verifies_over_our_pae():
    ec_mod = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ec")
    utils = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.utils")
    hashes = pytest.importorskip("cryptography.hazmat.primitives.hashes")
    spec = DSSE["spec_example"]
    key = spec["key"]
    public = ec_mod.EllipticCurvePublicNumbers(
        int(key["X"]), int(key["Y"]), ec_mod.SECP256R1()
    ).public_key()
    raw = base64.b64decode(spec["envelope"]["signatures"][0]["sig"])
    der = utils.encode_dss_signature(int.from_bytes(raw[:32]), int.from_bytes(raw[32:]))
    message = pae(spec["payloadType"], base64.b64decode(spec["payload_b64"]))
    public.verify(der, message, ec_mod.ECDSA(hashes.SHA256()))  # raises InvalidSignature
    exceptions = pytest.importorskip("cryptography.exceptions")
    with pytest.raises(exceptions.InvalidSignature):
        public.verify(der, message + b" ", ec_mod.ECDSA(hashes.SHA256()))


def test_pae_counts_bytes_not_characters():
    assert pae("ä", b"\xff") == b"DSSEv1 2 \xc3\xa4 1 \xff"
    assert pae("", b"") == b"DSSEv1 0  0 "


@pytest.mark.parametrize(
    "vector", [v for v in DSSE_VECTORS if v["id"] != "payload-type-swapped"], ids=lambda v: v["id"]
)
def test_pae_of_envelope_type_and_payload_reproduces_published_pae(vector):
    envelope = vector["envelope"]
    assert pae(envelope["payloadType"], _b64_any(envelope["payload"])).hex() == vector["pae"]


def test_pae_of_swapped_payload_type_differs_from_what_was_signed():
    vector = next(v for v in DSSE_VECTORS if v["id"] == "payload-type-swapped")
    payload = _b64_any(vector["envelope"]["payload"])
    assert pae(vector["envelope"]["payloadType"], payload).hex() != vector["pae"]
    assert pae("application/vnd.in-toto+json", payload).hex() == vector["pae"]


@pytest.mark.parametrize("name", sorted(DSSE_KEYS))
def test_signer_from_rfc8032_seed_has_the_published_public_key(name):
    key = DSSE_KEYS[name]
    assert Signer.from_seed(bytes.fromhex(key["seed"])).public_key.hex() == key["public"]


def test_signer_reproduces_the_published_single_signature_byte_for_byte():
    vector = next(v for v in DSSE_VECTORS if v["id"] == "single-signature")
    signer_a = Signer.from_seed(bytes.fromhex(DSSE_KEYS["A"]["seed"]))
    signature = signer_a.sign(bytes.fromhex(vector["pae"]))
    assert signature == _b64_any(vector["envelope"]["signatures"][0]["sig"])


def _dsse_keyring(names: list[str]) -> tuple[Keyring, dict[str, str]]:
    ring = Keyring()
    ids = {name: ring.add(bytes.fromhex(DSSE_KEYS[name]["public"])) for name in names}
    return ring, ids


def _dsse_accepts(vector: dict[str, Any]) -> bool:
    """The DSSE verifier contract (type check, PAE, threshold of distinct trusted keys) on Keyring."""
    envelope = vector["envelope"]
    if envelope["payloadType"] not in vector["supportedPayloadTypes"]:
        return False
    ring, ids = _dsse_keyring(vector["trustedKeys"])
    message = pae(envelope["payloadType"], _b64_any(envelope["payload"]))
    recognized: set[str] = set()
    for signature in envelope["signatures"]:
        raw = _b64_any(signature["sig"])
        if "keyid" in signature:
            candidates = [ids[signature["keyid"]]] if signature["keyid"] in ids else []
        else:
            candidates = list(ids.values())
        recognized.update(key_id for key_id in candidates if ring.verify(key_id, message, raw))
    return len(recognized) >= vector["threshold"]


@pytest.mark.parametrize("vector", DSSE_VECTORS, ids=lambda v: v["id"])
def test_keyring_verification_matches_published_dsse_outcome(vector):
    assert _dsse_accepts(vector) is (vector["expect"] == "accept")


@pytest.mark.parametrize("vector", DSSE_VECTORS, ids=lambda v: v["id"])
def test_every_published_signature_verifies_over_its_published_pae_and_nothing_else(vector):
    ring, ids = _dsse_keyring(sorted(DSSE_KEYS))
    message = bytes.fromhex(vector["pae"])
    for signature in vector["envelope"]["signatures"]:
        raw = _b64_any(signature["sig"])
        assert any(ring.verify(key_id, message, raw) for key_id in ids.values())
        assert not any(ring.verify(key_id, _flip(message, 7), raw) for key_id in ids.values())


def test_open_envelope_checks_the_published_signature_under_its_own_payload_type():
    # The published envelope re-keyed to our key id: the signature holds; only the type is foreign.
    vector = next(v for v in DSSE_VECTORS if v["id"] == "single-signature")
    ring, ids = _dsse_keyring(["A"])
    envelope = json.loads(json.dumps(vector["envelope"]))
    envelope["signatures"][0]["keyid"] = ids["A"]
    opened = open_envelope(json.dumps(envelope).encode(), ring)
    assert opened.problems == ("payload_type_mismatch",)
    assert opened.body == {"_type": "https://in-toto.io/Statement/v1"}


def test_open_envelope_rejects_the_published_payload_type_swap():
    vector = next(v for v in DSSE_VECTORS if v["id"] == "payload-type-swapped")
    ring, ids = _dsse_keyring(["A"])
    envelope = json.loads(json.dumps(vector["envelope"]))
    envelope["signatures"][0]["keyid"] = ids["A"]
    opened = open_envelope(json.dumps(envelope).encode(), ring)
    assert opened.problems == ("payload_type_mismatch", "signature_invalid")


# --- seal and open ---------------------------------------------------------------------------


def test_seal_then_open_round_trips_and_verifies(signer, keyring):
    sealed = seal(BODY, signer)
    opened = open_envelope(sealed.envelope, keyring)
    assert opened.verified, opened.problems
    assert opened.body == BODY
    assert opened.payload == canonical_bytes(BODY)
    assert opened.key_id == signer.key_id == sealed.key_id
    assert opened.envelope["payloadType"] == PAYLOAD_TYPE


def test_sealed_envelope_is_canonical_and_named_by_its_digest(signer):
    sealed = seal(BODY, signer)
    assert canonical_bytes(json.loads(sealed.envelope)) == sealed.envelope
    assert sealed.digest == sha256_digest(sealed.envelope)
    assert sealed.receipt_id == receipt_id_for(sealed.digest)
    assert sealed.receipt_id == "rcpt-" + hashlib.sha256(sealed.envelope).hexdigest()[:24]


def test_sealed_signature_is_plain_ed25519_over_the_pae(signer):
    envelope = json.loads(seal(BODY, signer).envelope)
    payload = base64.b64decode(envelope["payload"])
    signature = base64.b64decode(envelope["signatures"][0]["sig"])
    verify_key = nacl.signing.VerifyKey(signer.public_key)
    assert verify_key.verify(pae(PAYLOAD_TYPE, payload), signature) == pae(PAYLOAD_TYPE, payload)


def test_seal_is_deterministic_and_body_sensitive(signer):
    assert seal(BODY, signer).envelope == seal(dict(reversed(BODY.items())), signer).envelope
    assert seal(BODY, signer).digest != seal({**BODY, "seq": 2}, signer).digest


def test_seal_refuses_a_body_that_cannot_be_canonicalized(signer):
    with pytest.raises(SealError):
        seal({**BODY, "data": {"cost_usd": math.nan}}, signer)


class _ForgingSigner(Signer):
    def sign(self, message: bytes) -> bytes:
        return bytes(64)


def test_seal_refuses_a_signature_that_does_not_verify(signer):
    forging = _ForgingSigner(signer.key_id, signer.signing_key)
    with pytest.raises(SealError):
        seal(BODY, forging)


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    # Integral floats in [2**53, 1e21) are a known bug (see the xfail below); stay under it here.
    | st.floats(min_value=-(2.0**53) + 1, max_value=2.0**53 - 1)
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(body=st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=6))
def test_any_json_body_round_trips_through_seal_and_open(body, signer, keyring):
    opened = open_envelope(seal(body, signer).envelope, keyring)
    assert opened.verified, opened.problems
    assert canonical_bytes(opened.body) == canonical_bytes(body)


@pytest.mark.parametrize("value", [2.0**53, 1e16, -1e17], ids=["2**53", "1e16", "-1e17"])
def test_seal_refuses_a_body_that_would_not_read_back_as_itself(value, signer):
    # JCS writes 2.0**53 as `9007199254740992`, which reads back as an integer beyond IEEE-754
    # precision: a receipt sealed from it could never verify, so seal refuses it up front.
    with pytest.raises(SealError, match="round trip"):
        seal({"x": value}, signer)


def _sealed_envelope(signer: Signer) -> dict[str, Any]:
    return json.loads(seal(BODY, signer).envelope)


def _signed_raw_payload(signer: Signer, payload: bytes) -> dict[str, Any]:
    signature = signer.sign(pae(PAYLOAD_TYPE, payload))
    return {
        "payload": _b64(payload),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [{"keyid": signer.key_id, "sig": _b64(signature)}],
    }


def _tamper(case: str, signer: Signer, other: Signer) -> dict[str, Any]:
    envelope = _sealed_envelope(signer)
    sig = envelope["signatures"][0]
    if case == "payload":
        envelope["payload"] = _b64(canonical_bytes({**BODY, "seq": 2}))
    elif case == "payload_type":
        envelope["payloadType"] = "application/vnd.loopwarden.receipt+json; version=2"
    elif case == "keyid_unknown":
        sig["keyid"] = key_id_for(b"\x07" * 32)
    elif case == "keyid_other_trusted":
        sig["keyid"] = other.key_id
    elif case == "sig_flipped":
        sig["sig"] = _b64(_flip(base64.b64decode(sig["sig"]), 10))
    elif case == "sig_truncated":
        sig["sig"] = _b64(base64.b64decode(sig["sig"])[:63])
    elif case == "sig_not_base64":
        sig["sig"] = "!!not base64!!"
    elif case == "payload_not_base64":
        envelope["payload"] = "%%%"
    elif case == "payload_missing":
        del envelope["payload"]
    elif case == "payload_type_missing":
        del envelope["payloadType"]
    elif case == "signatures_missing":
        del envelope["signatures"]
    elif case == "signatures_empty":
        envelope["signatures"] = []
    elif case == "signatures_two":
        envelope["signatures"].append(dict(sig))
    elif case == "signatures_not_list":
        envelope["signatures"] = sig
    elif case == "keyid_missing":
        del sig["keyid"]
    elif case == "sig_missing":
        del sig["sig"]
    elif case == "non_canonical_payload":
        envelope = _signed_raw_payload(signer, json.dumps(BODY, indent=1).encode())
    elif case == "payload_not_json":
        envelope = _signed_raw_payload(signer, b"not json")
    elif case == "payload_not_object":
        envelope = _signed_raw_payload(signer, b"[1,2]")
    elif case == "payload_nan":
        envelope = _signed_raw_payload(signer, b'{"x":NaN}')
    else:  # pragma: no cover - a typo in the table
        raise AssertionError(case)
    return envelope


TAMPER_CASES = {
    "payload": ("signature_invalid",),
    "payload_type": ("payload_type_mismatch", "signature_invalid"),
    "keyid_unknown": ("unknown_key",),
    "keyid_other_trusted": ("signature_invalid",),
    "sig_flipped": ("signature_invalid",),
    "sig_truncated": ("signature_invalid",),
    "sig_not_base64": ("envelope_malformed",),
    "payload_not_base64": ("envelope_malformed",),
    "payload_missing": ("envelope_malformed",),
    "payload_type_missing": ("envelope_malformed",),
    "signatures_missing": ("envelope_malformed",),
    "signatures_empty": ("envelope_malformed",),
    "signatures_two": ("envelope_malformed",),
    "signatures_not_list": ("envelope_malformed",),
    "keyid_missing": ("envelope_malformed",),
    "sig_missing": ("envelope_malformed",),
    "non_canonical_payload": ("not_canonical",),
    "payload_not_json": ("payload_malformed",),
    "payload_not_object": ("payload_malformed",),
    "payload_nan": ("payload_malformed",),
}


@pytest.mark.parametrize(("case", "problems"), TAMPER_CASES.items(), ids=list(TAMPER_CASES))
def test_tampered_envelope_reports_the_right_problem(case, problems, signer, other_signer, keyring):
    envelope = _tamper(case, signer, other_signer)
    opened = open_envelope(json.dumps(envelope).encode(), keyring)
    assert opened.problems == problems
    assert not opened.verified


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[]", b'"string"', b"null", b"\xff\xfe", b'{"payload": 5}'],
    ids=["empty", "not-json", "array", "string", "null", "not-utf8", "payload-int"],
)
def test_envelope_that_is_not_a_dsse_object_is_malformed(raw, keyring):
    assert open_envelope(raw, keyring).problems == ("envelope_malformed",)


def test_envelope_from_a_key_missing_from_the_keyring_is_unknown_key(signer):
    assert open_envelope(seal(BODY, signer).envelope, Keyring()).problems == ("unknown_key",)


def _hostile(case: str, signer: Signer) -> bytes:
    envelope = _sealed_envelope(signer)
    if case == "keyid_is_a_list":
        envelope["signatures"][0]["keyid"] = [signer.key_id]
    elif case == "keyid_is_an_object":
        envelope["signatures"][0]["keyid"] = {"id": signer.key_id}
    elif case == "payload_type_is_a_number":
        envelope["payloadType"] = 1
    elif case == "envelope_nested_too_deep":
        return b"[" * 100_000 + b"]" * 100_000
    elif case == "payload_nested_too_deep":
        envelope = _signed_raw_payload(signer, b"[" * 100_000 + b"]" * 100_000)
    return json.dumps(envelope).encode()


@pytest.mark.parametrize(
    "case",
    [
        "keyid_is_a_list",
        "keyid_is_an_object",
        "payload_type_is_a_number",
        "envelope_nested_too_deep",
        "payload_nested_too_deep",
    ],
)
def test_open_envelope_never_raises_on_hostile_input(case, signer, keyring):
    opened = open_envelope(_hostile(case, signer), keyring)
    assert not opened.verified
    assert opened.problems


# --- signed notes: the published golang/mod sumdb vectors ---------------------------------------


def _verifier_public_key(verifier_key: str) -> bytes:
    _name, _key_hash, encoded = verifier_key.split("+", 2)  # base64 may itself contain '+'
    raw = base64.b64decode(encoded)
    assert raw[0] == 0x01  # Ed25519 algorithm byte
    return raw[1:]


def _published_seed(signer_key: str) -> bytes:
    raw = base64.b64decode(signer_key.split("+", 4)[4])  # PRIVATE+KEY+<name>+<hash>+<base64>
    assert raw[0] == 0x01
    return raw[1:]


@pytest.mark.parametrize("vector", NOTE_VECTORS, ids=lambda v: v["name"])
def test_note_key_hash_reproduces_the_published_key_hash(vector):
    public = _verifier_public_key(vector["verifier_key"])
    assert note_key_hash(vector["name"], public).hex() == vector["key_hash_hex"]
    assert note_key_hash(vector["name"] + "x", public).hex() != vector["key_hash_hex"]


def test_signer_from_published_seed_matches_the_published_verifier_key():
    vector = next(v for v in NOTE_VECTORS if v["name"] == "PeterNeumann")
    seed = _published_seed(vector["signer_key"])
    assert Signer.from_seed(seed).public_key == _verifier_public_key(vector["verifier_key"])


@pytest.mark.parametrize("vector", NOTE_VECTORS, ids=lambda v: v["name"])
def test_published_note_signature_verifies_with_keyring_and_key_hash(vector):
    public = _verifier_public_key(vector["verifier_key"])
    ring = Keyring()
    key_id = ring.add(public)
    blob = base64.b64decode(vector["signature_b64"])
    assert len(blob) == 68
    assert blob[:4] == note_key_hash(vector["name"], public)
    text = vector["text"].encode()
    assert ring.verify(key_id, text, blob[4:])
    assert not ring.verify(key_id, text.replace(b"answer", b"Answer"), blob[4:])
    assert not ring.verify(key_id, text, _flip(blob[4:], 30))


def test_our_signing_reproduces_the_published_signed_note_exactly():
    vector = next(v for v in NOTE_VECTORS if v["name"] == "PeterNeumann")
    seed = _published_seed(vector["signer_key"])
    note_signer = Signer.from_seed(seed)
    blob = note_key_hash("PeterNeumann", note_signer.public_key) + note_signer.sign(
        vector["text"].encode()
    )
    assert f"{vector['text']}\n{SIG_PREFIX}PeterNeumann {_b64(blob)}\n" == vector["signed_note"]


def test_open_checkpoint_refuses_a_signed_note_whose_text_is_not_a_checkpoint():
    vector = next(v for v in NOTE_VECTORS if v["name"] == "PeterNeumann")
    ring = Keyring()
    ring.add(_verifier_public_key(vector["verifier_key"]))
    checkpoint = open_checkpoint(vector["signed_note"], ring)
    assert checkpoint.problem == "checkpoint_malformed"
    assert not checkpoint.verified


def test_checkpoint_signed_with_the_published_key_verifies_once_that_key_is_trusted():
    vector = next(v for v in NOTE_VECTORS if v["name"] == "PeterNeumann")
    seed = _published_seed(vector["signer_key"])
    note_signer = Signer.from_seed(seed)
    note = sign_checkpoint("example.com/log", 7, hashlib.sha256(b"r").digest(), note_signer)
    assert open_checkpoint(note, Keyring()).problem == "unknown_key"
    ring = Keyring()
    ring.add(_verifier_public_key(vector["verifier_key"]))
    assert open_checkpoint(note, ring).verified


# --- our checkpoints -------------------------------------------------------------------------

ROOT = hashlib.sha256(b"a root").digest()
OTHER_ROOT = hashlib.sha256(b"another root").digest()


def test_sign_checkpoint_has_the_c2sp_shape(signer):
    note = sign_checkpoint("loopwarden.test/log", 12, ROOT, signer)
    body, signature_line = note.split("\n\n")
    assert body + "\n" == checkpoint_body("loopwarden.test/log", 12, ROOT)
    assert body.split("\n") == ["loopwarden.test/log", "12", _b64(ROOT)]
    # The key name is the origin (tlog-checkpoint SHOULD, tlog-policy MUST).
    assert signature_line.startswith(SIG_PREFIX + "loopwarden.test/log ")
    assert signature_line.endswith("\n")
    blob = base64.b64decode(signature_line.rstrip("\n").split(" ")[-1])
    assert blob[:4] == note_key_hash("loopwarden.test/log", signer.public_key)
    assert Keyring({signer.key_id: signer.public_key}).verify(
        signer.key_id, (body + "\n").encode(), blob[4:]
    )


def test_sign_then_open_checkpoint_round_trips(signer, keyring):
    checkpoint = open_checkpoint(sign_checkpoint("loopwarden.test/log", 12, ROOT, signer), keyring)
    assert checkpoint.verified
    assert checkpoint.problem is None
    assert (checkpoint.origin, checkpoint.size, checkpoint.root) == (
        "loopwarden.test/log",
        12,
        ROOT,
    )
    assert checkpoint.key_id == signer.key_id


def _resign_blob(note: str, blob: bytes) -> str:
    head, _, _ = note.rpartition(" ")
    return f"{head} {_b64(blob)}\n"


def _note_blob(note: str) -> bytes:
    return base64.b64decode(note.rstrip("\n").rpartition(" ")[2])


def _tampered_note(case: str, signer: Signer, other: Signer) -> str:
    note = sign_checkpoint("loopwarden.test/log", 12, ROOT, signer)
    if case == "size":
        return note.replace("\n12\n", "\n13\n")
    if case == "root":
        return note.replace(_b64(ROOT), _b64(OTHER_ROOT))
    if case == "origin":
        return note.replace("loopwarden.test/log", "loopwarden.test/lag")
    if case == "signature":
        return _resign_blob(note, _flip(_note_blob(note), 40))
    if case == "key_hash":
        return _resign_blob(note, _flip(_note_blob(note), 0))
    if case == "signed_by_other_key_under_our_name":
        forged = other.sign(checkpoint_body("loopwarden.test/log", 12, ROOT).encode())
        return _resign_blob(note, note_key_hash("loopwarden.test/log", signer.public_key) + forged)
    raise AssertionError(case)  # pragma: no cover


@pytest.mark.parametrize(
    "case",
    ["size", "root", "signature", "signed_by_other_key_under_our_name"],
)
def test_tampered_checkpoint_does_not_verify(case, signer, other_signer, keyring):
    checkpoint = open_checkpoint(_tampered_note(case, signer, other_signer), keyring)
    assert not checkpoint.verified
    assert checkpoint.problem == "signature_invalid"


@pytest.mark.parametrize("case", ["origin", "key_hash"])
def test_checkpoint_whose_line_names_no_trusted_key_is_unknown_key(
    case, signer, other_signer, keyring
):
    # The key name (the origin) or the key hash changed: the line names no trusted key, so the
    # signed-note spec has it ignored, and no signature from a known key is left.
    checkpoint = open_checkpoint(_tampered_note(case, signer, other_signer), keyring)
    assert (checkpoint.verified, checkpoint.problem) == (False, "unknown_key")


def test_checkpoint_signed_under_the_key_id_before_the_origin_still_opens(signer, keyring):
    body = checkpoint_body("loopwarden.test/log", 12, ROOT)
    blob = note_key_hash(signer.key_id, signer.public_key) + signer.sign(body.encode())
    old = f"{body}\n{SIG_PREFIX}{signer.key_id} {_b64(blob)}\n"
    checkpoint = open_checkpoint(old, keyring)
    assert (checkpoint.verified, checkpoint.key_id) == (True, signer.key_id)


def test_checkpoint_from_an_untrusted_key_is_unknown_key(signer, other_signer):
    note = sign_checkpoint("loopwarden.test/log", 12, ROOT, signer)
    ring = Keyring({other_signer.key_id: other_signer.public_key})
    checkpoint = open_checkpoint(note, ring)
    assert (checkpoint.verified, checkpoint.problem) == (False, "unknown_key")


MALFORMED_NOTES = {
    "no_blank_line": lambda n: n.replace("\n\n", "\n"),
    "two_lines_only": lambda n: n.replace("\n12\n", "\n"),
    "size_leading_zero": lambda n: n.replace("\n12\n", "\n012\n"),
    "size_negative": lambda n: n.replace("\n12\n", "\n-12\n"),
    "size_not_a_number": lambda n: n.replace("\n12\n", "\ntwelve\n"),
    "root_short": lambda n: n.replace(_b64(ROOT), _b64(ROOT[:31])),
    "root_not_base64": lambda n: n.replace(_b64(ROOT), "***"),
    "no_signature_line": lambda n: n.split("\n\n")[0] + "\n\n",
    "no_em_dash": lambda n: n.replace(SIG_PREFIX, "- "),
    "blob_short": lambda n: _resign_blob(n, _note_blob(n)[:67]),
    "blob_not_base64": lambda n: n.rpartition(" ")[0] + " ***\n",
    "name_with_space": lambda n: n.replace(SIG_PREFIX, SIG_PREFIX + "x "),
}


@pytest.mark.parametrize("case", list(MALFORMED_NOTES))
def test_malformed_checkpoint_is_reported_without_raising(case, signer, keyring):
    note = MALFORMED_NOTES[case](sign_checkpoint("loopwarden.test/log", 12, ROOT, signer))
    checkpoint = open_checkpoint(note, keyring)
    assert (checkpoint.verified, checkpoint.problem) == (False, "checkpoint_malformed")


# --- keyring and key ids ---------------------------------------------------------------------


def test_key_id_is_prefixed_sha256_of_the_public_key(signer):
    expected = "ed25519-" + hashlib.sha256(signer.public_key).hexdigest()[:16]
    assert key_id_for(signer.public_key) == expected == signer.key_id


def test_keyring_indexes_keys_by_their_derived_id_not_by_the_given_name(signer):
    ring = Keyring({"whatever": signer.public_key})
    assert ring.ids() == [signer.key_id]
    assert "whatever" not in ring
    assert not ring.verify("whatever", b"m", signer.sign(b"m"))
    assert ring.verify(signer.key_id, b"m", signer.sign(b"m"))


@pytest.mark.parametrize("size", [0, 31, 33])
def test_keyring_refuses_a_public_key_of_the_wrong_length(size):
    with pytest.raises(KeyFileError):
        Keyring().add(b"\x01" * size)


@pytest.mark.parametrize("signature", [b"", b"\x00" * 63, b"\x00" * 65, b"\x00" * 64])
def test_keyring_verify_returns_false_for_bad_signatures(signer, signature):
    assert (
        Keyring({signer.key_id: signer.public_key}).verify(signer.key_id, b"m", signature) is False
    )


def test_public_key_text_round_trips_and_refuses_bad_text(signer):
    assert decode_public_key(public_key_b64(signer.public_key) + "\n") == signer.public_key
    for bad in ["not base64!", _b64(b"\x00" * 31), ""]:
        with pytest.raises(KeyFileError):
            decode_public_key(bad)


# --- key files -------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_load_signer_creates_a_private_key_dir_and_a_0600_private_key(tmp_path):
    store = KeyStore(tmp_path / "home")
    signer = store.load_signer()
    assert _mode(store.dir) == 0o700
    assert _mode(store.dir / f"{signer.key_id}.key") == 0o600
    assert (store.dir / f"{signer.key_id}.pub").exists()
    assert store.active_id() == signer.key_id
    assert store.keyring().ids() == [signer.key_id]


def test_load_signer_returns_the_same_key_on_every_load(tmp_path):
    first = KeyStore(tmp_path).load_signer()
    second = KeyStore(tmp_path).load_signer()
    assert first.key_id == second.key_id
    assert first.sign(b"m") == second.sign(b"m")


def test_load_signer_tightens_a_key_dir_created_with_loose_permissions(tmp_path):
    (tmp_path / "keys").mkdir(mode=0o755)
    os.chmod(tmp_path / "keys", 0o755)
    KeyStore(tmp_path).load_signer()
    assert _mode(tmp_path / "keys") == 0o700


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o601])
def test_load_signer_refuses_a_private_key_readable_by_others(tmp_path, mode):
    store = KeyStore(tmp_path)
    signer = store.load_signer()
    os.chmod(store.dir / f"{signer.key_id}.key", mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        KeyStore(tmp_path).load_signer()


def test_load_signer_accepts_an_owner_read_only_private_key(tmp_path):
    store = KeyStore(tmp_path)
    signer = store.load_signer()
    os.chmod(store.dir / f"{signer.key_id}.key", 0o400)
    assert KeyStore(tmp_path).load_signer().key_id == signer.key_id


def test_load_signer_refuses_a_private_key_that_does_not_match_its_id(tmp_path, other_signer):
    store = KeyStore(tmp_path)
    signer = store.load_signer()
    private = store.dir / f"{signer.key_id}.key"
    os.chmod(private, 0o600)
    private.write_text(_b64(bytes(other_signer.signing_key)) + "\n")
    with pytest.raises(KeyFileError, match="does not match"):
        store.load_signer()


def test_load_signer_refuses_an_active_key_without_private_key(tmp_path):
    store = KeyStore(tmp_path)
    signer = store.load_signer()
    (store.dir / f"{signer.key_id}.key").unlink()
    with pytest.raises(KeyFileError, match="no private key"):
        store.load_signer()


def test_rotate_keeps_old_public_key_and_deletes_old_private_key(tmp_path, keyring):
    store = KeyStore(tmp_path)
    old = store.load_signer()
    old_receipt = seal(BODY, old)
    rotated = store.rotate()
    retired, new = rotated.retired, rotated.signer
    assert retired == old.key_id != new.key_id
    assert store.active_id() == new.key_id
    assert store.load_signer().key_id == new.key_id
    assert not (store.dir / f"{old.key_id}.key").exists()
    assert (store.dir / f"{old.key_id}.pub").exists()
    assert _mode(store.dir / f"{new.key_id}.key") == 0o600
    ring = store.keyring()
    assert set(ring.ids()) == {old.key_id, new.key_id}
    assert open_envelope(old_receipt.envelope, ring).verified
    assert open_envelope(seal(BODY, new).envelope, ring).verified


def test_rotate_on_a_fresh_home_makes_the_first_active_key(tmp_path):
    store = KeyStore(tmp_path)
    rotated = store.rotate()
    retired, new = rotated.retired, rotated.signer
    assert retired is None and rotated.until is None
    assert store.active_id() == new.key_id
    assert store.load_signer().key_id == new.key_id


def test_keyring_refuses_a_public_key_file_named_for_another_key(tmp_path, other_signer):
    store = KeyStore(tmp_path)
    signer = store.load_signer()
    (store.dir / f"{signer.key_id}.pub").write_text(public_key_b64(other_signer.public_key))
    with pytest.raises(KeyFileError):
        store.keyring()


_CONCURRENT_LOADER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from loopwarden.kernel.log.keys import KeyStore
    print("ready", flush=True)
    sys.stdin.readline()
    print(KeyStore(Path(sys.argv[1])).load_signer().key_id, flush=True)
    """
)


@pytest.mark.parametrize("processes", [2, 4])
def test_concurrent_load_signer_on_a_fresh_home_yields_one_active_key(tmp_path, processes):
    home = tmp_path / "home"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CONCURRENT_LOADER, str(home)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for child in children:  # every child imported and is waiting: release them together
            assert child.stdout.readline().strip() == "ready"
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        results = [child.communicate(timeout=30) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert [child.returncode for child in children] == [0] * processes, results
    key_ids = {out.strip() for out, _ in results}
    store = KeyStore(home)
    assert key_ids == {store.active_id()}
    assert sorted(p.name for p in store.dir.glob("*.key")) == [f"{store.active_id()}.key"]
    assert store.keyring().ids() == [store.active_id()]
    (genesis,) = store.statements()  # one history, begun by the key that won
    assert genesis.startswith(
        f"loopwarden key genesis\nloopwarden key history\n{store.active_id()} "
    )


def test_load_signer_loads_the_winner_when_another_process_publishes_first(tmp_path, monkeypatch):
    # A deterministic replay of the interleaving two processes can hit on a fresh home: both
    # see no `active` pointer and make a key; the other process links its (complete) pointer
    # into place just before this one tries. This one must load the winner's key and discard
    # its own, never fail or end up with two keys.
    store = KeyStore(tmp_path)
    winner = Signer.from_seed(hashlib.sha256(b"winner").digest())
    real_link = os.link
    race = {"won": False}

    def link(src, dst, *args, **kwargs):
        if Path(dst).name == "active" and not race["won"]:
            race["won"] = True
            keys_module._write_new(
                store.dir / f"{winner.key_id}.key", _b64(bytes(winner.signing_key)), 0o600
            )
            keys_module._write_new(
                store.dir / f"{winner.key_id}.pub", _b64(winner.public_key), 0o644
            )
            keys_module._write_new(store.dir / "winner.tmp", winner.key_id, 0o644)
            real_link(store.dir / "winner.tmp", dst)
            (store.dir / "winner.tmp").unlink()
        return real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    loaded = store.load_signer()
    assert race["won"], "the replay did not run: load_signer no longer links the pointer"
    assert loaded.key_id == winner.key_id == store.active_id()
    assert sorted(p.name for p in store.dir.glob("*.key")) == [f"{winner.key_id}.key"]
    assert not list(store.dir.glob("*.tmp"))


@settings(max_examples=200, deadline=None)
@given(
    payload=st.binary(max_size=600),
    signature=st.binary(min_size=64, max_size=64),
    key_id=st.one_of(
        st.from_regex(r"[A-Za-z0-9_.:-]{1,40}", fullmatch=True), st.text(min_size=1, max_size=20)
    ),
)
def test_envelope_template_renders_exactly_the_rfc8785_bytes(payload, signature, key_id):
    from loopwarden.kernel.log.seals import envelope_bytes

    expected = rfc8785.dumps(  # the reference itself, not our fast path
        {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"keyid": key_id, "sig": base64.b64encode(signature).decode()}],
        }
    )
    assert envelope_bytes(payload, key_id, signature) == expected


# --- the audit's one-pass payload parse -------------------------------------------------------


def _release_payloads() -> list[bytes]:
    import sqlite3

    from loopwarden.kernel.log.seals import parse_envelope

    db = Path(__file__).parent / "fixtures" / "release-0.1.0" / "loopwarden.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = [bytes(r[0]) for r in conn.execute("SELECT envelope FROM journal")]
    finally:
        conn.close()
    parsed = [parse_envelope(raw) for raw in rows]
    return [p.payload for p in parsed if p is not None]


RELEASE_PAYLOADS = _release_payloads()


def _two_steps(payload: bytes) -> Any:
    """What the audit did before: json.loads (no NaN), then the typed body; None on failure."""
    from pydantic import ValidationError

    from loopwarden.kernel.log.seals import _parse_body
    from loopwarden.kinds import KINDS

    raw = _parse_body(payload)
    try:
        return KINDS.parse_body(raw if raw is not None else {})
    except ValidationError:
        return None


def _edit(body: Any, path: list[int], value: Any) -> Any:
    """`body` with the node reached by `path` (indices into sorted keys / items) set to `value`."""
    if not path or not isinstance(body, dict | list) or not body:
        return value
    if isinstance(body, dict):
        key = sorted(body)[path[0] % len(body)]
        return {**body, key: _edit(body[key], path[1:], value)}
    at = path[0] % len(body)
    return [*body[:at], _edit(body[at], path[1:], value), *body[at + 1 :]]


@settings(max_examples=400, deadline=None)
@given(
    which=st.integers(min_value=0, max_value=len(RELEASE_PAYLOADS) - 1),
    path=st.lists(st.integers(min_value=0, max_value=20), max_size=4),
    value=st.one_of(
        JSON_VALUES,
        st.sampled_from([math.nan, math.inf, "\ud800", "NaN", 1e400, -0.0, 2**64, "", []]),
    ),
    edit=st.booleans(),
    spacing=st.sampled_from([(",", ":"), (", ", ": ")]),
    ascii_only=st.booleans(),
)
def test_the_one_pass_payload_parse_reads_what_json_then_the_schema_read(
    which, path, value, edit, spacing, ascii_only
):
    from loopwarden.kinds import KINDS

    body = json.loads(RELEASE_PAYLOADS[which])
    if edit:
        body = _edit(body, path, value)
    try:
        payload = json.dumps(body, separators=spacing, ensure_ascii=ascii_only).encode(
            "utf-8", "surrogatepass"
        )
    except ValueError:
        return
    one, two = KINDS.parse_payload(payload), _two_steps(payload)
    if one is not None:
        assert one == two
    if not edit:
        assert one is not None and one == two  # a signed payload takes the one pass


def test_every_release_payload_takes_the_one_pass_and_reads_the_same():
    from loopwarden.kinds import KINDS

    for payload in RELEASE_PAYLOADS:
        one = KINDS.parse_payload(payload)
        assert one is not None and one == _two_steps(payload)
    assert len(RELEASE_PAYLOADS) == 32


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_payload_json_loads_would_refuse_is_not_read_in_one_pass(literal):
    # NaN and Infinity are not JSON: the audit's old parse refused them (payload_malformed),
    # so the one pass must not read them where the schema lets any value through (a policy).
    from loopwarden.kinds import KINDS

    opened = next(p for p in RELEASE_PAYLOADS if b'"kind":"loop.opened"' in p)
    payload = opened.replace(b'"policy":{', b'"policy":{"x":' + literal.encode() + b",", 1)
    assert payload != opened and _two_steps(payload) is None
    assert KINDS.parse_payload(payload) is None
