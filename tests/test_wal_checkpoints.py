"""The SQLite WAL copied back into the database by a thread of its own (`checkpoints.py`): a
store that reads hands the work to it and turns its writer's autocheckpoint off; a store that
only writes, or whose checkpointer stopped, checkpoints on its writer as SQLite does."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from conftest import BASIC_POLICY, OPERATOR

from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.sql import checkpoints
from loopwarden.kernel.sql.sqlite import WAL_AUTOCHECKPOINT_PAGES, SqliteBackend
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.todos.todo_ops import TodoAddRequest, todo_add

pytestmark = pytest.mark.anyio

WAIT_SECONDS = 60.0  # a bound for the thread to run, never a pace: it runs when woken


def autocheckpoint(store: Store) -> int:
    backend = store.backend
    assert isinstance(backend, SqliteBackend)
    return int(backend.writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0])


def checkpointer(store: Store) -> checkpoints.Checkpointer:
    backend = store.backend
    assert isinstance(backend, SqliteBackend)
    assert backend._checkpoints is not None, "a store that reads starts a checkpointer"
    return backend._checkpoints


async def writes(store: Store, count: int) -> None:
    for n in range(count):
        await todo_add(store, OPERATOR, TodoAddRequest(loop_id="L1", title=f"todo {n}"))


async def open_store(home: Path) -> Store:
    keys = KeyStore(home)
    store = await Store.open(home / "loopwarden.db", keys.load_signer(), kinds=KINDS)
    await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            objective="o", policy=BASIC_POLICY, todos=[TodoInput(title="t")], loop_id="L1"
        ),
    )
    return store


async def test_a_store_that_reads_checkpoints_on_its_own_thread_not_its_writer(home, monkeypatch):
    monkeypatch.setattr(checkpoints, "EVERY", 4)
    store = await open_store(home)
    try:
        thread = checkpointer(store)
        await writes(store, 12)
        assert autocheckpoint(store) == 0  # the writer no longer copies the log back itself
        deadline = time.monotonic() + WAIT_SECONDS
        while thread.runs < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert thread.runs >= 3, (thread.runs, thread.failed)
        assert thread.failed is None
    finally:
        await store.close()
    assert not thread.running


async def test_a_writer_whose_checkpointer_stopped_checkpoints_again(home):
    store = await open_store(home)
    try:
        await writes(store, 1)
        assert autocheckpoint(store) == 0
        checkpointer(store).stop()
        await writes(store, 1)
        assert autocheckpoint(store) == WAL_AUTOCHECKPOINT_PAGES
    finally:
        await store.close()


async def test_a_store_that_only_writes_keeps_sqlites_autocheckpoint(home):
    keys = KeyStore(home)
    store = Store.open_now(home / "loopwarden.db", keys.load_signer(), key_dir=home, kinds=KINDS)
    try:
        backend = store.backend
        assert isinstance(backend, SqliteBackend)
        assert backend._checkpoints is None
        assert autocheckpoint(store) == WAL_AUTOCHECKPOINT_PAGES
    finally:
        store.close_now()


async def test_a_checkpointer_that_cannot_connect_leaves_the_work_to_the_writer(tmp_path):
    def refuse() -> sqlite3.Connection:
        raise sqlite3.OperationalError("unable to open database file")

    thread = checkpoints.Checkpointer(refuse, every=1)
    thread.start()
    deadline = time.monotonic() + WAIT_SECONDS
    while thread.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not thread.running
    assert isinstance(thread.failed, sqlite3.OperationalError)
    thread.committed()  # asked after it ended: nothing happens, nothing raises
    thread.stop()
