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
