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
    SHELL,
    Event,
    Hook,
    Host,
    MalformedEvent,
    Phase,
    Reply,
    digest,
    field_of,
    hook_entry_is_ours,
    json_text,
    optional_id,
    session_of,
)


class Cursor(Host):
    name = "cursor"
    title = "Cursor"
    events: ClassVar[Mapping[str, Phase]] = {
        "sessionStart": "session",
        "preToolUse": "pre",
        "beforeShellExecution": "pre",
        "beforeMCPExecution": "pre",
        "beforeReadFile": "pre",
        "postToolUse": "post",
        "stop": "stop",
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
            return Event(
                "pre", session, host_tool=host_tool, input_digest=digest(event.get("tool_input"))
            )
        if name == "beforeReadFile":
            path = event.get("file_path")
            return Event("pre", session, host_tool="Read", input_digest=digest({"file_path": path}))
        if name not in ("preToolUse", "postToolUse"):
            raise MalformedEvent(f"loopwarden does not handle {name!r} events")
        common = {
            **self.tool_fields(event, session, field_of(event, "tool_name", str)),
            "tool_use_id": optional_id(event, "tool_use_id"),
        }
        if name == "preToolUse":
            return Event("pre", **common)
        duration = event.get("duration")
        return Event(
            "post",
            **common,
            response_digest=digest(event.get("tool_output")),
            duration_ms=float(duration) if isinstance(duration, int | float) else None,
        )

    def reply(self, phase: Phase, block: bool, message: str) -> Reply:
        text = f"loopwarden: {message}"
        if phase == "pre" and block:
            return Reply(json_text({"permission": "deny", "user_message": text,
                                    "agent_message": text}))  # fmt: skip
        if phase == "stop" and block:
            return Reply(json_text({"followup_message": text}))
        return Reply()

    def failure(self, phase: Phase | None, message: str) -> Reply:
        if phase in (None, "pre"):  # the documented deny: exit 0 with the deny document
            return Reply(self.reply("pre", True, message).stdout, f"loopwarden: {message}\n")
        return Reply(stderr=f"loopwarden: {message}\n", exit_code=1)

    def hooks(self, hook: Hook) -> dict[str, Any]:
        """Decisions come from the before* events (which name the command, the MCP server and
        the file), the rest of the tools from preToolUse; none is decided twice."""

        def entry(**extra: Any) -> dict[str, Any]:
            return {"command": hook.command, "timeout": 30, **extra}

        closed = {"failClosed": True}
        return {
            "beforeShellExecution": entry(**closed),
            "beforeMCPExecution": entry(**closed),
            "beforeReadFile": entry(**closed),
            "preToolUse": entry(
                matcher="^(Write|Delete|Grep|Fetch|WebSearch|Task|List)$", **closed
            ),
            "postToolUse": entry(),
            "sessionStart": entry(),
            "stop": entry(loop_limit=1),
        }

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
