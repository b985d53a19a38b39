"""Smaller hardening from the hostile-clients review: private database files, expiring tokens,
case near-misses in policies, and the `receipt` tool writing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BUILDER, OPERATOR
from support import cli_env, db_bytes, loopwarden, make_policy, run_cli_app

from loopwarden.journal.receipt import ReceiptRequest, receipt
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.store.homes import DB_NAME
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.policy.evaluate import explain
from loopwarden.policy.lint import case_near_misses
from loopwarden.policy.loader import parse_policy
from loopwarden.turns.claim import ClaimRequest, claim

SERVE_AND_WRITE = """
import sys, anyio
from loopwarden.clients.admin import open_store
from loopwarden.auth.tokens import issue_token
from loopwarden.principals import principal
from pathlib import Path

async def main():
    async with open_store(sys.argv[1]) as store:  # WAL and -shm exist while it is open
        await store.write(lambda tx: issue_token(tx, principal("builder", "agent")))
        home = Path(sys.argv[1])
        for name in ("loopwarden.db", "loopwarden.db-wal", "loopwarden.db-shm", "loopwarden.db-waiting"):
            print(name, oct((home / name).stat().st_mode & 0o777))

anyio.run(main)
"""


def _modes_under_umask_000(home: Path) -> dict[str, str]:
    done = subprocess.run(
        ["sh", "-c", 'umask 000 && exec "$@"', "sh", sys.executable, "-c", SERVE_AND_WRITE, str(home)],
        capture_output=True, text=True, timeout=60, env=cli_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(line.split() for line in done.stdout.splitlines())


def test_the_database_and_its_wal_are_created_0600_even_under_a_permissive_umask(tmp_path):
    modes = _modes_under_umask_000(tmp_path / "home")
    assert modes == {
        "loopwarden.db": "0o600",
        "loopwarden.db-wal": "0o600",
        "loopwarden.db-shm": "0o600",
        "loopwarden.db-waiting": "0o600",  # the writers' waiting room (sqlite.py)
    }


def test_a_database_left_world_readable_is_made_private_on_open(tmp_path):
    home = tmp_path / "home"
    _modes_under_umask_000(home)
    os.chmod(home / DB_NAME, 0o644)
    assert _modes_under_umask_000(home)["loopwarden.db"] == "0o600"


def test_token_create_expires_sets_an_expiry_that_token_list_shows(tmp_path):
    home = str(tmp_path / "home")
    created = run_cli_app(
        "token", "create", "--agent", "brief", "--expires", "2h", "--json", "--home", home
    )
    assert created.exit_code == 0, created.output
    expires = json.loads(created.stdout)["expires_at"]
    assert expires and expires.endswith("Z")
    forever = run_cli_app("token", "create", "--agent", "long", "--json", "--home", home)
    assert json.loads(forever.stdout)["expires_at"] is None
    listed = json.loads(run_cli_app("token", "list", "--json", "--home", home).stdout)["tokens"]
    assert {t["agent"]: t["expires_at"] for t in listed} == {"brief": expires, "long": None}
    human = run_cli_app("token", "list", "--home", home).stdout
    assert "expires" in human and expires in human and "never" in human


@pytest.mark.parametrize("duration", ["0", "0s", "soon", "-5m", "1y"])
def test_a_bad_token_lifetime_is_a_usage_error_and_mints_nothing(tmp_path, duration):
    home = str(tmp_path / "home")
    done = run_cli_app("token", "create", "--agent", "x", "--expires", duration, "--home", home)
    assert done.exit_code == 2, done.output
    message = " ".join(done.output.split())
    assert "must be a positive duration" in message or "invalid duration" in message, message
    assert not (tmp_path / "home").exists(), "refused before the home was even created"


def _policy(**tools: list[str]) -> object:
    return parse_policy(
        json.dumps(make_policy(tools={"deny": [], "approval": [], **tools})), "json"
    )


@pytest.mark.parametrize(
    ("tools", "slips"),
    [
        (
            {"allow": ["fs.*"], "deny": ["fs.secret"]},
            "'fs.Secret', which tools.allow pattern 'fs.*'",
        ),
        ({"allow": ["fs.Secret"], "deny": ["fs.secret"]}, "'fs.Secret', which tools.allow"),
        (
            {"allow": ["fs.read"], "approval": ["FS.*"], "deny": ["fs.*"]},
            "tools.approval pattern 'FS.*'",
        ),
        ({"allow": ["*"], "deny": ["git.push"]}, "'git.Push', which tools.allow pattern '*'"),
        ({"allow": ["fs.read"], "deny": ["fs.*"]}, None),
        ({"allow": ["fs.*"], "deny": ["git.push"]}, None),
        ({"allow": ["fs.*"], "deny": ["*"]}, None),
    ],
)
def test_policy_check_warns_about_deny_patterns_a_differently_cased_name_slips_past(tools, slips):
    policy = _policy(**tools)
    notes = case_near_misses(policy)  # type: ignore[arg-type]
    if slips is None:
        assert notes == []
        return
    assert len(notes) == 1 and slips in notes[0] and "case-sensitively" in notes[0], notes
    assert explain(policy, notes[0].split("'")[3]).rule in ("allow", "approval")  # type: ignore[arg-type]


def test_policy_check_prints_the_case_note_in_both_forms(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(make_policy(tools={"allow": ["fs.*"], "deny": ["fs.secret"]})))
    human = subprocess.run(
        loopwarden("policy", "check", str(path)),
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
    )
    assert human.returncode == 0 and "note: deny pattern 'fs.secret' does not stop" in human.stdout
    as_json = run_cli_app("policy", "check", str(path), "--json")
    assert any("case-sensitively" in n for n in json.loads(as_json.stdout)["notes"])


@pytest.mark.anyio
async def test_the_receipt_tool_writes_nothing_even_for_a_receipt_no_checkpoint_covers_yet(home):
    keys = KeyStore(home)
    store = await Store.open(
        home / DB_NAME, keys.load_signer(), keyring=keys.keyring(), checkpoint_every=0, kinds=KINDS
    )
    try:
        request = OpenLoopRequest(
            objective="o", policy=make_policy(), todos=[TodoInput(title="t")], loop_id="L1"
        )
        await open_loop(store, OPERATOR, request)
        grant = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
        assert await store.read(lambda r: r.latest_checkpoint()) is None
        before = db_bytes(home)
        shown = await receipt(store, BUILDER, ReceiptRequest(receipt_id=grant.receipt_id))
        assert shown.inclusion_proof.verified and shown.checkpoint.verified  # signed on the fly
        assert (
            db_bytes(home) == before and await store.read(lambda r: r.latest_checkpoint()) is None
        )
    finally:
        await store.close()
