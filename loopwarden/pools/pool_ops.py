"""Budget pools: an operator defines (creates or changes), pauses and resumes them; anyone
with an operator's view lists them with their usage. A loop draws from the pools its policy
names; a claim is admitted only if every one has room (`claim.py`, `kernel/state/charges.py`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import Field

from loopwarden.canonical import digest_of
from loopwarden.errors import Conflict, NotFound
from loopwarden.kernel.runner.operation import OPERATOR_CALLERS, Call, Operation
from loopwarden.kernel.runner.results import BudgetOut, Model, budgets_out_of
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import did_you_mean
from loopwarden.kernel.state.charges import PoolReads, drawn
from loopwarden.kernel.state.events import MAX_SUMMARY, ReceiptKind, Timestamp
from loopwarden.kernel.state.rows import PoolRow
from loopwarden.kernel.store.reader import Reader, Rows
from loopwarden.kernel.store.store import Txn
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.policy.loader import pool_policy_from_data
from loopwarden.policy.model import POOL_NAME_RE, LoopPolicy
from loopwarden.policy.pool_policy import Window, window_end, window_start
from loopwarden.pools.pool_kinds import PoolDefined, PoolStatusChanged
from loopwarden.statuses import PoolStatus

PoolName = Field(pattern=POOL_NAME_RE.pattern, description="The pool's name, e.g. team-a.")


class PoolDefineRequest(Model):
    name: str = PoolName
    policy: dict[str, Any] = Field(
        description="budgets (max_cost_usd, max_turns, …), window (total, 1h or 1d, UTC), "
        "max_concurrent_turns, agents (bound in every loop)."
    )
    create_only: bool = Field(default=False, description="Refuse if the pool exists already.")


class PoolLine(Model):
    """A budget pool as a loop's agent sees it (quota): its window's usage and open turns."""

    name: str
    status: PoolStatus
    window: Window
    resets_at: Timestamp | None = Field(description="When the current window ends (None: never).")
    budgets: dict[str, BudgetOut] = Field(description="The current window's usage.")
    active_turns: int
    max_concurrent_turns: int | None


class PoolOut(PoolLine):
    """A budget pool as an operator sees it."""

    policy_digest: str
    window_start: str | None = Field(description="The current window's start (None: total).")
    agents: list[str] = Field(description="Agents drawing from the pool in every loop.")
    loops: list[str] = Field(description="Open loops whose policy names the pool.")
    updated_at: Timestamp


class PoolDefineResult(Model):
    pool: PoolOut
    created: bool
    changed: bool = Field(description="False when the policy was already this one.")
    receipt_id: str | None


def pool_line(reader: PoolReads, row: PoolRow, now: datetime) -> PoolLine:
    """A pool's current window, as `quota` shows it beside the loop's budgets."""
    policy = row.policy
    end = window_end(policy.window, now)
    return PoolLine(
        name=row.name,
        status=row.status,
        window=policy.window,
        resets_at=end,
        budgets=budgets_out_of(
            policy.budgets, reader.usage(row.name, window_start(policy.window, now))
        ),
        active_turns=row.active_turns,
        max_concurrent_turns=policy.max_concurrent_turns,
    )


def drawn_lines(reader: Rows, policy: LoopPolicy, agent: str, now: datetime) -> list[PoolLine]:
    """The pools a claim by `agent` in a loop with `policy` draws from, each as a line."""
    rows = reader.pools()
    return [
        pool_line(reader, rows[name], now) for name in drawn(rows, policy, agent) if name in rows
    ]


def open_members(reader: Reader) -> dict[str, list[str]]:
    """By pool name, the open loops whose policy names it (one pass over the loops)."""
    members: dict[str, list[str]] = {}
    for loop in reader.loops():
        if not loop.status.closed:
            for name in reader.policy(loop.policy_digest).pools or ():
                members.setdefault(name, []).append(loop.loop_id)
    return members


def pool_out(
    reader: Reader, row: PoolRow, now: datetime, members: dict[str, list[str]] | None = None
) -> PoolOut:
    """A pool's state as the operator reads it: the current window's usage, its open loops
    (`members`, from `open_members`, when several pools are shown at once)."""
    loops = (open_members(reader) if members is None else members).get(row.name, [])
    return PoolOut(
        **pool_line(reader, row, now).model_dump(),
        policy_digest=row.policy_digest,
        window_start=window_start(row.policy.window, now) or None,
        agents=list(row.policy.agents),
        loops=loops,
        updated_at=row.updated_at,
    )


@operation(access="write", callers=OPERATOR_CALLERS, tool=False)
def pool_define(call: Call[Txn], req: PoolDefineRequest) -> PoolDefineResult:
    """Operator only: create a budget pool, or change its policy.
    \f
    Seals `pool.defined` under `pool:<name>` with the normalized policy and its digest. The
    same policy again seals nothing (`changed` false). An invalid policy is `PolicyError`; an
    existing pool with `create_only` is `Conflict`.
    """
    policy = pool_policy_from_data(req.policy, f"pool {req.name}")
    document = policy.model_dump(mode="json", exclude_none=True)
    digest = digest_of(document)
    tx = call.tx
    tx.rows.own_pool_catalog()
    existing = tx.rows.pools().get(req.name)
    if existing is not None and req.create_only:
        raise Conflict(f"pool {req.name!r} exists already (change it with `pool set`)")
    if existing is not None and existing.policy_digest == digest:
        return PoolDefineResult(
            pool=pool_out(tx.unproved, existing, tx.now),
            created=False,
            changed=False,
            receipt_id=None,
        )
    sealed = tx.append_pool(
        req.name, ReceiptKind.POOL_DEFINED, call.who, PoolDefined(policy=document), digest
    )
    return PoolDefineResult(
        pool=pool_out(tx.unproved, sealed.pool, tx.now),
        created=existing is None,
        changed=True,
        receipt_id=sealed.receipt_id,
    )


class PoolControlRequest(Model):
    name: str = PoolName
    reason: str = Field(default="", max_length=MAX_SUMMARY, description="The operator's note.")


class PoolControlResult(Model):
    name: str
    status: PoolStatus
    receipt_id: str


def _control(kind: ReceiptKind, action: str, source: PoolStatus) -> Operation[Any, Any]:
    """Pause and resume differ only in the transition they seal."""
    code = ReasonCode.PAUSED if kind == ReceiptKind.POOL_PAUSED else ReasonCode.RESUMED

    def body(call: Call[Txn], req: PoolControlRequest) -> PoolControlResult:
        call.tx.rows.own_pool_catalog()  # a paused pool refuses every claim decided after it
        row = call.tx.rows.pools().get(req.name)
        if row is None:
            raise NotFound(no_pool(req.name, call.tx.rows.pools()))
        if row.status != source:
            raise Conflict(f"cannot {action} pool {req.name!r}: it is {row.status}")
        reason = Reason(code, req.reason or f"{action} by operator {call.who.id}")
        sealed = call.tx.append_pool(
            req.name,
            kind,
            call.who,
            PoolStatusChanged(reason=req.reason),
            row.policy_digest,
            decision=Decision("allow", (reason,)),
        )
        return PoolControlResult(
            name=req.name, status=sealed.pool.status, receipt_id=sealed.receipt_id
        )

    body.__doc__ = f"Operator only: {action} a budget pool (seals `{kind}`)."
    declare = operation(name=f"pool_{action}", access="write", callers=OPERATOR_CALLERS, tool=False)
    return declare(body)


pool_pause = _control(ReceiptKind.POOL_PAUSED, "pause", PoolStatus.ACTIVE)
pool_resume = _control(ReceiptKind.POOL_RESUMED, "resume", PoolStatus.PAUSED)

POOL_CONTROLS: dict[str, Operation[Any, Any]] = {"pause": pool_pause, "resume": pool_resume}
"""The operator's pool controls by action name."""


def no_pool(name: str, known: Mapping[str, object]) -> str:
    """The message for a pool name that names none (pools are an operator's to see)."""
    return f"no pool named {name!r}" + did_you_mean(
        difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    )


class PoolsRequest(Model):
    name: str | None = Field(default=None, description="Only this pool.")


class PoolList(Model):
    pools: list[PoolOut]


@operation(access="read", callers=OPERATOR_CALLERS, tool=False)
def pools(call: Call[Reader], req: PoolsRequest) -> PoolList:
    """Operator only: the budget pools, each with its current window's usage and its loops.
    \f
    `NotFound` for a named pool that does not exist.
    """
    rows = call.tx.rows.pools()
    if req.name is not None:
        if req.name not in rows:
            raise NotFound(no_pool(req.name, rows))
        rows = {req.name: rows[req.name]}
    now = call.now
    members = open_members(call.tx)
    return PoolList(pools=[pool_out(call.tx, row, now, members) for row in rows.values()])
