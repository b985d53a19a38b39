"""Cursor: `.cursor/hooks.json` (version 1): preToolUse, postToolUse, beforeShellExecution,
beforeMCPExecution, beforeReadFile, sessionStart, stop. Built from the hook code of the
`@cursor/sdk` package (tests/fixtures/hooks/cursor/SOURCES.md); the editor's own behaviour is not
verified (docs/hooks.md).

Deny: `{"permission": "deny", "user_message": …, "agent_message": …}`. Stop: a
`followup_message`, only on the first stop of a turn (`loop_count` 0). A failure before a tool
runs is the deny document (the installer also sets `failClosed: true`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from loopwarden.hosts.host import (
    MAX_ID,
    Event,
    Hook,
    Host,
    MalformedEvent,
    McpFile,
    On,
    Phase,
    Reply,
    digest,
    duration_of,
    field_of,
    hook_entry_is_ours,
    json_text,
    session_of,
)
from loopwarden.policy.patterns import SHELL

CLOSED = {"failClosed": True}  # a hook that fails (or times out) blocks the tool


class Cursor(Host):
    name = "cursor"
    title = "Cursor"
    # Each tool is decided once: by the before* event that names its command, MCP server or file,
    # the rest by preToolUse.
    events: ClassVar[Mapping[str, On]] = {
        "sessionStart": On("session"),
        "preToolUse": On("pre", "^(Write|Delete|Grep|Fetch|WebSearch|Task|List)$", extra=CLOSED),
        "beforeShellExecution": On("pre", extra=CLOSED),
        "beforeMCPExecution": On("pre", extra=CLOSED),
        "beforeReadFile": On("pre", extra=CLOSED),
        "postToolUse": On("post"),
        "stop": On("stop", extra={"loop_limit": 1}),
    }
    names: ClassVar[Mapping[str, str]] = {
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
    }
    shell: ClassVar[Mapping[str, str]] = {
        "Shell": "command"
    }  # and beforeShellExecution's own `command`
    settings_file = ".cursor/hooks.json"
    mcp_files = (
        McpFile("project", ".cursor/mcp.json"),
        McpFile("user", ".cursor/mcp.json"),
    )

    def read(self, event: dict[str, Any]) -> Event:
        name = field_of(event, "hook_event_name", str)
        session = (str(event.get("conversation_id") or "") or session_of(event))[:MAX_ID]
        if name == "sessionStart":
            return Event("session", session)
        if name == "stop":
            return Event("stop", session, stop_active=bool(event.get("loop_count")))
        if name == "beforeShellExecution":
            command = field_of(event, "command", str)
            return Event(
                "pre", session, host_tool="Shell", input_digest=digest({"command": command}),
                command=command,
            )  # fmt: skip
        if name == "beforeMCPExecution":
            server = field_of(event, "mcp_server_name", str) if "mcp_server_name" in event else ""
            tool = field_of(event, "tool_name", str)
            host_tool = f"mcp__{server}__{tool}" if server else f"MCP:{tool}"
            tool_input = event.get("tool_input")
            arguments = tool_input if isinstance(tool_input, dict) else None
            return Event(
                "pre", session, host_tool=host_tool, input_digest=digest(tool_input),
                arguments=arguments,
            )  # fmt: skip
        if name == "beforeReadFile":
            path = event.get("file_path")
            return Event("pre", session, host_tool="Read", input_digest=digest({"file_path": path}))
        if name not in ("preToolUse", "postToolUse"):
            raise MalformedEvent(f"loopwarden does not handle {name!r} events")
        return self.tool_event(event, self.events[name].phase, session)

    def outcome(self, event: dict[str, Any]) -> dict[str, Any]:
        return {
            "response_digest": digest(event.get("tool_output")),
            "duration_ms": duration_of(event, "duration"),
        }

    def reply(self, phase: Phase, block: bool, message: str) -> Reply:
        text = f"loopwarden: {message}"
        if phase == "pre" and block:
            return Reply(json_text({"permission": "deny", "user_message": text,
                                    "agent_message": text}))  # fmt: skip
        if phase == "stop" and block:
            return Reply(json_text({"followup_message": text}))
        return Reply()

    def blocking_failure(self, message: str) -> Reply:
        """The documented deny: exit 0 with the deny document."""
        return Reply(self.reply("pre", True, message).stdout, f"loopwarden: {message}\n")

    def group(self, hook: Hook, name: str, on: On) -> dict[str, Any]:
        """Cursor lists hook entries per event directly (no matcher groups)."""
        matcher = {"matcher": on.matcher} if on.matcher else {}
        return {"command": hook.command, "timeout": on.timeout, **matcher, **on.extra}

    def install(self, settings: dict[str, Any], hook: Hook) -> dict[str, Any]:
        """Cursor lists hook entries per event directly (no matcher groups)."""
        hooks = settings.setdefault("hooks", {})
        for event, entry in self.hooks(hook).items():
            existing = hooks.get(event)
            kept = [
                h
                for h in (existing if isinstance(existing, list) else [])
                if not hook_entry_is_ours(h, self.name)
            ]
            hooks[event] = [*kept, entry]
        settings.setdefault("version", 1)
        return settings


HOST = Cursor()
