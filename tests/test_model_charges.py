"""What the model gateway's receipts charge, and how reports and the audit agree with them.

In process, on a real store: `model_settle` seals what a call spent (`model.called`) and
charges its loop, the agent's open turn and the pools they draw from in the same transaction;
`update` then charges none of the model usage the gateway observed in the turn, keeps what the
agent reported beside it, and compares the two under `[observe] mode` (a report below what was
observed: a warning in `record`, a violation in `enforce`); `model_admit` decides a call
against the loop's and the pools' budgets with what calls in flight hold; the judging audit
replays every charge and flags one that its observations do not give.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import BUILDER, OPERATOR
from support import make_policy
from test_hooks import fixture, say

from loopwarden.audit.database import audit
from loopwarden.kernel.state.events import ModelSpend, ReceiptKind
from loopwarden.kernel.store.store import Store
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.model_gateway.model_kinds import ModelCalled, ModelPrice
from loopwarden.model_gateway.model_ops import (
    AdmitRequest,
    SettleRequest,
    model_admit,
    model_settle,
)
from loopwarden.model_gateway.prices import load_prices
from loopwarden.pools.pool_ops import PoolDefineRequest, pool_define
from loopwarden.principals import Principal
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.quota import QuotaRequest, quota
from loopwarden.turns.update import UpdateRequest, update

pytestmark = pytest.mark.anyio
LOOP = "L1"
GATEWAY = Principal(id="builder", role="observer")  # the gateway speaks for the agent
DIGEST = "sha256:" + "ab" * 32
EVIDENCE = [{"kind": "test", "summary": "green"}]


def policy(mode: str = "record", **budgets: Any) -> dict[str, Any]:
    return make_policy(
        agents=["builder"],
        budgets={"max_turns": 20, "max_cost_usd": 5.0, **budgets},
        model={"allow": ["claude-*"]},
        observe={"mode": mode},
        stop={"on_violation": "refuse_turn"},
    )


async def opened(store: Store, rules: dict[str, Any]) -> None:
    await open_loop(
        store, OPERATOR,
        OpenLoopRequest(objective="o", policy=rules, loop_id=LOOP,
                        todos=[TodoInput(id=f"t{n}", title=f"todo {n}") for n in range(3)]),
    )  # fmt: skip


async def claimed(store: Store) -> Any:
    await say(store, fixture("claude-code", "SessionStart-startup"), agent="builder")
    granted = await claim(store, BUILDER, ClaimRequest(loop_id=LOOP))
    assert granted.granted, granted.reasons
    return granted


def spend(
    inp: int = 1000, out: int = 200, write: int = 0, read: int = 0
) -> tuple[ModelSpend, ModelPrice]:
    price = load_prices().price("claude-sonnet-4-5")
    assert price is not None
    r = price.rates(inp + write + read)
    rated = ModelPrice(key=price.key, input=r.input / 1e6, output=r.output / 1e6,
                       cache_write=r.cache_write / 1e6, cache_read=r.cache_read / 1e6)  # fmt: skip
    used = ModelSpend(model_calls=1, input_tokens=inp, output_tokens=out,
                      cache_write_tokens=write, cache_read_tokens=read)  # fmt: skip
    return used.model_copy(update={"cost_usd": rated.cost_micros(used) / 1e6}), rated


async def settled(store: Store, **tokens: int) -> Any:
    used, rated = spend(**tokens)
    return await model_settle(
        store, GATEWAY,
        SettleRequest(loop_id=LOOP, provider="anthropic", api="messages", model="claude-sonnet-4-5",
                      stream=False, request_digest=DIGEST, status=200, outcome="ok", usage=used,
                      source="provider", price=rated, duration_ms=12.5),
    )  # fmt: skip


async def loop_totals(store: Store) -> Any:
    row = await store.read(lambda r: r.loop_row(LOOP))
    return row.totals


async def judged_clean(store: Store) -> None:
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert report.findings == [], [f.as_dict() for f in report.findings]


def report(granted: Any, **usage: Any) -> UpdateRequest:
    return UpdateRequest(
        turn_id=granted.turn_id, fence=granted.fence, outcome="progress", summary="did it",
        usage=usage, evidence=EVIDENCE, idempotency_key=f"k-{granted.turn_id}",
    )  # fmt: skip


async def test_a_call_in_a_turn_charges_the_turn_and_its_report_charges_no_model_usage_again(store):
    await opened(store, policy())
    granted = await claimed(store)
    first = await settled(store, inp=1000, out=200)
    await settled(store, inp=3000, out=100, read=5000)
    assert first.turn_id == granted.turn_id
    observed = await loop_totals(store)
    assert observed.units("model_calls") == 2 and observed.units("input_tokens") == 4000
    assert observed.units("cache_read_tokens") == 5000
    done = await update(store, BUILDER, report(granted))  # no model usage reported
    assert done.accepted, done.reasons
    after = await loop_totals(store)
    assert after.minus(observed).units("cost_usd") == 0  # nothing charged twice
    assert after.units("model_calls") == 2
    journal = await store.read(lambda r: r.loop_journal(LOOP))
    assert [r.kind for r in journal].count(ReceiptKind.MODEL_CALLED) == 2
    await judged_clean(store)


async def test_quota_shows_the_observed_spend(store):
    await opened(store, policy())
    await claimed(store)
    await settled(store, inp=1000, out=200)
    used, _ = spend(1000, 200)
    budgets = (await quota(store, BUILDER, QuotaRequest(loop_id=LOOP))).budgets
    assert budgets["cost_usd"].used == pytest.approx(used.cost_usd)
    assert budgets["model_calls"].used == 1


async def test_a_report_below_what_was_observed_is_a_warning_in_record_mode(store):
    await opened(store, policy("record"))
    granted = await claimed(store)
    await settled(store)
    await settled(store)
    done = await update(store, BUILDER, report(granted, model_calls=1))
    assert done.accepted
    assert [r.code for r in done.reasons] == ["model_usage_unreported"]
    assert "observed 2" in done.reasons[0].message
    assert (await loop_totals(store)).units("model_calls") == 2  # charged what was observed
    await judged_clean(store)


async def test_a_report_below_what_was_observed_is_refused_in_enforce_mode(store):
    await opened(store, policy("enforce"))
    granted = await claimed(store)
    await settled(store)
    await settled(store)
    done = await update(store, BUILDER, report(granted, model_calls=1, input_tokens=10))
    assert not done.accepted
    assert {r.code for r in done.reasons} == {"unreported_model_use"}
    honest = await update(
        store, BUILDER,
        report(granted, model_calls=2).model_copy(update={"idempotency_key": "again"}),
    )  # fmt: skip
    assert honest.accepted is False or honest.turn_status != "open"  # the violation closed it
    assert (await loop_totals(store)).units("model_calls") == 2
    await judged_clean(store)


async def test_a_report_that_leaves_model_usage_out_or_gives_more_is_not_flagged(store):
    await opened(store, policy("enforce"))
    granted = await claimed(store)
    await settled(store)
    done = await update(store, BUILDER, report(granted, model_calls=3, input_tokens=99999))
    assert done.accepted and done.reasons == []
    assert (await loop_totals(store)).units("model_calls") == 1  # the charge is what was observed


async def test_without_gateway_observations_a_report_is_charged_as_reported(store):
    await opened(store, policy())
    granted = await claimed(store)
    done = await update(store, BUILDER, report(granted, model_calls=4, cost_usd=0.25))
    assert done.accepted
    totals = await loop_totals(store)
    assert totals.units("model_calls") == 4 and totals.units("cost_usd") == 250_000


async def test_a_call_outside_a_turn_charges_the_loop_and_its_pools(store):
    await pool_define(
        store, OPERATOR,
        PoolDefineRequest(name="team", policy={"budgets": {"max_cost_usd": 1.0}, "agents": ["builder"]}),
    )  # fmt: skip
    await opened(store, policy())
    sealed = await settled(store, inp=2000, out=300)
    assert sealed.turn_id is None
    used, _ = spend(2000, 300)
    usage = await store.read(lambda r: r.pool_usage("team"))
    assert [u.totals.units("cost_usd") for u in usage] == [round(used.cost_usd * 1e6)]
    assert [u.totals.units("model_calls") for u in usage] == [1]
    await judged_clean(store)


def admit_request(reserve_usd: float, in_flight_usd: float = 0.0, **pools: float) -> AdmitRequest:
    return AdmitRequest(
        loop_id=LOOP, provider="anthropic", api="messages", model="claude-sonnet-4-5",
        stream=True, request_digest=DIGEST, priced=True,
        reserve=ModelSpend(model_calls=1, output_tokens=1000, cost_usd=reserve_usd),
        in_flight=ModelSpend(cost_usd=in_flight_usd),
        pools_in_flight={name: ModelSpend(cost_usd=v) for name, v in pools.items()},
    )  # fmt: skip


async def test_admission_counts_what_calls_in_flight_hold_and_says_a_retry_may_pass(store):
    await opened(store, policy(max_cost_usd=1.0))
    ok = await model_admit(store, GATEWAY, admit_request(0.4, in_flight_usd=0.5))
    assert ok.admitted and ok.receipt_id is None
    busy = await model_admit(store, GATEWAY, admit_request(0.4, in_flight_usd=0.7))
    assert not busy.admitted and busy.retry
    assert [r.code for r in busy.reasons] == ["budget_exhausted:cost_usd"]
    assert "held by calls in flight" in busy.message
    never = await model_admit(store, GATEWAY, admit_request(1.5))
    assert not never.admitted and not never.retry
    await judged_clean(store)


async def test_a_pool_without_room_refuses_a_call(store):
    await pool_define(
        store, OPERATOR,
        PoolDefineRequest(name="team", policy={"budgets": {"max_cost_usd": 0.5}, "agents": ["builder"]}),
    )  # fmt: skip
    await opened(store, policy())
    refused = await model_admit(store, GATEWAY, admit_request(0.6))
    assert not refused.admitted and [r.code for r in refused.reasons] == ["pool_exhausted"]
    assert "pool team" in refused.message
    assert (await model_admit(store, GATEWAY, admit_request(0.3, team=0.3))).retry
    await judged_clean(store)


async def test_the_audit_flags_a_sealed_charge_its_observations_do_not_give(store):
    await opened(store, policy())
    used, rated = spend(1000, 200)
    cheap = used.model_copy(update={"cost_usd": used.cost_usd / 10})  # charged a tenth
    data = ModelCalled(
        provider="anthropic", api="messages", model="claude-sonnet-4-5", stream=False,
        request_digest=DIGEST, status=200, outcome="ok", usage=cheap, source="provider",
        price=rated, duration_ms=1.0,
    )  # fmt: skip
    await store.write(lambda tx: tx.append(LOOP, ReceiptKind.MODEL_CALLED, GATEWAY, data))
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert [(f.kind, f.rule) for f in report.findings] == [("model.called", "charge")]


async def test_the_audit_flags_a_report_that_hides_what_the_gateway_observed(store):
    await opened(store, policy())
    granted = await claimed(store)
    await settled(store)

    def forged(tx: Any) -> None:  # a report sealed as if the gateway had seen nothing
        from loopwarden.turns.turn_kinds import TurnReported

        data = TurnReported(
            turn_id=granted.turn_id, todo_id=granted.todo_id, fence=granted.fence,
            outcome="progress", summary="s", tool_calls_charged=0, tool_calls_before=0,
        )  # fmt: skip
        tx.append(LOOP, ReceiptKind.TURN_REPORTED, BUILDER, data,
                  turn_id=granted.turn_id, todo_id=granted.todo_id)  # fmt: skip

    await store.write(forged)
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert ("turn.reported", "model_observed") in [(f.kind, f.rule) for f in report.findings]
