"""What an audit checks of the proofs the write path relies on.

- every loop row's MAC (with the integrity secret), and its state root against the root of a
  tree rebuilt from its stored rows, blob for blob (`state_mismatch`);
- the Merkle log state's, every token's and every idempotency record's MAC (`mac_invalid`);
- every stored node of the journal's Merkle tree against the node the receipts hash to, not only
  the root (`node_mismatch`): a proof is built from stored nodes, so a wrong one would hand
  out proofs that fail.

A schema-3 database has no proofs to check; a missing secret skips the MACs (and says so).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import suppress

from loopwarden.audit.findings import FindingCode, Report
from loopwarden.errors import IntegrityError, LoopwardenError
from loopwarden.kernel.log.integrity import LOG_MAC, LOOP_MAC, RECORD_MAC, TOKEN_MAC, Integrity
from loopwarden.kernel.state.rows import LoopView
from loopwarden.kernel.store.guard import loop_mac_values, row_leaf
from loopwarden.kernel.store.reader import Reader, unpack_response
from loopwarden.kernel.store.statetree import EMPTY, StateTree, node

Node = tuple[int, int, bytes]


def state_tree(view: LoopView) -> StateTree:
    """The state tree of a loop's rows, built from nothing."""
    tree = StateTree(0, node(EMPTY), lambda level, idx: None)
    tree.grow(view.loop.slots)
    tree.fill(
        {
            row.slot: row_leaf(table, row)
            for table in ("todos", "turns", "approvals")
            for row in getattr(view, table).values()
        }
    )
    return tree


class StoredLoops:
    """Each stored loop's projection (`Reader.full_view`) and the state tree of its rows, as
    the audit's snapshot holds them: read when the projection check asks (`take`), or ahead of
    it (`prepare`) while the audit's workers replay the journal and this process would only wait
    for them. At most `AHEAD_ROWS` rows are held ahead of the check."""

    AHEAD_ROWS = 250_000

    def __init__(self, reader: Reader, loop_id: str | None) -> None:
        ids = {row.loop_id for row in reader.loops()}
        self.ids = ids if loop_id is None else ids & {loop_id}
        self._reader = reader
        self._ahead = sorted(self.ids, reverse=True)  # popped from the end: in id order
        self._read: dict[str, tuple[LoopView | None, StateTree | None] | Exception] = {}
        self._rows = 0

    def prepare(self, busy: Callable[[], bool]) -> None:
        """Read loops ahead, one at a time, while `busy()` and under `AHEAD_ROWS`."""
        while self._ahead and self._rows < self.AHEAD_ROWS and busy():
            loop_id = self._ahead.pop()
            found = self._view(loop_id)
            if isinstance(found, Exception) or found is None:
                self._read[loop_id] = found if isinstance(found, Exception) else (None, None)
                continue
            tree: StateTree | None = None
            if not self._reader.legacy:  # one that fails is built again, and fails, when asked
                with suppress(LookupError, LoopwardenError, ValueError, TypeError):
                    tree = state_tree(found)
            self._read[loop_id] = (found, tree)
            self._rows += _rows(found)

    def take(self, loop_id: str) -> tuple[LoopView | None, StateTree | None]:
        """The loop's stored projection and, if read ahead, its state tree; raises what
        `Reader.full_view` raises for an unreadable one."""
        kept = self._read.pop(loop_id, None)
        found = kept if kept is not None else self._view(loop_id)
        if isinstance(found, Exception):
            raise found
        if isinstance(found, tuple):
            if found[0] is not None:
                self._rows -= _rows(found[0])
            return found
        return found, None

    def _view(self, loop_id: str) -> LoopView | Exception | None:
        try:
            return self._reader.full_view(loop_id)
        except (LookupError, LoopwardenError, ValueError) as exc:
            return exc


def _rows(view: LoopView) -> int:
    return len(view.todos) + len(view.turns) + len(view.approvals)


def check_loop(
    reader: Reader,
    integrity: Integrity | None,
    stored: LoopView,
    report: Report,
    tree: StateTree | None = None,
) -> None:
    """One loop's anchor: its MAC, and its state root and blobs against its stored rows (their
    state tree, built here unless `tree` is it)."""
    loop_id = stored.loop.loop_id
    r = reader.conn.execute(
        "SELECT state_root, mac FROM loops WHERE loop_id = ?", (loop_id,)
    ).fetchone()
    root, mac = (bytes(r[0]) if r and r[0] is not None else b""), (r[1] if r else None)
    if integrity is not None and not integrity.valid(
        LOOP_MAC, loop_mac_values(stored.loop, root), mac
    ):
        report.add(
            FindingCode.MAC_INVALID,
            f"loop {loop_id}'s row does not carry a valid MAC",
            loop_id=loop_id,
        )
    tree = tree if tree is not None else state_tree(stored)
    if tree.root != root:
        report.add(
            FindingCode.STATE_MISMATCH,
            f"loop {loop_id}'s state root is not the root of its rows",
            loop_id=loop_id,
        )
        return
    built = {(level, idx): blob for level, idx, blob in tree.blobs()}
    kept = {
        (level, idx): bytes(blob)
        for level, idx, blob in reader.conn.execute(
            "SELECT level, idx, hashes FROM state_nodes WHERE loop_id = ?", (loop_id,)
        )
    }
    if kept != built:
        report.add(
            FindingCode.STATE_MISMATCH,
            f"loop {loop_id}'s stored state blobs are not its rows'",
            loop_id=loop_id,
        )


def check_records(reader: Reader, integrity: Integrity, report: Report) -> None:
    """The MACs of the rows outside any loop: the Merkle log state, tokens, idempotency records."""
    size, frontier, mac = reader.conn.execute(
        "SELECT size, frontier, mac FROM log_state WHERE id = 1"
    ).fetchone()
    if not integrity.valid(LOG_MAC, [size, bytes(frontier).hex()], mac):
        report.add(FindingCode.MAC_INVALID, "the Merkle log state does not carry a valid MAC")
    for token in reader.tokens():
        if not integrity.valid(TOKEN_MAC, token.mac_values(), token.mac):
            report.add(
                FindingCode.MAC_INVALID,
                f"token {token.token_id} was not written by loopwarden (its MAC fails)",
            )
    rows = reader.conn.execute(
        "SELECT principal, key, operation, request_digest, response, mac FROM idempotency"
    )
    for principal, key, operation, digest, response, record_mac in rows:
        try:
            values = [principal, key, operation, digest, unpack_response(response)]
        except IntegrityError:
            values = []  # no MAC matches: reported below
        if not values or not integrity.valid(RECORD_MAC, values, record_mac):
            report.add(
                FindingCode.MAC_INVALID,
                f"the idempotency record {principal}/{key} was changed outside loopwarden",
            )


class NodeCheck:
    """Compares the journal's stored Merkle nodes with the ones the receipts hash to, a batch
    of receipts at a time (each level's nodes of a batch are one range query)."""

    def __init__(self, reader: Reader, report: Report) -> None:
        self.reader, self.report = reader, report
        self.counted = 0

    def check(self, nodes: list[Node]) -> None:
        by_level: dict[int, dict[int, bytes]] = defaultdict(dict)
        for level, idx, value in nodes:
            by_level[level][idx] = value
        for level, built in by_level.items():
            kept = dict(
                self.reader.conn.execute(
                    "SELECT idx, hash FROM merkle_nodes WHERE level = ? AND idx BETWEEN ? AND ?",
                    (level, min(built), max(built)),
                ).fetchall()
            )
            for idx, value in built.items():
                if bytes(kept.get(idx, b"")) != value:
                    self.report.add(
                        FindingCode.NODE_MISMATCH,
                        f"Merkle node ({level}, {idx}) is not the one the receipts hash to",
                    )
        self.counted += len(nodes)

    def finish(self) -> None:
        (stored,) = self.reader.conn.execute("SELECT count(*) FROM merkle_nodes").fetchone()
        if stored != self.counted:
            self.report.add(
                FindingCode.NODE_MISMATCH,
                f"{stored} Merkle nodes are stored; the receipts make {self.counted}",
            )
