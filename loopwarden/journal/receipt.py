"""`receipt`: one signed envelope, decoded, verified, with its Merkle inclusion proof."""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import Field, model_validator

from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import open_checkpoint, sign_checkpoint
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.runner.operation import Call
from loopwarden.kernel.runner.results import Model, from_row
from loopwarden.kernel.runner.runner import NeedsPublication, operation
from loopwarden.kernel.runner.visibility import by_receipt
from loopwarden.kernel.state.events import MAX_FENCE, RECEIPT_ID_PATTERN, LoopId, Timestamp
from loopwarden.kernel.store.reader import CheckpointRow, Reader
from loopwarden.kernel.store.store import Store


class ReceiptRequest(Model):
    receipt_id: str | None = Field(
        default=None, pattern=RECEIPT_ID_PATTERN, description="The receipt id (rcpt-…)."
    )
    loop_id: LoopId | None = Field(default=None, description="With seq: the loop of the receipt.")
    seq: int | None = Field(
        default=None, ge=1, le=MAX_FENCE, description="With loop_id: the receipt's sequence number."
    )
    wait: bool = Field(
        default=False,
        description="Wait until the receipt is published under a stored signed checkpoint "
        "(a moment: the server integrates what is pending and signs one).",
    )

    @model_validator(mode="after")
    def _one_address(self) -> ReceiptRequest:
        by_id = self.receipt_id is not None and self.loop_id is None and self.seq is None
        by_seq = self.receipt_id is None and self.loop_id is not None and self.seq is not None
        if not (by_id or by_seq):
            raise ValueError("give either receipt_id, or loop_id and seq")
        return self


class InclusionProof(Model):
    leaf_index: int
    tree_size: int
    hashes: list[str] = Field(description="Audit path, base64, leaf side first (RFC 6962).")
    verified: bool = Field(
        description="The path leads from this envelope's leaf to the checkpoint root."
    )


class CheckpointOut(Model):
    size: int
    root: str = Field(description="Merkle root, base64.")
    note: str = Field(description="The signed checkpoint (C2SP signed note).")
    key_id: str
    signed_at: Timestamp
    verified: bool
    stored: bool = Field(
        description="Kept by the store (the receipt is published). False: signed for this "
        "answer only and not kept; the store keeps one every 256 receipts, or on `loopwarden "
        "checkpoint`."
    )


ReceiptState = Literal["sealed", "integrated", "published"]


class ReceiptResult(Model):
    receipt_id: str
    loop_id: str
    seq: int
    kind: str
    digest: str
    envelope: dict[str, Any] = Field(description="The DSSE envelope as stored.")
    body: dict[str, Any] = Field(description="The decoded, signed receipt body.")
    verified: bool = Field(description="Signature valid under a trusted key and body canonical.")
    problems: list[str]
    state: ReceiptState = Field(
        description="sealed: durable in its loop's chain, not yet in the Merkle tree (no proof "
        "yet: ask again, or with wait); integrated: in the tree, proved against a checkpoint "
        "signed for this answer; published: under a checkpoint the store keeps."
    )
    inclusion_proof: InclusionProof | None = Field(description="None while the receipt is sealed.")
    checkpoint: CheckpointOut | None = Field(description="None while the receipt is sealed.")


def covering_checkpoint(
    reader: Reader, store: Store, leaf_index: int
) -> tuple[CheckpointRow, bool]:
    """The latest stored checkpoint if it covers `leaf_index` (and True); else a checkpoint of
    the tree as it stands, signed now and not stored (and False: reading stays read-only)."""
    latest = reader.latest_checkpoint()
    if latest is not None and latest.size > leaf_index:
        return latest, True
    size, frontier = reader.log_state()
    root = merkle.root_from_frontier(frontier)
    note = sign_checkpoint(store.origin, size, root, store.signer)
    return CheckpointRow(size, root, note, store.signer.key_id, store.clock()), False


@operation(access="read", scope=by_receipt)
def receipt(call: Call[Reader], req: ReceiptRequest) -> ReceiptResult:
    """Fetch a signed receipt with its verification status and Merkle inclusion proof.

    Address it by `receipt_id`, or by `loop_id` and `seq`. Use it to prove what happened.

    \f
    A receipt by id or by (loop_id, seq) with everything needed to check it offline: the
    envelope, the decoded body, its verification under the trusted keys, and an inclusion proof
    against a signed checkpoint that covers it.
    """
    reader, store = call.tx, call.store
    assert call.found is not None and call.found.receipt is not None
    row = call.found.receipt
    latest = reader.latest_checkpoint()
    published = row.leaf_index is not None and latest is not None and latest.size > row.leaf_index
    if req.wait and not published and not call.waited:
        raise NeedsPublication()
    opened = open_envelope(row.envelope, store.keyring)
    return from_row(
        ReceiptResult,
        row,
        envelope=opened.envelope,
        body=opened.body,
        verified=opened.verified,
        problems=list(opened.problems),
        state="published" if published else "sealed" if row.leaf_index is None else "integrated",
        **(_proved(reader, store, row.leaf_index, row.envelope) if row.leaf_index is not None else
           {"inclusion_proof": None, "checkpoint": None}),
    )  # fmt: skip


def _proved(reader: Reader, store: Store, leaf_index: int, envelope: bytes) -> dict[str, Any]:
    """An integrated receipt's inclusion proof against a checkpoint that covers it."""
    checkpoint, stored = covering_checkpoint(reader, store, leaf_index)
    proof = merkle.inclusion_proof(leaf_index, checkpoint.size, reader.node)
    signed = open_checkpoint(checkpoint.note, store.keyring)
    proof_ok = merkle.verify_inclusion(
        merkle.leaf_hash(envelope), leaf_index, checkpoint.size, proof, signed.root
    )
    return {
        "inclusion_proof": InclusionProof(
            leaf_index=leaf_index,
            tree_size=checkpoint.size,
            hashes=[base64.b64encode(h).decode() for h in proof],
            verified=proof_ok,
        ),
        "checkpoint": CheckpointOut(
            size=checkpoint.size,
            root=base64.b64encode(checkpoint.root).decode(),
            note=checkpoint.note,
            key_id=checkpoint.key_id,
            signed_at=checkpoint.signed_at,
            verified=signed.verified and signed.size == checkpoint.size,
            stored=stored,
        ),
    }
