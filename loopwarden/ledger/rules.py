"""The facts the policy evaluator decides on, built from projection rows, once.

The write path builds them from the rows it has proved; the judging audit (`judge.py`) from
the rows it has replayed. Both call these functions, so a claim, a report or a stop is judged
on exactly the facts it was decided on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Protocol

from loopwarden.clock import parse_time
from loopwarden.ledger.events import Evidence, ToolUse
from loopwarden.ledger.rows import ApprovalRow, LoopRow, TodoRow, TurnRow
from loopwarden.policy import decision as codes
from loopwarden.policy.decision import Reason
from loopwarden.policy.evaluate import ClaimFacts, ReportFacts, StopFacts
from loopwarden.statuses import ApprovalStatus, TodoStatus


class ReportLike(Protocol):
    """What `report_facts` reads of a report: the request, or the report a receipt carries."""

    @property
    def fence(self) -> int: ...
    @property
    def outcome(self) -> str: ...
    @property
    def evidence(self) -> Sequence[Evidence]: ...
    @property
    def tools_used(self) -> Sequence[ToolUse]: ...
    @property
    def approval_ids(self) -> Sequence[str]: ...


def claim_facts(
    loop: LoopRow,
    open_turns: Iterable[TurnRow],
    claims_in_window: int,
    agent: str,
    now: datetime,
    now_text: str,
) -> ClaimFacts:
    """What a claim by `agent` is decided on: leases live at `now` (expired ones are swept
    first), per agent, and the claims already in the rate window."""
    live = [t for t in open_turns if t.lease_expires_at >= now_text]
    return ClaimFacts(
        agent=agent,
        status=loop.status,
        now=now,
        totals=loop.totals,
        active=len(live),
        active_for_agent=sum(1 for t in live if t.agent == agent),
        claims_in_window=claims_in_window,
    )


def stop_facts(loop: LoopRow, now: datetime) -> StopFacts:
    return StopFacts(
        status=loop.status,
        totals=loop.totals,
        open_turns=len(loop.open_turns),
        todos_total=loop.todo_total,
        todos_done=loop.count(TodoStatus.DONE),
        failure_streak=loop.failure_streak,
        now=now,
    )


def covered_tools(
    approval_ids: Iterable[str],
    evidence: Iterable[Evidence],
    turn: TurnRow,
    approvals: dict[str, ApprovalRow],
    now: str,
) -> tuple[frozenset[str], tuple[Reason, ...]]:
    """Tools covered by the approvals a report cites, and what is wrong with any of them.

    An approval covers its tool for the turn that requested it, once: it must be approved, not
    expired, not consumed, and if it is bound to an artifact digest, the report's evidence must
    carry that digest.
    """
    covered, problems = set(), []
    digests = {e.digest for e in evidence if e.digest}
    for approval_id in dict.fromkeys(approval_ids):
        approval = approvals.get(approval_id)
        problem = None
        if approval is None or approval.turn_id != turn.turn_id:
            problem = "does not exist for this turn"
        elif approval.status != ApprovalStatus.APPROVED:
            problem = f"is {approval.status}"
        elif approval.expires_at is not None and now >= approval.expires_at:
            problem = f"expired at {approval.expires_at}"
        elif approval.artifact_digest and approval.artifact_digest not in digests:
            problem = (
                f"is bound to artifact {approval.artifact_digest}, which no evidence item carries"
            )
        if problem is not None or approval is None:
            problems.append(Reason(codes.APPROVAL_INVALID, f"approval {approval_id} {problem}"))
        else:
            covered.add(approval.tool)
    return frozenset(covered), tuple(problems)


def report_facts(
    agent: str,
    loop: LoopRow,
    turn: TurnRow,
    todo: TodoRow | None,
    approvals: dict[str, ApprovalRow],
    report: ReportLike,
    now: datetime,
    now_text: str,
) -> ReportFacts:
    """What a report on `turn` is decided on."""
    covered, problems = covered_tools(
        report.approval_ids, report.evidence, turn, approvals, now_text
    )
    return ReportFacts(
        agent=agent,
        loop_status=loop.status,
        turn_agent=turn.agent,
        turn_status=turn.status,
        turn_fence=turn.fence,
        todo_fence=todo.fence if todo else -1,
        given_fence=report.fence,
        lease_expires_at=parse_time(turn.lease_expires_at),
        now=now,
        outcome=report.outcome,
        has_evidence=bool(report.evidence),
        tools=tuple(t.name for t in report.tools_used),
        approved_tools=covered,
        approval_problems=problems,
    )


def todo_graph_problem(ids: list[str], deps: dict[str, tuple[str, ...]]) -> str | None:
    """Why a set of todos is not a valid graph (a repeated id, an unknown or own dependency, a
    cycle), or None."""
    seen: set[str] = set()
    for todo_id in ids:
        if todo_id in seen:
            return f"todo id {todo_id!r} is used twice"
        seen.add(todo_id)
    for todo_id, needs in deps.items():
        for dep in needs:
            if dep == todo_id:
                return f"todo {todo_id!r} depends on itself"
            if dep not in seen:
                return f"todo {todo_id!r} depends on unknown todo {dep!r}"
    stuck = _on_cycles(ids, deps)
    return f"todo dependencies form a cycle among {', '.join(stuck[:5])}" if stuck else None


def _on_cycles(ids: list[str], deps: dict[str, tuple[str, ...]]) -> list[str]:
    """Kahn's algorithm: the todos left over sit on a cycle (sorted)."""
    indegree = {t: len(deps.get(t, ())) for t in ids}
    dependents: dict[str, list[str]] = {t: [] for t in ids}
    for t in ids:
        for d in deps.get(t, ()):
            dependents[d].append(t)
    ready = [t for t, n in indegree.items() if n == 0]
    while ready:
        for nxt in dependents[ready.pop()]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    return sorted(t for t, n in indegree.items() if n > 0)
