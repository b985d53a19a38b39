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


class ClaudeCode:
    """Claude Code hooks (PreToolUse, PostToolUse, SessionStart, Stop; command and http types).

    Pre-tool deny: exit 0 with `hookSpecificOutput.permissionDecision = "deny"` and its reason
    (shown to the model). An allow prints nothing (an explicit "allow" would also skip the
    user's own permission prompts, which is not ours to do). Stop: `{"decision": "block",
    "reason": …}`. A failure: exit 2 with the reason on stderr, which blocks a pre-tool call.
    """

    name = "claude-code"
    shell_tools = frozenset({"Bash"})

    def read(self, event: dict[str, Any]) -> Event:
        name = _field(event, "hook_event_name", str)
        session = _session(event)
        if name == "SessionStart":
            return Event("session", session)
        if name in ("Stop", "SubagentStop"):
            return Event("stop", session, stop_active=bool(event.get("stop_hook_active")))
        if name not in ("PreToolUse", "PostToolUse", "PostToolUseFailure"):
            raise MalformedEvent(f"loopwarden does not handle {name!r} events")
        tool = _field(event, "tool_name", str)
        tool_input = event.get("tool_input", {})
        use_id = event.get("tool_use_id")
        common = {
            "session_id": session,
            "tool_use_id": use_id if isinstance(use_id, str) else None,
            "host_tool": tool,
            "input_digest": digest(tool_input),
            "command": _shell_line(tool_input) if tool in self.shell_tools else None,
        }
        if name == "PreToolUse":
            return Event("pre", **common)
        response = event.get("tool_response", event.get("error"))
        errored = name == "PostToolUseFailure" or (
            isinstance(response, dict)
            and (response.get("is_error") is True or response.get("success") is False)
        )
        return Event("post", **common, response_digest=digest(response), errored=errored)

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


PROTOCOLS: dict[str, ClaudeCode] = {"claude-code": ClaudeCode()}
