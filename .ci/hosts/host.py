"""What the scenarios need of a host: how to set it up in a world, how to start one session,
and the dialect its fake model API speaks. One module per host implements it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .fake import Dialect
from .script import Script
from .world import World


@dataclass(frozen=True)
class Options:
    """How a scenario wants the host: with its deferred-tool search on (Claude Code), with
    subagents' tools allowed, through loopwarden's model gateway (with its token as key), or
    with loopwarden's MCP gateway as its only MCP server and no hooks (`mcp_gateway.py`)."""

    tool_search: bool = False
    subagents: bool = False
    gateway: bool = False  # the host's model calls go through loopwarden's model gateway
    key: str | None = None  # what the host presents as its API key (the fake's, by default)
    mcp_gateway: bool = False  # loopwarden serves with `--gateway`, no hooks installed


class Host(Protocol):
    name: str  # loopwarden's name for the host (`hook install NAME`)
    label: str  # as people know it
    features: frozenset[str]  # what it can show: "tool_search", "subagent"

    def configure(self, world: World, api_url: str, options: Options) -> None:
        """The host's settings in the world: the model API, loopwarden's MCP server and hooks
        as the README shows, and the trust the host needs."""

    def session(
        self, world: World, api_url: str, prompt: str, options: Options
    ) -> tuple[list[str], dict[str, str]]:
        """The command line and the extra environment of one non-interactive session."""

    def dialect(self, script: Script) -> Dialect:
        """The host's model API, answered by `script`."""
