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
    SHELL,
    Event,
    Files,
    Hook,
    Host,
    Phase,
    Place,
    Reply,
    Trust,
    digest,
    field_of,
    json_text,
    optional_id,
)


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
    events: ClassVar[Mapping[str, Phase]] = {
        "SessionStart": "session",
        "PreToolUse": "pre",
        "PostToolUse": "post",
        "PostToolUseFailure": "post",
        "Stop": "stop",
        "SubagentStop": "stop",
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
    http_hooks = True
    subagents = True

    def read(self, event: dict[str, Any]) -> Event:
        phase, session, whole = self.opening(event)
        if whole is not None:
            return whole
        common = self.tool_call(event, session)
        if phase == "pre":
            return Event("pre", **common)
        response = event.get("tool_response", event.get("error"))
        errored = event.get("hook_event_name") == "PostToolUseFailure" or (
            isinstance(response, dict)
            and (response.get("is_error") is True or response.get("success") is False)
        )
        duration = event.get("duration_ms")
        return Event(
            "post",
            **common,
            response_digest=digest(response),
            errored=errored,
            duration_ms=float(duration) if isinstance(duration, int | float) else None,
        )

    def tool_call(self, event: dict[str, Any], session: str) -> dict[str, Any]:
        """The parts of a tool event: `tool_name`, `tool_input`, `tool_use_id`, and the
        subagent's `agent_id` / `agent_type` if a subagent made the call."""
        return {
            **self.tool_fields(event, session, field_of(event, "tool_name", str)),
            "tool_use_id": optional_id(event, "tool_use_id"),
            "agent_id": optional_id(event, "agent_id"),
            "agent_type": optional_id(event, "agent_type"),
        }

    def reply(self, phase: Phase, block: bool, message: str) -> Reply:
        if phase == "pre" and block:
            return Reply(json_text(deny(message)))
        if phase == "stop" and block:
            return Reply(json_text({"decision": "block", "reason": f"loopwarden: {message}"}))
        return Reply()

    def failure(self, phase: Phase | None, message: str) -> Reply:
        """Exit 2 blocks a tool call (and is the answer when the phase is unknown); after a
        tool ran, at a session's start or at a stop, exit 1 reports without blocking (a stop
        blocked on every failure could never end)."""
        blocking = phase in (None, "pre")
        return Reply(stderr=f"loopwarden: {message}\n", exit_code=2 if blocking else 1)

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

    def hooks(self, hook: Hook) -> dict[str, Any]:
        return self.groups(
            hook,
            {
                "PreToolUse": ("*", {"timeout": 30, "onFailure": "block"}),
                "PostToolUse": ("*", {"timeout": 30}),
                "PostToolUseFailure": ("*", {"timeout": 30}),
                "SessionStart": (None, {"timeout": 30}),
                "Stop": (None, {"timeout": 60}),
            },
        )

    def groups(
        self, hook: Hook, events: dict[str, tuple[str | None, dict[str, Any]]]
    ) -> dict[str, Any]:
        """One matcher group per event (matcher, the hook's extra settings): an `http` hook
        where the host posts itself and a URL is given, else a command."""

        def entry(extra: dict[str, Any]) -> dict[str, Any]:
            if hook.url is not None and self.http_hooks:
                return {
                    "type": "http",
                    "url": hook.url,
                    "headers": {"Authorization": f"Bearer ${hook.token_variable}"},
                    "allowedEnvVars": [hook.token_variable],
                    **extra,
                }
            return {"type": "command", "command": hook.command, **extra}

        return {
            event: {**({"matcher": matcher} if matcher else {}), "hooks": [entry(extra)]}
            for event, (matcher, extra) in events.items()
        }

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
