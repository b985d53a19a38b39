"""Human-readable output for the admin CLI (rich tables on stdout; `--json` bypasses all of this)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from loopwarden.audit.findings import Report
from loopwarden.clock import format_time
from loopwarden.projection.projection import ProjectionResult

# Piped output (scripts, docs, grep) is never wrapped: a line of ours (a finding, a step) stays
# one line whatever its length, and tables get a wide fixed width instead of rich's 80 columns.
# On a terminal, lines wrap at words to its width.
PIPED = not sys.stdout.isatty()
console = Console(highlight=False, emoji=False, width=160 if PIPED else None, soft_wrap=PIPED)
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)  # one error, one line


# What a terminal acts on instead of showing: C0 controls (newline and tab too: a cell is one
# line), DEL, C1 controls (U+009B is CSI on its own), the line and paragraph separators, and
# the bidirectional marks, embeddings, overrides and isolates that reorder what follows.
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


RAW_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in NAMED:
        return NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` as an operator's terminal must show it: every control character and bidi
    control written as its escape (`\\x1b`, `\\u202e`), never acted on. For any text an agent
    (or anyone but us) may have written; `--json` output never goes through this."""
    return CONTROLS.sub(_escaped, text)


def safe(text: str) -> str:
    """`visible`, then escaped for rich markup: for outside text inside our own markup."""
    return escape(visible(text))


def json_text(value: Any) -> str:
    """Indented JSON for a human: exact JSON, with the controls JSON leaves raw (C1, bidi)
    written as `\\uXXXX` escapes too, so the text is still valid JSON for the same value."""
    text = json.dumps(value, indent=2, ensure_ascii=False)  # C0 controls come out escaped
    return RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class Styled(str):
    """Markup we wrote ourselves; every other string is shown literally (a loop's objective or
    an agent's summary may contain `[...]`, which rich would otherwise read as markup)."""


def cell(value: Any) -> str | Text:
    if isinstance(value, Styled):
        return value
    if isinstance(value, datetime):
        return Text(format_time(value))
    return Text(visible(value) if isinstance(value, str) else _num(value))


def program() -> str:
    """How to run this `loopwarden` again from the same shell: `loopwarden` if that is the one
    on the PATH, else the running script's path (relative when it is below the working
    directory, as `.venv/bin/loopwarden` is after `make demo`), else `python -m loopwarden`."""
    script = Path(sys.argv[0]).absolute()
    if script.name != "loopwarden" or not script.is_file():
        return f"{sys.executable} -m loopwarden"
    found = shutil.which("loopwarden")
    if found and Path(found).absolute() == script:
        return "loopwarden"
    relative = os.path.relpath(script)
    return str(script) if relative.startswith("..") else relative


def counted(n: int, noun: str) -> str:
    """`1 loop`, `2 loops`, `0 loops`."""
    return f"{n} {noun if n == 1 else noun + 's'}"


def _plain(value: object) -> str:
    """What a value JSON has no type for prints as: a time as every time is written
    (`format_time`; the one place CLI output turns a datetime into JSON), else its text."""
    return format_time(value) if isinstance(value, datetime) else str(value)


def emit_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False, default=_plain))


def bar(used: float, limit: float | None, width: int = 20) -> Styled:
    if not limit:
        return Styled("[dim]no limit[/dim]")
    filled = min(width, round(width * used / limit))
    color = "green" if used < 0.8 * limit else "yellow" if used < limit else "red"
    return Styled(f"[{color}]{'█' * filled}{'░' * (width - filled)}[/{color}]")


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


STATUS_COLORS = {
    "active": "green",
    "paused": "yellow",
    "completed": "cyan",
    "stopped": "red",
    "cancelled": "red",
}


def status(text: str) -> Styled:
    return Styled(f"[{STATUS_COLORS.get(text, 'white')}]{safe(text)}[/]")


def controlled(what: str, name: str, now: str, receipt_id: str) -> None:
    """An operator's control, done: `loop L1 is now paused (receipt rcpt-…)`."""
    console.print(f"{what} {safe(name)} is now {status(now)} (receipt {receipt_id})")


def projection(p: ProjectionResult) -> None:
    head = f"[bold]{safe(p.loop_id)}[/bold]  {status(p.status)}"
    if p.stop_reason:
        head += f" ({safe(p.stop_reason)})"
    console.print(head)
    console.print(f"objective: {safe(p.objective)}")
    console.print(f"policy:    {p.policy_digest}", soft_wrap=True)  # a digest never wraps
    console.print(f"attention: [bold]{p.attention.who}[/bold] — {safe(p.attention.why)}")
    console.print(f"next:      {safe(p.next_action)}")
    table(
        "budgets",
        ["dimension", "used", "limit", "remaining", ""],
        [[d, b.used, b.limit, b.remaining, bar(b.used, b.limit)] for d, b in p.budgets.items()],
    )
    counts = ", ".join(f"{k} {v}" for k, v in p.todo_counts.items())
    table(
        f"todos ({counts})",
        ["id", "status", "attempts", "depends on", "title"],
        [[t.todo_id, t.status, t.attempts, ", ".join(t.depends_on), t.title] for t in p.todos],
    )
    if p.todos_truncated:
        console.print("[dim]… more todos (loopwarden loop show --json lists the first 200)[/dim]")
    if p.active_leases:
        table(
            "active leases",
            ["turn", "todo", "agent", "fence", "expires"],
            [
                [x.turn_id, x.todo_id, x.agent, x.fence, format_time(x.lease_expires_at)]
                for x in p.active_leases
            ],
        )
    _observed_tool_use(p)
    if p.approvals:
        table(
            "approvals",
            ["id", "tool", "status", "requested by", "summary"],
            [[a.approval_id, a.tool, a.status, a.requested_by, a.summary] for a in p.approvals],
        )
    table(
        "recent receipts",
        ["seq", "kind", "principal", "effect", "reasons", "receipt"],
        [
            [r.seq, r.kind, r.principal, r.effect, ", ".join(r.reasons), r.receipt_id]
            for r in p.recent_receipts
        ],
    )
    for warning in p.warnings:
        console.print(f"[yellow]warning:[/yellow] {safe(warning)}")
    console.print(f"[dim]head: seq {p.head.seq} {p.head.digest}[/dim]", soft_wrap=True)


def _observed_tool_use(p: ProjectionResult) -> None:
    """The turns a host's hooks saw: what they saw beside what was reported."""
    watched = [t for t in p.turns if t.observed or t.tool_refusals]
    if watched:
        table(
            "observed tool use",
            ["turn", "agent", "status", "observed", "reported", "refused"],
            [
                [
                    w.turn_id,
                    w.agent,
                    w.status,
                    ", ".join(f"{k} ×{v}" for k, v in w.observed.items()),
                    ", ".join(f"{k} ×{v}" for k, v in w.reported.items()),
                    w.tool_refusals,
                ]
                for w in watched
            ],
        )


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    out = Table(title=Text(visible(title)), title_justify="left", box=None, pad_edge=False)
    for column in columns:
        out.add_column(column)
    for row in rows:
        out.add_row(*map(cell, row))
    console.print(out, soft_wrap=False)  # a table lays its cells out in the console's width


def audit(report: Report) -> None:
    verdict = "[green]clean[/green]" if report.clean else "[red]TAMPERED[/red]"
    if report.trusted:
        console.print(f"trusting {safe(report.trusted)}")
    console.print(
        f"audit: {verdict} — {counted(report.receipts, 'receipt')}, "
        f"{counted(report.loops, 'loop')}, {counted(report.checkpoints, 'checkpoint')}, "
        f"tree size {report.tree_size} ({report.seconds:.2f}s)"
    )
    console.print(f"[dim]root {report.root}[/dim]")
    witnesses(report)
    for f in report.findings:
        console.print(f"  [red]{f.code}[/red] {safe(f.where())}: {safe(f.message)}")
    for note in report.notes:
        console.print(f"  [yellow]note[/yellow]: {safe(note)}")


def witnesses(report: Report) -> None:
    """The witnesses' line of a report checked against a witness policy."""
    seen = report.witnesses
    if seen is None:
        return
    met = "[green]quorum met[/green]" if seen["quorum_met"] else "[red]quorum NOT met[/red]"
    cosigned = ", ".join(seen["cosigned_by"]) or "no witness"
    missing = f"; missing {', '.join(seen['missing'])}" if seen["missing"] else ""
    console.print(
        f"witnesses: checkpoint {seen['checkpoint_size']} cosigned by {safe(cosigned)}"
        f"{safe(missing)} — {met} ({safe(seen['quorum'])})"
    )


def bundle(report: Report) -> None:
    verdict = "[green]clean[/green]" if report.clean else "[red]TAMPERED[/red]"
    pinned = (
        "pinned key"
        if report.keys_pinned
        else "[yellow]keys taken from the bundle (not pinned)[/yellow]"
    )
    console.print(
        f"bundle: {verdict} — loop {safe(report.loop_id)}, {counted(report.receipts, 'receipt')}, checkpoint size "
        f"{report.tree_size}, {pinned}"
    )
    if report.status:
        console.print(
            f"replayed status: {status(report.status)}"
            + (f" ({safe(report.stop_reason)})" if report.stop_reason else "")
        )
    witnesses(report)
    for f in report.findings:
        console.print(f"  [red]{safe(f.code)}[/red]: {safe(f.message)}")
    for note in report.notes:
        console.print(f"  [yellow]note[/yellow]: {safe(note)}")
