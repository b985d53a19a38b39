"""The full audit of a database: signatures, schema, chains, Merkle log, checkpoints, projection.

`audit(reader, keyring)` streams the journal once in leaf order and checks, for every receipt:
its DSSE signature under a *trusted* key (the key directory, never the database's own key
table), canonical form, body schema, digest and index columns, the per-loop `seq`/`prev` chain;
it recomputes the Merkle tree as it goes and compares the root with every signed checkpoint,
checks each checkpoint consistent with the previous one, compares the stored frontier, and
finally replays every loop's receipts through the fold (judging each decision on the way) and
compares the result with the stored projection tables and the proofs kept of them (`proofs`). Every defect is a typed `Finding` in one `Report`; nothing raises on bad data.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from loopwarden.audit.findings import ENVELOPE_PROBLEMS, Finding, FindingCode, Report
from loopwarden.audit.pool_audit import check_pools
from loopwarden.audit.proofs import Node, NodeCheck, check_loop, check_records
from loopwarden.canonical import sha256_digest
from loopwarden.errors import IntegrityError, LoopwardenError
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import open_checkpoint
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.log.keys import Keyring
from loopwarden.kernel.log.rotations import Trust, Window
from loopwarden.kernel.log.seals import (
    PAYLOAD_TYPE,
    open_envelope,
    parse_envelope,
    receipt_id_for,
    signature_problem,
)
from loopwarden.kernel.state.charges import (
    PoolLedger,
    before,
    charge,
    charges,
    pool_of,
)
from loopwarden.kernel.state.events import ReceiptBody
from loopwarden.kernel.state.fold import FoldError, chain_problem
from loopwarden.kernel.state.judge import Judge, Verdict
from loopwarden.kernel.state.legality import VerdictRule
from loopwarden.kernel.state.rows import LoopView, diff_views
from loopwarden.kernel.store.reader import LEGACY_FIELDS, CheckpointRow, JournalRow, Reader
from loopwarden.kinds import KINDS


@dataclass
class _LoopChain:
    seq: int = 0
    digest: str | None = None
    view: LoopView | None = None
    broken: bool = False


BATCH = 1024
PARALLEL_FROM = 4096  # receipts; below this, worker start-up costs more than it saves

Checked = tuple[bytes, str, tuple[str, bytes] | None, tuple[str, ...], str | None]
"""What a worker makes of one envelope: its Merkle leaf hash, its digest, its payload type and
payload (None if it is not a DSSE envelope), its signature problems and the key id it names."""


def check_envelopes(
    envelopes: list[tuple[bytes, bool]], public_keys: dict[str, bytes]
) -> list[Checked]:
    """Each envelope hashed and, if in the audit's scope, parsed once and its signature
    checked: the work of an audit that needs nothing but the envelope's bytes. A plain
    function of plain data, run in a worker process on large journals."""
    out: list[Checked] = []
    keyring = Keyring(public_keys)
    for raw, in_scope in envelopes:
        parsed = parse_envelope(raw) if in_scope else None
        problems = signature_problem(keyring, parsed) if parsed is not None else ()
        payload = None if parsed is None else (parsed.payload_type, parsed.payload)
        key_id = None if parsed is None else parsed.key_id
        out.append((merkle.leaf_hash(raw), sha256_digest(raw), payload, problems, key_id))
    return out


class _Result(Protocol):
    def result(self) -> list[Checked]: ...


class _Done:
    """A finished result with the `Future.result()` shape."""

    def __init__(self, value: list[Checked]) -> None:
        self._value = value

    def result(self) -> list[Checked]:
        return self._value


EnvelopeCheck = Callable[[list[tuple[bytes, bool]], dict[str, bytes]], _Result]


@contextmanager
def _envelope_checker(total: int, workers: int | None) -> Iterator[EnvelopeCheck]:
    """`check_envelopes` for a batch, returned as a future.

    Ed25519 verification is most of an audit's cost and PyNaCl holds the GIL, so on a large
    journal the envelope work runs in worker processes while this process validates, judges
    and folds the batch before. Small journals, one core, or `workers=0`: inline.
    """
    cores = os.cpu_count() or 1
    count = workers if workers is not None else max(cores - 1, 1)
    if count < 1 or total < PARALLEL_FROM or cores < 2:
        yield lambda envelopes, keys: _Done(check_envelopes(envelopes, keys))
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        yield lambda envelopes, keys: pool.submit(check_envelopes, envelopes, keys)


def _batches(rows: Iterable[JournalRow], size: int) -> Iterator[list[JournalRow]]:
    batch: list[JournalRow] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


WHERE = ("loop_id", "seq", "receipt_id", "leaf_index")
"""What a finding about a journal row points at: the row's own fields of these names."""


def _where(row: JournalRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in WHERE}


class _Audit:
    """One pass over the journal in leaf order: the log as a whole, and each loop in depth."""

    def __init__(
        self,
        reader: Reader,
        keyring: Keyring,
        loop_id: str | None,
        report: Report,
        integrity: Integrity | None,
        windows: Mapping[str, Window],
    ) -> None:
        self.reader, self.keyring, self.loop_id, self.report = reader, keyring, loop_id, report
        self.integrity = integrity
        self.windows = windows
        self.latest: datetime | None = None  # the latest receipt time so far, in log order
        self.nodes = NodeCheck(reader, report)
        self.made: list[Node] = []  # Merkle nodes the current batch's receipts complete
        self.checkpoints = reader.checkpoints(self._unreadable_checkpoint)
        self.pending = list(self.checkpoints)
        self.chains: dict[str, _LoopChain] = {}
        self.frontier: list[bytes] = []
        self.size = 0  # leaves hashed into the recomputed tree
        self.expected = 0  # the next leaf index the journal should hold
        self.keys = keyring.public_keys()
        # Budget pools are replayed only with the whole journal (a loop's share is not enough).
        self.pools = PoolLedger() if loop_id is None else None
        self.judge = Judge(KINDS, keys_known=loop_id is None, pools=self.pools)

    def _unreadable_checkpoint(self, size: int, problem: IntegrityError) -> None:
        self.report.add(FindingCode.CHECKPOINT_MALFORMED, f"checkpoint {size}: {problem.message}")

    def in_scope(self, row: JournalRow) -> bool:
        return self.loop_id is None or row.loop_id == self.loop_id

    def batch(self, rows: list[JournalRow], checked: list[Checked]) -> None:
        """One batch of the journal, with what `check_envelopes` made of its envelopes (or the
        receipts pending integration, which have no leaves yet: they are checked in their
        chains, after every integrated one)."""
        for row, (leaf, *_) in zip(rows, checked, strict=True):
            if row.leaf_index is not None:
                self._leaf(row, leaf)
        self.nodes.check(self.made)
        self.made = []
        mine = []
        for row, c in zip(rows, checked, strict=True):
            if self.in_scope(row):
                mine.append((row, c))
                self._receipt(row, c[1], c[2], c[4])
            else:  # its time still bounds what may come after it (index column, unsigned here)
                self.latest = row.at if self.latest is None else max(self.latest, row.at)
        for row, (_, _, _, problems, _) in mine:
            for problem in problems:
                self.report.add(problem, ENVELOPE_PROBLEMS[problem], **_where(row))
        self.report.receipts += len(mine)

    def _leaf(self, row: JournalRow, leaf: bytes) -> None:
        if row.leaf_index != self.expected:
            self.report.add(
                FindingCode.LEAF_GAP,
                f"leaf {self.expected} is missing; the journal jumps to {row.leaf_index}",
                **_where(row),
            )
        self.expected = row.leaf + 1
        self.frontier, made = merkle.append_leaf(self.frontier, self.size, leaf)
        self.made.extend(made)
        self.size += 1
        while self.pending and self.pending[0].size == self.size:
            self._root(self.pending.pop(0))

    def _root(self, cp: CheckpointRow) -> None:
        if merkle.root_from_frontier(self.frontier) != cp.root:
            self.report.add(
                FindingCode.ROOT_MISMATCH,
                f"the Merkle root recomputed at size {cp.size} differs from the checkpoint's",
            )

    def _receipt(
        self,
        row: JournalRow,
        digest: str,
        payload: tuple[str, bytes] | None,
        key_id: str | None,
    ) -> None:
        """Everything about one receipt but its signature (checked in bulk, see `audit`)."""
        add = self.report.add
        body = None
        if payload is not None and payload[0] == PAYLOAD_TYPE:
            body = KINDS.parse_payload(payload[1])  # the common case: one pass, nothing wrong
        opened = None if body is not None else open_envelope(row.envelope, None, canonical=False)
        for problem in opened.problems if opened is not None else ():
            add(problem, ENVELOPE_PROBLEMS[problem], **_where(row))
        if digest != row.digest or receipt_id_for(digest) != row.receipt_id:
            add(
                FindingCode.DIGEST_MISMATCH,
                "the stored digest or receipt id does not match the envelope",
                **_where(row),
            )
        chain = self.chains.setdefault(row.loop_id, _LoopChain())
        try:
            if body is None:
                assert opened is not None
                body = KINDS.parse_body(opened.body)  # what is wrong with it, step by step
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            add(
                FindingCode.SCHEMA_INVALID,
                f"the body does not match the receipt schema ({where}: {first['msg']})",
                **_where(row),
            )
            chain.broken = True
            return
        if (body.loop_id, body.seq, body.kind, body.at) != (row.loop_id, row.seq, row.kind, row.at):
            add(
                FindingCode.INDEX_MISMATCH,
                "the journal's index columns disagree with the signed body",
                **_where(row),
            )
        self._window(row, body.at, key_id)
        broken = chain_problem(chain.seq, chain.digest, body)
        if broken == "seq_gap":
            add(FindingCode.SEQ_GAP, f"seq {body.seq} follows seq {chain.seq}", **_where(row))
        elif broken == "prev_mismatch":
            add(
                FindingCode.PREV_MISMATCH,
                "prev does not name the previous receipt of this loop",
                **_where(row),
            )
        chain.broken = chain.broken or broken is not None
        chain.seq, chain.digest = body.seq, digest
        if chain.broken:
            return
        judged(self.report, self.judge, chain.view, body, **_where(row))
        try:
            self._fold(chain, body, digest)
        except FoldError as exc:
            add(FindingCode.PROJECTION_MISMATCH, f"the receipt does not fold: {exc}", **_where(row))
            chain.broken = True

    def _window(self, row: JournalRow, at: datetime, key_id: str | None) -> None:
        """Whether the receipt's key could sign it then (`rotations.Window`): dated inside the
        key's window, and not placed after receipts dated past its end."""
        window = self.windows.get(key_id) if key_id is not None else None
        problem = None if window is None else window.problem(at, self.latest)
        if problem is not None:
            self.report.add(
                FindingCode.KEY_OUT_OF_WINDOW,
                f"signed by key {key_id} outside its signing window: {problem}",
                **_where(row),
            )
        self.latest = at if self.latest is None else max(self.latest, at)

    def _fold(self, chain: _LoopChain, body: ReceiptBody, digest: str) -> None:
        """Fold one judged receipt: a pool's into the replayed pool (when pools are replayed),
        a loop's into its view, charging the pools it draws from (`FoldError` if impossible)."""
        pools = self.pools
        step = KINDS[body.kind].pool
        if step is not None:
            if pools is not None:
                name = pool_of(body.loop_id) or ""
                pools.put_pool(step.fold(pools.rows.get(name), body, digest))
            return
        prior = before(chain.view, KINDS.touched(body).turns) if pools and pools.rows else None
        chain.view = KINDS.apply(chain.view, body, digest)
        if prior is not None and pools is not None:
            charge(pools, charges(prior, chain.view, body, pools), body.at)
        self.judge.after(chain.view, body)

    def finish(self) -> None:
        stored_size, stored_frontier = self.reader.log_state()
        if stored_size != self.size:
            self.report.add(
                FindingCode.FRONTIER_MISMATCH,
                f"the stored Merkle log has size {stored_size}; the journal holds {self.size} receipts",
            )
        elif stored_frontier != self.frontier:
            self.report.add(
                FindingCode.FRONTIER_MISMATCH,
                "the stored Merkle frontier does not hash the journal's receipts",
            )
        for cp in self.pending:
            self.report.add(
                FindingCode.CHECKPOINT_BEYOND_JOURNAL,
                f"checkpoint for size {cp.size} is larger than the journal ({self.size} receipts): receipts were removed",
            )
        views = {
            lid: c.view for lid, c in self.chains.items() if c.view is not None and not c.broken
        }
        for lid, verdicts in self.judge.end(views).items():
            for verdict in verdicts:
                self.report.add(
                    FindingCode.DECISION_ILLEGAL, verdict.message, loop_id=lid, rule=verdict.rule
                )
        _check_checkpoints(self.checkpoints, self.reader, self.keyring, self.report)
        loops = {lid: c for lid, c in self.chains.items() if pool_of(lid) is None}
        _check_projection(self.reader, loops, self.loop_id, self.report, self.integrity)
        if self.pools is not None:
            check_pools(self.reader, self.pools, self.report, self.integrity)
        self.nodes.finish()
        if self.reader.legacy:
            self.report.notes.append(
                "schema 3 stores no row proofs: open it with this release to add them"
            )
        elif self.integrity is None:
            self.report.notes.append(
                "no integrity secret given: row and record MACs were not checked"
            )
        elif self.loop_id is None:
            check_records(self.reader, self.integrity, self.report)
        self.report.loops = len(loops)
        self.report.checkpoints = len(self.checkpoints)
        self.report.tree_size = self.size
        self.report.root = merkle.root_from_frontier(self.frontier).hex()


def judged(
    report: Report, judge: Judge, view: LoopView | None, body: ReceiptBody, **where: Any
) -> None:
    """Ask the judge about one receipt; a verdict is a `decision_illegal` finding. A receipt the
    judge cannot even read the facts of is one too: an audit fails closed."""
    try:
        verdicts = judge.step(view, body)
    except (LookupError, ValueError, TypeError) as exc:
        verdicts = [
            Verdict(VerdictRule.UNJUDGEABLE, f"its facts cannot be rebuilt ({type(exc).__name__})")
        ]
    for verdict in verdicts:
        message = f"{body.kind} #{body.seq}: {verdict.message}"
        report.add(
            FindingCode.DECISION_ILLEGAL, message, kind=str(body.kind), rule=verdict.rule, **where
        )


def audit(
    reader: Reader,
    keyring: Keyring,
    *,
    loop_id: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
    integrity: Integrity | None = None,
    windows: Mapping[str, Window] | None = None,
) -> Report:
    """Audit the database behind `reader` against the trusted `keyring`.

    With `loop_id`, only that loop's receipts are checked in depth and folded, but the Merkle
    tree, checkpoints and frontier are always checked over the whole journal (a loop's proof
    depends on all of it). `progress(done, total)` is called every 1024 receipts. `workers`
    sets how many processes verify signatures (default: one fewer than the CPUs; 0 = inline).
    With `integrity` (the store's secret), the MACs on loop rows, tokens, idempotency records
    and the log state are checked too; without it the report notes they were not. With
    `windows` (the key history's, `rotations.Window`), a receipt signed by a key outside its
    window is a `key_out_of_window` finding.

    Signatures bind the exact stored bytes, so the audit does not re-serialize payloads to
    RFC 8785 (seal refuses to sign anything else; `receipt` and bundle checks still do).
    """
    started = time.perf_counter()
    report = Report("database")
    run = _Audit(reader, keyring, loop_id, report, integrity, windows or {})
    total = reader.journal_count()
    with _envelope_checker(total, workers) as check:
        # One batch ahead: the envelopes of the next are checked while this one is folded.
        ahead: tuple[list[JournalRow], _Result] | None = None
        for rows in itertools.chain(_batches(reader.iter_journal(), BATCH), [None]):
            if rows is not None:
                envelopes = [(row.envelope, run.in_scope(row)) for row in rows]
                current, ahead = ahead, (rows, check(envelopes, run.keys))
            else:
                current, ahead = ahead, None
            if current is not None:
                run.batch(current[0], current[1].result())
                if progress:
                    progress(run.size, total)
        # Receipts sealed after the snapshot's last leaf: in their chains, not yet in the tree.
        pending = [row.integrated(None) for row in reader.pending_receipts()]
        if pending:
            run.batch(
                pending, check([(r.envelope, run.in_scope(r)) for r in pending], run.keys).result()
            )
    report.pending = len(pending)
    if pending:
        report.notes.append(
            f"{len(pending)} receipts are sealed and pending integration: checked in their "
            "loops' chains, not yet in the Merkle tree (a moment later they are)"
        )
    run.finish()
    report.seconds = time.perf_counter() - started
    return report


def audit_trusting(reader: Reader, trust: Trust, **options: Any) -> Report:
    """`audit` against what a home's keys vouch for (`rotations.directory_trust`, or keys an
    auditor pinned): its keyring and signing windows; what is wrong with the keys themselves is
    a finding of its own (`key_unvouched`, `key_history_missing`, `key_history_mismatch`), and
    the report says first what it trusted. `options` are `audit`'s."""
    report = audit(reader, trust.keyring, windows=trust.windows, **options)
    report.trusted = trust.basis
    report.findings[:0] = [
        Finding(FindingCode(problem.code), problem.message) for problem in trust.problems
    ]
    return report


def _check_checkpoints(
    checkpoints: list[CheckpointRow], reader: Reader, keyring: Keyring, report: Report
) -> None:
    origin = reader.meta("origin")
    previous: CheckpointRow | None = None
    for cp in checkpoints:
        signed = open_checkpoint(cp.note, keyring)
        if signed.problem == "checkpoint_malformed":
            report.add(
                FindingCode.CHECKPOINT_MALFORMED, f"checkpoint {cp.size} is not a signed note"
            )
            continue
        if signed.problem == "unknown_key":
            report.add(
                FindingCode.CHECKPOINT_UNKNOWN_KEY,
                f"checkpoint {cp.size} is signed by an untrusted key",
            )
        elif not signed.verified:
            report.add(
                FindingCode.CHECKPOINT_SIGNATURE_INVALID,
                f"checkpoint {cp.size}'s signature does not verify",
            )
        if (signed.origin, signed.size, signed.root) != (origin, cp.size, cp.root):
            report.add(
                FindingCode.CHECKPOINT_MALFORMED,
                f"checkpoint {cp.size}'s note disagrees with its row",
            )
        if previous is not None and not _consistent(previous, cp, reader):
            report.add(
                FindingCode.CHECKPOINT_INCONSISTENT,
                f"checkpoint {cp.size} is not an append-only extension of checkpoint {previous.size}",
            )
        previous = cp


def _consistent(old: CheckpointRow, new: CheckpointRow, reader: Reader) -> bool:
    try:
        proof = merkle.consistency_proof(old.size, new.size, reader.node)
        return merkle.verify_consistency(old.size, new.size, old.root, new.root, proof)
    except (LookupError, ValueError):
        return False


def _check_projection(
    reader: Reader,
    chains: dict[str, _LoopChain],
    loop_id: str | None,
    report: Report,
    integrity: Integrity | None,
) -> None:
    stored_ids = {row.loop_id for row in reader.loops()}
    if loop_id is not None:
        stored_ids &= {loop_id}
    for lid in sorted(stored_ids | set(chains)):
        chain = chains.get(lid)
        try:
            stored = reader.full_view(lid)
        except (LookupError, LoopwardenError, ValueError) as exc:
            report.add(
                FindingCode.PROJECTION_MISMATCH,
                f"loop {lid}'s stored projection is unreadable: {exc}",
                loop_id=lid,
            )
            continue
        if chain is None or chain.view is None:
            if chain is None or not chain.broken:
                report.add(
                    FindingCode.PROJECTION_MISMATCH,
                    f"loop {lid} is stored but has no receipts",
                    loop_id=lid,
                )
            continue
        if chain.broken:
            continue
        if stored is None:
            report.add(
                FindingCode.PROJECTION_MISMATCH,
                f"loop {lid} has receipts but no stored projection",
                loop_id=lid,
            )
            continue
        ignore = LEGACY_FIELDS if reader.legacy else frozenset()
        for difference in diff_views(stored, chain.view, ignore)[:10]:
            report.add(FindingCode.PROJECTION_MISMATCH, difference, loop_id=lid)
        if not reader.legacy:
            check_loop(reader, integrity, stored, report)
