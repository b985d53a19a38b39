"""`loopwarden approvals [--pending]`, `approve ID`, `reject ID`."""

from __future__ import annotations

from typing import Annotated

import typer

from loopwarden.approvals.approval_ops import decide_approval, list_approvals
from loopwarden.cli.common import Options, Reason, fail, parse_duration, shared_options
from loopwarden.clients import render
from loopwarden.clock import format_time
from loopwarden.errors import LoopwardenError


@shared_options("home", "store", "json")
def approvals(
    pending: Annotated[
        bool, typer.Option("--pending", help="Only approvals awaiting a decision.")
    ] = False,
    loop: Annotated[str | None, typer.Option("--loop", help="Only this loop.")] = None,
    *,
    options: Options,
) -> None:
    """List approval requests."""
    request = {"loop_id": loop, "status": "pending" if pending else None}
    result = options.operate(list_approvals, request)
    rows = result.approvals
    if options.json_out:
        render.emit_json(result.model_dump(mode="json"))
        return
    render.table(
        "approvals",
        ["id", "loop", "tool", "status", "requested by", "expires", "summary"],
        [
            [
                a.approval_id,
                a.loop_id,
                a.tool,
                a.status,
                a.requested_by,
                a.expires_at or "-",
                a.summary,
            ]
            for a in rows
        ],
    )


def _decide(
    approval_id: str, approve_it: bool, expires: str | None, reason: str, options: Options
) -> None:
    try:
        seconds = parse_duration(expires) if expires else 3600
    except LoopwardenError as exc:
        fail(exc.message, 2, as_json=options.json_out, error=exc.code)
    request = {
        "approval_id": approval_id,
        "approve": approve_it,
        "expires_in_seconds": seconds,
        "reason": reason,
    }
    result = options.operate(decide_approval, request)
    if options.json_out:
        render.emit_json(result.model_dump(mode="json"))
    else:
        until = f" until {format_time(result.expires_at)}" if result.expires_at else ""
        render.console.print(
            f"approval {result.approval_id} {result.status}{until} (receipt {result.receipt_id})"
        )


@shared_options("home", "store", "json", "as")
def approve(
    approval_id: str,
    expires: Annotated[
        str | None, typer.Option("--expires", help="Lifetime, e.g. 30m, 1h (default 1h).")
    ] = None,
    reason: Reason = "",
    *,
    options: Options,
) -> None:
    """Approve a pending approval request."""
    _decide(approval_id, True, expires, reason, options)


@shared_options("home", "store", "json", "as")
def reject(
    approval_id: str,
    reason: Annotated[str, typer.Option("--reason", help="Why (required).")],
    *,
    options: Options,
) -> None:
    """Reject a pending approval request."""
    _decide(approval_id, False, None, reason, options)
