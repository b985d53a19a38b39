"""Crash safety: a `loopwarden serve` SIGKILLed again and again while a client drives turns, and
a damaged store that the server and the audit refuse.

The crash loop runs in two variants: a short one (10 cycles) that every `make test` runs, and a
long one marked `slow` with LOOPWARDEN_CRASH_KILLS (default 50) cycles (`make test-all`). Each cycle starts a real
`loopwarden serve --http` on the shared data home, connects the MCP SDK client, resends the one
call left unanswered by the previous crash (same idempotency key), then claims and reports turns
until the server is SIGKILLed after a random delay — mostly in the middle of a request. Every
tenth cycle also kills a server while it is still starting up. The next server is started at
once, and while it boots the test opens the crashed database itself and checks: the startup check
passes, the Merkle frontier matches the journal, the full audit is clean (signatures, chains,
projection rebuilt from receipts = stored projection), and every receipt the client ever saw
acknowledged is there with the digest it was told; the new server then runs its own startup check
on the same state (and would exit 3 on a damaged one). Lives alternate `synchronous=FULL` and
`NORMAL`. Run `pytest -s` to see the measured figures.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BASIC_POLICY
from support import (
    EVIDENCE,
    Served,
    assert_totals_match,
    cli,
    cli_env,
    connect_http,
    kill_server,
    loop_entries,
    merkle_problems,
    mint_tokens,
    one_line,
    open_db,
    raw_sql,
    replay_grants,
    run_cli_app,
    spawn_server,
    start_server,
    stop_server,
    wait_listening,
)

from loopwarden.audit.database import audit
from loopwarden.clients import admin
from loopwarden.clients.agent import AgentClient
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.state.events import Evidence
from loopwarden.kernel.store.store import startup_check
from loopwarden.principals import Principal
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.update import UpdateRequest, update

pytestmark = pytest.mark.anyio

KILLS = max(50, int(os.environ.get("LOOPWARDEN_CRASH_KILLS", "50")))
LOOP = "crash"
AGENT = "crasher"
CRASHER = Principal(id=AGENT, role="agent")
CALL_TIMEOUT = 10.0  # seconds for one tool call while the server is alive
KILL_WINDOW = (0.0, 0.35)  # seconds after the client connected; requests take ~10-40 ms


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Ack:
    """A result the client received: the receipt it names must survive every later crash."""

    receipt_id: str
    kind: str
    turn_id: str
    digest: str | None = None


@dataclass
class Driver:
    """The client's side of the crash loop: the next call to make, and everything acknowledged."""

    n: int = 0
    pending: dict[str, Any] | None = None  # the call in progress (resent after a crash)
    turn: tuple[str, int] | None = None  # (turn_id, fence) of the open turn
    in_flight: bool = False
    acks: list[Ack] = field(default_factory=list)
    resent: int = 0
    resent_committed: int = 0  # resent calls that had committed before the crash
    kills_mid_request: int = 0

    def next_call(self) -> dict[str, Any]:
        if self.pending is None:
            if self.turn is None:
                self.pending = {"tool": "claim", "key": f"claim-{self.n}"}
            else:
                outcome = "completed" if self.n % 4 == 3 else "progress"
                self.pending = {
                    "tool": "update",
                    "key": f"report-{self.n}",
                    "outcome": outcome,
                    "usage": {"model_calls": 1 + self.n % 3, "cost_usd": 0.001 * (self.n % 7)},
                }
        return self.pending

    async def call(self, agent: AgentClient) -> None:
        """Make the pending call once; on success record the acknowledgement."""
        call = self.next_call()
        self.in_flight = True
        with anyio.fail_after(CALL_TIMEOUT):
            if call["tool"] == "claim":
                grant = await agent.claim(LOOP, idempotency_key=call["key"])
                self.in_flight = False
                assert grant.granted, grant.reasons
                assert grant.turn_id and grant.fence and grant.receipt_id
                self.turn = (grant.turn_id, grant.fence)
                self.acks.append(Ack(grant.receipt_id, "turn.claimed", grant.turn_id))
            else:
                assert self.turn is not None
                turn_id, fence = self.turn
                result = await agent.update(
                    turn_id,
                    fence,
                    call["outcome"],
                    f"{call['outcome']} #{self.n}",
                    call["key"],
                    usage=call["usage"],
                    evidence=EVIDENCE,
                    tools_used=[{"name": "fs.write", "count": 1}],
                )
                self.in_flight = False
                assert result.accepted, result.reasons
                self.acks.append(Ack(result.receipt_id, "turn.reported", turn_id, result.digest))
                self.turn = None
                self.n += 1
        self.pending = None


def crash_policy(todos: int) -> dict[str, Any]:
    return {
        **BASIC_POLICY,
        "agents": [AGENT],
        "budgets": {"max_turns": 1_000_000, "max_cost_usd": 1_000_000.0},
        "claims": {"lease_seconds": 3600, "max_active": 1, "max_active_per_agent": 1},
        "todos": {"max_todos": todos},
    }


@pytest.fixture
def crash_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A fresh home with the crash loop open and a bearer token for the agent (minted by the
    CLI): each variant of the crash loop checks its own journal from the first receipt."""
    root = tmp_path_factory.mktemp("crash")
    home = root / "home"
    # Enough work that the driver never finishes the loop before the last kill (a fast run
    # completes about 4 todos between kills; 20 per kill leaves a wide margin).
    todos = max(200, KILLS * 20)
    policy = root / "policy.json"
    policy.write_text(json.dumps(crash_policy(todos)))
    items = root / "todos.json"
    items.write_text(json.dumps([{"title": f"step {n}"} for n in range(todos)]))
    opened = run_cli_app(
        "loop", "open", "--policy", str(policy), "--objective", "survive crashes",
        "--todos", str(items), "--id", LOOP, "--home", str(home), "--json",
    )  # fmt: skip
    assert opened.exit_code == 0, opened.output
    return home, mint_tokens(home, [(AGENT, "agent")])[AGENT].token


def committed(home: Path, key: str) -> bool:
    """Did the call with this idempotency key commit (its response is stored with it)?"""
    with open_db(home) as reader:
        return reader.idempotency(AGENT, key) is not None


def check_after_crash(home: Path, acks: list[Ack]) -> int:
    """The state a crash left behind, as the next server will find it. Returns receipts."""
    keyring = KeyStore(home).keyring()
    with open_db(home, readonly=False) as reader:  # writable: SQLite recovers the WAL first
        startup_check(reader)  # journal head = projection head = Merkle frontier
        assert merkle_problems(reader) == []
        report = audit(reader, keyring)
        assert report.clean, [f.as_dict() for f in report.findings[:5]]
        for ack in acks:
            row = reader.receipt_by_id(ack.receipt_id)
            assert row is not None, f"acknowledged {ack.kind} {ack.receipt_id} was lost"
            assert (row.kind, row.turn_id) == (ack.kind, ack.turn_id)
            if ack.digest is not None:
                assert row.digest == ack.digest
        return report.receipts


async def drive_until_killed(served: Served, token: str, driver: Driver, delay: float) -> None:
    """Resend the pending call, then claim and report until the server is killed."""
    killed = anyio.Event()

    async def killer() -> None:
        await anyio.sleep(delay)
        driver.kills_mid_request += driver.in_flight
        kill_server(served)
        killed.set()

    started = False
    try:
        with anyio.fail_after(60):
            async with connect_http(served.url, token, read_timeout=CALL_TIMEOUT) as agent:
                if driver.pending is not None:
                    driver.resent += 1
                    driver.resent_committed += committed(served.home, driver.pending["key"])
                async with anyio.create_task_group() as group:
                    group.start_soon(killer)
                    started = True
                    while True:
                        await driver.call(agent)
    except Exception:
        # Whatever the client raises once the server is gone is expected; anything before is not.
        if not killed.is_set():
            raise
    assert started and killed.is_set()


SHORT_KILLS = 10  # cycle 10 also kills a server while it starts


@pytest.mark.parametrize(
    "kills",
    [pytest.param(SHORT_KILLS, id="short"), pytest.param(KILLS, id="long", marks=pytest.mark.slow)],
)
async def test_sigkill_at_random_moments_never_loses_an_acknowledged_receipt(
    crash_home, tmp_path, kills
):
    crash_home, token = crash_home
    rng = random.Random(int(os.environ.get("LOOPWARDEN_CRASH_SEED", "20260101")))
    driver = Driver()
    began = time.monotonic()
    startup_kills = receipts = 0
    logs = tmp_path / "logs"

    def env(cycle: int) -> dict[str, str]:  # alternate: both modes must survive a process crash
        return cli_env("full" if cycle % 2 == 0 else "normal")

    served, port = spawn_server(crash_home, logs, env=env(0))
    try:
        for cycle in range(kills):
            if cycle % 10 == 9:  # now and then, crash a server while it is still starting up
                time.sleep(rng.uniform(0.2, 1.2))  # imports, preflight, store open, bind
                kill_server(served)
                startup_kills += 1
                served, port = spawn_server(crash_home, logs, env=env(cycle))
                check_after_crash(crash_home, driver.acks)
            wait_listening(served, port)
            await drive_until_killed(served, token, driver, rng.uniform(*KILL_WINDOW))
            # Restart at once; check the crashed state while the new process boots (its own
            # startup check then runs on the same state, and refuses to serve if it is damaged).
            served, port = spawn_server(crash_home, logs, env=env(cycle + 1))
            receipts = check_after_crash(crash_home, driver.acks)
        # One last life: the call the final crash interrupted still resolves exactly once.
        wait_listening(served, port)
        async with connect_http(served.url, token) as agent:
            while driver.pending is not None or driver.turn is not None:
                await driver.call(agent)
        stop_server(served)
    finally:
        kill_server(served)
    elapsed = time.monotonic() - began

    verified = cli("verify", "--json", "--home", str(crash_home))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["verdict"] == "clean"
    with open_db(crash_home) as reader:
        entries = loop_entries(reader, crash_home, LOOP)
        replayed = replay_grants(entries)
        assert_totals_match(reader.loop_row(LOOP).totals, replayed)
    # Exactly once: every resent report sealed one turn.reported, never two.
    assert set(replayed.reports.values()) == {1}
    assert replayed.kinds["turn.reported"] == driver.n
    assert replayed.kinds["turn.claimed"] == sum(a.kind == "turn.claimed" for a in driver.acks)
    assert driver.kills_mid_request >= kills // 2, "kills should mostly land mid-request"
    print(
        f"\n[crash] {kills} SIGKILLs while driving + {startup_kills} during startup survived; "
        f"{driver.kills_mid_request} landed mid-request; {len(driver.acks)} acknowledged "
        f"receipts re-checked after every crash; {driver.resent} unanswered calls resent, "
        f"{driver.resent_committed} of them had committed and replayed their original result; "
        f"{len(entries)} receipts in the loop, {receipts} in the journal at the last check; "
        f"{elapsed:.1f}s"
    )


# --- startup recovery ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small healthy store: one loop, three claimed and reported turns."""
    root = tmp_path_factory.mktemp("damage")
    home = root / "home"
    policy = root / "policy.json"
    policy.write_text(json.dumps(crash_policy(10)))
    opened = run_cli_app(
        "loop", "open", "--policy", str(policy), "--objective", "o", "--todo", "a",
        "--todo", "b", "--todo", "c", "--id", LOOP, "--home", str(home), "--json",
    )  # fmt: skip
    assert opened.exit_code == 0, opened.output

    async def work() -> None:
        async with admin.open_store(home) as store:
            for n in range(3):
                grant = await claim(store, CRASHER, ClaimRequest(loop_id=LOOP))
                assert grant.granted and grant.turn_id and grant.fence
                request = UpdateRequest(
                    turn_id=grant.turn_id,
                    fence=grant.fence,
                    outcome="completed",
                    evidence=[Evidence(kind="test", summary="ok")],
                    summary="done",
                    idempotency_key=f"k{n}",
                )
                assert (await update(store, CRASHER, request)).accepted

    anyio.run(work)
    return home


def damaged_copy(populated: Path, tmp_path: Path, *statements: str) -> Path:
    home = tmp_path / "home"
    (home / "keys").mkdir(parents=True)
    for path in populated.rglob("*"):
        if path.is_file():
            target = home / path.relative_to(populated)
            target.write_bytes(path.read_bytes())
            target.chmod(path.stat().st_mode & 0o777)
    raw_sql(home, *statements)
    return home


DAMAGE = {
    "projection-head-behind": (
        "UPDATE loops SET head_seq = head_seq - 1",
        "projection head",
        "projection_mismatch",
    ),
    "merkle-frontier-zeroed": (
        "UPDATE log_state SET frontier = zeroblob(length(frontier))",
        "frontier",
        "frontier_mismatch",
    ),
    "merkle-size-ahead": (
        "UPDATE log_state SET size = size + 1",
        "Merkle log",
        "frontier_mismatch",
    ),
}


@pytest.mark.parametrize(("statement", "says", "finding"), DAMAGE.values(), ids=list(DAMAGE))
def test_a_damaged_store_is_refused_at_startup_and_verify_names_the_damage(
    populated, tmp_path, statement, says, finding
):
    home = damaged_copy(populated, tmp_path, statement)
    serve = cli("serve", "--agent", AGENT, "--home", str(home))
    assert serve.returncode == 3, serve.stdout + serve.stderr
    message = one_line(serve.stderr)
    assert "refusing to serve a damaged store" in message and says in message, message
    assert "loopwarden verify" in message and "Traceback" not in serve.stderr
    assert serve.stdout == "", "stdout is the protocol channel"

    http = cli("serve", "--http", "127.0.0.1:1", "--home", str(home))
    assert http.returncode == 3 and "damaged store" in one_line(http.stderr)

    verify = run_cli_app("verify", "--json", "--home", str(home))
    assert verify.exit_code == 3, verify.output
    report = json.loads(verify.stdout)
    assert report["verdict"] == "tampered"
    assert finding in {f["code"] for f in report["findings"]}, report["findings"]
    human = run_cli_app("verify", "--home", str(home))
    assert human.exit_code == 3 and finding in human.output
    # The reading commands still show what is there, so an operator can look at the damage.
    journal = run_cli_app("receipts", LOOP, "--json", "--home", str(home))
    assert journal.exit_code == 0, journal.output
    assert json.loads(journal.stdout)["receipts"], "the journal is still readable"


def test_the_undamaged_copy_serves_and_verifies_clean(populated, tmp_path):
    home = damaged_copy(populated, tmp_path)
    assert run_cli_app("verify", "--home", str(home)).exit_code == 0
    served = start_server(home, tmp_path / "logs")
    try:
        assert served.process.poll() is None
    finally:
        stop_server(served)


def dump(home: Path) -> list[str]:
    conn = sqlite3.connect(home / "loopwarden.db")
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def test_a_refused_store_is_left_exactly_as_it_was_found(populated, tmp_path):
    home = damaged_copy(populated, tmp_path, DAMAGE["projection-head-behind"][0])
    before = dump(home)
    for args in (
        ["serve", "--agent", AGENT],
        ["loop", "list"],
        ["token", "create", "--agent", "x"],
    ):
        done = cli(*args, "--home", str(home))
        assert done.returncode == 3, (args, done.stderr)
        assert "damaged store" in one_line(done.stderr)
    assert dump(home) == before, "a refused store must not be written to"
