"""loopwarden: an MCP server that governs long-running AI agent loops with signed receipts."""

__version__ = "0.2.0"  # the one place: pyproject.toml reads it, CHANGELOG.md dates it
