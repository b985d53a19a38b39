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
from loopwarden.turns.claim import ClaimRequest, claim

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
