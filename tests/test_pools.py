"""Budget pools: limits that span loops, checked in the same transaction as every turn.

- a pool is defined, changed, paused and resumed by an operator only, each a sealed receipt of
  its own chain (`pool:<name>`); the same policy again seals nothing;
- a claim is admitted only if every pool the loop (or the agent) draws from has room — budget
  left in its window, a turn free, not paused — and the refusal names the pool;
- every charge of a member loop (claims, reports, observed calls) lands on the pool, in the
  window of the receipt; a calendar window resets exactly once when the clock crosses it;
- the judging audit replays the pools and flags a forged grant past a pool's limit, a pool
  change by a non-operator, and stored pool rows that differ from the receipts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import BUILDER, OPERATOR, REVIEWER
from support import EVIDENCE, codes, make_policy

import loopwarden
from loopwarden.audit.database import audit
from loopwarden.clock import parse_time
from loopwarden.errors import Conflict, NotFound, PolicyError
from loopwarden.kernel.state.events import ReceiptKind
from loopwarden.loops.lifecycle import OpenLoopRequest, open_loop
from loopwarden.policy.pool_policy import PoolPolicy, window_end, window_start
from loopwarden.pools.pool_ops import (
    PoolControlRequest,
    PoolDefineRequest,
    PoolsRequest,
    pool_define,
    pool_pause,
    pool_resume,
    pools,
)
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.update import UpdateRequest, update

pytestmark = [pytest.mark.anyio, pytest.mark.backends]


async def define(store: Any, name: str, **policy: Any) -> Any:
    return await pool_define(store, OPERATOR, PoolDefineRequest(name=name, policy=policy))


async def open_in(store: Any, loop_id: str, todos: int = 4, **sections: Any) -> str:
    request = OpenLoopRequest(
        objective=f"loop {loop_id}",
        policy=make_policy(**sections),
        todos=[{"title": f"todo {i}"} for i in range(todos)],
        loop_id=loop_id,
    )
    return (await open_loop(store, OPERATOR, request)).loop_id


async def finish(store: Any, who: Any, granted: Any, cost: float = 0.0, calls: int = 0) -> Any:
    return await update(
        store,
        who,
        UpdateRequest(
            turn_id=granted.turn_id,
            fence=granted.fence,
            outcome="completed",
            evidence=EVIDENCE,
            summary="done",
            usage={"cost_usd": cost, "model_calls": calls},
            idempotency_key=f"k-{granted.turn_id}",
        ),
    )


async def pool_state(store: Any, name: str) -> Any:
    return (await pools(store, OPERATOR, PoolsRequest(name=name))).pools[0]


async def verified(store: Any) -> Any:
    return await store.read(lambda r: audit(r, store.keyring, workers=0, integrity=store.integrity))


# --- the pool itself ------------------------------------------------------------------------


async def test_an_operator_defines_a_pool_and_the_same_policy_again_seals_nothing(store):
    made = await define(store, "team-a", budgets={"max_cost_usd": 2.0}, window="1d")
    assert made.created and made.changed and made.receipt_id
    again = await define(store, "team-a", window="1d", budgets={"max_cost_usd": 2.0})
    assert not again.changed and again.receipt_id is None
    changed = await define(store, "team-a", budgets={"max_cost_usd": 3.0}, window="1d")
    assert changed.changed and not changed.created
    await store.integrate()
    kinds = await store.read(
        lambda r: [row.kind for row in r.iter_journal() if row.loop_id == "pool:team-a"]
    )
    assert kinds == [ReceiptKind.POOL_DEFINED, ReceiptKind.POOL_DEFINED]
    assert (await verified(store)).clean


async def test_bad_pool_input_is_refused_and_changes_nothing(store):
    with pytest.raises(PolicyError, match="at least one limit"):
        await define(store, "empty")
    with pytest.raises(PolicyError, match="window"):
        await define(store, "weekly", budgets={"max_turns": 3}, window="7d")
    with pytest.raises(ValueError, match="name"):
        await define(store, "Team A", budgets={"max_turns": 3})
    with pytest.raises(PolicyError, match="no pool named 'ghost'"):
        await open_in(store, "L1", pools=["ghost"])
    with pytest.raises(NotFound):
        await pool_pause(store, OPERATOR, PoolControlRequest(name="ghost"))
    assert await store.read(lambda r: r.journal_count() + r.pending_count()) == 0


async def test_only_an_operator_defines_or_pauses_a_pool(store):
    from loopwarden.errors import Forbidden

    await define(store, "team-a", budgets={"max_turns": 3})
    with pytest.raises(Forbidden):
        await pool_define(store, BUILDER, PoolDefineRequest(name="team-a", policy={}))
    with pytest.raises(Forbidden):
        await pool_pause(store, BUILDER, PoolControlRequest(name="team-a"))


# --- claims and charges ---------------------------------------------------------------------


async def test_loops_sharing_a_pool_are_refused_once_its_budget_is_spent(store):
    await define(store, "team-a", budgets={"max_cost_usd": 1.0})
    await open_in(store, "L1", pools=["team-a"])
    await open_in(store, "L2", pools=["team-a"])
    first = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    await finish(store, BUILDER, first, cost=0.6)
    second = await claim(store, REVIEWER, ClaimRequest(loop_id="L2"))
    assert second.granted  # 0.6 of 1.0 used: room left
    await finish(store, REVIEWER, second, cost=0.6)
    refused = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    assert not refused.granted and codes(refused) == {"pool_exhausted"}
    assert "pool 'team-a'" in refused.reasons[0].message
    state = await pool_state(store, "team-a")
    assert state.budgets["cost_usd"].used == pytest.approx(1.2)
    assert sorted(state.loops) == ["L1", "L2"]
    report = await verified(store)
    assert report.clean, report.findings


async def test_max_concurrent_turns_counts_open_turns_across_loops(store):
    await define(store, "team-a", max_concurrent_turns=1)
    await open_in(store, "L1", pools=["team-a"])
    await open_in(store, "L2", pools=["team-a"])
    first = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    busy = await claim(store, REVIEWER, ClaimRequest(loop_id="L2"))
    assert codes(busy) == {"pool_busy"}
    assert (await pool_state(store, "team-a")).active_turns == 1
    await finish(store, BUILDER, first)
    assert (await claim(store, REVIEWER, ClaimRequest(loop_id="L2"))).granted
    assert (await verified(store)).clean


async def test_an_expired_lease_in_another_loop_frees_its_pool_slot_for_a_claim(store, clock):
    from loopwarden.turns.quota import QuotaRequest, quota

    await define(store, "team-a", max_concurrent_turns=1)
    await open_in(store, "L1", pools=["team-a"])
    await open_in(store, "L2", pools=["team-a"])
    held = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))  # its agent then goes away
    assert codes(await claim(store, REVIEWER, ClaimRequest(loop_id="L2"))) == {"pool_busy"}
    clock.advance(901)  # past the lease: nothing has happened in L1 since
    assert (await quota(store, REVIEWER, QuotaRequest(loop_id="L2"))).allowed  # as claim will
    granted = await claim(store, REVIEWER, ClaimRequest(loop_id="L2"))
    assert granted.granted, granted.reasons
    swept = await store.read(lambda r: [j.kind for j in r.loop_journal("L1")])
    assert swept[-1] == ReceiptKind.LEASE_EXPIRED
    assert (await store.read(lambda r: r.turn(held.turn_id))).status != "open"
    assert (await pool_state(store, "team-a")).active_turns == 1
    assert (await verified(store)).clean


async def test_a_pool_bound_to_an_agent_charges_it_in_every_loop(store):
    await define(store, "builder-day", budgets={"max_turns": 2}, agents=["builder"])
    await open_in(store, "L1")
    await open_in(store, "L2")
    for loop_id in ("L1", "L2"):
        granted = await claim(store, BUILDER, ClaimRequest(loop_id=loop_id))
        assert granted.granted
        await finish(store, BUILDER, granted)
    assert codes(await claim(store, BUILDER, ClaimRequest(loop_id="L1"))) == {"pool_exhausted"}
    assert (await claim(store, REVIEWER, ClaimRequest(loop_id="L1"))).granted  # not bound
    assert (await verified(store)).clean


async def test_a_paused_pool_refuses_its_loops_claims_until_resumed(store):
    await define(store, "team-a", budgets={"max_turns": 10})
    await open_in(store, "L1", pools=["team-a"])
    await pool_pause(store, OPERATOR, PoolControlRequest(name="team-a", reason="incident"))
    assert codes(await claim(store, BUILDER, ClaimRequest(loop_id="L1"))) == {"pool_paused"}
    with pytest.raises(Conflict):
        await pool_pause(store, OPERATOR, PoolControlRequest(name="team-a"))
    await pool_resume(store, OPERATOR, PoolControlRequest(name="team-a"))
    assert (await claim(store, BUILDER, ClaimRequest(loop_id="L1"))).granted
    assert (await verified(store)).clean


async def test_a_daily_window_resets_exactly_once_at_midnight_utc(store, clock):
    clock.set(datetime(2026, 3, 1, 23, 0, tzinfo=UTC))
    await define(store, "team-a", budgets={"max_turns": 1}, window="1d")
    await open_in(store, "L1", pools=["team-a"])
    first = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    await finish(store, BUILDER, first)
    refused = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    assert codes(refused) == {"pool_exhausted"}
    assert "resets at 2026-03-02 00:00 UTC" in refused.reasons[0].message
    clock.set(datetime(2026, 3, 1, 23, 59, 59, 999999, tzinfo=UTC))
    assert codes(await claim(store, BUILDER, ClaimRequest(loop_id="L1"))) == {"pool_exhausted"}
    clock.set(datetime(2026, 3, 2, 0, 0, tzinfo=UTC))
    second = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    assert second.granted  # a new day, a new window
    await finish(store, BUILDER, second)
    clock.set(datetime(2026, 3, 2, 12, 0, tzinfo=UTC))
    assert codes(await claim(store, BUILDER, ClaimRequest(loop_id="L1"))) == {"pool_exhausted"}
    windows = await store.read(
        lambda r: [(u.window_start, u.totals.turns) for u in r.pool_usage("team-a")]
    )
    assert windows == [("2026-03-01T00:00:00.000000Z", 1), ("2026-03-02T00:00:00.000000Z", 1)]
    assert (await verified(store)).clean


def test_windows_are_utc_calendar_periods():
    late = datetime(2026, 12, 31, 23, 30, tzinfo=UTC)
    assert window_start("1d", late) == "2026-12-31T00:00:00.000000Z"
    assert window_end("1d", late) == datetime(2027, 1, 1, tzinfo=UTC)
    assert window_start("1h", late) == "2026-12-31T23:00:00.000000Z"
    assert window_start("total", late) == "" and window_end("total", late) is None
    assert PoolPolicy.model_validate({"budgets": {"max_turns": 1}}).window == "total"


# --- the audit ------------------------------------------------------------------------------


async def test_the_audit_flags_a_grant_its_pool_should_have_refused(store, monkeypatch):
    await define(store, "team-a", budgets={"max_turns": 1})
    await open_in(store, "L1", pools=["team-a"])
    await finish(store, BUILDER, await claim(store, BUILDER, ClaimRequest(loop_id="L1")))
    # A server that holds the key but skips the pool's check (a bug, or an insider).
    monkeypatch.setattr("loopwarden.turns.claim.claim_reasons", lambda *args: [])
    forged = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    assert forged.granted
    report = await verified(store)
    illegal = [(f.kind, f.rule) for f in report.findings if f.code == "decision_illegal"]
    assert illegal == [("turn.claimed", "pool_exhausted")]


async def test_the_audit_flags_a_pool_change_sealed_for_a_non_operator(store):
    from loopwarden.canonical import digest_of
    from loopwarden.pools.pool_kinds import PoolDefined

    await define(store, "team-a", budgets={"max_turns": 1})
    document = PoolPolicy.model_validate({"budgets": {"max_turns": 99}}).model_dump(
        mode="json", exclude_none=True
    )
    # The transaction seals what it is given; the runner is what checks roles. Sealed anyway:
    await store.write(
        lambda tx: tx.append_pool(
            "team-a", ReceiptKind.POOL_DEFINED, BUILDER, PoolDefined(policy=document),
            digest_of(document),
        )
    )  # fmt: skip
    report = await verified(store)
    illegal = [(f.kind, f.rule) for f in report.findings if f.code == "decision_illegal"]
    assert illegal == [("pool.defined", "role")]


async def test_a_pool_row_changed_outside_loopwarden_is_refused_and_reported(
    store, backend, store_url
):
    from support import raw_sql_url

    from loopwarden.errors import IntegrityError

    await define(store, "team-a", budgets={"max_cost_usd": 1.0})
    await open_in(store, "L1", pools=["team-a"])
    await finish(store, BUILDER, await claim(store, BUILDER, ClaimRequest(loop_id="L1")), cost=1.0)
    raw_sql_url(backend, store_url, "UPDATE pool_usage SET cost_micros = 0")
    with pytest.raises(IntegrityError, match="pool 'team-a'"):
        await claim(store, REVIEWER, ClaimRequest(loop_id="L1"))
    report = await verified(store)
    found = {(f.code, f.loop_id) for f in report.findings}
    assert ("mac_invalid", "pool:team-a") in found
    assert ("projection_mismatch", "pool:team-a") in found


# --- what agents and operators see ----------------------------------------------------------


async def test_quota_shows_the_pool_lines_and_projection_says_the_pool_blocks(store, clock):
    from loopwarden.projection.projection import ProjectionRequest, projection
    from loopwarden.turns.quota import QuotaRequest, quota

    clock.set(datetime(2026, 5, 4, 10, 0, tzinfo=UTC))
    await define(store, "team-a", budgets={"max_cost_usd": 0.5}, window="1d")
    await open_in(store, "L1", pools=["team-a"])
    before = await quota(store, BUILDER, QuotaRequest(loop_id="L1"))
    assert before.allowed and [p.name for p in before.pools] == ["team-a"]
    await finish(store, BUILDER, await claim(store, BUILDER, ClaimRequest(loop_id="L1")), cost=0.5)
    after = await quota(store, BUILDER, QuotaRequest(loop_id="L1"))
    assert not after.allowed and codes(after) == {"pool_exhausted"}
    line = after.pools[0]
    assert line.budgets["cost_usd"].remaining == 0 and line.resets_at == parse_time(
        "2026-05-05T00:00:00.000000Z"
    )
    seen = await projection(store, BUILDER, ProjectionRequest(loop_id="L1"))
    assert seen.attention.who == "human"
    assert "team-a" in seen.attention.why and "resets at 2026-05-05 00:00 UTC" in seen.attention.why


async def test_observed_tool_calls_charge_the_pools_in_and_outside_turns(store):
    from loopwarden.hosts.hook import HookEvent, hook
    from loopwarden.principals import Principal

    await define(store, "calls", budgets={"max_tool_calls": 3})
    watched = {"observe": {"mode": "record"}, "tools": {"allow": ["fs.*"]}, "pools": ["calls"]}
    await open_in(store, "L1", **watched)
    observer = Principal(id="builder", role="observer")

    async def ran(use_id: str) -> None:
        post = HookEvent(
            loop_id="L1", host="claude-code", phase="post", session_id="s", host_tool="Read",
            tool_use_id=use_id, input_digest="sha256:" + "1" * 64,
            response_digest="sha256:" + "2" * 64,
        )  # fmt: skip
        await hook(store, observer, post)

    await ran("outside")  # no turn: charged when observed (record mode let it run)
    assert (await pool_state(store, "calls")).budgets["tool_calls"].used == 1
    granted = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    for n in range(3):
        await ran(f"u{n}")
    await finish(store, BUILDER, granted)  # the report charges what the host saw: 3 calls
    assert (await pool_state(store, "calls")).budgets["tool_calls"].used == 4
    assert codes(await claim(store, BUILDER, ClaimRequest(loop_id="L1"))) == {"pool_exhausted"}
    assert (await verified(store)).clean


# --- many processes, one pool ---------------------------------------------------------------

POOL_WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    import anyio

    from loopwarden.kernel.log.keys import KeyStore
    from loopwarden.kernel.state.events import Evidence, Usage
    from loopwarden.kernel.store.store import Store
    from loopwarden.kinds import KINDS
    from loopwarden.turns.claim import ClaimRequest, claim
    from loopwarden.turns.update import UpdateRequest, update
    from loopwarden.principals import Principal


    async def agent(store, name, loops, deadline, done):
        who, n = Principal(id=name, role="agent"), 0
        while time.monotonic() < deadline:
            refused = 0
            for loop_id in loops:
                granted = await claim(store, who, ClaimRequest(loop_id=loop_id))
                if not granted.granted:
                    refused += "pool_exhausted" in {r.code for r in granted.reasons}
                    continue
                n += 1
                await anyio.sleep(0.005)  # hold the turn a moment: others claim meanwhile
                await update(store, who, UpdateRequest(
                    turn_id=granted.turn_id, fence=granted.fence, outcome="completed",
                    usage=Usage(model_calls=1, cost_usd=0.01),
                    evidence=[Evidence(kind="test", summary="ok")], summary="ok",
                    idempotency_key=f"{name}-{n}",
                ))
            if refused == len(loops):  # the pool is spent for every loop
                done.append(0)  # (this agent saw it spent)
                break
            await anyio.sleep(0.002)
        done.append(n)


    async def main(home, url, worker, loops):
        keys = KeyStore(home)
        store = await Store.open(url, keys.load_signer(), key_dir=home, kinds=KINDS)
        (home / f"ready-{worker}").touch()
        deadline = time.monotonic() + 600  # a hung run's end: agents stop when the pool is spent
        while not (home / "go").exists():
            await anyio.sleep(0.002)
        done = []
        try:
            async with anyio.create_task_group() as tg:
                for a in range(8):
                    order = loops[a % len(loops):] + loops[:a % len(loops)]
                    tg.start_soon(agent, store, f"w{worker}a{a}", order, deadline, done)
        finally:
            await store.close()
        print(sum(done), len(done))  # turns granted, agents done (8 + those that saw it spent)


    anyio.run(main, Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4].split(","))
    """
)


HANG_GUARD = 900  # seconds: a hung run's end, never a timing expectation


@pytest.mark.parametrize("limit", [60])
async def test_processes_sharing_a_pool_never_overdraw_it_by_one_unit(
    home, tmp_path, store, store_url, limit
):
    await define(store, "shared", budgets={"max_turns": limit}, max_concurrent_turns=3)
    loops = [f"L{n}" for n in range(6)]
    for loop_id in loops:
        wide = {"max_turns": 100, "max_cost_usd": 100.0}  # only the pool limits them
        await open_in(store, loop_id, todos=12, agents=["*"], budgets=wide, pools=["shared"])
    script = tmp_path / "pool_worker.py"
    script.write_text(POOL_WORKER)
    env = {**os.environ, "PYTHONPATH": str(Path(loopwarden.__file__).resolve().parent.parent)}
    workers = [str(n) for n in range(4)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(home), store_url, w, ",".join(loops)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in workers
    ]
    try:
        # Started workers are waited for as long as they live (a loaded machine may take its
        # time): only a worker that died fails here; HANG_GUARD only stops a hung run.
        guard = time.monotonic() + HANG_GUARD
        while not all((home / f"ready-{w}").exists() for w in workers):
            assert all(p.poll() is None for p in procs), [
                p.stderr.read()
                for p in procs
                if p.poll() is not None  # type: ignore[union-attr]
            ]
            assert time.monotonic() < guard, "hung: workers alive but never ready"
            time.sleep(0.02)
        (home / "go").touch()
        outputs = [p.communicate(timeout=HANG_GUARD) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    per_worker = [tuple(map(int, out.split())) for out, _ in outputs]
    assert sum(granted for granted, _ in per_worker) == limit, per_worker  # none past the limit
    # Every agent of every process saw the pool spent: each decided on the others' writes.
    assert all(agents == 16 for _, agents in per_worker), per_worker
    # ... and each was granted some: no process's writer starves the others (on SQLite, one
    # whose queue never empties could take the file's write lock back at every commit).
    assert all(granted for granted, _ in per_worker), f"a process was starved: {per_worker}"
    state = await pool_state(store, "shared")
    assert state.budgets["turns"].used == limit and state.active_turns == 0
    rows = await store.read(lambda r: [r.loop_row(loop_id) for loop_id in loops])
    assert sum(row.totals.turns for row in rows) == limit  # the pool's count is the loops' sum
    report = await verified(store)
    assert report.clean, report.findings[:5]


async def test_a_bundle_of_a_pooled_loop_verifies_and_says_what_it_cannot_judge(store):
    from loopwarden.audit.bundles import export_bundle, verify_bundle

    await define(store, "team-a", budgets={"max_turns": 1})
    await open_in(store, "L1", pools=["team-a"])
    await finish(store, BUILDER, await claim(store, BUILDER, ClaimRequest(loop_id="L1")))
    refused = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    assert codes(refused) == {"pool_exhausted"}
    await store.checkpoint()
    bundle = await store.read(
        lambda r: export_bundle(r, "L1", store.keyring, store.clock(), store.signer)
    )
    report = verify_bundle(bundle, store.keyring)
    assert report.clean, report.findings
    assert any("budget pools (team-a)" in note for note in report.notes)


# --- the admin CLI, in real processes -------------------------------------------------------


def test_the_pool_commands_create_change_pause_and_show_a_pool(home, tmp_path):
    from support import cli, cli_json, cli_open_loop

    made = cli_json(
        "pool", "create", "team-a", "--max-cost-usd", "200", "--window", "1d",
        "--max-concurrent-turns", "5", "--as", "carol", "--home", str(home),
    )  # fmt: skip
    assert made["created"] and made["pool"]["budgets"]["cost_usd"]["limit"] == 200.0
    again = cli("pool", "create", "team-a", "--max-turns", "3", "--home", str(home))
    assert again.returncode == 1 and "exists already" in again.stderr
    cli_open_loop(home, "L1", make_policy(pools=["team-a"]), ("a",))
    changed = cli_json("pool", "set", "team-a", "--max-turns", "3", "--home", str(home))
    assert changed["changed"] and changed["pool"]["budgets"] == {
        "turns": {"limit": 3, "used": 0, "remaining": 3}
    }
    paused = cli_json("pool", "pause", "team-a", "--reason", "incident", "--home", str(home))
    assert paused["status"] == "paused"
    listed = cli_json("pool", "list", "--home", str(home))["pools"]
    assert [(p["name"], p["status"], p["loops"]) for p in listed] == [("team-a", "paused", ["L1"])]
    bad = cli("pool", "create", "team-b", "--window", "2d", "--max-turns", "1", "--home", str(home))
    assert bad.returncode == 2 and "window" in bad.stderr
    assert cli("verify", "--home", str(home)).returncode == 0


def test_a_pool_command_on_a_missing_home_creates_nothing(tmp_path):
    from support import cli

    missing = tmp_path / "nowhere"
    done = cli("pool", "pause", "team-a", "--home", str(missing))
    assert done.returncode == 1 and "no loopwarden database" in done.stderr
    assert not missing.exists()
