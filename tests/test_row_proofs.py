"""The write path proves every row it acts on (kernel/store/guard.py), beyond the attacks of
`test_tamper_rows.py`: each row kind a write reads, edited with plain sqlite3 between two
writes, makes the next write on that loop fail with `IntegrityError` having sealed nothing, and
`verify` names it; loops the edit does not touch keep working; putting the row back heals both.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import BUILDER, OPERATOR, REVIEWER
from support import make_policy

from loopwarden.audit.database import audit
from loopwarden.errors import IntegrityError
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.store.store import Store, snapshot
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.policy.pool_policy import TOTAL_WINDOW
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.update import UpdateRequest, update

pytestmark = pytest.mark.anyio
DB = "loopwarden.db"


async def _open(store: Store, loop_id: str) -> None:
    await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            objective=loop_id,
            policy=make_policy(),
            loop_id=loop_id,
            todos=[
                TodoInput(id="t0", title="first"),
                TodoInput(id="t1", title="after t0", depends_on=("t0",)),
                TodoInput(id="t2", title="third"),
                TodoInput(id="t3", title="fourth"),
            ],
        ),
    )


def _findings(home: Path) -> set[str]:
    with snapshot(home / DB) as reader:
        keys = KeyStore(home)
        report = audit(reader, keys.keyring(), integrity=Integrity(keys.load_secret()))
    return {f.code for f in report.findings}


def _journal(home: Path) -> int:
    with snapshot(home / DB) as reader:
        return reader.journal_count()


Edit = Callable[[sqlite3.Connection], object]
LOOP_TABLES = ("loops", "todos", "turns", "approvals", "state_nodes")  # loop A's rows in each


def _zero(table: str, where: str, column: str) -> Edit:
    """Overwrite one BLOB with zeros of the same length."""

    def edit(conn: sqlite3.Connection) -> None:
        (original,) = conn.execute(f"SELECT {column} FROM {table} WHERE {where}").fetchone()
        conn.execute(f"UPDATE {table} SET {column} = zeroblob({len(original)}) WHERE {where}")

    return edit


def _sql(statement: str) -> Edit:
    return lambda conn: conn.execute(statement)


# Each edit is made on loop A while builder's turn on t0 is open; the next write, reviewer's
# claim on A, reads the edited row (the loop row, its open turn, t2 next in line, or t1 once
# its dependency on t0 is gone).
EDITS: dict[str, tuple[Edit, set[str]]] = {
    "the next todo's attempts raised": (
        _sql("UPDATE todos SET attempts = 9 WHERE loop_id = 'A' AND todo_id = 't2'"),
        {"state_mismatch", "projection_mismatch"},
    ),
    "the next todo's dependencies dropped": (
        _sql("UPDATE todos SET depends_on = '[]' WHERE loop_id = 'A' AND todo_id = 't1'"),
        {"state_mismatch", "projection_mismatch"},
    ),
    "a turn's lease extended": (
        _sql(
            "UPDATE turns SET lease_expires_at = '2999-01-01T00:00:00.000000Z' WHERE loop_id = 'A'"
        ),
        {"state_mismatch", "projection_mismatch"},
    ),
    "a state blob zeroed": (
        _zero("state_nodes", "loop_id = 'A' AND level = 0 AND idx = 0", "hashes"),
        {"state_mismatch"},
    ),
    "the loop's state root zeroed": (
        _zero("loops", "loop_id = 'A'", "state_root"),
        {"state_mismatch", "mac_invalid"},
    ),
    "the loop row's MAC removed": (
        _sql("UPDATE loops SET mac = NULL WHERE loop_id = 'A'"),
        {"mac_invalid"},
    ),
    "the cost counter changed": (
        _sql("UPDATE loops SET cost_micros = 123 WHERE loop_id = 'A'"),
        {"mac_invalid", "projection_mismatch"},
    ),
}


async def _opened(home: Path, clock) -> Store:
    keys = KeyStore(home)
    return await Store.open(
        home / DB, keys.load_signer(), keyring=keys.keyring(), clock=clock, check=False, kinds=KINDS
    )


@pytest.mark.parametrize("name", list(EDITS), ids=list(EDITS))
async def test_an_edited_row_refuses_the_next_write_on_its_loop_only(home, clock, name):
    edit, expected = EDITS[name]
    store = await _opened(home, clock)
    try:
        await _open(store, "A")
        await _open(store, "B")
        assert (await claim(store, BUILDER, ClaimRequest(loop_id="A"))).granted
    finally:
        await store.close()

    conn = sqlite3.connect(home / DB)
    saved = {
        t: conn.execute(f"SELECT * FROM {t} WHERE loop_id = 'A'").fetchall() for t in LOOP_TABLES
    }
    edit(conn)
    conn.commit()
    assert expected <= _findings(home), _findings(home)

    store = await _opened(home, clock)
    try:
        before = _journal(home)
        with pytest.raises(IntegrityError):
            await claim(store, REVIEWER, ClaimRequest(loop_id="A"))
        assert _journal(home) == before, "a refused write sealed nothing"
        assert (await claim(store, REVIEWER, ClaimRequest(loop_id="B"))).granted, (
            "a loop the edit does not touch keeps working"
        )

        for table, rows in saved.items():  # put loop A's rows back exactly as they were
            conn.execute(f"DELETE FROM {table} WHERE loop_id = 'A'")
            if rows:
                marks = ", ".join("?" for _ in rows[0])
                conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        conn.commit()
        assert _findings(home) == set()
        assert (await claim(store, REVIEWER, ClaimRequest(loop_id="A"))).granted
    finally:
        conn.close()
        await store.close()


@pytest.mark.parametrize("forgery", ["garbled", "recompressed"])
async def test_an_edited_idempotency_record_is_never_replayed(home, clock, forgery):
    """Garbled bytes, or a well-formed record with another answer in it (what a careful forger
    writes): either way the replay is refused, and verify names the record."""
    store = await _opened(home, clock)
    try:
        await _open(store, "A")
        request = ClaimRequest(loop_id="A", idempotency_key="c1")
        first = await claim(store, BUILDER, request)
        assert first.granted
        conn = sqlite3.connect(home / DB)
        (response,) = conn.execute("SELECT response FROM idempotency WHERE key = 'c1'").fetchone()
        if forgery == "garbled":
            forged = bytes(response)[:-1] + bytes([bytes(response)[-1] ^ 1])
        else:
            text = zlib.decompress(response).decode().replace(first.turn_id, "turn-" + "0" * 20)
            forged = zlib.compress(text.encode())
        conn.execute("UPDATE idempotency SET response = ? WHERE key = 'c1'", (forged,))
        conn.commit()
        before = _journal(home)
        with pytest.raises(IntegrityError):
            await claim(store, BUILDER, request)
        assert _journal(home) == before
        assert "mac_invalid" in _findings(home)
        conn.execute("UPDATE idempotency SET response = ? WHERE key = 'c1'", (response,))
        conn.commit()
        conn.close()
        again = await claim(store, BUILDER, request)
        assert again.turn_id == first.turn_id, "the genuine record replays the first answer"
        assert _findings(home) == set()
    finally:
        await store.close()


async def test_an_edited_merkle_log_state_refuses_every_write(home, clock):
    store = await _opened(home, clock)
    try:
        await _open(store, "A")
        await _open(store, "B")
        conn = sqlite3.connect(home / DB)
        (size,) = conn.execute("SELECT size FROM log_state").fetchone()
        conn.execute("UPDATE log_state SET size = size - 1")
        conn.commit()
        before = _journal(home)
        for loop_id in ("A", "B"):  # the log is every loop's
            with pytest.raises(IntegrityError):
                await claim(store, BUILDER, ClaimRequest(loop_id=loop_id))
        assert _journal(home) == before
        assert {"mac_invalid", "frontier_mismatch"} <= _findings(home)
        conn.execute("UPDATE log_state SET size = ?", (size,))
        conn.commit()
        conn.close()
        assert (await claim(store, BUILDER, ClaimRequest(loop_id="A"))).granted
        assert _findings(home) == set()
    finally:
        await store.close()


async def test_a_deleted_open_todo_is_skipped_and_verify_reports_it(home, clock):
    """The one edit the write path does not refuse (docs/reliability.md says so): a row hidden
    from the next-todo query is never read, so a claim takes the next todo instead. Nothing
    illegal is granted (any eligible todo may be claimed), and `verify` reports the missing row."""
    store = await _opened(home, clock)
    try:
        await _open(store, "A")
        assert (await claim(store, BUILDER, ClaimRequest(loop_id="A"))).todo_id == "t0"
        conn = sqlite3.connect(home / DB)
        conn.execute("DELETE FROM todos WHERE loop_id = 'A' AND todo_id = 't2'")
        conn.commit()
        conn.close()
        assert {"state_mismatch", "projection_mismatch"} <= _findings(home)
        skipped = await claim(store, REVIEWER, ClaimRequest(loop_id="A"))
        assert skipped.granted and skipped.todo_id == "t3"
        codes = _findings(home)
        assert "decision_illegal" not in codes and "state_mismatch" in codes
    finally:
        await store.close()


# --- the proved view: every reading method a write can reach -----------------------------------

# How each reading method of `ProvedRows` is asked in the case below, and the stored row an edit
# of which it must refuse (`table`, `where`): loop A with t0 claimed by builder (t1 waits on
# t0), an approved approval in that turn, the pool `team` it draws from, and the claim's
# idempotency record.
ProvedRead = Callable[[Any], object]
NOW = "2999-01-01T00:00:00.000000Z"
PROVED_READS: dict[str, tuple[ProvedRead, str, str]] = {
    "loop_row": (lambda r: r.loop_row("A"), "loops", "loop_id = 'A'"),
    "todos": (lambda r: r.todos("A", ["t2"]), "todos", "todo_id = 't2'"),
    "todo": (lambda r: r.todo("A", "t2"), "todos", "todo_id = 't2'"),
    "all_todos": (lambda r: r.all_todos("A"), "todos", "todo_id = 't3'"),
    "max_todo_order": (lambda r: r.max_todo_order("A"), "todos", "todo_id = 't3'"),
    "next_eligible_todo": (lambda r: r.next_eligible_todo("A"), "todos", "todo_id = 't2'"),
    "dependencies_done": (
        lambda r: r.dependencies_done("A", r.todo("A", "t1")),
        "todos",
        "todo_id = 't0'",
    ),
    "turns": (lambda r: r.turns([_turn_id()]), "turns", "loop_id = 'A'"),
    "turn": (lambda r: r.turn(_turn_id()), "turns", "loop_id = 'A'"),
    "loop_turns": (lambda r: r.loop_turns("A"), "turns", "loop_id = 'A'"),
    "open_turns": (lambda r: r.open_turns("A"), "turns", "loop_id = 'A'"),
    "expired_turns": (lambda r: r.expired_turns("A", _far()), "turns", "loop_id = 'A'"),
    "count_open_turns": (lambda r: r.count_open_turns("A"), "turns", "loop_id = 'A'"),
    "claims_since": (lambda r: r.claims_since("A", _long_ago()), "turns", "loop_id = 'A'"),
    "approvals": (lambda r: r.approvals([_approval_id()]), "approvals", "loop_id = 'A'"),
    "approval": (lambda r: r.approval(_approval_id()), "approvals", "loop_id = 'A'"),
    "approved_for_turn": (
        lambda r: r.approved_for_turn("A", _turn_id()),
        "approvals",
        "loop_id = 'A'",
    ),
    "loop_approvals": (lambda r: r.loop_approvals("A"), "approvals", "loop_id = 'A'"),
    "view": (lambda r: r.view("A", None), "approvals", "loop_id = 'A'"),
    "policy": (lambda r: r.policy(r.loop_row("B").policy_digest), "policies", "1 = 1"),
    "pools": (lambda r: r.pools(), "pools", "name = 'team'"),
    "usage": (lambda r: r.usage("team", TOTAL_WINDOW), "pool_usage", "pool = 'team'"),
    "idempotency": (lambda r: r.idempotency("builder", "claim-1"), "idempotency", "1 = 1"),
    "log_state": (lambda r: r.log_state(), "log_state", "id = 1"),
}
NOT_ROWS = {
    "loops_with_expired_turns_in": "loop ids to sweep, each swept through its proved rows",
    "tree": "a loop's state tree, built from its proved row",
    "lock_clause": "SQL text",
}
WRITES = {"save", "keep", "put_pool", "put_usage", "carry_log", "log_carried", "wrote_log", "hold",
          "own_pool_catalog"}  # fmt: skip
_IDS: dict[str, str] = {}


def _turn_id() -> str:
    return _IDS["turn"]


def _approval_id() -> str:
    return _IDS["approval"]


def _far():
    from loopwarden.clock import parse_time

    return parse_time(NOW)


def _long_ago():
    from loopwarden.clock import parse_time

    return parse_time("2000-01-01T00:00:00.000000Z")


def test_every_reading_method_of_the_proved_view_is_held_to_its_proof():
    """A method added to `ProvedRows` must be listed here: as a read proved below, as one that
    returns no row, or as a write."""
    from loopwarden.kernel.store.guard import ProvedRows

    public = {name for name in dir(ProvedRows) if not name.startswith("_")}
    public |= {"lock_clause", "conn", "dialect", "integrity"}  # set in __init__
    assert public - {"conn", "dialect", "integrity"} == set(PROVED_READS) | set(NOT_ROWS) | WRITES


def test_a_write_reads_unproved_rows_only_through_its_named_reader():
    """The transaction is no reader: what is not proved is reached as `tx.unproved`."""
    from loopwarden.kernel.store.reader import Reader
    from loopwarden.kernel.store.txn import Txn

    readers = {n for n in dir(Reader) if not n.startswith("_")} - {"rows"}
    assert readers & {n for n in dir(Txn) if not n.startswith("_")} == set()


async def _proved_case(store: Store) -> None:
    from loopwarden.approvals.approval_ops import (
        ApprovalRequest,
        DecideApprovalRequest,
        decide_approval,
        request_approval,
    )
    from loopwarden.pools.pool_ops import PoolDefineRequest, pool_define

    await pool_define(
        store, OPERATOR, PoolDefineRequest(name="team", policy={"budgets": {"max_turns": 50}})
    )
    for loop_id in ("A", "B"):
        await open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(
                objective=loop_id,
                policy=make_policy(pools=["team"]),
                loop_id=loop_id,
                todos=[
                    TodoInput(id="t0", title="first"),
                    TodoInput(id="t1", title="after t0", depends_on=("t0",)),
                    TodoInput(id="t2", title="third"),
                    TodoInput(id="t3", title="fourth"),
                ],
            ),
        )
    granted = await claim(store, BUILDER, ClaimRequest(loop_id="A", idempotency_key="claim-1"))
    assert granted.granted, granted.reasons
    asked = await request_approval(
        store,
        BUILDER,
        ApprovalRequest(
            turn_id=granted.turn_id, fence=granted.fence, tool="deploy.prod", summary="ship it"
        ),
    )
    await decide_approval(
        store, OPERATOR, DecideApprovalRequest(approval_id=asked.approval_id, approve=True)
    )
    _IDS.update(turn=granted.turn_id, approval=asked.approval_id)


@pytest.mark.parametrize("method", list(PROVED_READS))
async def test_each_reading_method_of_a_write_refuses_an_edited_row(home, clock, method):
    read, table, where = PROVED_READS[method]
    store = await _opened(home, clock)
    try:
        await _proved_case(store)
        assert await store.write(lambda tx: read(tx.rows) is not None), "reads clean before"
    finally:
        await store.close()
    conn = sqlite3.connect(home / DB)
    try:
        edited = _edit_one(conn, table, where)
        conn.commit()
    finally:
        conn.close()
    assert edited, f"the case has a {table} row where {where}"
    store = await _opened(home, clock)
    try:
        with pytest.raises(IntegrityError):
            await store.write(lambda tx: read(tx.rows))
    finally:
        await store.close()


def _edit_one(conn: sqlite3.Connection, table: str, where: str) -> int:
    """Change one stored value of the rows `where`, as an editor outside loopwarden would."""
    edits = {
        "loops": "objective = json_quote('edited')",
        "todos": "title = 'edited'",
        "turns": "lease_expires_at = '2998-01-01T00:00:00.000000Z'",
        "approvals": "tool = 'deploy.edited'",
        "policies": "document = replace(document, '\"max_turns\":20', '\"max_turns\":99')",
        "pools": "status = 'paused'",
        "pool_usage": "turns = turns + 7",
        "idempotency": "request_digest = 'sha256:' || substr(request_digest, 8, 63) || '0'",
        "log_state": "size = size + 1",
    }
    return conn.execute(f"UPDATE {table} SET {edits[table]} WHERE {where}").rowcount


@pytest.mark.parametrize("table", ["todos", "turns"])
async def test_a_row_put_back_to_a_copy_this_store_wrote_is_refused_by_that_store(
    home, clock, table
):
    """The store takes a row read back as values it wrote for the row it wrote (`written.py`):
    an older copy it wrote, put back while it runs, is still proved against the loop's tree."""
    store = await _opened(home, clock)
    try:
        await _open(store, "A")
        first = await claim(store, BUILDER, ClaimRequest(loop_id="A"))
        assert first.granted and first.turn_id is not None
        key = ("todo_id", "t0") if table == "todos" else ("turn_id", first.turn_id)
        conn = sqlite3.connect(home / DB)
        try:
            older = conn.execute(f"SELECT * FROM {table} WHERE {key[0]} = ?", (key[1],)).fetchone()
            await _close_as_failed(store, first.turn_id, first.fence)
            newer = conn.execute(f"SELECT * FROM {table} WHERE {key[0]} = ?", (key[1],)).fetchone()
            assert newer != older, "the write changed the row"
            marks = ", ".join("?" * len(older))
            conn.execute(f"REPLACE INTO {table} VALUES ({marks})", older)
            conn.commit()
        finally:
            conn.close()
        read = (
            (lambda tx: tx.rows.todo("A", "t0"))
            if table == "todos"
            else (lambda tx: tx.rows.turn(first.turn_id))
        )
        with pytest.raises(IntegrityError):
            await store.write(read)
    finally:
        await store.close()


async def _close_as_failed(store: Store, turn_id: str, fence: int) -> None:
    """A write that changes the turn and its todo: the turn closed as failed."""
    result = await update(
        store,
        BUILDER,
        UpdateRequest(turn_id=turn_id, fence=fence, outcome="failed", summary="later",
                      idempotency_key="k-failed"),
    )  # fmt: skip
    assert result.accepted, result
