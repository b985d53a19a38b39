"""The facts the policy evaluator decides on, built from projection rows, once.

The write path builds them from the rows it has proved; the judging audit (`judge.py`) from
the rows it has replayed. Both call these functions, so a claim, an act on a turn (a report, a
heartbeat, an approval request) or a stop is judged on exactly the facts it was decided on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from loopwarden.clock import format_time
from loopwarden.errors import InvalidInput
from loopwarden.kernel.state.events import Evidence, ToolUse, Usage
from loopwarden.kernel.state.rows import ApprovalRow, LoopRow, TodoRow, TurnRow
from loopwarden.policy.budgets import Totals
from loopwarden.policy.decision import Reason, ReasonCode
from loopwarden.policy.evaluate import (
    ClaimFacts,
    ReportFacts,
    StopFacts,
    ToolCallFacts,
    TurnFacts,
    explain,
)
from loopwarden.policy.model import LoopPolicy
from loopwarden.statuses import ApprovalStatus, TodoStatus, TurnStatus


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
    @property
    def usage(self) -> Usage: ...


def claim_facts(
    loop: LoopRow,
    open_turns: Iterable[TurnRow],
    claims_in_window: int,
    agent: str,
    now: datetime,
    lease_seconds: int,
) -> ClaimFacts:
    """What a claim by `agent` is decided on: leases live at `now` (expired ones are swept
    first), per agent, and the claims already in the rate window."""
    live = [t for t in open_turns if t.lease_expires_at >= now]
    return ClaimFacts(
        agent=agent,
        status=loop.status,
        now=now,
        totals=loop.totals,
        active=len(live),
        active_for_agent=sum(1 for t in live if t.agent == agent),
        claims_in_window=claims_in_window,
        host_attached=host_attached(loop, agent, now, lease_seconds),
    )


def host_attached(loop: LoopRow, agent: str, now: datetime, lease_seconds: int) -> bool:
    """Whether `agent`'s host hooks spoke for this loop within the last lease window."""
    seen = loop.hosts.get(agent)
    return seen is not None and seen.at >= now - timedelta(seconds=lease_seconds)


def model_counts(totals: Totals) -> tuple[tuple[str, int], ...]:
    """The model dimensions an agent reports (calls, tokens, cost), in their integer units,
    where they are not zero."""
    out = []
    for name in ("model_calls", "input_tokens", "output_tokens", "cost_usd"):
        units = totals.units(name)
        if units:
            out.append((name, units))
    return tuple(out)


def observed_counts(turn: TurnRow) -> tuple[tuple[str, int], ...]:
    """What the host's hooks saw run in `turn`, per policy tool name (sorted)."""
    return tuple((tool, turn.observed_calls(tool)) for tool in sorted(turn.observed))


def tool_calls_due(report: ReportLike, usage_tool_calls: int, turn: TurnRow) -> int:
    """What a report charges against max_tool_calls beyond what its turn was charged before
    (`turn.tool_calls_charged`: earlier reports, its lease's expiry, its loop's close).

    The turn's total becomes the largest of what the report claims, the sum of its listed
    counts (which name every call of the turn) and what the host observed in it. On an open
    turn a report's usage is what came since the last report, so it claims the total charged
    so far plus that usage; on a closed one (the first report after an expiry or a close) it
    is the whole turn's. What was charged before is never charged again."""
    listed = sum(t.count for t in report.tools_used)
    before = turn.tool_calls_charged
    claimed = usage_tool_calls + (before if turn.status == TurnStatus.OPEN else 0)
    return max(claimed, listed, turn.observed_total, before) - before


def legacy_tool_calls_charged(report: ReportLike, usage_tool_calls: int, turn: TurnRow) -> int:
    """What a report of release 0.1.x charged (no `tool_calls_before`): the largest of the
    usage, the listed counts and the observed calls, whatever the turn was charged before."""
    listed = sum(t.count for t in report.tools_used)
    return max(usage_tool_calls, listed, turn.observed_total)


def unsettled_calls(turn: TurnRow) -> int:
    """The calls the host observed in `turn` beyond what the turn was charged: what its
    lease's expiry or its loop's close charges, and what the pre-tool check counts as spent."""
    return max(0, turn.observed_total - turn.tool_calls_charged)


CANCELLABLE = (TodoStatus.OPEN, TodoStatus.BLOCKED)
SETTLED = (TodoStatus.DONE, TodoStatus.CANCELLED)
"""A todo no longer owed: done, or cancelled by an operator."""


def cancel_problem(todo: TodoRow, todos: Iterable[TodoRow]) -> str | None:
    """Why `todo` cannot be cancelled (None if it can): only an open or blocked todo can, and
    only while no unfinished todo depends on it (cancel those first)."""
    if todo.status not in CANCELLABLE:
        return f"todo {todo.todo_id!r} is {todo.status}: only an open or blocked todo is cancelled"
    waiting = sorted(
        t.todo_id for t in todos if todo.todo_id in t.depends_on and t.status not in SETTLED
    )
    if waiting:
        return f"todo {todo.todo_id!r} is a dependency of {', '.join(waiting)}: cancel those first"
    return None


def stop_facts(loop: LoopRow, now: datetime) -> StopFacts:
    return StopFacts(
        status=loop.status,
        totals=loop.totals,
        open_turns=len(loop.open_turns),
        todos_total=loop.todo_total,
        todos_done=loop.count(TodoStatus.DONE) + loop.count(TodoStatus.CANCELLED),
        failure_streak=loop.failure_streak,
        now=now,
    )


def covered_tools(
    approval_ids: Iterable[str],
    evidence: Iterable[Evidence],
    turn: TurnRow,
    approvals: dict[str, ApprovalRow],
    now: datetime,
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
            problem = f"expired at {format_time(approval.expires_at)}"
        elif approval.artifact_digest and approval.artifact_digest not in digests:
            problem = (
                f"is bound to artifact {approval.artifact_digest}, which no evidence item carries"
            )
        if problem is not None or approval is None:
            problems.append(
                Reason(ReasonCode.APPROVAL_INVALID, f"approval {approval_id} {problem}")
            )
        else:
            covered.add(approval.tool)
    return frozenset(covered), tuple(problems)


def turn_facts(
    agent: str, loop: LoopRow, turn: TurnRow, todo: TodoRow | None, fence: int, now: datetime
) -> TurnFacts:
    """What an act of `agent` on `turn` with `fence` at `now` is decided on first (a report, a
    heartbeat, an approval request): the turn's owner and liveness. A missing todo has fence -1,
    which no turn's fence matches."""
    return TurnFacts(
        agent=agent,
        loop_status=loop.status,
        turn_agent=turn.agent,
        turn_status=turn.status,
        turn_fence=turn.fence,
        todo_fence=todo.fence if todo else -1,
        given_fence=fence,
        lease_expires_at=turn.lease_expires_at,
        now=now,
    )


def approvals_found(
    policy: LoopPolicy,
    report: ReportLike,
    turn: TurnRow,
    approvals: Iterable[ApprovalRow],
    now: datetime,
) -> tuple[str, ...]:
    """The approvals a report did not cite that count for it: for each approval-gated tool it
    names that no cited approval covers, the earliest approval of `turn` for that tool that is
    approved, unexpired, unconsumed and (if bound to an artifact) matched by the evidence. An
    operator's approval for this very turn is not lost because the agent forgot to cite it."""
    known = {a.approval_id: a for a in approvals}
    cited = dict.fromkeys(report.approval_ids)
    covered, _ = covered_tools(cited, report.evidence, turn, known, now)
    digests = {e.digest for e in report.evidence if e.digest}
    found = []
    for tool in dict.fromkeys(t.name for t in report.tools_used):
        if tool in covered or explain(policy, tool).rule != "approval":
            continue
        usable = [
            a
            for a in known.values()
            if a.approval_id not in cited
            and a.turn_id == turn.turn_id
            and a.tool == tool
            and a.status == ApprovalStatus.APPROVED
            and (a.expires_at is None or now < a.expires_at)
            and (not a.artifact_digest or a.artifact_digest in digests)
        ]
        if usable:
            found.append(min(usable, key=lambda a: (a.requested_at, a.approval_id)).approval_id)
    return tuple(found)


def report_facts(
    agent: str,
    loop: LoopRow,
    turn: TurnRow,
    todo: TodoRow | None,
    approvals: dict[str, ApprovalRow],
    report: ReportLike,
    now: datetime,
    found: Sequence[str] = (),
) -> ReportFacts:
    """What a report on `turn` is decided on: `found`, the approvals it did not cite that
    count for it (`approvals_found`), cover tools as the cited ones do."""
    cited = (*report.approval_ids, *found)
    covered, problems = covered_tools(cited, report.evidence, turn, approvals, now)
    return ReportFacts(
        **vars(turn_facts(agent, loop, turn, todo, report.fence, now)),
        outcome=report.outcome,
        has_evidence=bool(report.evidence),
        tools=tuple(t.name for t in report.tools_used),
        approved_tools=covered,
        approval_problems=problems,
        reported=tuple((t.name, t.count) for t in report.tools_used),
        observed=observed_counts(turn),
        model_reported=model_counts(report.usage.charge()),
        model_observed=model_counts(turn.model),
    )


def agent_turn(open_turns: Iterable[TurnRow], agent: str) -> TurnRow | None:
    """The open turn a hook event of `agent` counts against: its latest claimed."""
    mine = [t for t in open_turns if t.agent == agent]
    return max(mine, key=lambda t: t.number) if mine else None


def tool_call_facts(
    loop: LoopRow,
    open_turns: Sequence[TurnRow],
    approvals: Iterable[ApprovalRow],
    agent: str,
    call: tuple[str, str, str | None],
    now: datetime,
    *,
    internal: bool = False,
    once: bool = False,
) -> ToolCallFacts:
    """What a pre-tool decision for `agent` is made on: its open turn, the approvals that
    cover tools in it, and the loop's tool calls so far (charged, plus those observed in open
    turns and not yet charged). `call` is (host tool, policy tool, command line); `internal`
    says the host tool is host-internal (`policy/hosts.is_internal`). `once` (the MCP
    gateway's rule): an approval covers one call, so a tool is covered while the turn holds more
    approvals of it than calls of it were admitted; otherwise one covers the tool for the turn."""
    host_tool, tool, command = call
    turn = agent_turn(open_turns, agent)
    live = [
        a.tool
        for a in approvals
        if turn is not None
        and a.turn_id == turn.turn_id
        and a.status == ApprovalStatus.APPROVED
        and (a.expires_at is None or now < a.expires_at)
    ]
    approved = frozenset(live)
    if once and turn is not None:
        approved = frozenset(
            name for name in approved if live.count(name) > turn.observed_admitted(name)
        )
    return ToolCallFacts(
        agent=agent,
        loop_id=loop.loop_id,
        loop_status=loop.status,
        turn_id=turn.turn_id if turn is not None else None,
        tool=tool,
        host_tool=host_tool,
        command=command,
        approved=approved,
        tool_calls=loop.totals.tool_calls + sum(unsettled_calls(t) for t in open_turns),
        lease_expired=turn is not None and turn.lease_expires_at < now,
        internal=internal,
    )


def check_todo_graph(ids: list[str], deps: dict[str, tuple[str, ...]]) -> None:
    """`InvalidInput` unless todo ids are unique, dependencies name known todos, and there is
    no cycle (the fold enforces the same rule on every receipt)."""
    problem = todo_graph_problem(ids, deps)
    if problem is not None:
        raise InvalidInput(problem)


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
