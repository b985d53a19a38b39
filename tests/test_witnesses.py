"""Witnesses against the attacks they exist for, with real witness servers on loopback.

Every test runs `loopwarden witness serve` processes (a module's pair, shared: each test's log
has an origin of its own, so the witnesses' views of two tests never meet), real SQLite files in
a real home, and the witness client (`witnesses/submitter.py`) on a manual clock: a round is
`Submitter.step`, called by the test, and a backoff passes when the test moves the clock.

The attack (issue 45): someone holding every loopwarden key and the database removes a legal
receipt, rebuilds the tree and re-signs every checkpoint. `verify` alone calls the result clean;
with two witnesses and a quorum of two, the witnesses refuse the rewritten checkpoint and
`verify` and `verify-bundle` under the policy fail, naming what is missing, while an honest
log's bundle passes.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import nacl.signing
import pytest
from conftest import BUILDER, OPERATOR
from support import (
    Served,
    cli_env,
    dashboard_url,
    free_port,
    loopwarden,
    make_policy,
    run_cli_app,
    running,
    wait_listening,
)

from loopwarden.audit.bundles import export_bundle, verify_bundle
from loopwarden.audit.database import audit
from loopwarden.audit.findings import FindingCode, Report
from loopwarden.clock import ManualClock
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.log.keys import KeyStore, Signer
from loopwarden.kernel.log.seals import PAYLOAD_TYPE
from loopwarden.kernel.state.events import Evidence, ToolUse, Usage
from loopwarden.kernel.store.store import Store, snapshot
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.update import UpdateRequest, update
from loopwarden.witnesses.cosignatures import Cosigner
from loopwarden.witnesses.submitter import Pacing, Submitter
from loopwarden.witnesses.vkeys import ED25519, VerifierKey
from loopwarden.witnesses.witness_audit import check_bundle, check_store
from loopwarden.witnesses.witness_home import load_cosigner
from loopwarden.witnesses.witness_policy import WitnessPolicy, parse_policy

pytestmark = pytest.mark.anyio

DB = "loopwarden.db"
NAMES = ("attack", "rollback", "split", "down", "forged", "honest", "served")
POLICY = make_policy(stop={"on_violation": "refuse_turn"})  # a refusal that keeps the loop going
PACING = Pacing(checkpoint_after=None, timeout=5.0, first_retry=1.0, longest_retry=8.0)


def origin_of(name: str) -> str:
    return f"loopwarden.test/{name}"


# --- the witnesses ---------------------------------------------------------------------------


@dataclass
class RunningWitness:
    directory: Path
    port: int
    served: Served
    name: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def vkey(self) -> str:
        return str(load_cosigner(self.directory).vkey)


def _log_vkeys(keys_home: Path) -> list[str]:
    signer = KeyStore(keys_home).load_signer()
    return [str(VerifierKey(origin_of(n), ED25519, signer.public_key)) for n in NAMES]


def init_witness(directory: Path, name: str) -> None:
    """`loopwarden witness init DIR --name NAME`, in-process."""
    done = run_cli_app("witness", "init", str(directory), "--name", name)
    assert done.exit_code == 0, done.output


def spawn_witness(directory: Path, keys_home: Path, port: int | None = None) -> RunningWitness:
    """`loopwarden witness serve DIR` on loopback, trusting the tests' log keys (not yet
    listening: `wait_listening`)."""
    port = port or free_port()
    name = directory.name
    if not (directory / "witness.key").exists():
        init_witness(directory, f"{name}.test/witness")
    log = directory.parent / f"{name}-{port}.log"
    logs = [arg for vkey in _log_vkeys(keys_home) for arg in ("--log", vkey)]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            loopwarden("witness", "serve", str(directory), "--listen", f"127.0.0.1:{port}", *logs),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )
    served = Served(process, f"http://127.0.0.1:{port}", directory, log)
    return RunningWitness(directory, port, served, name)


def start_witness(directory: Path, keys_home: Path, port: int | None = None) -> RunningWitness:
    """`loopwarden witness serve DIR` on loopback, listening."""
    witness = spawn_witness(directory, keys_home, port)
    wait_listening(witness.served, witness.port)
    return witness


def stop_witness(witness: RunningWitness) -> None:
    witness.served.process.terminate()
    try:
        witness.served.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        witness.served.process.kill()
        witness.served.process.wait(timeout=10)


@pytest.fixture(scope="module")
def keys_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The log's keys (every test's home copies them): the witnesses trust them at start."""
    home = tmp_path_factory.mktemp("log-keys")
    KeyStore(home).load_signer()
    KeyStore(home).load_secret()
    return home


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, keys_home: Path
) -> Iterator[list[RunningWitness]]:
    root = tmp_path_factory.mktemp("witnesses")
    started: list[RunningWitness] = []
    try:
        for name in ("w1", "w2"):  # both start at once: the wait is one process start
            started.append(spawn_witness(root / name, keys_home))
        for witness in started:
            wait_listening(witness.served, witness.port)
        yield started
    finally:
        for witness in started:
            stop_witness(witness)


def policy_text(
    origin: str, signer: Signer, witnesses: list[RunningWitness], *, urls: bool = True
) -> str:
    lines = [f"log {VerifierKey(origin, ED25519, signer.public_key)}"]
    names = []
    for index, witness in enumerate(witnesses, start=1):
        url = f" {witness.url}" if urls else ""
        lines.append(f"witness W{index} {witness.vkey}{url}")
        names.append(f"W{index}")
    lines.append(f"group everyone all {' '.join(names)}")
    lines.append("quorum everyone")
    return "\n".join(lines) + "\n"


def auditor_policy(origin: str, signer: Signer, witnesses: list[RunningWitness]) -> WitnessPolicy:
    """The auditor's pinned policy: keys and quorum, no URLs."""
    return parse_policy(policy_text(origin, signer, witnesses, urls=False))


# --- a log -----------------------------------------------------------------------------------


@dataclass
class Log:
    home: Path
    store: Store
    clock: ManualClock
    signer: Signer
    origin: str

    @property
    def db(self) -> Path:
        return self.home / DB


async def open_log(home: Path, keys_home: Path, name: str, clock: ManualClock) -> Log:
    """A store in `home` (the module's keys) whose origin is `name`'s, which the witnesses
    trust. The origin is set before anything is signed, as the attacker does too."""
    if not (home / "keys").exists():
        shutil.copytree(keys_home / "keys", home / "keys")
    keys = KeyStore(home)
    signer = keys.load_signer()
    fresh = not (home / DB).exists()
    store = await _open(home, signer, clock)
    if fresh:
        await store.close()
        with sqlite3.connect(home / DB) as conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'origin'", (origin_of(name),))
        store = await _open(home, signer, clock)
    return Log(home, store, clock, signer, store.origin)


async def _open(home: Path, signer: Signer, clock: ManualClock) -> Store:
    return await Store.open(
        home / DB,
        signer,
        keyring=KeyStore(home).keyring(),
        key_dir=home,
        clock=clock,
        checkpoint_every=1000,
        kinds=KINDS,
    )


class History:
    """Governed turns through the operations themselves: every receipt legal."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reports = 0

    async def open(self, loop_id: str = "L") -> None:
        todos = [TodoInput(id=t, title=t.upper()) for t in ("a", "b", "c", "d", "e")]
        request = OpenLoopRequest(objective=loop_id, policy=POLICY, todos=todos, loop_id=loop_id)
        await open_loop(self.store, OPERATOR, request)

    async def turn(self, tools: dict[str, int], loop_id: str = "L") -> Any:
        granted = await claim(self.store, BUILDER, ClaimRequest(loop_id=loop_id))
        assert granted.granted, granted.reasons
        self.reports += 1
        return await update(
            self.store,
            BUILDER,
            UpdateRequest(
                turn_id=granted.turn_id,
                fence=granted.fence,
                outcome="completed",
                tools_used=[ToolUse(name=n, count=c) for n, c in tools.items()],
                usage=Usage(model_calls=1, input_tokens=10, cost_usd=0.01),
                evidence=[Evidence(kind="test", summary="green")],
                summary="done",
                idempotency_key=f"report-{self.reports}",
            ),
        )


async def history(store: Store, *, embarrassing: bool = True) -> None:
    """Open a loop, a good turn, a refused one (the git push the attacker wants gone), a good
    one. Without `embarrassing`, the refused turn never happened: the attacker's rewrite."""
    run = History(store)
    await run.open()
    assert (await run.turn({"fs.write": 1})).accepted
    if embarrassing:
        refused = await run.turn({"git.push": 1})
        assert not refused.accepted and refused.status == "active"
    assert (await run.turn({"fs.read": 1})).accepted


async def step(log: Log, policy_file_text: str, *, pacing: Pacing = PACING) -> None:
    """One round of the witness client of `log` with the operator's policy (URLs)."""
    submitter = Submitter(log.store, parse_policy(policy_file_text), clock=log.clock, pacing=pacing)
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(pacing.timeout)) as http:
        await submitter.step(http)


def audited(home: Path, policy: WitnessPolicy | None) -> Report:
    """`loopwarden verify` as a function: the audit, then the witnesses' part."""
    with snapshot(home / DB) as reader:
        secret = KeyStore(home).load_secret(create=False)
        report = audit(reader, KeyStore(home).keyring(), workers=0, integrity=Integrity(secret))
        check_store(reader, policy, report)
    return report


def codes(report: Report) -> set[str]:
    return {str(f.code) for f in report.findings}


def messages(report: Report, code: FindingCode) -> str:
    return " | ".join(f.message for f in report.findings if f.code == code)


async def bundle_of(log: Log, loop_id: str = "L") -> dict[str, Any]:
    await log.store.checkpoint()
    now = log.clock()
    return await log.store.read(
        lambda reader: export_bundle(reader, loop_id, log.store.keyring, now, log.signer)
    )


def bundle_report(bundle: dict[str, Any], policy: WitnessPolicy | None) -> Report:
    """`loopwarden verify-bundle` as a function."""
    report = verify_bundle(json.loads(json.dumps(bundle)))
    check_bundle(bundle["checkpoint"]["note"], policy, bundle["origin"], report)
    return report


def witness_rows(log: Log) -> dict[str, Any]:
    with snapshot(log.db) as reader:
        return {row.vkey: row for row in reader.witness_rows()}


def replace_database(target: Path, source: Path) -> None:
    """The attacker swaps the database file (its WAL and shared memory go with it)."""
    for suffix in ("-wal", "-shm"):
        Path(str(target) + suffix).unlink(missing_ok=True)
    shutil.copyfile(source, target)


# --- the attack ------------------------------------------------------------------------------


async def test_a_rewritten_history_is_clean_to_verify_alone_and_refused_by_a_quorum_of_two(
    tmp_path: Path, keys_home: Path, pair: list[RunningWitness]
) -> None:
    clock = ManualClock()
    honest = await open_log(tmp_path / "home", keys_home, "attack", clock)
    operator = policy_text(honest.origin, honest.signer, pair)
    policy = auditor_policy(honest.origin, honest.signer, pair)
    await history(honest.store)
    await honest.store.checkpoint()
    await step(honest, operator)
    honest_bundle = await bundle_of(honest)  # the checkpoint it takes is the cosigned one
    size = honest_bundle["checkpoint"]["size"]
    assert audited(honest.home, policy).clean
    passing = bundle_report(honest_bundle, policy)
    assert passing.clean, passing.findings
    assert passing.witnesses and passing.witnesses["cosigned_by"] == ["W1", "W2"]
    await honest.store.close()

    # The attacker holds the keys (the same home's key directory) and the database: they
    # replay the history without the refused turn into a fresh file with the log's origin,
    # re-signing every receipt and checkpoint, and put it in place of the real one.
    forged_home = tmp_path / "attacker"
    shutil.copytree(honest.home / "keys", forged_home / "keys")
    rewritten = await open_log(forged_home, keys_home, "attack", ManualClock())
    await history(rewritten.store, embarrassing=False)
    await rewritten.store.checkpoint()
    await rewritten.store.close()
    replace_database(honest.db, rewritten.db)

    # Without witnesses, nothing tells: every signature is loopwarden's, every rule held.
    alone = audited(honest.home, None)
    assert alone.clean, alone.findings
    assert any("nothing outside loopwarden vouches" in note for note in alone.notes)
    done = run_cli_app("verify", "--home", str(honest.home))
    assert done.exit_code == 0, done.output

    # With the auditor's policy: no checkpoint of this history has the quorum.
    judged = audited(honest.home, policy)
    assert codes(judged) == {"witness_quorum_missing"}
    assert "missing W1, W2" in messages(judged, FindingCode.WITNESS_QUORUM_MISSING)
    policy_file = tmp_path / "auditor.policy"
    policy_file.write_text(policy_text(honest.origin, honest.signer, pair, urls=False))
    done = run_cli_app("verify", "--home", str(honest.home), "--witness-policy", str(policy_file))
    assert done.exit_code == 3, done.output
    assert "witness_quorum_missing" in done.stdout and "missing W1, W2" in done.stdout

    # Served on, the rewritten log asks the witnesses to cosign: both refuse, and it grows
    # until it is as long as the history they cosigned, so the refusal is the proof's.
    forged = await open_log(honest.home, keys_home, "attack", ManualClock())
    run = History(forged.store)
    run.reports = 100  # idempotency keys the rewritten history has not used
    while (await forged.store.read(lambda r: r.log_state().size)) < size + 1:
        assert (await run.turn({"fs.read": 1})).accepted
    await forged.store.checkpoint()
    await step(forged, operator)
    rows = witness_rows(forged)
    assert [r.conflict for r in rows.values()] == [rows[k].conflict for k in rows]
    assert all(r.conflict and "inconsistent" in r.conflict for r in rows.values()), rows
    with snapshot(forged.db) as reader:
        assert reader.cosignatures() == []
    judged = audited(forged.home, policy)
    assert codes(judged) == {"witness_quorum_missing", "witness_conflict"}
    assert len([f for f in judged.findings if f.code == FindingCode.WITNESS_CONFLICT]) == 2

    # Its bundle fails under the policy, naming the witnesses it lacks; the honest one passes.
    forged_bundle = await bundle_of(forged)
    failing = bundle_report(forged_bundle, policy)
    assert codes(failing) == {"witness_quorum_missing"}
    assert "missing W1, W2" in messages(failing, FindingCode.WITNESS_QUORUM_MISSING)
    assert bundle_report(forged_bundle, None).clean  # without the policy it would pass
    files = {"honest": honest_bundle, "forged": forged_bundle}
    for name, bundle in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(bundle))
    for name, expected in (("honest", 0), ("forged", 3)):
        bundle_file = str(tmp_path / f"{name}.json")
        done = run_cli_app("verify-bundle", bundle_file, "--witness-policy", str(policy_file))
        assert done.exit_code == expected, (name, done.output)
    await forged.store.close()


# --- rollback, split view, a witness down, a forged cosignature -------------------------------


async def test_a_rollback_to_an_older_size_is_a_conflict_and_no_later_checkpoint_is_cosigned(
    tmp_path: Path, keys_home: Path, pair: list[RunningWitness]
) -> None:
    clock = ManualClock()
    log = await open_log(tmp_path / "home", keys_home, "rollback", clock)
    operator = policy_text(log.origin, log.signer, pair)
    policy = auditor_policy(log.origin, log.signer, pair)
    run = History(log.store)
    await run.open()
    await log.store.checkpoint()
    await step(log, operator)
    await log.store.close()
    backup = tmp_path / "backup.db"
    shutil.copyfile(log.db, backup)  # size 1, cosigned by both
    log = await open_log(log.home, keys_home, "rollback", clock)
    run = History(log.store)
    for _ in range(2):
        assert (await run.turn({"fs.read": 1})).accepted
    await log.store.checkpoint()
    await step(log, operator)  # size 5, cosigned by both
    assert audited(log.home, policy).clean
    await log.store.close()

    replace_database(log.db, backup)  # rolled back to size 1
    log = await open_log(log.home, keys_home, "rollback", clock)
    assert audited(log.home, policy).clean  # offline, an old state is a consistent state
    run = History(log.store)
    run.reports = 10  # new idempotency keys: the old calls are gone with the rollback
    assert (await run.turn({"fs.write": 1})).accepted  # a different size-3 history
    await log.store.checkpoint()
    await step(log, operator)
    rows = witness_rows(log)
    assert len(rows) == 2 and all(
        r.conflict and "larger than its latest checkpoint (3)" in r.conflict for r in rows.values()
    ), rows
    judged = audited(log.home, policy)
    assert codes(judged) == {"witness_quorum_missing", "witness_conflict"}
    assert "last checkpoint with the quorum is 1" in messages(
        judged, FindingCode.WITNESS_QUORUM_MISSING
    )
    await log.store.close()


async def test_a_split_view_shown_to_two_witnesses_gathers_the_quorum_on_neither_side(
    tmp_path: Path, keys_home: Path, pair: list[RunningWitness]
) -> None:
    w1, w2 = pair
    one = await open_log(tmp_path / "one", keys_home, "split", ManualClock())
    other = await open_log(tmp_path / "other", keys_home, "split", ManualClock())
    assert one.origin == other.origin
    policy = auditor_policy(one.origin, one.signer, pair)
    await history(one.store)  # the true history, shown to W1 only
    await history(other.store, embarrassing=False)  # the rewritten one, shown to W2 only
    for log, witness in ((one, w1), (other, w2)):
        await log.store.checkpoint()
        await step(log, policy_text(log.origin, log.signer, [witness]))
        assert not any(r.conflict for r in witness_rows(log).values())
    for log, have, lacks in ((one, "W1", "W2"), (other, "W2", "W1")):
        judged = audited(log.home, policy)
        assert codes(judged) == {"witness_quorum_missing"}
        assert f"missing {lacks} (cosigned by {have})" in messages(
            judged, FindingCode.WITNESS_QUORUM_MISSING
        )
        report = bundle_report(await bundle_of(log), policy)
        assert codes(report) == {"witness_quorum_missing"}
    # Each side asking the other witness meets the view that witness holds: a conflict.
    await step(one, policy_text(one.origin, one.signer, pair))
    conflicts = {row.vkey: row.conflict for row in witness_rows(one).values() if row.conflict}
    assert list(conflicts) == [w2.vkey], conflicts
    for log in (one, other):
        await log.store.close()


async def test_a_witness_down_blocks_no_write_and_the_gap_is_reported_until_it_is_back(
    tmp_path: Path, keys_home: Path, pair: list[RunningWitness]
) -> None:
    w1 = pair[0]
    clock = ManualClock()
    log = await open_log(tmp_path / "home", keys_home, "down", clock)
    hanging = Hanging()  # accepts connections and never answers
    down = RunningWitness(tmp_path / "w3", hanging.port, pair[1].served, "w3")
    # The third witness's key exists before it ever runs: the policy names it.
    init_witness(down.directory, "w3.test/witness")
    witnesses = [w1, down]
    operator = policy_text(log.origin, log.signer, witnesses)
    policy = auditor_policy(log.origin, log.signer, witnesses)
    run = History(log.store)
    await run.open()
    await log.store.checkpoint()

    # A round waits on the hanging witness (up to its timeout); writes go on meanwhile.
    wrote = anyio.Event()
    async with anyio.create_task_group() as group:

        async def submit() -> None:
            await step(log, operator, pacing=Pacing(checkpoint_after=None, timeout=30.0))
            assert wrote.is_set(), "the round ended before the writes: nothing was shown"

        group.start_soon(submit)
        assert await anyio.to_thread.run_sync(hanging.accepted.wait, 30)
        for _ in range(3):
            assert (await run.turn({"fs.read": 1})).accepted
        wrote.set()
        hanging.close()  # the witness goes away: the round ends with a failure
    rows = witness_rows(log)
    assert rows[down.vkey].error.startswith(("transport error", "connection failed")), rows
    assert rows[w1.vkey].error is None and rows[w1.vkey].cosigned == 1
    await log.store.checkpoint()  # size 7: W1 cosigns, W3 is still down
    await step(log, operator)
    judged = audited(log.home, policy)
    assert codes(judged) == {"witness_quorum_missing"}
    gap = messages(judged, FindingCode.WITNESS_QUORUM_MISSING)
    assert "missing W2 (cosigned by W1)" in gap and "no checkpoint has the quorum" in gap

    # The witness comes up where the policy says; once the backoff has passed, it cosigns.
    started = start_witness(down.directory, keys_home, port=down.port)
    try:
        await step(log, operator)  # still backing off: nothing is sent
        assert witness_rows(log)[down.vkey].cosigned == 0
        clock.advance(PACING.longest_retry)
        await step(log, operator)
        rows = witness_rows(log)
        assert rows[down.vkey].cosigned == 7 and rows[down.vkey].error is None
        assert audited(log.home, policy).clean
    finally:
        stop_witness(started)
        await log.store.close()


class Hanging:
    """A TCP listener on loopback that accepts and never answers (a witness that hangs)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        self.conns.append(conn)
        self.accepted.set()

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.sock.close()


async def test_a_forged_cosignature_fails_the_audit_and_the_bundle(
    tmp_path: Path, keys_home: Path, pair: list[RunningWitness]
) -> None:
    log = await open_log(tmp_path / "home", keys_home, "forged", ManualClock())
    operator = policy_text(log.origin, log.signer, pair)
    policy = auditor_policy(log.origin, log.signer, pair)
    await history(log.store)
    await log.store.checkpoint()
    await step(log, policy_text(log.origin, log.signer, pair[:1]))  # W1 only
    bundle = await bundle_of(log)
    # A line under W2's name and key hash, signed by a key that is not W2's.
    w2 = load_cosigner(pair[1].directory)
    impostor = Cosigner(w2.name, Signer.generate().signing_key)
    text = bundle["checkpoint"]["note"].split("\n\n")[0] + "\n"
    name, blob = impostor.cosign(text, 1_767_225_600).rstrip("\n").split(" ")[1:]
    real_hash = w2.vkey.key_hash
    forged = base64.b64encode(real_hash + base64.b64decode(blob)[4:]).decode()
    forged_line = f"\u2014 {name} {forged}\n"
    size = bundle["checkpoint"]["size"]
    with sqlite3.connect(log.db) as conn:
        conn.execute(
            "INSERT INTO cosignatures VALUES (?, ?, ?, ?, ?)",
            (size, w2.name, real_hash.hex(), forged_line, "2026-01-01T00:00:00.000000Z"),
        )
    judged = audited(log.home, policy)
    assert codes(judged) == {"cosignature_invalid", "witness_quorum_missing"}
    assert "witness W2" in messages(judged, FindingCode.COSIGNATURE_INVALID)
    bundle["checkpoint"]["note"] += forged_line
    for receipt in bundle["receipts"]:
        receipt["tlog_proof"] += forged_line
    report = bundle_report(bundle, policy)
    assert codes(report) == {"cosignature_invalid", "witness_quorum_missing"}
    # The honest client counts no stored line it cannot verify: it asks W2, which cosigns,
    # and W2's own line takes the forged one's place.
    await step(log, operator)
    with snapshot(log.db) as reader:
        lines = [c.line for c in reader.cosignatures(size)]
    assert forged_line not in lines and len(lines) == 2
    assert audited(log.home, policy).clean
    await log.store.close()


async def test_verify_without_a_policy_says_nothing_outside_vouches_and_the_payload_type_holds(
    tmp_path: Path, keys_home: Path
) -> None:
    log = await open_log(tmp_path / "home", keys_home, "honest", ManualClock())
    await history(log.store)
    report = audited(log.home, None)
    assert report.clean and report.witnesses is None
    assert any("nothing outside loopwarden vouches" in n for n in report.notes)
    bundle = await bundle_of(log)
    assert PAYLOAD_TYPE in bundle["receipts"][0]["envelope"]
    checked = bundle_report(bundle, None)
    assert checked.clean and any("nothing outside loopwarden" in n for n in checked.notes)
    await log.store.close()


# --- served: the client in `serve --witness`, the alarm on the dashboard and in /metrics -------


def wait_until(what: str, done: Any, seconds: float = 120.0) -> Any:
    """Poll a real server's answer until `done()` is truthy (bounded): the client's round runs
    in another process, on its own clock."""
    deadline = time.monotonic() + seconds
    while True:
        found = done()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


async def test_serve_submits_checkpoints_and_a_conflict_is_an_alarm_on_the_dashboard_and_in_metrics(
    tmp_path: Path, keys_home: Path, pair: list[RunningWitness]
) -> None:
    w2 = pair[1]
    root = tmp_path / "served"
    log = await open_log(root / "home", keys_home, "served", ManualClock())
    await History(log.store).open()
    await log.store.close()
    # Before it serves, someone shows W2 another history of this log (its keys, its origin).
    fork = await open_log(tmp_path / "fork", keys_home, "served", ManualClock())
    await history(fork.store)
    await fork.store.checkpoint()
    await step(fork, policy_text(fork.origin, fork.signer, [w2]))
    await fork.store.close()

    policy_file = root / "witnesses.policy"
    policy_file.write_text(policy_text(log.origin, log.signer, pair))
    with running(root, "--witness", str(policy_file)) as served:
        minted = run_cli_app(
            "token", "create", "--agent", "alice", "--role", "operator", "--json",
            "--home", str(served.home),
        )  # fmt: skip
        assert minted.exit_code == 0, minted.output
        token = json.loads(minted.stdout)["token"]
        exported = run_cli_app(
            "export", "L", "-o", str(root / "b.json"), "--home", str(served.home)
        )
        assert exported.exit_code == 0, exported.output  # it signs a checkpoint: size 1
        base = dashboard_url(served)
        headers = {"Authorization": f"Bearer {token}"}

        def metrics() -> str:
            return httpx2.get(base + "/metrics", headers=headers, timeout=30).text

        wait_until(
            "W1's cosignature and W2's conflict in /metrics",
            lambda: (
                'loopwarden_witness_cosignatures_total{witness="W1"} 1.0' in metrics()
                and 'loopwarden_witness_conflicts_total{witness="W2"}' in metrics()
            ),
        )
        with httpx2.Client(base_url=base, follow_redirects=False, timeout=30) as http:
            form = http.get("/login")
            nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert nonce, form.text
            http.post("/login", data={"token": token, "csrf": nonce.group(1)})
            page = http.get("/audit").text
        assert "CONFLICT" in page and "w2.test/witness" in page
        assert "w1.test/witness" in page and "verifies" in page
        status = run_cli_app("witness", "status", "--home", str(served.home), "--json")
        assert status.exit_code == 3, status.output
        standing = json.loads(status.stdout)
        assert standing["cosigned_by"] == ["w1.test/witness"]
    judged = audited(root / "home", auditor_policy(log.origin, log.signer, pair))
    assert codes(judged) == {"witness_quorum_missing", "witness_conflict"}


# --- the client's reading of answers, against a stand-in witness (no network) -----------------


async def test_the_client_stores_no_answer_it_cannot_verify_and_reads_a_v1_0_409_as_a_conflict(
    tmp_path: Path, keys_home: Path
) -> None:
    log = await open_log(tmp_path / "home", keys_home, "honest", ManualClock())
    await History(log.store).open()
    await log.store.checkpoint()
    real = Cosigner("w.test/stand-in", nacl.signing.SigningKey.generate())
    policy = parse_policy(f"witness S {real.vkey} http://127.0.0.1:9\nquorum S\n")
    answers: list[httpx2.Response] = []

    def witness(request: httpx2.Request) -> httpx2.Response:
        return answers.pop(0)

    impostor = Cosigner(real.name, nacl.signing.SigningKey.generate())
    note = await log.store.read(lambda r: r.latest_checkpoint().note)
    text = note.split("\n\n")[0] + "\n"
    answers.append(httpx2.Response(200, content=impostor.cosign(text, 1_767_225_600).encode()))
    submitter = Submitter(log.store, policy, clock=log.clock, pacing=PACING)
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(witness)) as http:
        await submitter.step(http)
        [row] = witness_rows(log).values()
        assert "no valid cosignature" in (row.error or "") and row.conflict is None
        with snapshot(log.db) as reader:
            assert reader.cosignatures() == []
        # A tlog-witness v1.0.0 witness says "another root at this size" with a 409 naming
        # the size that was sent.
        log.clock.advance(PACING.longest_retry)
        size = (await log.store.read(lambda r: r.latest_checkpoint())).size
        sized = {"Content-Type": "text/x.tlog.size"}
        answers.append(httpx2.Response(409, content=f"{size}\n".encode(), headers=sized))
        answers.append(httpx2.Response(409, content=f"{size}\n".encode(), headers=sized))
        await submitter.step(http)
        [row] = witness_rows(log).values()
        assert row.conflict and "another tree of size" in row.conflict
    await log.store.close()
