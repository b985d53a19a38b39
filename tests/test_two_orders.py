"""Two orders: each loop's chain at commit, the one Merkle order after, by the integrator.

- SQLite integrates in the write transaction: no committed store ever holds a pending receipt.
- PostgreSQL: a write seals its receipt into its loop's chain and leaves it pending; `receipt`
  says `sealed` (no proof yet), then `integrated`, and with `wait` `published`; the audit
  checks pending receipts in their chains and reports them as pending, not as findings.
- Writes on different loops do not wait for each other (a loop's row held from outside stops
  only that loop's writes); a grouped body that finds its loop held runs again in the next
  transaction instead of waiting inside a group.
- Replicas integrating at once keep one tree: every sealed receipt in it exactly once, each
  loop's receipts in `seq` order, and the audit clean.
- A replica SIGKILLed in the middle of integrating (its journal rows written, not committed)
  loses nothing and doubles nothing: another replica integrates the same receipts.
- Servers starting during a write storm never refuse the store (start-up reads one snapshot).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BUILDER, OPERATOR
from test_store import open_test_loop

from loopwarden.audit.database import audit
from loopwarden.errors import Conflict, StoreBusy
from loopwarden.journal.receipt import ReceiptRequest, receipt
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.sql.postgres import connect
from loopwarden.kernel.state.events import TodoSpec
from loopwarden.kernel.store.store import Store, snapshot
from loopwarden.kinds import KINDS
from loopwarden.todos.todo_kinds import TodoAdded
from loopwarden.turns.claim import ClaimRequest, claim

pytestmark = pytest.mark.anyio


async def _open(home: Path, url: str, **kw: Any) -> Store:
    keys = KeyStore(home)
    return await Store.open(
        url, keys.load_signer(), keyring=keys.keyring(), key_dir=home, kinds=KINDS, **kw
    )


def _add(loop_id: str, n: int) -> Any:
    todo = TodoAdded(todo=TodoSpec(id=f"t{n}", title=f"todo {n}", order=n))
    return lambda tx: tx.append(loop_id, "todo.added", OPERATOR, todo)


def _counts(url: str) -> tuple[int, int]:
    with snapshot(url) as reader:
        return reader.journal_count(), reader.pending_count()


def _audit(home: Path, url: str) -> Any:
    with snapshot(url) as reader:
        return audit(reader, KeyStore(home).keyring(), workers=0)


async def _integrated_and_clean(home: Path, url: str, *stores: Store) -> None:
    """Each store integrates what it left pending; then the audit finds nothing."""
    for store in stores:
        await store.integrate()
    report = _audit(home, url)
    assert report.clean and report.pending == 0, report.findings


def _halted(store: Store) -> Store:
    """The store with its integrator's thread ended: what it writes stays pending until the test
    integrates it (`Store.integrate`)."""
    assert store.integrator is not None
    store.integrator.halt()
    return store


async def test_a_sqlite_commit_never_leaves_a_receipt_pending(home):
    store = await _open(home, str(home / "loopwarden.db"))
    try:
        assert store.integrator is None
        await open_test_loop(store, 0)
        for n in range(5):
            await store.write(_add("L1", n))
        assert _counts(str(home / "loopwarden.db")) == (6, 0)
    finally:
        await store.close()


async def test_a_receipt_is_sealed_then_integrated_then_published(home, pg_url):
    store = await _open(home, pg_url, checkpoint_every=1000)
    try:
        _halted(store)
        await open_test_loop(store, 0)
        appended = await store.write(_add("L1", 1))
        assert _counts(pg_url) == (0, 2)
        sealed = await receipt(store, OPERATOR, ReceiptRequest(receipt_id=appended.receipt_id))
        assert (sealed.state, sealed.inclusion_proof, sealed.checkpoint) == ("sealed", None, None)
        assert sealed.verified and sealed.seq == 2
        by_seq = await receipt(store, OPERATOR, ReceiptRequest(loop_id="L1", seq=2))
        assert by_seq.receipt_id == appended.receipt_id and by_seq.state == "sealed"
        # The loop's own reads see its whole chain; the leaf-order reads only the tree.
        chain = await store.read(lambda r: [row.seq for row in r.loop_journal("L1")])
        assert chain == [1, 2]
        assert await store.read(lambda r: list(r.iter_journal())) == []

        report = _audit(home, pg_url)
        assert report.clean, report.findings
        assert (report.pending, report.receipts, report.tree_size) == (2, 2, 0)
        assert any("pending integration" in note for note in report.notes)

        assert await store.integrate() == 2
        integrated = await receipt(store, OPERATOR, ReceiptRequest(loop_id="L1", seq=2))
        assert integrated.state == "integrated"
        assert integrated.inclusion_proof is not None and integrated.inclusion_proof.verified
        assert integrated.inclusion_proof.leaf_index == 1
        assert integrated.checkpoint is not None and integrated.checkpoint.verified
        assert not integrated.checkpoint.stored  # signed for that answer, not kept

        published = await receipt(store, OPERATOR, ReceiptRequest(loop_id="L1", seq=2, wait=True))
        assert published.state == "published" and published.checkpoint is not None
        assert published.checkpoint.size == 2 and published.checkpoint.verified
        assert published.checkpoint.stored
        report = _audit(home, pg_url)
        assert report.clean and (report.pending, report.tree_size) == (0, 2)
    finally:
        await store.close()


async def test_wait_publishes_a_receipt_still_pending(home, pg_url):
    store = await _open(home, pg_url, checkpoint_every=1000)
    try:
        _halted(store)
        await open_test_loop(store, 0)
        found = await receipt(store, OPERATOR, ReceiptRequest(loop_id="L1", seq=1, wait=True))
        assert found.state == "published" and found.inclusion_proof is not None
        assert found.inclusion_proof.verified and _counts(pg_url) == (1, 0)
    finally:
        await store.close()


def _hold(url: str, loop_id: str) -> Any:
    """A connection outside loopwarden holding `loop_id`'s row (as a slow writer would)."""
    conn = connect(url)
    conn.execute("BEGIN")
    conn.execute("SELECT 1 FROM loops WHERE loop_id = ? FOR UPDATE", (loop_id,))
    return conn


async def _written(store: Store, fn: Any, done: dict[str, Any], name: str) -> None:
    done[name] = await store.write(fn)


async def test_replicas_writing_different_loops_do_not_wait_for_each_other(home, pg_url):
    first, second = await _open(home, pg_url), await _open(home, pg_url)
    try:
        await open_test_loop(first, 0, loop_id="L1")
        await open_test_loop(first, 0, loop_id="L2")
        holder, done = _hold(pg_url, "L1"), {}
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_written, first, _add("L1", 1), done, "L1")  # waits for the row
                with anyio.fail_after(10):
                    for n in range(3):  # the other replica's writes on L2 go through meanwhile
                        await second.write(_add("L2", n))
                assert "L1" not in done
                holder.execute("ROLLBACK")
        finally:
            holder.close()
        assert done["L1"].seq == 2
        await first.integrate()
        await second.integrate()
        with snapshot(pg_url) as reader:
            assert [r.seq for r in reader.loop_journal("L1")] == [1, 2]
            assert [r.seq for r in reader.loop_journal("L2")] == [1, 2, 3, 4]
    finally:
        await first.close()
        await second.close()


async def test_a_grouped_body_that_finds_its_loop_held_runs_in_the_next_transaction(home, pg_url):
    store = await _open(home, pg_url)
    try:
        for loop_id in ("L1", "L2", "L3"):
            await open_test_loop(store, 0, loop_id=loop_id)
        blocker, holder, done = _hold(pg_url, "L3"), _hold(pg_url, "L2"), {}
        try:
            async with anyio.create_task_group() as tg:
                # The writer waits in a body on L3; meanwhile a body on L1 and one on L2 queue
                # up behind it, and are grouped into the next transaction.
                tg.start_soon(_written, store, _add("L3", 1), done, "L3")
                await anyio.sleep(0.2)
                tg.start_soon(_written, store, _add("L1", 1), done, "L1")
                tg.start_soon(_written, store, _add("L2", 1), done, "L2")
                await anyio.sleep(0.2)
                blocker.execute("ROLLBACK")
                with anyio.fail_after(10):  # L1 commits while L2's row is still held
                    while "L1" not in done:
                        await anyio.sleep(0.01)
                assert "L3" in done and "L2" not in done
                holder.execute("ROLLBACK")
        finally:
            blocker.close()
            holder.close()
        assert (done["L1"].seq, done["L2"].seq, done["L3"].seq) == (2, 2, 2)
        await _integrated_and_clean(home, pg_url, store)
    finally:
        await store.close()


async def test_two_replicas_integrating_at_once_keep_every_receipt_once_in_seq_order(home, pg_url):
    first, second = await _open(home, pg_url), await _open(home, pg_url)
    try:
        loops = [f"L{n}" for n in range(6)]
        for loop_id in loops:
            await open_test_loop(first, 0, loop_id=loop_id)

        async def add(store: Store, loop_id: str) -> None:
            for n in range(15):
                await store.write(_add(loop_id, n))

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i, loop_id in enumerate(loops):
                    tg.start_soon(add, (first, second)[i % 2], loop_id)
        await first.integrate()
        await second.integrate()
        both = first.integrator.integrated + second.integrator.integrated  # type: ignore[union-attr]
        assert both == 6 * 16
        with snapshot(pg_url) as reader:
            rows = list(reader.iter_journal())
        assert [r.leaf_index for r in rows] == list(range(6 * 16))
        assert len({r.receipt_id for r in rows}) == len(rows)
        for loop_id in loops:
            assert [r.seq for r in rows if r.loop_id == loop_id] == list(range(1, 17))
        report = _audit(home, pg_url)
        assert report.clean and report.pending == 0, report.findings
    finally:
        await first.close()
        await second.close()


async def test_replicas_take_turns_a_replica_lets_receipts_gather_after_another_s_batch(
    home, pg_url
):
    """A replica's integrator that finds the log grown by another replica's batch since it last
    looked leaves its receipts pending for `gather` more (the next batch then serves both
    replicas' commits); after that, or for a drain, or as it stops, it batches."""
    first, second = _halted(await _open(home, pg_url)), _halted(await _open(home, pg_url))
    try:
        now = [100.0]
        mine, theirs = second.integrator, first.integrator
        assert mine is not None and theirs is not None
        mine.monotonic = theirs.monotonic = lambda: now[0]
        assert mine.run_once() == 0  # nothing pending: it has looked at the log
        await open_test_loop(first, 0)
        assert theirs.run_once() == 1  # the other replica's batch
        await second.write(_add("L1", 1))
        await second.write(_add("L1", 2))
        assert mine.run_once() == 0 and mine.backlog == 2  # the log grew since it looked
        now[0] += mine.gather / 2
        assert mine.run_once() == 0 and _counts(pg_url) == (1, 2)
        now[0] += mine.gather
        assert mine.run_once() == 2 and _counts(pg_url) == (3, 0)
        await first.write(_add("L1", 3))
        assert theirs.run_once() == 0  # it found the log grown by the other replica
        assert await first.integrate() == 1  # a drain does not wait its turn
        await second.write(_add("L1", 4))
        assert mine.run_once() == 0  # the other replica's drain grew the log
        mine.stop()  # nor does a replica's last batch as it stops
        assert _counts(pg_url) == (5, 0)
        report = _audit(home, pg_url)
        assert report.clean and report.pending == 0, report.findings
    finally:
        await first.close()
        await second.close()


_STUCK_REPLICA = textwrap.dedent(
    """
    import sys, time, anyio
    from loopwarden.kernel.log.keys import KeyStore
    from loopwarden.kernel.store.store import Store
    from loopwarden.kinds import KINDS
    from loopwarden.kernel.store.txn import Txn
    from loopwarden.kernel.state.events import TodoSpec
    from loopwarden.todos.todo_kinds import TodoAdded
    from loopwarden.principals import Principal

    home, url = sys.argv[1], sys.argv[2]
    real = Txn.integrate

    def stuck(self, limit=None, **given):  # the journal rows written, never committed
        moved = real(self, limit, **given)
        self.conn.execute("SELECT 1").fetchone()  # the pipeline's writes sent and run
        print("integrating", moved, flush=True)
        time.sleep(3600)
        return moved

    Txn.integrate = stuck

    async def main():
        keys = KeyStore(home)
        store = await Store.open(url, keys.load_signer(), keyring=keys.keyring(), key_dir=home, kinds=KINDS)
        who = Principal(id="alice", role="operator")
        for n in range(10):
            todo = TodoAdded(todo=TodoSpec(id=f"k{n}", title="k", order=n))
            await store.write(lambda tx, t=todo: tx.append("L1", "todo.added", who, t))
        print("written", flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


async def test_a_replica_killed_while_integrating_loses_and_doubles_nothing(home, pg_url):
    store = await _open(home, pg_url)
    try:
        await open_test_loop(store, 0)
        await store.integrate()
    finally:
        await store.close()
    replica = subprocess.Popen(
        [sys.executable, "-c", _STUCK_REPLICA, str(home), pg_url],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert replica.stdout is not None
        with anyio.fail_after(60):
            lines = [await anyio.to_thread.run_sync(replica.stdout.readline) for _ in range(2)]
        assert any(line.startswith("integrating") for line in lines), lines
        assert _counts(pg_url)[0] == 1  # its journal rows are not committed
    finally:
        os.kill(replica.pid, signal.SIGKILL)
        replica.wait()
    journal, pending = _counts(pg_url)
    assert (journal, pending) == (1, 10)
    report = _audit(home, pg_url)
    assert report.clean and report.pending == 10, report.findings

    other = await _open(home, pg_url)  # another replica takes over
    try:
        with anyio.fail_after(30):
            while _counts(pg_url) != (11, 0):  # its integrator's own poll, not a drain
                await anyio.sleep(0.02)
    finally:
        await other.close()
    with snapshot(pg_url) as reader:
        rows = list(reader.iter_journal())
    assert [r.seq for r in rows] == list(range(1, 12))
    assert len({r.receipt_id for r in rows}) == 11
    report = _audit(home, pg_url)
    assert report.clean and report.pending == 0 and report.tree_size == 11, report.findings


async def test_servers_starting_during_a_write_storm_never_refuse_the_store(home, pg_url):
    writer = await _open(home, pg_url)
    try:
        loops = [f"S{n}" for n in range(4)]
        for loop_id in loops:
            await open_test_loop(writer, 0, loop_id=loop_id)
        stop = anyio.Event()

        async def storm(loop_id: str) -> None:
            n = 0
            while not stop.is_set() and n < 400:
                await writer.write(_add(loop_id, n))
                n += 1

        opened = 0
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for loop_id in loops:
                    tg.start_soon(storm, loop_id)
                for _ in range(8):  # each open runs the start-up check on one snapshot
                    starting = await _open(home, pg_url)
                    await starting.close()
                    opened += 1
                stop.set()
        assert opened == 8
        await _integrated_and_clean(home, pg_url, writer)
    finally:
        await writer.close()


# --- push back, the delay, and keys two replicas write at once ----------------------------------


async def test_writes_past_the_pending_limit_are_refused_until_the_integrator_catches_up(
    home, pg_url
):
    store = _halted(await _open(home, pg_url))
    try:
        store.max_pending = 3
        await open_test_loop(store, 0)
        for n in range(4):  # not yet counted: the integrator has not polled
            await store.write(_add("L1", n))
        log = _hold_log(pg_url)  # another replica's integrator holds the log's row
        try:
            assert store.integrator is not None
            assert await anyio.to_thread.run_sync(store.integrator.run_once) == 0
            assert store.pending_backlog() == 5
            with pytest.raises(StoreBusy, match="5 receipts are waiting for their Merkle leaves"):
                await store.write(_add("L1", 9))
            assert _counts(pg_url) == (0, 5)  # nothing of the refused write
        finally:
            log.execute("ROLLBACK")
            log.close()
        assert await store.integrate() == 5 and store.pending_backlog() == 0
        assert (await store.write(_add("L1", 9))).seq == 6
    finally:
        await store.close()


async def test_a_hook_process_past_the_pending_limit_is_refused_before_it_writes(home, pg_url):
    store = _halted(await _open(home, pg_url))
    log = _hold_log(pg_url)  # so that closing cannot integrate what it sealed either
    try:
        await open_test_loop(store, 0)
        for n in range(3):
            await store.write(_add("L1", n))
    finally:
        await store.close()
        log.execute("ROLLBACK")
        log.close()
    assert _counts(pg_url) == (0, 4)
    keys = KeyStore(home)
    hook = Store.open_now(
        pg_url, keys.load_signer(), keyring=keys.keyring(), key_dir=home, kinds=KINDS
    )
    try:
        hook.max_pending = 1
        with pytest.raises(StoreBusy, match="4 receipts are waiting"):
            hook.write_now(_add("L1", 9))
        hook.max_pending = 10
        assert hook.write_now(_add("L1", 9)).seq == 5
    finally:
        hook.close_now()
    assert _counts(pg_url) == (5, 0)  # the hook process gave every pending receipt its leaf


async def test_the_integration_delay_is_a_histogram_and_the_backlog_a_gauge(home, pg_url):
    from prometheus_client.parser import text_string_to_metric_families

    from loopwarden.observe.telemetry import Telemetry

    telemetry = Telemetry(tracing=False, metrics=True, version="test")
    store = _halted(await _open(home, pg_url, clock=_Clock()))
    store.observer = telemetry
    telemetry.gauge("pending_receipts", "pending", store.pending_backlog)
    try:
        await open_test_loop(store, 0)
        for n in range(2):
            await store.write(_add("L1", n))
        store.clock.advance(0.2)  # type: ignore[attr-defined]  # the integrator's turn comes later
        assert await store.integrate() == 3
    finally:
        await store.close()
    exposition = telemetry.metrics()
    assert exposition is not None
    samples = {
        (s.name, s.labels.get("le")): s.value
        for family in text_string_to_metric_families(exposition[0].decode())
        for s in family.samples
    }
    assert samples[("loopwarden_integration_delay_seconds_count", None)] == 3
    assert samples[("loopwarden_integration_delay_seconds_bucket", "0.15")] == 0
    assert samples[("loopwarden_integration_delay_seconds_bucket", "0.25")] == 3
    assert samples[("loopwarden_pending_receipts", None)] == 0


async def _race(
    url: str, first: Store, second: Store, op: Any, request: Any, who: Any
) -> list[Any]:
    """`op(request)` on both replicas, the second sent while the first holds its commit (the
    rows written, not committed) and released once PostgreSQL shows the second waiting for a
    lock: what each returned or raised."""
    from loopwarden.kernel.runner.runner import _write

    token = anyio.lowlevel.current_token()
    reached, gate, outcome = anyio.Event(), anyio.Event(), [None, None]

    def held(tx: Any) -> Any:
        result = _write(op, first, who, request, tx)
        anyio.from_thread.run_sync(reached.set, token=token)
        anyio.from_thread.run(gate.wait, token=token)
        return result

    async def call(n: int, fn: Any) -> None:
        try:
            outcome[n] = await fn()
        except Exception as exc:
            outcome[n] = exc

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, 0, lambda: first.write(held))
            await reached.wait()
            tg.start_soon(call, 1, lambda: op(second, who, request))
            pid = second.backend.writer.raw.info.backend_pid
            while not _waiting_for_a_lock(url, pid):
                await anyio.sleep(0.01)
            gate.set()
    return outcome


async def test_two_replicas_opening_one_loop_id_at_once_give_one_loop_and_a_conflict(home, pg_url):
    from test_store import WIDE_POLICY

    from loopwarden.loops.lifecycle import OpenLoopRequest, open_loop

    first, second = await _open(home, pg_url), await _open(home, pg_url)
    request = OpenLoopRequest(objective="o", policy=WIDE_POLICY, loop_id="twice")
    try:
        # The second waits on the loop's key, written and not committed; then runs again.
        opened, refused = await _race(pg_url, first, second, open_loop, request, OPERATOR)
        assert opened.loop_id == "twice"
        assert isinstance(refused, Conflict) and "already exists" in str(refused), refused
        await first.integrate()
        with snapshot(pg_url) as reader:
            assert [r.kind for r in reader.loop_journal("twice")] == ["loop.opened"]
    finally:
        await first.close()
        await second.close()


async def test_a_turn_found_before_its_loop_was_free_is_read_again_not_refused_as_tampered(
    home, pg_url
):
    from conftest import BUILDER

    from loopwarden.turns.claim import ClaimRequest, claim
    from loopwarden.turns.leases import HeartbeatRequest, heartbeat

    first, second = await _open(home, pg_url), await _open(home, pg_url)
    try:
        await open_test_loop(first, 1)
        turn = await claim(first, BUILDER, ClaimRequest(loop_id="L1"))
        assert turn.granted
        request = HeartbeatRequest(turn_id=turn.turn_id, fence=turn.fence)
        # The second finds the turn by id, then waits for its loop's row while the first renews
        # the lease: the turn it found is no longer the one the loop's root holds.
        renewals = await _race(pg_url, first, second, heartbeat, request, BUILDER)
        assert [r.renewed for r in renewals] == [True, True], renewals
        await _integrated_and_clean(home, pg_url, first, second)
    finally:
        await first.close()
        await second.close()


class _Clock:
    """A clock the test moves (the store's and the integrator's)."""

    def __init__(self) -> None:
        from datetime import UTC, datetime

        self.now = datetime(2026, 6, 1, tzinfo=UTC)

    def __call__(self) -> Any:
        return self.now

    def advance(self, seconds: float) -> None:
        from datetime import timedelta

        self.now += timedelta(seconds=seconds)


def _hold_log(url: str) -> Any:
    """A connection holding the log's row, as an integrator in the middle of a batch does."""
    conn = connect(url)
    conn.execute("BEGIN")
    conn.execute("SELECT 1 FROM log_state WHERE id = 1 FOR UPDATE")
    return conn


def _waiting_for_a_lock(url: str, pid: int) -> bool:
    """Whether the server session `pid` waits for a lock (PostgreSQL's own view)."""
    conn = connect(url)
    try:
        rows = conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = ? AND wait_event_type = 'Lock'", (pid,)
        ).fetchall()
        return bool(rows)
    finally:
        conn.close()


async def test_the_audit_finds_a_pending_receipt_removed_and_one_in_both_orders(home, pg_url):
    store = _halted(await _open(home, pg_url))
    try:
        for loop_id in ("L1", "L2"):
            await open_test_loop(store, 0, loop_id=loop_id)
            await store.write(_add(loop_id, 0))
        await store.integrate()  # L1 and L2: seq 1 and 2 in the tree
        for n in range(1, 4):
            await store.write(_add("L1", n))  # L1: seq 3..5, pending
    finally:
        log = _hold_log(pg_url)  # closing must not integrate them
        await store.close()
        log.execute("ROLLBACK")
        log.close()
    assert _audit(home, pg_url).clean
    columns = "loop_id, seq, kind, receipt_id, digest, at, turn_id, envelope, payload, key_id, "
    columns += "signature, leaf_hash"
    conn = connect(pg_url)
    try:
        conn.execute("DELETE FROM pending WHERE loop_id = 'L1' AND seq = 4")  # sealed, removed
        report = _audit(home, pg_url)
        assert report.pending == 2
        found = {(f.code, f.loop_id, f.message) for f in report.findings}
        assert ("seq_gap", "L1", "seq 5 follows seq 3") in found, report.findings
        # L2's last integrated receipt written again as pending: one receipt in both orders.
        copied = columns.replace("leaf_hash", "decode('00', 'hex')")
        conn.execute(
            f"INSERT INTO pending ({columns}) SELECT {copied} "
            "FROM journal WHERE loop_id = 'L2' AND seq = 2"
        )
        doubled = _audit(home, pg_url)
        found = {(f.code, f.loop_id, f.message) for f in doubled.findings}
        assert ("seq_gap", "L2", "seq 2 follows seq 2") in found, doubled.findings
    finally:
        conn.close()


async def test_the_receipt_command_says_sealed_then_waits_for_publication(home, pg_url):
    from support import cli

    store = _halted(await _open(home, pg_url))
    try:
        await open_test_loop(store, 0)
        await store.integrate()
        appended = await store.write(_add("L1", 1))
    finally:
        log = _hold_log(pg_url)  # closing must not integrate it
        await store.close()
        log.execute("ROLLBACK")
        log.close()
    where = ("--home", str(home), "--store", pg_url)
    log = _hold_log(pg_url)  # another replica's integrator is busy (each command integrates)
    try:
        shown = cli("receipt", appended.receipt_id, "--json", *where)
        human = cli("receipt", appended.receipt_id, *where)
    finally:
        log.execute("ROLLBACK")
        log.close()
    assert shown.returncode == 0, shown.stderr
    out = json.loads(shown.stdout)
    assert (out["state"], out["leaf_index"], out["verified"]) == ("sealed", None, True)
    assert f"{appended.receipt_id} sealed, pending its leaf" in human.stdout, human.stdout
    waited = json.loads(cli("receipt", appended.receipt_id, "--wait", "--json", *where).stdout)
    assert (waited["state"], waited["leaf_index"]) == ("published", 1)
    assert _counts(pg_url) == (2, 0)


# --- budget pools: a write holds only the pools it decides on --------------------------------


def _hold_rows(url: str, sql: str) -> Any:
    """A connection outside loopwarden holding the rows `sql` locks (as a slow writer would)."""
    conn = connect(url)
    conn.execute("BEGIN")
    conn.execute(sql)
    return conn


async def _pooled(home: Path, url: str) -> Store:
    """A store with pools `a` and `b`, loop L1 drawing from `a` and L2 from `b`."""
    from test_pools import define, open_in

    store = await _open(home, url)
    await define(store, "a", max_concurrent_turns=4)
    await define(store, "b", max_concurrent_turns=4)
    await open_in(store, "L1", pools=["a"])
    await open_in(store, "L2", pools=["b"])
    return store


async def _claimed(store: Store, loop_id: str, done: dict[str, Any]) -> None:
    done[loop_id] = await claim(store, BUILDER, ClaimRequest(loop_id=loop_id))


async def test_writes_drawing_from_different_pools_do_not_wait_for_each_other(home, pg_url):
    store, done = await _pooled(home, pg_url), {}
    other = await _open(home, pg_url)  # another replica
    try:
        holder = _hold_rows(pg_url, "SELECT 1 FROM pools WHERE name = 'a' FOR UPDATE")
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_claimed, store, "L1", done)  # waits for pool a's row
                await anyio.sleep(0.2)
                with anyio.fail_after(10):  # the other replica's claim on pool b goes through
                    await _claimed(other, "L2", done)
                assert done["L2"].granted and "L1" not in done
                holder.execute("ROLLBACK")
        finally:
            holder.close()
        assert done["L1"].granted
        await _integrated_and_clean(home, pg_url, store)
    finally:
        await other.close()
        await store.close()


async def test_a_pool_change_waits_for_the_writes_that_read_the_pools(home, pg_url):
    from test_pools import define, pool_state

    store, done = await _pooled(home, pg_url), {}
    try:
        reading = _hold_rows(pg_url, "SELECT 1 FROM meta WHERE key = 'schema_version' FOR SHARE")
        try:
            async with anyio.create_task_group() as tg:

                async def bind() -> None:  # binds the builder to pool b in every loop
                    done["define"] = await define(
                        store, "b", agents=["builder"], max_concurrent_turns=4
                    )

                tg.start_soon(bind)
                await anyio.sleep(0.3)
                assert "define" not in done  # a write still reading the pools holds it back
                reading.execute("ROLLBACK")
        finally:
            reading.close()
        assert done["define"].changed
        granted = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
        assert granted.granted
        charged = [(await pool_state(store, name)).active_turns for name in ("a", "b")]
        assert charged == [1, 1]  # decided on the new binding: L1's turn counts in pool b too
        await _integrated_and_clean(home, pg_url, store)
    finally:
        await store.close()


def test_the_dashboard_shows_a_sealed_receipt_as_pending_then_its_proof(home, pg_url):
    """The receipt page on PostgreSQL: a receipt still waiting for its leaf says so (no proof,
    no error), and once the integrator has given it its leaf the page shows the proof."""
    from support import mint_tokens, running
    from test_dashboard import client, sign_in

    async def seal() -> str:
        store = _halted(await _open(home, pg_url))
        try:
            await open_test_loop(store, 0)
            await store.integrate()
            return (await store.write(_add("L1", 1))).receipt_id
        finally:
            held = _hold_log(pg_url)  # closing must not integrate it
            await store.close()
            held.execute("ROLLBACK")
            held.close()

    operator = mint_tokens(home, [("alice", "operator")], pg_url)["alice"]
    receipt_id = anyio.run(seal)
    assert _counts(pg_url) == (1, 1)
    log = _hold_log(pg_url)  # the server's integrator finds the log's row held
    with running(home.parent, "--store", pg_url) as served, client(served) as http:
        try:
            assert sign_in(http, operator.token).status_code == 303
            page = http.get(f"/receipts/{receipt_id}")
        finally:
            log.execute("ROLLBACK")
            log.close()
        assert page.status_code == 200, page.text
        assert "pending integration" in page.text and "is included in the tree" not in page.text
        for _ in range(100):  # the integrator's next poll gives it its leaf (every 50 ms)
            if _counts(pg_url)[1] == 0:
                break
            time.sleep(0.05)
        page = http.get(f"/receipts/{receipt_id}")
        assert page.status_code == 200, page.text
        assert "is included in the tree" in page.text
