"""Offline proof bundles: one loop's receipts, provable with no database and no server.

A bundle holds the loop's envelopes (the exact canonical JSON text), the public keys that
signed them, a fresh signed checkpoint of the whole log, and an RFC 6962 inclusion proof of
every envelope against that checkpoint. `verify_bundle` checks all of it and replays the
receipts through the projection fold.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from loopwarden.canonical import canonical_bytes, sha256_digest
from loopwarden.errors import LoopwardenError
from loopwarden.ledger import merkle
from loopwarden.ledger.checkpoints import open_checkpoint
from loopwarden.ledger.events import ReceiptBody
from loopwarden.ledger.keys import Keyring, Signer, decode_public_key, public_key_b64
from loopwarden.ledger.projection import LoopView, ProjectionError, apply
from loopwarden.ledger.reader import Reader
from loopwarden.ledger.receipts import open_envelope, pae

BUNDLE_FORMAT = "loopwarden.bundle/v1"


MANIFEST_TYPE = "application/vnd.loopwarden.bundle-manifest+json; version=1"


def _manifest_message(manifest: dict[str, Any]) -> bytes:
    return pae(MANIFEST_TYPE, canonical_bytes(manifest))


def export_bundle(
    reader: Reader, loop_id: str, keyring: Keyring, exported_at: str, signer: Signer
) -> dict[str, Any]:
    """Build the bundle for `loop_id` against the latest checkpoint (which must cover the loop).

    The caller signs a fresh checkpoint first (`Txn.checkpoint`). The bundle carries a manifest
    signed by `signer` naming the loop's head (seq and digest) at export time, so a bundle with
    its last receipts cut off cannot pass for a complete one. Raises `LookupError` if the loop
    has no receipts or the checkpoint does not cover them.
    """
    rows = reader.loop_journal(loop_id)
    checkpoint = reader.latest_checkpoint()
    if not rows:
        raise LookupError(f"loop {loop_id!r} has no receipts")
    if checkpoint is None or checkpoint.size <= rows[-1].leaf_index:
        raise LookupError("no checkpoint covers the loop's last receipt")
    key_ids = sorted(
        {open_envelope(r.envelope, keyring).key_id or "" for r in rows}
        | {checkpoint.key_id, signer.key_id}
    )
    public = keyring.public_keys()
    manifest = {
        "loop_id": loop_id,
        "head_seq": rows[-1].seq,
        "head_digest": rows[-1].digest,
        "checkpoint_size": checkpoint.size,
        "exported_at": exported_at,
    }
    signature = signer.sign(_manifest_message(manifest))
    return {
        "format": BUNDLE_FORMAT,
        "origin": reader.meta("origin"),
        "loop_id": loop_id,
        "exported_at": exported_at,
        "public_keys": {k: public_key_b64(public[k]) for k in key_ids if k in public},
        "checkpoint": {
            "note": checkpoint.note,
            "size": checkpoint.size,
            "root": base64.b64encode(checkpoint.root).decode(),
        },
        "manifest": manifest,
        "manifest_signature": {
            "keyid": signer.key_id,
            "sig": base64.b64encode(signature).decode(),
        },
        "receipts": [
            {
                "leaf_index": r.leaf_index,
                "receipt_id": r.receipt_id,
                "envelope": r.envelope.decode(),
                "inclusion_proof": [
                    base64.b64encode(h).decode()
                    for h in merkle.inclusion_proof(r.leaf_index, checkpoint.size, reader.node)
                ],
            }
            for r in rows
        ],
    }


@dataclass
class BundleReport:
    loop_id: str = ""
    receipts: int = 0
    checkpoint_size: int = 0
    key_ids: list[str] = field(default_factory=list)
    pinned: bool = False
    status: str | None = None
    stop_reason: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": "clean" if self.clean else "tampered",
            "loop_id": self.loop_id,
            "receipts": self.receipts,
            "checkpoint_size": self.checkpoint_size,
            "key_ids": self.key_ids,
            "keys_pinned": self.pinned,
            "status": self.status,
            "stop_reason": self.stop_reason,
            "findings": self.findings,
        }


def verify_bundle(bundle: Any, trusted: Keyring | None = None) -> BundleReport:
    """Verify a bundle. Never raises on bad data: every defect is a finding.

    With `trusted` keys, only those keys are accepted (a bundle signed by any other key fails
    with `unknown_key`); without, the bundle's own public keys are used and the report says the
    keys were not pinned.
    """
    report = BundleReport(pinned=trusted is not None)

    def add(code: str, message: str, **where: Any) -> None:
        report.findings.append({"code": code, "message": message, **where})

    try:
        if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"not a {BUNDLE_FORMAT} document")
        report.loop_id = str(bundle["loop_id"])
        keyring = trusted or Keyring(
            {str(k): decode_public_key(str(v)) for k, v in dict(bundle["public_keys"]).items()}
        )
        report.key_ids = keyring.ids()
        note = bundle["checkpoint"]["note"]
        items = list(bundle["receipts"])
        manifest = bundle["manifest"]
        manifest_sig = bundle["manifest_signature"]
        if not isinstance(note, str) or not isinstance(manifest, dict):
            raise ValueError("checkpoint note or manifest has the wrong type")
        manifest_key = str(manifest_sig["keyid"])
        manifest_sig_bytes = base64.b64decode(str(manifest_sig["sig"]), validate=True)
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        binascii.Error,
        LoopwardenError,
    ) as exc:
        add("bundle_malformed", f"the bundle cannot be read: {exc}")
        return report

    try:
        manifest_ok = keyring.verify(manifest_key, _manifest_message(manifest), manifest_sig_bytes)
    except LoopwardenError:
        manifest_ok = False
    if manifest_key not in keyring:
        add("manifest_unknown_key", "the manifest is signed by an untrusted key")
    elif not manifest_ok:
        add("manifest_signature_invalid", "the manifest signature does not verify")

    signed = open_checkpoint(note, keyring)
    report.checkpoint_size = signed.size
    if signed.problem == "unknown_key":
        add("checkpoint_unknown_key", "the checkpoint is signed by an untrusted key")
    elif not signed.verified:
        add("checkpoint_signature_invalid", "the checkpoint signature does not verify")
    if signed.origin != bundle.get("origin"):
        add("checkpoint_malformed", "the checkpoint's origin is not the bundle's origin")

    view: LoopView | None = None
    previous: str | None = None
    for position, item in enumerate(items, start=1):
        try:
            envelope = str(item["envelope"]).encode()
            leaf_index = int(item["leaf_index"])
            proof = [base64.b64decode(h, validate=True) for h in item["inclusion_proof"]]
        except (KeyError, TypeError, ValueError, binascii.Error):
            add("bundle_malformed", f"receipt #{position} is malformed", position=position)
            continue
        where = {"position": position, "leaf_index": leaf_index}
        opened = open_envelope(envelope, keyring)
        for problem in opened.problems:
            add(problem, f"receipt #{position}: {problem.replace('_', ' ')}", **where)
        if not merkle.verify_inclusion(
            merkle.leaf_hash(envelope), leaf_index, signed.size, proof, signed.root
        ):
            add("inclusion_invalid", f"receipt #{position} is not in the checkpointed log", **where)
        digest = sha256_digest(envelope)
        try:
            body = ReceiptBody.model_validate(opened.body)
        except ValidationError:
            add("schema_invalid", f"receipt #{position} does not match the receipt schema", **where)
            break
        if body.loop_id != report.loop_id:
            add("index_mismatch", f"receipt #{position} belongs to loop {body.loop_id}", **where)
        if body.seq != position:
            add("seq_gap", f"receipt #{position} has seq {body.seq}", **where)
            break
        if body.prev != previous:
            add("prev_mismatch", f"receipt #{position} does not chain to its predecessor", **where)
            break
        previous = digest
        try:
            view = apply(view, body, digest)
        except (ProjectionError, ValidationError) as exc:
            add("projection_mismatch", f"receipt #{position} does not fold: {exc}", **where)
            break
        report.receipts += 1
    if not items:
        add("bundle_malformed", "the bundle holds no receipts")
    elif (
        manifest.get("loop_id") != report.loop_id
        or manifest.get("head_seq") != len(items)
        or (manifest.get("head_digest") != previous)
    ):
        add(
            "bundle_incomplete",
            f"the manifest names head seq {manifest.get('head_seq')} of loop "
            f"{manifest.get('loop_id')}, but the bundle's receipts end at seq {report.receipts}",
        )
    if view is not None:
        report.status = view.loop.status
        report.stop_reason = view.loop.stop_reason
    return report


def load_bundle(text: str) -> Any:
    """Parse bundle JSON; a syntax error becomes a bundle the verifier reports as malformed."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None
