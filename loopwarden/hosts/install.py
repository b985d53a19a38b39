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

from loopwarden import hosts
from loopwarden.errors import InvalidInput
from loopwarden.hosts.host import Hook

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
    http: str | None = None  # a server's base URL: http hooks, or a forwarding command
    store: str | None = None  # a store URL for the hook command (`--store`), without a password
    in_process: bool = False  # the hook opens the store itself instead of the local server

    def command(self) -> str:
        """The hook command: by default one that forwards each event to the home's local hook
        server, starting it on first use (`clients/hook_local.py`); with `in_process`, one
        that decides itself (`clients/hook_command.py`); with `http` (hosts without http
        hooks), one that forwards each event to that server (`clients/hook_forward.py`)."""
        words = [*self.program, "hook", self.host, "--loop", self.loop_id, "--agent", self.agent]
        words += ["--server", self.http] if self.http else ["--home", str(self.home)]
        if self.store and not self.http:
            words += ["--store", self.store]
        if self.in_process and not self.http:
            words += ["--in-process"]
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
    return (project if scope == "project" else user_home) / hosts.get(host).settings_file


def hook_for(target: Target) -> Hook:
    """How `target`'s hooks call loopwarden: a URL where the host posts itself (`--http` on a
    host with `http` hooks), else a command (with `--http`, one that forwards)."""
    host = hosts.get(target.host)
    url = target.url() if target.http is not None and host.http_hooks else None
    return Hook(command=target.command(), url=url, token_variable=TOKEN_VARIABLE)


def groups_for(target: Target) -> dict[str, Any]:
    """Per event, the one matcher group (or, for Cursor, hook entry) loopwarden installs."""
    return hosts.get(target.host).hooks(hook_for(target))


def merged(settings: Any, target: Target) -> dict[str, Any]:
    """`settings` (the file's JSON, or None for a new file) with loopwarden's hooks in place."""
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise InvalidInput("the settings file does not hold a JSON object; fix it or move it aside")
    if not isinstance(settings.get("hooks", {}), dict):
        raise InvalidInput("the settings file's 'hooks' is not an object; fix it or move it aside")
    return hosts.get(target.host).install(copy.deepcopy(settings), hook_for(target))
