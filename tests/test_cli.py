"""The admin CLI: every command, its exit code (0 ok, 1 refused / not found, 2 usage or invalid
input, 3 verification failed) and the shape of its `--json` document.

Most commands run in-process through typer's `CliRunner`; a handful run as real
`python -m loopwarden` subprocesses to prove exit codes and home resolution end to end. Agent
activity (claims, reports, approval requests) is driven through the store API on the same data
home, as a server process would do it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import queue
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import anyio
import jsonschema
import platformdirs
import pytest
import typer
import yaml
from click.testing import Result
from conftest import BASIC_POLICY, BUILDER, REVIEWER
from rich.console import Console
from support import cli as run_process
from support import cli_env, one_line
from support import loopwarden as loopwarden_process
from typer.testing import CliRunner

import loopwarden
from loopwarden.approvals.approval_ops import ApprovalRequest, request_approval
from loopwarden.canonical import canonical_bytes, sha256_digest
from loopwarden.cli.root import app
from loopwarden.clients import admin, demo, render
from loopwarden.clock import parse_time
from loopwarden.kernel.log.keys import Signer, public_key_b64
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.state.events import TIME_PATTERN, Evidence, ToolUse, Usage
from loopwarden.kernel.store.homes import DB_NAME
from loopwarden.kernel.store.store import Store
from loopwarden.policy.digest import policy_digest
from loopwarden.policy.loader import parse_policy
from loopwarden.principals import Principal
from loopwarden.projection.projection import ProjectionRequest, projection
from loopwarden.turns.claim import ClaimRequest, ClaimResult, claim
from loopwarden.turns.quota import QuotaRequest
from loopwarden.turns.quota import quota as quota_op
from loopwarden.turns.update import UpdateRequest, UpdateResult, update
from loopwarden.witnesses.witness_audit import UNVOUCHED

T = TypeVar("T")

NO_SUCH_APPROVAL = "appr-" + "0" * 20

# BASIC_POLICY written as TOML by hand (same keys and values, hence the same digest).
POLICY_TOML = """\
agents = ["builder", "reviewer"]

[tools]
allow = ["fs.read", "fs.write", "tests.run", "git.diff"]
deny = ["git.push"]
approval = ["deploy.*"]

[budgets]
max_turns = 20
max_cost_usd = 5.0

[claims]
lease_seconds = 900
max_active = 4
max_active_per_agent = 1
max_attempts = 3

[stop]
on_violation = "stop_loop"
repeated_failure_limit = 3

[todos]
agents_may_add = true
max_todos = 100
"""

runner = CliRunner()


# --- helpers ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No LOOPWARDEN_* from outside; a command without --home lands in tmp, never in the user's
    data dir. Returns that environment home."""
    for name in list(os.environ):
        if name.startswith("LOOPWARDEN_"):
            monkeypatch.delenv(name)
    path = tmp_path / "env-home"
    monkeypatch.setenv("LOOPWARDEN_HOME", str(path))
    return path


def cli(command: str) -> Result:
    """`loopwarden <command>` in-process (a shell-like command line; tmp paths need no quoting)."""
    return runner.invoke(app, shlex.split(command), catch_exceptions=False)


def cli_json(command: str) -> tuple[int, Any]:
    result = cli(f"{command} --json")
    try:
        return result.exit_code, json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"not JSON (exit {result.exit_code}): {result.stdout!r} {result.stderr!r}")


def ok_json(command: str) -> Any:
    code, out = cli_json(command)
    assert code == 0, out
    return out


def subprocess_cli(command: str, env_home: Path | None = None) -> subprocess.CompletedProcess:
    """`loopwarden <command>` in a real process, with LOOPWARDEN_HOME=`env_home` if given."""
    extra = {} if env_home is None else {"LOOPWARDEN_HOME": str(env_home)}
    return run_process(*shlex.split(command), env=cli_env(**extra))


def assert_error_document(out: Any, code: str | None = None) -> None:
    """`--json` failures print `{"error": code, "message": text}` on stdout."""
    assert set(out) == {"error", "message"}
    assert isinstance(out["error"], str) and isinstance(out["message"], str) and out["message"]
    if code is not None:
        assert out["error"] == code


def with_store(home: Path, fn: Callable[[Store], Awaitable[T]]) -> T:
    async def go() -> T:
        async with admin.open_store(home) as store:
            return await fn(store)

    return anyio.run(go)


def agent_claim(home: Path, loop_id: str, who: Principal = BUILDER) -> ClaimResult:
    return with_store(home, lambda k: claim(k, who, ClaimRequest(loop_id=loop_id)))


def agent_report(home: Path, granted: ClaimResult, who: Principal = BUILDER) -> UpdateResult:
    """Complete the claimed todo with evidence (accepted)."""
    assert granted.granted, granted.reasons
    request = UpdateRequest(
        turn_id=granted.turn_id,  # type: ignore[arg-type]
        fence=granted.fence,  # type: ignore[arg-type]
        outcome="completed",
        tools_used=[ToolUse(name="fs.write", count=1)],
        usage=Usage(model_calls=1, cost_usd=0.5),
        evidence=[Evidence(kind="test", summary="green")],
        summary=f"did {granted.todo_id}",
        idempotency_key=f"report-{granted.turn_id}",
    )
    result = with_store(home, lambda k: update(k, who, request))
    assert result.accepted, result.reasons
    return result


def request_deploy_approval(home: Path, granted: ClaimResult, summary: str) -> str:
    request = ApprovalRequest(
        turn_id=granted.turn_id,  # type: ignore[arg-type]
        fence=granted.fence,  # type: ignore[arg-type]
        tool="deploy.prod",
        summary=summary,
    )
    asked = with_store(home, lambda k: request_approval(k, BUILDER, request))
    assert asked.requested, asked.reasons
    return asked.approval_id  # type: ignore[return-value]


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_TOML)
    return path


def open_loop(home: Path, policy: Path, loop_id: str, *todos: str) -> dict[str, Any]:
    todo_args = " ".join(f"--todo {shlex.quote(t)}" for t in todos)
    return ok_json(
        f"loop open --policy {policy} --objective 'ship it' {todo_args} --id {loop_id} "
        f"--home {home}"
    )


@pytest.fixture
def loop(home: Path, policy_file: Path) -> str:
    """Loop L1 with todos t1 'first' and t2 'second', opened through the CLI."""
    return open_loop(home, policy_file, "L1", "first", "second")["loop_id"]


def kinds(home: Path, loop_id: str) -> list[str]:
    return [r["kind"] for r in ok_json(f"receipts {loop_id} --home {home}")["receipts"]]


# --- loop open -------------------------------------------------------------------------------


def test_loop_open_with_todos_and_id_prints_the_documented_json(home, policy_file):
    out = ok_json(
        f"loop open --policy {policy_file} --objective 'ship it' --todo build --todo test "
        f"--id L1 --home {home}"
    )
    assert out["loop_id"] == "L1"
    assert out["todos"] == 2 and isinstance(out["todos"], int)
    assert out["status"] == "active"
    assert out["policy_digest"].startswith("sha256:") and len(out["policy_digest"]) == 71
    assert out["receipt_id"].startswith("rcpt-")
    assert kinds(home, "L1") == ["loop.opened"]


def test_loop_open_without_id_generates_one_and_says_so(home, policy_file):
    result = cli(f"loop open --policy {policy_file} --objective o --todo a --home {home}")
    assert result.exit_code == 0, result.stderr
    assert "opened loop loop-" in result.stdout and "with 1 todo (" in result.stdout
    generated = result.stdout.split("opened loop ")[1].split()[0]
    assert [lp["loop_id"] for lp in ok_json(f"loop list --home {home}")["loops"]] == [generated]


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_loop_open_todos_file_keeps_ids_titles_and_dependencies(home, policy_file, tmp_path, fmt):
    todos = [
        {"id": "verify", "title": "verify the release", "depends_on": ["build"]},
        {"id": "build", "title": "build the release"},
        "write the notes",  # a bare string is a title
    ]
    path = tmp_path / f"todos.{fmt}"
    path.write_text(yaml.safe_dump(todos) if fmt == "yaml" else json.dumps(todos))
    out = ok_json(
        f"loop open --policy {policy_file} --objective o --todo 'kick off' --todos {path} "
        f"--id R1 --home {home}"
    )
    assert out["todos"] == 4
    shown = ok_json(f"loop show R1 --home {home}")
    by_id = {t["todo_id"]: t for t in shown["todos"]}
    assert by_id["verify"]["depends_on"] == ["build"]
    assert by_id["build"]["title"] == "build the release"
    assert "write the notes" in {t["title"] for t in shown["todos"]}
    # --todo items come first; then `verify` waits for `build` although it is listed before it.
    assert agent_claim(home, "R1").todo_title == "kick off"
    assert agent_claim(home, "R1", REVIEWER).todo_id == "build"


def test_loop_open_todos_file_with_an_unknown_dependency_exits_2(home, policy_file, tmp_path):
    path = tmp_path / "todos.json"
    path.write_text(json.dumps([{"id": "a", "title": "a", "depends_on": ["nope"]}]))
    code, out = cli_json(
        f"loop open --policy {policy_file} --objective o --todos {path} --home {home}"
    )
    assert code == 2
    assert_error_document(out)
    assert "nope" in out["message"]
    assert ok_json(f"loop list --home {home}") == {"loops": []}


def test_loop_open_todos_file_that_is_not_a_list_exits_2(home, policy_file, tmp_path):
    path = tmp_path / "todos.yaml"
    path.write_text("title: not a list\n")
    result = cli(f"loop open --policy {policy_file} --objective o --todos {path} --home {home}")
    assert result.exit_code == 2
    assert "expected a list" in one_line(result.stderr)


def test_loop_open_with_an_invalid_policy_exits_2_naming_the_field(home, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(POLICY_TOML.replace("max_turns = 20", 'max_turns = "twenty"'))
    code, out = cli_json(f"loop open --policy {bad} --objective o --home {home}")
    assert code == 2
    assert_error_document(out, "policy_invalid")
    assert "budgets.max_turns" in out["message"]
    human = cli(f"loop open --policy {bad} --objective o --home {home}")
    assert human.exit_code == 2 and "budgets.max_turns" in one_line(human.stderr)
    assert not home.exists()  # refused before any store was created


def test_loop_open_with_an_unknown_policy_extension_exits_2(home, tmp_path):
    path = tmp_path / "policy.txt"
    path.write_text(POLICY_TOML)
    result = cli(f"loop open --policy {path} --objective o --home {home}")
    assert result.exit_code == 2
    assert "unknown policy file extension" in one_line(result.stderr)


def test_loop_open_with_a_missing_policy_file_exits_2(home, tmp_path):
    result = cli(f"loop open --policy {tmp_path / 'nope.toml'} --objective o --home {home}")
    assert result.exit_code == 2
    assert "cannot read policy file" in one_line(result.stderr)


def test_loop_open_with_a_duplicate_id_exits_1_and_seals_nothing(home, policy_file, loop):
    code, out = cli_json(
        f"loop open --policy {policy_file} --objective again --id {loop} --home {home}"
    )
    assert code == 1
    assert_error_document(out, "conflict")
    assert kinds(home, loop) == ["loop.opened"]


def test_loop_open_without_an_objective_is_a_usage_error(home, policy_file):
    assert cli(f"loop open --policy {policy_file} --home {home}").exit_code == 2


# --- loop list / show ------------------------------------------------------------------------


def test_loop_list_on_a_store_without_loops_is_an_empty_list(home):
    assert cli(f"token create --agent builder --home {home}").exit_code == 0  # creates the store
    assert cli_json(f"loop list --home {home}") == (0, {"loops": []})


def test_loop_list_json_shape_and_table(home, policy_file):
    open_loop(home, policy_file, "L1", "a", "b")
    open_loop(home, policy_file, "L2", "c")
    agent_report(home, agent_claim(home, "L1"))
    out = ok_json(f"loop list --home {home}")
    assert set(out) == {"loops"}
    by_id = {lp["loop_id"]: lp for lp in out["loops"]}
    assert set(by_id) == {"L1", "L2"}
    for item in out["loops"]:
        assert set(item) == {
            "loop_id",
            "status",
            "stop_reason",
            "objective",
            "opened_at",
            "receipts",
            "todos",
        }
        assert isinstance(item["receipts"], int) and isinstance(item["opened_at"], str)
        assert set(item["todos"]) == {"open", "claimed", "done", "blocked", "cancelled"}
    assert by_id["L1"]["todos"] == {
        "open": 1,
        "claimed": 0,
        "done": 1,
        "blocked": 0,
        "cancelled": 0,
    }
    assert (by_id["L1"]["receipts"], by_id["L2"]["receipts"]) == (3, 1)
    assert (by_id["L2"]["status"], by_id["L2"]["stop_reason"]) == ("active", None)
    table = cli(f"loop list --home {home}")
    assert table.exit_code == 0
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[2:]}
    assert rows["L1"][:5] == ["L1", "active", "1/2", "1", "3"]
    assert rows["L2"][:5] == ["L2", "active", "0/1", "0", "1"]


def test_loop_show_human_output_has_status_budgets_todos_and_receipts(home, loop):
    agent_report(home, agent_claim(home, loop))
    result = cli(f"loop show {loop} --home {home}")
    assert result.exit_code == 0
    out = result.stdout
    assert out.splitlines()[0].split() == [loop, "active"]
    assert "objective: ship it" in out
    assert "budgets" in out and "turns" in out and "cost_usd" in out
    assert "█" in out  # a used/limit bar
    assert "todos (open 1, claimed 0, done 1, blocked 0, cancelled 0)" in one_line(
        out
    )  # title wraps
    assert "first" in out and "second" in out
    assert "recent receipts" in out and "turn.reported" in out and "loop.opened" in out
    assert "head: seq 3" in out


def test_loop_show_json_is_the_projection(home, loop):
    agent_claim(home, loop)
    out = ok_json(f"loop show {loop} --home {home}")
    expected = with_store(
        home, lambda k: projection(k, admin.operator(), ProjectionRequest(loop_id=loop))
    )
    assert out == expected.model_dump(mode="json")
    assert (out["status"], out["head"]["seq"]) == ("active", 2)
    assert (len(out["active_leases"]), out["todo_counts"]["claimed"]) == (1, 1)


def test_loop_show_unknown_loop_exits_1_and_malformed_id_exits_2(home, loop):
    code, out = cli_json(f"loop show nope --home {home}")
    assert code == 1
    assert_error_document(out, "not_found")
    assert cli(f"loop show 'bad id!' --home {home}").exit_code == 2


# --- loop pause / resume / cancel ------------------------------------------------------------


def test_pause_resume_cancel_follow_the_state_machine(home, loop):
    out = ok_json(f"loop pause {loop} --reason lunch --home {home}")
    assert set(out) == {"loop_id", "status", "receipt_id"}
    assert (out["loop_id"], out["status"]) == (loop, "paused")
    refused = agent_claim(home, loop)
    assert not refused.granted and "loop_not_active" in {r.code for r in refused.reasons}

    assert cli_json(f"loop pause {loop} --home {home}")[0] == 1  # already paused
    assert ok_json(f"loop resume {loop} --home {home}")["status"] == "active"
    assert cli_json(f"loop resume {loop} --home {home}")[0] == 1  # not paused
    assert ok_json(f"loop cancel {loop} --home {home}")["status"] == "cancelled"
    for action in ("pause", "resume", "cancel"):
        code, out = cli_json(f"loop {action} {loop} --home {home}")
        assert code == 1, action
        assert_error_document(out, "conflict")
    assert kinds(home, loop) == [
        "loop.opened",
        "loop.paused",
        "claim.refused",
        "loop.resumed",
        "loop.cancelled",
    ]


def test_cancel_closes_open_turns_and_shows_in_list(home, loop):
    agent_claim(home, loop)
    result = cli(f"loop cancel {loop} --home {home}")
    assert result.exit_code == 0 and "is now cancelled" in result.stdout
    shown = ok_json(f"loop show {loop} --home {home}")
    assert shown["status"] == "cancelled" and shown["active_leases"] == []
    assert ok_json(f"loop list --home {home}")["loops"][0]["status"] == "cancelled"


@pytest.mark.parametrize("action", ["pause", "resume", "cancel"])
def test_control_of_an_unknown_loop_exits_1(home, loop, action):
    code, out = cli_json(f"loop {action} ghost --home {home}")
    assert code == 1
    assert_error_document(out, "not_found")


def test_operator_name_and_reason_are_recorded_in_the_receipt(home, loop, monkeypatch):
    paused = ok_json(f"loop pause {loop} --reason audit --as carol --home {home}")
    body = ok_json(f"receipt {paused['receipt_id']} --home {home}")["body"]
    assert body["principal"] == {"id": "carol", "role": "operator"}
    assert body["decision"]["reasons"][0]["message"] == "audit"
    monkeypatch.setenv("LOOPWARDEN_OPERATOR", "dave")
    resumed = ok_json(f"loop resume {loop} --home {home}")
    body = ok_json(f"receipt {resumed['receipt_id']} --home {home}")["body"]
    assert body["principal"]["id"] == "dave"


# --- receipts / receipt ----------------------------------------------------------------------


def test_receipts_table_lists_every_receipt_with_its_signature_state(home, loop):
    agent_report(home, agent_claim(home, loop))
    result = cli(f"receipts {loop} --home {home}")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].strip() == f"receipts of {loop}"
    header = ["seq", "time", "(UTC)", "kind", "principal", "effect", "receipt", "sig", "reasons"]
    assert lines[1].split() == header
    rows = [line.split() for line in lines[2:] if line.strip()]
    assert [(r[0], r[2], r[6]) for r in rows] == [
        ("1", "loop.opened", "ok"),
        ("2", "turn.claimed", "ok"),
        ("3", "turn.reported", "ok"),
    ]


def test_receipts_json_shape_and_kind_filter(home, loop):
    granted = agent_claim(home, loop)
    agent_report(home, granted)
    out = ok_json(f"receipts {loop} --home {home}")
    assert set(out) == {"loop_id", "receipts"} and out["loop_id"] == loop
    assert [r["seq"] for r in out["receipts"]] == [1, 2, 3]
    for item in out["receipts"]:
        assert set(item) == {
            "seq",
            "receipt_id",
            "digest",
            "kind",
            "at",
            "principal",
            "effect",
            "reasons",
            "subagent",
            "messages",
            "turn_id",
            "verified",
        }
        assert item["verified"] is True and isinstance(item["reasons"], list)
        assert item["receipt_id"].startswith("rcpt-") and item["effect"] in ("allow", "deny")
    claimed = out["receipts"][1]
    assert (claimed["principal"], claimed["turn_id"]) == ("builder", granted.turn_id)
    only = ok_json(f"receipts {loop} --kind turn.claimed --home {home}")
    assert [r["kind"] for r in only["receipts"]] == ["turn.claimed"]
    assert ok_json(f"receipts {loop} --kind loop.stopped --home {home}")["receipts"] == []


def test_receipts_of_an_unknown_loop_exits_1(home, loop):
    code, out = cli_json(f"receipts ghost --home {home}")
    assert code == 1
    assert_error_document(out, "not_found")


def test_receipt_json_has_the_envelope_decoded_body_and_verification(home, loop):
    granted = agent_claim(home, loop)
    out = ok_json(f"receipt {granted.receipt_id} --home {home}")
    assert set(out) == {
        "receipt_id",
        "leaf_index",
        "state",
        "digest",
        "verified",
        "problems",
        "key_id",
        "body",
        "envelope",
    }
    assert (out["receipt_id"], out["leaf_index"]) == (granted.receipt_id, 1)
    assert out["state"] == "integrated"  # SQLite integrates as it writes; no checkpoint yet
    assert out["verified"] is True and out["problems"] == []
    assert out["digest"].startswith("sha256:") and out["key_id"].startswith("ed25519-")
    assert (out["body"]["kind"], out["body"]["seq"], out["body"]["loop_id"]) == (
        "turn.claimed",
        2,
        loop,
    )
    envelope = out["envelope"]
    assert envelope["signatures"][0]["keyid"] == out["key_id"]
    assert json.loads(base64.b64decode(envelope["payload"])) == out["body"]
    human = cli(f"receipt {granted.receipt_id} --home {home}")
    assert human.exit_code == 0
    assert granted.receipt_id in human.stdout and "signature ok" in human.stdout


def test_checkpoint_signs_and_stores_one_that_publishes_every_receipt_then_has_nothing_to_sign(
    home, loop
):
    granted = agent_claim(home, loop)
    assert ok_json(f"receipt {granted.receipt_id} --home {home}")["state"] == "integrated"
    made = ok_json(f"checkpoint --home {home}")
    assert made["signed_now"] is True and made["size"] == 2  # loop.opened, turn.claimed
    assert made["key_id"].startswith("ed25519-") and made["root"]
    assert ok_json(f"receipt {granted.receipt_id} --home {home}")["state"] == "published"
    again = cli(f"checkpoint --home {home}")
    assert again.exit_code == 0 and "already covers the journal" in again.stdout
    assert ok_json(f"checkpoint --home {home}")["signed_now"] is False


def test_checkpoint_of_a_home_without_a_store_exits_1_and_makes_nothing(tmp_path):
    empty = tmp_path / "nothing-here"
    code, out = cli_json(f"checkpoint --home {empty}")
    assert code == 1 and out["error"] == "not_found", out
    assert not empty.exists()


def test_receipt_unknown_id_exits_1(home, loop):
    code, out = cli_json(f"receipt rcpt-{'0' * 24} --home {home}")
    assert code == 1
    assert_error_document(out, "not_found")


# --- verify ----------------------------------------------------------------------------------


def test_verify_clean_database_exits_0_with_the_documented_json(home, loop):
    agent_report(home, agent_claim(home, loop))
    out = ok_json(f"verify --home {home}")
    assert set(out) == {
        "verdict",
        "receipts",
        "pending",
        "loops",
        "checkpoints",
        "tree_size",
        "root",
        "trusted",
        "seconds",
        "findings",
        "notes",
    }
    # Without a witness policy it says that nothing outside loopwarden vouches for the log.
    assert (out["verdict"], out["findings"], out["notes"]) == ("clean", [], [UNVOUCHED])
    assert out["trusted"].startswith("the key history: 1 key from genesis key ed25519-")
    assert (out["receipts"], out["pending"], out["loops"], out["tree_size"]) == (3, 0, 1, 3)
    assert isinstance(out["checkpoints"], int) and isinstance(out["seconds"], int | float)
    assert len(bytes.fromhex(out["root"])) == 32
    human = cli(f"verify --home {home}")
    assert human.exit_code == 0
    trusting, verdict = human.stdout.splitlines()[:2]
    assert trusting == f"trusting {out['trusted']}"
    assert verdict.startswith("audit: clean — 3 receipts, 1 loop, ")


def test_verify_one_loop_exits_0_and_an_unknown_loop_exits_1(home, policy_file):
    open_loop(home, policy_file, "L1")
    open_loop(home, policy_file, "L2")
    out = ok_json(f"verify --loop L2 --home {home}")
    assert (out["verdict"], out["receipts"], out["tree_size"]) == ("clean", 1, 2)
    code, out = cli_json(f"verify --loop ghost --home {home}")
    assert code == 1
    assert_error_document(out, "not_found")


def test_verify_a_home_without_a_database_exits_1(tmp_path):
    code, out = cli_json(f"verify --home {tmp_path / 'empty'}")
    assert code == 1
    assert_error_document(out, "not_found")


def test_verify_with_a_trusted_keys_file(home, loop, tmp_path):
    exported = ok_json(f"keys export --home {home}")
    trusted = tmp_path / "trusted.json"
    trusted.write_text(json.dumps({exported["key_id"]: exported["public_key"]}))
    assert cli_json(f"verify --trusted-keys {trusted} --home {home}")[0] == 0
    stranger = Signer.generate()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"keys": {stranger.key_id: public_key_b64(stranger.public_key)}}))
    code, out = cli_json(f"verify --trusted-keys {other} --home {home}")
    assert (code, out["verdict"]) == (3, "tampered")
    assert any(
        (f["code"], f.get("loop_id"), f.get("seq")) == ("unknown_key", loop, 1)
        for f in out["findings"]
    )
    garbage = tmp_path / "garbage.json"
    garbage.write_text("[1, 2")
    assert cli(f"verify --trusted-keys {garbage} --home {home}").exit_code == 2


@pytest.mark.parametrize("command", ["verify", "receipts L1", "receipt RECEIPT"])
def test_an_unreadable_public_key_file_is_a_clean_error(home, loop, command):
    opened = ok_json(f"receipts {loop} --home {home}")["receipts"][0]["receipt_id"]
    (home / "keys" / "ed25519-0000000000000000.pub").write_text("not base64!\n")
    result = runner.invoke(app, [*command.replace("RECEIPT", opened).split(), "--home", str(home)])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code != 0
    assert "cannot read key file" in one_line(result.stderr)


# --- export / verify-bundle ------------------------------------------------------------------


@pytest.fixture
def bundle(home: Path, loop: str, tmp_path: Path) -> Path:
    agent_report(home, agent_claim(home, loop))
    path = tmp_path / "bundle.json"
    out = ok_json(f"export {loop} -o {path} --home {home}")
    assert set(out) == {"loop_id", "output", "receipts", "checkpoint_size", "key_ids"}
    assert (out["loop_id"], out["output"], out["receipts"]) == (loop, str(path), 3)
    assert out["checkpoint_size"] == 3 and len(out["key_ids"]) == 1
    return path


def test_export_writes_a_bundle_file(bundle, loop):
    data = json.loads(bundle.read_text())
    assert (data["format"], data["loop_id"]) == ("loopwarden.bundle/v1", loop)
    assert (len(data["receipts"]), data["checkpoint"]["size"]) == (3, 3)


def test_export_of_an_unknown_loop_exits_1(home, loop, tmp_path):
    out_file = tmp_path / "nope.json"
    code, out = cli_json(f"export ghost -o {out_file} --home {home}")
    assert code == 1
    assert_error_document(out, "not_found")
    assert not out_file.exists()


def test_export_to_an_unwritable_path_is_a_usage_error(home, loop, tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "bundle.json"
    result = runner.invoke(app, ["export", loop, "-o", str(target), "--home", str(home)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output and not isinstance(result.exception, OSError)


def test_verify_bundle_clean_exits_0_with_the_documented_json(bundle):
    out = ok_json(f"verify-bundle {bundle}")
    assert set(out) == {
        "verdict",
        "loop_id",
        "receipts",
        "checkpoint_size",
        "key_ids",
        "keys_pinned",
        "status",
        "stop_reason",
        "findings",
        "notes",
    }
    assert out["notes"] == [UNVOUCHED]
    assert (out["verdict"], out["receipts"], out["keys_pinned"], out["status"]) == (
        "clean",
        3,
        False,
        "active",
    )
    human = cli(f"verify-bundle {bundle}")
    assert human.exit_code == 0
    assert "bundle: clean" in human.stdout and "not pinned" in human.stdout


def test_verify_bundle_with_the_exported_key_exits_0(home, bundle):
    public_key, key_id = cli(f"keys export --home {home}").stdout.split()
    assert key_id.startswith("ed25519-")
    out = ok_json(f"verify-bundle {bundle} --key {public_key}")
    assert (out["verdict"], out["keys_pinned"]) == ("clean", True)


def test_verify_bundle_with_another_key_exits_3_unknown_key(bundle):
    other = public_key_b64(Signer.generate().public_key)
    code, out = cli_json(f"verify-bundle {bundle} --key {other}")
    assert (code, out["verdict"]) == (3, "tampered")
    assert {"unknown_key", "checkpoint_unknown_key"} <= {f["code"] for f in out["findings"]}
    assert {f.get("position") for f in out["findings"] if f["code"] == "unknown_key"} == {1, 2, 3}


def test_verify_bundle_with_a_trusted_keys_file(home, bundle, tmp_path):
    shown = ok_json(f"keys show --home {home}")
    trusted = tmp_path / "trusted.json"
    trusted.write_text(json.dumps({k["key_id"]: k["public_key"] for k in shown["keys"]}))
    assert ok_json(f"verify-bundle {bundle} --trusted-keys {trusted}")["keys_pinned"] is True
    stranger = Signer.generate()
    trusted.write_text(json.dumps({stranger.key_id: public_key_b64(stranger.public_key)}))
    assert cli_json(f"verify-bundle {bundle} --trusted-keys {trusted}")[0] == 3


def test_verify_bundle_usage_errors_exit_2(bundle, tmp_path):
    key = public_key_b64(Signer.generate().public_key)
    trusted = tmp_path / "t.json"
    trusted.write_text("{}")
    assert cli(f"verify-bundle {bundle} --key {key} --trusted-keys {trusted}").exit_code == 2
    assert cli(f"verify-bundle {bundle} --key not-a-key").exit_code == 2
    assert cli(f"verify-bundle {tmp_path / 'missing.json'}").exit_code == 2
    trusted.write_text("not json")
    assert cli(f"verify-bundle {bundle} --trusted-keys {trusted}").exit_code == 2


def test_a_mistyped_loop_id_names_the_loop_it_likely_meant(tmp_path):
    home = tmp_path / "home"
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps(BASIC_POLICY))
    opened = cli(f"loop open --policy {policy} --objective x --todo t --id release --home {home}")
    assert opened.exit_code == 0, opened.output
    for command in ("loop show relase", "verify --loop relase", f"export relase -o {tmp_path}/b"):
        done = cli(f"{command} --home {home}")
        assert done.exit_code == 1, done.output
        assert "no loop with id 'relase'; did you mean 'release'?" in one_line(done.stderr)
    far = cli(f"loop show zzz --home {home}")
    assert far.exit_code == 1 and one_line(far.stderr).endswith("no loop with id 'zzz'")


def test_verify_piped_prints_each_finding_on_one_line_however_long(tmp_path):
    """A finding naming a 64-character loop id is over 160 characters: piped, it was cut into
    two lines mid-message (rich's fixed width), so `grep unknown_key` lost its end."""
    home = tmp_path / "home"
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps(BASIC_POLICY))
    loop_id = "L" * 64
    opened = cli(f"loop open --policy {policy} --objective x --todo t --id {loop_id} --home {home}")
    assert opened.exit_code == 0, opened.output
    stranger = Signer.generate()
    keys = tmp_path / "stranger.keys"
    keys.write_text(json.dumps({"keys": {stranger.key_id: public_key_b64(stranger.public_key)}}))
    proc = subprocess_cli(f"verify --trusted-keys {keys} --home {home}")
    assert proc.returncode == 3, proc.stderr
    findings = [line for line in proc.stdout.splitlines() if "unknown_key" in line]
    assert findings and all(len(line) > 160 for line in findings), proc.stdout
    assert all(line.endswith("signed by a key that is not trusted") for line in findings)


def test_verify_bundle_of_garbage_exits_3_bundle_malformed(tmp_path):
    path = tmp_path / "garbage.json"
    path.write_text("{not json")
    code, out = cli_json(f"verify-bundle {path}")
    assert code == 3
    assert [f["code"] for f in out["findings"]] == ["bundle_malformed"]


def test_verify_bundle_with_another_key_exits_3_in_a_real_process(bundle):
    other = public_key_b64(Signer.generate().public_key)
    proc = subprocess_cli(f"verify-bundle {bundle} --key {other}")
    assert proc.returncode == 3
    assert "TAMPERED" in proc.stdout and "unknown_key" in proc.stdout


# --- approvals -------------------------------------------------------------------------------


@pytest.fixture
def two_pending(home: Path, loop: str) -> tuple[str, str]:
    granted = agent_claim(home, loop)
    return (
        request_deploy_approval(home, granted, "deploy to prod"),
        request_deploy_approval(home, granted, "deploy again"),
    )


APPROVAL_KEYS = {
    "approval_id",
    "loop_id",
    "turn_id",
    "todo_id",
    "tool",
    "summary",
    "artifact_digest",
    "status",
    "requested_by",
    "requested_at",
    "decided_by",
    "decided_at",
    "expires_at",
    "reason",
    "consumed_by",
}


def pending_ids(home: Path) -> list[str]:
    return [a["approval_id"] for a in ok_json(f"approvals --pending --home {home}")["approvals"]]


def test_approvals_lists_requests_with_the_documented_json(home, loop, two_pending):
    out = ok_json(f"approvals --home {home}")
    assert set(out) == {"approvals"}
    assert {a["approval_id"] for a in out["approvals"]} == set(two_pending)
    for item in out["approvals"]:
        assert set(item) == APPROVAL_KEYS
        assert (item["status"], item["tool"], item["loop_id"]) == ("pending", "deploy.prod", loop)
        assert item["requested_by"] == "builder"
    assert ok_json(f"approvals --loop {loop} --home {home}") == out
    assert ok_json(f"approvals --loop other --home {home}") == {"approvals": []}
    table = cli(f"approvals --pending --home {home}")
    assert table.exit_code == 0
    assert all(a in table.stdout for a in two_pending) and "deploy.prod" in table.stdout


def test_approve_with_expiry_and_reason_then_pending_shrinks(home, two_pending):
    first, second = two_pending
    before = datetime.now(UTC)
    out = ok_json(f"approve {first} --expires 30m --reason 'go ahead' --home {home}")
    assert set(out) == {"approval_id", "status", "expires_at", "receipt_id"}
    assert (out["approval_id"], out["status"]) == (first, "approved")
    expires = parse_time(out["expires_at"])
    assert before + timedelta(minutes=29) < expires < datetime.now(UTC) + timedelta(minutes=31)
    assert pending_ids(home) == [second]
    decided = ok_json(f"receipt {out['receipt_id']} --home {home}")["body"]
    assert decided["kind"] == "approval.decided"
    assert (decided["data"]["reason"], decided["data"]["approved"]) == ("go ahead", True)


def test_reject_then_deciding_again_exits_1(home, two_pending):
    first, second = two_pending
    out = ok_json(f"reject {second} --reason 'not today' --home {home}")
    assert (out["status"], out["expires_at"]) == ("rejected", None)
    human = cli(f"approve {first} --home {home}")
    assert human.exit_code == 0 and f"approval {first} approved until" in human.stdout
    for command in (f"approve {first}", f"reject {first} --reason x", f"approve {second}"):
        code, out = cli_json(f"{command} --home {home}")
        assert code == 1, command
        assert_error_document(out, "conflict")
    decided = ok_json(f"approvals --home {home}")["approvals"]
    assert {a["approval_id"]: a["status"] for a in decided} == {
        first: "approved",
        second: "rejected",
    }


@pytest.mark.parametrize("expires", ["3x", "soon", "-5m", "0", "31d"])
def test_approve_with_a_bad_duration_exits_2_and_decides_nothing(home, two_pending, expires):
    code, out = cli_json(f"approve {two_pending[0]} --expires={expires} --home {home}")
    assert code == 2
    assert_error_document(out)
    assert len(pending_ids(home)) == 2


def test_approve_unknown_id_exits_1_malformed_id_exits_2_reject_needs_a_reason(home, loop):
    assert cli(f"approve {NO_SUCH_APPROVAL} --home {home}").exit_code == 1
    assert cli(f"approve not-an-approval --home {home}").exit_code == 2
    assert cli(f"reject {NO_SUCH_APPROVAL} --home {home}").exit_code == 2  # --reason is required


# --- tokens ----------------------------------------------------------------------------------


def test_token_create_prints_the_token_once_and_list_never_shows_it(home):
    result = cli(f"token create --agent builder --home {home}")
    assert result.exit_code == 0
    assert "shown once" in result.stderr
    token = result.stdout.strip()  # the token alone: TOKEN=$(loopwarden token create …)
    assert token.startswith("lw_") and result.stdout == token + "\n"
    assert token not in result.stderr
    created = ok_json(f"token create --agent ops --role operator --home {home}")
    assert set(created) == {"token", "token_id", "agent", "role", "expires_at"}
    assert (created["agent"], created["role"]) == ("ops", "operator")
    assert created["token"].startswith("lw_") and created["token"] != token

    listed = ok_json(f"token list --home {home}")
    assert set(listed) == {"tokens"}
    for item in listed["tokens"]:
        assert set(item) == {
            "token_id", "agent", "role", "created_at", "revoked_at", "expires_at", "loop_id"
        }  # fmt: skip
        assert item["revoked_at"] is None and item["expires_at"] is None
    assert {t["agent"] for t in listed["tokens"]} == {"builder", "ops"}
    human = cli(f"token list --home {home}")
    assert created["token_id"] in human.stdout
    for secret in (token, created["token"]):
        assert secret not in json.dumps(listed) and secret not in human.stdout
        for path in home.iterdir():  # only the hash is stored
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path.name


def test_token_revoke_marks_it_and_unknown_or_repeated_revoke_exits_1(home):
    created = ok_json(f"token create --agent builder --home {home}")
    out = ok_json(f"token revoke {created['token_id']} --home {home}")
    assert out == {"token_id": created["token_id"], "revoked": True}
    assert ok_json(f"token list --home {home}")["tokens"][0]["revoked_at"] is not None
    assert cli_json(f"token revoke {created['token_id']} --home {home}")[0] == 1
    code, out = cli_json(f"token revoke tok-ghost --home {home}")
    assert code == 1
    assert_error_document(out)


def test_token_create_with_an_invalid_role_exits_2(home):
    assert cli(f"token create --agent x --role root --home {home}").exit_code == 2
    assert not home.exists()  # refused before any store was created


# --- keys ------------------------------------------------------------------------------------


def test_keys_show_and_export_describe_the_active_key(home, loop):
    shown = ok_json(f"keys show --home {home}")
    assert set(shown) == {"active", "keys"} and len(shown["keys"]) == 1
    (key,) = shown["keys"]
    assert set(key) == {"key_id", "public_key", "active"}
    assert key["active"] is True and key["key_id"] == shown["active"]
    assert len(base64.b64decode(key["public_key"])) == 32
    exported = ok_json(f"keys export --home {home}")
    assert exported == {"key_id": key["key_id"], "public_key": key["public_key"]}
    human = cli(f"keys export --home {home}").stdout.split()
    assert human == [key["public_key"], key["key_id"]]


def test_keys_rotate_keeps_the_old_public_key_and_old_receipts_still_verify(home, loop):
    old = ok_json(f"keys export --home {home}")
    rotated = ok_json(f"keys rotate --home {home}")
    assert set(rotated) == {"retired", "active", "public_key", "retired_signs_until"}
    assert rotated["retired"] == old["key_id"] and rotated["active"] != old["key_id"]
    shown = ok_json(f"keys show --home {home}")
    assert shown["active"] == rotated["active"]
    assert {(k["key_id"], k["active"]) for k in shown["keys"]} == {
        (old["key_id"], False),
        (rotated["active"], True),
    }
    assert not (home / "keys" / f"{old['key_id']}.key").exists()
    assert ok_json(f"verify --home {home}")["verdict"] == "clean"  # under the retired key

    paused = ok_json(f"loop pause {loop} --home {home}")
    signed = ok_json(f"receipt {paused['receipt_id']} --home {home}")
    assert signed["key_id"] == rotated["active"] and signed["verified"]
    out = ok_json(f"verify --home {home}")
    assert (out["verdict"], out["receipts"]) == ("clean", 2)
    receipts = ok_json(f"receipts {loop} --home {home}")["receipts"]
    assert [r["verified"] for r in receipts] == [True, True]


def _history(home: Path) -> list[str]:
    return [json.loads(line) for line in (home / "keys" / "history").read_text().splitlines()]


def test_verify_says_first_what_it_trusts_and_follows_the_key_history_across_rotations(home, loop):
    first = ok_json(f"keys export --home {home}")["key_id"]
    ok_json(f"keys rotate --home {home}")
    ok_json(f"loop pause {loop} --home {home}")
    last = ok_json(f"keys rotate --home {home}")["active"]
    ok_json(f"loop resume {loop} --home {home}")
    notes = _history(home)
    assert [n.splitlines()[0] for n in notes] == [
        "loopwarden key genesis",
        "loopwarden key rotation",
        "loopwarden key rotation",
    ]
    assert notes[-1].count("\n\u2014 ") == 2, "a rotation is signed by the old key and the new"
    text = cli(f"verify --home {home}")
    assert text.exit_code == 0, text.stdout
    basis = f"the key history: 3 keys from genesis key {first}"
    assert text.stdout.splitlines()[0] == f"trusting {basis}"
    out = ok_json(f"verify --home {home}")
    assert (out["verdict"], out["trusted"], out["receipts"]) == ("clean", basis, 3)
    assert last in notes[-1]


def test_a_key_written_into_the_key_directory_is_reported_and_not_trusted(home, loop):
    rogue = Signer.generate()
    (home / "keys" / f"{rogue.key_id}.pub").write_text(public_key_b64(rogue.public_key) + "\n")
    code, out = cli_json(f"verify --home {home}")
    assert (code, out["verdict"]) == (3, "tampered")
    assert [(f["code"], rogue.key_id in f["message"]) for f in out["findings"]] == [
        ("key_unvouched", True)
    ]


def test_an_edited_rotation_statement_vouches_for_nothing(home, loop):
    new = ok_json(f"keys rotate --home {home}")["active"]
    ok_json(f"loop pause {loop} --home {home}")  # signed by the new key
    notes = _history(home)
    notes[-1] = notes[-1].replace("Z\n", "1Z\n", 1)  # the statement's time, edited
    (home / "keys" / "history").write_text("".join(json.dumps(n) + "\n" for n in notes))
    code, out = cli_json(f"verify --home {home}")
    assert code == 3
    codes = {f["code"] for f in out["findings"]}
    assert {"key_unvouched", "unknown_key"} <= codes, out["findings"]
    assert any(f"rotation to {new} is not signed" in f["message"] for f in out["findings"])


def test_a_home_without_a_key_history_fails_verify_and_says_how_to_pin_its_keys(home, loop):
    ok_json(f"keys rotate --home {home}")
    (home / "keys" / "history").unlink()
    code, out = cli_json(f"verify --home {home}")
    assert (code, out["verdict"]) == (3, "tampered")
    assert [f["code"] for f in out["findings"]] == ["key_history_missing"]
    assert "--trusted-keys" in out["findings"][0]["message"]
    assert out["trusted"] == "no key history: 2 keys of the key directory, unproven"
    pinned = tmp_keys = home.parent / "pinned.keys"
    tmp_keys.write_text(cli(f"keys export --all --home {home}").stdout)
    assert ok_json(f"verify --home {home} --trusted-keys {pinned}")["verdict"] == "clean"


def test_a_damaged_key_history_is_a_clean_failure(home, loop):
    (home / "keys" / "history").write_text("not json\n")
    code, out = cli_json(f"verify --home {home}")
    assert code == 1 and "keys/history is damaged" in out["message"], out


# --- policy ----------------------------------------------------------------------------------


def test_policy_check_prints_the_same_digest_for_toml_yaml_and_json(tmp_path, policy_file):
    as_yaml = tmp_path / "policy.yaml"
    as_yaml.write_text(yaml.safe_dump(BASIC_POLICY))
    as_json = tmp_path / "policy.json"
    as_json.write_text(json.dumps(BASIC_POLICY))
    digests = set()
    for path in (policy_file, as_yaml, as_json):
        result = cli(f"policy check {path}")
        assert result.exit_code == 0
        verdict, name, digest = result.stdout.split()[:3]
        assert (verdict, name) == ("valid", path.name) and digest.startswith("sha256:")
        digests.add(digest)
        out = ok_json(f"policy check {path}")
        assert set(out) == {"valid", "digest", "notes", "policy"}
        assert (out["valid"], out["digest"], out["notes"]) == (True, digest, [])
        assert out["policy"]["agents"] == ["builder", "reviewer"]
    assert len(digests) == 1


def test_policy_check_notes_a_policy_nobody_can_use(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"budgets": {"max_turns": 1}}))
    assert len(ok_json(f"policy check {path}")["notes"]) == 2


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("broken.toml", "agents = [", "malformed TOML"),
        ("broken.yaml", "agents: [builder", "malformed YAML"),
        ("broken.json", '{"agents": ', "malformed JSON"),
        ("field.toml", POLICY_TOML.replace('"stop_loop"', '"explode"'), "stop.on_violation"),
        ("extra.json", json.dumps({**BASIC_POLICY, "surprise": 1}), "surprise"),
        ("policy.ini", POLICY_TOML, "unknown policy file extension"),
    ],
)
def test_policy_check_of_a_bad_file_exits_2_with_the_reason(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    code, out = cli_json(f"policy check {path}")
    assert code == 2
    assert_error_document(out, "policy_invalid")
    assert needle in out["message"]


def test_policy_check_of_a_missing_file_exits_2(tmp_path):
    assert cli(f"policy check {tmp_path / 'missing.toml'}").exit_code == 2


def test_policy_schema_is_a_json_schema_that_accepts_a_policy():
    result = cli("policy schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert {"agents", "tools", "budgets", "claims", "stop", "todos"} <= set(schema["properties"])
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(BASIC_POLICY)
    assert not validator.is_valid({**BASIC_POLICY, "surprise": 1})


def test_policy_explain_names_the_deciding_pattern(policy_file):
    tools = "--tool git.push --tool deploy.prod --tool fs.read --tool curl"
    result = cli(f"policy explain {policy_file} {tools}")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "deny     git.push: denied by tools.deny pattern 'git.push'",
        "approval deploy.prod: needs approval by tools.approval pattern 'deploy.*'",
        "allow    fs.read: allowed by tools.allow pattern 'fs.read'",
        "deny     curl: denied (no allow pattern matches; default deny)",
    ]
    out = ok_json(f"policy explain {policy_file} {tools}")
    assert set(out) == {"tools"}
    for item in out["tools"]:
        assert set(item) == {"tool", "effect", "rule", "pattern", "explanation"}
    assert [(t["tool"], t["effect"], t["rule"], t["pattern"]) for t in out["tools"]] == [
        ("git.push", "deny", "deny", "git.push"),
        ("deploy.prod", "approval", "approval", "deploy.*"),
        ("fs.read", "allow", "allow", "fs.read"),
        ("curl", "deny", "default", None),
    ]


def test_policy_explain_usage_errors_exit_2(policy_file, tmp_path):
    assert cli(f"policy explain {policy_file}").exit_code == 2  # no --tool
    bad = tmp_path / "bad.toml"
    bad.write_text("agents = [")
    assert cli(f"policy explain {bad} --tool fs.read").exit_code == 2


# --- serve argument errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ("--http 0.0.0.0:8765 --agent builder", "--allow-remote"),
        ("--http 10.1.2.3:8765", "--allow-remote"),
        ("--no-auth --agent builder", "--no-auth only applies to --http"),
        ("--http 0.0.0.0:8765 --no-auth --allow-remote --agent b", "loopback"),
        ("--http nonsense", "HOST:PORT"),
        ("--agent builder --role root", "role must be agent or operator"),
        ("", "--agent"),
    ],
    ids=[
        "non-loopback-http",
        "private-address-http",
        "no-auth-without-http",
        "no-auth-remote",
        "malformed-http",
        "bad-role",
        "stdio-without-agent",
    ],
)
def test_serve_argument_errors_exit_2_before_serving(home, args, needle):
    result = cli(f"serve {args} --home {home}")
    assert result.exit_code == 2
    assert needle in one_line(result.stderr)
    assert result.stdout == ""


def test_serve_stdio_without_agent_exits_2_as_a_real_process(home):
    proc = subprocess_cli(f"serve --home {home}")
    assert proc.returncode == 2
    assert "--agent" in one_line(proc.stderr) and proc.stdout == ""


# --- data home resolution --------------------------------------------------------------------


def test_home_flag_wins_over_environment_and_environment_is_the_fallback(
    tmp_path, policy_file, env_home
):
    flag_home = tmp_path / "flag-home"
    ok_json(f"loop open --policy {policy_file} --objective e --id ENV")
    ok_json(f"loop open --policy {policy_file} --objective f --id FLAG --home {flag_home}")
    assert (env_home / "loopwarden.db").exists() and (flag_home / "loopwarden.db").exists()
    assert [lp["loop_id"] for lp in ok_json("loop list")["loops"]] == ["ENV"]
    assert [lp["loop_id"] for lp in ok_json(f"loop list --home {flag_home}")["loops"]] == ["FLAG"]
    assert ok_json("keys export") != ok_json(f"keys export --home {flag_home}")
    assert (env_home / "keys").stat().st_mode & 0o777 == 0o700


def test_home_resolution_end_to_end_in_real_processes(tmp_path, policy_file):
    env_home, flag_home = tmp_path / "a", tmp_path / "b"
    opened = subprocess_cli(
        f"loop open --policy {policy_file} --objective o --id P1 --json", env_home=env_home
    )
    assert opened.returncode == 0, opened.stderr
    assert json.loads(opened.stdout)["loop_id"] == "P1"
    assert (env_home / "loopwarden.db").exists()
    listed = subprocess_cli(f"loop list --json --home {flag_home}", env_home=env_home)
    assert listed.returncode == 1 and json.loads(listed.stdout)["error"] == "not_found"
    missing = subprocess_cli(f"loop show P1 --home {flag_home}", env_home=env_home)
    assert missing.returncode == 1 and str(flag_home) in one_line(missing.stderr)
    assert not flag_home.exists()  # the flag won over the environment, and created nothing
    verified = subprocess_cli("verify --json", env_home=env_home)
    assert verified.returncode == 0, verified.stdout
    assert json.loads(verified.stdout)["receipts"] == 1


def test_version_prints_the_package_version():
    result = cli("--version")
    assert (result.exit_code, result.stdout.strip()) == (0, loopwarden.__version__)


def test_home_and_json_before_the_subcommand_mean_the_same_as_after_it(home, policy_file):
    opened = cli(
        f"--home {home} --json loop open --policy {policy_file} --objective o --todo a --id ROOT"
    )
    assert opened.exit_code == 0, opened.stderr
    assert json.loads(opened.stdout)["loop_id"] == "ROOT"
    assert [lp["loop_id"] for lp in ok_json(f"loop list --home {home}")["loops"]] == ["ROOT"]
    human = cli(f"--home {home} loop list")
    assert human.exit_code == 0 and "ROOT" in human.stdout
    other = home.parent / "other"
    mistyped = cli(f"--home {home} loop list --home {other}")  # the subcommand's own option wins
    assert mistyped.exit_code == 1 and str(other) in one_line(mistyped.stderr)


def test_home_prints_the_resolved_home_and_where_it_came_from(tmp_path, env_home, monkeypatch):
    assert cli("home").stdout.strip() == str(env_home)
    out = ok_json(f"home --home {tmp_path / 'flag'}")
    assert out == {
        "home": str(tmp_path / "flag"),
        "source": "--home",
        "database": str(tmp_path / "flag" / "loopwarden.db"),
        "exists": False,
    }
    assert ok_json("home")["source"] == "LOOPWARDEN_HOME"
    monkeypatch.delenv("LOOPWARDEN_HOME")
    default = ok_json("home")
    assert default["source"] == "default"
    assert default["home"] == str(Path(platformdirs.user_data_dir("loopwarden")).resolve())
    assert not (tmp_path / "flag").exists() and not env_home.exists()  # it only looks


def test_home_says_when_the_home_holds_a_database(home, loop):
    result = cli(f"home --home {home}")
    assert (result.stdout.strip(), "holds a database") == (str(home), one_line(result.stderr)[-16:])


def test_root_help_names_the_data_home_and_the_exit_codes(env_home):
    text = one_line(cli("--help").stdout)
    assert f"Data home: {env_home} (given by $LOOPWARDEN_HOME; no database yet)." in text
    assert "Exit codes: 0 ok, 1 refused / not found / failed, 2 usage" in text


# Every command that only reads, or acts on something already stored, on a home with no
# database: it says so, exits 1 and creates nothing (a mistyped --home is not a new store).
NEEDS_A_STORE = [
    "loop list",
    "loop show L1",
    "loop pause L1",
    "loop resume L1",
    "loop cancel L1",
    "receipts L1",
    "receipts L1 --follow",
    "receipt rcpt-" + "0" * 24,
    "verify",
    "verify --loop L1",
    "approvals",
    f"approve {NO_SUCH_APPROVAL}",
    f"reject {NO_SUCH_APPROVAL} --reason no",
    "token list",
    "token revoke tok-ghost",
    "export L1 -o {tmp}/bundle.json",
]


@pytest.mark.parametrize("command", NEEDS_A_STORE)
@pytest.mark.parametrize("exists", [False, True], ids=["no-directory", "empty-directory"])
def test_a_command_needing_a_store_on_a_home_without_one_exits_1_and_creates_nothing(
    tmp_path, command, exists
):
    home = tmp_path / "mistyped"
    if exists:
        home.mkdir()
    line = command.format(tmp=tmp_path)
    human = cli(f"{line} --home {home}")
    assert human.exit_code == 1, human.output
    assert f"there is no loopwarden database in {home}" in one_line(human.stderr)
    code, out = cli_json(f"{line} --home {home}")
    assert code == 1
    assert_error_document(out, "not_found")
    assert home.exists() == exists and (not exists or list(home.iterdir()) == [])
    assert not (tmp_path / "bundle.json").exists()


@pytest.mark.parametrize("command", ["keys show", "keys export", "keys export --all"])
def test_keys_commands_work_on_a_keys_only_home_and_refuse_one_without_keys(tmp_path, command):
    """`keys rotate` makes a home with keys and no database (a replica's, a verifier's): the
    key commands read it (they said "no loopwarden database"); a home without keys is exit 1,
    and nothing is created."""
    home = tmp_path / "replica"
    active = ok_json(f"keys rotate --home {home}")["active"]
    assert not (home / DB_NAME).exists()
    shown = cli(f"{command} --home {home}")
    assert shown.exit_code == 0, shown.output
    assert active in shown.stdout
    assert not (home / DB_NAME).exists()
    missing = tmp_path / "mistyped"
    human = cli(f"{command} --home {missing}")
    assert human.exit_code == 1 and f"there are no signing keys in {missing}" in one_line(
        human.stderr
    )
    code, out = cli_json(f"{command} --home {missing}")
    assert code == 1
    assert_error_document(out, "not_found")
    assert not missing.exists()


def test_a_mistyped_home_creates_nothing_in_a_real_process(tmp_path):
    """The issue's case: `loop list --home /mistyped` used to print an empty table, exit 0
    and leave a database and keys behind."""
    home = tmp_path / "mistyped"
    for command in ("loop list", "verify"):
        proc = subprocess_cli(f"{command} --home {home}")
        assert proc.returncode == 1 and "no loopwarden database" in one_line(proc.stderr)
        assert proc.stdout == "" and not home.exists()


# --- policy init -----------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
# The starter policy's digest: the same as examples/policy.yaml's. A change to the starter's
# values must change this on purpose (the README shows it).
STARTER_DIGEST = "sha256:031ee1c60f462ec0793ef296a7aff4677d9013f39d4cf2489e5ba49b253d4381"


def test_policy_init_prints_a_commented_starter_policy_valid_as_written(tmp_path):
    result = cli("policy init")
    assert result.exit_code == 0
    text = result.stdout
    assert sum(line.lstrip().startswith("#") for line in text.splitlines()) >= 10
    policy = parse_policy(text, "toml", source="starter")
    assert policy_digest(policy) == STARTER_DIGEST
    assert policy.agents == ("builder", "reviewer") and not policy.budgets.is_empty()


def test_policy_init_writes_the_file_policy_check_accepts_and_never_overwrites(tmp_path):
    target = tmp_path / "policy.toml"
    written = cli(f"policy init {target}")
    assert written.exit_code == 0 and f"policy check {target}" in one_line(written.stdout)
    assert target.read_text() == cli("policy init").stdout
    assert ok_json(f"policy check {target}")["digest"] == STARTER_DIGEST
    target.write_text("# mine\n")
    again = cli(f"policy init {target}")
    assert again.exit_code == 1 and "--force" in one_line(again.stderr)
    assert target.read_text() == "# mine\n"  # refused, unchanged
    assert cli(f"policy init {target} --force").exit_code == 0
    assert ok_json(f"policy check {target}")["digest"] == STARTER_DIGEST


def test_policy_init_refuses_a_file_name_that_is_not_toml(tmp_path):
    result = cli(f"policy init {tmp_path / 'policy.yaml'}")
    assert result.exit_code == 2 and "*.toml" in one_line(result.stderr)
    assert not (tmp_path / "policy.yaml").exists()


def test_the_example_policy_is_the_starter_policy_and_cites_no_missing_file():
    example = (REPO / "examples" / "policy.toml").read_text()
    assert example == cli("policy init").stdout
    assert "DESIGN.md" not in example
    assert ok_json(f"policy check {REPO / 'examples' / 'policy.yaml'}")["digest"] == STARTER_DIGEST


def test_policy_check_accepts_home_and_policy_schema_accepts_json(policy_file, tmp_path):
    checked = ok_json(f"policy check {policy_file} --home {tmp_path / 'unused'}")
    assert checked["valid"] is True and not (tmp_path / "unused").exists()
    assert cli("policy schema --json").stdout == cli("policy schema").stdout
    assert json.loads(cli("--json policy schema").stdout)["type"] == "object"


# --- keys export → verify-bundle -------------------------------------------------------------


def exported(home: Path, tmp_path: Path, flags: str) -> tuple[str, Path]:
    """`keys export FLAGS` to stdout and to a file: (the stdout text, the file)."""
    shown = cli(f"keys export {flags} --home {home}")
    assert shown.exit_code == 0, shown.stderr
    path = tmp_path / f"key{len(list(tmp_path.glob('key*')))}"
    assert cli(f"keys export {flags} -o {path} --home {home}").exit_code == 0
    assert path.read_text() == shown.stdout
    return shown.stdout.strip(), path


@pytest.mark.parametrize("flags", ["", "--json", "--all", "--all --json"])
def test_what_keys_export_writes_is_what_verify_bundle_and_verify_accept(
    home, bundle, tmp_path, flags
):
    text, path = exported(home, tmp_path, flags)
    if not flags.endswith("--json"):
        assert ok_json(f"verify-bundle {bundle} --key {shlex.quote(text)}")["keys_pinned"]
    for option in (f"--key {path}", f"--trusted-keys {path}"):
        out = ok_json(f"verify-bundle {bundle} {option}")
        assert (out["verdict"], out["keys_pinned"]) == ("clean", True)
    assert ok_json(f"verify --trusted-keys {path} --home {home}")["verdict"] == "clean"


def test_keys_export_all_includes_retired_keys_so_old_bundles_still_pin(home, bundle, tmp_path):
    old_key, _ = exported(home, tmp_path, "")
    assert cli(f"keys rotate --home {home}").exit_code == 0
    current, _ = exported(home, tmp_path, "")
    code, out = cli_json(f"verify-bundle {bundle} --key {shlex.quote(current)}")
    assert code == 3 and "unknown_key" in {f["code"] for f in out["findings"]}
    _, every = exported(home, tmp_path, "--all")
    assert {line.split()[0] for line in every.read_text().splitlines()} == {
        old_key.split()[0],
        current.split()[0],
    }
    assert ok_json(f"verify-bundle {bundle} --trusted-keys {every}")["verdict"] == "clean"


def test_trusted_keys_keep_the_old_forms_and_refuse_a_mislabelled_key(home, bundle, tmp_path):
    key = ok_json(f"keys export --home {home}")
    path = tmp_path / "trusted.json"
    for document in (
        {key["key_id"]: key["public_key"]},  # the documented {key_id: base64}
        {"keys": {key["key_id"]: key["public_key"]}},
        {"prod": key["public_key"]},  # a label that is not a key id is only a name
        ok_json(f"keys show --home {home}"),
    ):
        path.write_text(json.dumps(document))
        assert ok_json(f"verify-bundle {bundle} --trusted-keys {path}")["verdict"] == "clean"
    assert ok_json(f"verify-bundle {bundle} --key {key['public_key']}")["verdict"] == "clean"
    path.write_text(json.dumps({"ed25519-0000000000000000": key["public_key"]}))
    result = cli(f"verify-bundle {bundle} --trusted-keys {path}")
    assert result.exit_code == 2 and "mislabelled" in one_line(result.stderr)


def test_verify_bundle_key_that_is_neither_a_file_nor_a_key_exits_2(bundle, tmp_path):
    result = cli(f"verify-bundle {bundle} --key {tmp_path / 'no-such.pub'}")
    assert result.exit_code == 2
    assert "neither a key file nor a base64 public key" in one_line(result.stderr)


def test_one_edited_receipt_in_a_six_receipt_bundle_is_one_finding(home, policy_file, tmp_path):
    """The issue's case: an edit used to be reported as three problems and a cut-off bundle
    (`bundle_incomplete … receipts end at seq 3`) although all 6 receipts were there."""
    open_loop(home, policy_file, "SIX", "a")
    for action in ("pause", "resume", "pause", "resume", "cancel"):
        assert cli(f"loop {action} SIX --home {home}").exit_code == 0
    path = tmp_path / "six.json"
    ok_json(f"export SIX -o {path} --home {home}")
    bundle = json.loads(path.read_text())
    assert len(bundle["receipts"]) == 6
    envelope = json.loads(bundle["receipts"][2]["envelope"])
    body = json.loads(base64.b64decode(envelope["payload"]))
    body["data"]["reason"] = "edited"
    envelope["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
    bundle["receipts"][2]["envelope"] = json.dumps(envelope)
    path.write_text(json.dumps(bundle))
    code, out = cli_json(f"verify-bundle {path}")
    assert code == 3
    assert [(f["code"], f.get("position")) for f in out["findings"]] == [("signature_invalid", 3)]
    assert (out["receipts"], out["status"]) == (6, "cancelled")
    human = cli(f"verify-bundle {path}").stdout
    assert "6 receipts" in human and "bundle_incomplete" not in human


# --- receipts --follow -----------------------------------------------------------------------

FOLLOW_TIMEOUT = 30.0  # seconds for a follower to print its header, and to stop


def columns_line_up(lines: list[str]) -> None:
    """Every row's cells start where the header's columns do (fixed widths)."""
    header = lines[0]
    starts = [header.index(name) for name in ("time", "kind", "principal", "receipt", "sig")]
    for row in lines[1:]:
        for start in starts:
            assert row[start - 2 : start] == "  " and row[start] != " ", (header, row)


def test_receipts_follow_of_a_closed_loop_prints_everything_once_and_exits_0(home, loop):
    assert cli(f"loop cancel {loop} --home {home}").exit_code == 0
    result = cli(f"receipts {loop} --follow --home {home}")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == f"receipts of {loop}" and lines[1].startswith("seq")
    assert [line.split()[2] for line in lines[2:]] == ["loop.opened", "loop.cancelled"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", lines[2].split()[1])
    columns_line_up(lines[1:])
    assert "stopped following" in result.stderr


def test_receipts_follow_prints_one_header_and_stops_when_the_loop_closes(home, loop, tmp_path):
    """A real follower process: new receipts appear under the first header, in fixed columns,
    and it exits 0 on its own once the loop is closed."""
    with (tmp_path / "follow.err").open("w") as errors:
        follower = subprocess.Popen(
            loopwarden_process("receipts", loop, "--follow", "--home", str(home)),
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=cli_env(),
        )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=read_into, args=(follower, lines), daemon=True)
    reader.start()
    try:
        first = [next_line(lines) for _ in range(3)]  # title, header, loop.opened
        agent_report(home, agent_claim(home, loop))
        assert cli(f"loop cancel {loop} --home {home}").exit_code == 0
        assert follower.wait(timeout=FOLLOW_TIMEOUT) == 0, (tmp_path / "follow.err").read_text()
    finally:
        follower.kill()
        follower.wait()
    reader.join(timeout=FOLLOW_TIMEOUT)
    rest = list(iter(lines.get_nowait, None))
    every = first + rest
    assert sum(line.startswith("seq ") for line in every) == 1
    assert [line.split()[2] for line in every[2:]] == [
        "loop.opened",
        "turn.claimed",
        "turn.reported",
        "loop.cancelled",
    ]
    columns_line_up(every[1:])


# --- events: receipts as CloudEvents ----------------------------------------------------------


def _events(command: str) -> list[dict[str, Any]]:
    result = cli(command)
    assert result.exit_code == 0, result.stdout
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_events_prints_every_receipt_as_a_cloudevent_in_log_order_and_resumes_after(home, loop):
    agent_report(home, agent_claim(home, loop))
    ok_json(f"loop pause {loop} --home {home}")
    every = _events(f"events --home {home}")
    journal = ok_json(f"receipts {loop} --home {home}")["receipts"]
    assert [e["id"] for e in every] == [r["receipt_id"] for r in journal]  # one loop: log order
    assert [e["loopwardenindex"] for e in every] == list(range(len(journal)))
    keyring = admin.keyring_of(home)
    for event, line in zip(every, journal, strict=True):
        assert event["specversion"] == "1.0" and event["source"].startswith("loopwarden:")
        assert event["type"] == "io.github.loopwarden.receipt." + line["kind"]
        assert (event["subject"], event["loopwardenseq"]) == (loop, line["seq"])
        data, stored = event["data"], ok_json(f"receipt {event['id']} --home {home}")
        assert (data["log_index"], data["digest"]) == (stored["leaf_index"], stored["digest"])
        envelope = canonical_bytes(data["envelope"])
        assert sha256_digest(envelope) == data["digest"]  # the envelope as stored, byte for byte
        assert open_envelope(envelope, keyring).verified
    assert _events(f"events --after 1 --home {home}") == every[2:]
    assert _events(f"events --after {len(every) - 1} --home {home}") == []
    code, out = cli_json(f"events --after -2 --home {home}")
    assert code == 2 and "--after -2" in out["message"]


def test_receipts_format_cloudevents_is_the_events_feed_of_the_store_or_of_one_loop(
    home, loop, policy_file
):
    other = ok_json(f"loop open --policy {policy_file} --objective o --home {home}")["loop_id"]
    ok_json(f"loop pause {loop} --home {home}")
    every = _events(f"events --home {home}")
    assert _events(f"receipts --format cloudevents --home {home}") == every
    assert _events(f"receipts {loop} --format cloudevents --home {home}") == [
        e for e in every if e["subject"] == loop
    ]
    paused = _events(f"receipts {loop} --format cloudevents --kind loop.paused --home {home}")
    assert [e["type"] for e in paused] == ["io.github.loopwarden.receipt.loop.paused"]
    assert {e["subject"] for e in every} == {loop, other}
    code, out = cli_json(f"receipts --home {home}")
    assert code == 2 and "--format cloudevents" in out["message"]


def test_export_status_shows_each_sinks_cursor_lag_error_and_live_lease(home, loop):
    async def sink() -> None:
        async with admin.open_store(home) as store:
            await store.write(
                lambda tx: tx.cursors.take_export_lease("siem", "host/1/ab", "https://x", 600)
            )
            await store.write(lambda tx: tx.cursors.advance_export("siem", "host/1/ab", 0, 1, 600))
            await store.write(
                lambda tx: tx.cursors.note_export_failure("siem", "host/1/ab", "HTTP 503")
            )

    code, empty = cli_json(f"export-status --home {home}")
    assert code == 0 and empty["sinks"] == [] and empty["log_size"] >= 1
    anyio.run(sink)
    code, status = cli_json(f"export-status --home {home}")
    assert code == 0, status
    (found,) = status["sinks"]
    assert (found["sink"], found["target"], found["exported"]) == ("siem", "https://x", 0)
    assert found["lag"] == status["log_size"] - 1 and found["sent"] == 1
    assert (found["last_error"], found["lease_holder"]) == ("HTTP 503", "host/1/ab")
    assert found["last_success"] and found["last_error_at"] and found["lease_expires_at"]
    shown = cli(f"export-status --home {home}")
    assert shown.exit_code == 0 and "siem" in shown.stdout and "HTTP 503" in shown.stdout
    assert cli(f"export-status --home {home}/nowhere").exit_code == 1


def test_events_follow_prints_new_receipts_as_they_are_sealed(home, loop, tmp_path):
    with (tmp_path / "events.err").open("w") as errors:
        follower = subprocess.Popen(
            loopwarden_process("events", "--follow", "--home", str(home)),
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=cli_env(),
        )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=read_into, args=(follower, lines), daemon=True).start()
    try:
        assert json.loads(next_line(lines))["type"].endswith(".loop.opened")
        paused = ok_json(f"loop pause {loop} --home {home}")
        assert json.loads(next_line(lines))["id"] == paused["receipt_id"]
    finally:
        follower.kill()
        follower.wait()


def read_into(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Every line `process` prints, then None at its end."""
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def next_line(lines: queue.Queue[str | None]) -> str:
    try:
        line = lines.get(timeout=FOLLOW_TIMEOUT)
    except queue.Empty:
        raise AssertionError(f"no output within {FOLLOW_TIMEOUT}s") from None
    assert line is not None, "the follower ended early"
    return line


# --- serve on a busy port --------------------------------------------------------------------


def test_serve_http_on_a_busy_port_says_address_in_use_and_exits_1(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess_cli(f"serve --http 127.0.0.1:{port} --home {home}")
    assert proc.returncode == 1, proc.stderr
    assert f"address in use: 127.0.0.1:{port}" in one_line(proc.stderr)
    assert "serving" not in proc.stderr and "Traceback" not in proc.stderr


# --- a loop with no todos --------------------------------------------------------------------


def test_a_loop_opened_without_todos_says_so_at_open_claim_quota_and_show(home, policy_file):
    opened = cli(f"loop open --policy {policy_file} --objective o --id EMPTY --home {home}")
    assert opened.exit_code == 0 and "with 0 todos" in opened.stdout
    assert "this loop has no todos" in one_line(opened.stderr)
    claimed = agent_claim(home, "EMPTY")
    assert not claimed.granted and claimed.receipt_id is None  # nothing to claim: no receipt
    assert [(r.code, r.message) for r in claimed.reasons] == [
        (
            "no_eligible_todo",
            "this loop has no todos: nothing can be claimed until one is added (todo_add)",
        )
    ]
    quota = with_store(home, lambda k: quota_op(k, BUILDER, QuotaRequest(loop_id="EMPTY")))
    assert not quota.allowed and "this loop has no todos" in quota.reasons[0].message
    shown = ok_json(f"loop show EMPTY --home {home}")
    assert shown["attention"] == {"who": "human", "why": "the loop has no todos"}
    assert kinds(home, "EMPTY") == ["loop.opened"]


def test_a_loop_with_todos_waiting_on_dependencies_keeps_the_dependency_message(
    home, policy_file, tmp_path
):
    todos = tmp_path / "todos.json"
    todos.write_text(json.dumps([{"id": "a", "title": "a"}, {"title": "b", "depends_on": ["a"]}]))
    ok_json(
        f"loop open --policy {policy_file} --objective o --todos {todos} --id DEP --home {home}"
    )
    assert agent_claim(home, "DEP").granted
    waiting = agent_claim(home, "DEP", REVIEWER)
    assert [r.message for r in waiting.reasons] == ["no open todo has its dependencies done"]


# --- polish: plurals, help, demo, widths -----------------------------------------------------


def test_counts_of_one_are_singular(home, policy_file):
    assert (
        "with 1 todo ("
        in cli(
            f"loop open --policy {policy_file} --objective o --todo a --id ONE --home {home}"
        ).stdout
    )
    ok_json(f"export ONE -o {home / 'one.json'} --home {home}")
    audit_line = cli(f"verify --home {home}").stdout.splitlines()[1]  # after "trusting …"
    assert "— 1 receipt, 1 loop, 1 checkpoint, tree size 1" in audit_line
    assert "loop ONE, 1 receipt," in cli(f"verify-bundle {home / 'one.json'}").stdout
    assert render.counted(0, "loop") == "0 loops" and render.counted(2, "todo") == "2 todos"


def every_command(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in getattr(group, "commands", {}).items():
        found.append((*path, name))
        found += every_command(command, (*path, name))
    return found


COMMANDS = every_command(typer.main.get_command(app))


def command_named(path: tuple[str, ...]) -> Any:
    found = typer.main.get_command(app)
    for name in path:
        found = found.commands[name]
    return found


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_help_shows_no_bool_placeholders_and_unwraps_every_paragraph(command):
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=400)
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout
    description = result.stdout.split("\n\n")[1:]  # after the usage line
    for paragraph in description:
        if paragraph.startswith(("Options:", "Commands:", "Arguments:")):
            break
        assert "\n" not in paragraph.strip(), paragraph  # re-wrapped, never hard-wrapped


def test_every_command_summary_fits_the_command_list():
    for command in COMMANDS:
        summary = (command_named(command).help or "").split("\f")[0].strip().split("\n\n")[0]
        assert "\n" not in summary and len(summary) <= 60, (command, summary)


def test_loop_show_never_wraps_a_digest_at_80_columns(home, loop, monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(render, "console", Console(file=buffer, width=80, highlight=False))
    assert cli(f"loop show {loop} --home {home}").exit_code == 0
    shown = ok_json(f"loop show {loop} --home {home}")
    lines = buffer.getvalue().splitlines()
    assert f"policy:    {shown['policy_digest']}" in lines
    assert any(line.endswith(shown["head"]["digest"]) for line in lines)


def test_the_demo_hint_names_a_command_that_runs(tmp_path, monkeypatch):
    script = tmp_path / "venv" / "bin" / "loopwarden"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "demo"])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert render.program() == "venv/bin/loopwarden"  # below the working directory: relative
    monkeypatch.chdir(tmp_path / "venv")
    monkeypatch.setattr(sys, "argv", ["bin/loopwarden", "demo"])
    assert render.program() == "bin/loopwarden"
    monkeypatch.setenv("PATH", str(script.parent))
    script.chmod(0o755)
    assert render.program() == "loopwarden"  # the one on the PATH
    monkeypatch.setattr(sys, "argv", ["/somewhere/__main__.py"])
    assert render.program() == f"{sys.executable} -m loopwarden"


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "--json"])
def test_the_demo_refuses_a_home_that_holds_a_database_up_front_with_exit_1(tmp_path, as_json):
    """A second `demo --home DIR` on one DIR: refused before it runs a scenario (an earlier demo's
    loop ids are taken, so every scenario failed and the run exited 3, the tamper code)."""
    home = tmp_path / "demo"
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps(BASIC_POLICY))
    opened = cli(
        f"loop open --policy {policy} --objective x --todo t --id build-review --home {home}"
    )
    assert opened.exit_code == 0, opened.output
    before = (home / DB_NAME).read_bytes()
    done = cli(f"demo --home {home}" + (" --json" if as_json else ""))
    assert done.exit_code == 1, done.output
    assert str(home) in done.stderr and "already holds a loopwarden database" in done.stderr
    assert "new directory" in done.stderr and "━━" not in done.stdout  # no scenario ran
    if as_json:
        assert json.loads(done.stdout)["error"] == "conflict"
    assert (home / DB_NAME).read_bytes() == before and not (home / "guarded-bundle.json").exists()


@pytest.mark.parametrize("given", [False, True], ids=["temporary", "--home"])
def test_the_demo_keeps_its_store_and_bundle_only_in_a_given_home(
    tmp_path, monkeypatch, capsys, given
):
    """The demo's own bookkeeping, with one stand-in scenario (the real ones run above)."""
    seen: list[tuple[Path, Path]] = []

    async def scenario(home: Path, narrator: Any, work: Path) -> bool:
        seen.append((home, work))
        (work / "guarded-bundle.json").write_text("{}")
        return True

    monkeypatch.setattr(demo, "SCENARIOS", {"only": scenario})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    home = tmp_path / "kept" if given else None
    assert anyio.run(demo.run_demo, home, True)
    out = json.loads(capsys.readouterr().out)
    ((used, work),) = seen
    assert (out["kept"], out["home"]) == (given, str(used))
    if given:
        assert used == work == home and (work / "guarded-bundle.json").is_file()
    else:
        assert work.name.startswith("loopwarden-demo-") and used == work / "home"
        assert not work.exists()


LEAVES = [c for c in COMMANDS if not hasattr(command_named(c), "commands")]


@pytest.mark.parametrize("command", LEAVES, ids=[" ".join(c) for c in LEAVES])
def test_every_command_takes_home_and_every_one_that_prints_takes_json(command, tmp_path):
    flags = ["--home", str(tmp_path)] + ([] if command == ("serve",) else ["--json"])
    result = CliRunner().invoke(app, [*command, *flags, "--help"])
    assert result.exit_code == 0, result.output  # an unknown option would be exit 2


def test_policy_init_json_names_the_file_and_the_digest(tmp_path):
    target = tmp_path / "p.toml"
    assert ok_json(f"policy init {target}") == {"file": str(target), "digest": STARTER_DIGEST}
    printed = ok_json("policy init")
    assert (printed["file"], printed["digest"]) == (None, STARTER_DIGEST)
    assert printed["text"] == target.read_text()


def test_times_print_in_the_one_utc_form_in_json_and_in_text(home, loop, two_pending):
    """An instant is a datetime in memory; wherever the CLI prints one it is `format_time`'s
    text (never Python's `2026-01-01 00:00:00+00:00`)."""
    stamp = re.compile(TIME_PATTERN.strip("^$"))
    first, _ = two_pending
    approved = cli(f"approve {first} --expires 30m --home {home}")
    said = approved.stdout + approved.stderr
    assert approved.exit_code == 0 and stamp.search(said) and "+00:00" not in said
    listed = ok_json(f"loop list --home {home}")["loops"]
    assert listed and all(re.fullmatch(stamp, lp["opened_at"]) for lp in listed)
    made = ok_json(f"token create --agent builder --expires 1h --home {home}")
    assert re.fullmatch(stamp, made["expires_at"])
    (token,) = ok_json(f"token list --home {home}")["tokens"]
    assert all(re.fullmatch(stamp, token[k]) for k in ("created_at", "expires_at"))


# --- messages a person can act on ------------------------------------------------------------


def test_a_malformed_id_is_described_not_shown_as_a_regular_expression(home, loop):
    result = cli(f"approve appr-nope --home {home}")
    said = one_line(result.stderr)
    assert result.exit_code == 2 and "'appr-' followed by 20 hex digits" in said
    assert "^appr" not in said and "{20}" not in said


def test_a_mistyped_pool_name_gets_the_pools_it_may_mean(home):
    assert cli(f"pool create team --max-turns 5 --home {home}").exit_code == 0
    result = cli(f"pool show tema --home {home}")
    assert result.exit_code == 1 and "did you mean 'team'?" in one_line(result.stderr)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('agents = ["a"]\n[budgets]\nmax_turn = 3\n', "budgets.max_turn: unknown key (did you mean 'max_turns'?)"),
        ('agents = ["a"]\n[budgets]\nmax_turns = 3\n[tool]\nallow = []\n', "tool: unknown key (did you mean 'tools'?)"),
        ('agents = ["a"]\n[budgets]\nmax_turns = 3\n\n[tools]\nallow = ["fs.read"\ndeny = []\n\n[stop]\n',
         "the one opened at line 6 is not closed"),
    ],
    ids=["a-budget-key", "a-section", "an-unclosed-array"],
)  # fmt: skip
def test_a_policy_mistake_is_reported_where_it_is_with_what_was_meant(tmp_path, text, said):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    result = cli(f"policy check {path}")
    assert result.exit_code == 2 and said in one_line(result.stderr)
