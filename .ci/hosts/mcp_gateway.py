"""loopwarden's MCP gateway in a world: the host is given loopwarden as its only MCP server,
`loopwarden serve --agent … --gateway servers.json` over stdio, with **no hooks installed**;
the gateway serves the project's own downstream server (`bench/downstream_server.py`, over
stdio, no network) under the names `own__<tool>` (policy names `mcp.own.<tool>`).

The operator pins the downstream's tool descriptions before the first session
(`loopwarden gateway pin`). `redescribe` rewrites the servers file so that the next session's
downstream describes `echo` otherwise (`DOWNSTREAM_DESCRIBE=v2`): a re-described tool.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .world import LOOP, SERVE, World

REPO = Path(__file__).resolve().parents[2]
DOWNSTREAM = REPO / "bench" / "downstream_server.py"
SERVER = "own"  # the downstream's name in the servers file: its tools are `own__<tool>`


def servers_path(world: World) -> Path:
    return world.root / "servers.json"


def write_servers(world: World, describe: str = "v1") -> Path:
    """The servers file: the downstream over stdio (this checkout's Python), the world's loop."""
    path = servers_path(world)
    downstream = {
        "command": sys.executable,
        "args": [str(DOWNSTREAM)],
        "env": {"DOWNSTREAM_DESCRIBE": describe},
    }
    document = {"mcpServers": {SERVER: downstream}, "gateway": {"loop": LOOP}}
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def add_gateway(world: World, mcp_add_prefix: list[str]) -> None:
    """loopwarden as the host's only MCP server, in front of the downstream, pinned by the
    operator; `mcp_add_prefix` is the host's `mcp add` command up to the server's command line.
    No `hook install`: the gateway is the only thing in the path."""
    servers = write_servers(world)
    world.run("loopwarden", "gateway", "pin", str(servers))
    world.run(*mcp_add_prefix, *SERVE, "--gateway", str(servers))


def redescribe(world: World) -> None:
    """Between sessions: the downstream now describes `echo` otherwise (a "rug pull")."""
    write_servers(world, describe="v2")
