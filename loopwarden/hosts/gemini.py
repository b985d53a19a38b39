"""Gemini CLI: hooks in `.gemini/settings.json` (BeforeTool, AfterTool, SessionStart,
AfterAgent; `command` type only; the sources are listed in tests/fixtures/hooks/gemini/SOURCES.md).

A pre-tool deny is `{"decision": "deny", "reason": …}` on stdout (JSON decides whatever the exit
code). AfterAgent (the stop): the same document re-prompts the model, once while
`stop_hook_active` is false. Gemini has no fail-closed setting and exit 2 with no output lets
the tool run, so a failure before a tool runs prints the deny document and exits 2. MCP tools
are named from `mcp_context` (the flat `mcp_<server>_<tool>` is ambiguous).

Gemini reads a project's settings only in a trusted folder (folder trust is on unless
`security.folderTrust.enabled` is false; `~/.gemini/trustedFolders.json`, the longest matching
rule deciding; `GEMINI_CLI_TRUST_WORKSPACE` overrides both), and headless runs refuse an
untrusted folder.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from loopwarden.hosts.host import (
    Files,
    Hook,
    Host,
    McpFile,
    On,
    Phase,
    Place,
    Reply,
    Trust,
    digest,
    json_text,
)
from loopwarden.policy.patterns import SHELL

TRUST_VARIABLE = "GEMINI_CLI_TRUST_WORKSPACE"


def _loose_json(text: str | None) -> Any:
    """A JSON file Gemini reads (it allows whole-line `//` comments), or None."""
    if not text:
        return None
    kept = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
    try:
        return json.loads(kept)
    except ValueError:
        return None


def _within(location: Path, root: Path) -> bool:
    return location == root or str(location).startswith(str(root).rstrip(os.sep) + os.sep)


class Gemini(Host):
    name = "gemini"
    title = "Gemini CLI"
    events: ClassVar[Mapping[str, On]] = {
        "SessionStart": On("session"),
        "BeforeTool": On("pre", ".*"),
        "AfterTool": On("post", ".*"),
        "AfterAgent": On("stop", timeout=60),
    }
    names: ClassVar[Mapping[str, str]] = {
        "run_shell_command": SHELL,
        "read_file": "fs.read",
        "read_many_files": "fs.read",
        "list_directory": "fs.read",
        "write_file": "fs.write",
        "replace": "fs.write",
        "glob": "fs.search",
        "grep_search": "fs.search",
        "search_file_content": "fs.search",
        "web_fetch": "web.fetch",
        "google_web_search": "web.search",
        "invoke_agent": "agent.spawn",
        "save_memory": "host.memory",
        "write_todos": "host.todo",
    }
    shell: ClassVar[Mapping[str, str]] = {"run_shell_command": "command"}
    internal = frozenset(  # core tools that keep the session's own state (tool-names.ts)
        {"write_todos", "ask_user", "enter_plan_mode", "exit_plan_mode", "get_internal_docs",
         "tracker_create_task", "tracker_update_task", "tracker_get_task",
         "tracker_list_tasks", "tracker_add_dependency", "tracker_visualize"}
    )  # fmt: skip
    settings_file = ".gemini/settings.json"
    mcp_files = (
        McpFile("project", ".gemini/settings.json"),
        McpFile("user", ".gemini/settings.json"),
    )
    ids = ()  # its events carry no tool call id

    def tool_name(self, event: dict[str, Any]) -> str:
        """An MCP tool is named from `mcp_context` (the flat `mcp_<server>_<tool>` is
        ambiguous)."""
        tool = super().tool_name(event)
        context = event.get("mcp_context")
        if isinstance(context, dict) and isinstance(context.get("server_name"), str):
            tool = f"mcp__{context['server_name']}__{context.get('tool_name') or tool}"
        return tool

    def outcome(self, event: dict[str, Any]) -> dict[str, Any]:
        response = event.get("tool_response")
        errored = isinstance(response, dict) and bool(response.get("error"))
        return {"response_digest": digest(response), "errored": errored}

    def reply(self, phase: Phase, block: bool, message: str) -> Reply:
        if phase in ("pre", "stop") and block:
            return Reply(json_text({"decision": "deny", "reason": f"loopwarden: {message}"}))
        return Reply()

    def blocking_failure(self, message: str) -> Reply:
        """The deny document, and exit 2 (exit 2 alone lets the tool run)."""
        return Reply(
            self.reply("pre", True, message).stdout, f"loopwarden: {message}\n", exit_code=2
        )

    def entry(self, hook: Hook, name: str, on: On) -> dict[str, Any]:
        """A named command hook (`loopwarden-before-tool`), its timeout in milliseconds."""
        words = re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()
        return {
            "name": f"loopwarden-{words}",
            "type": "command",
            "command": hook.command,
            "timeout": on.timeout * 1000,
        }

    def install(self, settings: dict[str, Any], hook: Hook) -> dict[str, Any]:
        out = super().install(settings, hook)
        out["hooksConfig"] = {**(out.get("hooksConfig") or {}), "enabled": True}
        return out

    def trust(self, place: Place, files: Files) -> Trust:
        """The folder's trust as Gemini decides it: the variable, then whether folder trust is
        on, then the longest matching rule of the trusted folders file."""
        given = place.env.get(TRUST_VARIABLE, "").lower()
        if given in ("true", "false"):
            return Trust(
                given == "true",
                f"{TRUST_VARIABLE}={given} in this environment (the host's own must say so too)",
                "" if given == "true" else f"unset {TRUST_VARIABLE} or set it to true",
            )
        settings = _loose_json(files(place.user_home / ".gemini/settings.json")) or {}
        security = settings.get("security") if isinstance(settings, dict) else None
        folder_trust = security.get("folderTrust") if isinstance(security, dict) else None
        if isinstance(folder_trust, dict) and folder_trust.get("enabled") is False:
            return Trust(True, "folder trust is off (security.folderTrust.enabled = false)")
        rules_file = Path(
            place.env.get("GEMINI_CLI_TRUSTED_FOLDERS_PATH")
            or place.user_home / ".gemini/trustedFolders.json"
        )
        return _folder_trust(place.project, _loose_json(files(rules_file)), rules_file)


def _folder_trust(project: Path, rules: Any, rules_file: Path) -> Trust:
    """The longest rule whose folder holds `project` decides (TRUST_PARENT names a folder in
    the one it trusts); with none, Gemini asks in an interactive session and a headless run
    refuses the folder."""
    best: tuple[int, str, str] | None = None
    for path, level in rules.items() if isinstance(rules, dict) else []:
        folder = Path(path).parent if level == "TRUST_PARENT" else Path(path)
        if _within(project, folder) and (best is None or len(path) > best[0]):
            best = (len(path), path, level)
    fix = (
        f'trust the folder when Gemini CLI asks (/permissions), add "{project}": '
        f'"TRUST_FOLDER" to {rules_file}, or set {TRUST_VARIABLE}=true in the host\'s '
        "environment"
    )
    if best is None:
        return Trust(False, f"{project} is not a trusted folder ({rules_file} has no rule)", fix)
    if best[2] == "DO_NOT_TRUST":
        return Trust(False, f"{rules_file} marks {best[1]} DO_NOT_TRUST", fix)
    return Trust(True, f"{rules_file}: {best[1]} is {best[2]}")


HOST = Gemini()
