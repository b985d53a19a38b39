"""The tamper corpus: a real journal, damaged one way per case, must never audit clean.

A module fixture builds one data home with three loops (claims, reports, a policy refusal, an
approval requested / decided / used, a pause, a cancel) under a store that signs a checkpoint
every 4 receipts. Each case copies that home, damages the copy with raw `sqlite3` (as someone
with write access to the file would), and asserts that `audit()` reports the expected typed
finding naming the damaged receipt (loop / seq / leaf index) or checkpoint. Offline bundles get
the same treatment with `verify_bundle`. The untouched journal and bundle verify clean, so
every finding below is caused by its damage.

On PostgreSQL: the journal cases, the `verify` command's exits and the startup check run there
too (`backend`): the pristine store is copied into a fresh PostgreSQL schema (`store copy`'s
rows), damaged there through psycopg with the same statements, and audited there. The one case
that only SQLite can hold (an envelope rewritten as TEXT in its BLOB column) stays SQLite's.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BUILDER, OPERATOR, REVIEWER
from support import ENVELOPE_PARTS, cli, cli_env, control_loop, make_policy, stored_envelope
from typer.testing import CliRunner

from loopwarden.approvals.approval_ops import (
    ApprovalRequest,
    DecideApprovalRequest,
    decide_approval,
    request_approval,
)
from loopwarden.audit import bundles, partitions, proofs
from loopwarden.audit import database as audit_module
from loopwarden.audit.bundles import export_bundle, verify_bundle
from loopwarden.audit.database import audit
from loopwarden.audit.findings import Finding, Report
from loopwarden.canonical import canonical_bytes, sha256_digest
from loopwarden.cli.root import app
from loopwarden.clients import admin
from loopwarden.clock import ManualClock, parse_time
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import sign_checkpoint
from loopwarden.kernel.log.keys import Keyring, KeyStore, Signer, public_key_b64
from loopwarden.kernel.log.seals import receipt_id_for, seal
from loopwarden.kernel.state.events import Evidence, ToolUse, Usage
from loopwarden.kernel.store.copies import copy_rows
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import (
    LoopControlRequest,
    OpenLoopRequest,
    TodoInput,
    open_loop,
)
from loopwarden.principals import Principal
from loopwarden.turns.claim import ClaimRequest, ClaimResult, claim
from loopwarden.turns.update import UpdateRequest, update

DB = "loopwarden.db"
CHECKPOINT_EVERY = 4
POLICY = make_policy(stop={"on_violation": "refuse_turn"})  # a refusal that keeps the loop going

# The journal the fixture builds, in leaf order: (loop, seq, kind). Cases below rely on it.
LAYOUT = [
    ("alpha", 1, "loop.opened"),
    ("beta", 1, "loop.opened"),
    ("alpha", 2, "turn.claimed"),
    ("alpha", 3, "turn.reported"),
    ("alpha", 4, "turn.claimed"),
    ("alpha", 5, "turn.refused"),
    ("beta", 2, "turn.claimed"),
    ("beta", 3, "turn.reported"),
    ("alpha", 6, "turn.claimed"),
    ("alpha", 7, "approval.requested"),
    ("alpha", 8, "approval.decided"),
    ("alpha", 9, "turn.reported"),
    ("beta", 4, "loop.paused"),
    ("gamma", 1, "loop.opened"),
    ("gamma", 2, "loop.cancelled"),
]
CHECKPOINT_SIZES = [4, 8, 12, 15]  # every 4 receipts, plus one signed at the end


# --- the pristine journal --------------------------------------------------------------------


async def _build_journal(home: Path) -> None:
    keys = KeyStore(home)
    store = await Store.open(
        home / DB,
        keys.load_signer(),
        clock=ManualClock(),
        checkpoint_every=CHECKPOINT_EVERY,
        kinds=KINDS,
    )
    reports = iter(range(1000))

    async def turn(who: Principal, loop_id: str) -> ClaimResult:
        granted = await claim(store, who, ClaimRequest(loop_id=loop_id))
        assert granted.granted, granted.reasons
        return granted

    async def report(who, granted, outcome="completed", tools=None, approvals=()):
        return await update(
            store,
            who,
            UpdateRequest(
                turn_id=granted.turn_id,
                fence=granted.fence,
                outcome=outcome,
                tools_used=[ToolUse(name=n, count=c) for n, c in (tools or {}).items()],
                usage=Usage(model_calls=2, input_tokens=100, cost_usd=0.25),
                evidence=[Evidence(kind="test", summary="green")] if outcome == "completed" else [],
                summary=f"{outcome} {granted.todo_id}",
                approval_ids=list(approvals),
                idempotency_key=f"report-{next(reports)}",
            ),
        )

    async def open_(loop_id: str, todos: list[TodoInput]) -> None:
        await open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(objective=loop_id, policy=POLICY, todos=todos, loop_id=loop_id),
        )

    try:
        await open_(
            "alpha",
            [
                TodoInput(id="a", title="A"),
                TodoInput(id="b", title="B", depends_on=("a",)),
                TodoInput(id="c", title="C"),
            ],
        )
        await open_("beta", [TodoInput(title="x"), TodoInput(title="y")])
        assert (await report(BUILDER, await turn(BUILDER, "alpha"), tools={"fs.write": 2})).accepted
        refused = await report(BUILDER, await turn(BUILDER, "alpha"), tools={"git.push": 1})
        assert not refused.accepted and refused.status == "active"
        assert (await report(REVIEWER, await turn(REVIEWER, "beta"), "progress")).accepted
        granted = await turn(BUILDER, "alpha")
        asked = await request_approval(
            store,
            BUILDER,
            ApprovalRequest(
                turn_id=granted.turn_id,  # type: ignore[arg-type]
                fence=granted.fence,  # type: ignore[arg-type]
                tool="deploy.prod",
                summary="ship",
            ),
        )
        await decide_approval(
            store,
            OPERATOR,
            DecideApprovalRequest(approval_id=asked.approval_id, approve=True, reason="ok"),  # type: ignore[arg-type]
        )
        used = await report(
            BUILDER, granted, tools={"deploy.prod": 1}, approvals=[asked.approval_id]
        )
        assert used.accepted, used.reasons
        await control_loop(store, OPERATOR, "pause", LoopControlRequest(loop_id="beta"))
        await open_("gamma", [TodoInput(title="z")])
        await control_loop(store, OPERATOR, "cancel", LoopControlRequest(loop_id="gamma"))
        await store.write(lambda tx: tx.checkpoint())
    finally:
        await store.close()


@dataclass(frozen=True)
class Pristine:
    home: Path
    bundle: dict[str, Any]  # loop alpha, exported against the last checkpoint


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    home = tmp_path_factory.mktemp("pristine") / "home"
    anyio.run(_build_journal, home)
    with admin.open_reader(home) as reader:
        bundle = export_bundle(
            reader,
            "alpha",
            admin.keyring_of(home),
            parse_time(A_TIME),
            KeyStore(home).load_signer(),
        )
    return Pristine(home, bundle)


def run_audit(home: Path | Copy, loop_id: str | None = None) -> Report:
    where = home if isinstance(home, Copy) else Copy(home)
    with admin.open_reader(where.home, store=where.store) as reader:
        return audit(reader, admin.keyring_of(where.home), loop_id=loop_id)


def test_pristine_journal_has_the_layout_the_cases_rely_on(pristine):
    with admin.open_reader(pristine.home) as reader:
        rows = [(r.loop_id, r.seq, r.kind) for r in reader.iter_journal()]
        sizes = [cp.size for cp in reader.checkpoints()]
    assert rows == LAYOUT
    assert sizes == CHECKPOINT_SIZES


def test_pristine_journal_audits_clean(pristine):
    report = run_audit(pristine.home)
    assert report.findings == []
    assert (report.receipts, report.loops, report.checkpoints, report.tree_size) == (15, 3, 4, 15)


def test_pristine_bundle_verifies_clean_pinned_and_unpinned(pristine):
    unpinned = verify_bundle(copy.deepcopy(pristine.bundle))
    assert unpinned.findings == [] and not unpinned.keys_pinned
    assert (unpinned.receipts, unpinned.tree_size, unpinned.status) == (9, 15, "active")
    pinned = verify_bundle(copy.deepcopy(pristine.bundle), admin.keyring_of(pristine.home))
    assert pinned.findings == [] and pinned.keys_pinned


# --- raw damage helpers ----------------------------------------------------------------------


def unpack(envelope: bytes | str) -> tuple[dict[str, Any], dict[str, Any]]:
    env = json.loads(envelope)
    return env, json.loads(base64.b64decode(env["payload"]))


def repack(env: dict[str, Any], body: dict[str, Any]) -> bytes:
    """The envelope with a new payload and its *old* signature."""
    payload = base64.b64encode(canonical_bytes(body)).decode()
    return canonical_bytes({**env, "payload": payload})


class Db:
    """A damaged copy's database, opened with plain sqlite3 (no loopwarden code in the way), or
    with psycopg for a PostgreSQL copy (`store`): `?` placeholders either way."""

    def __init__(self, home: Path, store: str | None = None) -> None:
        self.home = home
        self.conn: Any = sqlite3.connect(home / DB) if store is None else pg_connection(store)

    def row(self, loop_id: str, seq: int) -> tuple[int, bytes, str]:
        """(leaf_index, envelope, digest) of one receipt."""
        leaf, digest, *parts = self.conn.execute(
            f"SELECT leaf_index, digest, {ENVELOPE_PARTS} FROM journal "
            "WHERE loop_id = ? AND seq = ?",
            (loop_id, seq),
        ).fetchone()
        return leaf, stored_envelope(*parts), digest

    def envelopes(self) -> list[bytes]:
        rows = self.conn.execute(f"SELECT {ENVELOPE_PARTS} FROM journal ORDER BY leaf_index")
        return [stored_envelope(*r) for r in rows]

    def replace_envelope(self, leaf_index: int, envelope: bytes, *, fix_columns: bool) -> None:
        """Swap a stored envelope; with `fix_columns`, also its digest and receipt id, as a
        careful forger would, so only the cryptography can tell."""
        if fix_columns:
            digest = sha256_digest(envelope)
            self.conn.execute(
                "UPDATE journal SET envelope = ?, digest = ?, receipt_id = ? WHERE leaf_index = ?",
                (envelope, digest, receipt_id_for(digest), leaf_index),
            )
        else:
            self.conn.execute(
                "UPDATE journal SET envelope = ? WHERE leaf_index = ?", (envelope, leaf_index)
            )

    def insert(self, leaf_index: int, envelope: bytes, *, receipt_id: str | None = None) -> None:
        _, body = unpack(envelope)
        digest = sha256_digest(envelope)
        self.conn.execute(
            "INSERT INTO journal (leaf_index, loop_id, seq, kind, receipt_id, digest, at, "
            "turn_id, envelope) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                leaf_index,
                body["loop_id"],
                body["seq"],
                body["kind"],
                receipt_id or receipt_id_for(digest),
                digest,
                body["at"],
                body.get("turn_id"),
                envelope,
            ),
        )

    def truncate(self, size: int) -> bytes:
        """Drop every receipt from leaf `size` on and make the stored Merkle log agree; returns
        the (genuine) root of what is left."""
        self.conn.execute("DELETE FROM journal WHERE leaf_index >= ?", (size,))
        frontier: list[bytes] = []
        for index, envelope in enumerate(self.envelopes()):
            frontier, _ = merkle.append_leaf(frontier, index, merkle.leaf_hash(envelope))
        self.conn.execute(
            "UPDATE log_state SET size = ?, frontier = ? WHERE id = 1", (size, b"".join(frontier))
        )
        return merkle.root_from_frontier(frontier)

    def origin(self) -> str:
        return self.conn.execute("SELECT value FROM meta WHERE key = 'origin'").fetchone()[0]


def edit_body(db: Db, loop_id: str, seq: int) -> tuple[int, dict[str, Any], dict[str, Any]]:
    leaf, envelope, _ = db.row(loop_id, seq)
    env, body = unpack(envelope)
    body["data"]["summary"] = "nothing to see here"
    body["data"]["usage"]["cost_usd"] = 0.0
    return leaf, env, body


# --- the journal cases -----------------------------------------------------------------------


def edited_body_not_resigned(db: Db) -> None:
    leaf, env, body = edit_body(db, "alpha", 3)
    db.replace_envelope(leaf, repack(env, body), fix_columns=True)


def edited_body_resigned_with_unknown_key(db: Db) -> None:
    leaf, _, body = edit_body(db, "alpha", 3)
    db.replace_envelope(leaf, seal(body, Signer.generate()).envelope, fix_columns=True)


def signature_bytes_flipped(db: Db) -> None:
    leaf, envelope, _ = db.row("alpha", 3)
    env, _ = unpack(envelope)
    sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    sig[0] ^= 0x01
    env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    db.replace_envelope(leaf, canonical_bytes(env), fix_columns=False)


def receipt_deleted(db: Db) -> None:
    db.conn.execute("DELETE FROM journal WHERE loop_id = 'alpha' AND seq = 3")


def envelopes_swapped_between_rows(db: Db) -> None:
    (leaf_a, env_a, _), (leaf_b, env_b, _) = db.row("alpha", 2), db.row("alpha", 3)
    db.replace_envelope(leaf_a, env_b, fix_columns=False)
    db.replace_envelope(leaf_b, env_a, fix_columns=False)


def rows_reordered(db: Db) -> None:
    """Two whole rows trade places in leaf order (each row stays self-consistent)."""
    db.conn.execute("UPDATE journal SET leaf_index = -1 WHERE leaf_index = 2")
    db.conn.execute("UPDATE journal SET leaf_index = 2 WHERE leaf_index = 3")
    db.conn.execute("UPDATE journal SET leaf_index = 3 WHERE leaf_index = -1")


def forged_receipt(
    db: Db, loop_id: str, seq: int, prev: str | None, kind_from=("beta", 4), signer=None
):
    """A schema-valid receipt for `loop_id`/`seq`, signed by a key nobody trusts."""
    _, template = unpack(db.row(*kind_from)[1])
    body = {**template, "loop_id": loop_id, "seq": seq, "at": "2026-01-01T01:00:00.000000Z"}
    body.pop("prev", None)
    if prev is not None:
        body["prev"] = prev
    return seal(body, signer or Signer.generate()).envelope


def forged_receipt_appended(db: Db) -> None:
    head = db.row("alpha", 9)
    db.insert(len(LAYOUT), forged_receipt(db, "alpha", 10, head[2]))


def signed_receipt_replayed(db: Db) -> None:
    """A genuine, validly signed envelope copied to the end of the journal as alpha's next."""
    leaf, _, _ = db.row("alpha", 2)
    db.conn.execute(
        "INSERT INTO journal (leaf_index, loop_id, seq, kind, receipt_id, digest, at, turn_id, "
        f"{ENVELOPE_PARTS}) SELECT ?, loop_id, 10, kind, ?, digest, at, turn_id, "
        f"{ENVELOPE_PARTS} FROM journal WHERE leaf_index = ?",
        (len(LAYOUT), "rcpt-" + secrets.token_hex(12), leaf),
    )


def forged_loop_inserted_mid_journal(db: Db) -> None:
    """Leaves from 5 on move up one; a whole forged loop's `loop.opened` takes leaf 5."""
    db.conn.execute("UPDATE journal SET leaf_index = -leaf_index - 1 WHERE leaf_index >= 5")
    db.conn.execute("UPDATE journal SET leaf_index = -leaf_index WHERE leaf_index < 0")
    db.insert(5, forged_receipt(db, "delta", 1, None, kind_from=("gamma", 1)))


def tail_truncated_checkpoints_kept(db: Db) -> None:
    db.truncate(10)


A_TIME = "2026-01-01T00:00:00.000000Z"  # a well-formed stored time


def tail_truncated_with_forged_checkpoint(db: Db) -> None:
    root = db.truncate(10)
    rogue = Signer.generate()
    db.conn.execute("DELETE FROM checkpoints WHERE size > 8")
    db.conn.execute(
        "INSERT INTO checkpoints (size, root, note, key_id, signed_at) VALUES (?, ?, ?, ?, ?)",
        (10, root, sign_checkpoint(db.origin(), 10, root, rogue), rogue.key_id, A_TIME),
    )


def checkpoint_time_garbled(db: Db) -> None:
    db.conn.execute("UPDATE checkpoints SET signed_at = ? WHERE size = 8", ("x",))


def checkpoint_root_replaced_and_resigned_with_real_key(db: Db) -> None:
    real = KeyStore(db.home).load_signer()
    fake_root = secrets.token_bytes(32)
    db.conn.execute(
        "UPDATE checkpoints SET root = ?, note = ? WHERE size = 8",
        (fake_root, sign_checkpoint(db.origin(), 8, fake_root, real)),
    )


def checkpoint_note_edited(db: Db) -> None:
    fake_root = base64.b64encode(secrets.token_bytes(32)).decode()
    (note,) = db.conn.execute("SELECT note FROM checkpoints WHERE size = 8").fetchone()
    lines = note.split("\n")
    lines[2] = fake_root
    db.conn.execute("UPDATE checkpoints SET note = ? WHERE size = 8", ("\n".join(lines),))


def projection_cost_edited(db: Db) -> None:
    db.conn.execute("UPDATE loops SET cost_micros = cost_micros - 1 WHERE loop_id = 'alpha'")


def projection_todo_status_edited(db: Db) -> None:
    db.conn.execute("UPDATE todos SET status = 'done' WHERE loop_id = 'beta' AND todo_id = 't2'")


def projection_turn_deleted(db: Db) -> None:
    db.conn.execute(
        "DELETE FROM turns WHERE turn_id = (SELECT min(turn_id) FROM turns WHERE loop_id = 'beta')"
    )


def projection_loop_status_edited(db: Db) -> None:
    db.conn.execute("UPDATE loops SET status = 'active' WHERE loop_id = 'gamma'")


def frontier_edited(db: Db) -> None:
    (frontier,) = db.conn.execute("SELECT frontier FROM log_state").fetchone()
    forged = secrets.token_bytes(32) + bytes(frontier)[32:]
    db.conn.execute("UPDATE log_state SET frontier = ?", (forged,))


@dataclass(frozen=True)
class Expect:
    """A finding that must be present: its code, and where it must point."""

    code: str
    loop_id: str | None = None
    seq: int | None = None
    leaf_index: int | None = None
    message: str | None = None  # a substring, for findings about checkpoints or the log

    def matches(self, f: Finding) -> bool:
        return (
            f.code == self.code
            and all(
                want is None or getattr(f, name) == want
                for name, want in (
                    ("loop_id", self.loop_id),
                    ("seq", self.seq),
                    ("leaf_index", self.leaf_index),
                )
            )
            and (self.message is None or self.message in f.message)
        )


@dataclass(frozen=True)
class Case:
    damage: Callable[[Db], None]
    expect: list[Expect] = field(default_factory=list)


CASES: dict[str, Case] = {
    "edited-body-not-resigned": Case(
        edited_body_not_resigned,
        [
            Expect("signature_invalid", "alpha", 3, 3),
            Expect("prev_mismatch", "alpha", 4, 4),
            Expect("root_mismatch", message="size 4"),
        ],
    ),
    "edited-body-resigned-with-unknown-key": Case(
        edited_body_resigned_with_unknown_key,
        [Expect("unknown_key", "alpha", 3, 3), Expect("root_mismatch", message="size 4")],
    ),
    "signature-bytes-flipped": Case(
        signature_bytes_flipped,
        [Expect("signature_invalid", "alpha", 3, 3), Expect("digest_mismatch", "alpha", 3, 3)],
    ),
    "receipt-deleted": Case(
        receipt_deleted,
        [
            Expect("leaf_gap", "alpha", 4, 4),
            Expect("seq_gap", "alpha", 4, 4),
            Expect("checkpoint_beyond_journal", message="size 15"),
            Expect("frontier_mismatch"),
        ],
    ),
    "envelopes-swapped-between-rows": Case(
        envelopes_swapped_between_rows,
        [
            Expect("seq_gap", "alpha", leaf_index=2),
            Expect("index_mismatch", "alpha", 2, 2),
            Expect("root_mismatch", message="size 4"),
        ],
    ),
    "rows-reordered": Case(
        rows_reordered,
        [Expect("seq_gap", "alpha", 3, 2), Expect("root_mismatch", message="size 4")],
    ),
    "forged-receipt-appended": Case(
        forged_receipt_appended,
        [
            Expect("unknown_key", "alpha", 10, 15),
            Expect("frontier_mismatch"),
            Expect("projection_mismatch", "alpha"),
        ],
    ),
    "signed-receipt-replayed": Case(
        signed_receipt_replayed,
        [
            Expect("seq_gap", "alpha", 10, 15),
            Expect("index_mismatch", "alpha", 10, 15),
            Expect("frontier_mismatch"),
        ],
    ),
    "forged-loop-inserted-mid-journal": Case(
        forged_loop_inserted_mid_journal,
        [
            Expect("unknown_key", "delta", 1, 5),
            Expect("root_mismatch", message="size 8"),
            Expect("projection_mismatch", "delta"),
            Expect("frontier_mismatch"),
        ],
    ),
    "tail-truncated-checkpoints-kept": Case(
        tail_truncated_checkpoints_kept,
        [
            Expect("checkpoint_beyond_journal", message="size 12"),
            Expect("checkpoint_beyond_journal", message="size 15"),
            Expect("projection_mismatch", "alpha"),
        ],
    ),
    "tail-truncated-with-forged-checkpoint": Case(
        tail_truncated_with_forged_checkpoint,
        [
            Expect("checkpoint_unknown_key", message="checkpoint 10"),
            Expect("projection_mismatch", "gamma"),
        ],
    ),
    "checkpoint-time-garbled": Case(
        checkpoint_time_garbled,
        [Expect("checkpoint_malformed", message="checkpoint 8: a stored time was changed")],
    ),
    "checkpoint-root-replaced-and-resigned-with-real-key": Case(
        checkpoint_root_replaced_and_resigned_with_real_key,
        [
            Expect("root_mismatch", message="size 8"),
            Expect("checkpoint_inconsistent", message="checkpoint 8 "),
            Expect("checkpoint_inconsistent", message="checkpoint 12 "),
        ],
    ),
    "checkpoint-note-edited": Case(
        checkpoint_note_edited,
        [Expect("checkpoint_signature_invalid", message="checkpoint 8")],
    ),
    "projection-cost-edited": Case(
        projection_cost_edited, [Expect("projection_mismatch", "alpha", message="loop.totals")]
    ),
    "projection-todo-status-edited": Case(
        projection_todo_status_edited,
        [Expect("projection_mismatch", "beta", message="todos[t2] differs in status")],
    ),
    "projection-turn-deleted": Case(
        projection_turn_deleted,
        [Expect("projection_mismatch", "beta", message="missing from the stored projection")],
    ),
    "projection-loop-status-edited": Case(
        projection_loop_status_edited,
        [Expect("projection_mismatch", "gamma", message="loop.status")],
    ),
    "frontier-edited": Case(frontier_edited, [Expect("frontier_mismatch")]),
}


def pg_connection(url: str) -> Any:
    """A psycopg connection in one transaction (committed by `damaged_copy`), `?` queries."""
    from loopwarden.kernel.sql.postgres import connect

    conn = connect(url)
    conn.execute("BEGIN")
    conn.commit = lambda: conn.execute("COMMIT")  # type: ignore[attr-defined]
    return conn


def copy_to(home: Path, url: str) -> None:
    """The pristine store, row for row, in the fresh PostgreSQL schema `url`."""

    async def copy() -> None:
        keys = KeyStore(home)
        with admin.open_reader(home) as source:
            store = await Store.open(
                url, keys.load_signer(), keyring=keys.keyring(), key_dir=home, kinds=KINDS
            )
            try:
                await store.write(lambda tx: copy_rows(source, tx.conn))
            finally:
                await store.close()

    anyio.run(copy)


@dataclass(frozen=True)
class Copy:
    """A damaged copy: its home (keys), and its store URL on PostgreSQL (None: the home's file)."""

    home: Path
    store: str | None = None

    def args(self) -> list[str]:
        return ["--store", self.store] if self.store else []


def damaged_copy(
    pristine: Pristine, tmp_path: Path, damage: Callable[[Db], None], pg: str | None = None
) -> Copy:
    home = tmp_path / "home"
    shutil.copytree(pristine.home, home)
    if pg is not None:
        copy_to(home, pg)
    db = Db(home, pg)
    try:
        damage(db)
        db.conn.commit()
    finally:
        db.conn.close()
    return Copy(home, pg)


@pytest.fixture
def pg(backend: str, request: pytest.FixtureRequest) -> str | None:
    """None on SQLite; on PostgreSQL a fresh schema's URL for the damaged copy."""
    return request.getfixturevalue("pg_url") if backend == "postgresql" else None


def describe(report: Report) -> str:
    return "\n".join(str(f.as_dict()) for f in report.findings)


@pytest.mark.backends
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_audit_detects_tampering(pristine, tmp_path, case, pg):
    home = damaged_copy(pristine, tmp_path, CASES[case].damage, pg)
    report = run_audit(home)
    assert not report.clean
    for expected in CASES[case].expect:
        assert any(expected.matches(f) for f in report.findings), (
            f"{expected} not among:\n{describe(report)}"
        )


def test_a_receipt_signed_by_a_key_planted_in_the_key_directory_is_not_trusted(pristine, tmp_path):
    """Writing a key into keys/ is not enough to be trusted: only the key history vouches."""
    rogue = Signer.generate()

    def forged_by_planted_key(db: Db) -> None:
        db.insert(len(LAYOUT), forged_receipt(db, "alpha", 10, db.row("alpha", 9)[2], signer=rogue))

    copy = damaged_copy(pristine, tmp_path, forged_by_planted_key)
    (copy.home / "keys" / f"{rogue.key_id}.pub").write_text(public_key_b64(rogue.public_key))
    result = CliRunner().invoke(app, ["verify", "--json", "--home", str(copy.home)])
    out = json.loads(result.stdout)
    assert (result.exit_code, out["verdict"]) == (3, "tampered")
    codes = {(f["code"], f.get("seq")) for f in out["findings"]}
    assert {("unknown_key", 10), ("key_unvouched", None)} <= codes, out["findings"]


def test_audit_reports_an_envelope_rewritten_as_text(pristine, tmp_path):
    def rewrite_as_text(db: Db) -> None:
        leaf, env, body = edit_body(db, "alpha", 3)
        db.conn.execute(
            "UPDATE journal SET envelope = ? WHERE leaf_index = ?",
            (repack(env, body).decode(), leaf),
        )

    report = run_audit(damaged_copy(pristine, tmp_path, rewrite_as_text))
    assert any(Expect("signature_invalid", "alpha", 3, 3).matches(f) for f in report.findings)


def test_one_deleted_receipt_is_reported_as_one_leaf_gap(pristine, tmp_path):
    report = run_audit(damaged_copy(pristine, tmp_path, receipt_deleted))
    gaps = [(f.leaf_index, f.message) for f in report.findings if f.code == "leaf_gap"]
    assert gaps == [(4, "leaf 3 is missing; the journal jumps to 4")]


def test_audit_of_one_loop_still_checks_the_whole_log(pristine, tmp_path):
    home = damaged_copy(pristine, tmp_path, edited_body_not_resigned)
    report = run_audit(home, loop_id="beta")
    codes = {f.code for f in report.findings}
    assert "root_mismatch" in codes  # alpha's edit breaks the tree every loop's proof uses
    assert "signature_invalid" not in codes  # alpha's receipts are not checked in depth
    assert report.receipts == 4


def home_env(home: Path) -> dict[str, str]:
    """No outside LOOPWARDEN_* (so SQLite's default synchronous mode); `home` is the data home."""
    return cli_env(synchronous=None, LOOPWARDEN_HOME=str(home))


@pytest.mark.backends
@pytest.mark.parametrize(
    ("case", "code"),
    [("edited-body-not-resigned", "signature_invalid"), ("receipt-deleted", "seq_gap")],
)
def test_verify_command_exits_3_and_lists_the_finding(pristine, tmp_path, case, code, pg):
    damaged = damaged_copy(pristine, tmp_path, CASES[case].damage, pg)
    proc = cli("verify", "--json", *damaged.args(), env=home_env(damaged.home))
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)
    assert out["verdict"] == "tampered"
    assert any(f["code"] == code and f.get("loop_id") == "alpha" for f in out["findings"])


@pytest.mark.backends
def test_verify_command_on_the_untouched_copy_exits_0(pristine, tmp_path, pg):
    copy = damaged_copy(pristine, tmp_path, lambda db: None, pg)
    result = CliRunner().invoke(app, ["verify", "--json", "--home", str(copy.home), *copy.args()])
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)["verdict"] == "clean"


@pytest.mark.backends
def test_a_store_missing_a_receipt_is_refused_with_exit_3(pristine, tmp_path, pg):
    """The cheap startup check catches a journal that disagrees with its projection heads."""
    copy = damaged_copy(pristine, tmp_path, receipt_deleted, pg)
    result = CliRunner().invoke(app, ["loop", "list", "--home", str(copy.home), *copy.args()])
    assert result.exit_code == 3
    assert "refusing to serve a damaged store" in " ".join(result.stderr.split())


# --- bundles ---------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def stranger_keys() -> dict[str, str]:
    other = Signer.generate()
    return {other.key_id: b64(other.public_key)}


def bundle_public_keys_replaced(bundle: dict[str, Any]) -> None:
    bundle["public_keys"] = stranger_keys()


def bundle_public_key_relabelled(bundle: dict[str, Any]) -> None:
    """The real key id, another key's bytes."""
    (real_id,) = bundle["public_keys"]
    bundle["public_keys"] = {real_id: next(iter(stranger_keys().values()))}


def bundle_receipt_edited(bundle: dict[str, Any]) -> None:
    item = bundle["receipts"][2]
    env, body = unpack(item["envelope"])
    body["data"]["usage"]["cost_usd"] = 0.0
    item["envelope"] = repack(env, body).decode()


def bundle_receipt_resigned_by_added_key(bundle: dict[str, Any]) -> None:
    """An attacker re-signs an edited receipt and adds their public key to the bundle."""
    rogue = Signer.generate()
    item = bundle["receipts"][2]
    _, body = unpack(item["envelope"])
    body["data"]["usage"]["cost_usd"] = 0.0
    item["envelope"] = seal(body, rogue).envelope.decode()
    bundle["public_keys"][rogue.key_id] = b64(rogue.public_key)


def bundle_receipt_dropped(bundle: dict[str, Any]) -> None:
    del bundle["receipts"][2]


def bundle_receipts_reordered(bundle: dict[str, Any]) -> None:
    items = bundle["receipts"]
    items[1], items[2] = items[2], items[1]


def bundle_inclusion_proof_forged(bundle: dict[str, Any]) -> None:
    bundle["receipts"][4]["inclusion_proof"][0] = b64(secrets.token_bytes(32))


def bundle_inclusion_proofs_swapped(bundle: dict[str, Any]) -> None:
    a, b = bundle["receipts"][4], bundle["receipts"][5]
    a["inclusion_proof"], b["inclusion_proof"] = b["inclusion_proof"], a["inclusion_proof"]


def bundle_leaf_index_moved(bundle: dict[str, Any]) -> None:
    bundle["receipts"][4]["leaf_index"] += 1


def bundle_checkpoint_root_edited(bundle: dict[str, Any]) -> None:
    lines = bundle["checkpoint"]["note"].split("\n")
    lines[2] = b64(secrets.token_bytes(32))
    bundle["checkpoint"]["note"] = "\n".join(lines)


def bundle_loop_relabelled(bundle: dict[str, Any]) -> None:
    bundle["loop_id"] = "beta"


def bundle_receipt_edited_and_last_cut(bundle: dict[str, Any]) -> None:
    """Two causes: one receipt edited, and the last two receipts cut off."""
    bundle_receipt_edited(bundle)
    del bundle["receipts"][-2:]


@dataclass(frozen=True)
class BundleCase:
    damage: Callable[[dict[str, Any]], None]
    expect: set[tuple[str, int | None]]  # exactly these (code, position): one per cause
    pinned: bool = False  # verify against the home's keys instead of the bundle's


EVERY_RECEIPT = range(1, 10)  # the pristine bundle holds 9 receipts
UNTRUSTED = {("unknown_key", p) for p in EVERY_RECEIPT} | {
    ("checkpoint_unknown_key", None),
    ("manifest_unknown_key", None),
}
BUNDLE_CASES: dict[str, BundleCase] = {
    "public-keys-replaced": BundleCase(bundle_public_keys_replaced, UNTRUSTED),
    "public-key-relabelled": BundleCase(bundle_public_key_relabelled, UNTRUSTED),
    "receipt-edited": BundleCase(bundle_receipt_edited, {("signature_invalid", 3)}),
    "receipt-edited-and-last-cut": BundleCase(
        bundle_receipt_edited_and_last_cut,
        {("signature_invalid", 3), ("bundle_incomplete", None)},
    ),
    "receipt-edited-and-resigned-by-added-key": BundleCase(
        bundle_receipt_resigned_by_added_key, {("inclusion_invalid", 3)}
    ),
    "receipt-edited-and-resigned-by-added-key-pinned": BundleCase(
        bundle_receipt_resigned_by_added_key, {("unknown_key", 3)}, pinned=True
    ),
    "receipt-dropped": BundleCase(bundle_receipt_dropped, {("seq_gap", 3)}),
    "receipts-reordered": BundleCase(bundle_receipts_reordered, {("seq_gap", 2)}),
    "inclusion-proof-forged": BundleCase(bundle_inclusion_proof_forged, {("inclusion_invalid", 5)}),
    "inclusion-proofs-swapped": BundleCase(
        bundle_inclusion_proofs_swapped, {("inclusion_invalid", 5), ("inclusion_invalid", 6)}
    ),
    "leaf-index-moved": BundleCase(bundle_leaf_index_moved, {("inclusion_invalid", 5)}),
    "checkpoint-root-edited": BundleCase(
        bundle_checkpoint_root_edited, {("checkpoint_signature_invalid", None)}
    ),
    "loop-relabelled": BundleCase(
        bundle_loop_relabelled, {("index_mismatch", p) for p in EVERY_RECEIPT}
    ),
}


@pytest.mark.parametrize("case", list(BUNDLE_CASES), ids=list(BUNDLE_CASES))
def test_bundle_verification_reports_each_tampering_once(pristine, case):
    spec = BUNDLE_CASES[case]
    bundle = copy.deepcopy(pristine.bundle)
    spec.damage(bundle)
    trusted = admin.keyring_of(pristine.home) if spec.pinned else None
    report = verify_bundle(json.loads(json.dumps(bundle)), trusted)
    found = [(f.code, f.position) for f in report.findings]
    assert sorted(found, key=str) == sorted(spec.expect, key=str), report.findings


def test_an_edited_receipt_does_not_stop_the_replay_of_the_genuine_ones(pristine):
    """The edit is one finding; the receipts after it still verify, chain and fold."""
    bundle = copy.deepcopy(pristine.bundle)
    bundle_receipt_edited(bundle)
    report = verify_bundle(bundle, admin.keyring_of(pristine.home))
    assert (report.receipts, report.status) == (9, "active")


def test_swapped_public_keys_do_not_matter_when_the_auditor_pins_the_real_key(pristine):
    """The bundle's own key list is untrusted input: pinned, the genuine receipts verify."""
    bundle = copy.deepcopy(pristine.bundle)
    bundle_public_keys_replaced(bundle)
    assert verify_bundle(bundle, admin.keyring_of(pristine.home)).findings == []


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b.__setitem__("public_keys", {"k": "AAAA"}),
        lambda b: b.__setitem__("checkpoint", "not an object"),
    ],
    ids=["short-public-key", "checkpoint-not-an-object"],
)
def test_malformed_bundle_is_a_finding_not_a_crash(pristine, damage):
    bundle = copy.deepcopy(pristine.bundle)
    damage(bundle)
    report = verify_bundle(bundle)
    assert "bundle_malformed" in {f.code for f in report.findings}


def test_a_bundle_with_its_last_receipts_dropped_is_detected(pristine):
    bundle = copy.deepcopy(pristine.bundle)
    del bundle["receipts"][-2:]  # hide the approval decision and the report that used it
    report = verify_bundle(bundle, admin.keyring_of(pristine.home))
    assert "bundle_incomplete" in {f.code for f in report.findings}


def test_a_bundle_whose_manifest_was_edited_to_match_a_cut_is_detected(pristine):
    bundle = copy.deepcopy(pristine.bundle)
    del bundle["receipts"][-2:]
    bundle["manifest"]["head_seq"] -= 2  # the cut hidden in the manifest too, without its key
    report = verify_bundle(bundle, admin.keyring_of(pristine.home))
    assert "manifest_signature_invalid" in {f.code for f in report.findings}


def reforge(bundle: dict[str, Any], rogue: Signer) -> dict[str, Any]:
    """The whole bundle rebuilt by an attacker: every receipt re-signed (chain re-linked), a new
    Merkle tree, a checkpoint signed by the attacker, and only the attacker's key listed."""
    envelopes: list[bytes] = []
    prev: str | None = None
    for item in bundle["receipts"]:
        _, body = unpack(item["envelope"])
        body["data"].get("usage", {}).update(cost_usd=0.0)
        body.pop("prev", None)
        if prev is not None:
            body["prev"] = prev
        sealed = seal(body, rogue)
        envelopes.append(sealed.envelope)
        prev = sealed.digest
    leaves = [merkle.leaf_hash(e) for e in envelopes]
    nodes = merkle.list_nodes(leaves)
    size, root = len(leaves), merkle.root_from_leaves(leaves)
    manifest = {**bundle["manifest"], "head_digest": prev, "checkpoint_size": size}
    return {
        **bundle,
        "manifest": manifest,
        "manifest_signature": {
            "keyid": rogue.key_id,
            "sig": b64(rogue.sign(bundles._manifest_message(manifest))),
        },
        "public_keys": {rogue.key_id: b64(rogue.public_key)},
        "checkpoint": {
            "note": sign_checkpoint(bundle["origin"], size, root, rogue),
            "size": size,
            "root": b64(root),
        },
        "receipts": [
            {
                "leaf_index": i,
                "receipt_id": receipt_id_for(sha256_digest(e)),
                "envelope": e.decode(),
                "inclusion_proof": [b64(h) for h in merkle.inclusion_proof(i, size, nodes)],
            }
            for i, e in enumerate(envelopes)
        ],
    }


@pytest.fixture
def reforged(pristine: Pristine, tmp_path: Path) -> Path:
    path = tmp_path / "reforged.json"
    path.write_text(json.dumps(reforge(copy.deepcopy(pristine.bundle), Signer.generate())))
    return path


def test_a_fully_reforged_bundle_passes_only_unpinned_and_fails_with_the_real_key(
    pristine, reforged
):
    bundle = json.loads(reforged.read_text())
    unpinned = verify_bundle(bundle)
    # Self-consistent forgery: nothing but a pinned key can tell, and the report says so.
    assert unpinned.clean and not unpinned.keys_pinned
    pinned = verify_bundle(bundle, admin.keyring_of(pristine.home))
    codes = {(f.code, f.position) for f in pinned.findings}
    assert ("checkpoint_unknown_key", None) in codes
    assert {("unknown_key", p) for p in range(1, 10)} <= codes


def test_verify_bundle_with_the_real_key_rejects_the_reforged_bundle_in_a_real_process(
    pristine, reforged
):
    real = KeyStore(pristine.home).load_signer()
    proc = cli(
        *("verify-bundle", str(reforged), "--key", public_key_b64(real.public_key), "--json"),
        env=home_env(pristine.home),
    )
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)
    assert out["keys_pinned"] is True and out["verdict"] == "tampered"
    assert "unknown_key" in {f["code"] for f in out["findings"]}


def test_verify_bundle_with_trusted_keys_file_rejects_the_reforged_bundle(pristine, reforged):
    ring: Keyring = admin.keyring_of(pristine.home)
    trusted = reforged.with_name("trusted.json")
    trusted.write_text(json.dumps({k: b64(v) for k, v in ring.public_keys().items()}))
    result = CliRunner().invoke(
        app, ["verify-bundle", str(reforged), "--trusted-keys", str(trusted)]
    )
    assert result.exit_code == 3
    assert "unknown_key" in result.stdout


def test_verify_bundle_with_an_empty_key_is_a_usage_error(reforged):
    result = CliRunner().invoke(app, ["verify-bundle", str(reforged), "--key", ""])
    assert result.exit_code == 2


@pytest.mark.parametrize("batch", [1024, 3], ids=["one-batch", "batches-in-flight"])
def test_parallel_signature_checks_find_exactly_what_inline_checks_find(
    pristine, tmp_path, monkeypatch, batch
):
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 0)  # force worker processes on a small log
    monkeypatch.setattr(audit_module, "BATCH", batch)  # small: the next batch checked meanwhile
    home = damaged_copy(pristine, tmp_path, edited_body_not_resigned).home
    with admin.open_reader(home) as reader:
        parallel = audit(reader, admin.keyring_of(home), workers=1)
        inline = audit(reader, admin.keyring_of(home), workers=0)
    assert parallel.findings == inline.findings
    assert any(f.code == "signature_invalid" for f in parallel.findings)
    assert parallel.receipts == inline.receipts and parallel.root == inline.root


def _counting_partitioned_replays(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The reports the partitioned replay made (it returns None to fall back to one replay)."""
    made: list[object] = []
    partitioned = audit_module._partitioned

    def counted(*args: object) -> object:
        report = partitioned(*args)  # type: ignore[arg-type]
        if report is not None:
            made.append(report)
        return report

    monkeypatch.setattr(audit_module, "_partitioned", counted)
    return made


def test_loops_that_share_an_idempotency_key_are_replayed_serially(pristine, tmp_path, monkeypatch):
    """A key two partitions touch could be judged differently in each: the audit falls back to
    one replay of every loop, with the serial audit's findings."""
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 0)
    replays = _counting_partitioned_replays(monkeypatch)
    end = partitions.Partition.end

    def shared(self: partitions.Partition) -> partitions.Ending:  # run in the forked workers
        ending = end(self)
        ending.touched.add(("someone", "the-same-key"))
        return ending

    monkeypatch.setattr(partitions.Partition, "end", shared)
    with admin.open_reader(pristine.home) as reader:
        report = audit(reader, admin.keyring_of(pristine.home), workers=2)
    assert report.clean and not replays
    monkeypatch.setattr(partitions.Partition, "end", end)
    with admin.open_reader(pristine.home) as reader:
        assert audit(reader, admin.keyring_of(pristine.home), workers=2).clean
    assert len(replays) == 1


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_every_tampering_is_reported_alike_by_the_parallel_and_the_serial_audit(
    pristine, tmp_path, monkeypatch, case
):
    """The whole tamper corpus, forged histories included: an audit that checks envelopes in
    worker processes, batches in flight, reports exactly the findings (in the same order) of
    one that checks everything in this process, one receipt after another."""
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 0)  # worker processes on a small log
    monkeypatch.setattr(audit_module, "BATCH", 3)  # batches checked while others are folded
    home = damaged_copy(pristine, tmp_path, CASES[case].damage).home
    replays = _counting_partitioned_replays(monkeypatch)
    with admin.open_reader(home) as reader:
        parallel = audit(reader, admin.keyring_of(home), workers=1)
        partitioned = audit(reader, admin.keyring_of(home), workers=2)  # loops in 2 workers
        serial = audit(reader, admin.keyring_of(home), workers=0)
    assert replays, "the loops were replayed in worker processes, not serially after all"
    for other in (parallel, partitioned):
        assert [f.as_dict() for f in other.findings] == [f.as_dict() for f in serial.findings]
        assert other.receipts == serial.receipts and other.root == serial.root
        assert other.loops == serial.loops
    assert not parallel.clean


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_stored_projections_read_ahead_are_judged_as_those_read_at_the_end(
    pristine, tmp_path, monkeypatch, case
):
    """A partitioned audit reads the stored projections while its workers replay
    (`StoredLoops.prepare`, as far as they take); every loop read ahead gives the findings of
    every loop read when the check asks, unreadable and damaged ones included."""
    home = damaged_copy(pristine, tmp_path, CASES[case].damage).home
    with admin.open_reader(home) as reader:
        at_the_end = audit(reader, admin.keyring_of(home), workers=0)
    made = proofs.StoredLoops.__init__

    def all_ahead(self: proofs.StoredLoops, *args: object) -> None:
        made(self, *args)  # type: ignore[arg-type]
        self.prepare(lambda: True)
        assert not self._ahead, "every stored loop was read ahead"

    monkeypatch.setattr(proofs.StoredLoops, "__init__", all_ahead)
    with admin.open_reader(home) as reader:
        ahead = audit(reader, admin.keyring_of(home), workers=0)
    assert [f.as_dict() for f in ahead.findings] == [f.as_dict() for f in at_the_end.findings]
    assert ahead.loops == at_the_end.loops
