"""The row attacks of issue 11: someone who can write `loopwarden.db` edits the rows the server
acts on (not the journal), lets an agent act, and puts the rows back.

Two halves:

- **against this release**, each attack is carried out live: the home is set up with the
  operations, the row is edited with plain `sqlite3`, `verify` must report the edit, a real
  client acting through a real `loopwarden serve` (HTTP, bearer tokens) must be refused with an
  integrity error and nothing sealed, and once the row is put back the journal verifies clean
  and the same client's next call goes through;
- **on PostgreSQL**, three of the attacks (a policy document, a todo row and a loop row edited:
  the policy's hash, the state tree and the loop's MAC) and the forged token row, each edited
  through psycopg in the replica's database (`$LOOPWARDEN_STORE` for the in-process CLI,
  `--store` for the server);
- **against release 0.1.0**, the same attacks succeeded (`tests/fixtures/make_attacked_db.py`
  ran them, one loop each, and the server signed every decision): the audit now judges each of
  those signed decisions illegal, naming the receipt and the rule.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BUILDER, OPERATOR, REVIEWER
from support import (
    Served,
    connect_http,
    make_policy,
    mint_tokens,
    raw_initialize,
    start_server,
    stop_server,
)
from typer.testing import CliRunner

from loopwarden.approvals.approval_ops import ApprovalRequest, request_approval
from loopwarden.auth.tokens import TOKEN_PREFIX, token_hash, token_id_for
from loopwarden.cli.root import app
from loopwarden.clients import admin
from loopwarden.clients.agent import AgentClient, ToolCallError
from loopwarden.kernel.log.keys import KeyStore, public_key_b64
from loopwarden.kernel.sql.location import STORE_ENV
from loopwarden.kernel.state.events import Evidence, ToolUse, Usage
from loopwarden.kernel.store.homes import DB_NAME
from loopwarden.kernel.store.store import Store
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.principals import Principal
from loopwarden.turns.claim import ClaimRequest, ClaimResult, claim
from loopwarden.turns.update import UpdateRequest, update
from loopwarden.witnesses.witness_audit import UNVOUCHED

ATTACKED = Path(__file__).parent / "fixtures" / "attacked-0.1.0"
POLICY = make_policy(budgets={"max_turns": 3})
LOOP = "target"


# --- verify, as the operator runs it -----------------------------------------------------------


def verify(home: Path) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["verify", "--json", "--home", str(home)])
    assert result.exit_code in (0, 3), result.output
    return json.loads(result.stdout)


def finding_codes(report: dict[str, Any]) -> set[str]:
    return {f["code"] for f in report["findings"]}


def journal_size(home: Path) -> int:
    with admin.open_reader(home) as reader:
        return reader.sealed_count()


class Db:
    """The home's database under plain sqlite3, or the PostgreSQL store `$LOOPWARDEN_STORE`
    names under plain psycopg: what the attacker has."""

    def __init__(self, home: Path) -> None:
        self.path = home / DB_NAME
        self.store = os.environ.get(STORE_ENV)

    def _connect(self) -> Any:
        if self.store is None:
            return sqlite3.connect(self.path)
        from loopwarden.kernel.sql.postgres import connect  # autocommit: each statement stands

        conn = connect(self.store)
        conn.commit = lambda: None  # type: ignore[attr-defined]
        return conn

    def one(self, sql: str, params: tuple = ()) -> Any:
        conn = self._connect()
        try:
            return conn.execute(sql, params).fetchone()
        finally:
            conn.close()

    def run(self, sql: str, params: tuple = ()) -> None:
        conn = self._connect()
        try:
            conn.execute(sql, params)
            conn.commit()
        finally:
            conn.close()


@pytest.fixture
def where(backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The backend under attack; on PostgreSQL `$LOOPWARDEN_STORE` names a fresh schema."""
    if backend == "postgresql":
        monkeypatch.setenv(STORE_ENV, request.getfixturevalue("pg_url"))
    return backend


# --- setting a home up, with the operations themselves ---------------------------------------


@dataclass
class Scene:
    """What an attack's setup left: its home, and the grants and approvals it made."""

    home: Path
    grants: dict[str, ClaimResult]
    approval_id: str | None = None


async def _with_store(home: Path, work: Callable[[Store], Awaitable[Any]]) -> Any:
    async with admin.open_store(home) as store:  # the home's file, or $LOOPWARDEN_STORE
        return await work(store)


def report_request(grant: ClaimResult, key: str, tools=(), approvals=()) -> UpdateRequest:
    return UpdateRequest(
        turn_id=grant.turn_id,  # type: ignore[arg-type]
        fence=grant.fence,  # type: ignore[arg-type]
        outcome="completed",
        summary="done",
        evidence=[Evidence(kind="test", summary="green")],
        tools_used=[ToolUse(name=n, count=c) for n, c in tools],
        usage=Usage(model_calls=1, cost_usd=0.01),
        approval_ids=list(approvals),
        idempotency_key=key,
    )


def set_up(home: Path, *, todos: int = 3, claims: tuple[Principal, ...] = (), stop=False) -> Scene:
    """A loop `target` opened by the operator, the `claims` granted in order; with `stop`, the
    builder's turn reports a denied tool and the loop stops for the violation."""

    async def work(store: Store) -> Scene:
        await open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(
                objective="attacked",
                policy=POLICY,
                loop_id=LOOP,
                todos=[TodoInput(id=f"t{n}", title=f"todo {n}") for n in range(todos)],
            ),
        )
        scene = Scene(home, {})
        for who in claims:
            granted = await claim(store, who, ClaimRequest(loop_id=LOOP))
            assert granted.granted, granted.reasons
            scene.grants[who.id] = granted
        if stop:
            stopped = await update(
                store, BUILDER, report_request(scene.grants["builder"], "push", [("git.push", 1)])
            )
            assert stopped.status == "stopped"
        return scene

    return anyio.run(_with_store, home, work)


def ask_approval(scene: Scene) -> None:
    async def work(store: Store) -> str:
        grant = scene.grants["builder"]
        asked = await request_approval(
            store,
            BUILDER,
            ApprovalRequest(
                turn_id=grant.turn_id,  # type: ignore[arg-type]
                fence=grant.fence,  # type: ignore[arg-type]
                tool="deploy.prod",
                summary="ship it",
            ),
        )
        return asked.approval_id  # type: ignore[return-value]

    scene.approval_id = anyio.run(_with_store, scene.home, work)


# --- the attacks ------------------------------------------------------------------------------

Act = Callable[[dict[str, AgentClient], Scene], Awaitable[Any]]


@dataclass(frozen=True)
class Attack:
    """One row attack: the setup, the edit and its undoing, what the agent then tries, and what
    `verify` must say while the edit is in place."""

    setup: Callable[[Path], Scene]
    edit: Callable[[Db, Scene], Callable[[], None]]  # returns the restore
    act: Act
    findings: set[str]


def _update(who: str, key: str, tools=(), approval=False) -> Act:
    async def act(clients: dict[str, AgentClient], scene: Scene) -> Any:
        grant = scene.grants["builder"]
        return await clients[who].update(
            grant.turn_id,  # type: ignore[arg-type]
            grant.fence,  # type: ignore[arg-type]
            "completed",
            "done",
            key,
            tools_used=[{"name": n, "count": c} for n, c in tools],
            evidence=[{"kind": "test", "summary": "green"}],
            approval_ids=[scene.approval_id] if approval else [],
        )

    return act


def _claim(who: str) -> Act:
    async def act(clients: dict[str, AgentClient], scene: Scene) -> Any:
        return await clients[who].claim(LOOP)

    return act


def _policy_edit(db: Db, scene: Scene) -> Callable[[], None]:
    (digest,) = db.one("SELECT policy_digest FROM loops WHERE loop_id = ?", (LOOP,))
    (original,) = db.one("SELECT document FROM policies WHERE digest = ?", (digest,))
    doc = json.loads(original)
    doc["tools"]["deny"] = []
    doc["tools"]["allow"].append("git.push")
    db.run("UPDATE policies SET document = ? WHERE digest = ?", (json.dumps(doc), digest))
    return lambda: db.run("UPDATE policies SET document = ? WHERE digest = ?", (original, digest))


def _approval_approved(db: Db, scene: Scene) -> Callable[[], None]:
    ask_approval(scene)
    row = (scene.approval_id,)
    db.run(
        "UPDATE approvals SET status = 'approved', decided_by = 'alice', "
        "decided_at = requested_at, expires_at = '2999-01-01T00:00:00.000000Z' "
        "WHERE approval_id = ?",
        row,
    )
    return lambda: db.run(
        "UPDATE approvals SET status = 'pending', decided_by = NULL, decided_at = NULL, "
        "expires_at = NULL WHERE approval_id = ?",
        row,
    )


def _todo_reopened(db: Db, scene: Scene) -> Callable[[], None]:
    todo = scene.grants["builder"].todo_id
    where = (LOOP, todo)
    db.run(
        "UPDATE todos SET status = 'open', turn_id = NULL WHERE loop_id = ? AND todo_id = ?", where
    )
    turn = scene.grants["builder"].turn_id
    return lambda: db.run(
        "UPDATE todos SET status = 'claimed', turn_id = ? WHERE loop_id = ? AND todo_id = ?",
        (turn, *where),
    )


def _turns_held_at_zero(db: Db, scene: Scene) -> Callable[[], None]:
    (turns,) = db.one("SELECT turns FROM loops WHERE loop_id = ?", (LOOP,))
    db.run("UPDATE loops SET turns = 0 WHERE loop_id = ?", (LOOP,))
    return lambda: db.run("UPDATE loops SET turns = ? WHERE loop_id = ?", (turns, LOOP))


def _stopped_set_active(db: Db, scene: Scene) -> Callable[[], None]:
    status, reason = db.one("SELECT status, stop_reason FROM loops WHERE loop_id = ?", (LOOP,))
    db.run("UPDATE loops SET status = 'active', stop_reason = NULL WHERE loop_id = ?", (LOOP,))
    return lambda: db.run(
        "UPDATE loops SET status = ?, stop_reason = ? WHERE loop_id = ?", (status, reason, LOOP)
    )


def _turn_agent_swapped(db: Db, scene: Scene) -> Callable[[], None]:
    turn = scene.grants["builder"].turn_id
    db.run("UPDATE turns SET agent = 'reviewer' WHERE turn_id = ?", (turn,))
    return lambda: db.run("UPDATE turns SET agent = 'builder' WHERE turn_id = ?", (turn,))


def _merkle_node_zeroed(db: Db, scene: Scene) -> Callable[[], None]:
    (original,) = db.one("SELECT hash FROM merkle_nodes WHERE level = 0 AND idx = 1")
    db.run("UPDATE merkle_nodes SET hash = zeroblob(32) WHERE level = 0 AND idx = 1")
    return lambda: db.run(
        "UPDATE merkle_nodes SET hash = ? WHERE level = 0 AND idx = 1", (original,)
    )


ATTACKS: dict[str, Attack] = {
    "policy-document-edited": Attack(
        lambda home: set_up(home, claims=(BUILDER,)),
        _policy_edit,
        _update("builder", "push-3", [("git.push", 3)]),
        {"projection_mismatch"},
    ),
    "approval-row-set-approved": Attack(
        lambda home: set_up(home, claims=(BUILDER,)),
        _approval_approved,
        _update("builder", "deploy", [("deploy.prod", 1)], approval=True),
        {"state_mismatch", "projection_mismatch"},
    ),
    "claimed-todo-marked-open": Attack(
        lambda home: set_up(home, todos=2, claims=(BUILDER,)),
        _todo_reopened,
        _claim("reviewer"),
        {"state_mismatch", "projection_mismatch"},
    ),
    "turns-counter-held-at-zero": Attack(
        lambda home: set_up(home, claims=(BUILDER, REVIEWER)),
        _turns_held_at_zero,
        _claim("reviewer"),
        {"mac_invalid", "projection_mismatch"},
    ),
    "stopped-loop-set-active": Attack(
        lambda home: set_up(home, claims=(BUILDER,), stop=True),
        _stopped_set_active,
        _claim("reviewer"),
        {"mac_invalid", "projection_mismatch"},
    ),
    "turn-agent-swapped": Attack(
        lambda home: set_up(home, claims=(BUILDER,)),
        _turn_agent_swapped,
        _update("reviewer", "not-mine"),
        {"state_mismatch", "projection_mismatch"},
    ),
}


@pytest.fixture
def live(tmp_path: Path) -> Callable[[Path], Served]:
    """Starts `loopwarden serve --http` on a home (tokens minted first); stopped at teardown."""
    started: list[Served] = []

    def start(home: Path) -> Served:
        store = os.environ.get(STORE_ENV)  # the server's environment is cleared of it
        started.append(
            start_server(home, tmp_path / "logs", *(("--store", store) if store else ()))
        )
        return started[-1]

    yield start
    for served in started:
        stop_server(served)


def _try(served: Served, tokens: dict[str, Any], act: Act, scene: Scene) -> Any:
    """What the agents' call answers: its result, or the `ToolCallError` it raised."""

    async def attempt() -> Any:
        async with (
            connect_http(served.url, tokens["builder"].token) as builder,
            connect_http(served.url, tokens["reviewer"].token) as reviewer,
        ):
            try:
                return await act({"builder": builder, "reviewer": reviewer}, scene)
            except ToolCallError as exc:
                return exc

    return anyio.run(attempt)


PG_ATTACKS = ("policy-document-edited", "claimed-todo-marked-open", "stopped-loop-set-active")


@pytest.mark.parametrize(
    ("name", "backend"),
    [*((name, "sqlite") for name in ATTACKS), *((name, "postgresql") for name in PG_ATTACKS)],
    ids=[*ATTACKS, *(f"{name}-postgresql" for name in PG_ATTACKS)],
    indirect=["backend"],
)
def test_a_row_attack_is_seen_by_verify_and_refused_by_the_server(tmp_path, live, name, where):
    attack = ATTACKS[name]
    home = tmp_path / "home"
    scene = attack.setup(home)
    tokens = mint_tokens(home, [("builder", "agent"), ("reviewer", "agent")])
    assert verify(home)["verdict"] == "clean"
    restore = attack.edit(Db(home), scene)

    seen = verify(home)
    assert seen["verdict"] == "tampered"
    assert attack.findings <= finding_codes(seen), seen["findings"]

    served = live(home)
    before = journal_size(home)
    refused = _try(served, tokens, attack.act, scene)
    assert isinstance(refused, ToolCallError), refused
    assert refused.code == "integrity_error", refused
    assert "loopwarden verify" in str(refused)
    assert journal_size(home) == before, "a refused write sealed something"
    assert "integrity check failed" in served.stderr()

    restore()
    restored = verify(home)
    assert (restored["verdict"], restored["findings"], restored["notes"]) == (
        "clean",
        [],
        [UNVOUCHED],  # no witness policy was given: nothing else is unchecked
    )
    answer = _try(served, tokens, attack.act, scene)
    assert not isinstance(answer, ToolCallError), answer
    assert journal_size(home) > before, "the server acts again once the rows are the journal's"
    assert verify(home)["verdict"] == "clean"


@pytest.mark.backends
def test_a_forged_operator_token_row_opens_nothing(tmp_path, live, where):
    home = tmp_path / "home"
    set_up(home)
    forged = TOKEN_PREFIX + "chosen-by-the-attacker-0123456789abcdef"
    hashed = token_hash(forged)
    Db(home).run(
        "INSERT INTO tokens (token_hash, token_id, agent, role, created_at, revoked_at, mac) "
        "VALUES (?, ?, 'root', 'operator', '2026-01-01T00:00:00.000000Z', NULL, NULL)",
        (hashed, token_id_for(hashed)),
    )
    seen = verify(home)
    assert any(
        f["code"] == "mac_invalid" and token_id_for(hashed) in f["message"]
        for f in seen["findings"]
    ), seen["findings"]
    served = live(home)
    before = journal_size(home)

    answer = anyio.run(
        lambda: raw_initialize(served.url, "forged", Authorization=f"Bearer {forged}")
    )
    assert answer.status_code == 401, answer.text
    assert "MAC does not verify" in served.stderr()
    assert journal_size(home) == before

    Db(home).run("DELETE FROM tokens WHERE token_hash = ?", (hashed,))
    assert verify(home)["verdict"] == "clean"


def test_a_zeroed_merkle_node_is_reported_and_no_bad_proof_leaves(tmp_path, live):
    """The write path never reads old nodes (it appends from the MAC'd frontier), so writes go
    on; what a wrong node would spoil is a proof, and no proof built on one is handed out."""
    home = tmp_path / "home"
    scene = set_up(home, claims=(BUILDER, REVIEWER))
    restore = _merkle_node_zeroed(Db(home), scene)
    seen = verify(home)
    assert any(
        f["code"] == "node_mismatch" and "(0, 1)" in f["message"] for f in seen["findings"]
    ), seen["findings"]

    bundle = tmp_path / "target.json"
    export = CliRunner().invoke(
        app, ["export", LOOP, "-o", str(bundle), "--json", "--home", str(home)]
    )
    assert export.exit_code != 0 and not bundle.exists()
    assert "do not prove receipt" in export.output

    served = live(home)
    tokens = mint_tokens(home, [("builder", "agent")])

    async def look() -> Any:
        async with connect_http(served.url, tokens["builder"].token) as builder:
            return await builder.receipt(loop_id=LOOP, seq=1)  # leaf 0: its sibling is (0, 1)

    answer = anyio.run(look)
    assert answer.verified and not answer.inclusion_proof.verified

    restore()
    assert verify(home)["verdict"] == "clean"
    again = CliRunner().invoke(app, ["export", LOOP, "-o", str(bundle), "--home", str(home)])
    assert again.exit_code == 0, again.output
    (key,) = KeyStore(home).keyring().public_keys().values()
    checked = CliRunner().invoke(app, ["verify-bundle", str(bundle), "--key", public_key_b64(key)])
    assert checked.exit_code == 0, checked.output


# --- what release 0.1.0 signed under the same attacks -----------------------------------------

# (loop, seq, kind, rule) of each decision the attacked release signed, and the attack behind it.
JUDGED = [
    ("policy", 2, "turn.claimed", "grant_terms"),  # the grant lists the edited policy's tools
    ("policy", 3, "turn.reported", "tool_denied"),  # git.push × 3 accepted
    ("approval", 4, "turn.reported", "approval_invalid"),  # cites an approval never decided
    ("approval", 4, "turn.reported", "approval_required"),
    ("double", 3, "turn.claimed", "todo_not_eligible"),  # a second live turn on one todo
    ("counter", 8, "turn.claimed", "stop_due"),  # the 4th turn under max_turns = 3
    ("counter", 8, "turn.claimed", "stop_missing"),
    ("counter", 12, "turn.claimed", "stop_due"),  # ... and the 6th
    ("revived", 5, "turn.claimed", "loop_not_active"),  # a turn on a stopped loop
    ("swap", 3, "turn.reported", "not_turn_owner"),  # another agent's report accepted
]


@pytest.fixture(scope="module")
def attacked_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("attacked") / "home"
    shutil.copytree(ATTACKED, home)
    for key in (home / "keys").glob("*.key"):
        key.chmod(0o600)  # git keeps no permissions; the key directory demands them
    return {"home": home, "report": verify(home)}


@pytest.mark.parametrize(("loop", "seq", "kind", "rule"), JUDGED)
def test_what_0_1_0_signed_under_attack_is_judged_illegal(attacked_report, loop, seq, kind, rule):
    findings = attacked_report["report"]["findings"]
    assert any(
        f["code"] == "decision_illegal"
        and (f.get("loop_id"), f.get("seq"), f.get("kind"), f.get("rule"))
        == (loop, seq, kind, rule)
        for f in findings
    ), [f for f in findings if f.get("loop_id") == loop]


def test_the_attacked_0_1_0_journal_names_each_attacked_loop_and_nothing_else(attacked_report):
    report = attacked_report["report"]
    illegal = {f["loop_id"] for f in report["findings"] if f["code"] == "decision_illegal"}
    assert illegal == {"policy", "approval", "double", "counter", "revived", "swap"}
    assert any(f["code"] == "node_mismatch" for f in report["findings"])
    assert report["notes"] == [
        "schema 3 stores no row proofs: open it with this release to add them",
        UNVOUCHED,
    ]


def test_this_release_will_not_upgrade_and_serve_the_attacked_journal(attacked_report):
    """Upgrading re-derives every row from the journal; receipts that do not fold stop it."""
    result = CliRunner().invoke(app, ["loop", "list", "--home", str(attacked_report["home"])])
    assert result.exit_code == 3, result.output
    assert "does not fold" in " ".join(result.output.split()) or "refus" in result.output
