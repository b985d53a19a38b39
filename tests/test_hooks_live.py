"""A whole host session against a real `loopwarden serve --http` (issue 10).

Claude Code's documented payloads, played in the order a session makes them: SessionStart
through a real `loopwarden hook claude-code` process, every tool event through `POST
/hooks/claude-code` with an observer token, and the agent's own `claim` and `update` over MCP
on the same server. A `git push` through Bash is denied before it runs, an under-reported turn
is refused, an honest one accepted, and `loopwarden verify` judges the journal clean. The HTTP
hook's authentication fails closed.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from conftest import OPERATOR
from support import (
    Served,
    cli,
    cli_env,
    connect_http,
    loopwarden,
    mint_tokens,
    start_server,
    stop_server,
)
from test_hooks import imported_by

from loopwarden.clients.admin import open_store
from loopwarden.clients.agent import ToolCallError
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop

FIXTURES = Path(__file__).parent / "fixtures" / "hooks" / "claude-code"
LOOP = "live"
POLICY = {
    "agents": ["builder"],
    "tools": {
        "allow": ["fs.*", "shell.run"],
        "deny": ["web.*"],
        "commands": {"deny": ["git push*"]},
    },
    "budgets": {"max_turns": 10},
    "stop": {"on_violation": "refuse_turn"},
    "observe": {"mode": "enforce"},
}


def event(name: str, **changes: Any) -> dict[str, Any]:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    data.update(changes)
    return data


def bash(command: str, phase: str = "Pre") -> dict[str, Any]:
    data = event(f"{phase}ToolUse-bash")
    data["tool_input"] = {**data["tool_input"], "command": command}
    return data


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("hooks-live")
    home = root / "home"

    async def setup() -> None:
        async with open_store(home) as store:
            await open_loop(
                store,
                OPERATOR,
                OpenLoopRequest(
                    objective="hooked session",
                    policy=POLICY,
                    loop_id=LOOP,
                    todos=[TodoInput(id=f"t{n}", title=f"todo {n}") for n in range(3)],
                ),
            )

    anyio.run(setup)
    agents = mint_tokens(home, [("builder", "agent")])
    observers = mint_tokens(home, [("builder", "observer")])
    served = start_server(home, root / "logs")
    try:
        yield {
            "home": home,
            "served": served,
            "agent": agents["builder"],
            "observer": observers["builder"],
        }
    finally:
        stop_server(served)


def post(
    served: Served, body: Any, token: str | None, query: str = f"loop={LOOP}"
) -> httpx2.Response:
    url = served.url.removesuffix("/mcp") + f"/hooks/claude-code?{query}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.post(url, json=body, headers=headers, timeout=30)


def denied(response: httpx2.Response) -> str | None:
    assert response.status_code == 200, response.text
    if not response.content:
        return None
    spec = response.json().get("hookSpecificOutput", {})
    return (
        spec.get("permissionDecisionReason") if spec.get("permissionDecision") == "deny" else None
    )


def test_a_host_session_is_governed_end_to_end(live):
    home, served = live["home"], live["served"]
    observer = live["observer"].token
    started = subprocess.run(
        [
            *loopwarden(
                "hook", "claude-code", "--loop", LOOP, "--agent", "builder", "--home", str(home)
            ),
            "--in-process",
        ],
        input=json.dumps(event("SessionStart-startup")).encode(),
        capture_output=True,
        env=cli_env(),
        timeout=60,
    )
    assert (started.returncode, started.stdout) == (0, b""), started.stderr

    assert "claim a turn first" in denied(post(served, event("PreToolUse-read"), observer))
    claim_call = event("PreToolUse-mcp", tool_name="mcp__loopwarden__claim")
    assert denied(post(served, claim_call, observer)) is None

    async def agent_session() -> tuple[Any, Any]:
        async with connect_http(served.url, live["agent"].token) as agent:
            first = await agent.claim(LOOP)
            assert first.granted, first.reasons
            assert denied(post(served, bash("pytest -q"), observer)) is None
            assert post(served, bash("pytest -q", "Post"), observer).status_code == 200
            assert "git push" in denied(post(served, bash("git push origin main"), observer))
            under = await agent.update(
                first.turn_id, first.fence, "completed", "done", "u1",
                evidence=[{"kind": "test", "summary": "green"}],
            )  # fmt: skip
            second = await agent.claim(LOOP)
            assert denied(post(served, bash("pytest -q"), observer)) is None
            honest = await agent.update(
                second.turn_id, second.fence, "completed", "done", "u2",
                tools_used=[{"name": "shell.run", "count": 1}],
                evidence=[{"kind": "test", "summary": "green"}],
            )  # fmt: skip
            return under, honest

    under, honest = anyio.run(agent_session)
    assert not under.accepted and [r.code for r in under.reasons] == ["unreported_tool_use"]
    assert honest.accepted, honest.reasons
    assert denied(post(served, event("Stop-first"), observer)) is None, "nothing left unreported"

    verified = cli("verify", "--json", "--home", str(home), env=cli_env())
    report = json.loads(verified.stdout)
    assert (verified.returncode, report["findings"]) == (0, []), report
    refusals = json.loads(
        cli("receipts", LOOP, "--kind", "tool.refused", "--json", "--home", str(home)).stdout
    )
    reasons = [r["reasons"] for r in refusals["receipts"]]
    assert reasons == [["no_open_turn"], ["command_denied"]]
    shown = cli("loop", "show", LOOP, "--home", str(home), env=cli_env()).stdout
    assert "observed tool use" in shown and "shell.run ×1" in shown


def test_the_http_hook_fails_closed_on_every_bad_credential(live):
    served = live["served"]
    read = event("PreToolUse-read")
    assert "no bearer token" in denied(post(served, read, None))
    assert "observer token" in denied(post(served, read, live["agent"].token))
    assert "not valid" in denied(post(served, read, "lw_" + "x" * 43))
    assert "names no loop" in denied(post(served, read, live["observer"].token, query="x=1"))
    assert "not JSON" in denied(
        httpx2.post(
            served.url.removesuffix("/mcp") + f"/hooks/claude-code?loop={LOOP}",
            content=b"{oops",
            headers={"Authorization": f"Bearer {live['observer'].token}"},
            timeout=30,
        )
    )
    unknown = httpx2.post(
        served.url.removesuffix("/mcp") + "/hooks/nethack?loop=x", json={}, timeout=30
    )
    assert unknown.status_code == 404


def test_an_observer_token_calls_no_tool(live):
    async def try_quota() -> ToolCallError:
        async with connect_http(live["served"].url, live["observer"].token) as observer:
            with pytest.raises(ToolCallError) as refused:
                await observer.quota(LOOP)
            return refused.value

    assert anyio.run(try_quota).code == "forbidden"


def forward(live: dict[str, Any], host: str, name: str, **env: str) -> subprocess.CompletedProcess:
    """`loopwarden hook HOST --server URL`: the standard-library forwarder a command-only host
    runs, posting to the live server."""
    base = live["served"].url.removesuffix("/mcp")
    raw = (FIXTURES.parent / host / f"{name}.json").read_bytes()
    return subprocess.run(
        [*loopwarden("hook", host, "--loop", LOOP, "--agent", "builder", "--server", base)],
        input=raw,
        capture_output=True,
        env=cli_env(**env),
        timeout=60,
    )


@pytest.mark.parametrize(
    ("host", "name", "is_deny"),
    [
        (
            "codex",
            "PreToolUse-read",
            lambda o: o["hookSpecificOutput"]["permissionDecision"] == "deny",
        ),
        ("gemini", "BeforeTool-read_file", lambda o: o["decision"] == "deny"),
        ("cursor", "preToolUse-Read", lambda o: o["permission"] == "deny"),
    ],
)
def test_a_command_only_host_forwards_to_the_server_and_gets_its_decision(
    live, host, name, is_deny
):
    done = forward(live, host, name, LOOPWARDEN_OBSERVER_TOKEN=live["observer"].token)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert is_deny(answer) and "claim a turn first" in json.dumps(answer)


# What the forwarder may import beyond what the interpreter (and `-m`'s runpy) loads anyway.
FORWARDER = {"loopwarden", "loopwarden.clients", "loopwarden.cli", "loopwarden.cli.entry", "loopwarden.hostnames",
             "loopwarden.hosts",
             "loopwarden.clients.hook_forward", "loopwarden.clients.http1", "_socket",
             "loopwarden.clients.hook_process",
             "__future__", "importlib"}  # fmt: skip


def test_the_forwarder_decides_with_nothing_but_the_c_socket_module(live):
    """No pydantic, store, host module, `json`, `http.client`, `socket`, `ssl`, `urllib` or
    `re` of its own: a forwarded decision is an interpreter start and one request."""
    base = live["served"].url.removesuffix("/mcp")
    raw = (FIXTURES.parent / "codex" / "PreToolUse-read.json").read_bytes()
    env = cli_env(LOOPWARDEN_OBSERVER_TOKEN=live["observer"].token)
    args = ["hook", "codex", "--loop", LOOP, "--agent", "builder", "--server", base]
    done, names = imported_by(["-m", "loopwarden", *args], raw, env)
    assert done.returncode == 0 and b"claim a turn first" in done.stdout, done.stderr[-2000:]
    _, startup = imported_by(["-c", "import runpy"], b"", env)
    assert "loopwarden.clients.http1" in names and "site" in startup, "the traces were read"
    assert names - startup <= FORWARDER, names - startup - FORWARDER


def test_the_forwarder_fails_closed_without_a_token_or_a_server(live, tmp_path):
    missing = forward(live, "codex", "PreToolUse-read")
    assert missing.returncode == 2 and b"LOOPWARDEN_OBSERVER_TOKEN" in missing.stderr
    wrong = forward(live, "codex", "PreToolUse-read", LOOPWARDEN_OBSERVER_TOKEN=live["agent"].token)
    assert wrong.returncode == 0 and b"observer token" in wrong.stdout, "the server's deny"
    raw = (FIXTURES.parent / "codex" / "PreToolUse-read.json").read_bytes()
    down = subprocess.run(
        [
            *loopwarden(
                "hook", "codex", "--loop", LOOP, "--agent", "b", "--server", "http://127.0.0.1:9"
            )
        ],
        input=raw,
        capture_output=True,
        env=cli_env(LOOPWARDEN_OBSERVER_TOKEN="lw_x"),
        timeout=60,
    )
    assert down.returncode == 2 and b"cannot be reached" in down.stderr


def test_the_http_hook_takes_no_cross_site_post_even_without_auth(tmp_path):
    """`--no-auth`: the Host/Origin rules of /mcp and JSON-only bodies hold on /hooks too; a
    refused post is answered as a block and seals nothing."""
    home = tmp_path / "home"

    async def setup() -> None:
        async with open_store(home) as store:
            await open_loop(store, OPERATOR, OpenLoopRequest(objective="x", policy=POLICY,
                                                             loop_id=LOOP))  # fmt: skip

    anyio.run(setup)
    served = start_server(home, tmp_path / "logs", "--no-auth", "--agent", "builder")
    try:
        url = served.url.removesuffix("/mcp") + f"/hooks/claude-code?loop={LOOP}"
        body = json.dumps(event("PreToolUse-read")).encode()
        evil = {"Origin": "http://evil.example"}
        mcp = httpx2.post(served.url, content=b"{}", headers={**evil,
                          "Content-Type": "application/json"}, timeout=30)  # fmt: skip
        assert mcp.status_code == 403
        for headers in (
            {**evil, "Content-Type": "text/plain"},
            {**evil, "Content-Type": "application/json"},
            {"Content-Type": "text/plain"},
            {"Content-Type": "application/json", "Host": "evil.example"},
        ):
            refused = httpx2.post(url, content=body, headers=headers, timeout=30)
            assert denied(refused), (headers, refused.text)
        allowed = httpx2.post(url, content=body, headers={"Content-Type": "application/json"},
                              timeout=30)  # fmt: skip
        assert "claim a turn first" in denied(allowed), "the same post, from the host itself"
    finally:
        stop_server(served)
    receipts = json.loads(cli("receipts", LOOP, "--json", "--home", str(home)).stdout)
    assert [r["kind"] for r in receipts["receipts"]] == [
        "loop.opened", "host.attached", "tool.refused",
    ], "only the host's own post was sealed"  # fmt: skip


class _Answering(http.server.BaseHTTPRequestHandler):
    """A server that answers every post with the class's status and headers: not a decision."""

    status, headers = 500, {}

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(self.status)
        for name, value in self.headers_out.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(b"Internal Server Error")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("status", "headers"), [(500, {}), (500, {"Loopwarden-Hook-Answer": "x"}),
                                                 (200, {}), (404, {})])  # fmt: skip
def test_the_forwarder_blocks_a_tool_on_any_answer_that_is_not_a_decision(status, headers):
    handler = type("Handler", (_Answering,), {"status": status, "headers_out": headers})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for host, name, blocked in [
            ("codex", "PreToolUse-read", lambda d: d.returncode == 2 and d.stderr),
            ("gemini", "BeforeTool-read_file",
             lambda d: d.returncode == 2 and json.loads(d.stdout)["decision"] == "deny"),
            ("cursor", "preToolUse-Read", lambda d: json.loads(d.stdout)["permission"] == "deny"),
        ]:  # fmt: skip
            done = subprocess.run(
                loopwarden("hook", host, "--loop", LOOP, "--agent", "builder", "--server", base),
                input=(FIXTURES.parent / host / f"{name}.json").read_bytes(),
                capture_output=True,
                env=cli_env(LOOPWARDEN_OBSERVER_TOKEN="lw_x"),
                timeout=60,
            )
            assert blocked(done), (host, done.returncode, done.stdout, done.stderr)
        after = subprocess.run(
            loopwarden("hook", "codex", "--loop", LOOP, "--agent", "builder", "--server", base),
            input=(FIXTURES.parent / "codex" / "PostToolUse-bash.json").read_bytes(),
            capture_output=True,
            env=cli_env(LOOPWARDEN_OBSERVER_TOKEN="lw_x"),
            timeout=60,
        )
        assert after.returncode == 1, "after a tool ran, a failure is reported, not a block"
    finally:
        server.shutdown()
        server.server_close()


def test_doctor_checks_that_the_server_takes_the_observer_token(live, tmp_path):
    from typer.testing import CliRunner

    from loopwarden.cli.root import app

    base = live["served"].url.removesuffix("/mcp")
    user, project = tmp_path / "user", tmp_path / "project"
    project.mkdir(parents=True)
    env = {"HOME": str(user)}
    installed = CliRunner().invoke(
        app,
        ["hook", "install", "claude-code", "--loop", LOOP, "--agent", "builder", "--http", base,
         "--project", str(project), "--home", str(live["home"])],
        env=env,
    )  # fmt: skip
    assert installed.exit_code == 0, installed.output
    before = cli("receipts", LOOP, "--json", "--home", str(live["home"])).stdout

    def doctor(token: str) -> dict[str, Any]:
        done = CliRunner().invoke(
            app, ["hook", "doctor", "claude-code", "--project", str(project), "--json"],
            env={**env, "LOOPWARDEN_OBSERVER_TOKEN": token},
        )  # fmt: skip
        report = json.loads(done.output)
        assert (done.exit_code == 0) == report["ok"]
        return {c["name"]: c["ok"] for c in report["checks"]}

    assert doctor(live["observer"].token)["token"] is True
    assert doctor(live["agent"].token)["token"] is False, "an agent token is no observer token"
    assert cli("receipts", LOOP, "--json", "--home", str(live["home"])).stdout == before
