"""The `loopwarden` command's entry point: `loopwarden hook HOST …` (started by agent hosts
for every tool call) goes straight to its lean handler (or, with `--server`, to a forwarder
that imports nothing but the standard library); everything else to the admin CLI."""

from __future__ import annotations

import os
import sys

from loopwarden.hosts import NAMES as HOSTS  # the registry alone: no host module is imported


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "hook" and argv[1] in HOSTS and "--server" in argv:
        from loopwarden.clients.hook_forward import main as forward

        sys.exit(forward(argv[1:]))
    if len(argv) >= 2 and argv[0] == "hook" and argv[1] in HOSTS:
        # Pydantic looks up plugin entry points on first use (~10 ms of importlib.metadata);
        # loopwarden uses none, and the hook runs on every tool call the model makes.
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
        from loopwarden.clients.hook_command import main as hook_main

        sys.exit(hook_main(argv[1:]))
    from loopwarden.clients.cli import main as cli_main

    cli_main()
