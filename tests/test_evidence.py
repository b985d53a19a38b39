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
from conftest import BUILDER
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import scale
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

from loopwarden.clock import ManualClock
from loopwarden.ledger.audit.database import audit
from loopwarden.ledger.log.keys import KeyStore
from loopwarden.ledger.log.receipts import open_envelope
from loopwarden.ledger.state.events import LeaseExpired, ToolObserved, TurnReport
from loopwarden.ledger.state.registry import parse_body
from loopwarden.ledger.storage.store import Store
from loopwarden.operations.claim import ClaimRequest, claim
from loopwarden.operations.update import update

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
        elif isinstance(data, LeaseExpired) and getattr(data, "tool_calls_charged", None):
            total += data.tool_calls_charged
    return total


async def _drive(data: st.DataObject, mode: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home, clock = Path(tmp), ManualClock()
        keys = KeyStore(home)
        store = await Store.open(
            home / "lw.db", keys.load_signer(), keyring=keys.keyring(), key_dir=home, clock=clock
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
            bodies = [parse_body(open_envelope(r.envelope, None).body) for r in rows]
            loop = await store.read(lambda r: r.loop_row(LOOP))
            assert loop.totals.tool_calls == _charged(bodies)
        finally:
            await store.close()


@settings(max_examples=scale(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), mode=st.sampled_from(["record", "enforce"]))
def test_any_hook_event_sequence_is_judged_as_it_was_sealed(data, mode):
    anyio.run(_drive, data, mode)
