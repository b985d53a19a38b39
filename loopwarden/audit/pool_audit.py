"""The audit of budget pools: what the journal says each pool is and used, against the rows.

The database audit replays the pools with the journal (`PoolLedger`: each pool's own receipts,
and what every loop receipt charged); at the end the stored pool rows and window usage must
be exactly that, each under a valid MAC when the integrity secret is given.
"""

from __future__ import annotations

from dataclasses import fields

from loopwarden.audit.findings import FindingCode, Report
from loopwarden.kernel.log.integrity import POOL_MAC, POOL_USAGE_MAC, Integrity
from loopwarden.kernel.sql.schema import POOL_USAGE, POOLS
from loopwarden.kernel.state.charges import PoolLedger, chain_of
from loopwarden.kernel.store.reader import Reader
from loopwarden.policy.budgets import Totals


def check_pools(
    reader: Reader, ledger: PoolLedger, report: Report, integrity: Integrity | None
) -> None:
    """Compare the stored pools and usage with the replay; check their MACs."""
    stored = reader.pools()
    for name in sorted(set(stored) | set(ledger.rows)):
        where = {"loop_id": chain_of(name)}
        row, replayed = stored.get(name), ledger.rows.get(name)
        if row is None or replayed is None:
            what = "is stored but has no receipts" if replayed is None else "has no stored row"
            report.add(FindingCode.PROJECTION_MISMATCH, f"pool {name} {what}", **where)
            continue
        differs = [f.name for f in fields(row) if getattr(row, f.name) != getattr(replayed, f.name)]
        if differs:
            report.add(
                FindingCode.PROJECTION_MISMATCH,
                f"pool {name}'s stored row differs from its receipts in {', '.join(differs)}",
                **where,
            )
        windows = {u.window_start: u.totals for u in reader.pool_usage(name)}
        replayed_windows = {w: t for (p, w), t in ledger.used.items() if p == name}
        for window in sorted(set(windows) | set(replayed_windows)):
            if windows.get(window, Totals()) != replayed_windows.get(window, Totals()):
                label = window or "total"
                report.add(
                    FindingCode.PROJECTION_MISMATCH,
                    f"pool {name}'s stored usage for window {label} differs from what its loops' "
                    "receipts charged",
                    **where,
                )
    if integrity is not None and not reader.legacy:
        _check_macs(reader, integrity, report)


def _check_macs(reader: Reader, integrity: Integrity, report: Report) -> None:
    for table, kind, what in (
        (POOLS, POOL_MAC, "stored row"),
        (POOL_USAGE, POOL_USAGE_MAC, "stored usage"),
    ):
        for *values, mac in reader.conn.execute(f"SELECT {table.row_names}, mac FROM {table.name}"):
            if not integrity.valid(kind, table.mac_values(values), mac):  # as MACed
                name = values[0]  # a pool's name, or the pool a usage row is of
                report.add(
                    FindingCode.MAC_INVALID,
                    f"pool {name}'s {what} was changed outside loopwarden",
                    loop_id=chain_of(name),
                )
