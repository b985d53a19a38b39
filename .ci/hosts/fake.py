"""A host's model API, faked on loopback: every request answered by the scenario's script in
that host's dialect, and written to a redacted request log.

The server binds 127.0.0.1 on a free port and serves one scenario; `stop` shuts it down within
its poll interval. The log keeps what a reader needs to see what the host sent — method, path,
headers, the conversation — and nothing secret: header values that carry credentials, any
string equal to the fake key, and object keys named like a credential are replaced by
`[redacted]`; long texts are cut and tool definitions are reduced to their names.
"""

from __future__ import annotations

import gzip
import http.server
import json
import re
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAKE_KEY = "fake-key-for-a-loopback-fake"  # what every host is given as its API key
TEXT_LIMIT = 600
SECRET_NAME = re.compile(r"api[-_]?key|authorization|cookie|password|secret|(^|[-_])token$", re.I)
REDACTED = "[redacted]"


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes
    summary: str  # what was answered, for the log


def json_reply(value: Any, summary: str, status: int = 200) -> Reply:
    return Reply(status, "application/json", json.dumps(value).encode(), summary)


def sse_reply(events: list[tuple[str | None, Any]], summary: str) -> Reply:
    """Server-sent events: `event:` lines where the dialect names its events, `data:` JSON."""
    chunks = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        chunks.append(f"{head}data: {json.dumps(data)}\n\n")
    return Reply(200, "text/event-stream", "".join(chunks).encode(), summary)


NOT_FOUND = Reply(404, "application/json", b'{"error": "not faked"}', "404")

Dialect = Callable[[str, dict[str, Any]], Reply]  # (path, JSON body) -> reply


def redact(value: Any, *, name: str = "") -> Any:
    """`value` with credentials replaced and long texts cut (see the module docstring)."""
    if name and SECRET_NAME.search(name) and isinstance(value, str | int):
        return REDACTED
    if isinstance(value, dict):
        if name == "tools" or "functionDeclarations" in value:
            return tool_names(value)
        return {k: redact(v, name=k) for k, v in value.items()}
    if isinstance(value, list):
        if name in ("tools", "functionDeclarations"):
            return tool_names(value)
        return [redact(v) for v in value]
    if isinstance(value, str):
        value = value.replace(FAKE_KEY, REDACTED)
        if len(value) > TEXT_LIMIT:
            return value[:TEXT_LIMIT] + f"…[{len(value)} chars]"
    return value


def tool_names(value: Any) -> list[str]:
    """A tool list (any dialect's) as the names it declares."""
    names: list[str] = []
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, dict):
            continue
        if "name" in item:
            names.append(str(item["name"]))
        for nested in ("functionDeclarations", "tools"):
            if isinstance(item.get(nested), list):
                names += [
                    f"{item.get('name', '')}/{n}".lstrip("/") for n in tool_names(item[nested])
                ]
    return names


def _decoded(raw: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    return raw


class FakeApi:
    """One scenario's fake model API on 127.0.0.1 (a free port), logging to `log_path`."""

    def __init__(self, dialect: Dialect, log_path: Path) -> None:
        self.dialect, self.log_path = dialect, log_path
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self.requests = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.2,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeApi:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> Reply:
        try:
            text = _decoded(raw, headers.get("content-encoding", "").lower())
            body: Any = json.loads(text) if text else None
        except ValueError:
            body = None
        try:
            # every model API call is a POST of a JSON object; anything else is not faked
            ok = method == "POST" and isinstance(body, dict)
            reply = self.dialect(path, body) if ok else NOT_FOUND
        except Exception as exc:  # a dialect bug: answered 500 and logged, never a hang
            reply = json_reply({"error": repr(exc)}, f"500: {exc!r}", status=500)
        self._log(method, path, headers, body, reply)
        return reply

    def _log(
        self, method: str, path: str, headers: dict[str, str], body: Any, reply: Reply
    ) -> None:
        entry = {
            "at_s": round(time.monotonic() - self.started, 3),
            "method": method,
            "path": path,
            "headers": {
                k: (REDACTED if SECRET_NAME.search(k) else redact(v)) for k, v in headers.items()
            },
            "body": redact(body),
            "answered": f"{reply.status} {reply.summary}",
        }
        with self._lock:
            self.requests += 1
            with self.log_path.open("a") as log:
                log.write(json.dumps(entry, ensure_ascii=False) + "\n")

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = fake.answer(self.command, self.path, headers, raw)
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = _serve

            def log_message(self, format: str, *args: Any) -> None:
                return  # the request log says it all

        return Handler
