"""`loopwarden receipts LOOP [--follow]`, `loopwarden receipt RID`, `loopwarden events` and
`loopwarden checkpoint`: the journal."""

from __future__ import annotations

import base64
import json
import sys
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import anyio
import typer
from rich.markup import escape

from loopwarden.cli.common import EXIT_USAGE, Options, exit_code, fail, shared_options
from loopwarden.clients import admin, render
from loopwarden.clock import format_time
from loopwarden.errors import InvalidInput, LoopwardenError
from loopwarden.exports.cloudevents import cloudevent
from loopwarden.journal.listing import MAX_LINES, JournalResult, ReceiptLine, journal
from loopwarden.journal.receipt import receipt as receipt_op
from loopwarden.kernel.sql.records import CheckpointRow, JournalRow
from loopwarden.kernel.state.events import ReceiptKind

FOLLOW_SECONDS = 1.0  # how often --follow looks for new receipts
KIND_WIDTH = max(len(kind) for kind in ReceiptKind)
# (header, width): fixed, so --follow can print its header once and every row lines up; the
# last column takes the rest of the line. Longer cells are cut with "…" (--json has them whole).
COLUMNS = [
    ("seq", 5),
    ("time (UTC)", 20),
    ("kind", KIND_WIDTH),
    ("principal", 12),
    ("effect", 6),
    ("receipt", 29),
    ("sig", 3),
    ("reasons", 0),
]


def _fit(text: str, width: int) -> str:
    if not width:
        return text
    return text[: width - 1] + "…" if len(text) > width else text.ljust(width)


def _line(cells: list[str], styles: dict[int, str] | None = None) -> str:
    """One row as rich markup: every cell's controls escaped (`render.visible`), then its
    markup, then padded or cut to its column's width."""
    parts = []
    for index, (text, (_, width)) in enumerate(zip(cells, COLUMNS, strict=True)):
        part = escape(_fit(render.visible(text), width))  # agents' text: controls shown escaped
        style = (styles or {}).get(index)
        parts.append(f"[{style}]{part}[/{style}]" if style else part)
    return "  ".join(parts).rstrip()


def _row(line: ReceiptLine) -> str:
    at = format_time(line.at)[:19] + "Z"
    cells = [str(line.seq), at, line.kind, line.principal, line.effect, line.receipt_id]
    last = ", ".join(line.reasons) + (f" (subagent {line.subagent})" if line.subagent else "")
    cells += ["ok" if line.verified else "BAD", last.strip()]
    return _line(cells, None if line.verified else {6: "red"})


def _header(loop_id: str) -> None:
    render.console.print(f"receipts of {escape(loop_id)}")
    render.console.print(_line([name for name, _ in COLUMNS]), soft_wrap=True)


class Format(StrEnum):
    """How `receipts` prints: a table (or --json), or CloudEvents JSON lines."""

    TABLE = "table"
    CLOUDEVENTS = "cloudevents"


@shared_options("home", "store", "json")
def receipts(
    loop_id: Annotated[
        str | None, typer.Argument(help="The loop (optional with --format cloudevents).")
    ] = None,
    kind: Annotated[
        str | None, typer.Option("--kind", help="Only this kind, e.g. turn.refused.")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new receipts until the loop closes."),
    ] = False,
    *,
    options: Options,
    format_: Annotated[
        Format,
        typer.Option("--format", help="table (default), or cloudevents: the `events` feed."),
    ] = Format.TABLE,
) -> None:
    """Print a loop's receipts, each signature checked.

    With --follow, new receipts are printed as they are sealed, under the same header, until
    the loop closes (completed, stopped or cancelled): then it exits 0. With --json, one JSON
    document (or with --follow, one JSON line per receipt).

    With --format cloudevents, the CloudEvents feed of `loopwarden events`: the whole store's
    without LOOP, else LOOP's receipts only; --follow keeps printing until interrupted.
    """
    home, store, json_out = options.home, options.store, options.json_out
    if format_ is Format.CLOUDEVENTS:
        _feed(home, store, -1, follow, json_out, Only(loop_id, kind))
        return
    if loop_id is None:
        message = "name a LOOP, or print the whole store's feed with --format cloudevents"
        fail(message, EXIT_USAGE, as_json=json_out, error="invalid_input")
    if not follow:
        request = {"loop_id": loop_id, "kind": kind}
        result = options.operate(journal, request, check=False)
        if json_out:
            render.emit_json(result.model_dump(mode="json", include={"loop_id", "receipts"}))
            return
        _header(loop_id)
        for line in result.receipts:
            render.console.print(_row(line), soft_wrap=True)
        return
    try:
        anyio.run(_follow, loop_id, kind, home, store, json_out)
    except LoopwardenError as exc:
        fail(exc.message, exit_code(exc), as_json=json_out, error=exc.code)


async def _follow(
    loop_id: str, kind: str | None, home: Path | None, store: str | None, json_out: bool
) -> None:
    """Poll the journal; return once a poll saw the loop closed and everything up to it."""
    after, printed = 0, False
    async with admin.open_store(home, store=store, check=False, create=False) as opened:
        while True:
            request = {"loop_id": loop_id, "kind": kind, "after_seq": after}
            result: JournalResult = await journal(opened, admin.operator(), request)
            if not (json_out or printed):
                _header(loop_id)  # once, after the first poll found the loop
                printed = True
            for line in result.receipts:
                if json_out:
                    print(json.dumps(line.model_dump(mode="json")), flush=True)
                else:
                    render.console.print(_row(line), soft_wrap=True)
            sys.stdout.flush()  # a live stream: each batch reaches a pipe (| grep) at once
            after = result.receipts[-1].seq if result.receipts else after
            if result.closed and len(result.receipts) < MAX_LINES:
                if not json_out:
                    render.err.print(
                        f"[dim]loop {escape(loop_id)} is closed; stopped following[/dim]"
                    )
                return
            await anyio.sleep(FOLLOW_SECONDS)


Wait = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="Wait until the receipt is published under a signed checkpoint (on PostgreSQL a "
        "receipt may be sealed and still waiting for its Merkle leaf).",
    ),
]


@shared_options("home", "store", "json")
def receipt(receipt_id: str, *, options: Options, wait: Wait = False) -> None:
    """Show one receipt: envelope, body, verification.

    The DSSE envelope, its decoded body, whether its signature verifies and under which key,
    and its state: sealed (in its loop's chain, waiting for its Merkle leaf), integrated or
    published (under a stored signed checkpoint).
    """
    request = {"receipt_id": receipt_id, "wait": wait}
    result = options.operate(receipt_op, request, check=False)
    key_id = (result.envelope.get("signatures") or [{}])[0].get("keyid")
    out = {
        "receipt_id": result.receipt_id,
        "leaf_index": proof.leaf_index if (proof := result.inclusion_proof) else None,
        "state": result.state,
        "digest": result.digest,
        "verified": result.verified,
        "problems": result.problems,
        "key_id": key_id,
        "body": result.body,
        "envelope": result.envelope,
    }
    if options.json_out:
        render.emit_json(out)
        return
    state = (
        "[green]signature ok[/green]"
        if result.verified
        else f"[red]{', '.join(result.problems)}[/red]"
    )
    place = f"leaf {out['leaf_index']}" if out["leaf_index"] is not None else "pending its leaf"
    render.console.print(
        f"[bold]{result.receipt_id}[/bold] {result.state}, {place} {state} (key {key_id})"
    )
    render.console.print(f"[dim]{result.digest}[/dim]")
    render.console.print(render.json_text(result.body), markup=False)


EVENTS_PAGE = 500  # receipts read per snapshot by `events`


@shared_options("home", "store", "json")
def events(
    after: Annotated[
        int,
        typer.Option(
            "--after",
            help="Start after this log index (the last event's loopwardenindex): resume a feed.",
        ),
    ] = -1,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing receipts as they are sealed.")
    ] = False,
    *,
    options: Options,
) -> None:
    """Every receipt of the store as CloudEvents, in log order.

    One CloudEvents 1.0 JSON line per receipt.

    The feed for a SIEM or a log pipeline: each event's id is the receipt id (dedupe on it),
    its data holds the loop, seq, log index, digest and the signed envelope. --after resumes
    where a consumer stopped; --follow keeps printing until interrupted. The output is JSON
    lines with or without --json (which makes errors JSON too).
    """
    _feed(options.home, options.store, after, follow, options.json_out, Only())


@dataclass(frozen=True)
class Only:
    """Which receipts a feed prints: of one loop, of one kind (None: every one)."""

    loop_id: str | None = None
    kind: str | None = None

    def wants(self, row: JournalRow) -> bool:
        return (self.loop_id is None or row.loop_id == self.loop_id) and (
            self.kind is None or row.kind == self.kind
        )


def _feed(
    home: Path | None, store: str | None, after: int, follow: bool, json_out: bool, only: Only
) -> None:
    """The CloudEvents feed of `events` and `receipts --format cloudevents`: the receipts
    after log index `after` that `only` wants, then (with `follow`) every new one."""
    try:
        if after < -1:
            raise InvalidInput(f"--after {after}: a log index is -1 (from the start) or more")
        while True:
            after = _print_events(home, store, after, only)
            if not follow:
                return
            time.sleep(FOLLOW_SECONDS)
    except LoopwardenError as exc:
        fail(exc.message, exit_code(exc), as_json=json_out, error=exc.code)


def _print_events(home: Path | None, store: str | None, after: int, only: Only) -> int:
    """Print the events after log index `after`, page by page; the last index read."""
    while True:
        with admin.open_reader(home, store=store) as reader:
            origin = reader.meta("origin") or "loopwarden.local/unknown"
            rows = reader.journal_page(after, EVENTS_PAGE)
        for row in rows:
            if only.wants(row):
                print(json.dumps(cloudevent(row, origin), separators=(",", ":")))
        sys.stdout.flush()  # a live feed: each page reaches a pipe at once
        if len(rows) < EVENTS_PAGE:
            return rows[-1].leaf if rows else after
        after = rows[-1].leaf


@shared_options("home", "store", "json")
def checkpoint(*, options: Options) -> None:
    """Sign and store a checkpoint of the whole journal now.

    A server stores a signed checkpoint every 256 receipts it integrates, and when a receipt
    is asked for with --wait; between those, a receipt's proof is against a checkpoint signed
    for that answer only and not kept.

    A stored checkpoint publishes every receipt up to its size, and `verify` checks the tree
    against it. Nothing is signed when the latest one already covers the journal.
    """

    async def action() -> tuple[CheckpointRow | None, CheckpointRow | None]:
        async with admin.open_store(options.home, store=options.store, create=False) as opened:
            before = await opened.read(lambda reader: reader.latest_checkpoint())
            await opened.checkpoint()
            return before, await opened.read(lambda reader: reader.latest_checkpoint())

    try:
        before, after = anyio.run(action)
    except LoopwardenError as exc:
        fail(exc.message, exit_code(exc), as_json=options.json_out, error=exc.code)
    made = after is not None and (before is None or after.size > before.size)
    out = {
        "size": after.size if after else 0,
        "root": base64.b64encode(after.root).decode() if after else None,
        "key_id": after.key_id if after else None,
        "signed_at": format_time(after.signed_at) if after else None,
        "signed_now": made,
    }
    if options.json_out:
        render.emit_json(out)
    elif after is None:
        render.console.print("the journal is empty: there is nothing to sign")
    elif made:
        render.console.print(
            f"signed and stored a checkpoint of size {after.size} (key {after.key_id}): "
            f"{render.counted(after.size, 'receipt')} published"
        )
    else:
        render.console.print(
            f"the stored checkpoint of size {after.size} (signed {out['signed_at']}) already "
            "covers the journal: nothing to sign"
        )
