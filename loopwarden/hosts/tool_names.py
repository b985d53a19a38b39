"""Host tool names → policy tool names, and the classes of host tools a decision treats apart.

A policy speaks of tools by dotted names (`fs.write`, `shell.run`); an agent host names its
own (`Write`, `Bash`, `run_shell_command`). Each host module (`loopwarden/hosts`) documents its
default table, overridable in the policy (`[observe.names.<host>]`). MCP tools become
`mcp.<server>.<tool>`, and a host tool no table names becomes `host.<Name>`, so the default
deny covers tools that did not exist when the policy was written. Names are made safe for the
policy grammar (`patterns.py`): any character outside `[A-Za-z0-9_-]` in a segment becomes `_`.

A default table only grows: the judge maps every recorded host tool again, so a name that
changed its policy name would make earlier receipts disagree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from loopwarden import hostnames, hosts
from loopwarden.policy.patterns import MAX_NAME_LENGTH, SHELL

__all__ = ["SHELL", "is_internal", "is_own_tool", "mcp_parts", "policy_tool"]

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
    named = None if host == hostnames.GATEWAY else hosts.get(host).names.get(host_tool)
    if named is not None:
        return named
    parts = mcp_parts(host_tool)
    if parts is not None:
        name = f"mcp.{_segment(parts[0])}.{_segment(parts[1])}"
    else:
        name = f"host.{_segment(host_tool)}"
    return name[:MAX_NAME_LENGTH]


def is_own_tool(host_tool: str, servers: Iterable[str], tools: frozenset[str]) -> bool:
    """Whether `host_tool` is exactly one of loopwarden's own MCP tools (`tools`) under one of
    the names loopwarden's server has in the host's config (`servers`): `mcp__<server>__<tool>`
    and nothing looser (another tool of that server, or a server whose name only starts so,
    is a tool like any other)."""
    for server in servers:
        prefix = f"mcp__{server}__"
        if host_tool.startswith(prefix) and host_tool[len(prefix) :] in tools:
            return True
    return False


def is_internal(host: str, host_tool: str) -> bool:
    """Whether `host_tool` is one of `host`'s internal tools: ones that act on nothing outside
    the host (its todo list, plan mode, loading deferred tools). Named by the host's own tool
    name, whatever the policy renames it to."""
    return host != hostnames.GATEWAY and host_tool in hosts.get(host).internal
