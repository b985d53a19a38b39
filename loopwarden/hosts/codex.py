"""Codex CLI: Claude Code's event and answer format (PreToolUse, PostToolUse, SessionStart,
Stop) in `.codex/hooks.json`, `command` hooks only (the sources are listed in
tests/fixtures/hooks/codex/SOURCES.md).

Its PreToolUse takes only `deny`: a bare `allow` or any `ask` is invalid and lets the tool run,
so an allow prints nothing. Exit 2 blocks only with a non-empty stderr (ours always has one).
Codex has no fail-closed setting and no cap on blocked stops: loopwarden blocks a stop once
(`stop_hook_active`). Events from a subagent carry `agent_id` and `agent_type`.

Codex runs a project's `.codex/hooks.json` only in a project it trusts (`[projects."<path>"]
trust_level = "trusted"` in `$CODEX_HOME/config.toml`), and any hook only once the person
trusted it in `/hooks` (recorded under `[hooks.state]`), unless `bypass_hook_trust = true`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from loopwarden.hosts.claude_code import ClaudeCode
from loopwarden.hosts.host import Files, McpFile, On, Place, Trust
from loopwarden.policy.patterns import SHELL


def git_root(path: Path) -> Path | None:
    """The nearest directory at or above `path` holding `.git` (Codex trusts a repository by
    its root), or None."""
    for candidate in (path, *path.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


class Codex(ClaudeCode):
    name = "codex"
    title = "Codex CLI"
    events: ClassVar[Mapping[str, On]] = {
        "SessionStart": On("session", "startup|resume"),
        "PreToolUse": On("pre", "*"),
        "PostToolUse": On("post", "*"),
        "Stop": On("stop", timeout=60),
    }
    names: ClassVar[Mapping[str, str]] = {
        "Bash": SHELL,  # Codex reports every shell tool (and file reads and searches) as Bash
        "shell": SHELL,  # the shell tools by their own names (older releases, other front ends)
        "local_shell": SHELL,
        "exec_command": SHELL,
        "apply_patch": "fs.write",
        "spawn_agent": "agent.spawn",
        "web_search": "web.search",
        "view_image": "fs.read",
        "update_plan": "host.plan",
    }
    shell: ClassVar[Mapping[str, str]] = {  # every shell tool, as Codex names it and by its own
        "Bash": "command",
        "shell": "command",
        "local_shell": "command",
        "exec_command": "cmd",
    }
    dialects: ClassVar[Mapping[str, str]] = {}
    internal = frozenset({"update_plan", "request_user_input"})
    settings_file = ".codex/hooks.json"
    mcp_files = (
        McpFile("project", ".codex/config.toml", table="mcp_servers", toml=True),
        McpFile("user", ".codex/config.toml", table="mcp_servers", toml=True),
    )
    http_hooks = False

    def trust(self, place: Place, files: Files) -> Trust:
        """Project trust (for project hooks), then hook trust, read from Codex's config."""
        home = Path(place.env["CODEX_HOME"]) if place.env.get("CODEX_HOME") else None
        config_path = (home or place.user_home / ".codex") / "config.toml"
        try:
            config = tomllib.loads(files(config_path) or "")
        except tomllib.TOMLDecodeError as exc:
            return Trust(False, f"{config_path} is not TOML ({exc})", f"fix {config_path}")
        if place.scope == "project":
            refused = _project_untrusted(config, place.project, config_path)
            if refused is not None:
                return refused
        folder = place.project / ".codex" if place.scope == "project" else config_path.parent
        return _hooks_trusted(config, folder / "hooks.json")


def _project_untrusted(config: dict[str, Any], project: Path, where: Path) -> Trust | None:
    """Why Codex would not load the project's hooks, or None if it trusts the project."""
    projects = config.get("projects") if isinstance(config.get("projects"), dict) else {}
    keys = [project, *([root] if (root := git_root(project)) not in (None, project) else [])]
    for key in keys:
        entry = projects.get(str(key)) if isinstance(projects, dict) else None
        level = entry.get("trust_level") if isinstance(entry, dict) else None
        if level == "trusted":
            return None
        if level is not None:
            return Trust(
                False,
                f"Codex marks {key} as {level!r} ({where}): it will not run the project's hooks",
                f'set trust_level = "trusted" under [projects."{key}"] in {where}',
            )
    key = keys[-1]
    return Trust(
        False,
        f"Codex does not trust {key} ({where} has no trust entry): it ignores the project's "
        ".codex/hooks.json, silently",
        f"trust the folder when Codex asks, run `codex exec --trust` once in it, or add "
        f'[projects."{key}"] trust_level = "trusted" to {where}',
    )


def _hooks_trusted(config: dict[str, Any], hooks_file: Path) -> Trust:
    """Whether Codex runs the hooks in `hooks_file`: each hook must have been trusted in
    `/hooks` (a `[hooks.state."<file>:…"]` entry), unless `bypass_hook_trust = true`."""
    if config.get("bypass_hook_trust") is True:
        return Trust(True, "bypass_hook_trust = true: Codex runs every hook without asking")
    hooks = config.get("hooks") if isinstance(config.get("hooks"), dict) else {}
    state = hooks.get("state") if isinstance(hooks, dict) else None
    prefix = f"{hooks_file}:"
    if isinstance(state, dict) and any(str(key).startswith(prefix) for key in state):
        return Trust(
            None,
            f"hooks in {hooks_file} were trusted in /hooks; Codex asks again for any it sees "
            "changed",
            "open /hooks in Codex if it says a hook changed",
        )
    return Trust(
        False,
        f"no hook in {hooks_file} is trusted yet: Codex runs new or changed hooks only once "
        "trusted",
        "open /hooks in Codex and trust loopwarden's hooks (or start Codex with "
        "--dangerously-bypass-hook-trust)",
    )


HOST = Codex()
