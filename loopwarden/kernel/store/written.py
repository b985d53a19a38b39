"""What this process last wrote of the rows a write proves: each loop's row (with the
state-tree blobs its root commits to), the Merkle log's state, and the todo, turn and approval
rows (with their state-tree leaves), so that the next write that reads back exactly those values
does not decode, re-MAC or re-hash them.

A stored row is taken from here only when every stored value, its root and its MAC are equal
to what this process wrote under its own key: the MAC check is a pure function of those bytes,
so it would pass, and the decoded row is the one written. Everything a MAC cannot vouch for is
still checked on every read (a loop's head against the journal, the log's end against the
journal's last leaf), and any other stored bytes (another process's write, an edit, an older
copy) take the full proof. The blobs kept for a root are the ones that root commits to (the
tree hashed them into it), so a row proved against them is proved against the committed tree,
as when they are read and proved against the root. A todo, turn or approval row read back as
the values written is the row written, and its leaf the one computed from those values: the
write still proves it against its loop's tree (`ProvedRows._prove`), with that leaf.

One per store, used by its writer thread only (a write transaction at a time).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from loopwarden.kernel.sql.records import LogState
from loopwarden.kernel.state.rows import LoopRow

LOOPS_KEPT = 1_024  # loops remembered, least recently written dropped first
ROWS_KEPT = 4_096  # todo, turn and approval rows remembered, least recently written dropped first

StoredLoop = tuple[tuple[Any, ...], bytes, bytes]
"""A loop row as stored: its encoded values, its state root, its MAC."""
Blobs = dict[tuple[int, int], bytes]
StoredLog = tuple[int, bytes, bytes]
"""The Merkle log's row as stored: size, frontier, MAC."""
StoredRow = tuple[str, tuple[Any, ...]]
"""A todo, turn or approval row as stored: its table and its encoded values."""


class Written:
    """The loop rows and log state this process wrote, by their stored bytes."""

    def __init__(self) -> None:
        self._loops: OrderedDict[str, tuple[StoredLoop, LoopRow, Blobs]] = OrderedDict()
        self._log: tuple[StoredLog, LogState] | None = None
        self._rows: OrderedDict[StoredRow, tuple[Any, bytes]] = OrderedDict()

    def loop(self, loop_id: str, stored: StoredLoop) -> tuple[LoopRow, Blobs] | None:
        """The row and blobs written as `stored`, if that is what this process last wrote."""
        kept = self._loops.get(loop_id)
        if kept is None or kept[0] != stored:
            return None
        return kept[1], kept[2]

    def put_loop(self, stored: StoredLoop, row: LoopRow, blobs: Blobs) -> None:
        self._loops[row.loop_id] = (stored, row, blobs)
        self._loops.move_to_end(row.loop_id)
        while len(self._loops) > LOOPS_KEPT:
            self._loops.popitem(last=False)

    def log(self, stored: StoredLog) -> LogState | None:
        kept = self._log
        return kept[1] if kept is not None and kept[0] == stored else None

    def put_log(self, stored: StoredLog, state: LogState) -> None:
        self._log = (stored, state)

    def row(self, table: str, values: tuple[Any, ...]) -> tuple[Any, bytes] | None:
        """The row this process wrote as `values` in `table`, and its leaf; None if it wrote
        none so (or one of its values cannot be a key)."""
        try:
            return self._rows.get((table, values))
        except TypeError:
            return None

    def put_row(self, table: str, values: tuple[Any, ...], row: Any, leaf: bytes) -> None:
        try:
            self._rows[(table, values)] = (row, leaf)
        except TypeError:  # a value that cannot be a key: that row is decoded when read
            return
        self._rows.move_to_end((table, values))
        while len(self._rows) > ROWS_KEPT:
            self._rows.popitem(last=False)
