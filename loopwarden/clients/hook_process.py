"""What the hook processes that do not decide themselves share (the forwarder to a server,
`hook_forward.py`, and to the home's local server, `hook_local.py`): their options, read
without `argparse`, and their answer when they have no decision.

Standard library only, and only what runs: these processes start for every tool call.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not `typing`'s: the hook imports nothing it does not run
if TYPE_CHECKING:
    from collections.abc import Sequence


def options_of(argv: Sequence[str]) -> dict[str, object]:
    """`HOST --loop ID --agent NAME [--server URL] [--home H] [--store URL] [--server-name N …]`
    (the rest is ignored)."""
    found: dict[str, object] = {"host": argv[0], "server_name": []}
    rest = list(argv[1:])
    while rest:
        flag = rest.pop(0)
        value = rest.pop(0) if rest else ""
        if flag == "--server-name":
            found["server_name"].append(value)  # type: ignore[attr-defined]
        elif flag in ("--loop", "--agent", "--server", "--home", "--store"):
            found[flag[2:]] = value
    return found


def blocked(host: str, raw: bytes, message: str) -> int:
    """No decision: answer as `host`'s hook answers a failure (a block before a tool runs, or
    when the event cannot be read; a report otherwise)."""
    import json

    from loopwarden import hosts  # only here: a decision imports nothing of loopwarden's

    try:
        event = json.loads(raw)
    except ValueError:
        event = None
    known = hosts.get(host)
    reply = known.failure(known.phase_of(event), message)
    if reply.stdout:
        sys.stdout.write(reply.stdout + "\n")
    sys.stderr.write(reply.stderr)
    return reply.exit_code
