"""A loop's state tree: one Merkle tree over the rows of its projection, so that a write can
prove each row it loads is the current one.

Every todo, turn and approval row has a *slot* (its creation order in the loop, assigned by the
fold). The leaf at a slot is the digest of the row's stored values; interior nodes are blobs of
`FANOUT` child hashes, stored per loop as `(level, idx) → blob`; the root is the hash of the one
blob at the top. The root is kept in the loop row, under the loop row's MAC (`integrity.py`):
a database writer who edits, deletes or rolls back any row changes a leaf the root no longer
covers, and cannot make a new root pass the MAC.

A path check costs one leaf digest and one blob hash per level (two levels up to 256 rows,
three up to 4,096, five up to a million); blobs are cached per transaction, so rows that share
a blob share the work.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable

from loopwarden.errors import IntegrityError

FANOUT = 16
HASH = 32
BLOB = FANOUT * HASH
EMPTY = bytes(BLOB)

Blobs = dict[tuple[int, int], bytes]
"""Blobs by (level, idx)."""
BlobSource = Callable[[int, int], bytes | None]
"""`blob(level, idx)` → the stored blob, or None if none was ever written."""


_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode


def leaf(table: str, values: Iterable[object]) -> bytes:
    """The digest of one row: its table and its stored column values, in column order."""
    values = tuple(values)
    try:
        return _leaf(table, values)
    except TypeError:  # a value that cannot be a cache key (the digest does not need one)
        return _leaf.__wrapped__(table, values)


@functools.lru_cache(maxsize=4096)
def _leaf(table: str, values: tuple[object, ...]) -> bytes:
    # Memoized: a write proves every open turn of its loop, and they are mostly the rows the
    # previous write proved. The digest is a pure function of its arguments, so a cached one is
    # the one a fresh computation gives; the proof itself (the path to the root) is never cached.
    return hashlib.sha256(b"\x00" + _ENCODE([table, *values]).encode()).digest()


def node(blob: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + blob).digest()


def depth(slots: int) -> int:
    """Blob levels a tree of `slots` leaves needs (at least one)."""
    levels, capacity = 1, FANOUT
    while capacity < slots:
        levels += 1
        capacity *= FANOUT
    return levels


def _index(slot: int, level: int) -> tuple[int, int]:
    """(blob index at `level`, position inside that blob) of the path from leaf `slot`."""
    span = FANOUT**level
    return slot // (span * FANOUT), (slot // span) % FANOUT


class StateMismatch(IntegrityError):
    """A stored blob is not the one the loop's root commits to."""


class StateTree:
    """One loop's tree as one transaction sees it.

    It starts from the root the loop row commits to (`slots` leaves) and reads blobs through
    `source`, proving each against that root the first time it is read, top down: a blob is
    trusted only if its hash is the entry its proved parent holds for it (the top one, if it
    hashes to the root). Blobs wholly beyond the committed leaves are empty whatever the
    database holds. A change (`grow`, `put`) touches proved blobs only, so no edited sibling
    can be folded into a new root.
    """

    def __init__(
        self,
        slots: int,
        root: bytes,
        source: BlobSource,
        proved: Blobs | None = None,
    ) -> None:
        """`proved`: blobs already known to be the ones `root` commits to (those this process
        hashed into it, `written.py`), used instead of reading and proving them again."""
        self.committed = slots
        self.slots = slots
        self.root = root
        self._committed_top = depth(slots) - 1
        self._committed_root = root
        self._source = source
        self._blobs: dict[tuple[int, int], bytearray] = (
            {key: bytearray(blob) for key, blob in proved.items()} if proved else {}
        )
        self.dirty: set[tuple[int, int]] = set()
        self._proved: set[tuple[int, int]] = set(proved) if proved else set()

    def _load(self, level: int, idx: int) -> bytearray:
        key = (level, idx)
        if key in self._blobs:
            return self._blobs[key]
        covered = level <= self._committed_top and idx * FANOUT ** (level + 1) < self.committed
        blob = bytearray(self._source(level, idx) or EMPTY) if covered else bytearray(EMPTY)
        if covered and node(bytes(blob)) != self._expected(level, idx):
            raise StateMismatch(f"state blob ({level}, {idx}) is not the one the root commits to")
        if covered:
            self._proved.add(key)
        self._blobs[key] = blob
        return blob

    def _expected(self, level: int, idx: int) -> bytes:
        if level == self._committed_top:
            return self._committed_root
        parent = self._load(level + 1, idx // FANOUT)
        pos = idx % FANOUT
        return bytes(parent[pos * HASH : (pos + 1) * HASH])

    def holds(self, slot: int, digest: bytes) -> bool:
        """True if the committed tree has `digest` as the leaf at `slot`."""
        if not 0 <= slot < self.committed:
            return False
        try:
            blob = self._load(0, slot // FANOUT)
        except StateMismatch:
            return False
        pos = slot % FANOUT
        return bytes(blob[pos * HASH : (pos + 1) * HASH]) == digest

    def grow(self, slots: int) -> None:
        """Make room for leaves up to `slots`: a taller tree keeps the old top as child 0."""
        old, new = depth(self.slots), depth(slots)
        for level in range(old, new):
            top = self._load(level, 0)
            top[:HASH] = node(bytes(self._load(level - 1, 0)))
            self.dirty.add((level, 0))
            self.root = node(bytes(top))
        self.slots = max(self.slots, slots)

    def put(self, slot: int, digest: bytes) -> None:
        """Set the leaf at `slot` (below `slots`), every hash on its path, and the root."""
        top = depth(self.slots) - 1
        value = digest
        for level in range(top + 1):
            idx, pos = _index(slot, level)
            blob = self._load(level, idx)
            blob[pos * HASH : (pos + 1) * HASH] = value
            self.dirty.add((level, idx))
            value = node(bytes(blob))
        self.root = value

    def fill(self, leaves: dict[int, bytes]) -> None:
        """`put` every (slot → digest) of `leaves` (all below `slots`), hashing each blob on
        their paths once, bottom up, instead of once per leaf: the same tree, blobs and root.
        (A slot outside the tree, which only a damaged row can name, is put as `put` does.)"""
        if any(not 0 <= slot < self.slots for slot in leaves):
            for slot, digest in leaves.items():
                self.put(slot, digest)
            return
        entries = leaves  # at each level: index of the entry in that level's blobs → hash
        for level in range(depth(self.slots)):
            touched = set()
            for at, value in entries.items():
                idx, pos = divmod(at, FANOUT)
                self._load(level, idx)[pos * HASH : (pos + 1) * HASH] = value
                touched.add(idx)
            self.dirty.update((level, idx) for idx in touched)
            entries = {idx: node(bytes(self._load(level, idx))) for idx in touched}
        if entries:
            self.root = entries[0]

    def blobs(self) -> list[tuple[int, int, bytes]]:
        """The rewritten blobs, to store: (level, idx, blob)."""
        return [(level, idx, bytes(self._blobs[(level, idx)])) for level, idx in sorted(self.dirty)]

    def committed_blobs(self, rewritten: list[tuple[int, int, bytes]]) -> Blobs:
        """The blobs the current root commits to that this tree holds: those `rewritten` (as
        `blobs()` gave them) and those read and proved (a blob beyond the committed leaves,
        never proved, is left out)."""
        kept = {key: bytes(self._blobs[key]) for key in self._proved - self.dirty}
        kept.update(((level, idx), blob) for level, idx, blob in rewritten)
        return kept
