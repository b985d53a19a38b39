"""The SQLite WAL stays bounded while a store writes without pause: its checkpoints copy the log
back and the writer starts it again from the top, so the file does not grow with the journal.
(A checkpoint made beside a writer that never pauses never catches up with it, and the log
grows for as long as the writes go on: this holds the store to a log it can start again.)"""

from __future__ import annotations

import pytest
from conftest import BASIC_POLICY, OPERATOR

from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.sql.sqlite import WAL_AUTOCHECKPOINT_PAGES
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.todos.todo_ops import TodoAddRequest, todo_add

pytestmark = pytest.mark.anyio

PAGE = 4096 + 24  # a WAL frame: a page and its header
WRITES = 1_500  # receipts: each commit writes at least 3 pages (journal, log state, loop row)


async def test_a_store_writing_without_pause_keeps_its_wal_bounded(home):
    db = home / "loopwarden.db"
    store = await Store.open(db, KeyStore(home).load_signer(), kinds=KINDS)
    try:
        await open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(
                objective="o", policy=BASIC_POLICY, todos=[TodoInput(title="t")], loop_id="L1"
            ),
        )
        for n in range(WRITES):
            await todo_add(store, OPERATOR, TodoAddRequest(loop_id="L1", title=f"todo {n}"))
        wal = db.with_name(db.name + "-wal").stat().st_size
    finally:
        await store.close()
    assert WRITES * 3 > WAL_AUTOCHECKPOINT_PAGES, "the writes outgrow one log"
    assert wal <= 1.5 * WAL_AUTOCHECKPOINT_PAGES * PAGE, f"the WAL grew to {wal:,} bytes"
