"""A loop's history as the dashboard shows it, read once and then only extended.

The journal is append-only and each loop's `seq` runs without gaps, so what the dashboard has
read of a loop never changes: `Histories` keeps, per loop, the compact lines of every receipt
read so far (each signature checked by the `journal` operation), each budget's cumulative use
over time, and per turn the tools the agent reported next to the host events recorded for it.
A page asks for the loop at its current head and only the receipts after the cached head are
read, in chunks, so a loop with thousands of receipts is read once, and no single read holds
the store's read side for long.

Budgets are what the fold says: each receipt, parsed as its kind's typed body, is folded into
the loop's view with the same registry the write path and the audit use (`Kinds.apply`), and
each budget's line is the view's totals after it — a claim's turn, a report's usage, a lease's
expiry, a loop's close, a call observed outside a turn, whatever a kind charges. A page
compares the result with the stored totals and says so if they differ.

Each turn keeps every report the agent sent, in order, with its verdict: a refused report does
not replace the one before it (a turn stopped for `tool_denied` and then reported again, refused
as `turn_closed`, shows both). What the host's hooks recorded for a turn (`tool.admitted`,
`tool.refused`, `tool.observed`) is kept per tool: the policy name, the host's own name, how
often it was let through, refused (and why) and ran. Receipts of kinds this module does not
model are still counted for their turn, by kind (`TurnTools.other`); the receipt page shows any
body as signed.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio
from pydantic import ValidationError

from loopwarden.approvals.approval_kinds import ApprovalRequested
from loopwarden.errors import LoopwardenError
from loopwarden.hosts.host_kinds import ToolAdmitted, ToolCall, ToolObserved, ToolRefused
from loopwarden.journal.listing import JournalRequest, ReceiptLine, journal
from loopwarden.kernel.state.events import LoopStopped, ReceiptBody, ReceiptKind, TurnReport
from loopwarden.kernel.state.registry import Kinds
from loopwarden.kernel.state.rows import LoopView
from loopwarden.kernel.store.store import Store
from loopwarden.loops.loop_kinds import LoopStatusChanged
from loopwarden.policy.budgets import BUDGET_DIMENSIONS, Totals
from loopwarden.principals import Principal
from loopwarden.turns.turn_kinds import TurnClaimed

CHUNK = 100  # receipts per read (~10 ms): bounds how long one read holds the store's read side
MAX_LOOPS = 8  # loops whose history is kept (least recently used dropped first)
# The turn's own lifecycle; any other kind that names a turn is something a host recorded.
TURN_KINDS = frozenset(
    str(kind)
    for kind in (
        ReceiptKind.TURN_CLAIMED,
        ReceiptKind.TURN_REPORTED,
        ReceiptKind.TURN_REFUSED,
        ReceiptKind.LEASE_RENEWED,
        ReceiptKind.LEASE_EXPIRED,
        ReceiptKind.APPROVAL_REQUESTED,
        ReceiptKind.APPROVAL_DECIDED,
        ReceiptKind.REQUEST_REFUSED,
        ReceiptKind.CLAIM_REFUSED,
    )
)


@dataclass(frozen=True, slots=True)
class Line:
    """One receipt as listed: no body, so thousands fit in little memory. `subject` names the
    tools it is about (a report's, a host's call), if any; `messages` go with `reasons`."""

    seq: int
    receipt_id: str
    kind: str
    at: datetime
    principal: str
    effect: str
    reasons: tuple[str, ...]
    turn_id: str | None
    verified: bool
    messages: tuple[str, ...] = ()
    subject: str = ""

    @property
    def refused(self) -> bool:
        return self.effect == "deny"

    @property
    def explained(self) -> list[tuple[str, str]]:
        """Each reason code with its message (empty where the receipt had none)."""
        messages = list(self.messages) + [""] * (len(self.reasons) - len(self.messages))
        return list(zip(self.reasons, messages, strict=False))


@dataclass(frozen=True)
class Report:
    """One `update` of a turn as sealed: what the agent said it used, and the verdict."""

    seq: int
    outcome: str
    tools: tuple[tuple[str, int], ...]
    refused: bool
    reasons: tuple[str, ...]


@dataclass
class HostUse:
    """What a host's hooks recorded for one tool in one turn."""

    tool: str  # the policy name (`shell.run`)
    host_tool: str  # the host's own (`Bash`)
    admitted: int = 0
    refused: int = 0
    ran: int = 0
    errored: int = 0
    refusals: Counter[str] = field(default_factory=Counter)  # reason code → count


@dataclass
class TurnTools:
    """What one turn's receipts say about tools: every report, and what hosts recorded."""

    turn_id: str
    todo_id: str = ""
    agent: str = ""
    reports: list[Report] = field(default_factory=list)
    host: dict[tuple[str, str], HostUse] = field(default_factory=dict)
    hosts: set[str] = field(default_factory=set)  # the hosts (or the MCP gateway) that saw it
    other: Counter[str] = field(default_factory=Counter)  # receipts of unmodelled kinds, by kind

    @property
    def refused(self) -> bool:
        """The turn's latest report was refused (a refusal corrected since is not)."""
        return bool(self.reports) and self.reports[-1].refused

    @property
    def reported(self) -> Counter[str]:
        """Every tool the accepted reports listed (refused ones changed nothing)."""
        total: Counter[str] = Counter()
        for report in self.reports:
            if not report.refused:
                total.update(dict(report.tools))
        return total


CONTROL_KINDS = frozenset(
    str(kind)
    for kind in (ReceiptKind.LOOP_PAUSED, ReceiptKind.LOOP_RESUMED, ReceiptKind.LOOP_CANCELLED)
)


@dataclass(frozen=True)
class Control:
    """An operator's pause, resume or cancel: who, when, and the reason they gave ("" if none)."""

    kind: str
    principal: str
    at: datetime
    reason: str


@dataclass
class LoopHistory:
    loop_id: str
    head: int = 0
    lines: list[Line] = field(default_factory=list)
    control: Control | None = None  # the latest pause, resume or cancel
    view: LoopView | None = None  # the loop as its receipts fold it (None before loop.opened)
    # dimension → [(at, seq, used so far)], one point each time that dimension moved
    series: dict[str, list[tuple[datetime, int, float]]] = field(default_factory=dict)
    turns: dict[str, TurnTools] = field(default_factory=dict)
    unreadable: int = 0  # receipts that are no typed body or do not fold (tampered data)

    @property
    def totals(self) -> Totals:
        """What the loop's receipts charged, as the fold charges it."""
        return self.view.loop.totals if self.view is not None else Totals()

    def extend(
        self, kinds: Kinds, receipts: list[ReceiptLine], bodies: list[dict[str, Any]]
    ) -> None:
        """Add the next receipts (in `seq` order, from `head + 1`) and their signed bodies."""
        for receipt, raw in zip(receipts, bodies, strict=True):
            if receipt.seq != self.head + 1:
                raise ValueError(f"{self.loop_id}: receipt {receipt.seq} after {self.head}")
            self._add(kinds, receipt, _typed(kinds, raw))
            self.head = receipt.seq

    def _add(self, kinds: Kinds, r: ReceiptLine, body: ReceiptBody | None) -> None:
        self.lines.append(
            Line(
                r.seq, r.receipt_id, r.kind, r.at, r.principal, r.effect, tuple(r.reasons),
                r.turn_id, r.verified, tuple(r.messages), subject(body),
            )
        )  # fmt: skip
        before = self.totals
        if body is None:
            self.unreadable += 1
        else:
            self._fold(kinds, body, r.digest)
        if r.seq == 1 or self.totals != before:
            for dim in BUDGET_DIMENSIONS:
                if r.seq == 1 or self.totals.units(dim) != before.units(dim):
                    self.series.setdefault(dim, []).append((r.at, r.seq, self.totals.used(dim)))
        if r.turn_id is not None:
            self._note_turn(r, body)
        data = body.data if body is not None else None
        if r.kind in CONTROL_KINDS and isinstance(data, (LoopStatusChanged, LoopStopped)):
            given = data.detail if isinstance(data, LoopStopped) else data.reason
            self.control = Control(r.kind, r.principal, r.at, given)  # a cancel's: its stop's

    def _fold(self, kinds: Kinds, body: ReceiptBody, digest: str) -> None:
        """Fold one receipt into the view; one that does not fit leaves the view as it was
        (the audit says why) and is counted unreadable."""
        try:
            self.view = kinds.apply(self.view, body, digest)
        except LoopwardenError:  # FoldError, or an opening whose policy does not parse
            self.unreadable += 1

    def _note_turn(self, r: ReceiptLine, body: ReceiptBody | None) -> None:
        """What a receipt says about its turn (one this version cannot read, by its kind)."""
        assert r.turn_id is not None
        turn = self.turns.setdefault(r.turn_id, TurnTools(r.turn_id))
        data = body.data if body is not None else None
        if isinstance(data, TurnClaimed):
            turn.todo_id, turn.agent = data.todo_id, r.principal
        elif isinstance(data, TurnReport):
            tools = tuple(tools_used(data).items())
            turn.reports.append(
                Report(r.seq, data.outcome, tools, r.effect == "deny", tuple(r.reasons))
            )
        elif isinstance(data, (ToolCall, ToolObserved)):
            _note_host(turn, r, data)
        elif r.kind not in TURN_KINDS:
            turn.other[r.kind] += 1


def _typed(kinds: Kinds, raw: dict[str, Any]) -> ReceiptBody | None:
    """A signed body as its kind's typed body (None where it is not one: tampered data)."""
    try:
        return kinds.parse_body(raw)
    except (ValidationError, ValueError, TypeError):
        return None


def _note_host(turn: TurnTools, r: ReceiptLine, data: ToolCall | ToolObserved) -> None:
    """Count one hook receipt for its tool."""
    use = turn.host.setdefault((data.tool, data.host_tool), HostUse(data.tool, data.host_tool))
    turn.hosts.add(data.host)
    if isinstance(data, ToolAdmitted):
        use.admitted += 1
    elif isinstance(data, ToolRefused):
        use.refused += 1
        use.refusals.update(r.reasons)
    elif isinstance(data, ToolObserved):
        use.ran += 1
        use.errored += data.errored


def tools_used(report: TurnReport) -> Counter[str]:
    """A report's `tools_used` as name → count."""
    tools: Counter[str] = Counter()
    for use in report.tools_used:
        tools[use.name] += use.count
    return tools


def subject(body: ReceiptBody | None) -> str:
    """The tools a receipt is about, for a list line: a report's, a host's call, an approval's."""
    data = body.data if body is not None else None
    if isinstance(data, TurnReport):
        return ", ".join(f"{name}×{n}" for name, n in tools_used(data).items())
    if isinstance(data, (ToolCall, ToolObserved)):
        return f"{data.tool} ({data.host_tool})"
    if isinstance(data, ApprovalRequested):
        return data.tool
    return ""


class Histories:
    """The cached histories of the loops a dashboard has shown (bounded, least recent out)."""

    def __init__(self, max_loops: int = MAX_LOOPS) -> None:
        self._max = max_loops
        self._histories: OrderedDict[str, LoopHistory] = OrderedDict()
        self._locks: dict[str, anyio.Lock] = {}

    async def get(self, store: Store, who: Principal, loop_id: str, head: int) -> LoopHistory:
        """The loop's history up to at least `head` (its head as the caller last read it).
        Raises what `journal` raises (`NotFound` for a loop the caller may not see)."""
        lock = self._locks.setdefault(loop_id, anyio.Lock())
        async with lock:
            history = self._histories.pop(loop_id, None) or LoopHistory(loop_id)
            while history.head < head:
                request = JournalRequest(
                    loop_id=loop_id, after_seq=history.head, limit=CHUNK, with_bodies=True
                )
                chunk = await journal(store, who, request)
                if not chunk.receipts:
                    break
                history.extend(store.kinds, chunk.receipts, chunk.bodies or [])
                await anyio.sleep(0)  # reads queued meanwhile (governance) go before the next chunk
            self._histories[loop_id] = history
            while len(self._histories) > self._max:
                dropped, _ = self._histories.popitem(last=False)
                self._locks.pop(dropped, None)
            return history
