"""Store invariants: one all-or-nothing write path, a startup check that refuses a damaged file,
a Merkle frontier that matches the journal, consistent checkpoints, and several processes
sharing one database file without breaking any of it."""

from __future__ import annotations

import copy
import itertools
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from conftest import BASIC_POLICY, BUILDER, OPERATOR, REVIEWER
from support import raw_sql_url

import loopwarden
from loopwarden.errors import IntegrityError, LoopwardenError
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import open_checkpoint
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.runner.runner import run_now
from loopwarden.kernel.state.events import Evidence, ReceiptBody, TodoSpec
from loopwarden.kernel.store.reader import Reader
from loopwarden.kernel.store.store import Store, startup_check
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.principals import Principal
from loopwarden.todos.todo_kinds import TodoAdded
from loopwarden.todos.todo_ops import todo_add
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.update import UpdateRequest, update

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

EVIDENCE = [Evidence(kind="test", summary="ok")]
WIDE_POLICY = {**copy.deepcopy(BASIC_POLICY), "budgets": {"max_turns": 1000}}


# --- helpers ---------------------------------------------------------------------------------


async def open_store(home: Path, **kwargs: Any) -> Store:
    keys = KeyStore(home)
    store = await Store.open(home / "loopwarden.db", keys.load_signer(), kinds=KINDS, **kwargs)
    return store


async def open_test_loop(store: Store, todos: int, policy=WIDE_POLICY, loop_id="L1") -> str:
    await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            objective="o",
            policy=policy,
            todos=[TodoInput(title=f"todo {n}") for n in range(todos)],
            loop_id=loop_id,
        ),
    )
    return loop_id


async def work_one(store: Store, who: Principal, loop_id: str, key: str) -> bool:
    """Claim the next todo and complete it; False if nothing was granted."""
    granted = await claim(store, who, ClaimRequest(loop_id=loop_id))
    if not granted.granted:
        return False
    result = await update(
        store,
        who,
        UpdateRequest(
            turn_id=granted.turn_id,  # type: ignore[arg-type]
            fence=granted.fence,  # type: ignore[arg-type]
            outcome="completed",
            evidence=EVIDENCE,
            summary="done",
            idempotency_key=key,
        ),
    )
    assert result.accepted
    return True


def snapshot(reader) -> dict[str, Any]:
    """Everything a write could change."""
    conn = reader.conn
    return {
        "journal": reader.journal_count(),
        "log": reader.log_state(),
        "nodes": conn.execute("SELECT level, idx, hash FROM merkle_nodes ORDER BY 1, 2").fetchall(),
        "checkpoints": reader.checkpoints(),
        "view": reader.full_view("L1"),
        "loops": conn.execute("SELECT * FROM loops ORDER BY loop_id").fetchall(),
        "todos": conn.execute("SELECT * FROM todos ORDER BY loop_id, todo_id").fetchall(),
        "idempotency": conn.execute("SELECT * FROM idempotency ORDER BY 1, 2").fetchall(),
    }


async def settled(store: Store) -> dict[str, Any]:
    """`snapshot` once every committed receipt has its leaf (PostgreSQL's integrator)."""
    await store.integrate()
    return await store.read(snapshot)


def leaf_hashes(reader) -> list[bytes]:
    return [merkle.leaf_hash(row.envelope) for row in reader.iter_journal()]


async def assert_fold_equals_stored(store: Store, loop_id: str) -> list[ReceiptBody]:
    def read(r):
        return r.loop_journal(loop_id), r.full_view(loop_id)

    rows, stored = await store.read(read)
    bodies = []
    for expected_seq, row in enumerate(rows, start=1):
        opened = open_envelope(row.envelope, store.keyring)
        assert opened.verified, opened.problems
        body = KINDS.parse_body(opened.body)
        assert body.seq == row.seq == expected_seq
        bodies.append(body)
    rebuilt = KINDS.rebuild([(b, r.digest) for b, r in zip(bodies, rows, strict=True)])[loop_id]
    assert (rebuilt.loop, rebuilt.todos, rebuilt.turns, rebuilt.approvals, rebuilt.policy) == (
        stored.loop,
        stored.todos,
        stored.turns,
        stored.approvals,
        stored.policy,
    )
    return bodies


# --- one write path: all or nothing ----------------------------------------------------------


async def test_failed_transaction_after_append_leaves_no_trace(store):
    await open_test_loop(store, 14)
    # Fill the log to one short of a checkpoint, so the aborted append would also have signed one.
    while (head := await store.read(lambda r: r.loop_row("L1").head_seq)) < 15:
        await store.write(
            lambda tx, n=head: tx.append(
                "L1",
                "todo.added",
                OPERATOR,
                TodoAdded(todo=TodoSpec(id=f"x{n}", title="x", order=99)),
            )
        )
    await store.integrate()
    before = await settled(store)
    assert before["journal"] == 15 and not before["checkpoints"]

    def doomed(tx):
        tx.append(
            "L1", "todo.added", OPERATOR, TodoAdded(todo=TodoSpec(id="zz", title="z", order=1))
        )
        tx.remember("builder", "key-1", "update", "sha256:" + "0" * 64, '{"accepted":true}')
        assert (
            tx.unproved.pending_count() == 1 and len(tx.integrate()) == 1
        )  # the leaf, as a commit gives it
        assert (
            tx.unproved.journal_count() == 16 and tx.unproved.latest_checkpoint() is not None
        )  # visible inside
        raise RuntimeError("boom after the append")

    with pytest.raises(RuntimeError, match="boom"):
        await store.write(doomed)
    assert await settled(store) == before

    # The next append continues the chain exactly where the committed state left it.
    appended = await store.write(
        lambda tx: tx.append(
            "L1", "todo.added", OPERATOR, TodoAdded(todo=TodoSpec(id="zz", title="z", order=1))
        )
    )
    assert appended.seq == before["view"].loop.head_seq + 1
    await store.integrate()
    stored = await store.read(lambda r: r.receipt_by_id(appended.receipt_id))
    assert stored is not None and stored.leaf_index == 15


async def test_failed_transaction_with_domain_error_leaves_no_trace(store):
    await open_test_loop(store, 2)
    before = await settled(store)

    def doomed(tx):
        tx.append(
            "L1", "todo.added", OPERATOR, TodoAdded(todo=TodoSpec(id="zz", title="z", order=1))
        )
        raise LoopwardenError("refused late")

    with pytest.raises(LoopwardenError):
        await store.write(doomed)
    assert await settled(store) == before


async def test_grouped_writes_commit_together_and_a_failing_body_rolls_back_alone(store):
    """Concurrent writes are group-committed; each body still commits or vanishes on its own."""
    await open_test_loop(store, 2)
    before = await settled(store)
    gate = anyio.Event()
    outcomes: dict[int, object] = {}

    def add(n: int):
        def body(tx):
            sealed = tx.append(
                "L1",
                "todo.added",
                OPERATOR,
                TodoAdded(todo=TodoSpec(id=f"g{n}", title="g", order=n)),
            )
            if n % 3 == 0:
                raise LoopwardenError(f"body {n} refuses after appending")
            return sealed.seq

        return body

    async def writer(n: int) -> None:
        await gate.wait()
        try:
            outcomes[n] = await store.write(add(n))
        except LoopwardenError as exc:
            outcomes[n] = exc

    async with anyio.create_task_group() as tg:
        for n in range(1, 13):
            tg.start_soon(writer, n)
        await anyio.sleep(0)
        gate.set()

    failed = sorted(n for n, o in outcomes.items() if isinstance(o, LoopwardenError))
    committed = {n: o for n, o in outcomes.items() if not isinstance(o, LoopwardenError)}
    assert failed == [3, 6, 9, 12]
    head = before["view"].loop.head_seq
    # The survivors got exactly the next seqs, with no holes left by the rolled-back bodies.
    assert sorted(committed.values()) == list(range(head + 1, head + 1 + len(committed)))
    after = await settled(store)
    assert after["journal"] == before["journal"] + len(committed)
    todos = await store.read(lambda r: {t.todo_id for t in r.all_todos("L1")})
    assert {f"g{n}" for n in committed} <= todos
    assert not {f"g{n}" for n in failed} & todos
    await assert_fold_equals_stored(store, "L1")
    await assert_log_whole(store)


# --- startup check ---------------------------------------------------------------------------

DAMAGE = {
    "projection_head_seq_edited": "UPDATE loops SET head_seq = head_seq - 1",
    "projection_head_digest_edited": "UPDATE loops SET head_digest = 'sha256:' || hex(zeroblob(32))",
    "last_journal_row_deleted": "DELETE FROM journal WHERE leaf_index = (SELECT max(leaf_index) FROM journal)",
    "middle_journal_row_deleted": "DELETE FROM journal WHERE leaf_index = 3",
    "log_size_decreased": "UPDATE log_state SET size = size - 1",
    "log_size_increased": "UPDATE log_state SET size = size + 1",
    "frontier_replaced": "UPDATE log_state SET frontier = zeroblob(length(frontier))",
    "last_envelope_replaced": "UPDATE journal SET envelope = x'00' WHERE leaf_index = (SELECT max(leaf_index) FROM journal)",
}


async def _populated_home(home: Path) -> None:
    store = await open_store(home)
    try:
        await open_test_loop(store, 4)
        for n in range(3):
            await work_one(store, BUILDER, "L1", f"k{n}")
    finally:
        await store.close()


async def test_startup_check_accepts_an_undamaged_store(home):
    await _populated_home(home)
    store = await open_store(home)
    try:
        await store.read(startup_check)
    finally:
        await store.close()


@pytest.mark.backends
async def test_a_store_opening_while_another_writer_commits_checks_one_snapshot(
    home, store_url, monkeypatch
):
    """The start-up check reads the log and the journal in one snapshot: a receipt committed
    by another process between its reads is not a damaged store (it once refused to serve:
    "the journal holds 22 receipts but the Merkle log has 21 leaves")."""
    keys = KeyStore(home)
    writer = Store.open_now(store_url, keys.load_signer(), key_dir=home, kinds=KINDS)
    try:
        request = {"objective": "o", "policy": BASIC_POLICY, "loop_id": "L"}
        run_now(open_loop, writer, OPERATOR, request)
        counted = Reader.journal_count
        commits = []

        def count_after_a_commit(reader: Reader) -> int:
            if not commits:  # another writer commits between the check's two reads
                todo = {"loop_id": "L", "title": "late"}
                commits.append(run_now(todo_add, writer, OPERATOR, todo))
            return counted(reader)

        monkeypatch.setattr(Reader, "journal_count", count_after_a_commit)
        opened = Store.open_now(store_url, keys.load_signer(), key_dir=home, kinds=KINDS)
        opened.close_now()
        assert commits, "the writer committed while the check ran"
    finally:
        writer.close_now()


@pytest.mark.parametrize("damage", list(DAMAGE.values()), ids=list(DAMAGE))
async def test_startup_check_refuses_a_damaged_store(home, damage):
    await _populated_home(home)
    raw = sqlite3.connect(home / "loopwarden.db")
    try:
        assert raw.execute(damage).rowcount == 1
        raw.commit()
    finally:
        raw.close()
    with pytest.raises(IntegrityError):
        await open_store(home)


# --- Merkle log ------------------------------------------------------------------------------


async def test_frontier_and_root_match_the_journal_after_every_append(store):
    await open_test_loop(store, 6)
    sizes = set()
    for n in range(7):
        await work_one(store, BUILDER if n % 2 else REVIEWER, "L1", f"k{n}")
        await store.integrate()

        def check(reader):
            size, frontier = reader.log_state()
            leaves = leaf_hashes(reader)
            assert size == len(leaves) == reader.journal_count()
            assert frontier == merkle.frontier_at(size, reader.node)
            assert merkle.root_from_frontier(frontier) == merkle.root_from_leaves(leaves)
            return size

        sizes.add(await store.read(check))
    assert len(sizes) == 7  # every round appended


async def test_checkpoints_every_n_receipts_are_signed_and_consistent(store):
    await open_test_loop(store, 30)
    for n in range(30):
        assert await work_one(store, BUILDER, "L1", f"k{n}")

    def read(reader):
        checkpoints = reader.checkpoints()
        leaves = leaf_hashes(reader)
        proofs = [
            merkle.consistency_proof(old.size, new.size, reader.node)
            for old, new in itertools.pairwise(checkpoints)
        ]
        return checkpoints, leaves, proofs

    checkpoints, leaves, proofs = await store.read(read)
    every = store.checkpoint_every
    assert [c.size for c in checkpoints] == list(range(every, len(leaves) + 1, every))
    assert len(checkpoints) >= 3
    for cp in checkpoints:
        signed = open_checkpoint(cp.note, store.keyring)
        assert signed.verified and signed.size == cp.size and signed.root == cp.root
        assert cp.root == merkle.root_from_leaves(leaves[: cp.size])
    for (old, new), proof in zip(itertools.pairwise(checkpoints), proofs, strict=True):
        assert merkle.verify_consistency(old.size, new.size, old.root, new.root, proof)
        assert not merkle.verify_consistency(old.size, new.size, new.root, new.root, proof)


# --- several processes on one file -----------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    import anyio

    from loopwarden.kernel.state.events import Evidence
    from loopwarden.kernel.log.keys import KeyStore
    from loopwarden.kernel.store.store import Store
    from loopwarden.kinds import KINDS
    from loopwarden.principals import Principal
    from loopwarden.turns.claim import ClaimRequest, claim
    from loopwarden.turns.update import UpdateRequest, update
    from loopwarden.kernel.state.events import Usage


    async def main(home: Path, loop_id: str, agent: str) -> None:
        keys = KeyStore(home)
        store = await Store.open(home / "loopwarden.db", keys.load_signer(), kinds=KINDS)
        who = Principal(id=agent, role="agent")
        (home / f"ready-{agent}").touch()
        deadline = time.monotonic() + 30
        while not (home / "go").exists():  # start together
            if time.monotonic() > deadline:
                raise SystemExit("no go signal")
            await anyio.sleep(0.01)
        completed = n = 0
        try:
            while time.monotonic() < deadline:
                granted = await claim(store, who, ClaimRequest(loop_id=loop_id))
                if not granted.granted:
                    if granted.status != "active":
                        break
                    await anyio.sleep(0.002)
                    continue
                n += 1
                # Every third turn reports progress: the todo goes back for anyone to claim.
                outcome = "progress" if n % 3 == 0 else "completed"
                result = await update(
                    store,
                    who,
                    UpdateRequest(
                        turn_id=granted.turn_id,
                        fence=granted.fence,
                        outcome=outcome,
                        usage=Usage(model_calls=1, cost_usd=0.01),
                        evidence=[Evidence(kind="test", summary="ok")],
                        summary=f"{outcome} by {agent}",
                        idempotency_key=f"{agent}-{n}",
                    ),
                )
                assert result.accepted, result.reasons
                completed += outcome == "completed"
                # An agent works between turns; without a pause, one process can re-take
                # SQLite's write lock turn after turn while the others sleep in its busy
                # handler, and the test would not exercise several writers at all.
                await anyio.sleep(0.01)
        finally:
            await store.close()
        print(completed)


    anyio.run(main, Path(sys.argv[1]), sys.argv[2], sys.argv[3])
    """
)


def _check_no_double_grant(bodies: list[ReceiptBody]) -> Counter[str]:
    """Replay the grants: a todo is never granted while another turn on it is open, fences
    rise by one per grant, and each todo is completed exactly once. Returns completions."""
    open_turn: dict[str, str] = {}
    fence: Counter[str] = Counter()
    completed: Counter[str] = Counter()
    for body in bodies:
        data = body.data.model_dump(mode="json")
        if body.kind == "turn.claimed":
            todo = data["todo_id"]
            assert todo not in open_turn, f"todo {todo} granted while {open_turn[todo]} is open"
            assert data["fence"] == fence[todo] + 1
            fence[todo] = data["fence"]
            open_turn[todo] = data["turn_id"]
        elif body.kind in ("turn.reported", "lease.expired") or (
            body.kind == "turn.refused" and data["closes_turn"]
        ):
            assert open_turn.pop(data["todo_id"]) == data["turn_id"]
            if body.kind == "turn.reported" and data["outcome"] == "completed":
                completed[data["todo_id"]] += 1
        elif body.kind in ("loop.stopped", "loop.completed", "loop.cancelled"):
            for closed in data.get("closed_turns", ()):
                assert open_turn.pop(closed["todo_id"]) == closed["turn_id"]
    return completed


async def test_several_processes_share_one_store_without_breaking_invariants(home, tmp_path):
    todos = 40
    store = await open_store(home)
    try:
        await open_test_loop(store, todos, {**WIDE_POLICY, "agents": ["*"]})
    finally:
        await store.close()

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(Path(loopwarden.__file__).resolve().parent.parent)}
    agents = [f"worker{n}" for n in range(4)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(home), "L1", agent],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for agent in agents
    ]
    deadline = time.monotonic() + 60
    try:
        while not all((home / f"ready-{a}").exists() for a in agents):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                pytest.fail(
                    "a worker did not start: "
                    + "".join(p.stderr.read() for p in procs if p.poll() is not None)
                )  # type: ignore[union-attr]
            time.sleep(0.02)
        (home / "go").touch()
        outputs = [p.communicate(timeout=max(deadline - time.monotonic(), 1)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    per_worker = [int(out.strip()) for out, _ in outputs]
    assert sum(per_worker) == todos
    assert sum(1 for n in per_worker if n) >= 2, f"no real concurrency: {per_worker}"

    store = await open_store(home)  # the startup check runs here too
    try:
        await store.read(startup_check)
        count, size = await store.read(lambda r: (r.journal_count(), r.log_state()[0]))
        assert count == size
        bodies = await assert_fold_equals_stored(store, "L1")
        completed = _check_no_double_grant(bodies)
        assert completed == {f"t{n}": 1 for n in range(1, todos + 1)}
        loop = await store.read(lambda r: r.loop_row("L1"))
        assert loop.status == "completed"
        turns = sum(1 for b in bodies if b.kind == "turn.claimed")
        assert loop.totals.turns == turns and loop.totals.units("model_calls") == turns
    finally:
        await store.close()


SATURATOR = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    import anyio

    from loopwarden.kernel.log.keys import KeyStore
    from loopwarden.kernel.state.events import Evidence
    from loopwarden.kernel.store.store import Store
    from loopwarden.kinds import KINDS
    from loopwarden.turns.claim import ClaimRequest, claim
    from loopwarden.turns.update import UpdateRequest, update
    from loopwarden.principals import Principal


    async def agent(store, name, turns, home):
        who = Principal(id=name, role="agent")
        for n in range(turns):
            granted = await claim(store, who, ClaimRequest(loop_id="busy"))
            assert granted.granted, granted.reasons
            await update(store, who, UpdateRequest(
                turn_id=granted.turn_id, fence=granted.fence, outcome="progress",
                evidence=[Evidence(kind="test", summary="ok")], summary="busy",
                idempotency_key=f"{name}-{n}",
            ))
            if n == 10:
                (home / "running").touch()


    async def main(home, turns):
        store = await Store.open(home / "loopwarden.db", KeyStore(home).load_signer(), kinds=KINDS)
        try:
            async with anyio.create_task_group() as tg:  # 8 agents: the queue is never empty
                for a in range(8):
                    tg.start_soon(agent, store, f"busy{a}", turns, home)
        finally:
            await store.close()


    anyio.run(main, Path(sys.argv[1]), int(sys.argv[2]))
    """
)


async def test_a_process_writing_flat_out_does_not_starve_another_process(home, tmp_path):
    """One process with 8 agents keeps its store's queue full, so it could take SQLite's write
    lock back the moment it commits, for as long as it runs; another process's writes must
    still land while it runs, not after it (the order in the log says which)."""
    store = await open_store(home)
    try:
        policy = {**WIDE_POLICY, "agents": ["*"], "budgets": {"max_turns": 100_000}}
        policy["claims"] = {**policy["claims"], "max_active": 8, "max_active_per_agent": 1}
        await open_test_loop(store, 8, policy, loop_id="busy")
        await open_test_loop(store, 8, policy, loop_id="other")
        script = tmp_path / "saturator.py"
        script.write_text(SATURATOR)
        env = {**os.environ, "PYTHONPATH": str(Path(loopwarden.__file__).resolve().parent.parent)}
        proc = subprocess.Popen(
            [sys.executable, str(script), str(home), "150"],
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not (home / "running").exists():
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()  # type: ignore[union-attr]
                await anyio.sleep(0.01)
            for n in range(5):
                assert await work_one(store, REVIEWER, "other", f"other-{n}")
            _, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=120))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        leaves = await store.read(
            lambda r: {
                lid: [j.leaf_index for j in r.loop_journal(lid)] for lid in ("busy", "other")
            }
        )
        busy_after = [leaf for leaf in leaves["busy"] if leaf > max(leaves["other"])]
        assert len(busy_after) > 100, (
            f"the other process waited for the busy one to end: {busy_after}"
        )
    finally:
        await store.close()


# --- schema migrations -----------------------------------------------------------------------


async def test_a_version_1_database_is_migrated_in_place_and_keeps_working(home):
    from loopwarden.kernel.sql.schema import SCHEMA_VERSION
    from loopwarden.kernel.sql.upgrades import SQLITE_UPGRADES, SQLITE_VERSION_1

    home.mkdir(parents=True)
    path = home / "loopwarden.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in SQLITE_VERSION_1:
        conn.execute(statement)
    conn.execute("INSERT INTO meta (key, value) VALUES ('origin', 'loopwarden.local/old')")
    conn.execute("INSERT INTO log_state (id, size, frontier) VALUES (1, 0, x'')")
    # Rows in the tables version 2 rebuilds must survive the rebuild unchanged.
    old_loop = ("OLD", "o", "cancelled", "cancelled", "sha256:" + "0" * 64, "t", "op",
                *([0] * 11), None, 0, 0, "", "t")  # fmt: skip
    conn.execute(f"INSERT INTO loops VALUES ({','.join('?' * len(old_loop))})", old_loop)
    old_turn = ("turn-" + "0" * 20, "OLD", "t1", "a", 1, "closed", "t", "t", "t", None)
    conn.execute(f"INSERT INTO turns VALUES ({','.join('?' * len(old_turn))})", old_turn)
    for number in (2, 3):  # as `migrate` runs them
        for statement in SQLITE_UPGRADES[number]:
            conn.execute(statement)
    assert conn.execute("SELECT * FROM loops WHERE loop_id = 'OLD'").fetchone() == old_loop
    assert conn.execute("SELECT * FROM turns WHERE loop_id = 'OLD'").fetchone() == old_turn
    conn.execute("DELETE FROM turns")  # the stand-in rows have no receipts behind them
    conn.execute("DELETE FROM loops")
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    # Past version 3 the projection is re-derived from the journal (here: empty) with proofs.

    store = await open_store(home)
    try:
        await open_test_loop(store, 3)
        await work_one(store, BUILDER, "L1", "k0")
        await assert_fold_equals_stored(store, "L1")
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"todos_by_order", "turns_by_status_and_claim"} <= indexes
    assert "journal_turn" not in indexes and "turns_by_agent" not in indexes
    assert conn.execute("SELECT value FROM meta WHERE key = 'origin'").fetchone()[0] == (
        "loopwarden.local/old"
    )


HOOK_FIXTURES = Path(__file__).parent / "fixtures" / "hooks" / "claude-code"


async def test_a_version_5_store_is_migrated_to_6_and_its_rows_proved_again(
    home, backend, store_url
):
    from loopwarden.audit.database import audit
    from loopwarden.hosts.handle import handle
    from loopwarden.kernel.sql.schema import SCHEMA_VERSION
    from loopwarden.kernel.sql.upgrades import UPGRADES

    keys = KeyStore(home)

    async def opened() -> Store:
        signer = keys.load_signer()
        return await Store.open(
            store_url, signer, keyring=keys.keyring(), key_dir=home, kinds=KINDS
        )

    store = await opened()
    try:
        await open_test_loop(store, 3, {**WIDE_POLICY, "observe": {"mode": "record"}})
        session = (HOOK_FIXTURES / "SessionStart-startup.json").read_bytes()
        await handle(store, "claude-code", session, loop_id="L1", agent="builder", servers=[])
        assert await work_one(store, BUILDER, "L1", "k0")
        attached = (await store.read(lambda r: r.loop_row("L1"))).hosts
        assert "builder" in attached
    finally:
        await store.close()
    # Back to version 5, as a store written before the hooks left it: no hook columns (and
    # none a later version added).
    version = (
        "PRAGMA user_version = 5"
        if backend == "sqlite"
        else "UPDATE meta SET value = '5' WHERE key = 'schema_version'"
    )
    dropped = [
        step.reverted()
        for number in sorted(UPGRADES, reverse=True)
        for step in reversed(UPGRADES[number])
    ]
    assert "ALTER TABLE loops DROP COLUMN hosts" in dropped
    raw_sql_url(backend, store_url, *dropped, version)
    store = await opened()
    try:
        assert (await store.read(lambda r: r.loop_row("L1"))).hosts == attached  # from receipts
        assert await work_one(store, BUILDER, "L1", "k1"), "the re-proved rows serve writes"
        await assert_fold_equals_stored(store, "L1")
        report = await store.read(lambda r: audit(r, store.keyring, workers=0))
        assert report.findings == [], [f.as_dict() for f in report.findings]
        if backend == "sqlite":
            found = await store.read(lambda r: r.conn.execute("PRAGMA user_version").fetchone())
        else:
            found = await store.read(
                lambda r: r.conn.execute(
                    "SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'schema_version'"
                ).fetchone()
            )
        assert found[0] == SCHEMA_VERSION
    finally:
        await store.close()


async def test_a_database_from_a_newer_loopwarden_is_refused(home):
    from loopwarden.kernel.sql.schema import SCHEMA_VERSION

    home.mkdir(parents=True)
    conn = sqlite3.connect(home / "loopwarden.db", isolation_level=None)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(LoopwardenError, match="Upgrade loopwarden"):
        await open_store(home)


async def test_a_write_cancelled_while_queued_never_commits(store):
    """A caller that gives up while waiting for the writer must not be committed later by
    someone else's group (it would hold leases nobody knows about)."""
    await open_test_loop(store, 2)
    before = await settled(store)
    started = anyio.Event()
    released = threading.Event()
    token = anyio.lowlevel.current_token()  # the body runs on the store's writer thread

    def slow(tx):
        anyio.from_thread.run_sync(started.set, token=token)
        # Hold the writer until the second call has given up (a sleep here was sometimes over
        # before a loaded machine had even queued it).
        assert released.wait(timeout=30), "the queued call was never cancelled"

    def doomed(tx):
        tx.append(
            "L1", "todo.added", OPERATOR, TodoAdded(todo=TodoSpec(id="late", title="x", order=9))
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(store.write, slow)
        await started.wait()
        with anyio.move_on_after(0.05):
            await store.write(doomed)  # cancelled while queued
        released.set()
    await store.write(lambda tx: None)  # a later group must not pick it up
    after = await settled(store)
    assert after == before
    assert await store.read(lambda r: r.todo("L1", "late")) is None


async def test_a_write_past_the_backlog_is_refused_at_once_and_nothing_of_it_is_written(
    home, store_url
):
    """With the writer held and `backlog` calls queued behind it, the next write is refused
    (`StoreBusy`, retriable) without waiting; the queued ones commit once the writer is free,
    and a write after them is taken again."""
    from loopwarden.errors import StoreBusy

    keys = KeyStore(home)
    store = await Store.open(store_url, keys.load_signer(), key_dir=home, backlog=2, kinds=KINDS)
    try:
        await open_test_loop(store, 4)
        started, released = anyio.Event(), threading.Event()
        token = anyio.lowlevel.current_token()

        def hold(tx):
            anyio.from_thread.run_sync(started.set, token=token)
            assert released.wait(timeout=30), "the refused write never came"

        def add(todo: str):
            spec = TodoSpec(id=todo, title=todo, order=9)
            return lambda tx: tx.append("L1", "todo.added", OPERATOR, TodoAdded(todo=spec))

        async with anyio.create_task_group() as tg:
            tg.start_soon(store.write, hold)
            await started.wait()  # the writer thread is inside `hold`: what follows queues
            tg.start_soon(store.write, add("queued-1"))
            tg.start_soon(store.write, add("queued-2"))
            while store.queue_depth() < 2:
                await anyio.lowlevel.checkpoint()
            with pytest.raises(StoreBusy, match=r"2 writes are already waiting .* limit is 2"):
                await store.write(add("refused"))
            released.set()
        await store.write(add("after"))
        todos = {n: await store.read(lambda r, n=n: r.todo("L1", n)) for n in ("queued-1",
                 "queued-2", "refused", "after")}  # fmt: skip
        assert {n for n, row in todos.items() if row is not None} == {
            "queued-1",
            "queued-2",
            "after",
        }
    finally:
        await store.close()


async def test_a_backlog_limit_below_one_is_refused(home):
    from loopwarden.errors import InvalidInput

    with pytest.raises(InvalidInput, match="positive number of calls, not 0"):
        Store.open_now(home / "loopwarden.db", KeyStore(home).load_signer(), backlog=0, kinds=KINDS)
    assert not (home / "loopwarden.db").exists()


async def test_a_database_error_in_one_grouped_body_fails_that_body_alone(store):
    """Three bodies committed as one group; the middle one's last statement breaks a key (on
    PostgreSQL its writes are pipelined, so the error arrives when the body ends): that body
    fails and leaves nothing, the other two commit with the next seqs."""
    await open_test_loop(store, 2)
    before = await settled(store)
    started, released = anyio.Event(), threading.Event()
    token = anyio.lowlevel.current_token()
    outcomes: dict[int, object] = {}

    def hold(tx):
        anyio.from_thread.run_sync(started.set, token=token)
        assert released.wait(timeout=30), "the group was never queued"

    def body(n: int):
        def run(tx):
            spec = TodoSpec(id=f"p{n}", title="p", order=n)
            sealed = tx.append("L1", "todo.added", OPERATOR, TodoAdded(todo=spec))
            if n == 2:  # the store's origin row exists: a duplicate key
                tx.conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", ("origin", "x"))
            return sealed.seq

        return run

    async def write(n: int) -> None:
        try:
            outcomes[n] = await store.write(body(n))
        except LoopwardenError as exc:
            outcomes[n] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(store.write, hold)
        await started.wait()
        for n in (1, 2, 3):
            tg.start_soon(write, n)
            while store.queue_depth() < n:  # queued in this order, taken as one group
                await anyio.lowlevel.checkpoint()
        released.set()
    head = before["view"].loop.head_seq
    assert isinstance(outcomes[2], LoopwardenError), outcomes
    assert [outcomes[1], outcomes[3]] == [head + 1, head + 2]
    todos = await store.read(lambda r: {t.todo_id for t in r.all_todos("L1")})
    assert {"p1", "p3"} <= todos and "p2" not in todos
    assert (await settled(store))["journal"] == before["journal"] + 2
    await assert_fold_equals_stored(store, "L1")
    await assert_log_whole(store)  # the failed body's leaf is in no later body's frontier


async def assert_log_whole(store: Store) -> None:
    """The Merkle log holds exactly the journal: the start-up check and a full audit agree."""
    from loopwarden.audit.database import audit

    await store.read(startup_check)
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert report.findings == [], [f.as_dict() for f in report.findings]
