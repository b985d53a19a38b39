"""What only PostgreSQL has to prove: replicas on one database, lost connections, copies.

- two stores on one database (replicas in one process) keep one Merkle order and one `seq` chain
  per loop, and replicas starting together migrate once;
- a replica with another integrity secret is refused before it writes;
- an ambiguous commit (the connection lost after COMMIT was sent) is read back: committed, the
  caller gets its result and nothing is written twice; not committed, the caller gets an error,
  nothing is durable, and a retry with the same idempotency key writes it once. The connection
  really is cut, by a TCP proxy between the store and the server;
- `loopwarden store copy` SQLite → PostgreSQL → SQLite: receipts byte-identical, same Merkle
  root, every table row for row, and `verify` clean on each.

The operation, invariant and tamper suites run on both backends through the `store` fixture
(`pytest.mark.backends`); the replicas and SIGKILL tests are in test_concurrency.py.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import anyio
import pytest
from conftest import BASIC_POLICY, BUILDER, OPERATOR
from support import cli, cli_env, merkle_problems

from loopwarden.errors import KeyFileError, StoreError
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.store.store import Store, snapshot
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, open_loop
from loopwarden.todos.todo_ops import TodoAddRequest, todo_add
from loopwarden.turns.claim import ClaimRequest, claim

pytestmark = pytest.mark.anyio


async def _open(home: Path, url: str, **kw: Any) -> Store:
    keys = KeyStore(home)
    return await Store.open(
        url, keys.load_signer(), keyring=keys.keyring(), key_dir=home, kinds=KINDS, **kw
    )


async def _loop(store: Store, loop_id: str = "L1", todos: int = 3) -> None:
    await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            loop_id=loop_id,
            objective="test",
            policy=BASIC_POLICY,
            todos=[{"title": f"item {n}"} for n in range(1, todos + 1)],
        ),
    )


def _journal(url: str) -> list[tuple[int | None, str, int, bytes]]:
    """Every sealed receipt: those in the tree in leaf order, then those pending (no leaf)."""
    with snapshot(url) as reader:
        rows = [*reader.iter_journal(), *(p.integrated(None) for p in reader.pending_receipts())]
        return [(r.leaf_index, r.loop_id, r.seq, r.envelope) for r in rows]


# --- replicas in one process ------------------------------------------------------------------


async def test_two_stores_on_one_database_keep_one_merkle_order_and_one_chain(home, pg_url):
    first, second = await _open(home, pg_url), await _open(home, pg_url)
    try:
        await _loop(first, "L1", todos=0)
        await _loop(second, "L2", todos=0)

        async def add(store: Store, loop_id: str, n: int) -> None:
            for i in range(n):
                await todo_add(
                    store, OPERATOR, TodoAddRequest(loop_id=loop_id, title=f"{loop_id}-{i}")
                )

        async with anyio.create_task_group() as group:
            for store in (first, second):
                for loop_id in ("L1", "L2"):
                    group.start_soon(add, store, loop_id, 15)
    finally:
        await first.close()
        await second.close()
    rows = _journal(pg_url)
    assert [r[0] for r in rows] == list(range(len(rows))) == list(range(62))
    for loop_id in ("L1", "L2"):
        assert [r[2] for r in rows if r[1] == loop_id] == list(range(1, 32))
    with snapshot(pg_url) as reader:
        assert merkle_problems(reader) == []


async def test_replicas_starting_together_migrate_the_schema_once(home, pg_url):
    KeyStore(home).load_signer()
    KeyStore(home).load_secret()
    stores: list[Store] = []

    async def start() -> None:
        stores.append(await _open(home, pg_url))

    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(start)
    try:
        origins = {s.origin for s in stores}
        assert len(stores) == 4 and len(origins) == 1
        await _loop(stores[0])
        assert await stores[3].read(lambda r: r.loop_row("L1")) is not None
    finally:
        for store in stores:
            await store.close()


async def test_a_replica_with_another_integrity_secret_is_refused_before_it_writes(
    tmp_path, pg_url
):
    first_home, other_home = tmp_path / "a", tmp_path / "b"
    store = await _open(first_home, pg_url)
    await _loop(store)
    await store.close()
    before = _journal(pg_url)
    with pytest.raises(KeyFileError, match="integrity secret"):  # none at all: not made up
        await _open(other_home, pg_url)
    KeyStore(other_home).load_secret()  # a secret of its own
    with pytest.raises(StoreError, match="integrity secret") as refused:
        await _open(other_home, pg_url)
    assert refused.value.code == "integrity_secret_mismatch"
    assert _journal(pg_url) == before


async def test_a_store_that_does_not_exist_is_not_created_by_a_reading_command(home, pg_url):
    done = cli("loop", "list", "--store", pg_url, "--home", str(home))
    assert done.returncode == 1 and "there are no keys in" in done.stderr, done.stderr
    assert not home.exists()  # a mistyped home makes nothing
    KeyStore(home).load_signer()
    KeyStore(home).load_secret()
    done = cli("loop", "list", "--home", str(home), env=cli_env(LOOPWARDEN_STORE=pg_url))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no loopwarden store" in done.stderr
    assert "password" not in done.stderr
    with pytest.raises(Exception, match="no loopwarden store"):
        _journal(pg_url)


# --- ambiguous commits, with the connection really cut -----------------------------------------


COMMIT = (
    b"Q\x00\x00\x00\x0bCOMMIT\x00",  # the simple-query message psycopg sends for COMMIT
    b"P\x00\x00\x00\x0e\x00COMMIT\x00",  # its Parse message in a pipeline (extended protocol)
)


class _Cut:
    """One proxied connection's cut: `muted` once the server's answers are to be swallowed,
    `answered` once one was."""

    def __init__(self) -> None:
        self.muted = threading.Event()
        self.answered = threading.Event()


class CuttingProxy:
    """A TCP proxy to the server's Unix socket that, when armed, cuts the connection at the
    store's next COMMIT: `before` it reaches the server, or `after` the server has answered
    it (the answer is never passed on). Every socket is closed when the proxy is."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.mode: str | None = None
        self.cuts = 0
        self._open: list[socket.socket] = [self.listener]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX)
            server.connect(self.socket_path)
            self._open += [client, server]
            cut = _Cut()
            threading.Thread(target=self._up, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, cut), daemon=True).start()

    def _down(self, server: socket.socket, client: socket.socket, cut: _Cut) -> None:
        """The server's answers to the client, until the cut: what comes after is swallowed
        (and `answered` set), so the COMMIT's answer never reaches the store."""
        try:
            while data := server.recv(65536):
                if cut.muted.is_set():
                    cut.answered.set()
                    continue
                client.sendall(data)
        except OSError:
            pass
        finally:
            cut.answered.set()
            for sock in (server, client):
                sock.close()

    def _up(self, client: socket.socket, server: socket.socket, cut: _Cut) -> None:
        try:
            while data := client.recv(65536):
                if self.mode and any(message in data for message in COMMIT):
                    mode, self.mode = self.mode, None
                    self.cuts += 1
                    if mode == "after":
                        cut.muted.set()  # before the COMMIT goes: its answer must not get back
                        server.sendall(data)
                        cut.answered.wait(10)  # the server has committed, and said so
                    break
                server.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                sock.close()

    def url(self, store_url: str) -> str:
        query = parse_qs(urlsplit(store_url).query)
        options = quote(query["options"][0])
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?options={options}"

    def close(self) -> None:
        self._closing = True
        for sock in self._open:
            sock.close()


@contextmanager
def cutting_proxy(store_url: str) -> Iterator[tuple[CuttingProxy, str]]:
    host = parse_qs(urlsplit(store_url).query).get("host")
    if not host:
        pytest.skip("the test server is not reached through a Unix socket")
    sockets = sorted(Path(host[0]).glob(".s.PGSQL.*"))
    if not sockets:
        pytest.skip("no server socket to put the proxy in front of")
    proxy = CuttingProxy(str(sockets[0]))
    try:
        yield proxy, proxy.url(store_url)
    finally:
        proxy.close()


async def test_a_commit_whose_answer_is_lost_is_read_back_and_not_written_twice(home, pg_url):
    with cutting_proxy(pg_url) as (proxy, url):
        store = await _open(home, url)
        assert store.integrator is not None
        store.integrator.halt()  # its connection goes through the proxy too: only the writer's
        try:
            await _loop(store)
            before = len(_journal(pg_url))
            proxy.mode = "after"
            grant = await claim(store, BUILDER, ClaimRequest(loop_id="L1", idempotency_key="k1"))
            assert proxy.cuts == 1 and grant.granted
            after = _journal(pg_url)
            assert len(after) == before + 1  # committed once, reported as committed
            again = await claim(store, BUILDER, ClaimRequest(loop_id="L1", idempotency_key="k1"))
            assert again == grant and len(_journal(pg_url)) == before + 1
        finally:
            await store.close()


async def test_a_commit_cut_before_it_reached_the_server_fails_and_nothing_is_durable(home, pg_url):
    with cutting_proxy(pg_url) as (proxy, url):
        store = await _open(home, url)
        assert store.integrator is not None
        store.integrator.halt()  # its connection goes through the proxy too: only the writer's
        try:
            await _loop(store)
            before = _journal(pg_url)
            proxy.mode = "before"
            with pytest.raises(StoreError) as lost:
                await claim(store, BUILDER, ClaimRequest(loop_id="L1", idempotency_key="k1"))
            assert proxy.cuts == 1 and lost.value.code == "store_unavailable"
            assert _journal(pg_url) == before
            grant = await claim(store, BUILDER, ClaimRequest(loop_id="L1", idempotency_key="k1"))
            assert grant.granted and len(_journal(pg_url)) == len(before) + 1
        finally:
            await store.close()


# --- store copy ----------------------------------------------------------------------------------


def test_store_copy_sqlite_to_postgresql_to_sqlite_keeps_every_byte(tmp_path, pg_url):
    home = tmp_path / "home"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(BASIC_POLICY))
    env = cli_env()
    opened = cli(
        "loop", "open", "--policy", str(policy), "--objective", "copy me", "--todo", "a",
        "--todo", "b", "--id", "L1", "--home", str(home), "--json", env=env,
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    assert (
        cli("token", "create", "--agent", "builder", "--home", str(home), env=env).returncode == 0
    )
    assert cli("loop", "pause", "L1", "--home", str(home), env=env).returncode == 0
    bundle = tmp_path / "bundle.json"  # signs a checkpoint into the store
    assert cli("export", "L1", "-o", str(bundle), "--home", str(home), env=env).returncode == 0
    source = str(home / "loopwarden.db")
    back = tmp_path / "back" / "copy.db"  # sqlite:///{back}: four slashes, an absolute path
    back.parent.mkdir()
    for src, dst in ((source, pg_url), (pg_url, f"sqlite:///{back}")):
        done = cli("store", "copy", "--from", src, "--to", dst, "--home", str(home), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert report["faithful"] and report["receipts"] == 2, report
        assert report["rows"]["checkpoints"] == report["rows"]["tokens"] == 1, report
        audit = cli("verify", "--store", dst, "--home", str(home), "--json")
        assert audit.returncode == 0, audit.stdout + audit.stderr
    first, last = _journal(source), _journal(str(back))
    assert first == last == _journal(pg_url) and len(first) == 2
    with snapshot(source) as a, snapshot(str(back)) as b:
        assert a.log_state() == b.log_state()
        assert merkle.root_from_frontier(a.log_state()[1]) == merkle.root_from_frontier(
            b.log_state()[1]
        )
        assert a.tokens() == b.tokens() and a.meta("origin") == b.meta("origin")
    again = cli("store", "copy", "--from", source, "--to", pg_url, "--home", str(home))
    assert again.returncode == 1 and "not empty" in again.stderr
