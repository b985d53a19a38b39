"""Command rules through every host's shell tools, on both hook paths (issue 21).

Each evasion class is denied for Claude Code (`Bash`, and `PowerShell` lines), Codex (`Bash`,
`exec_command {cmd}`, `shell` with an argv), Gemini CLI (`run_shell_command`) and Cursor
(`beforeShellExecution`, `preToolUse` Shell): in process, through a real `loopwarden hook HOST`
process, and through `POST /hooks/{host}` on a real server. A refused line that carries a secret
leaves no trace of it in the answer, the server's log, or any byte of the database (its WAL
included), and the journal is judged clean.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from conftest import BUILDER, OPERATOR
from corpora import load
from support import cli, cli_env, db_bytes, loopwarden, mint_tokens, start_server, stop_server

from loopwarden.audit.database import audit
from loopwarden.clients.admin import open_store
from loopwarden.hosts.handle import handle
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.turns.claim import ClaimRequest, claim

FIXTURES = Path(__file__).parent / "fixtures" / "hooks"
LOOP = "cmd"
POLICY = {
    "agents": ["builder"],
    "tools": {"allow": ["fs.*", "shell.run"], "commands": {"deny": ["git push", "rm -r -f"]}},
    "budgets": {"max_turns": 10},
    "claims": {"lease_seconds": 86400},
    "stop": {"on_violation": "refuse_turn"},
    "observe": {"mode": "enforce"},
}
SECRET = "ghp_" + "S3cr3t" * 6
SECRET_LINE = f"git push https://ci:{SECRET}@github.com/acme/api.git HEAD:main"


def _first_of_each_class() -> list[str]:
    seen: dict[str, str] = {}
    for entry in load("evasions.txt"):
        seen.setdefault(entry.group, entry.line)
    return list(seen.values())


LINES = _first_of_each_class()
SHAPES = {  # host → (event shapes: fixture, how the line goes in), how the host reads a deny
    "claude-code": ["PreToolUse-bash"],
    "codex": ["PreToolUse-bash", "exec_command", "shell"],
    "gemini": ["BeforeTool-run_shell_command"],
    "cursor": ["beforeShellExecution", "preToolUse-Shell"],
}


def event(host: str, shape: str, line: str) -> dict[str, Any]:
    """`host`'s pre-tool shell event (the documented fixture) carrying `line`."""
    name = "PreToolUse-bash" if shape in ("exec_command", "shell") else shape
    data = json.loads((FIXTURES / host / f"{name}.json").read_text())
    if shape == "beforeShellExecution":
        data["command"] = line
    elif shape == "exec_command":
        data["tool_name"], data["tool_input"] = "exec_command", {"cmd": line}
    elif shape == "shell":
        data["tool_name"], data["tool_input"] = "shell", {"command": ["bash", "-lc", line]}
    else:
        data["tool_input"] = {**data.get("tool_input", {}), "command": line}
    return data


def is_deny(host: str, out: dict[str, Any]) -> bool:
    if host in ("claude-code", "codex"):
        return out.get("hookSpecificOutput", {}).get("permissionDecision") == "deny"
    if host == "gemini":
        return out.get("decision") == "deny"
    return out.get("permission") == "deny"


CASES = [(host, shape) for host, shapes in SHAPES.items() for shape in shapes]


async def _session(store: Any) -> None:
    await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            objective="commands", policy=POLICY, loop_id=LOOP,
            todos=[TodoInput(id="t", title="work")],
        ),
    )  # fmt: skip
    start = json.dumps(
        json.loads((FIXTURES / "claude-code" / "SessionStart-startup.json").read_text())
    )
    await handle(store, "claude-code", start.encode(), loop_id=LOOP, agent="builder", servers=[])
    granted = await claim(store, BUILDER, ClaimRequest(loop_id=LOOP))
    assert granted.granted, granted.reasons


pytestmark = pytest.mark.anyio


async def _answer(store: Any, host: str, data: dict[str, Any]) -> dict[str, Any]:
    raw = json.dumps(data).encode()
    reply = await handle(store, host, raw, loop_id=LOOP, agent="builder", servers=["loopwarden"])
    return json.loads(reply.stdout) if reply.stdout else {}


@pytest.mark.parametrize(("host", "shape"), CASES)
async def test_every_evasion_class_is_denied_in_process_for_every_shell_tool(store, host, shape):
    await _session(store)
    for line in LINES:
        out = await _answer(store, host, event(host, shape, line))
        assert is_deny(host, out), (host, shape, line, out)
    allowed = await _answer(store, host, event(host, shape, "git status && pytest -q 2>&1 | tail"))
    assert allowed == {}, "an ordinary line runs"
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert report.findings == [], [f.as_dict() for f in report.findings]


async def test_claude_codes_powershell_tool_is_read_as_powershell(store):
    await _session(store)
    for line, refused in [
        ("Remove-Item -Recurse -Force build", True),
        ('iex "git push"', True),
        ("& $tool push", True),
        ("Get-ChildItem -Recurse | Select-Object Name", False),
    ]:
        data = event("claude-code", "PreToolUse-bash", line)
        data["tool_name"] = "PowerShell"
        assert is_deny("claude-code", await _answer(store, "claude-code", data)) is refused, line


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("command-hooks")
    home = root / "home"

    async def setup() -> None:
        async with open_store(home) as store:
            await _session(store)

    anyio.run(setup)
    observer = mint_tokens(home, [("builder", "observer")])["builder"].token
    served = start_server(home, root / "logs")
    try:
        yield {"home": home, "served": served, "observer": observer}
    finally:
        stop_server(served)


def _post(live: dict[str, Any], host: str, data: dict[str, Any]) -> dict[str, Any]:
    url = live["served"].url.removesuffix("/mcp") + f"/hooks/{host}?loop={LOOP}"
    headers = {"Authorization": f"Bearer {live['observer']}"}
    response = httpx2.post(url, json=data, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json() if response.content else {}


@pytest.mark.parametrize(("host", "shape"), CASES)
def test_every_evasion_class_is_denied_through_the_http_hook(live, host, shape):
    for line in LINES:
        assert is_deny(host, _post(live, host, event(host, shape, line))), (host, shape, line)


def _hook_process(home: Path, host: str, data: dict[str, Any]) -> subprocess.CompletedProcess:
    return subprocess.run(
        loopwarden("hook", host, "--loop", LOOP, "--agent", "builder", "--home", str(home),
                   "--in-process"),
        input=json.dumps(data).encode(), capture_output=True, env=cli_env(), timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("host", list(SHAPES))
def test_a_real_hook_process_denies_evasions_for_every_host(live, host):
    # git's global options, or a carrier (xargs); every class in the slow variant below
    for line in (LINES[1] if host in ("claude-code", "gemini") else LINES[6],):
        done = _hook_process(live["home"], host, event(host, SHAPES[host][-1], line))
        assert done.returncode == 0 and is_deny(host, json.loads(done.stdout)), done


@pytest.mark.slow
@pytest.mark.parametrize("host", list(SHAPES))
def test_a_real_hook_process_denies_every_evasion_class(live, host):
    for line in LINES:
        done = _hook_process(live["home"], host, event(host, SHAPES[host][0], line))
        assert done.returncode == 0 and is_deny(host, json.loads(done.stdout)), (line, done)


def test_a_refused_secret_bearing_line_leaves_no_trace_anywhere(live):
    for host in SHAPES:
        data = event(host, SHAPES[host][0], SECRET_LINE)
        done = _hook_process(live["home"], host, copy.deepcopy(data))
        assert is_deny(host, json.loads(done.stdout)), done
        assert SECRET.encode() not in done.stdout + done.stderr
        answer = _post(live, host, data)
        assert is_deny(host, answer) and SECRET not in json.dumps(answer)
        assert "git push" in json.dumps(answer), "the reason names what the rule matched"
    assert SECRET.encode() not in db_bytes(live["home"]), "no stored byte holds the secret"
    assert SECRET not in live["served"].stderr()
    shown = cli("receipts", LOOP, "--json", "--home", str(live["home"]), env=cli_env()).stdout
    assert SECRET not in shown and "command_denied" in shown
    verified = cli("verify", "--json", "--home", str(live["home"]), env=cli_env())
    assert verified.returncode == 0, verified.stdout
