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
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from loopwarden.audit import partitions
from loopwarden.audit.findings import ENVELOPE_PROBLEMS, Finding, FindingCode, Report
from loopwarden.audit.pool_audit import check_pools
from loopwarden.audit.proofs import Node, NodeCheck, StoredLoops, check_loop, check_records
from loopwarden.audit.replay import LoopChain, Replay, where_of
from loopwarden.canonical import sha256_digest
from loopwarden.errors import IntegrityError, LoopwardenError
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import open_checkpoint
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.log.keys import Keyring
from loopwarden.kernel.log.rotations import Trust, Window
from loopwarden.kernel.log.seals import (
    parse_envelope,
    signature_problem,
)
from loopwarden.kernel.state.charges import (
    pool_of,
)
from loopwarden.kernel.state.judge import Verdict
from loopwarden.kernel.state.rows import diff_views
from loopwarden.kernel.store.reader import LEGACY_FIELDS, CheckpointRow, JournalRow, Reader

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
        self.frontier: list[bytes] = []
        self.size = 0  # leaves hashed into the recomputed tree
        self.expected = 0  # the next leaf index the journal should hold
        self.keys = keyring.public_keys()
        # Budget pools are replayed only with the whole journal (a loop's share is not enough).
        self.replay = Replay(pools=loop_id is None, keys_known=loop_id is None)
        self.chains: dict[str, LoopChain] = self.replay.chains
        self.pools = self.replay.pools
        self.ending: list[tuple[str, list[Verdict]]] | None = None  # set by a partitioned run
        self.stored = StoredLoops(reader, loop_id)  # what the projection check compares with

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
                self.replay.receipt(self.report, self._window, row, c[1], c[2], c[4])
            else:  # its time still bounds what may come after it (index column, unsigned here)
                self.latest = row.at if self.latest is None else max(self.latest, row.at)
        for row, (_, _, _, problems, _) in mine:
            for problem in problems:
                self.report.add(problem, ENVELOPE_PROBLEMS[problem], **where_of(row))
        self.report.receipts += len(mine)

    def replayed(self, rows: list[JournalRow], results: list[partitions.RowResult]) -> None:
        """One batch of the whole journal, as the partitions' workers replayed it: the same
        checks as `batch`, their findings in the same order."""
        for row, result in zip(rows, results, strict=True):
            if row.leaf_index is not None:
                self._leaf(row, result.leaf)
        self.nodes.check(self.made)
        self.made = []
        for row, result in zip(rows, results, strict=True):
            self.report.findings.extend(result.before)
            if result.window is not None:
                self._window(row, *result.window)
            self.report.findings.extend(result.after)
        for row, result in zip(rows, results, strict=True):
            for problem in result.problems:
                self.report.add(problem, ENVELOPE_PROBLEMS[problem], **where_of(row))
        self.report.receipts += len(rows)

    def _leaf(self, row: JournalRow, leaf: bytes) -> None:
        if row.leaf_index != self.expected:
            self.report.add(
                FindingCode.LEAF_GAP,
                f"leaf {self.expected} is missing; the journal jumps to {row.leaf_index}",
                **where_of(row),
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

    def _window(self, row: JournalRow, at: datetime, key_id: str | None) -> None:
        """Whether the receipt's key could sign it then (`rotations.Window`): dated inside the
        key's window, and not placed after receipts dated past its end."""
        window = self.windows.get(key_id) if key_id is not None else None
        problem = None if window is None else window.problem(at, self.latest)
        if problem is not None:
            self.report.add(
                FindingCode.KEY_OUT_OF_WINDOW,
                f"signed by key {key_id} outside its signing window: {problem}",
                **where_of(row),
            )
        self.latest = at if self.latest is None else max(self.latest, at)

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
        ending = self.ending if self.ending is not None else self.replay.ending().items()
        for lid, verdicts in ending:
            for verdict in verdicts:
                self.report.add(
                    FindingCode.DECISION_ILLEGAL, verdict.message, loop_id=lid, rule=verdict.rule
                )
        _check_checkpoints(self.checkpoints, self.reader, self.keyring, self.report)
        loops = {lid: c for lid, c in self.chains.items() if pool_of(lid) is None}
        _check_projection(self.reader, loops, self.stored, self.report, self.integrity)
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
    job = _Job(reader, keyring, loop_id, integrity, windows or {}, reader.journal_count(), progress)
    count = _partition_count(reader, loop_id, job.total, workers)
    report = _partitioned(job, count) if count else None
    if report is None:  # small, one loop, or loops that share pools or keys: one replay
        report = _serial(job, workers)
    report.seconds = time.perf_counter() - started
    return report


@dataclass(frozen=True)
class _Job:
    """One audit's inputs, whichever way it replays the journal (`_serial`, `_partitioned`)."""

    reader: Reader
    keyring: Keyring
    loop_id: str | None
    integrity: Integrity | None
    windows: Mapping[str, Window]
    total: int  # receipts in the journal
    progress: Callable[[int, int], None] | None

    def start(self) -> _Audit:
        """A pass of its own, with a fresh report."""
        report = Report("database")
        return _Audit(self.reader, self.keyring, self.loop_id, report, self.integrity, self.windows)

    def moved(self, run: _Audit) -> None:
        if self.progress:
            self.progress(run.size, self.total)


def _serial(job: _Job, workers: int | None) -> Report:
    """One replay of every loop in this process (signatures checked in workers)."""
    reader, run = job.reader, job.start()
    report = run.report
    with _envelope_checker(job.total, workers) as check:
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
                job.moved(run)
        # Receipts sealed after the snapshot's last leaf: in their chains, not yet in the tree.
        pending = [row.integrated(None) for row in reader.pending_receipts()]
        if pending:
            run.batch(
                pending, check([(r.envelope, run.in_scope(r)) for r in pending], run.keys).result()
            )
    _ended(run, report, len(pending))
    return report


def _ended(run: _Audit, report: Report, pending: int) -> None:
    report.pending = pending
    if pending:
        report.notes.append(
            f"{pending} receipts are sealed and pending integration: checked in their "
            "loops' chains, not yet in the Merkle tree (a moment later they are)"
        )
    run.finish()


def _partition_count(reader: Reader, loop_id: str | None, total: int, workers: int | None) -> int:
    """How many worker processes replay a share of the loops each (0: none, `_serial`)."""
    cores = os.cpu_count() or 1
    count = workers if workers is not None else cores
    if loop_id is not None or count < 2 or total < PARALLEL_FROM or cores < 2:
        return 0
    if reader.pools():  # pool charges interleave across loops: replayed in journal order, once
        return 0
    count = min(count, len(reader.loops()))
    return count if count >= 2 else 0


Shares = tuple[list[tuple[int, int]], list["Future[list[partitions.RowResult]] | None"]]


def _partitioned(job: _Job, count: int) -> Report | None:
    """The whole journal with its loops replayed in `count` worker processes, a share each
    (`partitions`); None if what crosses loops (pools, keys) needs one replay of them all."""
    reader, run = job.reader, job.start()
    report = run.report
    share_of: dict[str, int] = {}  # loop -> partition, in the order the loops first appear
    ordinal = itertools.count()
    with _partition_pool(count, run.keys) as pools:

        def submit(rows: list[JournalRow]) -> Shares:
            shares: list[list[tuple[int, JournalRow]]] = [[] for _ in pools]
            slots = []
            for row in rows:
                k = share_of.setdefault(row.loop_id, len(share_of) % count)
                slots.append((k, len(shares[k])))
                shares[k].append((next(ordinal), row))
            futures = [
                pool.submit(partitions.batch, share) if share else None
                for pool, share in zip(pools, shares, strict=True)
            ]
            return slots, futures

        def results(shares: Shares) -> list[partitions.RowResult]:
            slots, futures = shares
            # While the workers replay, this process reads the stored projections ahead.
            run.stored.prepare(lambda: not all(f.done() for f in futures if f is not None))
            done = [f.result() if f is not None else [] for f in futures]
            return [done[k][i] for k, i in slots]

        ahead: tuple[list[JournalRow], Shares] | None = None
        for rows in itertools.chain(_batches(reader.iter_journal(), BATCH), [None]):
            current, ahead = ahead, None if rows is None else (rows, submit(rows))
            if current is not None:
                run.replayed(current[0], results(current[1]))
                job.moved(run)
        pending = [row.integrated(None) for row in reader.pending_receipts()]
        if pending:
            run.replayed(pending, results(submit(pending)))
        endings = [f.result() for f in [pool.submit(partitions.end) for pool in pools]]
    if not _apart(endings, share_of):
        return None
    chains = {lid: c for ending in endings for lid, c in ending.chains.items()}
    run.chains.update((lid, chains[lid]) for lid in share_of if lid in chains)
    verdicts = sorted((v for ending in endings for v in ending.verdicts), key=lambda v: v[0])
    run.ending = [(lid, found) for _, lid, found in verdicts]
    _ended(run, report, len(pending))
    return report


def _apart(endings: list[partitions.Ending], share_of: dict[str, int]) -> bool:
    """Whether the partitions' replays are the serial one's: no pool replayed, no loop judged
    in a partition but its rows' (a body naming another loop), no key two of them touched."""
    seen: set[tuple[str, str]] = set()
    for k, ending in enumerate(endings):
        if ending.pooled or any(share_of.get(lid) != k for lid in ending.judged):
            return False
        if seen & ending.touched:
            return False
        seen |= ending.touched
    return True


@contextmanager
def _partition_pool(count: int, keys: dict[str, bytes]) -> Iterator[list[ProcessPoolExecutor]]:
    """One single-process executor per partition: its worker keeps the partition's replay."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=context,
                    initializer=partitions.start,
                    initargs=(keys,),
                )
            )
            for _ in range(count)
        ]


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
    chains: dict[str, LoopChain],
    stored_loops: StoredLoops,
    report: Report,
    integrity: Integrity | None,
) -> None:
    for lid in sorted(stored_loops.ids | set(chains)):
        chain = chains.get(lid)
        try:
            stored, tree = stored_loops.take(lid)
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
            check_loop(reader, integrity, stored, report, tree)
