"""Family 2 — kernel throughput without MCP: sealed governed turns (claim + update, two
receipts) per second through the governance operations, with WAL durability: one writer
(synchronous=full and normal), 8 concurrent writers on one store in one process, and 4 processes
each with its own store on the same database file. Next to them, in the same run, the disk's
own limit (a minimal receipt transaction's commits per second: one writer, two commits a turn,
cannot pass half of it) and the SQL statements one claim and one update issue.

`python -m bench.kernel --writer …` is the child of the 4-process measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import harness as h
from bench.report import Section, Table, Target
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.sql.sqlite import SqliteBackend
from loopwarden.kernel.store.store import Synchronous, migrate
from loopwarden.kinds import KINDS
from loopwarden.principals import Principal

NAME = "kernel"
TARGET = 1_000  # sealed turns per second, one writer, synchronous=full (issue 15)
CEILING_SHARE = 0.45  # of the two-fsync ceiling, same writer (issue 15)
GROUP_TARGET = 2_000  # sealed turns per second, 8 writers (group commit), synchronous=full
CEILING_SECONDS = 1.5  # per synchronous mode
ENVELOPE = bytes(1400)  # a receipt envelope's size
WRITERS = 8
PROCESSES = 4
CHILD_TIMEOUT = 120.0
FULL_LABEL = "1 writer, synchronous=full (the default)"
NORMAL_LABEL = "1 writer, synchronous=normal"


@dataclass(frozen=True)
class Config:
    single_full: int  # turns
    single_normal: int
    concurrent: int  # turns over all 8 writers
    per_process: int  # turns per process
    warmup: int


QUICK = Config(single_full=120, single_normal=250, concurrent=240, per_process=60, warmup=10)
FULL = Config(single_full=1000, single_normal=2000, concurrent=1600, per_process=300, warmup=30)
SHARES = (0.28, 0.22, 0.2, 0.22)  # of the family's budget: full, normal, 8 writers, 4 processes


@dataclass
class Run:
    label: str
    turns: int
    wall: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.turns / self.wall


async def _writer(store, who: Principal, turns: int, deadline: h.Deadline) -> list[float]:
    out = []
    for _ in range(turns):
        if deadline.expired:
            break
        t0 = time.perf_counter()
        await h.governed_turn(store, who, h.LOOP_ID)
        out.append(time.perf_counter() - t0)
    return out


async def single(
    label: str, synchronous: Synchronous, turns: int, cfg: Config, seconds: float
) -> Run:
    with h.temp_home("kernel") as home:
        async with h.open_store(home, synchronous=synchronous) as store:
            await h.open_bench_loop(store, todos=10)
            await _writer(store, h.AGENT, cfg.warmup, h.Deadline(seconds))
            t0 = time.perf_counter()
            latencies = await _writer(store, h.AGENT, turns, h.Deadline(seconds))
            wall = time.perf_counter() - t0
    return Run(label, len(latencies), wall, latencies)


async def concurrent(cfg: Config, seconds: float) -> Run:
    agents = [Principal(id=f"writer-{n}") for n in range(WRITERS)]
    with h.temp_home("kernel8") as home:
        async with h.open_store(home) as store:
            await h.open_bench_loop(store, todos=2 * WRITERS)
            await _writer(store, h.AGENT, cfg.warmup, h.Deadline(seconds))
            deadline = h.Deadline(seconds)
            t0 = time.perf_counter()
            per_agent = await asyncio.gather(
                *(_writer(store, a, cfg.concurrent // WRITERS, deadline) for a in agents)
            )
            wall = time.perf_counter() - t0
    latencies = [x for xs in per_agent for x in xs]
    label = f"{WRITERS} writers, one process, one store, synchronous=full"
    return Run(label, len(latencies), wall, latencies)


def processes(cfg: Config, seconds: float) -> Run:
    """4 child processes, each its own store on one file; all start on one signal."""
    with h.temp_home("kernel4p") as home:
        asyncio.run(_prepare(home))
        children = [
            subprocess.Popen(
                h.python(
                    *("-m", "bench.kernel", "--writer", "--home", str(home)),
                    *("--agent", f"proc-{n}", "--turns", str(cfg.per_process)),
                    *("--warmup", str(cfg.warmup), "--seconds", f"{seconds:.1f}"),
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=h.child_env(),
                cwd=h.REPO,
            )
            for n in range(PROCESSES)
        ]
        try:
            for child in children:  # each has opened its store and warmed up
                assert child.stdin and child.stdout and child.stderr
                if child.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"writer process failed: {child.stderr.read()[-2000:]}")
            for child in children:
                assert child.stdin
                child.stdin.write("go\n")
                child.stdin.flush()
            reports = []
            for child in children:
                out, err = child.communicate(timeout=CHILD_TIMEOUT)
                if child.returncode != 0:
                    raise RuntimeError(f"writer process exited {child.returncode}: {err[-2000:]}")
                reports.append(json.loads(out))
        finally:
            for child in children:
                h.stop_process(child)
    latencies = [x for r in reports for x in r["latencies"]]
    wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    label = f"{PROCESSES} processes, one store each, one file, synchronous=full"
    return Run(label, len(latencies), wall, latencies)


async def _prepare(home: Path) -> None:
    async with h.open_store(home) as store:
        await h.open_bench_loop(store, todos=2 * PROCESSES)


async def _child(args: argparse.Namespace) -> None:
    who = Principal(id=args.agent)
    async with h.open_store(Path(args.home)) as store:
        await _writer(store, who, args.warmup, h.Deadline(args.seconds))
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on the machine
        latencies = await _writer(store, who, args.turns, h.Deadline(args.seconds))
        end = time.monotonic()
    print(json.dumps({"start": start, "end": end, "latencies": latencies}), flush=True)


def ceiling(synchronous: Synchronous, seconds: float) -> float:
    """Commits per second of a minimal receipt transaction on a fresh store's schema and
    pragmas: BEGIN IMMEDIATE, a journal row (1.4 kB, its indexes), one Merkle node, the log
    state, COMMIT. No checks, no projection: what the disk allows one writer."""
    with h.temp_home("ceiling") as home:
        home.mkdir(parents=True)
        backend = SqliteBackend(home / "ceiling.db", synchronous)
        conn = backend.writer
        try:
            migrate(backend, Integrity(bytes(32)), KINDS)
            commits, deadline = 0, h.Deadline(seconds)
            t0 = time.perf_counter()
            while not deadline.expired:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "INSERT INTO journal (leaf_index, loop_id, seq, kind, receipt_id, digest, at, "
                    "turn_id, envelope) VALUES (?, 'bench', ?, 'turn.claimed', ?, ?, ?, ?, ?)",
                    (commits, commits + 1, f"rcpt-{secrets.token_hex(12)}", "sha256:x",
                     "2026-01-01T00:00:00.000000Z", f"turn-{secrets.token_hex(10)}", ENVELOPE),
                )  # fmt: skip
                conn.execute(
                    "INSERT INTO merkle_nodes (level, idx, hash) VALUES (0, ?, ?)",
                    (commits, secrets.token_bytes(32)),
                )
                conn.execute("UPDATE log_state SET size = ? WHERE id = 1", (commits + 1,))
                conn.execute("COMMIT")
                commits += 1
            return commits / (time.perf_counter() - t0)
        finally:
            conn.close()


async def statements(turns: int = 20) -> dict[str, collections.Counter[str]]:
    """SQL statements per claim and per update, by their first word (the store's writer
    connection traced; None if this store has no such connection)."""
    counts: dict[str, collections.Counter[str]] = {
        "claim": collections.Counter(),
        "update": collections.Counter(),
    }
    with h.temp_home("statements") as home:
        async with h.open_store(home) as store:
            await h.open_bench_loop(store, todos=10)
            for _ in range(5):
                await h.governed_turn(store, h.AGENT, h.LOOP_ID)
            conn = getattr(store, "_conn", None)
            if conn is None:
                return {}
            current = counts["claim"]
            conn.set_trace_callback(lambda sql: current.update([sql.split(None, 1)[0].upper()]))
            try:
                for _ in range(turns):
                    current = counts["claim"]
                    grant = await h.claim(store, h.AGENT, h.LOOP_ID)
                    current = counts["update"]
                    await h.report(store, h.AGENT, grant, h.idempotency_key())
            finally:
                conn.set_trace_callback(None)
    return {
        op: collections.Counter({k: v / turns for k, v in c.items()}) for op, c in counts.items()
    }


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    section = Section(
        family=NAME,
        number=2,
        title="Kernel throughput (no MCP)",
        how=(
            "`claim` then `update` (outcome progress: two sealed receipts per turn) called "
            "directly on a fresh store (SQLite WAL, checkpoint every 256 receipts), sequential "
            f"per writer after {cfg.warmup} warm-up turns; turns/s is turns over wall time, "
            "latency is per whole turn."
        ),
        notes=[
            f"{WRITERS} writers: asyncio tasks sharing one `Store`, each a different agent. "
            f"{PROCESSES} processes: Python processes, each with its own `Store` on the same "
            "file, released on one signal; wall time from the first start to the last finish.",
            "every configuration stops at its turn count or its share of the time budget.",
        ],
    )
    full_s, normal_s, concurrent_s, processes_s = (budget * s for s in SHARES)
    h.progress(NAME, "the disk's limit: minimal receipt transactions")
    limit = {mode: ceiling(mode, CEILING_SECONDS) for mode in ("full", "normal")}
    runs = []
    h.progress(NAME, "single writer, synchronous=full")
    runs.append(await single(FULL_LABEL, "full", cfg.single_full, cfg, full_s))
    h.progress(NAME, "single writer, synchronous=normal")
    runs.append(await single(NORMAL_LABEL, "normal", cfg.single_normal, cfg, normal_s))
    h.progress(NAME, f"{WRITERS} concurrent writers")
    runs.append(await concurrent(cfg, concurrent_s))
    h.progress(NAME, f"{PROCESSES} processes")
    runs.append(await asyncio.to_thread(processes, cfg, processes_s))
    h.progress(NAME, "statements per claim and update")
    counted = await statements()
    full, normal, group = runs[0], runs[1], runs[2]
    two_fsync = {FULL_LABEL: limit["full"] / 2, NORMAL_LABEL: limit["normal"] / 2}
    rows = []
    for r in runs:
        lat = h.Latency.of(r.latencies)
        share = f"{r.rate / two_fsync[r.label]:.0%}" if r.label in two_fsync else "—"
        rows.append(
            [
                r.label,
                str(r.turns),
                h.rate(r.rate),
                h.rate(2 * r.rate),
                h.ms(lat.p50),
                h.ms(lat.p99),
                share,
            ]
        )
    section.tables.append(
        Table(
            [
                "configuration",
                "turns",
                "turns/s",
                "receipts/s",
                "p50 ms",
                "p99 ms",
                "of the two-commit ceiling",
            ],
            rows,
        )
    )
    section.tables.append(
        Table(
            ["synchronous", "minimal commits/s", "two-commit ceiling, turns/s", "µs per commit"],
            [[mode, h.rate(c), h.rate(c / 2), h.us(1 / c)] for mode, c in limit.items()],
            title="The disk's limit, same run: a minimal receipt transaction (journal row, "
            "Merkle node, log state)",
        )
    )
    if counted:
        order = ["SELECT", "INSERT", "UPDATE", "BEGIN", "COMMIT"]
        seen = {k for c in counted.values() for k in c}
        kinds = [k for k in order if k in seen] + sorted(seen - set(order))
        section.tables.append(
            Table(
                ["operation", *kinds],
                [[op, *(f"{c.get(k, 0):g}" for k in kinds)] for op, c in counted.items()],
                title="SQL statements per call (the store's connection traced, 20 turns)",
            )
        )
    share = full.rate / two_fsync[FULL_LABEL]
    per_turn = 1 / full.rate
    floor = 2 / limit["full"]
    section.targets += [
        Target(
            f"kernel ≥ {TARGET:,} sealed turns/s (one writer, synchronous=full)",
            f"{h.rate(full.rate)} turns/s",
            full.rate >= TARGET,
            ""
            if full.rate >= TARGET
            else f"{h.ms(per_turn)} ms a turn, of which the two commits alone take "
            f"{h.ms(floor)} ms on this disk; the rest is the operations' own work, and "
            "the hops to the store's thread and back",
        ),
        Target(
            f"kernel one writer ≥ {CEILING_SHARE:.0%} of the two-commit ceiling (synchronous=full)",
            f"{share:.0%} ({h.rate(full.rate)} of {h.rate(two_fsync[FULL_LABEL])} turns/s)",
            share >= CEILING_SHARE,
        ),
        Target(
            f"kernel ≥ {GROUP_TARGET:,} sealed turns/s ({WRITERS} writers, group commit, "
            "synchronous=full)",
            f"{h.rate(group.rate)} turns/s",
            group.rate >= GROUP_TARGET,
            ""
            if group.rate >= GROUP_TARGET
            else f"{h.ms(1 / group.rate)} ms of the process's time a turn: group commit "
            "shares the commits, so the operations' own work (one core) is the bound",
        ),
    ]
    section.notes.append(
        f"synchronous=normal, one writer: {h.rate(normal.rate)} turns/s, "
        f"{normal.rate / two_fsync[NORMAL_LABEL]:.0%} of its two-commit ceiling."
    )
    section.notes.append(
        "all writers of one database file share SQLite's single write lock; across processes a "
        "waiting writer sleeps in SQLite's busy handler, which is what the p99 there shows."
    )
    return section


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.kernel")
    parser.add_argument("--writer", action="store_true", required=True)
    parser.add_argument("--home", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30)
    asyncio.run(_child(parser.parse_args()))


if __name__ == "__main__":
    main()
