"""`loopwarden receipts LOOP [--follow]` and `loopwarden receipt RID`: the journal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import anyio
import typer

from loopwarden.clients import admin, render
from loopwarden.clients.cli.common import Home, Json, exit_code, fail, operate
from loopwarden.errors import LoopwardenError
from loopwarden.operations.journal import JournalResult, ReceiptLine, journal
from loopwarden.operations.receipt import receipt as receipt_op

COLUMNS = ["seq", "kind", "principal", "effect", "reasons", "receipt", "sig"]


def _row(line: ReceiptLine) -> list[object]:
    sig = "ok" if line.verified else render.Styled("[red]BAD[/red]")
    return [
        line.seq,
        line.kind,
        line.principal,
        line.effect,
        ", ".join(line.reasons),
        line.receipt_id,
        sig,
    ]


def receipts(
    loop_id: str,
    kind: Annotated[
        str | None, typer.Option("--kind", help="Only this kind, e.g. turn.refused.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new receipts.")
    ] = False,
    home: Home = None,
    json_out: Json = False,
) -> None:
    """The loop's journal as a table (signature checked per row)."""
    if not follow:
        request = {"loop_id": loop_id, "kind": kind}
        result = operate(journal, request, home, as_json=json_out, check=False)
        if json_out:
            render.emit_json(result.model_dump(mode="json", include={"loop_id", "receipts"}))
        else:
            render.table(f"receipts of {loop_id}", COLUMNS, [_row(r) for r in result.receipts])
        return
    try:
        anyio.run(_follow, loop_id, kind, home, json_out)
    except LoopwardenError as exc:
        fail(exc.message, exit_code(exc), as_json=json_out, error=exc.code)


async def _follow(loop_id: str, kind: str | None, home: Path | None, json_out: bool) -> None:
    after, first = 0, True
    async with admin.open_store(home, check=False) as store:
        while True:
            request = {"loop_id": loop_id, "kind": kind, "after_seq": after}
            result: JournalResult = await journal(store, admin.operator(), request)
            if result.receipts:
                after = result.receipts[-1].seq
            if json_out:
                for line in result.receipts:
                    print(json.dumps(line.model_dump(mode="json")), flush=True)
            elif result.receipts or first:
                title = f"receipts of {loop_id}" if first else ""
                render.table(title, COLUMNS, [_row(r) for r in result.receipts])
            first = False
            await anyio.sleep(1.0)


def receipt(receipt_id: str, home: Home = None, json_out: Json = False) -> None:
    """One receipt: the envelope, its decoded body, and whether it verifies."""
    result = operate(receipt_op, {"receipt_id": receipt_id}, home, as_json=json_out, check=False)
    key_id = (result.envelope.get("signatures") or [{}])[0].get("keyid")
    out = {
        "receipt_id": result.receipt_id,
        "leaf_index": result.inclusion_proof.leaf_index,
        "digest": result.digest,
        "verified": result.verified,
        "problems": result.problems,
        "key_id": key_id,
        "body": result.body,
        "envelope": result.envelope,
    }
    if json_out:
        render.emit_json(out)
        return
    state = (
        "[green]signature ok[/green]"
        if result.verified
        else f"[red]{', '.join(result.problems)}[/red]"
    )
    render.console.print(
        f"[bold]{result.receipt_id}[/bold] leaf {out['leaf_index']} {state} (key {key_id})"
    )
    render.console.print(f"[dim]{result.digest}[/dim]")
    render.console.print(render.json_text(result.body), markup=False)
