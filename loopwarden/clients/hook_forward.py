"""`loopwarden hook HOST --loop ID --agent NAME --server URL`: a command hook that forwards its
event to a running `serve --http` (`POST /hooks/HOST`) and prints the server's answer.

For hosts whose hooks can only be commands (Codex, Gemini CLI, Cursor): the process imports the
standard library only, so a tool call waits for an interpreter start and one local request,
and the decision is the server's, with the same receipts. The observer token comes from
`LOOPWARDEN_OBSERVER_TOKEN` (never from the event; it is the agent's host's secret). Fails
closed: if the server cannot be reached or refuses, a pre-tool event is blocked (exit 2, the
reason on stdout and stderr, which every host reads as a block).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
from collections.abc import Sequence
from urllib.parse import quote, urlsplit

TOKEN_VARIABLE = "LOOPWARDEN_OBSERVER_TOKEN"
TIMEOUT = 25.0  # seconds; under the 30 s the installer gives a hook
PRE_EVENTS = frozenset(  # the events that guard a tool call, by host
    {"PreToolUse", "BeforeTool", "preToolUse", "beforeShellExecution", "beforeMCPExecution",
     "beforeReadFile"}
)  # fmt: skip


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


def _block(raw: bytes, message: str) -> int:
    """Fail closed: block a pre-tool event, report any other."""
    try:
        name = json.loads(raw).get("hook_event_name")
    except (ValueError, AttributeError):
        name = None
    text = f"loopwarden: {message}"
    if name is None or name in PRE_EVENTS:
        sys.stdout.write(text + "\n")
        sys.stderr.write(text + "\n")
        return 2
    sys.stderr.write(text + "\n")
    return 1


def main(argv: Sequence[str]) -> int:
    options = _options(argv)
    raw = sys.stdin.buffer.read()
    token = os.environ.get(TOKEN_VARIABLE, "")
    if not token:
        return _block(
            raw, f"${TOKEN_VARIABLE} is not set (loopwarden token create --role observer)"
        )
    url = urlsplit(str(options.get("server", "")))
    if url.scheme not in ("http", "https") or not url.hostname:
        return _block(raw, f"--server {options.get('server')!r} is not an http(s) URL")
    query = f"loop={quote(str(options.get('loop', '')))}" + "".join(
        f"&server={quote(str(s))}"
        for s in options["server_name"]  # type: ignore[attr-defined]
    )
    path = f"{url.path.rstrip('/')}/hooks/{quote(str(options['host']))}?{query}"
    connection_type = (
        http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    )
    try:
        connection = connection_type(url.hostname, url.port, timeout=TIMEOUT)
        connection.request(
            "POST",
            path,
            body=raw,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        body = response.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        return _block(raw, f"the loopwarden server at {url.netloc} cannot be reached ({exc})")
    if response.status == 200:
        if body:
            sys.stdout.write(body + "\n")
        return 0
    if response.status == 500:  # a failure after the tool ran, at a session start or a stop
        sys.stderr.write(body if body.endswith("\n") else body + "\n")
        return 1
    return _block(raw, f"the loopwarden server answered HTTP {response.status}: {body[:200]}")
