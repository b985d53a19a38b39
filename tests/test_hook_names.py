"""loopwarden's own MCP server under any name: `hook install` and `hook doctor` read each host's
MCP configuration for the names that run `loopwarden serve` for this home, and a refusal of one
of loopwarden's own tools under a name the hooks do not know says so, instead of telling the
model to call the tool it was just refused."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from conftest import BUILDER, OPERATOR
from support import cli, make_policy
from test_hooks import fixture

from loopwarden import hosts
from loopwarden.hosts.handle import handle
from loopwarden.hosts.host import Place
from loopwarden.hosts.servers import loopwarden_servers, runs_loopwarden
from loopwarden.loops.lifecycle import open_loop
from loopwarden.turns.claim import claim


def _files(root: Path):
    def read(path: Path) -> str | None:
        return path.read_text() if path.is_file() else None

    return read


def _write(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value)


@pytest.mark.parametrize(
    "entry",
    [
        {"command": "loopwarden", "args": ["serve", "--agent", "builder"]},
        {"command": "/opt/venv/bin/loopwarden", "args": ["serve"]},
        {"command": "python3", "args": ["-m", "loopwarden", "serve", "--agent", "b"]},
        {"command": "uvx", "args": ["loopwarden", "serve"]},
    ],
)
def test_an_entry_that_starts_loopwarden_serve_is_recognised(entry):
    assert runs_loopwarden(entry)


@pytest.mark.parametrize(
    "entry",
    [
        {"command": "loopwarden", "args": ["verify"]},
        {"command": "npx", "args": ["@modelcontextprotocol/server-memory"]},
        {"url": "http://127.0.0.1:8787/mcp"},
        {"command": ["loopwarden"], "args": ["serve"]},
    ],
)
def test_an_entry_that_does_not_is_not(entry):
    assert not runs_loopwarden(entry)


def test_every_hosts_configuration_is_read_for_loopwardens_names(tmp_path):
    project, user, home = tmp_path / "p", tmp_path / "u", tmp_path / "home"
    place = Place("project", project, user)
    serve = {"command": "loopwarden", "args": ["serve", "--home", str(home)]}
    elsewhere = {"command": "loopwarden", "args": ["serve", "--home", str(tmp_path / "other")]}
    _write(project / ".mcp.json", json.dumps({"mcpServers": {"lw": serve, "x": elsewhere}}))
    _write(user / ".claude.json", json.dumps({"projects": {str(project): {"mcpServers": {
        "gov": {"command": "loopwarden", "args": ["serve"]}}}}}))  # fmt: skip
    _write(user / ".codex/config.toml",
           f'[mcp_servers.warden]\ncommand = "loopwarden"\nargs = ["serve", "--home", "{home}"]\n')  # fmt: skip
    _write(project / ".gemini/settings.json", json.dumps({"mcpServers": {"lwg": serve}}))
    _write(user / ".cursor/mcp.json", "{not json")  # what the host cannot read names nothing
    found = {
        name: [f.name for f in loopwarden_servers(hosts.get(name).mcp_files, place, _files(tmp_path), home)]
        for name in hosts.NAMES
    }  # fmt: skip
    assert found == {"claude-code": ["lw", "gov"], "codex": ["warden"], "gemini": ["lwg"],
                     "cursor": []}  # fmt: skip


def test_hook_install_takes_the_name_the_host_runs_loopwarden_under_and_doctor_checks_it(
    tmp_path,
):
    home, project = tmp_path / "home", tmp_path / "project"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(make_policy(observe={"mode": "enforce"})))
    assert cli("loop", "open", "--policy", str(policy), "--objective", "o", "--todo", "a",
               "--id", "hx4", "--home", str(home)).returncode == 0  # fmt: skip
    _write(project / ".mcp.json", json.dumps({"mcpServers": {"lw": {
        "command": "loopwarden", "args": ["serve", "--agent", "builder", "--home", str(home)]}}}))  # fmt: skip
    done = cli("hook", "install", "claude-code", "--loop", "hx4", "--agent", "builder",
               "--home", str(home), cwd=project)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "server name(s) lw" in " ".join(done.stderr.split())
    settings = json.loads((project / ".claude/settings.json").read_text())
    command = settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    assert shlex.split(command)[-2:] == ["--server-name", "lw"]
    doctor = cli("hook", "doctor", "claude-code", "--json", cwd=project)
    names = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "names")
    assert names["ok"] is True

    # The user renames the server; the hooks still know the old name only.
    _write(project / ".mcp.json", json.dumps({"mcpServers": {"gov": {
        "command": "loopwarden", "args": ["serve", "--agent", "builder", "--home", str(home)]}}}))  # fmt: skip
    doctor = cli("hook", "doctor", "claude-code", "--json", cwd=project)
    names = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "names")
    assert doctor.returncode == 1 and names["ok"] is False and "--server-name gov" in names["fix"]


@pytest.mark.anyio
async def test_a_refused_own_tool_under_an_unknown_name_says_so_and_not_call_claim(store):
    policy = make_policy(observe={"mode": "enforce"}, tools={"allow": ["fs.*"]})
    await open_loop(store, OPERATOR, {"objective": "o", "policy": policy, "loop_id": "L1",
                                      "todos": [{"title": "a"}]})  # fmt: skip
    event = fixture("claude-code", "PreToolUse-mcp", tool_name="mcp__lw__claim", tool_input={})
    reply = await handle(store, "claude-code", json.dumps(event).encode(), loop_id="L1",
                         agent="builder", servers=["loopwarden"])  # fmt: skip
    said = json.loads(reply.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    assert "--server-name lw" in said and "call loopwarden's claim tool" not in said
    # Under the name the hooks know, the same tool passes unrecorded.
    event = fixture("claude-code", "PreToolUse-mcp", tool_name="mcp__loopwarden__claim")
    reply = await handle(store, "claude-code", json.dumps(event).encode(), loop_id="L1",
                         agent="builder", servers=["loopwarden"])  # fmt: skip
    assert reply.exit_code == 0 and "deny" not in reply.stdout
    assert (await claim(store, BUILDER, {"loop_id": "L1"})).granted
