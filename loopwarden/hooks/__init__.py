"""Agent host hook protocols (Claude Code, Codex CLI, Gemini CLI, Cursor): each host's event in,
the `hook` operation run, each host's answer out (docs/hooks.md)."""
