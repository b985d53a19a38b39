"""Offline proof bundles: one loop's receipts, provable with no database and no server.

A bundle holds the loop's envelopes (the exact canonical JSON text), the public keys that
signed them, a signed checkpoint of the whole log with the witnesses' cosignatures it gathered,
and an RFC 6962 inclusion proof of every envelope against that checkpoint — beside it, and as
a C2SP tlog-proof (`kernel/log/tlog_proofs.py`) any tlog-proof verifier can check with the
envelope as the entry. The tlog-proofs do not replace the bundle's other parts: a loop's
receipts need their envelopes, keys, chain and the signed manifest naming the head too, so that
a bundle with receipts cut off cannot pass for a complete one. `verify_bundle` checks all of it
and replays the receipts through the fold; the witnesses' part is `witnesses/witness_audit.py`.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from loopwarden.audit.findings import ENVELOPE_PROBLEMS, FindingCode, Report
from loopwarden.audit.replay import judged
from loopwarden.canonical import canonical_bytes, sha256_digest
from loopwarden.clock import format_time
from loopwarden.errors import IntegrityError, LoopwardenError
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import Checkpoint, cosigned_note, open_checkpoint
from loopwarden.kernel.log.keys import Keyring, Signer, decode_public_key, public_key_b64
from loopwarden.kernel.log.seals import Opened, open_envelope, pae
from loopwarden.kernel.log.tlog_proofs import format_proof, parse_proof
from loopwarden.kernel.state.events import ReceiptBody
from loopwarden.kernel.state.fold import FoldError, chain_problem
from loopwarden.kernel.state.judge import Judge, Verdict
from loopwarden.kernel.state.rows import LoopView
from loopwarden.kernel.store.reader import CheckpointRow, JournalRow, Reader
from loopwarden.kinds import KINDS

BUNDLE_FORMAT = "loopwarden.bundle/v1"


MANIFEST_TYPE = "application/vnd.loopwarden.bundle-manifest+json; version=1"


def _manifest_message(manifest: dict[str, Any]) -> bytes:
    return pae(MANIFEST_TYPE, canonical_bytes(manifest))


def export_bundle(
    reader: Reader,
    loop_id: str,
    keyring: Keyring,
    exported_at: datetime,
    signer: Signer,
    *,
    size: int | None = None,
) -> dict[str, Any]:
    """Build the bundle for `loop_id` against the checkpoint of `size` (default: the latest),
    which must cover the loop, with the cosignatures stored for it.

    The caller signs a fresh checkpoint first (`Store.checkpoint`). The bundle carries a manifest
    signed by `signer` naming the loop's head (seq and digest) at export time, so a bundle with
    its last receipts cut off cannot pass for a complete one. Raises `LookupError` if the loop
    has no receipts or the checkpoint does not cover them.
    """
    rows = reader.loop_journal(loop_id)
    checkpoint = _covering(reader, loop_id, rows, size)
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
        "exported_at": format_time(exported_at),
    }
    signature = signer.sign(_manifest_message(manifest))
    note = cosigned_note(checkpoint.note, [c.line for c in reader.cosignatures(checkpoint.size)])
    proofs = {r.leaf: _proof(reader, r, checkpoint) for r in rows}
    return {
        "format": BUNDLE_FORMAT,
        "origin": reader.meta("origin"),
        "loop_id": loop_id,
        "exported_at": format_time(exported_at),
        "public_keys": {k: public_key_b64(public[k]) for k in key_ids if k in public},
        "checkpoint": {
            "note": note,
            "size": checkpoint.size,
            "root": base64.b64encode(checkpoint.root).decode(),
        },
        "manifest": manifest,
        "manifest_signature": {
            "keyid": signer.key_id,
            "sig": base64.b64encode(signature).decode(),
        },
        "receipts": [_bundled(r, proofs[r.leaf], note) for r in rows],
    }


def _covering(
    reader: Reader, loop_id: str, rows: list[JournalRow], size: int | None
) -> CheckpointRow:
    """The checkpoint of `size` (default: the latest) if it covers the loop's last receipt;
    `LookupError` otherwise."""
    checkpoint = reader.latest_checkpoint() if size is None else reader.checkpoint_of(size)
    if not rows:
        raise LookupError(f"loop {loop_id!r} has no receipts")
    if rows[-1].leaf_index is None:
        raise LookupError("the loop's last receipts are still pending integration; retry")
    if checkpoint is None or checkpoint.size <= rows[-1].leaf:
        raise LookupError("no checkpoint covers the loop's last receipt")
    return checkpoint


def _bundled(row: JournalRow, proof: list[bytes], note: str) -> dict[str, Any]:
    """One receipt as a bundle carries it: its envelope, its inclusion proof, its tlog-proof."""
    return {
        "leaf_index": row.leaf_index,
        "receipt_id": row.receipt_id,
        "envelope": row.envelope.decode(),
        "inclusion_proof": [base64.b64encode(h).decode() for h in proof],
        "tlog_proof": format_proof(row.leaf, proof, note),
    }


def witnessed_size(reader: Reader, loop_id: str) -> int | None:
    """The largest checkpoint covering `loop_id`'s last receipt that a witness has cosigned
    (None if none has: the latest checkpoint is used then)."""
    rows = reader.loop_journal(loop_id)
    if not rows or rows[-1].leaf_index is None:
        return None
    cosigned = {c.size for c in reader.cosignatures() if c.size > rows[-1].leaf}
    return max(cosigned) if cosigned else None


def _proof(reader: Reader, row: JournalRow, checkpoint: CheckpointRow) -> list[bytes]:
    """A receipt's inclusion proof, checked against the checkpoint before it is handed out: a
    stored Merkle node that is not the receipts' would make a bundle that fails offline."""
    proof = merkle.inclusion_proof(row.leaf, checkpoint.size, reader.node)
    leaf = merkle.leaf_hash(row.envelope)
    if not merkle.verify_inclusion(leaf, row.leaf, checkpoint.size, proof, checkpoint.root):
        raise IntegrityError(
            f"the stored Merkle nodes do not prove receipt {row.receipt_id} into checkpoint "
            f"{checkpoint.size}: no bundle was written (run loopwarden verify)"
        )
    return proof


@dataclass(frozen=True)
class _Parts:
    """A bundle's parts, read (not yet checked)."""

    keyring: Keyring
    note: str
    items: list[Any]
    manifest: dict[str, Any]
    manifest_key: str
    manifest_sig: bytes


def _parts(bundle: Any, trusted: Keyring | None, report: Report) -> _Parts | None:
    try:
        if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"not a {BUNDLE_FORMAT} document")
        report.loop_id = str(bundle["loop_id"])
        keyring = trusted or Keyring(
            {str(k): decode_public_key(str(v)) for k, v in dict(bundle["public_keys"]).items()}
        )
        report.key_ids = keyring.ids()
        note, manifest = bundle["checkpoint"]["note"], bundle["manifest"]
        signature = bundle["manifest_signature"]
        if not isinstance(note, str) or not isinstance(manifest, dict):
            raise ValueError("checkpoint note or manifest has the wrong type")
        return _Parts(
            keyring,
            note,
            list(bundle["receipts"]),
            manifest,
            str(signature["keyid"]),
            base64.b64decode(str(signature["sig"]), validate=True),
        )
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        binascii.Error,
        LoopwardenError,
    ) as exc:
        report.add(FindingCode.BUNDLE_MALFORMED, f"the bundle cannot be read: {exc}")
        return None


def _check_signed(parts: _Parts, origin: object, report: Report) -> Checkpoint:
    """The manifest's and the checkpoint's signatures, and the checkpoint's origin."""
    try:
        manifest_ok = parts.keyring.verify(
            parts.manifest_key, _manifest_message(parts.manifest), parts.manifest_sig
        )
    except LoopwardenError:
        manifest_ok = False
    if parts.manifest_key not in parts.keyring:
        report.add(FindingCode.MANIFEST_UNKNOWN_KEY, "the manifest is signed by an untrusted key")
    elif not manifest_ok:
        report.add(FindingCode.MANIFEST_SIGNATURE_INVALID, "the manifest signature does not verify")
    signed = open_checkpoint(parts.note, parts.keyring)
    report.tree_size = signed.size
    if signed.problem == "unknown_key":
        report.add(
            FindingCode.CHECKPOINT_UNKNOWN_KEY, "the checkpoint is signed by an untrusted key"
        )
    elif not signed.verified:
        report.add(
            FindingCode.CHECKPOINT_SIGNATURE_INVALID, "the checkpoint signature does not verify"
        )
    if signed.origin != origin:
        report.add(
            FindingCode.CHECKPOINT_MALFORMED, "the checkpoint's origin is not the bundle's origin"
        )
    return signed


@dataclass(frozen=True)
class _Item:
    """One receipt of a bundle, read and checked against its signature and the log."""

    envelope: bytes
    opened: Opened
    where: dict[str, int]
    altered: bool  # not the receipt that was signed and logged (reported once)


def _read_item(
    parts: _Parts, signed: Checkpoint, item: Any, position: int, report: Report
) -> _Item | None:
    """Read bundle item `position` and check it is what was signed and logged. One finding
    per receipt: its first envelope problem (the message names the others), else
    `inclusion_invalid` (not judged against a checkpoint whose own signature fails). None if
    the item is malformed."""
    try:
        envelope = str(item["envelope"]).encode()
        leaf_index = int(item["leaf_index"])
        proof = [base64.b64decode(h, validate=True) for h in item["inclusion_proof"]]
    except (KeyError, TypeError, ValueError, binascii.Error):
        report.add(
            FindingCode.BUNDLE_MALFORMED, f"receipt #{position} is malformed", position=position
        )
        return None
    where = {"position": position, "leaf_index": leaf_index}
    differs = "tlog_proof" in item and not _same_proof(item["tlog_proof"], leaf_index, proof, parts)
    opened = open_envelope(envelope, parts.keyring)
    if opened.problems:  # one finding, naming every problem of this envelope
        first, *more = (ENVELOPE_PROBLEMS[p] for p in opened.problems)
        also = "".join(f"; and {text}" for text in more)
        report.add(opened.problems[0], f"receipt #{position}: {first}{also}", **where)
    leaf = merkle.leaf_hash(envelope)
    logged = merkle.verify_inclusion(leaf, leaf_index, signed.size, proof, signed.root)
    if signed.problem == "signature_invalid":
        logged = True  # an edited checkpoint proves nothing either way; its one finding says so
    if not logged and not opened.problems:
        report.add(
            FindingCode.INCLUSION_INVALID,
            f"receipt #{position} is not in the checkpointed log",
            **where,
        )
    elif differs and not opened.problems and signed.problem is None:  # the tlog-proof edited
        report.add(
            FindingCode.BUNDLE_MALFORMED,
            f"receipt #{position}'s tlog-proof is not its inclusion proof in the bundle's "
            "checkpoint",
            **where,
        )
    return _Item(envelope, opened, where, altered=bool(opened.problems) or not logged)


def _same_proof(text: Any, index: int, proof: list[bytes], parts: _Parts) -> bool:
    """Whether a receipt's tlog-proof says what the bundle beside it says: one proof, two
    shapes (a generic verifier reads the one, this one reads the other)."""
    try:
        read = parse_proof(str(text))
    except ValueError:
        return False
    return (read.index, list(read.proof), read.checkpoint) == (index, proof, parts.note)


@dataclass
class _Replayed:
    view: LoopView | None
    head: str | None  # the last receipt's digest
    last_altered: bool  # whether the last receipt is not the one that was logged
    ending: list[Verdict]  # the judge's verdicts on the end of the receipts (a stop owed)


def _chains(
    report: Report,
    position: int,
    previous: str | None,
    body: ReceiptBody,
    after_altered: LoopView | None,
    where: dict[str, int],
) -> bool:
    """Whether receipt #`position` continues the chain (a finding if not). `after_altered` is
    the view when its predecessor was altered and already reported: then `prev` names the
    genuine receipt, which is not in the bundle to check, so its word is taken for the head."""
    broken = chain_problem(position - 1, previous, body)
    if broken == "prev_mismatch" and after_altered is not None and body.prev:
        after_altered.loop = replace(after_altered.loop, head_digest=body.prev)
        return True
    if broken is not None:
        what = f"has seq {body.seq}" if broken == "seq_gap" else "does not chain to its predecessor"
        report.add(broken, f"receipt #{position} {what}", **where)
        return False
    return True


def _replay(parts: _Parts, signed: Checkpoint, report: Report) -> _Replayed:
    """Check, judge and fold the receipts in order; the first one that breaks the chain ends
    the replay (what follows it cannot be judged).

    One finding per cause: an altered receipt is reported once (`_read_item`), and its
    successor's `prev`, which names the genuine receipt's digest, is not reported again as a
    broken chain."""
    view: LoopView | None = None
    previous: str | None = None
    altered = False  # the previous receipt is not the one that was logged
    judge = Judge(
        KINDS, keys_known=False
    )  # one loop's receipts: a key's earlier use may be elsewhere
    for position, raw in enumerate(parts.items, start=1):
        item = _read_item(parts, signed, raw, position, report)
        if item is None:
            continue
        where, digest = item.where, sha256_digest(item.envelope)
        follows_altered, altered = altered, item.altered
        try:
            body = KINDS.parse_body(item.opened.body)
        except ValidationError:
            report.add(
                FindingCode.SCHEMA_INVALID,
                f"receipt #{position} does not match the receipt schema",
                **where,
            )
            break
        if body.loop_id != report.loop_id:
            report.add(
                FindingCode.INDEX_MISMATCH,
                f"receipt #{position} belongs to loop {body.loop_id}",
                **where,
            )
        if not _chains(report, position, previous, body, view if follows_altered else None, where):
            break
        previous = digest
        if not item.altered:  # an altered receipt is reported already; its decision is not its
            judged(report, judge, view, body, **where)
        try:
            view = KINDS.apply(view, body, digest)
        except FoldError as exc:
            report.add(
                FindingCode.PROJECTION_MISMATCH,
                f"receipt #{position} does not fold: {exc}",
                **where,
            )
            break
        judge.after(view, body)
        report.receipts += 1
    ending = [] if view is None else judge.end({view.loop.loop_id: view}).get(view.loop.loop_id, [])
    return _Replayed(view, previous, altered, ending)


ALTERED_RECEIPT = frozenset(ENVELOPE_PROBLEMS) | {"inclusion_invalid"}
REPLAYED_THROUGH = ALTERED_RECEIPT | {"decision_illegal"}  # findings that end no replay


def _ends_early(parts: _Parts, report: Report, head: str | None, last_altered: bool) -> bool:
    """Whether the receipts stop before the head the signed manifest names. Judged only when
    that is a cause of its own: every receipt replayed, and nothing found but altered receipts
    (whose digest, if the last one, is not compared: it is reported already) or illegal
    decisions."""
    if report.receipts != len(parts.items):
        return False
    if any(f.code not in REPLAYED_THROUGH for f in report.findings):
        return False
    manifest = parts.manifest
    return (
        manifest.get("loop_id") != report.loop_id
        or manifest.get("head_seq") != len(parts.items)
        or (manifest.get("head_digest") != head and not last_altered)
    )


def verify_bundle(bundle: Any, trusted: Keyring | None = None) -> Report:
    """Verify a bundle. Never raises on bad data: every defect is a finding.

    With `trusted` keys, only those keys are accepted (a bundle signed by any other key fails
    with `unknown_key`); without, the bundle's own public keys are used and the report says the
    keys were not pinned.
    """
    report = Report("bundle", keys_pinned=trusted is not None)
    parts = _parts(bundle, trusted, report)
    if parts is None:
        return report
    signed = _check_signed(parts, bundle.get("origin"), report)
    replayed = _replay(parts, signed, report)
    view = replayed.view
    if not parts.items:
        report.add(FindingCode.BUNDLE_MALFORMED, "the bundle holds no receipts")
    elif _ends_early(parts, report, replayed.head, replayed.last_altered):
        manifest = parts.manifest
        report.add(
            FindingCode.BUNDLE_INCOMPLETE,
            f"the manifest names head seq {manifest.get('head_seq')} of loop "
            f"{manifest.get('loop_id')}, but the bundle's receipts end at seq {report.receipts}",
        )
    else:  # a stop owed at the end is judged only on receipts that are all there
        for verdict in replayed.ending:
            report.add(FindingCode.DECISION_ILLEGAL, verdict.message, rule=verdict.rule)
    if view is not None:
        report.status = str(view.loop.status)
        report.stop_reason = view.loop.stop_reason
        pools = sorted({name for turn in view.turns.values() for name in turn.pools})
        if pools:
            report.notes.append(
                f"the loop's turns drew from budget pools ({', '.join(pools)}): whether a pool "
                "had room is judged with the whole journal (`loopwarden verify`), not one loop's"
            )
    return report


def load_bundle(text: str) -> Any:
    """Parse bundle JSON; a syntax error becomes a bundle the verifier reports as malformed."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None
