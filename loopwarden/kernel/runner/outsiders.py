"""Refusals of outsiders: recorded, never silent, and bounded in what they add to a journal.

An outsider is a caller whose loop's policy does not admit it. The runner answers its writes
exactly as for a loop that does not exist, and records the refusal here: the first refusal of
an outsider in a loop is sealed through the operation's `refuse` (so operators see it in the
journal), and for `WINDOW` after it every further refusal of that outsider in that loop is only
counted on the sealed one's row. The next refusal after the window is sealed again and carries
the count of those answered since (reason `refusals_suppressed`). So an outsider adds at most
one receipt per loop per window however fast it calls, and every refusal is accounted for: in
a receipt, or in the count the next receipt will carry (`Reader.outsider_refusals`).

The rows also mark the outsiders' receipts, so the projection's recent view leaves them out:
no one outside a loop can push its own activity out of view.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from loopwarden.kernel.runner.operation import Call, Refuse
from loopwarden.kernel.store.reader import OutsiderRefusal
from loopwarden.kernel.store.store import Txn
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.principals import Principal

WINDOW = timedelta(seconds=60)


def outsider_decision(who: Principal, last: OutsiderRefusal | None) -> Decision:
    """The refusal sealed for `who`: not admitted, and how many refusals went unsealed since
    the previous sealed one (`last`)."""
    reasons = [
        Reason(ReasonCode.AGENT_NOT_ALLOWED, f"agent {who.id!r} is not in the policy's agents")
    ]
    if last is not None and last.suppressed:
        reasons.append(
            Reason(
                ReasonCode.REFUSALS_SUPPRESSED,
                f"{last.suppressed} more refusal(s) of {who.id!r} were answered but not sealed "
                f"since seq {last.seq} (at most one is sealed per {int(WINDOW.total_seconds())} s)",
            )
        )
    return Decision("deny", tuple(reasons))


def refuse_outsider(call: Call[Txn], refuse: Refuse[Any, Any], req: Any) -> None:
    """Record an outsider's refusal: sealed through `refuse` unless one was sealed for it in
    this loop within `WINDOW`, in which case it is counted on that one."""
    tx, who = call.tx, call.who
    loop_id = call.loop.loop_id
    last = tx.unproved.last_outsider_refusal(loop_id, who.id)
    if last is not None and last.at > tx.now - WINDOW:
        tx.count_suppressed_refusal(loop_id, last.seq)
        return
    before = call.loop.head_seq
    refuse(call, req, outsider_decision(who, last))
    for seq in range(before + 1, call.loop.head_seq + 1):
        tx.note_outsider_refusal(loop_id, seq, who.id)
