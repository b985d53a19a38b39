"""Claude Code: hooks in `.claude/settings.json`, `command` and `http` types (the sources are
listed in docs/hooks.md and tests/fixtures/hooks/claude-code/SOURCES.md).

Events: PreToolUse, PostToolUse, PostToolUseFailure, SessionStart, Stop, SubagentStop. A
pre-tool deny is exit 0 with `hookSpecificOutput.permissionDecision = "deny"` and its reason
(shown to the model); an allow prints nothing (an explicit "allow" would also skip the user's
own permission prompts, which is not ours to do). A stop is blocked with `{"decision":
"block", "reason": …}`, never again once `stop_hook_active`. A failure is exit 2 with the reason
on stderr, which blocks a pre-tool call; the installer also sets `onFailure: "block"`, so a
crash or a timeout blocks too. Events from a subagent carry `agent_id` and `agent_type`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from loopwarden.hosts.host import (
    Files,
    Host,
    McpFile,
    On,
    Phase,
    Place,
    Reply,
    Trust,
    digest,
    duration_of,
    json_text,
)
from loopwarden.policy.patterns import SHELL


def deny(reason: str) -> dict[str, Any]:
    """The PreToolUse deny document (Claude Code's, and Codex's)."""
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": f"loopwarden: {reason}",
        }
    }


class ClaudeCode(Host):
    name = "claude-code"
    title = "Claude Code"
    events: ClassVar[Mapping[str, On]] = {
        "SessionStart": On("session"),
        "PreToolUse": On("pre", "*", extra={"onFailure": "block"}),
        "PostToolUse": On("post", "*"),
        "PostToolUseFailure": On("post", "*"),
        "Stop": On("stop", timeout=60),
        "SubagentStop": On("stop", installed=False),
    }
    names: ClassVar[Mapping[str, str]] = {
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
    }
    shell: ClassVar[Mapping[str, str]] = {"Bash": "command", "PowerShell": "command"}
    dialects: ClassVar[Mapping[str, str]] = {"PowerShell": "powershell"}
    internal = frozenset(  # the tools reference lists them; they touch nothing outside the host
        {"ToolSearch", "TodoWrite", "TaskCreate", "TaskGet", "TaskList", "TaskUpdate",
         "EnterPlanMode", "ExitPlanMode", "AskUserQuestion"}
    )  # fmt: skip
    settings_file = ".claude/settings.json"
    mcp_files = (
        McpFile("project", ".mcp.json"),
        McpFile("user", ".claude.json", per_project=True),
    )
    http_hooks = True
    ids = ("tool_use_id", "agent_id", "agent_type")  # a subagent's call names the subagent

    def outcome(self, event: dict[str, Any]) -> dict[str, Any]:
        response = event.get("tool_response", event.get("error"))
        errored = event.get("hook_event_name") == "PostToolUseFailure" or (
            isinstance(response, dict)
            and (response.get("is_error") is True or response.get("success") is False)
        )
        return {
            "response_digest": digest(response),
            "errored": errored,
            "duration_ms": duration_of(event, "duration_ms"),
        }

    def reply(self, phase: Phase, block: bool, message: str) -> Reply:
        if phase == "pre" and block:
            return Reply(json_text(deny(message)))
        if phase == "stop" and block:
            return Reply(json_text({"decision": "block", "reason": f"loopwarden: {message}"}))
        return Reply()

    def blocking_failure(self, message: str) -> Reply:
        """Exit 2, with the reason on stderr."""
        return Reply(stderr=f"loopwarden: {message}\n", exit_code=2)

    def http(self, reply: Reply) -> tuple[int, str]:
        """The same reply for an `http` hook, which has no exit code: Claude Code reads a 2xx
        body as it reads a command's stdout, and takes any other status as a non-blocking
        error, so a blocking failure is answered 200 with the deny document."""
        if reply.exit_code == 2:
            reason = reply.stderr.strip().removeprefix("loopwarden: ")
            return 200, json_text(deny(reason))
        if reply.exit_code:
            return 500, reply.stderr
        return 200, reply.stdout

    def trust(self, place: Place, files: Files) -> Trust:
        """Claude Code asks to trust a folder the first time an interactive session opens it
        (and records the answer in `~/.claude.json`); `claude -p` does not ask."""
        if place.scope == "user":
            return Trust(True, "user settings apply in every folder")
        text = files(place.user_home / ".claude.json")
        try:
            projects = json.loads(text).get("projects", {}) if text else {}
            accepted = projects.get(str(place.project), {}).get("hasTrustDialogAccepted")
        except (ValueError, AttributeError):
            accepted = None
        if accepted is True:
            return Trust(True, f"{place.project} is trusted (~/.claude.json)")
        return Trust(
            None,
            f"no trust answer recorded for {place.project}: an interactive session asks once",
            "accept the trust prompt when Claude Code first opens the project (claude -p "
            "does not ask)",
        )


HOST = ClaudeCode()
