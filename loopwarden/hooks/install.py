"""`loopwarden hook install`: the hook entries each host's settings file needs, merged into
what the file already holds (pure: the CLI reads and writes the file).

Idempotent and polite: loopwarden's own entries (a command running `hook HOST`, or an `http`
hook posting to `/hooks/HOST`) are replaced, every other hook is kept as it was. Where the host
can be told to block when a hook fails, it is (`onFailure`, `failClosed`).
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from loopwarden.errors import InvalidInput

TOKEN_VARIABLE = "LOOPWARDEN_OBSERVER_TOKEN"


@dataclass(frozen=True)
class Target:
    """Where and how the hooks call loopwarden."""

    host: str
    loop_id: str
    agent: str
    program: tuple[str, ...]  # how to start loopwarden (an absolute path, or python -m)
    home: Path
    servers: tuple[str, ...] = ("loopwarden",)
    http: str | None = None  # a server's base URL, for Claude Code's http hooks
    store: str | None = None  # a store URL for the hook command (`--store`), without a password

    def command(self) -> str:
        """The hook command; with `http` (hosts without http hooks), one that forwards each
        event to that server (`clients/hook_forward.py`)."""
        words = [*self.program, "hook", self.host, "--loop", self.loop_id, "--agent", self.agent]
        words += ["--server", self.http] if self.http else ["--home", str(self.home)]
        if self.store and not self.http:
            words += ["--store", self.store]
        for server in self.servers:
            if server != "loopwarden" or len(self.servers) > 1:
                words += ["--server-name", server]
        return shlex.join(words)

    def url(self) -> str:
        assert self.http is not None
        query = [("loop", self.loop_id)] + [
            ("server", s) for s in self.servers if s != "loopwarden"
        ]
        return f"{self.http.rstrip('/')}/hooks/{self.host}?{urlencode(query)}"


def settings_path(host: str, scope: str, project: Path, user_home: Path) -> Path:
    """The settings file a host reads hooks from, for the project or the user."""
    base = project if scope == "project" else user_home
    names = {
        "claude-code": ".claude/settings.json",
        "codex": ".codex/hooks.json",
        "gemini": ".gemini/settings.json",
        "cursor": ".cursor/hooks.json",
    }
    return base / names[host]


def _ours(hook: Any, host: str) -> bool:
    if not isinstance(hook, dict):
        return False
    command = str(hook.get("command", ""))
    url = str(hook.get("url", ""))
    return (f" hook {host} " in f" {command} " and "loopwarden" in command) or (
        f"/hooks/{host}" in url
    )


def _merge_groups(existing: Any, group: dict[str, Any], host: str) -> list[Any]:
    """An event's matcher groups with loopwarden's hooks taken out (and groups left empty by
    that dropped), then loopwarden's group appended."""
    kept = []
    for entry in existing if isinstance(existing, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("hooks"), list):
            hooks = [h for h in entry["hooks"] if not _ours(h, host)]
            if not hooks:
                continue
            entry = {**entry, "hooks": hooks}
        kept.append(entry)
    return [*kept, group]


def _claude_like(target: Target, events: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    def hook(extra: dict[str, Any]) -> dict[str, Any]:
        if target.http is not None and target.host == "claude-code":  # Claude's own http hooks
            return {
                "type": "http",
                "url": target.url(),
                "headers": {"Authorization": f"Bearer ${TOKEN_VARIABLE}"},
                "allowedEnvVars": [TOKEN_VARIABLE],
                **extra,
            }
        return {"type": "command", "command": target.command(), **extra}

    return {
        event: {
            **({"matcher": spec["matcher"]} if "matcher" in spec else {}),
            "hooks": [hook(spec["hook"])],
        }
        for event, spec in events.items()
    }


def groups_for(target: Target) -> dict[str, dict[str, Any]]:
    """Per event, the one matcher group (or, for Cursor, hook entry) loopwarden installs."""
    if target.host == "claude-code":
        block = {"timeout": 30, "onFailure": "block"}
        return _claude_like(
            target,
            {
                "PreToolUse": {"matcher": "*", "hook": block},
                "PostToolUse": {"matcher": "*", "hook": {"timeout": 30}},
                "PostToolUseFailure": {"matcher": "*", "hook": {"timeout": 30}},
                "SessionStart": {"hook": {"timeout": 30}},
                "Stop": {"hook": {"timeout": 60}},
            },
        )
    if target.host == "codex":
        return _claude_like(
            target,
            {
                "PreToolUse": {"matcher": "*", "hook": {"timeout": 30}},
                "PostToolUse": {"matcher": "*", "hook": {"timeout": 30}},
                "SessionStart": {"matcher": "startup|resume", "hook": {"timeout": 30}},
                "Stop": {"hook": {"timeout": 60}},
            },
        )
    if target.host == "gemini":

        def named(name: str, timeout_ms: int, matcher: str | None = None) -> dict[str, Any]:
            hook = {
                "name": f"loopwarden-{name}",
                "type": "command",
                "command": target.command(),
                "timeout": timeout_ms,
            }
            return {**({"matcher": matcher} if matcher else {}), "hooks": [hook]}

        return {
            "BeforeTool": named("before-tool", 30_000, ".*"),
            "AfterTool": named("after-tool", 30_000, ".*"),
            "SessionStart": named("session-start", 30_000),
            "AfterAgent": named("after-agent", 60_000),
        }

    # Cursor: decisions come from the before* events (which name the command, the MCP server
    # and the file), the rest of the tools from preToolUse; none is decided twice.
    def entry(**extra: Any) -> dict[str, Any]:
        return {"command": target.command(), "timeout": 30, **extra}

    closed = {"failClosed": True}
    return {
        "beforeShellExecution": entry(**closed),
        "beforeMCPExecution": entry(**closed),
        "beforeReadFile": entry(**closed),
        "preToolUse": entry(matcher="^(Write|Delete|Grep|Fetch|WebSearch|Task|List)$", **closed),
        "postToolUse": entry(),
        "sessionStart": entry(),
        "stop": entry(loop_limit=1),
    }


def merged(settings: Any, target: Target) -> dict[str, Any]:
    """`settings` (the file's JSON, or None for a new file) with loopwarden's hooks in place."""
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise InvalidInput("the settings file does not hold a JSON object; fix it or move it aside")
    out = copy.deepcopy(settings)
    hooks = out.get("hooks", {})
    if not isinstance(hooks, dict):
        raise InvalidInput("the settings file's 'hooks' is not an object; fix it or move it aside")
    for event, group in groups_for(target).items():
        if target.host == "cursor":
            kept = [h for h in hooks.get(event, []) or [] if not _ours(h, target.host)]
            hooks[event] = [*kept, group]
        else:
            hooks[event] = _merge_groups(hooks.get(event), group, target.host)
    out["hooks"] = hooks
    if target.host == "gemini":
        out["hooksConfig"] = {**(out.get("hooksConfig") or {}), "enabled": True}
    if target.host == "cursor":
        out.setdefault("version", 1)
    return out
