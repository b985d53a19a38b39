"""The loops of a large journal replayed in worker processes, a partition of the loops each.

Each worker keeps its partition's `Replay` between batches: the audit streams the journal once
in leaf order and hands each worker its loops' rows, in order; the worker parses and checks each
envelope (signature included), replays it, and hands back what the audit needs in log order —
the leaf hash and digest, the signature problems and the findings before and after the signing
window check, which only the audit can make (it follows the whole log). At the end it hands
back its chains and the judge's closing verdicts.

What crosses loops is checked afterwards: a replay of budget pools, or an idempotency key that
two partitions both used or looked up, means the partitions may have judged differently from
one replay of the whole journal, and the audit is run again serially. Anything else a receipt
is judged on belongs to its loop, so the findings are the serial audit's, in its order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from loopwarden.audit.findings import Finding, FindingCode
from loopwarden.audit.replay import LoopChain, Replay
from loopwarden.canonical import sha256_digest
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.keys import Keyring
from loopwarden.kernel.log.seals import parse_envelope, signature_problem
from loopwarden.kernel.state.judge import Verdict
from loopwarden.kernel.store.reader import JournalRow


class Touched(set[tuple[str, str]]):
    """A judge's set of used keys that remembers every key looked up or added."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: set[tuple[str, str]] = set()

    def __contains__(self, key: object) -> bool:
        if isinstance(key, tuple):
            self.touched.add(key)
        return super().__contains__(key)

    def add(self, key: tuple[str, str]) -> None:
        self.touched.add(key)
        super().add(key)


@dataclass
class RowResult:
    """What a worker made of one row: its leaf hash and digest, its signature problems, the
    findings before the signing-window check and after it, and the window check's arguments
    (None when the body could not be read, so the check was never made)."""

    leaf: bytes
    problems: tuple[str, ...]
    before: list[Finding] = field(default_factory=list)
    window: tuple[datetime, str | None] | None = None
    after: list[Finding] = field(default_factory=list)


@dataclass
class Ending:
    """What a worker hands back when the journal ends."""

    chains: dict[str, LoopChain]
    verdicts: list[tuple[int, str, list[Verdict]]]  # (first judged at, loop, verdicts)
    touched: set[tuple[str, str]]
    judged: list[str]  # the loops its judge judged (a body may name another loop than its row)
    pooled: bool  # it replayed a pool: the partitions cannot be trusted to agree


class _Recorder:
    """A `Sink` that files each finding into the current row's result."""

    def __init__(self) -> None:
        self.result: RowResult | None = None

    def add(self, code: FindingCode | str, message: str, **where: Any) -> None:
        assert self.result is not None
        found = Finding(FindingCode(code), message, **where)
        (self.result.before if self.result.window is None else self.result.after).append(found)

    def window(self, row: JournalRow, at: datetime, key_id: str | None) -> None:
        assert self.result is not None
        self.result.window = (at, key_id)


class Partition:
    """One worker's share of the loops, replayed across batches."""

    def __init__(self, public_keys: dict[str, bytes]) -> None:
        self.keyring = Keyring(public_keys)
        self.keys = Touched()
        self.replay = Replay(pools=True, keys=self.keys, keys_known=True)
        self.first: dict[str, int] = {}  # loop -> the ordinal of the row that first judged it
        self.recorder = _Recorder()

    def batch(self, rows: list[tuple[int, JournalRow]]) -> list[RowResult]:
        out = []
        judge, recorder = self.replay.judge, self.recorder
        for ordinal, row in rows:
            parsed = parse_envelope(row.envelope)
            problems = signature_problem(self.keyring, parsed) if parsed is not None else ()
            payload = None if parsed is None else (parsed.payload_type, parsed.payload)
            key_id = None if parsed is None else parsed.key_id
            digest = sha256_digest(row.envelope)
            result = recorder.result = RowResult(merkle.leaf_hash(row.envelope), problems)
            judged = len(self.first)
            self.replay.receipt(recorder, recorder.window, row, digest, payload, key_id)
            if judge.loop_count() > judged:
                for lid in judge.loop_ids()[judged:]:
                    self.first[lid] = ordinal
            out.append(result)
        return out

    def end(self) -> Ending:
        ending = self.replay.ending()
        verdicts = [(self.first[lid], lid, v) for lid, v in ending.items()]
        pools = self.replay.pools
        pooled = pools is not None and bool(pools.rows or pools.used)
        return Ending(self.replay.chains, verdicts, self.keys.touched, list(self.first), pooled)


_partition: Partition | None = None  # this worker process's share (one partition a process)


def start(public_keys: dict[str, bytes]) -> None:
    """The worker's initializer."""
    global _partition
    _partition = Partition(public_keys)


def batch(rows: list[tuple[int, JournalRow]]) -> list[RowResult]:
    assert _partition is not None
    return _partition.batch(rows)


def end() -> Ending:
    assert _partition is not None
    return _partition.end()
