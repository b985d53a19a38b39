"""Which MCP server names run loopwarden in a host's configuration (pure: handed the files).

A host calls loopwarden's own tools `mcp__<server>__claim`, where `<server>` is whatever name
the user gave loopwarden's server when adding it (`claude mcp add lw -- loopwarden serve …`).
The hooks must let exactly those names' own tools through, so `hook install` and `hook doctor`
read the host's MCP configuration files (project and user scope, `Host.mcp_files`) and find
each server entry that starts `loopwarden serve` — the `loopwarden` command, `python -m
loopwarden`, or a runner (`uvx`, `pipx run`) of it — for this data home: an entry naming
another home (`--home`, `LOOPWARDEN_HOME`) is someone else's, one naming none is taken as this
home's (the host's environment decides, which the installer cannot see).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopwarden.hosts.host import Files, McpFile, Place


@dataclass(frozen=True)
class Found:
    """A server entry that runs loopwarden: its name and the file that declares it."""

    name: str
    file: Path


def _servers(file: McpFile, text: str, project: Path) -> Iterator[tuple[str, Any]]:
    try:
        data = tomllib.loads(text) if file.toml else json.loads(text)
    except (ValueError, RecursionError):
        return  # a file the host itself cannot read names nothing here
    if not isinstance(data, dict):
        return
    tables = [data.get(file.table)]
    if file.per_project and isinstance(data.get("projects"), dict):
        mine = data["projects"].get(str(project))
        tables.append(mine.get(file.table) if isinstance(mine, dict) else None)
    for table in tables:
        if isinstance(table, dict):
            yield from table.items()


def _argv(entry: Mapping[str, Any]) -> list[str]:
    command, args = entry.get("command"), entry.get("args", [])
    if not isinstance(command, str) or not isinstance(args, list):
        return []
    return [command, *(a for a in args if isinstance(a, str))]


def runs_loopwarden(entry: Any) -> bool:
    """Whether a server entry starts `loopwarden serve` (by any of the usual launchers)."""
    argv = _argv(entry) if isinstance(entry, dict) else []
    names = [Path(word).name for word in argv]
    for i, name in enumerate(names):
        if name == "loopwarden" or (name == "-m" and names[i + 1 : i + 2] == ["loopwarden"]):
            rest = names[i + (2 if name == "-m" else 1) :]
            return bool(rest) and rest[0] == "serve"
    return False


def _home_of(entry: Mapping[str, Any]) -> Path | None:
    argv = _argv(entry)
    for i, word in enumerate(argv):
        if word == "--home" and i + 1 < len(argv):
            return Path(argv[i + 1]).expanduser()
        if word.startswith("--home="):
            return Path(word.split("=", 1)[1]).expanduser()
    env = entry.get("env")
    named = env.get("LOOPWARDEN_HOME") if isinstance(env, dict) else None
    return Path(named).expanduser() if isinstance(named, str) else None


def loopwarden_servers(
    mcp_files: tuple[McpFile, ...], place: Place, files: Files, home: Path | None
) -> list[Found]:
    """Every server entry of the host's MCP configuration that runs loopwarden for `home`
    (None: any home), in file order (project scope first), each name once."""
    found: dict[str, Found] = {}
    for file in sorted(mcp_files, key=lambda f: f.scope != "project"):
        path = (place.project if file.scope == "project" else place.user_home) / file.path
        text = files(path)
        if text is None:
            continue
        for name, entry in _servers(file, text, place.project):
            if not runs_loopwarden(entry) or name in found:
                continue
            named = _home_of(entry)
            if home is not None and named is not None and named.resolve() != home.resolve():
                continue
            found[name] = Found(name, path)
    return list(found.values())
