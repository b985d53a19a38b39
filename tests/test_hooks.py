"""Host hooks decide every tool call before it runs (issue 10).

The events are the hosts' documented payloads (`tests/fixtures/hooks/<host>/`, each with its
source in SOURCES.md), edited only where a case needs another tool or command. This file runs
them through `hooks.handle` on a real store (the decision matrix, every reason), through a real
`loopwarden hook HOST` subprocess per host (formats, exit codes, failing closed), and checks
that update compares reports with what was observed, that every receipt is judged legal, and
that the installer merges settings without clobbering them. The tests marked `backends` run on
SQLite and on PostgreSQL (the decision matrix, the report cross-check, Stop, and a real hook
process given the store with `--store`).
"""

from __future__ import annotations

import base64
import copy
import json
import shlex
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import BUILDER, OPERATOR, REVIEWER
from support import cli_env, control_loop, loopwarden, make_policy

from loopwarden.approvals.approval_ops import (
    ApprovalRequest,
    DecideApprovalRequest,
    decide_approval,
    request_approval,
)
from loopwarden.audit.database import audit
from loopwarden.clock import ManualClock
from loopwarden.hosts.handle import handle
from loopwarden.hosts.install import Target, merged
from loopwarden.hosts.tool_names import policy_tool
from loopwarden.kernel.store.store import Store
from loopwarden.loops.lifecycle import LoopControlRequest, OpenLoopRequest, TodoInput, open_loop
from loopwarden.policy.commands.lines import read_line
from loopwarden.turns.claim import ClaimRequest, ClaimResult, claim
from loopwarden.turns.update import UpdateRequest, update

FIXTURES = Path(__file__).parent / "fixtures" / "hooks"
LOOP = "L1"
HOOKED = {
    "agents": ["builder", "reviewer"],
    "tools": {
        "allow": ["fs.*", "shell.run", "mcp.github.*"],
        "deny": ["web.*"],
        "approval": ["mcp.deploy.*"],
        "commands": {"deny": ["git push*", "rm -rf *"]},
    },
    "budgets": {"max_turns": 20, "max_tool_calls": 6},
    "stop": {"on_violation": "refuse_turn"},
    "observe": {"mode": "enforce"},
}

pytestmark = pytest.mark.anyio


def fixture(host: str, name: str, **changes: Any) -> dict[str, Any]:
    event = json.loads((FIXTURES / host / f"{name}.json").read_text())
    for key, value in changes.items():
        event[key] = value
    return event


def bash(command: str, **changes: Any) -> dict[str, Any]:
    event = fixture("claude-code", "PreToolUse-bash", **changes)
    event["tool_input"] = {**event["tool_input"], "command": command}
    return event


async def say(
    store: Store, event: dict[str, Any], agent: str = "builder", host: str = "claude-code"
):
    """The reply to one event, and what the host would make of it."""
    reply = await handle(
        store, host, json.dumps(event).encode(), loop_id=LOOP, agent=agent, servers=["loopwarden"]
    )
    out = json.loads(reply.stdout) if reply.stdout else {}
    return reply, out


def denied(out: dict[str, Any]) -> str | None:
    """Claude Code's reading of a reply: the deny reason, or None if the call may run."""
    spec = out.get("hookSpecificOutput", {})
    return (
        spec.get("permissionDecisionReason") if spec.get("permissionDecision") == "deny" else None
    )


async def opened(store: Store, policy: dict[str, Any] | None = None, todos: int = 3) -> None:
    await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            objective="hooked",
            policy=policy or HOOKED,
            loop_id=LOOP,
            todos=[TodoInput(id=f"t{n}", title=f"todo {n}") for n in range(todos)],
        ),
    )


async def attached_claim(store: Store, who=BUILDER) -> ClaimResult:
    await say(store, fixture("claude-code", "SessionStart-startup"), agent=who.id)
    granted = await claim(store, who, ClaimRequest(loop_id=LOOP))
    assert granted.granted, granted.reasons
    return granted


async def judged_clean(store: Store) -> None:
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert report.findings == [], [f.as_dict() for f in report.findings]


async def kinds(store: Store) -> list[str]:
    return [r.kind for r in await store.read(lambda r: r.loop_journal(LOOP))]


# --- before a tool runs ------------------------------------------------------------------------


async def test_without_a_turn_every_tool_is_denied_but_loopwardens_own_tools_run(store):
    await opened(store)
    _, out = await say(store, fixture("claude-code", "PreToolUse-read"))
    assert "claim a turn first" in denied(out)
    for name in ("claim", "update", "quota"):
        _, own = await say(
            store, fixture("claude-code", "PreToolUse-mcp", tool_name=f"mcp__loopwarden__{name}")
        )
        assert own == {}, "loopwarden's own tools always run"
    assert await kinds(store) == ["loop.opened", "host.attached", "tool.refused"]
    await judged_clean(store)


CASES = [  # (event, the reason code it must be denied for, or None for allowed)
    (fixture("claude-code", "PreToolUse-read"), None),
    (fixture("claude-code", "PreToolUse-write"), None),
    (bash("pytest -q tests/test_auth.py"), None),
    (bash("git push origin main"), "command_denied"),
    (bash("git status && git push --force"), "command_denied"),
    (bash("echo $(rm -rf /tmp/x)"), "command_denied"),
    (bash("sudo -u ci git push"), "command_denied"),
    (bash("bash -c 'git push'"), "command_denied"),
    (bash('echo "unclosed'), "command_unreadable"),
    (fixture("claude-code", "PreToolUse-read", tool_name="WebFetch"), "tool_denied"),
    (fixture("claude-code", "PreToolUse-read", tool_name="FancyNewTool"), "tool_not_allowed"),
    (fixture("claude-code", "PreToolUse-mcp"), None),  # mcp.github.create_issue is allowed
    (fixture("claude-code", "PreToolUse-mcp", tool_name="mcp__slack__post"), "tool_not_allowed"),
    (fixture("claude-code", "PreToolUse-mcp", tool_name="mcp__deploy__prod"), "approval_required"),
]


@pytest.mark.parametrize(
    ("event", "code"), CASES, ids=[f"{i}-{c}" for i, (_, c) in enumerate(CASES)]
)
@pytest.mark.backends
async def test_each_tool_call_is_decided_by_the_policy_before_it_runs(store, event, code):
    await opened(store)
    granted = await attached_claim(store)
    reply, out = await say(store, event)
    answer_reason = denied(out)
    journal = await store.read(lambda r: r.loop_journal(LOOP))
    last = json.loads(base64.b64decode(json.loads(journal[-1].envelope)["payload"]))
    if code is None:
        assert answer_reason is None and reply.exit_code == 0 and reply.stdout == ""
        assert last["kind"] == "tool.admitted" and last["turn_id"] == granted.turn_id
    else:
        assert answer_reason is not None, out
        assert last["kind"] == "tool.refused" and last["data"]["enforced"] is True
        assert code in [r["code"] for r in last["decision"]["reasons"]]
    assert "tool_input" not in json.dumps(last["data"]), "the input itself is never recorded"
    assert last["data"]["input_digest"].startswith("sha256:")
    await judged_clean(store)


async def test_an_approval_gated_tool_runs_once_an_operator_approves_it(store):
    await opened(store)
    granted = await attached_claim(store)
    gated = fixture("claude-code", "PreToolUse-mcp", tool_name="mcp__deploy__prod")
    _, out = await say(store, gated)
    assert "request_approval" in denied(out) and granted.turn_id in denied(out)
    asked = await request_approval(
        store,
        BUILDER,
        ApprovalRequest(
            turn_id=granted.turn_id, fence=granted.fence, tool="mcp.deploy.prod", summary="ship"
        ),
    )
    await decide_approval(
        store, OPERATOR, DecideApprovalRequest(approval_id=asked.approval_id, approve=True)
    )
    _, out = await say(store, gated)
    assert denied(out) is None
    await judged_clean(store)


async def test_observed_calls_count_against_max_tool_calls_before_any_report(store):
    await opened(store)
    await attached_claim(store)
    answers = [denied((await say(store, bash("ls")))[1]) for _ in range(7)]
    assert answers[:6] == [None] * 6
    assert "tool_calls budget is used up" in answers[6]
    await judged_clean(store)


async def test_a_paused_loop_runs_no_tool(store):
    await opened(store)
    await attached_claim(store)
    await control_loop(store, OPERATOR, "pause", LoopControlRequest(loop_id=LOOP))
    _, out = await say(store, fixture("claude-code", "PreToolUse-read"))
    assert "is paused" in denied(out)
    await judged_clean(store)


async def test_another_agents_hook_cannot_use_this_agents_turn(store):
    await opened(store)
    await attached_claim(store, BUILDER)
    _, out = await say(store, fixture("claude-code", "PreToolUse-read"), agent="reviewer")
    assert "claim a turn first" in denied(out), "the reviewer holds no turn"


async def test_an_agent_outside_the_policy_is_blocked_and_recorded(store):
    await opened(store)
    reply, _ = await say(store, fixture("claude-code", "PreToolUse-read"), agent="mallory")
    assert reply.exit_code == 2 and "no loop" in reply.stderr
    assert (await kinds(store))[-1] == "request.refused"
    await judged_clean(store)


# --- record mode: decided and sealed, never binding -----------------------------------------


async def test_record_mode_records_refusals_but_lets_the_call_run(store):
    await opened(store, {**HOOKED, "observe": {"mode": "record"}})
    await attached_claim(store)
    reply, out = await say(store, bash("git push origin main"))
    assert out == {} and reply.exit_code == 0, "record mode never blocks"
    assert (await kinds(store))[-1] == "tool.refused"
    await judged_clean(store)


async def test_mode_off_seals_nothing_and_blocks_nothing(store):
    await opened(store, {**HOOKED, "observe": {"mode": "off"}})
    before = await kinds(store)
    _, out = await say(store, bash("git push origin main"))
    assert out == {} and await kinds(store) == before


# --- the report against what was observed -----------------------------------------------------


def report(granted: ClaimResult, key: str, tools: dict[str, int], **kw: Any) -> UpdateRequest:
    return UpdateRequest(
        turn_id=granted.turn_id,  # type: ignore[arg-type]
        fence=granted.fence,  # type: ignore[arg-type]
        outcome="completed",
        summary="done",
        evidence=[{"kind": "test", "summary": "green"}],
        tools_used=[{"name": n, "count": c} for n, c in tools.items()],
        idempotency_key=key,
        **kw,
    )


@pytest.mark.backends
async def test_enforce_refuses_an_underreported_turn_and_charges_what_was_observed(store):
    await opened(store)
    granted = await attached_claim(store)
    for _ in range(3):
        await say(store, bash("pytest -q"))
    await say(store, fixture("claude-code", "PreToolUse-read"))
    under = await update(store, BUILDER, report(granted, "u1", {"fs.read": 1}))
    assert not under.accepted
    assert [r.code for r in under.reasons] == ["unreported_tool_use"]
    assert "shell.run" in under.reasons[0].message
    loop = await store.read(lambda r: r.loop_row(LOOP))
    assert loop.totals.tool_calls == 4, "the refused report is charged what the host observed"
    again = await attached_claim(store)
    await say(store, bash("pytest -q"))
    honest = await update(store, BUILDER, report(again, "u2", {"shell.run": 1}))
    assert honest.accepted, honest.reasons
    await judged_clean(store)


async def test_record_mode_accepts_with_warnings_both_ways(store):
    await opened(store, {**HOOKED, "observe": {"mode": "record"}})
    granted = await attached_claim(store)
    await say(store, bash("pytest -q"))
    result = await update(store, BUILDER, report(granted, "u1", {"fs.write": 2}))
    assert result.accepted
    assert sorted(r.code for r in result.reasons) == ["tool_unobserved", "tool_unreported"]
    await judged_clean(store)


@pytest.mark.backends
async def test_enforce_refuses_a_claim_until_the_agents_host_attached(store):
    await opened(store)
    refused = await claim(store, REVIEWER, ClaimRequest(loop_id=LOOP))
    assert not refused.granted and [r.code for r in refused.reasons] == ["host_not_attached"]
    granted = await attached_claim(store, REVIEWER)
    assert granted.granted
    await judged_clean(store)


async def test_max_tool_calls_charges_the_listed_counts_without_any_host(store):
    """The fix that holds without hooks: tools_used counts are charged even if usage says 0."""
    await opened(store, make_policy(budgets={"max_tool_calls": 1_000_000}))
    granted = await claim(store, BUILDER, ClaimRequest(loop_id=LOOP))
    listed = await update(
        store,
        BUILDER,
        report(granted, "u1", {"fs.write": 250_000}, usage={"tool_calls": 0}),
    )
    assert listed.accepted
    assert listed.budgets["tool_calls"].used == 250_000
    await judged_clean(store)


# --- the Stop hook --------------------------------------------------------------------------


@pytest.mark.backends
async def test_stop_is_blocked_once_while_observed_work_is_unreported(store):
    await opened(store)
    granted = await attached_claim(store)
    _, before_work = await say(store, fixture("claude-code", "Stop-first"))
    assert before_work == {}, "nothing observed yet: the host may stop"
    await say(store, bash("pytest -q"))
    _, out = await say(store, fixture("claude-code", "Stop-first"))
    assert out["decision"] == "block" and granted.turn_id in out["reason"]
    _, again = await say(store, fixture("claude-code", "Stop-after-block"))
    assert again == {}, "a host that was blocked once is let stop"


# --- shell parsing and names -----------------------------------------------------------------


def _runs(line: str) -> list[str]:
    """The commands a line runs, each as its words (a computed word as `<…>`)."""
    return [
        " ".join(w.text if w.text is not None else "<…>" for w in run.argv)
        for run in read_line(line).runs
    ]


@pytest.mark.parametrize(
    ("line", "commands"),
    [
        ("git status", ["git status"]),
        ("a && b || c; d | e & f", ["a", "b", "c", "d", "e", "f"]),
        ("FOO=1 BAR=2 make test", ["make test"]),
        ("/usr/bin/git push", ["/usr/bin/git push"]),
        ("echo `whoami`", ["echo <…>", "whoami"]),
        ('echo "$(git push)"', ["echo <…>", "git push"]),
        ("(cd src && rm -rf build)", ["cd src", "rm -rf build"]),
        ("sh -c 'make && git push'", ["sh -c make && git push", "make", "git push"]),
        ("eval 'git push'", ["eval git push", "git push"]),
        ("ls # git push", ["ls"]),
    ],
)
def test_a_command_line_is_read_into_what_it_runs(line, commands):
    assert sorted(_runs(line)) == sorted(commands)


@pytest.mark.parametrize("line", ['echo "open', "echo 'open", "echo $(unclosed", "echo `x"])
def test_an_unreadable_command_line_is_a_doubt_not_a_pass(line):
    reading = read_line(line)
    assert reading.doubts or any(run.doubts for run in reading.runs)


def test_nesting_is_bounded():
    line = "x"
    for _ in range(10):
        line = f"bash -c {shlex.quote(line)}"
    reading = read_line(line)
    assert any("nested deeper" in d.what for run in reading.runs for d in run.doubts)


@pytest.mark.parametrize(
    ("host", "tool", "name"),
    [
        ("claude-code", "Bash", "shell.run"),
        ("claude-code", "Edit", "fs.write"),
        ("claude-code", "Agent", "agent.spawn"),
        ("claude-code", "mcp__github__create_issue", "mcp.github.create_issue"),
        ("claude-code", "mcp__my.server__do it", "mcp.my_server.do_it"),
        ("claude-code", "SomethingNew", "host.SomethingNew"),
        ("codex", "apply_patch", "fs.write"),
        ("codex", "Bash", "shell.run"),
        ("gemini", "run_shell_command", "shell.run"),
        ("gemini", "replace", "fs.write"),
        ("cursor", "Shell", "shell.run"),
    ],
)
def test_host_tool_names_map_to_policy_names(host, tool, name):
    assert policy_tool(host, tool) == name


def test_the_policy_can_rename_a_host_tool():
    assert policy_tool("claude-code", "Bash", {"Bash": "shell.exec"}) == "shell.exec"


# --- the installer ---------------------------------------------------------------------------


def target(host: str = "claude-code", **kw: Any) -> Target:
    return Target(host, LOOP, "builder", ("/opt/bin/loopwarden",), Path("/srv/lw"), **kw)


def test_install_keeps_other_hooks_and_is_idempotent():
    theirs = {
        "permissions": {"allow": ["Bash(ls:*)"]},
        "hooks": {
            "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "lint"}]}]
        },
    }
    once = merged(copy.deepcopy(theirs), target())
    twice = merged(copy.deepcopy(once), target())
    assert once == twice
    assert once["permissions"] == theirs["permissions"]
    pre = once["hooks"]["PreToolUse"]
    assert pre[0] == theirs["hooks"]["PreToolUse"][0], "another tool's hook is kept as it was"
    assert pre[1]["hooks"][0]["onFailure"] == "block"
    assert (
        "hook claude-code --loop L1 --agent builder --home /srv/lw" in pre[1]["hooks"][0]["command"]
    )
    moved = merged(
        copy.deepcopy(once),
        Target("claude-code", "L2", "builder", ("/opt/bin/loopwarden",), Path("/srv/lw")),
    )
    assert len(moved["hooks"]["PreToolUse"]) == 2 and "--loop L2" in json.dumps(moved)


def test_install_http_posts_to_the_server_with_an_observer_token():
    settings = merged(None, target(http="http://127.0.0.1:8765"))
    hook = settings["hooks"]["PreToolUse"][0]["hooks"][0]
    assert (
        hook["type"] == "http" and hook["url"] == "http://127.0.0.1:8765/hooks/claude-code?loop=L1"
    )
    assert hook["headers"]["Authorization"] == "Bearer $LOOPWARDEN_OBSERVER_TOKEN"
    assert hook["allowedEnvVars"] == ["LOOPWARDEN_OBSERVER_TOKEN"]


def test_install_speaks_each_hosts_settings_format():
    gemini = merged(None, target("gemini"))
    assert gemini["hooksConfig"]["enabled"] is True
    assert set(gemini["hooks"]) == {"BeforeTool", "AfterTool", "SessionStart", "AfterAgent"}
    assert gemini["hooks"]["BeforeTool"][0]["hooks"][0]["timeout"] == 30_000  # milliseconds
    codex = merged(None, target("codex"))
    assert set(codex["hooks"]) == {"PreToolUse", "PostToolUse", "SessionStart", "Stop"}
    assert "onFailure" not in json.dumps(codex), "Codex has no such setting"
    cursor = merged(None, target("cursor"))
    assert cursor["version"] == 1
    assert cursor["hooks"]["beforeShellExecution"][0]["failClosed"] is True
    forwarded = merged(None, target("codex", http="http://127.0.0.1:8765"))
    command = forwarded["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    assert command.endswith("hook codex --loop L1 --agent builder --server http://127.0.0.1:8765")


def test_install_names_the_store_in_the_hook_command_but_never_a_password(tmp_path):
    from typer.testing import CliRunner

    from loopwarden.cli.root import app

    settings = merged(None, target(store="postgresql://lw@db.internal/loopwarden"))
    command = settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    assert command.endswith("--home /srv/lw --store postgresql://lw@db.internal/loopwarden")
    for url in ("postgresql://lw:hunter2@db/lw", "postgresql://lw@db/lw?password=hunter2"):
        result = CliRunner().invoke(
            app,
            ["hook", "install", "claude-code", "--loop", "L1", "--agent", "builder",
             "--store", url, "--project", str(tmp_path), "--home", str(tmp_path / "home")],
        )  # fmt: skip
        assert result.exit_code == 2 and "LOOPWARDEN_STORE" in result.output
        assert "hunter2" not in result.output
    assert list(tmp_path.iterdir()) == [], "nothing written, no home made"


# --- a real `loopwarden hook HOST` process per host -----------------------------------------


async def _home_with_turn(store: Store, clock: ManualClock) -> ClaimResult:
    """A loop with the builder's turn claimed now: a real hook process reads the system clock,
    so the store's clock is set to it (a turn claimed at the test clock's epoch would have an
    expired lease, on which no tool runs)."""
    clock.set(datetime.now(UTC))
    await opened(store)
    return await attached_claim(store)


def hook_process(
    home: Path, host: str, event: bytes, *, agent: str = "builder", store: str | None = None
) -> subprocess.CompletedProcess:
    given = ("--store", store, "--in-process") if store else ("--in-process",)
    return subprocess.run(
        [*loopwarden("hook", host, "--loop", LOOP, "--agent", agent, "--home", str(home), *given)],
        input=event,
        capture_output=True,
        env=cli_env(),
        timeout=60,
    )


PRE_SHELL = {  # each host's pre-tool shell event, and how that host reads a deny
    "claude-code": (
        "PreToolUse-bash",
        lambda out: out["hookSpecificOutput"]["permissionDecision"] == "deny",
    ),
    "codex": (
        "PreToolUse-bash",
        lambda out: out["hookSpecificOutput"]["permissionDecision"] == "deny",
    ),
    "gemini": ("BeforeTool-run_shell_command", lambda out: out["decision"] == "deny"),
    "cursor": ("preToolUse-Shell", lambda out: out["permission"] == "deny"),
}


@pytest.mark.parametrize("host", list(PRE_SHELL))
async def test_a_real_hook_process_answers_in_each_hosts_format(home, store, host):
    await opened(store)  # no turn held: the call must be denied
    name, is_deny = PRE_SHELL[host]
    raw = (FIXTURES / host / f"{name}.json").read_bytes()
    done = hook_process(home, host, raw)
    assert done.returncode == 0, done.stderr
    assert is_deny(json.loads(done.stdout)), done.stdout
    assert b"claim a turn first" in done.stdout


@pytest.mark.parametrize("host", list(PRE_SHELL))
async def test_a_real_hook_process_fails_closed(home, store, tmp_path, host):
    await opened(store)
    name, _ = PRE_SHELL[host]
    raw = (FIXTURES / host / f"{name}.json").read_bytes()
    for event, where in ((b"{not json", home), (raw, tmp_path / "no-such-home")):
        done = hook_process(where, host, event)
        blocked = done.returncode == 2 or (done.stdout and "deny" in done.stdout.decode())
        assert blocked, (host, done.returncode, done.stdout, done.stderr)
        assert b"Traceback" not in done.stderr
    assert not (tmp_path / "no-such-home").exists(), "a hook never creates a home"


HEAVY = (  # what the admin CLI, the server and the dashboard load, and a hook must not
    "typer", "click", "rich", "mcp", "httpx", "httpx2", "httpcore", "starlette", "uvicorn",
    "jinja2", "yaml", "opentelemetry", "prometheus_client", "loopwarden.server",
    "loopwarden.dashboard", "loopwarden.cli.root", "loopwarden.cli.common", "loopwarden.clients.render",
    "loopwarden.catalog", "loopwarden.audit",
    "importlib.metadata", "email",  # pydantic's plugin lookup, turned off (cli/entry.py)
)  # fmt: skip


def imported_by(
    args: list[str], stdin: bytes, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`python -X importtime ARGS` as a real process, and every module it imported (the trace
    goes to the process's own stderr, not through `sys.stderr`)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        input=stdin, capture_output=True, env=env, timeout=60,
    )  # fmt: skip
    lines = done.stderr.decode().splitlines()
    names = {line.rpartition("|")[2].strip() for line in lines if line.startswith("import time:")}
    return done, names - {"imported package"}


def heavy(names: set[str]) -> set[str]:
    return {n for n in names for h in HEAVY if n == h or n.startswith(h + ".")}


async def test_a_real_hook_process_decides_without_loading_the_cli_server_or_telemetry(
    home, store, clock
):
    await _home_with_turn(store, clock)
    args = ["-m", "loopwarden", "hook", "claude-code", "--loop", LOOP, "--agent", "builder"]
    done, names = imported_by(
        [*args, "--home", str(home), "--in-process"],
        json.dumps(bash("pytest -q")).encode(),
        cli_env(),
    )
    assert (done.returncode, done.stdout) == (0, b""), done.stderr[-2000:]
    assert (await kinds(store))[-1] == "tool.admitted", "decided, sealed, answered"
    assert {"loopwarden.hosts.hook", "loopwarden.policy.commands.verdicts"} <= names
    assert heavy(names) == set(), "the hook's entry loads only what a pre-tool decision needs"


async def test_codex_never_sees_a_bare_allow(home, store, clock):
    await _home_with_turn(store, clock)
    raw = (FIXTURES / "codex" / "PreToolUse-bash.json").read_bytes()
    done = hook_process(home, "codex", raw)
    assert (done.returncode, done.stdout) == (0, b""), "an allow is silence, never 'allow'"
    session = (FIXTURES / "codex" / "SessionStart-startup.json").read_bytes()
    assert hook_process(home, "codex", session).stdout == b""


def store_arg(backend: str, store_url: str) -> str:
    """The `--store` a host's hook command names: a SQLite URL, or the PostgreSQL one."""
    return f"sqlite:///{store_url}" if backend == "sqlite" else store_url


@pytest.mark.backends
async def test_a_real_hook_process_decides_on_the_store_it_is_given(
    home, store, clock, backend, store_url
):
    await _home_with_turn(store, clock)
    given = store_arg(backend, store_url)
    read = (FIXTURES / "claude-code" / "PreToolUse-read.json").read_bytes()
    allowed = hook_process(home, "claude-code", read, store=given)
    assert (allowed.returncode, allowed.stdout) == (0, b""), allowed.stderr
    push = json.dumps(bash("git push origin main")).encode()
    refused = hook_process(home, "claude-code", push, store=given)
    assert refused.returncode == 0 and denied(json.loads(refused.stdout)), refused.stdout
    assert (await kinds(store))[-2:] == ["tool.admitted", "tool.refused"]
    await judged_clean(store)


@pytest.mark.backends
async def test_a_damaged_store_blocks_every_call(home, store, clock, backend, store_url):
    await _home_with_turn(store, clock)
    if backend == "sqlite":
        conn = sqlite3.connect(home / "loopwarden.db")
        conn.execute("UPDATE loops SET turns = 0")
        conn.commit()
        conn.close()
    else:
        from loopwarden.kernel.sql.postgres import connect  # autocommit: the edit stands

        edit = connect(store_url)
        edit.execute("UPDATE loops SET turns = 0")
        edit.close()
    done = hook_process(
        home,
        "claude-code",
        (FIXTURES / "claude-code" / "PreToolUse-read.json").read_bytes(),
        store=store_arg(backend, store_url),
    )
    assert done.returncode == 2 and b"changed outside loopwarden" in done.stderr
    assert done.stderr.count(b"\n") == 1, "one line: the reason the model and the user see"
