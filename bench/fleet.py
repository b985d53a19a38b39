"""Family 12 — a fleet of hosts posting hook events: what one HTTP hook event costs the server.

A real `loopwarden serve --http` (a subprocess on a loopback port, fresh home) serves 16 loops,
each with an open turn for its own agent; 16 simulated hosts (one per loop, each with its own
observer token) post Claude Code `PreToolUse` + `PostToolUse` pairs for `Bash` to
`/hooks/claude-code` concurrently, every pair admitted by the policy (each event seals a
receipt: `tool.admitted`, then `tool.observed`). The hosts stop at their count or at the
family's time share. Measured: hook events/s over the whole fleet, each event's round trip
(p50/p99), and the server process's CPU per event (utime + stime from `/proc/PID/stat`, all its
threads, read before and after the measured window).

The hosts are a small HTTP/1.1 client on raw asyncio streams (keep-alive, one connection per
host, the request bytes built once), so the bench process spends as little of the machine's CPU
as it can on its side. A backend is a `Fleet` (the servers and the store they share): SQLite is
one server on its home's file; PostgreSQL is one or two replicas on one database (the second
replica holds only a copy of the first's keys, as tests/test_replicas.py starts them), measured
in the same run so that their ratio is judged on figures from one run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from bench import harness as h
from bench.report import Section, Table, Target
from bench.transport import _free_port, _wait_listening
from loopwarden.auth.tokens import issue_token
from loopwarden.hosts.hook import HookEvent, hook
from loopwarden.kernel.sql.location import Location, parse_location
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.principals import Principal
from loopwarden.turns.claim import ClaimRequest, claim

NAME = "fleet"
HOSTS = 16
RATE_TARGET = 2_000.0  # hook events/s, SQLite, one server, 16 hosts
CPU_TARGET = 0.6e-3  # seconds of server CPU per HTTP hook event
PG_RATIO_TARGET = 1.7  # two replicas ÷ one (issue 23's PostgreSQL target)
BYTES_TARGET = 2_000  # database bytes per tool call (its two receipts and all they touch)
STORED_CALLS = 400  # tool calls per id length in the storage measurement
REPLICAS = (1, 2, 4)  # PostgreSQL replicas measured, in this order
HELD_TARGET = 0.20  # the sequencer row held at most this share of the time (PostgreSQL's view)
DELAY_TARGET = 0.25  # seconds from a receipt's commit to its Merkle leaf, p99
DELAY_METRIC = "loopwarden_integration_delay_seconds"
TICK = os.sysconf("SC_CLK_TCK")
POLICY = {
    "agents": ["*"],
    "tools": {"allow": ["fs.*", "shell.run"], "commands": {"deny": ["git push*"]}},
    "budgets": {"max_turns": 1_000},
    "claims": {"lease_seconds": 7 * 86400, "max_active": 100, "max_active_per_agent": 10},
    "observe": {"mode": "enforce"},
}


@dataclass(frozen=True)
class Config:
    pairs: int  # PreToolUse + PostToolUse pairs per host, at most
    warmup: int  # pairs per host before the measured window (the host attaches on the first)


QUICK = Config(pairs=60, warmup=3)
FULL = Config(pairs=250, warmup=5)


def loop_of(n: int) -> str:
    return f"fleet-{n:02d}"


def agent_of(n: int) -> str:
    return f"host-agent-{n:02d}"


def session_of(n: int) -> str:
    return f"fleet-session-{n:02d}"


# --- the store: 16 loops, each with an open turn, and one observer token per host -----------


async def prepare(home: Path, location: Location | None) -> tuple[list[str], str]:
    """Open the loops and their turns; return the hosts' observer tokens (in host order) and
    an operator's token (for `GET /metrics`)."""
    tokens = []
    async with h.open_store(home, location=location) as store:
        for n in range(HOSTS):
            request = OpenLoopRequest(
                objective="bench fleet",
                policy=POLICY,
                loop_id=loop_of(n),
                todos=[TodoInput(id="t", title="work")],
            )
            await open_loop(store, h.OPERATOR, request)
            observer = Principal(id=agent_of(n), role="observer")
            attach = HookEvent(
                loop_id=loop_of(n), host="claude-code", phase="session", session_id=session_of(n)
            )
            await hook(store, observer, attach)
            granted = await claim(
                store, Principal(id=agent_of(n)), ClaimRequest(loop_id=loop_of(n))
            )
            if not granted.granted:
                raise RuntimeError(f"the bench turn was refused: {granted.reasons}")
            issued = await store.write(lambda tx, who=observer: issue_token(tx, who))
            tokens.append(issued.token)
        operator = await store.write(lambda tx: issue_token(tx, h.OPERATOR))
    return tokens, operator.token


# --- the servers ----------------------------------------------------------------------------


@dataclass
class Server:
    base: str
    port: int
    process: subprocess.Popen[bytes]

    def cpu(self) -> tuple[float, float]:
        """Seconds of CPU (user + system) the server process has used: all its threads, and its
        main thread alone (the event loop: HTTP, authentication, reading and answering each
        event; the rest is the store's writer thread and its reader's)."""
        pid = self.process.pid
        return _cpu(Path(f"/proc/{pid}/stat")), _cpu(Path(f"/proc/{pid}/task/{pid}/stat"))


def _cpu(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


@asynccontextmanager
async def served(home: Path, log: Path, store: list[str]) -> AsyncIterator[Server]:
    """`loopwarden serve --http` on a free loopback port with `home` (and `--store`)."""
    port = _free_port()
    args = h.python("-m", "loopwarden", "serve", "--http", f"127.0.0.1:{port}", "--home", str(home))
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*args, *store],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=h.child_env(),
            cwd=h.REPO,
        )
    try:
        _wait_listening(process, port, log)
        yield Server(f"http://127.0.0.1:{port}", port, process)
    finally:
        h.stop_process(process)


@dataclass
class Fleet:
    """The servers the hosts post to (host n posts to server n mod len), on one store."""

    label: str
    servers: list[Server]
    tokens: list[str]
    operator: str  # a token that reads each server's /metrics


@asynccontextmanager
async def sqlite_fleet(root: Path) -> AsyncIterator[Fleet]:
    home = root / "home"
    tokens, operator = await prepare(home, None)
    async with served(home, root / "serve.log", []) as server:
        yield Fleet("SQLite, one server", [server], tokens, operator)


@asynccontextmanager
async def postgres_fleet(root: Path, url: str, replicas: int) -> AsyncIterator[Fleet]:
    """`replicas` servers on the database at `url`; the first home holds the keys, every other
    one a copy of them and nothing else."""
    home = root / "home-0"
    tokens, operator = await prepare(home, parse_location(url))
    homes = [home]
    for n in range(1, replicas):
        other = root / f"home-{n}"
        other.mkdir(parents=True)
        shutil.copytree(home / "keys", other / "keys")
        homes.append(other)
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(served(hm, root / f"serve-{i}.log", ["--store", url]))
            for i, hm in enumerate(homes)
        ]
        label = f"PostgreSQL, {replicas} replica{'s' if replicas > 1 else ''}"
        yield Fleet(label, servers, tokens, operator)


# --- the hosts ------------------------------------------------------------------------------


def events(n: int, call: int) -> tuple[bytes, bytes]:
    """Host `n`'s `call`-th tool call: its PreToolUse and PostToolUse bodies."""
    common = {
        "session_id": session_of(n),
        "transcript_path": "",
        "cwd": ".",
        "tool_name": "Bash",
        "tool_input": {"command": f"pytest -q tests/test_{call}.py"},
        "tool_use_id": f"toolu_{n:02d}_{call:08d}",
    }
    pre = {**common, "hook_event_name": "PreToolUse"}
    post = {
        **common,
        "hook_event_name": "PostToolUse",
        "tool_response": {"stdout": "1 passed", "stderr": "", "interrupted": False},
    }
    return json.dumps(pre).encode(), json.dumps(post).encode()


class HookFailed(RuntimeError):
    pass


@dataclass
class Host:
    """One simulated host: one keep-alive connection, its requests' head built once."""

    n: int
    server: Server
    token: str
    samples: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.head = (
            f"POST /hooks/claude-code?loop={loop_of(self.n)} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{self.server.port}\r\n"
            f"Authorization: Bearer {self.token}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()

    async def post(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes
    ) -> float:
        t0 = time.perf_counter()
        writer.write(self.head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(
            int(v)
            for k, _, v in (x.partition(b":") for x in lines)
            if k.lower() == b"content-length"
        )
        answer = await reader.readexactly(length) if length else b""
        elapsed = time.perf_counter() - t0
        if not lines[0].startswith(b"HTTP/1.1 200") or answer.strip() not in (b"", b"{}"):
            raise HookFailed(
                f"host {self.n}: the event was not admitted: {head[:80]!r} {answer[:200]!r}"
            )
        return elapsed

    async def run(self, first: int, pairs: int, deadline: h.Deadline, keep: bool) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        try:
            for call in range(first, first + pairs):
                if deadline.expired:
                    break
                for body in events(self.n, call):
                    elapsed = await self.post(reader, writer, body)
                    if keep:
                        self.samples.append(elapsed)
        finally:
            writer.close()


@dataclass(frozen=True)
class Held:
    """What PostgreSQL's own view (`pg_stat_activity`, sampled) says of the sequencer row over
    the measured window. Writes no longer take it: an integrator holds it while it gives a
    batch of pending receipts their leaves (`kernel/store/integrator.py`). `held`: the share
    of samples in which an integrator held the row — its transaction has a transaction id
    (`backend_xid`), which locking the row gives it, and nothing else an integrator does
    before that; `busy`: the share in which an integrator was in any transaction or statement
    (the row held, or asked for and found taken, or the backlog counted: the measure of
    earlier runs, which counted all of these as held); `waited`: the share in which some
    writer waited for a row lock (another write's loop or pool row)."""

    samples: int
    held: float
    busy: float
    waited: float


class Sampler:
    """Polls `pg_stat_activity` for the store's writer and integrator sessions every `every`
    seconds on its own connection and thread, until stopped (bounded by `limit` samples)."""

    QUERY = (
        "SELECT application_name, backend_xid IS NOT NULL, wait_event_type, "
        "xact_start IS NOT NULL "
        "FROM pg_stat_activity "
        "WHERE application_name IN ('loopwarden writer', 'loopwarden integrator')"
    )

    def __init__(self, url: str, every: float = 0.002, limit: int = 50_000) -> None:
        self.url, self.every, self.limit = url, every, limit
        self.counts = [0, 0, 0, 0]  # samples, held, an integrator busy, a writer waited
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set() and self.counts[0] < self.limit:
                rows = conn.execute(self.QUERY).fetchall()
                busy = [r for r in rows if r[0] == "loopwarden integrator" and r[3]]
                writers = [r for r in rows if r[0] == "loopwarden writer"]
                self.counts[0] += 1
                self.counts[1] += any(r[1] for r in busy)
                self.counts[2] += bool(busy)
                self.counts[3] += any(r[2] == "Lock" for r in writers)
                self._stop.wait(self.every)

    def held(self) -> Held:
        n, held, busy, waited = self.counts
        return Held(n, held / max(n, 1), busy / max(n, 1), waited / max(n, 1))


@dataclass(frozen=True)
class Delays:
    """The integrators' commit-to-leaf delays over the measured window, from each replica's
    `loopwarden_integration_delay_seconds` histogram (its buckets' counts, summed)."""

    count: float
    buckets: dict[float, float]  # upper bound (seconds) -> receipts at or under it

    def within(self, bound: float) -> float:
        """The share of receipts given their leaf within `bound` seconds (a bucket's bound)."""
        return self.buckets.get(bound, 0.0) / self.count if self.count else 1.0

    def quantile_bound(self, q: float) -> float:
        """The smallest bucket bound under which at least `q` of the receipts fall."""
        for bound in sorted(self.buckets):
            if self.count and self.buckets[bound] >= q * self.count:
                return bound
        return float("inf")


def _histogram(server: Server, token: str) -> dict[float, float]:
    """One server's delay buckets (cumulative counts by upper bound), from `GET /metrics`."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(
        f"{server.base}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{DELAY_METRIC}_bucket":
                out[float(sample.labels["le"])] = sample.value
    return out


def _delays(before: list[dict[float, float]], after: list[dict[float, float]]) -> Delays:
    buckets: dict[float, float] = {}
    for b, a in zip(before, after, strict=True):
        for bound, value in a.items():
            buckets[bound] = buckets.get(bound, 0.0) + value - b.get(bound, 0.0)
    return Delays(buckets.get(float("inf"), 0.0), buckets)


def _machine_busy() -> float:
    """Busy CPU seconds of the whole machine so far, every core (`/proc/stat`)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / TICK


@dataclass(frozen=True)
class Measured:
    label: str
    events: int
    seconds: float
    cpu: float  # server CPU seconds, all servers together
    loop_cpu: float  # of which their main threads' (the event loop's)
    latency: h.Latency
    machine: float = 0.0  # busy CPU seconds of the whole machine (servers, database, hosts)
    held: Held | None = None
    delays: Delays | None = None

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    @property
    def cpu_per_event(self) -> float:
        return self.cpu / self.events

    @property
    def loop_cpu_per_event(self) -> float:
        return self.loop_cpu / self.events

    @property
    def machine_per_event(self) -> float:
        return self.machine / self.events


async def measure(fleet: Fleet, cfg: Config, seconds: float, url: str | None = None) -> Measured:
    hosts = [Host(n, fleet.servers[n % len(fleet.servers)], fleet.tokens[n]) for n in range(HOSTS)]
    warm = h.Deadline(max(seconds / 5, 2.0))
    await asyncio.gather(*(host.run(0, cfg.warmup, warm, keep=False) for host in hosts))
    deadline = h.Deadline(seconds)
    sampler = Sampler(url) if url is not None else None
    scrape = lambda: [_histogram(s, fleet.operator) for s in fleet.servers]  # noqa: E731
    histograms = await asyncio.to_thread(scrape) if url is not None else []
    with sampler or nullcontext():
        before, busy = [s.cpu() for s in fleet.servers], _machine_busy()
        t0 = time.perf_counter()
        runs = (host.run(cfg.warmup, cfg.pairs, deadline, keep=True) for host in hosts)
        await asyncio.gather(*runs)
        wall = time.perf_counter() - t0
        after, busy = [s.cpu() for s in fleet.servers], _machine_busy() - busy
    cpu = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    loop_cpu = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    samples = [x for host in hosts for x in host.samples]
    held = sampler.held() if sampler is not None else None
    await asyncio.sleep(0.5)  # the last receipts' integration (the receipts of the window)
    delays = _delays(histograms, await asyncio.to_thread(scrape)) if url is not None else None
    latency = h.Latency.of(samples)
    return Measured(fleet.label, len(samples), wall, cpu, loop_cpu, latency, busy, held, delays)


# --- the family -----------------------------------------------------------------------------


def _pg_url() -> tuple[object | None, str]:
    from bench.backends import _pg_server

    return _pg_server()


async def _postgres(cfg: Config, seconds: float) -> list[Measured]:
    """One, two and four replicas on PostgreSQL (a fresh database each), or [] without a
    server."""
    server, url = _pg_url()
    if server is None:
        h.progress(NAME, f"PostgreSQL skipped: {url}")
        return []
    results = []
    try:
        for replicas in REPLICAS:
            h.progress(NAME, f"PostgreSQL, {replicas} replica(s)")
            with h.temp_home(f"{NAME}-pg{replicas}") as home:
                fresh = server.fresh_url(f"fleet{replicas}")  # type: ignore[attr-defined]
                async with postgres_fleet(home.parent, fresh, replicas) as fleet:
                    results.append(await measure(fleet, cfg, seconds, fresh))
    finally:
        stop = getattr(server, "stop", None)
        if stop is not None:
            stop()
    return results


# --- what a tool call stores ------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    label: str
    calls: int
    per_call: float  # database bytes per tool call
    tables: dict[str, float]  # bytes per tool call, by table or index


def _pages(db: Path) -> tuple[int, dict[str, int]]:
    """The database's bytes after folding the WAL in, and per table or index (`dbstat`)."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
        rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
        return pages * size, dict(rows)
    finally:
        conn.close()


async def stored(home: Path, length: int, calls: int) -> Stored:
    """Database bytes per tool call: one loop whose ids (loop, agent, host session, tool use)
    are `length` characters, `calls` admitted PreToolUse + PostToolUse pairs sealed in process."""
    loop_id, agent = "l" * length, "a" * length
    session = "s" * length
    observer = Principal(id=agent, role="observer")
    async with h.open_store(home) as store:
        request = OpenLoopRequest(
            objective="bench storage",
            policy=POLICY,
            loop_id=loop_id,
            todos=[TodoInput(id="t", title="w")],
        )
        await open_loop(store, h.OPERATOR, request)
        await hook(
            store,
            observer,
            HookEvent(loop_id=loop_id, host="claude-code", phase="session", session_id=session),
        )
        await claim(store, Principal(id=agent), ClaimRequest(loop_id=loop_id))
    before, tables_before = _pages(home / h.DB_NAME)
    async with h.open_store(home) as store:
        for call in range(calls):
            digest = "sha256:" + hashlib.sha256(b"%d" % call).hexdigest()
            use = f"{call:0{length}d}"[-length:]
            common = dict(
                loop_id=loop_id,
                host="claude-code",
                session_id=session,
                tool_use_id=use,
                host_tool="Bash",
                input_digest=digest,
                command=f"pytest -q tests/test_{call}.py",
            )
            await hook(store, observer, HookEvent(phase="pre", **common))
            await hook(store, observer, HookEvent(phase="post", response_digest=digest, **common))
    after, tables = _pages(home / h.DB_NAME)
    grown = {name: (size - tables_before.get(name, 0)) / calls for name, size in tables.items()}
    label = f"ids of {length} characters (loop, agent, host session, tool use)"
    return Stored(label, calls, (after - before) / calls, grown)


def _storage_table(results: list[Stored]) -> Table:
    names = sorted(
        {n for r in results for n, v in r.tables.items() if v >= 1},
        key=lambda n: -results[0].tables.get(n, 0),
    )
    return Table(
        ["ids", "tool calls", "bytes per tool call", *(f"`{n}`" for n in names)],
        [
            [
                r.label,
                str(r.calls),
                f"{r.per_call:,.0f}",
                *(f"{r.tables.get(n, 0):,.0f}" for n in names),
            ]
            for r in results
        ],
        title="Database bytes per tool call (SQLite, after a WAL checkpoint; two receipts each)",
    )


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    started = time.monotonic()
    with_pg = os.environ.get("BENCH_FLEET_PG", "1") != "0"
    share = budget / (1 + len(REPLICAS) if with_pg else 1) - 6.0  # set-up: loops, server start
    section = Section(
        family=NAME,
        number=12,
        title="A fleet of hosts (HTTP hook events)",
        how=(
            f"a real `loopwarden serve --http` on loopback, fresh home, {HOSTS} loops each with "
            f"an open turn; {HOSTS} concurrent simulated hosts (one keep-alive connection and one "
            "observer token each) post Claude Code PreToolUse + PostToolUse pairs for `Bash` to "
            '`/hooks/claude-code`, all admitted (`[observe] mode = "enforce"`; each event seals '
            f"a receipt), up to {cfg.pairs} pairs per host after {cfg.warmup} warm-up pairs, "
            "within the family's time share. Server CPU: utime + stime of the server "
            "process(es) from `/proc/PID/stat` across the measured window, divided by the "
            "events; machine CPU: every core's busy time from `/proc/stat` (servers, database, "
            "the simulated hosts) per event. PostgreSQL: 1, 2 and 4 replicas on one database, "
            "its `pg_stat_activity` sampled every 2 ms for the writers' and integrators' sessions "
            "(an integrator whose transaction has a transaction id holds the sequencer row: "
            "locking it gives one, and an integrator does nothing else that does before it; "
            "writes take only their loop's row), and each replica's "
            "`loopwarden_integration_delay_seconds` histogram read from `GET /metrics` before "
            "and after the window (commit to Merkle leaf). SQLite synchronous=full (the default)."
        ),
    )
    results: list[Measured] = []
    h.progress(NAME, "SQLite, one server")
    with h.temp_home(NAME) as home:
        async with sqlite_fleet(home.parent) as fleet:
            results.append(await measure(fleet, cfg, max(share, 3.0)))
    h.progress(NAME, "database bytes per tool call")
    kept: list[Stored] = []
    for length in (8, 64):
        with h.temp_home(NAME) as home:
            kept.append(await stored(home, length, STORED_CALLS // (4 if quick else 1)))
    if with_pg:
        left = budget - (time.monotonic() - started)
        results += await _postgres(cfg, max(left / len(REPLICAS) - 8.0, 3.0))
    section.tables.append(_fleet_table(results))
    section.tables.append(_storage_table(kept))
    if len(results) > 1:
        section.notes.append(_model(results))
    section.targets += _targets(results)
    largest = max(kept, key=lambda k: k.per_call)
    section.targets.append(
        Target(
            f"≤ {BYTES_TARGET:,} bytes of database per tool call, whatever the ids' lengths",
            f"{largest.per_call:,.0f} bytes (ids of 64 characters); "
            f"{kept[0].per_call:,.0f} with ids of 8",
            largest.per_call <= BYTES_TARGET,
        )
    )
    section.notes.append(
        f"load average at the end of the family: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    return section


def _share(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def _fleet_table(results: list[Measured]) -> Table:
    columns = ["servers", "events", "events/s", "p50 ms", "p99 ms", "server CPU ms per event"]
    columns += ["of which the event loop's", "machine CPU ms per event"]
    columns += ["sequencer row held (integrator)", "an integrator in a transaction"]
    columns += ["a writer waiting for a row lock", "commit → leaf p50 / p99 ≤ (s)"]
    rows = []
    for m in results:
        row = [m.label, str(m.events), h.rate(m.rate), h.ms(m.latency.p50), h.ms(m.latency.p99)]
        row += [f"{m.cpu_per_event * 1e3:.3f}", f"{m.loop_cpu_per_event * 1e3:.3f}"]
        row.append(f"{m.machine_per_event * 1e3:.3f}")
        held = m.held
        row += [_share(held and held.held), _share(held and held.busy)]
        row.append(_share(held and held.waited))
        delays = m.delays
        row.append(
            f"{delays.quantile_bound(0.5):g} / {delays.quantile_bound(0.99):g}"
            if delays is not None and delays.count
            else ""
        )
        rows.append(row)
    return Table(columns, rows)


def _model(results: list[Measured]) -> str:
    """What limits each PostgreSQL run: how busy its shared resources were over the window (the
    machine's cores, the sequencer row), and the rate each would allow if it alone were the
    limit (the measured rate ÷ that resource's busy share: the figures come from the same run,
    so they say which resource is saturated, not a forecast)."""
    cores = os.cpu_count() or 1
    parts = []
    for m in results[1:]:
        if m.held is None:
            continue
        hold = m.held.held / m.rate  # seconds the row is held per event
        busy = m.machine_per_event * m.rate / cores  # share of all cores' time
        parts.append(
            f"{m.label}: {h.rate(m.rate)} events/s; the row held {m.held.held:.0%} of the time "
            f"({hold * 1e3:.3f} ms per event, so at most {h.rate(m.rate / max(m.held.held, 1e-9))}"
            f" events/s), the {cores} cores {busy:.0%} busy ({m.machine_per_event * 1e3:.2f} ms "
            f"per event, so at most {h.rate(m.rate / max(busy, 1e-9))})"
        )
    return (
        "what limits the rate: hook events/s ≤ min(cores ÷ machine CPU per event, 1 ÷ the "
        "sequencer row's hold per event), and the resource that is busy all the time is the one "
        "that sets it. Writes lock only their own loop's row (each host here posts to its own "
        "loop, so they never wait for each other); the sequencer row is held by an integrator, "
        "once per batch of pending receipts, so its hold per event shrinks as batches fill. "
        + "; ".join(parts)
    )


def _targets(results: list[Measured]) -> list[Target]:
    lite = results[0]
    targets = [
        Target(
            f"SQLite, one server, {HOSTS} hosts: ≥ {RATE_TARGET:,.0f} hook events/s",
            f"{h.rate(lite.rate)} events/s",
            lite.rate >= RATE_TARGET,
        ),
        Target(
            f"server CPU per HTTP hook event ≤ {CPU_TARGET * 1e3:.1f} ms (SQLite)",
            f"{lite.cpu_per_event * 1e3:.3f} ms",
            lite.cpu_per_event <= CPU_TARGET,
        ),
    ]
    if len(results) > 2:
        one, two = results[1], results[2]
        ratio = two.rate / one.rate
        targets.append(
            Target(
                f"PostgreSQL, {HOSTS} hosts: two replicas ≥ {PG_RATIO_TARGET}× one replica",
                f"{h.ratio(ratio)} ({h.rate(two.rate)} vs {h.rate(one.rate)} events/s)",
                ratio >= PG_RATIO_TARGET,
                "the machine's two cores bound both (see the note on what limits the rate)"
                if ratio < PG_RATIO_TARGET
                else "",
            )
        )
        targets.append(
            Target(
                "PostgreSQL, two replicas: ≥ 1,000 hook events/s",
                f"{h.rate(two.rate)} events/s",
                two.rate >= 1_000,
            )
        )
        if two.held is not None:
            targets.append(
                Target(
                    f"PostgreSQL, two replicas: the sequencer row held ≤ {HELD_TARGET:.0%} of "
                    "the time (PostgreSQL's view)",
                    f"{two.held.held:.0%} of {two.held.samples:,} samples (an integrator in a "
                    f"transaction, the row held or not, {two.held.busy:.0%})",
                    two.held.held <= HELD_TARGET,
                )
            )
    for m in results[1:]:
        if m.delays is None or not m.delays.count:
            continue
        within = m.delays.within(DELAY_TARGET)
        targets.append(
            Target(
                f"{m.label}: commit to Merkle leaf p99 ≤ {DELAY_TARGET * 1e3:.0f} ms",
                f"{within:.2%} of {m.delays.count:,.0f} receipts within "
                f"{DELAY_TARGET * 1e3:.0f} ms (p99 ≤ {m.delays.quantile_bound(0.99):g} s)",
                within >= 0.99,
            )
        )
    return targets
