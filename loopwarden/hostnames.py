"""The agent hosts loopwarden's hooks speak with, by name: a closed set every layer may name.

The policy validates `[observe.names.<host>]` against it, receipts carry one of these names,
and the `loopwarden hook HOST` entry point dispatches on it without importing anything. Each
name is one module of `loopwarden/hosts/` (`claude-code` is `hosts/claude_code.py`), which
declares that host; `tests/test_hosts.py` holds the two together.
"""

NAMES: tuple[str, ...] = (
    "claude-code",
    "codex",
    "gemini",
    "cursor",
)

GATEWAY = "mcp-gateway"
"""Not a host: the name loopwarden's MCP gateway (`loopwarden/mcp_gateway`) gives itself in the
tool receipts it seals, so a receipt says the call came through the gateway. It has no hooks and
no module of `loopwarden/hosts/`; its tool names are `mcp__<server>__<tool>`, read by the
generic MCP rule (`mcp.<server>.<tool>`), with no table and no internal tools."""

RECORDED: tuple[str, ...] = (*NAMES, GATEWAY)
"""Every name a tool receipt's `host` may hold: the hook hosts, and the MCP gateway."""
