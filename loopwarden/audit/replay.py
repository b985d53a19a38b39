"""The in-depth replay of loops: each receipt's body, chain, judged decision and fold.

`Replay.receipt` is what `audit` asks of every receipt in its scope after the envelope's own
checks; it reports what is wrong through a `Sink` and asks `window` for the key's signing window
in between (that check follows the whole log's order, so a partition of the loops replayed in
a worker process hands it back to the audit, see `partitions.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from loopwarden.audit.findings import ENVELOPE_PROBLEMS, FindingCode
from loopwarden.kernel.log.seals import PAYLOAD_TYPE, open_envelope, receipt_id_for
from loopwarden.kernel.state.charges import PoolLedger, before, charge, charges, pool_of
from loopwarden.kernel.state.events import ReceiptBody
from loopwarden.kernel.state.fold import FoldError, chain_problem
from loopwarden.kernel.state.judge import Judge, Verdict
from loopwarden.kernel.state.legality import VerdictRule
from loopwarden.kernel.state.rows import LoopView
from loopwarden.kernel.store.reader import JournalRow
from loopwarden.kinds import KINDS

WHERE = ("loop_id", "seq", "receipt_id", "leaf_index")
"""What a finding about a journal row points at: the row's own fields of these names."""


def where_of(row: JournalRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in WHERE}


class Sink(Protocol):
    """Where findings go: a `Report`, or a worker's record of them."""

    def add(self, code: FindingCode | str, message: str, **where: Any) -> None: ...


Window = Callable[[JournalRow, datetime, str | None], None]
"""The signing-window check of one receipt: its row, its signed time, the key id it names."""


@dataclass
class LoopChain:
    seq: int = 0
    digest: str | None = None
    view: LoopView | None = None
    broken: bool = False


class Replay:
    """Every loop's chain, judge and fold, receipt by receipt in journal order. `pools`:
    replay budget pools (only with the whole journal: a loop's share is not enough)."""

    def __init__(
        self, *, pools: bool, keys: set[tuple[str, str]] | None = None, keys_known: bool
    ) -> None:
        self.chains: dict[str, LoopChain] = {}
        self.pools = PoolLedger() if pools else None
        self.judge = Judge(KINDS, keys_known=keys_known, pools=self.pools, keys=keys)

    def receipt(
        self,
        sink: Sink,
        window: Window,
        row: JournalRow,
        digest: str,
        payload: tuple[str, bytes] | None,
        key_id: str | None,
    ) -> None:
        """Everything about one receipt but its signature (checked in bulk, see `audit`)."""
        chain = self.chains.setdefault(row.loop_id, LoopChain())
        body = _body(sink, row, digest, payload)
        if body is None:
            chain.broken = True
            return
        if (body.loop_id, body.seq, body.kind, body.at) != (row.loop_id, row.seq, row.kind, row.at):
            sink.add(
                FindingCode.INDEX_MISMATCH,
                "the journal's index columns disagree with the signed body",
                **where_of(row),
            )
        window(row, body.at, key_id)
        _chained(sink, chain, row, body, digest)
        if chain.broken:
            return
        judged(sink, self.judge, chain.view, body, **where_of(row))
        try:
            self._fold(chain, body, digest)
        except FoldError as exc:
            sink.add(
                FindingCode.PROJECTION_MISMATCH,
                f"the receipt does not fold: {exc}",
                **where_of(row),
            )
            chain.broken = True

    def _fold(self, chain: LoopChain, body: ReceiptBody, digest: str) -> None:
        """Fold one judged receipt: a pool's into the replayed pool (when pools are replayed),
        a loop's into its view, charging the pools it draws from (`FoldError` if impossible)."""
        pools = self.pools
        step = KINDS[body.kind].pool
        if step is not None:
            if pools is not None:
                name = pool_of(body.loop_id) or ""
                pools.put_pool(step.fold(pools.rows.get(name), body, digest))
            return
        prior = before(chain.view, KINDS.touched(body).turns) if pools and pools.rows else None
        chain.view = KINDS.apply(chain.view, body, digest)
        if prior is not None and pools is not None:
            charge(pools, charges(prior, chain.view, body, pools), body.at)
        self.judge.after(chain.view, body)

    def ending(self) -> dict[str, list[Verdict]]:
        """The judge's verdicts when the journal ends (stops still owed), by loop."""
        views = {
            lid: c.view for lid, c in self.chains.items() if c.view is not None and not c.broken
        }
        return self.judge.end(views)


def judged(
    report: Sink, judge: Judge, view: LoopView | None, body: ReceiptBody, **where: Any
) -> None:
    """Ask the judge about one receipt; a verdict is a `decision_illegal` finding. A receipt the
    judge cannot even read the facts of is one too: an audit fails closed."""
    try:
        verdicts = judge.step(view, body)
    except (LookupError, ValueError, TypeError) as exc:
        verdicts = [
            Verdict(VerdictRule.UNJUDGEABLE, f"its facts cannot be rebuilt ({type(exc).__name__})")
        ]
    for verdict in verdicts:
        message = f"{body.kind} #{body.seq}: {verdict.message}"
        report.add(
            FindingCode.DECISION_ILLEGAL, message, kind=str(body.kind), rule=verdict.rule, **where
        )


def _body(
    sink: Sink, row: JournalRow, digest: str, payload: tuple[str, bytes] | None
) -> ReceiptBody | None:
    """The receipt's signed body, with what is wrong with its envelope, digest or id reported;
    None (reported) if the body does not match the receipt schema."""
    body = None
    if payload is not None and payload[0] == PAYLOAD_TYPE:
        body = KINDS.parse_payload(payload[1])  # the common case: one pass, nothing wrong
    opened = None if body is not None else open_envelope(row.envelope, None, canonical=False)
    for problem in opened.problems if opened is not None else ():
        sink.add(problem, ENVELOPE_PROBLEMS[problem], **where_of(row))
    if digest != row.digest or receipt_id_for(digest) != row.receipt_id:
        sink.add(
            FindingCode.DIGEST_MISMATCH,
            "the stored digest or receipt id does not match the envelope",
            **where_of(row),
        )
    if body is not None:
        return body
    assert opened is not None
    try:
        return KINDS.parse_body(opened.body)  # what is wrong with it, step by step
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        sink.add(
            FindingCode.SCHEMA_INVALID,
            f"the body does not match the receipt schema ({where}: {first['msg']})",
            **where_of(row),
        )
        return None


def _chained(sink: Sink, chain: LoopChain, row: JournalRow, body: ReceiptBody, digest: str) -> None:
    """Check the receipt against its loop's chain (seq, prev) and move the chain on."""
    broken = chain_problem(chain.seq, chain.digest, body)
    if broken == "seq_gap":
        sink.add(FindingCode.SEQ_GAP, f"seq {body.seq} follows seq {chain.seq}", **where_of(row))
    elif broken == "prev_mismatch":
        sink.add(
            FindingCode.PREV_MISMATCH,
            "prev does not name the previous receipt of this loop",
            **where_of(row),
        )
    chain.broken = chain.broken or broken is not None
    chain.seq, chain.digest = body.seq, digest
