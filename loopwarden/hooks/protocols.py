"""Each host's hook event format and answer format, as the host documents them (the sources are
listed in docs/hooks.md and tests/fixtures/hooks/SOURCES.md).

A `Protocol` reads one event (`read`: the host's JSON → an `Event`) and writes one answer
(`reply`: a `HookAnswer`, or a failure → what to print and the exit code). It decides nothing:
the `hook` operation does. Every path that cannot produce an answer fails closed: before a tool
runs, a failure blocks it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loopwarden.canonical import digest_of
from loopwarden.errors import InvalidInput, SealError
from loopwarden.operations.hooks import HookAnswer, Phase

MAX_EVENT = 32 * 1024 * 1024  # bytes of one event (a Write of a large file carries it whole)


class MalformedEvent(InvalidInput):
    """An event this host does not send (or one loopwarden cannot read): answered fail-closed."""


@dataclass(frozen=True)
class Event:
    """One hook event in the host-neutral form the `hook` operation takes."""

    phase: Phase
    session_id: str
    tool_use_id: str | None = None
    host_tool: str | None = None
    input_digest: str | None = None
    command: str | None = None
    response_digest: str | None = None
    errored: bool = False
    duration_ms: float | None = None
    stop_active: bool = False


@dataclass(frozen=True)
class Reply:
    """What the hook process prints on stdout and stderr, and its exit code (the HTTP hook
    returns `stdout` as its body)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    """sha256 of the RFC 8785 bytes of a JSON value (an input or a response); a value JCS
    cannot represent is digested as its JSON text."""
    try:
        return digest_of(value)
    except SealError:
        return digest_of(json.dumps(value, sort_keys=True, default=str))


def _field(event: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = event.get(name)
    if not isinstance(value, kind):
        raise MalformedEvent(
            f"the event's {name!r} is missing or not a {getattr(kind, '__name__', kind)}"
        )
    return value


def _session(event: dict[str, Any]) -> str:
    session = _field(event, "session_id", str)
    if not session:
        raise MalformedEvent("the event's 'session_id' is empty")
    return str(session)[:200]


def _shell_line(tool_input: Any, key: str = "command") -> str | None:
    """The command line of a shell tool's input: a string, or an argv list joined by spaces."""
    if not isinstance(tool_input, dict):
        return None
    value = tool_input.get(key)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return _argv_line(value)
    return None


def _argv_line(argv: list[str]) -> str:
    """An argv as one line; `bash -lc SCRIPT` (how Codex runs commands) is the script itself."""
    if (
        len(argv) >= 3
        and argv[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh")
        and argv[1]
        in (
            "-c",
            "-lc",
        )
    ):
        return argv[2]
    return " ".join(argv)


def _deny(reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": f"loopwarden: {reason}",
        }
    }


def _tool_call(event: dict[str, Any], session: str, shell_tools: frozenset[str]) -> dict[str, Any]:
    """The parts of a tool event hosts name alike: `tool_name`, `tool_input`, `tool_use_id`."""
    tool = _field(event, "tool_name", str)
    tool_input = event.get("tool_input", {})
    use_id = event.get("tool_use_id")
    return {
        "session_id": session,
        "tool_use_id": use_id if isinstance(use_id, str) else None,
        "host_tool": tool,
        "input_digest": digest(tool_input),
        "command": _shell_line(tool_input) if tool in shell_tools else None,
    }


class ClaudeCode:
    """Claude Code hooks (PreToolUse, PostToolUse, PostToolUseFailure, SessionStart, Stop;
    `command` and `http` types).

    Pre-tool deny: exit 0 with `hookSpecificOutput.permissionDecision = "deny"` and its reason
    (shown to the model). An allow prints nothing (an explicit "allow" would also skip the
    user's own permission prompts, which is not ours to do). Stop: `{"decision": "block",
    "reason": …}`, not again once `stop_hook_active`. A failure: exit 2 with the reason on
    stderr, which blocks a pre-tool call (the installer also sets `onFailure: "block"`, so a
    crash or a timeout blocks too).
    """

    name = "claude-code"
    shell_tools = frozenset({"Bash", "PowerShell"})
    stop_events = frozenset({"Stop", "SubagentStop"})
    post_events = frozenset({"PostToolUse", "PostToolUseFailure"})

    def read(self, event: dict[str, Any]) -> Event:
        name = _field(event, "hook_event_name", str)
        session = _session(event)
        if name == "SessionStart":
            return Event("session", session)
        if name in self.stop_events:
            return Event("stop", session, stop_active=bool(event.get("stop_hook_active")))
        if name != "PreToolUse" and name not in self.post_events:
            raise MalformedEvent(f"loopwarden does not handle {name!r} events")
        common = _tool_call(event, session, self.shell_tools)
        if name == "PreToolUse":
            return Event("pre", **common)
        response = event.get("tool_response", event.get("error"))
        errored = name == "PostToolUseFailure" or (
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

    def reply(self, event: Event, answer: HookAnswer) -> Reply:
        if event.phase == "pre" and answer.block:
            return Reply(_json(_deny(answer.message)))
        if event.phase == "stop" and answer.block:
            return Reply(_json({"decision": "block", "reason": f"loopwarden: {answer.message}"}))
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
            return 200, _json(_deny(reason))
        if reply.exit_code:
            return 500, reply.stderr
        return 200, reply.stdout


class Codex(ClaudeCode):
    """Codex CLI hooks: Claude Code's event and answer format (PreToolUse, PostToolUse,
    SessionStart, Stop). Its PreToolUse takes only `deny`: a bare `allow` or any `ask` is
    invalid and lets the tool run, so an allow prints nothing. Exit 2 blocks only with a
    non-empty stderr (ours always has one). Codex has no fail-closed setting and no cap on
    blocked stops: loopwarden blocks a stop once (`stop_hook_active`)."""

    name = "codex"
    shell_tools = frozenset({"Bash", "shell", "local_shell", "exec_command"})
    stop_events = frozenset({"Stop"})
    post_events = frozenset({"PostToolUse"})


def _http_by_exit(reply: Reply) -> tuple[int, str]:
    """For hosts whose hooks are commands only (posted by a bridge such as `curl`): the
    reply's stdout with 200, or 500 with stderr on a failure."""
    return (200, reply.stdout) if not reply.exit_code else (500, reply.stderr)


class Gemini:
    """Gemini CLI hooks (BeforeTool, AfterTool, SessionStart, AfterAgent; `command` type).

    Pre-tool deny: `{"decision": "deny", "reason": …}` on stdout (JSON decides whatever the
    exit code). AfterAgent (the stop): the same document re-prompts the model, once while
    `stop_hook_active` is false. Gemini has no fail-closed setting and exit 2 with no output
    lets the tool run, so a failure before a tool runs prints the deny document and exits 2.
    MCP tools are named from `mcp_context` (the flat `mcp_<server>_<tool>` is ambiguous).
    """

    name = "gemini"
    shell_tools = frozenset({"run_shell_command"})

    def read(self, event: dict[str, Any]) -> Event:
        name = _field(event, "hook_event_name", str)
        session = _session(event)
        if name == "SessionStart":
            return Event("session", session)
        if name == "AfterAgent":
            return Event("stop", session, stop_active=bool(event.get("stop_hook_active")))
        if name not in ("BeforeTool", "AfterTool"):
            raise MalformedEvent(f"loopwarden does not handle {name!r} events")
        tool = _field(event, "tool_name", str)
        context = event.get("mcp_context")
        if isinstance(context, dict) and isinstance(context.get("server_name"), str):
            tool = f"mcp__{context['server_name']}__{context.get('tool_name') or tool}"
        tool_input = event.get("tool_input", {})
        common = {
            "session_id": session,
            "host_tool": tool,
            "input_digest": digest(tool_input),
            "command": _shell_line(tool_input) if tool in self.shell_tools else None,
        }
        if name == "BeforeTool":
            return Event("pre", **common)
        response = event.get("tool_response")
        errored = isinstance(response, dict) and bool(response.get("error"))
        return Event("post", **common, response_digest=digest(response), errored=errored)

    def reply(self, event: Event, answer: HookAnswer) -> Reply:
        if event.phase in ("pre", "stop") and answer.block:
            return Reply(_json({"decision": "deny", "reason": f"loopwarden: {answer.message}"}))
        return Reply()

    def failure(self, phase: Phase | None, message: str) -> Reply:
        if phase in (None, "pre"):
            deny = {"decision": "deny", "reason": f"loopwarden: {message}"}
            return Reply(_json(deny), f"loopwarden: {message}\n", exit_code=2)
        return Reply(stderr=f"loopwarden: {message}\n", exit_code=1)

    def http(self, reply: Reply) -> tuple[int, str]:
        return _http_by_exit(reply) if reply.exit_code != 2 else (200, reply.stdout)


class Cursor:
    """Cursor hooks (`hooks.json`, version 1): preToolUse, postToolUse, beforeShellExecution,
    beforeMCPExecution, beforeReadFile, sessionStart, stop. Built from the hook code of the
    `@cursor/sdk` package; the editor's own behaviour is not verified (docs/hooks.md).

    Deny: `{"permission": "deny", "user_message": …, "agent_message": …}`. Stop: a
    `followup_message`, only on the first stop of a turn (`loop_count` 0). A failure: exit 2
    with the message on stdout (the installer also sets `failClosed: true`).
    """

    name = "cursor"
    shell_tools = frozenset({"Shell"})
    pre_events = frozenset(
        {"preToolUse", "beforeShellExecution", "beforeMCPExecution", "beforeReadFile"}
    )

    def read(self, event: dict[str, Any]) -> Event:
        name = _field(event, "hook_event_name", str)
        session = str(event.get("conversation_id") or "") or _session(event)
        session = session[:200]
        if name == "sessionStart":
            return Event("session", session)
        if name == "stop":
            return Event("stop", session, stop_active=bool(event.get("loop_count")))
        if name == "beforeShellExecution":
            command = _field(event, "command", str)
            return Event(
                "pre", session, host_tool="Shell", input_digest=digest({"command": command}),
                command=command,
            )  # fmt: skip
        if name == "beforeMCPExecution":
            server = _field(event, "mcp_server_name", str) if "mcp_server_name" in event else ""
            tool = _field(event, "tool_name", str)
            host_tool = f"mcp__{server}__{tool}" if server else f"MCP:{tool}"
            return Event(
                "pre", session, host_tool=host_tool, input_digest=digest(event.get("tool_input"))
            )
        if name == "beforeReadFile":
            path = event.get("file_path")
            return Event("pre", session, host_tool="Read", input_digest=digest({"file_path": path}))
        if name not in ("preToolUse", "postToolUse"):
            raise MalformedEvent(f"loopwarden does not handle {name!r} events")
        common = _tool_call(event, session, self.shell_tools)
        if name == "preToolUse":
            return Event("pre", **common)
        duration = event.get("duration")
        return Event(
            "post",
            **common,
            response_digest=digest(event.get("tool_output")),
            duration_ms=float(duration) if isinstance(duration, int | float) else None,
        )

    def reply(self, event: Event, answer: HookAnswer) -> Reply:
        if event.phase == "pre" and answer.block:
            message = f"loopwarden: {answer.message}"
            return Reply(
                _json({"permission": "deny", "user_message": message, "agent_message": message})
            )
        if event.phase == "stop" and answer.block:
            return Reply(_json({"followup_message": f"loopwarden: {answer.message}"}))
        return Reply()

    def failure(self, phase: Phase | None, message: str) -> Reply:
        if phase in (None, "pre"):  # the documented deny: exit 0 with the deny document
            text = f"loopwarden: {message}"
            deny = {"permission": "deny", "user_message": text, "agent_message": text}
            return Reply(_json(deny), text + "\n")
        return Reply(stderr=f"loopwarden: {message}\n", exit_code=1)

    def http(self, reply: Reply) -> tuple[int, str]:
        return _http_by_exit(reply)


Protocol = ClaudeCode | Gemini | Cursor
PROTOCOLS: dict[str, Protocol] = {
    "claude-code": ClaudeCode(),
    "codex": Codex(),
    "gemini": Gemini(),
    "cursor": Cursor(),
}
