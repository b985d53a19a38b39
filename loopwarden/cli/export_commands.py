"""`loopwarden export-status`: where each export sink (`serve --export-webhook`) stands."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from loopwarden.cli.common import Options, exit_code, fail, shared_options
from loopwarden.clients import admin, render
from loopwarden.clock import format_optional, system_clock
from loopwarden.errors import LoopwardenError
from loopwarden.kernel.store.reader import ExportCursor


def sink_status(cursor: ExportCursor, size: int, now: datetime) -> dict[str, Any]:
    """One sink's status: its cursor, the receipts it has still to send and its lease."""
    live = cursor.lease_expires_at is not None and cursor.lease_expires_at > now
    return {
        "sink": cursor.sink,
        "target": cursor.target,
        "exported": cursor.exported,
        "lag": max(size - 1 - cursor.exported, 0),
        "sent": cursor.sent,
        "last_success": format_optional(cursor.succeeded_at),
        "last_error": cursor.error,
        "last_error_at": format_optional(cursor.failed_at) if cursor.error else None,
        "lease_holder": cursor.holder if live else None,
        "lease_expires_at": format_optional(cursor.lease_expires_at) if live else None,
    }


@shared_options("home", "store", "json")
def export_status(*, options: Options) -> None:
    """Show each export sink's cursor, lag and lease.

    For every webhook sink that has run on this store: the last log index its receiver
    acknowledged, the receipts still to send (lag), the last success and the last error (kept
    until the next success), and which server process holds its lease (none: nobody sends
    now). --json prints {"log_size": N, "sinks": [...]}.
    """
    try:
        with admin.open_reader(options.home, store=options.store) as reader:
            size = reader.log_state().size
            cursors = reader.export_cursors()
    except LoopwardenError as exc:
        fail(exc.message, exit_code(exc), as_json=options.json_out, error=exc.code)
    now = system_clock()
    sinks = [sink_status(cursor, size, now) for cursor in cursors]
    if options.json_out:
        render.emit_json({"log_size": size, "sinks": sinks})
        return
    render.console.print(f"log size {size}; {render.counted(len(sinks), 'export sink')}")
    if not sinks:
        render.console.print("no sink has run (serve --export-webhook URL starts one)")
        return
    columns = ["sink", "target", "exported", "lag", "last success", "last error", "lease holder"]
    rows = [
        [
            s["sink"],
            s["target"],
            s["exported"],
            s["lag"],
            s["last_success"] or "never",
            f"{s['last_error']} at {s['last_error_at']}" if s["last_error"] else "-",
            s["lease_holder"] or "none",
        ]
        for s in sinks
    ]
    render.table("export sinks", columns, rows)
