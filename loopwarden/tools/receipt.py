"""`receipt`: one signed envelope, decoded, verified, with its Merkle inclusion proof."""

from __future__ import annotations

import base64
from typing import Any

from pydantic import Field, model_validator

from loopwarden.errors import NotFound
from loopwarden.ledger import merkle
from loopwarden.ledger.checkpoints import open_checkpoint
from loopwarden.ledger.events import RECEIPT_ID_PATTERN, LoopId
from loopwarden.ledger.reader import Reader
from loopwarden.ledger.receipts import open_envelope
from loopwarden.ledger.store import Txn
from loopwarden.principals import Principal
from loopwarden.tools.common import Model, require_loop, require_visible
from loopwarden.tools.kernel import Kernel


class ReceiptRequest(Model):
    receipt_id: str | None = Field(default=None, pattern=RECEIPT_ID_PATTERN)
    loop_id: LoopId | None = None
    seq: int | None = Field(default=None, ge=1, le=2**53)

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
    signed_at: str
    verified: bool


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
    inclusion_proof: InclusionProof
    checkpoint: CheckpointOut


async def receipt(kernel: Kernel, who: Principal, req: ReceiptRequest) -> ReceiptResult:
    """Fetch a receipt by id or by (loop_id, seq) with everything needed to check it offline.

    If the latest checkpoint predates the receipt, a fresh checkpoint is signed first, so the
    inclusion proof always covers it. `NotFound` for an unknown receipt; `Forbidden` for an agent
    the receipt's loop does not admit.
    """

    def locate(reader: Reader) -> tuple[int, int]:
        row = (
            reader.receipt_by_id(req.receipt_id)
            if req.receipt_id is not None
            else reader.receipt_by_seq(req.loop_id, req.seq)  # type: ignore[arg-type]
        )
        if row is None:
            what = req.receipt_id or f"{req.loop_id} #{req.seq}"
            raise NotFound(f"no receipt {what}")
        require_visible(reader, require_loop(reader, row.loop_id), who)
        latest = reader.latest_checkpoint()
        return row.leaf_index, latest.size if latest else 0

    leaf_index, covered = await kernel.store.read(locate)
    if covered <= leaf_index:
        await kernel.store.write(Txn.checkpoint)

    def read(reader: Reader) -> ReceiptResult:
        row = reader.receipt_at(leaf_index)
        checkpoint = reader.latest_checkpoint()
        assert row is not None and checkpoint is not None
        opened = open_envelope(row.envelope, kernel.keyring)
        proof = merkle.inclusion_proof(leaf_index, checkpoint.size, reader.node)
        signed = open_checkpoint(checkpoint.note, kernel.keyring)
        proof_ok = merkle.verify_inclusion(
            merkle.leaf_hash(row.envelope), leaf_index, checkpoint.size, proof, signed.root
        )
        return ReceiptResult(
            receipt_id=row.receipt_id,
            loop_id=row.loop_id,
            seq=row.seq,
            kind=row.kind,
            digest=row.digest,
            envelope=opened.envelope,
            body=opened.body,
            verified=opened.verified,
            problems=list(opened.problems),
            inclusion_proof=InclusionProof(
                leaf_index=leaf_index,
                tree_size=checkpoint.size,
                hashes=[base64.b64encode(h).decode() for h in proof],
                verified=proof_ok,
            ),
            checkpoint=CheckpointOut(
                size=checkpoint.size,
                root=base64.b64encode(checkpoint.root).decode(),
                note=checkpoint.note,
                key_id=checkpoint.key_id,
                signed_at=checkpoint.signed_at,
                verified=signed.verified and signed.size == checkpoint.size,
            ),
        )

    return await kernel.store.read(read)
