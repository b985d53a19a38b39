"""Evidence that holds (issue 22): what the host saw is charged and judged the same way the
write path decided it, in every way a turn ends and outside any turn.

- a second host session while a turn is open (a `/clear`, a resume, a second `claude -p`) is
  sealed and judged alike: `verify` stays clean;
- in `record` mode, a call the host ran outside any turn is charged when it is observed;
- no tool runs on a turn whose lease has run out, even before any claim sweeps it;
- a property: any sequence of hook events, claims, reports and clock moves, in either mode,
  leaves a journal the judge finds legal and a loop whose tool-call total is the sum of what
  its receipts charged.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BUILDER, OPERATOR
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import control_loop, scale
from test_hooks import (
    HOOKED,
    LOOP,
    attached_claim,
    bash,
    denied,
    fixture,
    judged_clean,
    opened,
    say,
)
from test_hooks import report as honest_report
from test_judge import objections

from loopwarden.audit.database import audit
from loopwarden.clock import ManualClock
from loopwarden.hosts.host_kinds import ToolObserved
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.state.events import LoopStopped, TurnReport
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import LoopControlRequest
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.turn_kinds import LeaseExpired
from loopwarden.turns.update import update

pytestmark = pytest.mark.anyio
SESSION_B = "0b5e1d7c-2f3a-4c9e-8d6b-1a2b3c4d5e6f"


async def test_a_second_host_session_in_mid_turn_is_sealed_and_judged_alike(store):
    await opened(store)
    await attached_claim(store)
    await say(store, bash("pytest -q"))
    _, out = await say(store, bash("pytest -q", session_id=SESSION_B))
    assert denied(out) is None, "the new session's call runs on the agent's open turn"
    journal = await store.read(lambda r: r.loop_journal(LOOP))
    assert [r.kind for r in journal][-2:] == ["host.attached", "tool.admitted"]
    await judged_clean(store)


async def test_in_record_mode_a_call_run_outside_any_turn_is_charged(store):
    await opened(store, {**HOOKED, "observe": {"mode": "record"}})
    await say(store, fixture("claude-code", "SessionStart-startup"))
    _, out = await say(store, bash("pytest -q"))
    assert denied(out) is None, "record mode lets it run"
    await say(store, fixture("claude-code", "PostToolUse-bash"))
    loop = await store.read(lambda r: r.loop_row(LOOP))
    assert loop.totals.tool_calls == 1
    await judged_clean(store)


async def test_no_tool_runs_on_a_turn_whose_lease_ran_out(store, clock):
    policy = {**HOOKED, "claims": {"lease_seconds": 2}}
    await opened(store, policy)
    await attached_claim(store)
    _, out = await say(store, bash("pytest -q"))
    assert denied(out) is None
    clock.advance(3)
    _, out = await say(store, bash("pytest -q"))
    assert "lease on turn" in denied(out) and "claim" in denied(out)
    await judged_clean(store)


async def _calls(store: Store, n: int) -> None:
    for _ in range(n):
        _, out = await say(store, bash("pytest -q"))
        assert denied(out) is None
        await say(store, fixture("claude-code", "PostToolUse-bash"))


async def _charged_calls(store: Store) -> int:
    return (await store.read(lambda r: r.loop_row(LOOP))).totals.tool_calls


async def test_letting_a_lease_expire_does_not_escape_max_tool_calls(store, clock):
    policy = {**HOOKED, "budgets": {"max_turns": 20, "max_tool_calls": 4}}
    await opened(store, {**policy, "claims": {"lease_seconds": 2}})
    await attached_claim(store)
    await _calls(store, 3)
    clock.advance(3)
    await say(store, fixture("claude-code", "SessionStart-startup", session_id=SESSION_B))
    again = await claim(store, BUILDER, ClaimRequest(loop_id=LOOP))
    assert again.granted, "the claim sweeps the expired turn: its observed calls are charged"
    assert await _charged_calls(store) == 3
    await _calls(store, 1)
    _, out = await say(store, bash("pytest -q"))
    assert "tool_calls budget is used up (4 of 4" in denied(out)
    expired = [
        r for r in await store.read(lambda r: r.loop_journal(LOOP)) if r.kind == "lease.expired"
    ]
    body = KINDS.parse_body(open_envelope(expired[0].envelope, None).body)
    assert body.data.tool_calls_charged == 3
    await judged_clean(store)
    journal = [
        KINDS.parse_body(open_envelope(r.envelope, None).body)
        for r in await store.read(lambda r: r.loop_journal(LOOP))
    ]
    i = next(n for n, b in enumerate(journal) if b.kind == "lease.expired")
    waived = journal[i].data.model_copy(update={"tool_calls_charged": 0})
    forged = [*journal[:i], journal[i].model_copy(update={"data": waived}), *journal[i + 1 :]]
    assert any(o.endswith(": charge") for o in objections(forged)), objections(forged)


async def test_a_corrected_report_charges_the_observed_calls_once(store):
    await opened(store)
    granted = await attached_claim(store)
    await _calls(store, 3)
    missing = honest_report(granted, "u1", {"shell.run": 3}, usage={"tool_calls": 3})
    missing.evidence = []  # completing needs evidence: refused, the turn stays open
    first = await update(store, BUILDER, missing)
    assert not first.accepted and first.turn_status == "open"
    assert await _charged_calls(store) == 3
    fixed = honest_report(granted, "u2", {"shell.run": 3})  # no usage since the refused one
    assert (await update(store, BUILDER, fixed)).accepted
    assert await _charged_calls(store) == 3, "3 calls are charged as 3, not 6"
    await judged_clean(store)


async def test_a_report_on_a_turn_a_refusal_closed_is_not_charged_again(store):
    await opened(store)
    granted = await attached_claim(store)
    await _calls(store, 2)
    under = await update(store, BUILDER, honest_report(granted, "u1", {}, usage={"cost_usd": 1}))
    assert not under.accepted and under.turn_status == "refused", "the answer says it closed"
    totals = (await store.read(lambda r: r.loop_row(LOOP))).totals
    assert (totals.tool_calls, totals.units("cost_usd")) == (2, 1_000_000)
    again = await update(
        store, BUILDER, honest_report(granted, "u2", {"shell.run": 2}, usage={"cost_usd": 1})
    )
    assert not again.accepted and again.turn_status == "refused"
    assert (await store.read(lambda r: r.loop_row(LOOP))).totals == totals
    await judged_clean(store)


async def test_closing_a_loop_charges_its_open_turns_observed_calls(store):
    await opened(store)
    await attached_claim(store)
    await _calls(store, 2)
    await control_loop(store, OPERATOR, "cancel", LoopControlRequest(loop_id=LOOP))
    assert await _charged_calls(store) == 2
    await judged_clean(store)


# --- a property over hook event sequences --------------------------------------------------------

TOOLS = ("PreToolUse-bash", "PreToolUse-read", "PreToolUse-write")


def _post(name: str) -> dict[str, Any]:
    event = fixture("claude-code", "PostToolUse-bash")
    if name != "PreToolUse-bash":
        pre = fixture("claude-code", name)
        event["tool_name"], event["tool_input"] = pre["tool_name"], pre["tool_input"]
    return event


async def _step(store: Store, clock: ManualClock, data: st.DataObject, turns: list[Any]) -> None:
    step = data.draw(
        st.sampled_from(["pre", "pre", "post", "post", "session", "claim", "update", "advance"])
    )
    session = data.draw(st.sampled_from(["7f3c2a91-4e5b-4d8a-9c61-2b0e8f4d1a37", SESSION_B]))
    if step in ("pre", "post"):
        name = data.draw(st.sampled_from(TOOLS))
        event = fixture("claude-code", name) if step == "pre" else _post(name)
        await say(store, {**event, "session_id": session})
    elif step == "session":
        await say(store, fixture("claude-code", "SessionStart-startup", session_id=session))
    elif step == "claim":
        granted = await claim(store, BUILDER, ClaimRequest(loop_id=LOOP))
        if granted.granted:
            turns.append(granted)
    elif step == "update" and turns:
        turn = data.draw(st.sampled_from(turns))
        tools = {"shell.run": data.draw(st.integers(0, 3)), "fs.read": data.draw(st.integers(0, 2))}
        listed = {name: n for name, n in tools.items() if n}
        await update(
            store,
            BUILDER,
            honest_report(turn, f"k{len(turns)}-{data.draw(st.integers(0, 10**6))}", listed),
        )
    elif step == "advance":
        clock.advance(data.draw(st.sampled_from([1, 5, 61])))


def _charged(bodies: list[Any]) -> int:
    """The tool calls the receipts say they charged."""
    total = 0
    for body in bodies:
        data = body.data
        if isinstance(data, TurnReport) and (
            body.kind == "turn.reported" or getattr(data, "charged", False)
        ):
            total += data.tool_calls
        elif isinstance(data, ToolObserved) and data.charged:
            total += 1
        elif isinstance(data, LeaseExpired):
            total += data.tool_calls_charged or 0
        elif isinstance(data, LoopStopped):
            total += sum(c.tool_calls_charged or 0 for c in data.closed_turns)
    return total


async def _drive(data: st.DataObject, mode: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home, clock = Path(tmp), ManualClock()
        keys = KeyStore(home)
        store = await Store.open(
            home / "lw.db",
            keys.load_signer(),
            keyring=keys.keyring(),
            key_dir=home,
            clock=clock,
            kinds=KINDS,
        )
        try:
            policy = {**HOOKED, "observe": {"mode": mode}, "claims": {"lease_seconds": 60}}
            policy["budgets"] = {"max_turns": 50, "max_tool_calls": 10_000}
            await opened(store, policy, todos=6)
            turns: list[Any] = []
            for _ in range(data.draw(st.integers(5, 30))):
                await _step(store, clock, data, turns)
            report = await store.read(lambda r: audit(r, store.keyring, workers=0))
            assert report.findings == [], [f.as_dict() for f in report.findings]
            rows = await store.read(lambda r: r.loop_journal(LOOP))
            bodies = [KINDS.parse_body(open_envelope(r.envelope, None).body) for r in rows]
            loop = await store.read(lambda r: r.loop_row(LOOP))
            assert loop.totals.tool_calls == _charged(bodies)
        finally:
            await store.close()


@settings(max_examples=scale(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), mode=st.sampled_from(["record", "enforce"]))
def test_any_hook_event_sequence_is_judged_as_it_was_sealed(data, mode):
    anyio.run(_drive, data, mode)
