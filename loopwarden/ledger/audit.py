"""The full audit of a database: signatures, schema, chains, Merkle log, checkpoints, projection.

`audit(reader, keyring)` streams the journal once in leaf order and checks, for every receipt:
its DSSE signature under a *trusted* key (the key directory, never the database's own key
table), canonical form, body schema, digest and index columns, the per-loop `seq`/`prev` chain;
it recomputes the Merkle tree as it goes and compares the root with every signed checkpoint,
checks each checkpoint consistent with the previous one, compares the stored frontier, and
finally replays every loop's receipts through the projection fold and compares the result with
the stored projection tables. Every defect is a typed `Finding`; nothing raises on bad data.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields

from pydantic import ValidationError

from loopwarden.canonical import sha256_digest
from loopwarden.errors import LoopwardenError
from loopwarden.ledger import merkle
from loopwarden.ledger.checkpoints import open_checkpoint
from loopwarden.ledger.events import ReceiptBody
from loopwarden.ledger.keys import Keyring
from loopwarden.ledger.projection import LoopView, ProjectionError, apply
from loopwarden.ledger.reader import CheckpointRow, JournalRow, Reader
from loopwarden.ledger.receipts import open_envelope, receipt_id_for, signature_problems

FINDING_CODES = (
    "signature_invalid",
    "unknown_key",
    "envelope_malformed",
    "payload_type_mismatch",
    "payload_malformed",
    "schema_invalid",
    "digest_mismatch",
    "index_mismatch",
    "leaf_gap",
    "seq_gap",
    "prev_mismatch",
    "root_mismatch",
    "checkpoint_malformed",
    "checkpoint_signature_invalid",
    "checkpoint_unknown_key",
    "checkpoint_inconsistent",
    "checkpoint_beyond_journal",
    "frontier_mismatch",
    "projection_mismatch",
)


@dataclass(frozen=True)
class Finding:
    code: str
    message: str
    loop_id: str | None = None
    seq: int | None = None
    receipt_id: str | None = None
    leaf_index: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class AuditReport:
    receipts: int = 0
    loops: int = 0
    checkpoints: int = 0
    tree_size: int = 0
    root: str = ""
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, object]:
        return {
            "verdict": "clean" if self.clean else "tampered",
            "receipts": self.receipts,
            "loops": self.loops,
            "checkpoints": self.checkpoints,
            "tree_size": self.tree_size,
            "root": self.root,
            "seconds": round(self.seconds, 3),
            "findings": [f.as_dict() for f in self.findings],
        }


_ENVELOPE_PROBLEMS = {
    "signature_invalid": "the signature does not verify",
    "unknown_key": "signed by a key that is not trusted",
    "envelope_malformed": "the envelope is not a DSSE envelope",
    "payload_type_mismatch": "the payloadType is not a loopwarden receipt",
    "payload_malformed": "the payload is not a JSON object",
}


@dataclass
class _LoopChain:
    seq: int = 0
    digest: str | None = None
    view: LoopView | None = None
    broken: bool = False


def diff_views(stored: LoopView, rebuilt: LoopView) -> list[str]:
    """Human-readable differences between two views of one loop (empty if equal)."""
    out = []
    if stored.loop != rebuilt.loop:
        for f in fields(stored.loop):
            a, b = getattr(stored.loop, f.name), getattr(rebuilt.loop, f.name)
            if a != b:
                out.append(f"loop.{f.name}: stored {a!r}, receipts say {b!r}")
    if stored.policy != rebuilt.policy:
        out.append("the stored policy differs from the one the loop was opened with")
    for table in ("todos", "turns", "approvals"):
        mine, theirs = getattr(stored, table), getattr(rebuilt, table)
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                if key not in theirs:
                    out.append(f"{table}[{key}] is stored but no receipt creates it")
                elif key not in mine:
                    out.append(f"{table}[{key}] is missing from the stored projection")
                else:
                    changed = [
                        f.name
                        for f in fields(mine[key])
                        if getattr(mine[key], f.name) != getattr(theirs[key], f.name)
                    ]
                    out.append(f"{table}[{key}] differs in {', '.join(changed)}")
    return out


BATCH = 1024
PARALLEL_FROM = 4096  # receipts; below this, worker start-up costs more than it saves


class _Done:
    """A finished result with the `Future.result()` shape."""

    def __init__(self, value: list[tuple[str, ...]]) -> None:
        self._value = value

    def result(self) -> list[tuple[str, ...]]:
        return self._value


@contextmanager
def _signature_checker(total: int, workers: int | None) -> Iterator[Callable]:
    """Signature checks for a batch, returned as a future.

    Ed25519 verification is most of an audit's cost and PyNaCl holds the GIL, so on a large
    journal it runs in worker processes while this process parses, folds and hashes the same
    batch. Small journals (or `workers=0`) check inline.
    """
    count = workers if workers is not None else max((os.cpu_count() or 1) - 1, 1)
    if count < 1 or total < PARALLEL_FROM or (os.cpu_count() or 1) < 2:
        yield lambda envelopes, keys: _Done(signature_problems(envelopes, keys))
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        yield lambda envelopes, keys: pool.submit(signature_problems, envelopes, keys)


def _batches(rows: Iterable[JournalRow], size: int) -> Iterator[list[JournalRow]]:
    batch: list[JournalRow] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def audit(
    reader: Reader,
    keyring: Keyring,
    *,
    loop_id: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> AuditReport:
    """Audit the database behind `reader` against the trusted `keyring`.

    With `loop_id`, only that loop's receipts are checked in depth and folded, but the Merkle
    tree, checkpoints and frontier are always checked over the whole journal (a loop's proof
    depends on all of it). `progress(done, total)` is called every 1024 receipts. `workers`
    sets how many processes verify signatures (default: one fewer than the CPUs; 0 = inline).

    Signatures bind the exact stored bytes, so the audit does not re-serialize payloads to
    RFC 8785 (seal refuses to sign anything else; `receipt` and bundle checks still do).
    """
    started = time.perf_counter()
    report = AuditReport()
    total = reader.journal_count()
    checkpoints = reader.checkpoints()
    pending = list(checkpoints)
    chains: dict[str, _LoopChain] = {}
    frontier: list[bytes] = []
    size = 0

    def add(code: str, message: str, row: JournalRow | None = None, **extra: object) -> None:
        if row is not None:
            extra = {
                "loop_id": row.loop_id,
                "seq": row.seq,
                "receipt_id": row.receipt_id,
                "leaf_index": row.leaf_index,
                **extra,
            }
        report.findings.append(Finding(code, message, **extra))  # type: ignore[arg-type]

    expected = 0  # the next leaf index the journal should hold
    keys = keyring.public_keys()
    with _signature_checker(total, workers) as check_signatures:
        for batch in _batches(reader.iter_journal(), BATCH):
            in_scope = [row for row in batch if loop_id is None or row.loop_id == loop_id]
            signatures = check_signatures([row.envelope for row in in_scope], keys)
            for row in batch:
                if row.leaf_index != expected:
                    add(
                        "leaf_gap",
                        f"leaf {expected} is missing; the journal jumps to {row.leaf_index}",
                        row,
                    )
                expected = row.leaf_index + 1
                frontier, _ = merkle.append_leaf(frontier, size, merkle.leaf_hash(row.envelope))
                size += 1
                while pending and pending[0].size == size:
                    _check_root(pending.pop(0), frontier, add)
            for row in in_scope:
                _check_receipt(row, chains, add)
            for row, problems in zip(in_scope, signatures.result(), strict=True):
                for problem in problems:
                    add(problem, _ENVELOPE_PROBLEMS[problem], row)
            report.receipts += len(in_scope)
            if progress:
                progress(size, total)

    stored_size, stored_frontier = reader.log_state()
    if stored_size != size:
        add(
            "frontier_mismatch",
            f"the stored Merkle log has size {stored_size}; the journal holds {size} receipts",
        )
    elif stored_frontier != frontier:
        add("frontier_mismatch", "the stored Merkle frontier does not hash the journal's receipts")
    for cp in pending:
        add(
            "checkpoint_beyond_journal",
            f"checkpoint for size {cp.size} is larger than the journal ({size} receipts): "
            "receipts were removed",
        )
    _check_checkpoints(checkpoints, reader, keyring, add)
    _check_projection(reader, chains, loop_id, add)

    report.loops = len(chains)
    report.checkpoints = len(checkpoints)
    report.tree_size = size
    report.root = merkle.root_from_frontier(frontier).hex()
    report.seconds = time.perf_counter() - started
    return report


def _check_receipt(row: JournalRow, chains: dict[str, _LoopChain], add) -> None:
    """Everything about one receipt but its signature (checked in bulk, see `audit`)."""
    opened = open_envelope(row.envelope, None, canonical=False)
    for problem in opened.problems:
        add(problem, _ENVELOPE_PROBLEMS[problem], row)
    digest = sha256_digest(row.envelope)
    if digest != row.digest or receipt_id_for(digest) != row.receipt_id:
        add("digest_mismatch", "the stored digest or receipt id does not match the envelope", row)
    chain = chains.setdefault(row.loop_id, _LoopChain())
    try:
        body = ReceiptBody.model_validate(opened.body)
        facts = body.facts()
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        add(
            "schema_invalid",
            f"the body does not match the receipt schema ({where}: {first['msg']})",
            row,
        )
        chain.broken = True
        return
    if (body.loop_id, body.seq, body.kind, body.at) != (row.loop_id, row.seq, row.kind, row.at):
        add("index_mismatch", "the journal's index columns disagree with the signed body", row)
    if body.seq != chain.seq + 1:
        add("seq_gap", f"seq {body.seq} follows seq {chain.seq}", row)
        chain.broken = True
    elif body.prev != chain.digest:
        add("prev_mismatch", "prev does not name the previous receipt of this loop", row)
        chain.broken = True
    chain.seq, chain.digest = body.seq, digest
    if chain.broken:
        return
    try:
        chain.view = apply(chain.view, body, digest, facts)
    except ProjectionError as exc:
        add("projection_mismatch", f"the receipt does not fold: {exc}", row)
        chain.broken = True


def _check_root(cp: CheckpointRow, frontier: list[bytes], add) -> None:
    root = merkle.root_from_frontier(frontier)
    if root != cp.root:
        add(
            "root_mismatch",
            f"the Merkle root recomputed at size {cp.size} differs from the checkpoint's",
        )


def _check_checkpoints(
    checkpoints: list[CheckpointRow], reader: Reader, keyring: Keyring, add
) -> None:
    origin = reader.meta("origin")
    previous: CheckpointRow | None = None
    for cp in checkpoints:
        signed = open_checkpoint(cp.note, keyring)
        if signed.problem == "checkpoint_malformed":
            add("checkpoint_malformed", f"checkpoint {cp.size} is not a signed note")
            continue
        if signed.problem == "unknown_key":
            add("checkpoint_unknown_key", f"checkpoint {cp.size} is signed by an untrusted key")
        elif not signed.verified:
            add("checkpoint_signature_invalid", f"checkpoint {cp.size}'s signature does not verify")
        if (signed.origin, signed.size, signed.root) != (origin, cp.size, cp.root):
            add("checkpoint_malformed", f"checkpoint {cp.size}'s note disagrees with its row")
        if previous is not None:
            try:
                proof = merkle.consistency_proof(previous.size, cp.size, reader.node)
                ok = merkle.verify_consistency(
                    previous.size, cp.size, previous.root, cp.root, proof
                )
            except (LookupError, ValueError):
                ok = False
            if not ok:
                add(
                    "checkpoint_inconsistent",
                    f"checkpoint {cp.size} is not an append-only extension of checkpoint {previous.size}",
                )
        previous = cp


def _check_projection(
    reader: Reader, chains: dict[str, _LoopChain], loop_id: str | None, add
) -> None:
    stored_ids = {row.loop_id for row in reader.loops()}
    if loop_id is not None:
        stored_ids &= {loop_id}
    for lid in sorted(stored_ids | set(chains)):
        chain = chains.get(lid)
        try:
            stored = reader.full_view(lid)
        except (LookupError, LoopwardenError) as exc:
            add(
                "projection_mismatch",
                f"loop {lid}'s stored projection is unreadable: {exc}",
                loop_id=lid,
            )
            continue
        if chain is None or chain.view is None:
            if chain is None or not chain.broken:
                add("projection_mismatch", f"loop {lid} is stored but has no receipts", loop_id=lid)
            continue
        if chain.broken:
            continue
        if stored is None:
            add(
                "projection_mismatch",
                f"loop {lid} has receipts but no stored projection",
                loop_id=lid,
            )
            continue
        for difference in diff_views(stored, chain.view)[:10]:
            add("projection_mismatch", difference, loop_id=lid)
