"""Host tool names → policy tool names: one documented default table per host, overridable in
the policy (`[observe.names.<host>]`).

A policy speaks of tools by dotted names (`fs.write`, `shell.run`); an agent host names its
own (`Write`, `Bash`, `run_shell_command`). MCP tools become `mcp.<server>.<tool>`, and a host
tool no table names becomes `host.<Name>`, so the default deny covers tools that did not exist
when the policy was written. Names are made safe for the policy grammar (`patterns.py`): any
character outside `[A-Za-z0-9_-]` in a segment becomes `_`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from loopwarden.policy.patterns import MAX_NAME_LENGTH

HOSTS: tuple[str, ...] = ("claude-code", "codex", "gemini", "cursor")
SHELL = "shell.run"

DEFAULT_NAMES: dict[str, dict[str, str]] = {
    "claude-code": {
        "Read": "fs.read",
        "Write": "fs.write",
        "Edit": "fs.write",
        "MultiEdit": "fs.write",
        "NotebookEdit": "fs.write",
        "Glob": "fs.search",
        "Grep": "fs.search",
        "LS": "fs.search",
        "WebFetch": "web.fetch",
        "WebSearch": "web.search",
        "Task": "agent.spawn",
        "Agent": "agent.spawn",
        "Bash": SHELL,
        "PowerShell": SHELL,
        "BashOutput": "shell.output",
        "KillShell": "shell.kill",
        "TodoWrite": "host.todo",
        "ExitPlanMode": "host.plan",
    },
    "codex": {
        "Bash": SHELL,  # Codex reports every shell tool (and file reads and searches) as Bash
        "apply_patch": "fs.write",
        "spawn_agent": "agent.spawn",
        "web_search": "web.search",
        "view_image": "fs.read",
        "update_plan": "host.plan",
    },
    "gemini": {
        "run_shell_command": SHELL,
        "read_file": "fs.read",
        "read_many_files": "fs.read",
        "list_directory": "fs.read",
        "write_file": "fs.write",
        "replace": "fs.write",
        "glob": "fs.search",
        "grep_search": "fs.search",
        "search_file_content": "fs.search",
        "web_fetch": "web.fetch",
        "google_web_search": "web.search",
        "invoke_agent": "agent.spawn",
        "save_memory": "host.memory",
        "write_todos": "host.todo",
    },
    "cursor": {
        "Shell": SHELL,
        "WriteShellStdin": SHELL,
        "Read": "fs.read",
        "List": "fs.read",
        "ReadLints": "fs.read",
        "Write": "fs.write",
        "Delete": "fs.write",
        "Grep": "fs.search",
        "Fetch": "web.fetch",
        "WebSearch": "web.search",
        "Task": "agent.spawn",
    },
}
"""The defaults, documented in docs/hooks.md (keep the two in step)."""

_MCP = re.compile(r"^mcp__(?P<server>[^_].*?)__(?P<tool>.+)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _segment(text: str) -> str:
    return _UNSAFE.sub("_", text) or "_"


def mcp_parts(host_tool: str) -> tuple[str, str] | None:
    """(server, tool) of an MCP tool as hosts name them (`mcp__<server>__<tool>`), else None."""
    match = _MCP.match(host_tool)
    return (match["server"], match["tool"]) if match else None


def policy_tool(host: str, host_tool: str, overrides: Mapping[str, str] | None = None) -> str:
    """The policy name of `host_tool` as `host` names it: the policy's override, else the
    host's default table, else `mcp.<server>.<tool>` or `host.<Name>`."""
    if overrides and host_tool in overrides:
        return overrides[host_tool]
    named = DEFAULT_NAMES.get(host, {}).get(host_tool)
    if named is not None:
        return named
    parts = mcp_parts(host_tool)
    if parts is not None:
        name = f"mcp.{_segment(parts[0])}.{_segment(parts[1])}"
    else:
        name = f"host.{_segment(host_tool)}"
    return name[:MAX_NAME_LENGTH]


def is_own_tool(host_tool: str, servers: frozenset[str]) -> bool:
    """Whether `host_tool` is one of loopwarden's own MCP tools (the agent must always be able
    to claim and report), given the names loopwarden's server has in the host's config."""
    parts = mcp_parts(host_tool)
    return parts is not None and parts[0] in servers
