"""The agent hosts loopwarden's hooks speak with: one module per host, and this registry.

A host module (`claude_code.py`, …) declares one `Host` (`host.py`): its hook events and how to
read them, its answers (a decision, a failure, over HTTP), its default tool-name table, the
tools that carry a shell command line, its host-internal tools, the settings the installer
writes and how to tell whether the host trusts them. Everything else is derived from `NAMES`
and `get`: the CLI's choices, the forwarder, the entry point's fast dispatch, the receipts'
`host` field, the policy's `[observe.names]` validation.

Adding a host is one module and one line in `loopwarden/hostnames.py`. This package imports no host module until one
is asked for (`get`): the entry point reads `NAMES` on every tool call a model makes.
"""

from __future__ import annotations

import importlib

from loopwarden.hostnames import NAMES  # each is the module loopwarden/hosts/<name, - as _>.py

TYPE_CHECKING = False  # not `typing`'s: importing typing would cost the entry point ~2 ms
if TYPE_CHECKING:
    from loopwarden.hosts.host import Host

__all__ = ["ANSWER_HEADER", "NAMES", "get"]

ANSWER_HEADER = "Loopwarden-Hook-Answer"
"""The header a server's `POST /hooks/{host}` sets on every answer it makes: the forwarder
takes a response without it (a proxy's page, a crash) as no decision."""


def get(name: str) -> Host:
    """The host called `name`; `LookupError` naming the known hosts if there is none."""
    if name not in NAMES:
        raise LookupError(f"unknown host {name!r} (known: {', '.join(NAMES)})")
    module = importlib.import_module(f"loopwarden.hosts.{name.replace('-', '_')}")
    host: Host = module.HOST
    return host
