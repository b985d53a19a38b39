"""Family 4 — scale: how claim, update, projection (and quota, receipt) latency grow with the
receipts in a loop and with the todos in a loop; Merkle append and inclusion-proof latency up to
10⁶ leaves; database bytes per receipt. Each curve is reported with its growth: the cost at the
largest size over the cost at the smallest, measured in the same run."""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import harness as h
from bench.report import Section, Table, Target
from loopwarden.journal import receipt as receipt_op
from loopwarden.kernel.log import merkle
from loopwarden.kernel.store.homes import DB_NAME
from loopwarden.kernel.store.store import Store, Txn
from loopwarden.projection import projection as projection_op
from loopwarden.turns import quota as quota_op

NAME = "scale"
TARGET = 1.5  # cost at the largest size over the cost at 10²
GROWN_TODOS = 100  # todos in the loop whose receipts grow
GROWN_LOOP = "grown"
OPS_JUDGED = ("claim", "update", "projection")  # the operations the target names


@dataclass(frozen=True)
class Config:
    receipts: tuple[int, ...]
    todos: tuple[int, ...]
    leaves: tuple[int, ...]
    samples: int  # measured calls per operation and point
    proofs: int  # Merkle proofs timed per point
    shares: tuple[float, float, float] = (0.85, 0.09, 0.06)  # receipts, todos, Merkle


QUICK = Config(
    receipts=(100, 1_000), todos=(100, 1_000, 10_000), leaves=(1_000, 100_000), samples=15,
    proofs=200,
)  # fmt: skip
FULL = Config(
    receipts=(100, 1_000, 10_000, 100_000),
    todos=(100, 10_000, 100_000),
    leaves=(1_000, 10_000, 100_000, 1_000_000),
    samples=30,
    proofs=1_000,
)


@dataclass
class Point:
    size: int  # receipts or todos in the loop when measured
    lat: dict[str, h.Latency] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)


async def _timed(n: int, fn: Callable[[], Awaitable[object]]) -> h.Latency:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return h.Latency.of(samples)


async def measure_ops(store: Store, loop_id: str, n: int, *, receipts: int = 0) -> Point:
    """`n` governed turns (claim and update timed apart), projections and quotas; with
    `receipts`, also `receipt` lookups (with inclusion proof) of random earlier receipts."""
    claims, updates = [], []
    for _ in range(n):
        c, u = await h.governed_turn(store, h.AGENT, loop_id)
        claims.append(c)
        updates.append(u)
    point = Point(size=0)
    point.lat["claim"] = h.Latency.of(claims)
    point.lat["update"] = h.Latency.of(updates)
    point.lat["projection"] = await _timed(
        n,
        lambda: projection_op.projection(
            store, h.AGENT, projection_op.ProjectionRequest(loop_id=loop_id)
        ),
    )
    point.lat["quota"] = await _timed(
        n, lambda: quota_op.quota(store, h.AGENT, quota_op.QuotaRequest(loop_id=loop_id))
    )
    if receipts:
        await store.write(Txn.checkpoint)  # so no lookup below has to sign one
        rng = random.Random(receipts)
        point.lat["receipt"] = await _timed(
            n,
            lambda: receipt_op.receipt(
                store,
                h.AGENT,
                receipt_op.ReceiptRequest(loop_id=loop_id, seq=rng.randint(1, receipts)),
            ),
        )
    return point


def bytes_per_receipt(home: Path) -> tuple[int, int, dict[str, int]]:
    """(database bytes, receipts, bytes per table or index) after folding the WAL into the main
    file; the split is empty if this SQLite has no `dbstat` table."""
    conn = sqlite3.connect(home / DB_NAME, timeout=30)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        receipts = conn.execute("SELECT count(*) FROM journal").fetchone()[0]
        try:
            split = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
        except sqlite3.Error:
            split = {}
    finally:
        conn.close()
    return (home / DB_NAME).stat().st_size, receipts, split


def stored_proofs(home: Path, size: int, n: int) -> h.Latency:
    """Inclusion proofs read from the store's Merkle nodes (a read-only snapshot)."""
    rng = random.Random(size)
    samples = []
    with h.snapshot(home) as reader:
        tree = reader.log_state()[0]
        for _ in range(n):
            index = rng.randrange(tree)
            t0 = time.perf_counter()
            merkle.inclusion_proof(index, tree, reader.node)
            samples.append(time.perf_counter() - t0)
    return h.Latency.of(samples)


async def receipts_curve(
    cfg: Config, deadline: h.Deadline
) -> tuple[list[Point], str, tuple[int, dict[str, int]]]:
    """One loop grown through the kernel (synchronous=normal for setup speed), measured at each
    size on the way up. Returns the points reached, a note if the budget ran out, and where the
    database's bytes are at the last point (receipts, bytes by table or index)."""
    points: list[Point] = []
    note = ""
    split: tuple[int, dict[str, int]] = (0, {})
    with h.temp_home("scale-receipts") as home:
        async with h.open_store(home, synchronous="normal") as store:
            await h.open_bench_loop(store, GROWN_TODOS, loop_id=GROWN_LOOP)
            receipts = 1
            for target in cfg.receipts:
                h.progress(NAME, f"growing the loop to {target:,} receipts")
                while receipts < target and not deadline.expired:
                    await h.governed_turn(store, h.AGENT, GROWN_LOOP)
                    receipts += 2
                if receipts < target:
                    note = (
                        f"the time budget ran out while growing the loop to {target:,} receipts "
                        f"(reached {receipts:,}); larger sizes were not measured"
                    )
                    break
                point = await measure_ops(store, GROWN_LOOP, cfg.samples, receipts=receipts)
                point.size = target
                point.extra["receipts"] = f"{receipts:,}"
                receipts += 2 * cfg.samples
                point.lat["stored proof"] = stored_proofs(home, receipts, cfg.proofs // 4)
                size, count, by_object = bytes_per_receipt(home)
                point.extra["bytes/receipt"] = f"{size / count:,.0f}"
                point.extra["database"] = h.mib(size)
                points.append(point)
                split = (count, by_object)
    return points, note, split


async def todos_curve(cfg: Config, deadline: h.Deadline) -> tuple[list[Point], str]:
    """A loop per size, all in one store (synchronous=normal), measured right after opening."""
    points: list[Point] = []
    note = ""
    with h.temp_home("scale-todos") as home:
        async with h.open_store(home, synchronous="normal") as store:
            for todos in cfg.todos:
                if deadline.expired:
                    note = f"the time budget ran out before the loop of {todos:,} todos"
                    break
                h.progress(NAME, f"a loop of {todos:,} todos")
                t0 = time.perf_counter()
                loop_id = await h.open_bench_loop(store, todos, loop_id=f"todos-{todos}")
                opened = time.perf_counter() - t0
                point = await measure_ops(store, loop_id, cfg.samples)
                point.size = todos
                point.extra["open_loop"] = f"{h.ms(opened)} ms"
                points.append(point)
    return points, note


def merkle_curve(cfg: Config, deadline: h.Deadline) -> tuple[list[Point], str, float]:
    """An RFC 6962 tree in a dict of nodes, built leaf by leaf with `append_leaf`; at each size,
    the next appends and random inclusion proofs are timed one by one."""
    nodes: dict[tuple[int, int], bytes] = {}
    frontier: list[bytes] = []
    points: list[Point] = []
    note = ""
    rng = random.Random(6962)
    size = 0
    build_time = 0.0

    def source(level: int, index: int) -> bytes:
        return nodes[(level, index)]

    def append() -> None:
        nonlocal frontier, size
        frontier, new = merkle.append_leaf(
            frontier, size, merkle.leaf_hash(size.to_bytes(8, "big"))
        )
        for level, index, digest in new:
            nodes[(level, index)] = digest
        size += 1

    for target in cfg.leaves:
        h.progress(NAME, f"Merkle tree to {target:,} leaves")
        t0 = time.perf_counter()
        while size < target and not deadline.expired:
            for _ in range(min(10_000, target - size)):
                append()
        build_time += time.perf_counter() - t0
        if size < target:
            note = f"the time budget ran out building the tree to {target:,} leaves"
            break
        point = Point(size=size)
        proofs = []
        root = merkle.root_from_frontier(frontier)
        for _ in range(cfg.proofs):
            index = rng.randrange(size)
            t0 = time.perf_counter()
            proof = merkle.inclusion_proof(index, size, source)
            proofs.append(time.perf_counter() - t0)
        leaf = merkle.leaf_hash(index.to_bytes(8, "big"))
        if not merkle.verify_inclusion(leaf, index, size, proof, root):
            raise RuntimeError("an inclusion proof from the bench tree does not verify")
        appends = []
        for _ in range(cfg.proofs):
            t0 = time.perf_counter()
            append()
            appends.append(time.perf_counter() - t0)
        point.lat["append"] = h.Latency.of(appends)
        point.lat["proof"] = h.Latency.of(proofs)
        points.append(point)
    return points, note, size / build_time if build_time else 0.0


def _growth(points: list[Point], op: str) -> float:
    return points[-1].lat[op].p50 / points[0].lat[op].p50


def _curve_table(points: list[Point], ops: list[str], what: str, extras: list[str]) -> Table:
    columns = [what] + [f"{op} p50 / p99 ms" for op in ops] + extras
    rows = [
        [h.power(p.size)]
        + [f"{h.ms(p.lat[op].p50)} / {h.ms(p.lat[op].p99)}" for op in ops]
        + [p.extra.get(e, "") for e in extras]
        for p in points
    ]
    if len(points) > 1:
        rows.append(
            [f"growth {h.power(points[-1].size)} ÷ {h.power(points[0].size)}"]
            + [h.ratio(_growth(points, op)) for op in ops]
            + ["" for _ in extras]
        )
    return Table(columns, rows)


def _targets(points: list[Point], dimension: str, planned: int) -> list[Target]:
    out = []
    if len(points) < 2:
        return [
            Target(f"{op} growth over {dimension}", "—", None, "fewer than two sizes measured")
            for op in OPS_JUDGED
        ]
    big, small = points[-1], points[0]
    label = f"{h.power(big.size)} vs {h.power(small.size)} {dimension}"
    if big.size < planned:
        label += f" (the target's size is {h.power(planned)})"
    for op in OPS_JUDGED:
        g = _growth(points, op)
        why = ""
        if g > TARGET:
            why = (
                f"p50 {h.ms(small.lat[op].p50)} → {h.ms(big.lat[op].p50)} ms; see the "
                f"{dimension} table for the curve"
            )
        out.append(Target(f"{op} cost, {label} ≤ {TARGET}×", h.ratio(g), g <= TARGET, why))
    return out


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    section = Section(
        family=NAME,
        number=4,
        title="Scale",
        how=(
            "the governance operations called directly (no MCP), SQLite WAL with "
            "synchronous=normal so that fsyncs do not hide growth; at each size "
            f"{cfg.samples} governed turns (claim and update timed apart), projections, quotas "
            "and, for receipts, `receipt` lookups with inclusion proof; growth = p50 at the "
            "largest size ÷ p50 at the smallest."
        ),
        notes=[
            f"receipts: one loop of {GROWN_TODOS} todos grown with governed turns (outcome "
            "progress), measured on the way up; 'stored proof' is `merkle.inclusion_proof` over "
            "the store's Merkle nodes (SQLite reads); bytes per receipt is the database file "
            "after `PRAGMA wal_checkpoint(TRUNCATE)` over the receipts in the journal "
            "(projection, Merkle nodes and idempotency rows included).",
            "todos: one loop per size, opened with that many todos (its `loop.opened` receipt "
            "carries them all), measured right after.",
            "Merkle: an RFC 6962 tree in a Python dict built with `merkle.append_leaf`; at each "
            "size the next appends and random `inclusion_proof`s are timed one by one.",
        ],
    )
    shares = [budget * s for s in cfg.shares]
    started = time.monotonic()
    receipts, note_r, (counted, by_object) = await receipts_curve(cfg, h.Deadline(shares[0]))
    left = budget - (time.monotonic() - started)
    todos, note_t = await todos_curve(cfg, h.Deadline(max(left - shares[2], shares[1] / 2)))
    left = budget - (time.monotonic() - started)
    leaves, note_m, build_rate = merkle_curve(cfg, h.Deadline(max(left, shares[2] / 2)))

    ops = ["claim", "update", "projection", "quota", "receipt", "stored proof"]
    tables = [
        (
            receipts,
            ops,
            "receipts in loop",
            ["receipts", "bytes/receipt", "database"],
            "Receipts in the loop",
        ),
        (todos, ["claim", "update", "projection", "quota"], "todos", ["open_loop"], "Todos"),
        (leaves, ["append", "proof"], "leaves", [], "Merkle log in memory"),
    ]
    for points, columns, what, extras, title in tables:
        if points:
            table = _curve_table(points, columns, what, extras)
            table.title = title
            section.tables.append(table)
    if by_object:
        total = sum(by_object.values())
        ranked = sorted(by_object.items(), key=lambda kv: -kv[1])
        section.tables.append(
            Table(
                ["table or index", "bytes per receipt", "share"],
                [[f"`{name}`", f"{b / counted:,.0f}", f"{b / total:.0%}"] for name, b in ranked[:8]]
                + [["all", f"{total / counted:,.0f}", "100%"]],
                title=f"Where the database bytes go at {counted:,} receipts (SQLite `dbstat`)",
            )
        )
    section.targets += _targets(receipts, "receipts", 100_000)
    section.targets += _targets(todos, "todos", 100_000)
    section.notes += [n for n in (note_r, note_t, note_m) if n]
    section.notes.append(
        f"the in-memory tree was built at {h.rate(build_rate)} appends/s on average "
        f"(leaf hash, frontier update, node dict insert)."
    )
    return section
