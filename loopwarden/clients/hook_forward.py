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
from loopwarden.clients.hook_process import blocked, options_of
from loopwarden.hosts import ANSWER_HEADER  # the registry alone: no host module is imported

TYPE_CHECKING = False  # not `typing`'s: the forwarder imports nothing it does not run
if TYPE_CHECKING:
    from collections.abc import Sequence

TOKEN_VARIABLE = "LOOPWARDEN_OBSERVER_TOKEN"


def main(argv: Sequence[str]) -> int:
    options = options_of(argv)
    host = str(options["host"])
    raw = sys.stdin.buffer.read()
    try:
        return _forward(host, raw, options)
    except Exception as exc:  # no decision, whatever went wrong: fail closed
        return blocked(host, raw, f"the forwarder failed ({type(exc).__name__})")


def _forward(host: str, raw: bytes, options: dict[str, object]) -> int:
    token = os.environ.get(TOKEN_VARIABLE, "")
    if not token:
        why = f"${TOKEN_VARIABLE} is not set (loopwarden token create --role observer)"
        return blocked(host, raw, why)
    try:
        url = http1.Url(str(options.get("server", "")))
    except ValueError:
        return blocked(host, raw, f"--server {options.get('server')!r} is not an http(s) URL")
    query = f"loop={http1.quote(str(options.get('loop', '')))}" + "".join(
        f"&server={http1.quote(str(s))}"
        for s in options["server_name"]  # type: ignore[attr-defined]
    )
    path = f"{url.path.rstrip('/')}/hooks/{http1.quote(host)}?{query}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        status, answer_headers, answer = http1.post(url, path, raw, headers)
    except OSError as exc:
        return blocked(
            host, raw, f"the loopwarden server at {url.authority} cannot be reached ({exc})"
        )
    except ValueError as exc:
        return blocked(host, raw, f"the event cannot be sent to {url.authority} ({exc})")
    body = answer.decode("utf-8", "replace")
    answered = ANSWER_HEADER.lower() in answer_headers
    if status == 200 and answered:
        if body:
            sys.stdout.write(body + "\n")
        return 0
    if answered:  # the server's own failure answer
        return blocked(host, raw, body.strip().removeprefix("loopwarden: ")[:500])
    return blocked(host, raw, f"the loopwarden server answered HTTP {status}: {body[:200]}")
