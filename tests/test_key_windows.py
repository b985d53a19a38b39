"""Keys that retire (issue 44, findings 1 and 2).

A rotation states until when the retired key may sign; servers sharing the home move to the new
key and a server that cannot reach it stops signing at that time; `verify` reports a receipt a
key signed outside its window, also one dated back into it. A store anchors the genesis key of
the history it was opened with, so a key history deleted (or swapped for another) is a failing
finding, not a note: a key planted in the key directory is never trusted.

Attacker of finding 1: the retired private key, `keys/integrity.key` and write access to the
database. Attacker of finding 2: write access to the key directory and the database.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BASIC_POLICY, OPERATOR
from support import (
    cli,
    cli_json,
    cli_open_loop,
    connect_http,
    control_loop,
    make_policy,
    mint_tokens,
    open_db,
    raw_sql,
    running,
)

from loopwarden.clients.agent import ToolCallError
from loopwarden.clock import ManualClock, parse_time
from loopwarden.errors import KeyRetired
from loopwarden.kernel.log.keys import HISTORY_ORIGIN, KeyStore, Signer, genesis, public_key_b64
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import LoopControlRequest, OpenLoopRequest, open_loop
from loopwarden.server.runtime import Runtime
from loopwarden.server.settings import Settings

LOOP = "L1"


def _verify(home: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    done = cli("verify", "--home", str(home), "--json", *extra)
    return done.returncode, json.loads(done.stdout)


def _findings(out: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in out["findings"] if f["code"] == code]


def _signer_of(home: Path) -> Signer:
    """The home's active private key, as someone who copied the file holds it."""
    keys = KeyStore(home)
    seed = base64.b64decode((keys.dir / f"{keys.active_id()}.key").read_text())
    return Signer.from_seed(seed)


def _forge(home: Path, signer: Signer, when: datetime, action: str) -> None:
    """What the attacker does: open the database with a private key of their choosing, the
    home's integrity secret and a clock of their choosing, and seal an operator's act."""
    secret = KeyStore(home).load_secret(create=False)

    async def run() -> None:
        store = await Store.open(
            home / "loopwarden.db", signer, secret=secret, clock=ManualClock(when), kinds=KINDS
        )
        try:
            if action == "open":  # a loop of its own, whose time is its own to choose
                request = OpenLoopRequest(objective="o", policy=BASIC_POLICY, loop_id="L2")
                await open_loop(store, OPERATOR, request)
            else:
                await control_loop(store, OPERATOR, action, LoopControlRequest(loop_id=LOOP))
        finally:
            await store.close()

    anyio.run(run)


@pytest.fixture
def opened(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    policy = make_policy(
        agents=["builder"], claims={"max_active": 100, "max_active_per_agent": 100}
    )
    cli_open_loop(home, LOOP, policy, tuple(f"todo {i}" for i in range(60)))
    return home


def test_a_receipt_the_retired_key_signs_after_its_grace_is_reported(opened):
    home = opened
    retired = _signer_of(home)
    rotated = cli_json("keys", "rotate", "--grace", "1s", "--home", str(home))
    assert rotated["retired"] == retired.key_id
    until = parse_time(rotated["retired_signs_until"])
    history = (home / "keys" / "history").read_text().splitlines()
    assert json.loads(history[-1]).split("\n")[5] == (
        f"{retired.key_id} signs until {rotated['retired_signs_until']}"
    )
    assert _verify(home)[0] == 0

    # Seconds after the grace, and 30 days after, the stolen key signs an operator's acts.
    _forge(home, retired, until + timedelta(seconds=5), "pause")
    _forge(home, retired, until + timedelta(days=30), "resume")
    code, out = _verify(home)
    assert (code, out["verdict"]) == (3, "tampered"), out
    late = _findings(out, "key_out_of_window")
    assert [(f["loop_id"], f["seq"]) for f in late] == [(LOOP, 2), (LOOP, 3)], out["findings"]
    assert all(
        retired.key_id in f["message"] and "after its key stopped" in f["message"] for f in late
    )
    assert {f["code"] for f in out["findings"]} == {"key_out_of_window"}  # the signatures hold


def test_a_receipt_dated_back_into_the_retired_keys_window_is_reported(opened):
    home = opened
    retired = _signer_of(home)
    rotated = cli_json("keys", "rotate", "--grace", "1s", "--home", str(home))
    until = parse_time(rotated["retired_signs_until"])
    # The fleet goes on with the new key for a while (its clock: ten minutes on)...
    _forge(home, _signer_of(home), until + timedelta(minutes=10), "pause")
    assert _verify(home)[0] == 0
    # ...then the thief opens a loop dated inside the old key's window, after those receipts.
    _forge(home, retired, until - timedelta(seconds=1), "open")
    code, out = _verify(home)
    assert code == 3
    [late] = _findings(out, "key_out_of_window")
    assert (late["loop_id"], late["seq"], "dated back" in late["message"]) == ("L2", 1, True)


def _claim_key(url: str, token: str) -> str:
    """A claim over HTTP: the key id its receipt is signed with, or `refused: CODE`."""

    async def run() -> str:
        async with connect_http(url, token) as client:
            try:
                granted = await client.claim(LOOP)
            except ToolCallError as exc:
                return f"refused: {exc.code}"
            assert granted.granted, granted.reasons
            signed = await client.receipt(granted.receipt_id)
            return str(signed.envelope["signatures"][0]["keyid"])

    return anyio.run(run)


def _until(check: Any, seconds: float = 15.0) -> Any:
    """Poll `check()` until it returns something true (bounded: a server polls every second)."""
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_a_server_follows_a_rotation_and_without_the_new_key_stops_signing_at_the_grace(
    tmp_path, opened
):
    """The server's side of a rotation, on its own clock: each look at the key history
    (`Runtime.follow_keys`, which a server makes every second) is made here directly, and the
    grace runs out because the clock is moved past it, not because time passes."""
    home = opened
    clock = ManualClock(datetime.now().astimezone())
    settings = Settings(home=home, principal=OPERATOR, auth=False, synchronous="normal")
    runtime = Runtime(settings, clock=clock)
    keys = KeyStore(home)
    loop = LoopControlRequest(loop_id=LOOP)

    async def run() -> None:
        async with runtime.open():
            store = runtime.require_store()
            first = store.signer.key_id
            await control_loop(store, OPERATOR, "pause", loop)

            # The home's key rotates: at its next look the server signs with the new key.
            second = keys.rotate().signer.key_id
            assert second != first
            await runtime.follow_keys(keys)
            assert (store.signer.key_id, store.signs_until) == (second, None)
            clock.set(datetime.now().astimezone())
            await control_loop(store, OPERATOR, "resume", loop)

            # It is given a rotation's history and not the new private key: it keeps its key
            # until the stated end of the grace, and past it seals nothing.
            elsewhere = tmp_path / "admin-home"
            shutil.copytree(home / "keys", elsewhere / "keys")
            rotated = KeyStore(elsewhere).rotate(grace_seconds=60)
            assert rotated.until is not None
            third = rotated.signer.key_id
            for name in ("history", "active", f"{third}.pub"):
                shutil.copy(elsewhere / "keys" / name, home / "keys" / name)
            await runtime.follow_keys(keys)
            assert (store.signer.key_id, store.signs_until) == (second, rotated.until)
            clock.set(rotated.until - timedelta(seconds=1))
            await control_loop(store, OPERATOR, "pause", loop)
            sealed = await store.read(lambda reader: reader.journal_count())
            clock.set(rotated.until + timedelta(milliseconds=1))
            with pytest.raises(KeyRetired):
                await control_loop(store, OPERATOR, "resume", loop)
            assert await store.read(lambda reader: reader.journal_count()) == sealed

            # Given the new key, it signs again, with that key.
            shutil.copy(elsewhere / "keys" / f"{third}.key", home / "keys" / f"{third}.key")
            await runtime.follow_keys(keys)
            assert (store.signer.key_id, store.signs_until) == (third, None)
            await control_loop(store, OPERATOR, "resume", loop)
            assert await store.read(lambda reader: reader.journal_count()) == sealed + 1

    anyio.run(run)
    code, out = _verify(home)
    assert (code, out["findings"]) == (0, []), out
    assert out["trusted"].startswith("the key history: 3 keys")


@pytest.mark.slow  # the in-process test above is its short variant, on a clock of its own
def test_servers_move_to_the_new_key_and_one_without_it_stops_signing_at_the_grace(
    tmp_path, opened
):
    home = opened
    token = mint_tokens(home, [("builder", "agent")])["builder"].token
    first = KeyStore(home).active_id()
    with running(tmp_path, "--home", str(home)) as served:
        assert _claim_key(served.url, token) == first

        # A server sharing the home signs with the new key within a second of the rotation.
        second = cli_json("keys", "rotate", "--home", str(home))["active"]
        assert _until(lambda: _claim_key(served.url, token) == second)

        # A replica is given the key history and not the new private key: its key is retired
        # two seconds on, and from then it seals nothing rather than sign with it.
        elsewhere = tmp_path / "admin-home"
        shutil.copytree(home / "keys", elsewhere / "keys")
        third = cli_json("keys", "rotate", "--grace", "2s", "--home", str(elsewhere))["active"]
        for name in ("history", "active", f"{third}.pub"):
            shutil.copy(elsewhere / "keys" / name, home / "keys" / name)
        assert _until(lambda: _claim_key(served.url, token) == "refused: key_retired")
        assert "retired" in served.stderr()
        with open_db(home) as reader:
            sealed = reader.journal_count()

        # Given the new key, it signs again, with that key.
        shutil.copy(elsewhere / "keys" / f"{third}.key", home / "keys" / f"{third}.key")
        assert _until(lambda: _claim_key(served.url, token) == third)
    with open_db(home) as reader:
        assert reader.journal_count() > sealed
    code, out = _verify(home)
    assert (code, out["findings"]) == (0, []), out
    assert out["trusted"].startswith("the key history: 3 keys")


def test_a_deleted_key_history_fails_verify_and_a_planted_key_stays_untrusted(opened):
    home = opened
    cli_json("keys", "rotate", "--home", str(home))
    with open_db(home) as reader:
        anchor = reader.key_anchor()
    assert anchor is not None and anchor.startswith("loopwarden key genesis\n")

    planted = Signer.generate()
    (home / "keys" / f"{planted.key_id}.pub").write_text(public_key_b64(planted.public_key))
    _forge(home, planted, datetime.now().astimezone(), "pause")
    code, out = _verify(home)
    assert code == 3 and {"key_unvouched", "unknown_key"} <= {f["code"] for f in out["findings"]}

    # Without the history, the planted key is not trusted either: the audit fails, and says why.
    history = (home / "keys" / "history").read_text()
    (home / "keys" / "history").unlink()
    code, out = _verify(home)
    assert (code, out["verdict"]) == (3, "tampered"), out
    [missing] = _findings(out, "key_history_missing")
    assert "anchors a key history" in missing["message"]
    assert "--trusted-keys" in missing["message"]

    # A history of the attacker's own (a genesis for the planted key) is not the store's.
    forged = genesis(HISTORY_ORIGIN, planted, "2026-12-01T00:00:00.000000Z")
    (home / "keys" / "history").write_text(json.dumps(forged) + "\n")
    code, out = _verify(home)
    assert code == 3 and _findings(out, "key_history_mismatch"), out

    (home / "keys" / "history").write_text(history)  # put back: only the planted key is wrong
    code, out = _verify(home)
    assert code == 3 and not _findings(out, "key_history_missing")
    assert not _findings(out, "key_history_mismatch")


def test_a_home_of_one_key_from_before_key_histories_still_verifies(opened):
    """A store no home with a history opened, one key: the only case trusted without one."""
    home = opened
    (home / "keys" / "history").unlink()
    raw_sql(home, "DELETE FROM meta WHERE key = 'key_genesis'")
    code, out = _verify(home)
    assert (code, out["findings"]) == (0, []), out
    assert out["trusted"].startswith("the only key in the key directory")
