"""`loopwarden hook HOST --loop ID --agent NAME --server URL`: a command hook that forwards its
event to a running `serve --http` (`POST /hooks/HOST`) and prints the server's answer.

For hosts whose hooks can only be commands (Codex, Gemini CLI, Cursor): a decision costs an
interpreter start, the standard library and one local request, and it is the server's, with
the same receipts. The observer token comes from `LOOPWARDEN_OBSERVER_TOKEN` (never from the
event; it is the agent's host's secret). Fails closed: only a 200 answer the server marks as
its own (`ANSWER_HEADER`) is a decision; anything else (no token, a server that cannot be
reached, a refusal, an HTTP 500, a proxy's page) is answered as the host's own hook answers a
failure (`loopwarden/hosts`): a pre-tool event is blocked in that host's blocking form.
"""

from __future__ import annotations

import os
import sys

from loopwarden.clients import http1
from loopwarden.hosts import ANSWER_HEADER  # the registry alone: no host module is imported

TYPE_CHECKING = False  # not `typing`'s: the forwarder imports nothing it does not run
if TYPE_CHECKING:
    from collections.abc import Sequence

TOKEN_VARIABLE = "LOOPWARDEN_OBSERVER_TOKEN"


def _options(argv: Sequence[str]) -> dict[str, object]:
    """`HOST --loop ID --agent NAME --server URL [--server-name N …]` (the rest is ignored)."""
    found: dict[str, object] = {"host": argv[0], "server_name": []}
    rest = list(argv[1:])
    while rest:
        flag = rest.pop(0)
        value = rest.pop(0) if rest else ""
        if flag == "--server-name":
            found["server_name"].append(value)  # type: ignore[attr-defined]
        elif flag in ("--loop", "--agent", "--server", "--home"):
            found[flag[2:]] = value
    return found


def _block(host: str, raw: bytes, message: str) -> int:
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


def main(argv: Sequence[str]) -> int:
    options = _options(argv)
    host = str(options["host"])
    raw = sys.stdin.buffer.read()
    try:
        return _forward(host, raw, options)
    except Exception as exc:  # no decision, whatever went wrong: fail closed
        return _block(host, raw, f"the forwarder failed ({type(exc).__name__})")


def _forward(host: str, raw: bytes, options: dict[str, object]) -> int:
    token = os.environ.get(TOKEN_VARIABLE, "")
    if not token:
        why = f"${TOKEN_VARIABLE} is not set (loopwarden token create --role observer)"
        return _block(host, raw, why)
    try:
        url = http1.Url(str(options.get("server", "")))
    except ValueError:
        return _block(host, raw, f"--server {options.get('server')!r} is not an http(s) URL")
    query = f"loop={http1.quote(str(options.get('loop', '')))}" + "".join(
        f"&server={http1.quote(str(s))}"
        for s in options["server_name"]  # type: ignore[attr-defined]
    )
    path = f"{url.path.rstrip('/')}/hooks/{http1.quote(host)}?{query}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        status, answer_headers, answer = http1.post(url, path, raw, headers)
    except OSError as exc:
        return _block(
            host, raw, f"the loopwarden server at {url.authority} cannot be reached ({exc})"
        )
    except ValueError as exc:
        return _block(host, raw, f"the event cannot be sent to {url.authority} ({exc})")
    body = answer.decode("utf-8", "replace")
    answered = ANSWER_HEADER.lower() in answer_headers
    if status == 200 and answered:
        if body:
            sys.stdout.write(body + "\n")
        return 0
    if answered:  # the server's own failure answer
        return _block(host, raw, body.strip().removeprefix("loopwarden: ")[:500])
    return _block(host, raw, f"the loopwarden server answered HTTP {status}: {body[:200]}")
