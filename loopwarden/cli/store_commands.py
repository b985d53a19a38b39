"""`loopwarden store copy`: move a whole store between backends (SQLite ↔ PostgreSQL)."""

from __future__ import annotations

from typing import Annotated

import typer

from loopwarden.cli.common import EXIT_OK, EXIT_VERIFY, Home, Json, run
from loopwarden.clients import admin, render
from loopwarden.errors import InvalidInput, KeyFileError
from loopwarden.kernel.sql.location import parse_location
from loopwarden.kernel.store.copies import CopyReport, compare, copy_rows
from loopwarden.kernel.store.store import snapshot

app = typer.Typer(no_args_is_help=True, help="Move a store between backends.")


@app.command("copy")
def store_copy(
    source: Annotated[
        str, typer.Option("--from", metavar="URL", help="The store to copy (left unchanged).")
    ],
    destination: Annotated[
        str, typer.Option("--to", metavar="URL", help="A new, empty store to copy into.")
    ],
    home: Home = None,
    json_out: Json = False,
) -> None:
    """Copy a store into a new, empty one, and prove the copy.

    Every row as stored: receipts byte for byte, the Merkle tree and checkpoints, the
    projection with its proofs, tokens and idempotency records. Then both are read back and
    compared row for row, and the copy's Merkle root recomputed from its receipts.

    Both stores use the home's keys (the copy's MACs verify only with the home's integrity
    secret). The source is read from one snapshot: stop its servers first if the copy is to
    replace it. Exit 3 if the copy differs from its source.
    """

    async def action() -> CopyReport:
        src, dst = parse_location(source), parse_location(destination)
        if src == dst:
            raise InvalidInput("--from and --to name the same store")
        if admin.integrity_of(home) is None:
            raise KeyFileError(
                "the home has no integrity secret (keys/integrity.key): use the home of the "
                "store being copied (--home)"
            )
        with snapshot(src) as reader:
            async with admin.open_store(home, store=dst.url) as opened:
                rows = await opened.write(lambda tx: copy_rows(reader, tx.conn))
            report = CopyReport(rows=rows)
            with snapshot(dst) as copy:
                compare(reader, copy, report)
        return report

    report = run(action, as_json=json_out)
    if json_out:
        render.emit_json(report.as_dict())
    elif report.faithful:
        render.console.print(
            f"copied {render.counted(report.size, 'receipt')} and every other row to "
            f"{parse_location(destination)}: byte-identical, Merkle root {report.root}"
        )
    else:
        render.err.print("[red]the copy differs from its source:[/red]")
        for line in report.differences:
            render.err.print(f"  {render.safe(line)}")
    raise typer.Exit(EXIT_OK if report.faithful else EXIT_VERIFY)
