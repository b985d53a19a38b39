"""The witness formats byte for byte as the C2SP specs give them, checked against the specs' own
examples: signed-note verifier keys, tlog-cosignature v1, the tlog-witness add-checkpoint body,
tlog-proof and tlog-policy. And the bundled witness's answers, one per rule of tlog-witness.

Interoperability with an independent implementation (aics-tlog 0.2.1 and aics-witness 0.1.0,
from PyPI) was checked by hand both ways: docs/witnesses.md says how; they need Python 3.12, so
they are not a test dependency.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from pathlib import Path

import nacl.signing
import pytest

from loopwarden.clock import ManualClock
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import (
    checkpoint_body,
    cosigned_note,
    open_checkpoint,
    sign_checkpoint,
    split_note,
)
from loopwarden.kernel.log.keys import Keyring, Signer
from loopwarden.kernel.log.tlog_proofs import format_proof, parse_proof
from loopwarden.witnesses import add_checkpoint
from loopwarden.witnesses.cosignatures import Cosigner, check, matches, signed_message
from loopwarden.witnesses.cosigner import WitnessService, origin_hash
from loopwarden.witnesses.cosigner_store import CosignerStore
from loopwarden.witnesses.vkeys import COSIGNATURE_V1, ED25519, VerifierKey, parse_vkey
from loopwarden.witnesses.vouching import vouch
from loopwarden.witnesses.witness_policy import parse_policy

# --- signed-note: the spec's verifier key example ---------------------------------------------

SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n"
    "\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFX"
    "mRKuwHjG1Yu72IneyaQM=\n"
)


def test_the_signed_note_spec_vkey_parses_and_verifies_its_example_note():
    vkey = parse_vkey(SPEC_VKEY, kind=ED25519)
    assert (vkey.name, vkey.key_hash.hex()) == ("example.com/foo", "530d903a")
    assert str(vkey) == SPEC_VKEY  # and prints back byte for byte
    parts = split_note(SPEC_NOTE)
    assert parts.text == "This is an example message.\n"
    [(name, blob)] = parts.signatures
    assert name == vkey.name and blob[:4] == vkey.key_hash
    nacl.signing.VerifyKey(vkey.public_key).verify(parts.text.encode(), blob[4:])


@pytest.mark.parametrize(
    "text",
    [
        "example.com/foo+530d903b+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",  # hash
        "example.com/fo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",  # name
        "example.com/foo+530d903a",
        "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U",  # short
        "exa mple+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
    ],
)
def test_a_vkey_whose_parts_disagree_is_refused(text):
    with pytest.raises(ValueError):
        parse_vkey(text)


def test_a_vkey_whose_base64_holds_a_plus_parses():
    for seed in range(64):  # some key's base64 holds a `+`: the name is cut at the first one
        key = nacl.signing.SigningKey(bytes([seed]) * 32)
        vkey = VerifierKey("example.org/w", COSIGNATURE_V1, bytes(key.verify_key))
        assert parse_vkey(str(vkey)) == vkey


# --- tlog-checkpoint: the log signs under its origin ------------------------------------------


def test_a_checkpoint_is_signed_under_its_origin_and_verifies_with_the_log_vkey():
    signer = Signer.generate()
    root = hashlib.sha256(b"root").digest()
    note = sign_checkpoint("example.com/log", 3, root, signer)
    vkey = VerifierKey("example.com/log", ED25519, signer.public_key)
    [(name, blob)] = split_note(note).signatures
    assert name == "example.com/log" and blob[:4] == vkey.key_hash
    # Cosignature lines after it are ignored by the log's check (signed-note: unknown keys).
    witness = Cosigner("witness.example/w1", nacl.signing.SigningKey.generate())
    line = witness.cosign(checkpoint_body("example.com/log", 3, root), 1_700_000_000)
    opened = open_checkpoint(cosigned_note(note, [line]), Keyring({"k": signer.public_key}))
    assert opened.verified and opened.key_id == signer.key_id


# --- tlog-cosignature: the spec's example -------------------------------------------------------

SPEC_CHECKPOINT = (
    "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
)
SPEC_COSIGNATURE = (
    "\u2014 witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlr"
    "DJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"
)


def test_the_cosignature_spec_example_has_the_timestamp_its_signed_message_shows():
    parts = split_note(SPEC_CHECKPOINT + "\n" + SPEC_COSIGNATURE)
    [(name, blob)] = parts.signatures
    assert name == "witness.example.com/w1" and len(blob) == 4 + 8 + 64
    (timestamp,) = struct.unpack(">Q", blob[4:12])
    assert timestamp == 1679315147  # the spec's "time 1679315147"
    assert signed_message(parts.text, timestamp) == (
        b"cosignature/v1\ntime 1679315147\nexample.com/behind-the-sofa\n20852163\n"
        b"CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    )


def test_a_cosignature_line_has_the_v1_shape_and_verifies_only_over_its_checkpoint():
    key = nacl.signing.SigningKey(bytes(range(32)))
    witness = Cosigner("witness.example/w1", key)
    line = witness.cosign(SPEC_CHECKPOINT, 1679315147)
    assert line.startswith("\u2014 witness.example/w1 ") and line.endswith("\n")
    blob = base64.b64decode(line.split(" ")[-1])
    expected_hash = hashlib.sha256(b"witness.example/w1\n\x04" + bytes(key.verify_key)).digest()[:4]
    assert blob[:4] == expected_hash == witness.vkey.key_hash
    assert blob[4:12] == struct.pack(">Q", 1679315147)
    key.verify_key.verify(signed_message(SPEC_CHECKPOINT, 1679315147), blob[12:])
    assert matches(witness.vkey, "witness.example/w1", blob)
    assert check(witness.vkey, SPEC_CHECKPOINT, blob).verified
    other = SPEC_CHECKPOINT.replace("20852163", "20852164")
    assert not check(witness.vkey, other, blob).verified
    with pytest.raises(ValueError):
        witness.cosign(SPEC_CHECKPOINT, 0)  # tlog-witness: never an omitted timestamp


# --- tlog-witness: the spec's example request ---------------------------------------------------

SPEC_REQUEST = (
    "old 20852014\n"
    "PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\n"
    "jrJZDmY8Y7SyJE0MWLpLozkIVMSMZcD5kvuKxPC3swk=\n"
    "5+pKlUdi2LeF/BcMHBn+Ku6yhPGNCswZZD1X/6QgPd8=\n"
    "/6WVhPs2CwSsb5rYBH5cjHV/wSmA79abXAwhXw3Kj/0=\n"
    "\n"
    "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n"
    "\u2014 example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/"
    "Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
    "\u2014 example.com/behind-the-sofa opLqBQsREYCgu6xQkYQwJr9fo45a62DN9EdmHXnZdXNqlcVGlCum2Wks+49"
    "/V6267UEjw6QUXTS5Rovnzv++qbSzm9Q=\n"
)


def test_the_witness_spec_example_request_decodes_and_encodes_back_byte_for_byte():
    submission = add_checkpoint.decode(SPEC_REQUEST.encode())
    assert submission.old == 20852014 and len(submission.proof) == 4
    assert len(split_note(submission.note).signatures) == 2
    again = add_checkpoint.encode(submission.old, list(submission.proof), submission.note)
    assert again == SPEC_REQUEST.encode()


@pytest.mark.parametrize(
    "body",
    [
        "old 01\n\nnote\n",
        "old -1\n\nnote\n",
        "new 1\n\nnote\n",
        "old 1\nnot base64!\n\nnote\n",
        "old 1\nAAAA\n\nnote\n",  # not a SHA-256 hash
        "old 1\n" + "PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\n" * 64 + "\nnote\n",
        "old 1\nnote\n",  # no empty line
    ],
)
def test_a_malformed_request_body_is_refused(body):
    with pytest.raises(ValueError):
        add_checkpoint.decode(body.encode())


# --- the bundled witness: one answer per rule of tlog-witness ---------------------------------


class Log:
    def __init__(self, origin: str = "example.com/log") -> None:
        self.origin, self.signer = origin, Signer.generate()
        self.leaves: list[bytes] = []

    @property
    def vkey(self) -> VerifierKey:
        return VerifierKey(self.origin, ED25519, self.signer.public_key)

    def grow(self, size: int, tag: bytes = b"") -> None:
        while len(self.leaves) < size:
            self.leaves.append(merkle.leaf_hash(tag + b"%d" % len(self.leaves)))

    def note(self, size: int | None = None) -> str:
        size = len(self.leaves) if size is None else size
        root = merkle.root_from_leaves(self.leaves[:size])
        return sign_checkpoint(self.origin, size, root, self.signer)

    def request(self, old: int, size: int | None = None) -> bytes:
        size = len(self.leaves) if size is None else size
        nodes = merkle.list_nodes(self.leaves)
        proof = merkle.consistency_proof(old, size, nodes) if 0 < old < size else []
        return add_checkpoint.encode(old, proof, self.note(size))


@pytest.fixture
def witness(tmp_path: Path):
    log = Log()
    key = nacl.signing.SigningKey.generate()
    store = CosignerStore(tmp_path / "witness.db")
    service = WitnessService(
        Cosigner("witness.example/w1", key), [log.vkey], store, clock=ManualClock()
    )
    yield service, log
    store.close()


def test_the_witness_cosigns_a_first_checkpoint_then_only_consistent_ones(witness):
    service, log = witness
    log.grow(5)
    answer = service.add_checkpoint(log.request(0))
    assert answer.status == 200
    parts = split_note(log.note() + answer.body.decode())
    verdict = vouch(
        parse_policy(f"witness W {service.cosigner.vkey}\nquorum W\n"), parts.text, parts.signatures
    )
    assert verdict.quorum and list(verdict.cosigned) == ["W"]
    log.grow(9)
    assert service.add_checkpoint(log.request(5)).status == 200
    assert service.add_checkpoint(log.request(9)).status == 200  # the same size again
    served = service.checkpoint(origin_hash(log.origin))
    assert served.status == 200 and served.body.decode().startswith(log.note().split("\n\n")[0])
    assert service.checkpoint(origin_hash("elsewhere")).status == 404


def test_the_witness_answers_each_refusal_with_the_status_the_spec_names(witness):
    service, log = witness
    log.grow(4)
    assert service.add_checkpoint(log.request(0)).status == 200
    log.grow(8)
    stale = service.add_checkpoint(log.request(2))
    assert (stale.status, stale.body, stale.content_type) == (409, b"4\n", "text/x.tlog.size")
    assert service.add_checkpoint(log.request(9, 8)).status == 400  # old above the size
    stranger = Log("example.com/other")
    stranger.grow(2)
    assert service.add_checkpoint(stranger.request(0)).status == 404
    impostor = Log()  # the same origin, another key: not a trusted signature
    impostor.grow(8)
    assert service.add_checkpoint(impostor.request(4)).status == 403
    forged = log.request(4).replace(b"\n\n\xe2\x80\x94", b"\n\n\xe2\x80\x94", 1)
    head, _, sig = forged.rpartition(b" ")
    flipped = base64.b64encode(
        (lambda b: b[:10] + bytes([b[10] ^ 1]) + b[11:])(base64.b64decode(sig))
    )
    assert service.add_checkpoint(head + b" " + flipped + b"\n").status == 403
    fork = Log()
    fork.signer = log.signer  # the log's own key signing another tree: a fork
    fork.grow(8, b"fork")
    assert service.add_checkpoint(fork.request(4)).status == 422
    nodes = merkle.list_nodes(log.leaves)
    bad = add_checkpoint.encode(0, merkle.consistency_proof(4, 8, nodes), log.note(8))
    assert service.add_checkpoint(bad).status in (409, 422)
    same_size_other_root = fork.request(4, 4)
    assert service.add_checkpoint(same_size_other_root).status == 422
    empty = sign_checkpoint(log.origin, 0, hashlib.sha256(b"x").digest(), log.signer)
    assert service.add_checkpoint(add_checkpoint.encode(0, [], empty)).status == 409
    # Nothing refused moved the witness: the consistent checkpoint is still cosigned.
    assert service.add_checkpoint(log.request(4)).status == 200
    assert [r[2] for r in service.store.refusals()] == [422, 422]


def test_the_witness_never_rolls_back(witness):
    service, log = witness
    log.grow(10)
    assert service.add_checkpoint(log.request(0)).status == 200
    answer = service.add_checkpoint(log.request(0, 6))
    assert (answer.status, answer.body) == (409, b"10\n")
    assert service.add_checkpoint(log.request(10, 6)).status == 400
    assert service.store.latest(log.origin).size == 10


# --- tlog-proof ---------------------------------------------------------------------------------

SPEC_PROOF = (
    "c2sp.org/tlog-proof@v1\n"
    "extra YWdlLXYxLjIuMS1kYXJ3aW4tYXJtNjQudGFyLmd6kYXJ3aW4tYXJ\n"
    "index 73894\n"
    "gSKyXoYZUgZ6jduWYrkDOARinOMGJveXjgMkBTcdPlQ=\n"
    "B95lDa8R83lS8n0eG+o0buTxRKQTYFi//1U8anccXmA=\n"
    "EKNzoDWG8LGC0Yp9o+sv3qllpMP9uHQ9B20KNL+Q1zs=\n"
    "RoopEkOdqkYqMB4MJXrbt/hMjOxsVn0IrWjpz1ZMMes=\n"
    "AHCioX9nLjsrse6YhjRRmk1WUEirVOLLRoOQ6vfO5vk=\n"
    "\n"
    "example.com/fancylog\n109482\nsFodV/vSp5O8n9a8QpW6PRY97tfOSW5bsc2Xl/EQi08=\n\n"
    "\u2014 example.com/fancylog hI2DJw[...]1roloI=\n"
)


def test_the_tlog_proof_spec_example_parses():
    proof = parse_proof(SPEC_PROOF)
    assert proof.index == 73894 and len(proof.proof) == 5 and proof.extra is not None
    assert proof.checkpoint.startswith("example.com/fancylog\n109482\n")


def test_a_tlog_proof_we_write_verifies_as_the_spec_says():
    signer = Signer.generate()
    leaves = [merkle.leaf_hash(b"entry %d" % i) for i in range(11)]
    nodes = merkle.list_nodes(leaves)
    note = sign_checkpoint("example.com/log", 11, merkle.root_from_leaves(leaves), signer)
    text = format_proof(7, merkle.inclusion_proof(7, 11, nodes), note)
    assert text.startswith("c2sp.org/tlog-proof@v1\nindex 7\n")
    read = parse_proof(text)
    assert read.checkpoint == note and read.extra is None
    opened = open_checkpoint(read.checkpoint, Keyring({"k": signer.public_key}))
    assert opened.verified
    assert merkle.verify_inclusion(leaves[7], 7, opened.size, list(read.proof), opened.root)


# --- tlog-policy --------------------------------------------------------------------------------


def _vkeys(n: int) -> list[str]:
    return [
        str(
            VerifierKey(
                f"w{i}.example",
                COSIGNATURE_V1,
                bytes(nacl.signing.SigningKey(bytes([i + 1]) * 32).verify_key),
            )
        )
        for i in range(n)
    ]


def test_the_policy_spec_example_parses_and_its_quorum_is_two_x_and_one_y():
    x1, x2, x3, y1, y2, y3 = _vkeys(6)
    log = str(VerifierKey("example.com/log", ED25519, Signer.generate().public_key))
    policy = parse_policy(
        f"log {log}\n\n"
        f"witness X1 {x1}\nwitness X2 {x2}\nwitness X3 {x3}\n"
        "group X-witnesses 2 X1 X2 X3\n\n"
        f"witness Y1 {y1}\nwitness Y2 {y2}\nwitness Y3 {y3}\n"
        "group Y-witnesses any Y1 Y2 Y3\n\n"
        "group X-and-Y all X-witnesses Y-witnesses\nquorum X-and-Y\n"
    )
    assert policy.satisfied({"X1", "X3", "Y2"})
    assert not policy.satisfied({"X1", "Y1", "Y2", "Y3"})
    assert not policy.satisfied({"X1", "X2", "X3"})
    assert policy.counted() == ["X1", "X2", "X3", "Y1", "Y2", "Y3"]
    assert [v.name for v in policy.logs_for("example.com/log")] == ["example.com/log"]


def test_quorum_none_needs_no_cosignature_and_comments_and_tabs_are_whitespace():
    (w,) = _vkeys(1)
    policy = parse_policy(f"  # a comment\n\twitness\tA {w}   https://w.example\nquorum none\n")
    assert policy.satisfied(set()) and policy.witnesses["A"].url == "https://w.example"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("witness A {0}\n", "no quorum"),
        ("witness A {0}\nquorum A\nquorum A\n", "one quorum"),
        ("quorum A\nwitness A {0}\n", "defined on a line before"),
        ("witness A {0}\nwitness A {1}\nquorum A\n", "defined already"),
        ("witness A {0}\nwitness B {0}\nquorum A\n", "listed already"),
        ("witness A {0}\ngroup G 2 A\nquorum G\n", "threshold"),
        ("witness A {0}\ngroup G 0 A\nquorum G\n", "threshold"),
        ("witness A {0}\ngroup G any A A\nquorum G\n", "at most once"),
        ("witness A {0}\ngroup G any A none\nquorum G\n", "none"),
        ("witness none {0}\nquorum none\n", "predefined"),
        ("witness A {0}\ngroup G any G\nquorum G\n", "defined on a line before"),
        ("log {0}\nquorum none\n", "0x01"),  # a witness key given as a log's
        ("witness A {0}\nquorum A\nfrobnicate\n", "unknown keyword"),
        ("witness A {0}\x0bquorum A\n", "control character"),
    ],
)
def test_a_policy_that_breaks_a_rule_of_the_spec_is_refused(text, why):
    a, b = _vkeys(2)
    with pytest.raises(ValueError, match=why):
        parse_policy(text.format(a, b))


# --- a bundle's checkpoint against a policy ----------------------------------------------------


def test_a_checkpoint_no_listed_log_signed_is_log_not_in_policy_even_with_the_quorum():
    from loopwarden.audit.findings import Report
    from loopwarden.witnesses.witness_audit import check_bundle

    log, other = Signer.generate(), Signer.generate()
    root = hashlib.sha256(b"r").digest()
    witness = Cosigner("w.example/1", nacl.signing.SigningKey.generate())
    note = sign_checkpoint("example.com/log", 4, root, log)
    note += witness.cosign(checkpoint_body("example.com/log", 4, root), 1_700_000_000)
    listed = VerifierKey("example.com/log", ED25519, other.public_key)
    for log_key, expected in ((listed, {"log_not_in_policy"}), (None, set())):
        policy = parse_policy(
            (f"log {log_key}\n" if log_key else "") + f"witness W {witness.vkey}\nquorum W\n"
        )
        report = Report("bundle", tree_size=4)
        check_bundle(note, policy, "example.com/log", report)
        assert {str(f.code) for f in report.findings} == expected
        assert report.witnesses is not None and report.witnesses["quorum_met"]
