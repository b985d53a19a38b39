"""The gateway's two operations: `model_admit` decides a call before it goes upstream (a refusal
is sealed, `model.refused`), `model_settle` seals what an admitted call spent (`model.called`),
charging its loop, the agent's open turn and the pools they draw from in the same transaction.

Both are called by the gateway (`gateway.py`) for an `observer` speaking for one agent (its
gateway token's), through the one runner. What calls in flight hold (`reservations.py`) comes
in the request: the gateway admits one call at a time per process, reading the reservations
before the transaction and holding the new one after it commits, so each admission sees every
reservation made before it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from loopwarden.kernel.runner.operation import OBSERVER_CALLERS, Call
from loopwarden.kernel.runner.refusals import refuse_request
from loopwarden.kernel.runner.results import Model, ReasonOut, reasons_out
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.charges import drawn
from loopwarden.kernel.state.events import LoopId, ModelSpend, ReceiptKind
from loopwarden.kernel.state.facts import agent_turn
from loopwarden.kernel.state.rows import TurnRow
from loopwarden.kernel.store.reader import Reader
from loopwarden.kernel.store.store import Txn
from loopwarden.model_gateway.model_kinds import ModelCall, ModelCalled, ModelRefused
from loopwarden.policy.budgets import Totals
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.policy.model_calls import ModelCallFacts, budget_reasons, evaluate_model_call
from loopwarden.policy.pool_policy import window_start
from loopwarden.statuses import LoopStatus, PoolStatus


class AdmitRequest(ModelCall):
    """A model call to decide: what its request names, its reservation, and what calls in
    flight hold in its loop and in each pool (`pools_in_flight`, by name)."""

    loop_id: LoopId
    priced: bool
    reserve: ModelSpend
    in_flight: ModelSpend = ModelSpend()
    pools_in_flight: dict[str, ModelSpend] = Field(default_factory=dict, max_length=1000)


class Admission(Model):
    admitted: bool
    reasons: list[ReasonOut]
    message: str = Field(description="Why not, for a person: which loop, which budget, what to do.")
    retry: bool = Field(description="Refused only for what calls in flight hold: worth a retry.")
    pools: list[str] = Field(description="The pools the call draws from (its reservation's).")
    turn_id: str | None
    receipt_id: str | None = Field(description="The refusal's receipt, if refused.")
    tokens: str = Field(
        default="", description="The tokens version of the snapshot decided on (model_check)."
    )


class SettleRequest(ModelCalled):
    loop_id: LoopId


class Settlement(Model):
    receipt_id: str
    turn_id: str | None


def _rows(call: Call[Any]) -> Any:
    """What a call reads its rows from: a write's proved rows, or a read's snapshot (the same
    methods on both)."""
    return call.tx.rows if isinstance(call.tx, Txn) else call.tx


def _turn(call: Call[Any]) -> TurnRow | None:
    return agent_turn(_rows(call).open_turns(call.loop.loop_id), call.who.id)


def _pools(call: Call[Any], turn: TurnRow | None) -> list[str]:
    """The pools a call by the caller draws from now: its open turn's, else the loop's and
    the agent's."""
    if turn is not None:
        return list(turn.pools)
    rows = _rows(call)
    policy = rows.policy(call.loop.policy_digest)
    return drawn(rows.pools(), policy, call.who.id)


def _pool_reasons(call: Call[Any], req: AdmitRequest, names: list[str]) -> list[Reason]:
    """Why the pools refuse the call: paused, or a budget that its reservation does not fit."""
    tx, reserve = _rows(call), req.reserve.charge()
    tx.hold(names)
    rows, reasons = tx.pools(), []
    for name in names:
        row = rows.get(name)
        if row is None:
            reasons.append(Reason(ReasonCode.POOL_UNKNOWN, f"pool {name!r} does not exist"))
            continue
        if row.status == PoolStatus.PAUSED:
            reasons.append(Reason(ReasonCode.POOL_PAUSED, f"pool {name!r} is paused"))
        used = tx.usage(name, window_start(row.policy.window, call.now))
        held = req.pools_in_flight.get(name, ModelSpend()).charge()
        remedy = f"an operator raises it with loopwarden pool set {name} (its new limits)"
        for reason in budget_reasons(
            row.policy.budgets, used, held, reserve, f"pool {name}", remedy
        ):
            reasons.append(Reason(ReasonCode.POOL_EXHAUSTED, reason.message))
    return reasons


def _decide(call: Call[Any], req: AdmitRequest) -> tuple[Decision, list[str], TurnRow | None]:
    """The decision on a call (`model_call_reasons`, then its pools'), the pools it draws
    from and the agent's open turn: the same on a snapshot (`model_check`) and in the write
    transaction that seals a refusal (`model_admit`)."""
    loop = call.loop
    policy = _rows(call).policy(loop.policy_digest)
    turn = _turn(call)
    pools = _pools(call, turn)
    decision = evaluate_model_call(
        policy, _facts(call, req, req.in_flight.charge()), digest=loop.policy_digest
    )
    pooled = _pool_reasons(call, req, pools) if loop.status == LoopStatus.ACTIVE else []
    if pooled:
        decision = Decision("deny", decision.reasons + tuple(pooled), loop.policy_digest)
    return decision, pools, turn


def _refuse(call: Call[Txn], req: AdmitRequest, decision: Decision) -> Admission:
    """A caller the loop does not admit: recorded (bounded, `outsiders.py`), refused."""
    receipt = refuse_request(call, "model_admit", decision)
    return Admission(
        admitted=False,
        reasons=reasons_out(decision.reasons),
        message="; ".join(r.message for r in decision.reasons),
        retry=False,
        pools=[],
        turn_id=None,
        receipt_id=receipt,
    )


def _facts(call: Call[Any], req: AdmitRequest, in_flight: Totals) -> ModelCallFacts:
    return ModelCallFacts(
        loop_id=call.loop.loop_id,
        loop_status=call.loop.status,
        model=req.model,
        priced=req.priced,
        used=call.loop.totals,
        in_flight=in_flight,
        reserve=req.reserve.charge(),
    )


@operation(access="read", scope=by_loop, callers=OBSERVER_CALLERS, tool=False)
def model_check(call: Call[Reader], req: AdmitRequest) -> Admission:
    """Decide one model call on a snapshot, sealing nothing.

    \f
    The gateway's fast way: the decision `model_admit` makes, on the loop's committed state
    (a read, which never waits for the store's writer), with the tokens version of the same
    snapshot (so a gateway token verified before is known to be unrevoked in the same read). An admission needs no receipt; a
    refusal does, so the gateway then asks `model_admit`, which decides again in a write
    transaction and seals it. What calls in flight hold comes in the request, read before this
    snapshot, so a call charged in between is counted twice at most, never missed.
    """
    decision, pools, turn = _decide(call, req)
    return Admission(
        tokens=repr(call.tx.tokens_version()),  # the gateway's remembered token still holds?
        admitted=decision.allowed,
        reasons=reasons_out(decision.reasons),
        message="; ".join(r.message for r in decision.reasons),
        retry=False,
        pools=pools,
        turn_id=turn.turn_id if turn else None,
        receipt_id=None,
    )


@operation(access="write", scope=by_loop, callers=OBSERVER_CALLERS, refuse=_refuse, tool=False)
def model_admit(call: Call[Txn], req: AdmitRequest) -> Admission:
    """Decide one model call before it goes upstream, sealing a refusal.

    \f
    By the pure decision (`policy/model_calls.py`): the loop active, the model allowed by the
    policy's `[model]` and priced, and every model budget of the loop and of the pools the call
    draws from with room for the call's reservation beside what is used and what calls in
    flight hold. A refusal is sealed (`model.refused`, on the agent's open turn if any); an
    admission seals nothing (its call is sealed when it ends, `model_settle`). `retry` says
    the refusal is owed only to calls in flight (their end may make room).
    """
    tx, loop = call.tx, call.loop
    policy = tx.rows.policy(loop.policy_digest)
    decision, pools, turn = _decide(call, req)
    if decision.allowed:
        return Admission(
            admitted=True, reasons=[], message="", retry=False, pools=pools,
            turn_id=turn.turn_id if turn else None, receipt_id=None,
        )  # fmt: skip
    alone = evaluate_model_call(policy, _facts(call, req, Totals()), digest="")
    idle = {name: ModelSpend() for name in req.pools_in_flight}
    retry = alone.allowed and not _pool_reasons(
        call, req.model_copy(update={"pools_in_flight": idle}), pools
    )
    data = ModelRefused(
        provider=req.provider,
        api=req.api,
        model=req.model,
        stream=req.stream,
        request_digest=req.request_digest,
        reserve=req.reserve,
        in_flight=req.in_flight,
        priced=req.priced,
    )
    sealed = tx.append(
        loop.loop_id,
        ReceiptKind.MODEL_REFUSED,
        call.who,
        data,
        decision=decision,
        turn_id=turn.turn_id if turn else None,
        todo_id=turn.todo_id if turn else None,
    )
    return Admission(
        admitted=False,
        reasons=reasons_out(decision.reasons),
        message="; ".join(r.message for r in decision.reasons),
        retry=retry,
        pools=pools,
        turn_id=turn.turn_id if turn else None,
        receipt_id=sealed.receipt_id,
    )


@operation(access="write", scope=by_loop, callers=OBSERVER_CALLERS, tool=False)
def model_settle(call: Call[Txn], req: SettleRequest) -> Settlement:
    """Seal what an admitted model call spent.

    \f
    `model.called` on the agent's open turn now (its latest; none if it holds none: the call
    is then charged to the loop and the pools the loop and the agent draw from). The fold
    charges the loop's totals and the turn's observed model usage; the pools are charged in
    the same transaction (`kernel/state/charges.py`). A loop closed since the call was
    admitted still takes it: the money was spent.
    """
    turn = _turn(call)
    data = ModelCalled(**req.model_dump(exclude={"loop_id"}))
    sealed = call.tx.append(
        call.loop.loop_id,
        ReceiptKind.MODEL_CALLED,
        call.who,
        data,
        decision=Decision("allow"),
        turn_id=turn.turn_id if turn else None,
        todo_id=turn.todo_id if turn else None,
    )
    return Settlement(receipt_id=sealed.receipt_id, turn_id=turn.turn_id if turn else None)
