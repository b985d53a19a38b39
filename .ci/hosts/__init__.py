"""Hooks firing inside the real hosts: scripted fakes of each host's model API on loopback, and
the scenarios that drive Claude Code, Gemini CLI and Codex CLI through them (`check.py`)."""
