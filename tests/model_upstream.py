"""A scripted model upstream on loopback: the Anthropic, OpenAI and Gemini APIs' shapes, with
known usage, for the model gateway's tests and bench.

`ScriptedUpstream` serves in a thread (`with ScriptedUpstream() as up:`), answers every model
call with `up.usage` (its figures are what receipts must charge), and records every request it
got (path, headers, body) so that tests see what reached the provider. `up.mode` scripts how
the next calls go: `ok`; `error` (a 500 in the provider's shape, no usage); `stall` (headers,
then silence until `up.release` is set or the bound passes); `drop` (a stream cut after its
first events, the connection closed without its end). Streams send `up.pieces` text deltas.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STALL_BOUND = 30.0  # seconds a stalled answer waits at most


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Usage:
    input: int = 1200
    output: int = 345
    cache_write: int = 100
    cache_read: int = 2000


@dataclass
class ScriptedUpstream:
    key: str = "sk-test-upstream-key"
    usage: Usage = field(default_factory=Usage)
    mode: str = "ok"
    pieces: int = 3
    delay: float = 0.0  # seconds between streamed events
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        upstream = self

        class Handler(_Handler):
            script = upstream

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> ScriptedUpstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def calls(self) -> list[Seen]:
        """The model calls it got (not model listings or token counts)."""
        with self.lock:
            return [s for s in self.seen if s.method == "POST" and "count" not in s.path.lower()]


class _Handler(BaseHTTPRequestHandler):
    script: ScriptedUpstream
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small writes go at once (no 40 ms delayed-ACK stalls)

    def log_message(self, format: str, *args: Any) -> None:
        return

    # --- plumbing ----------------------------------------------------------------------------

    def _body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _json(self, status: int, document: object) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        if self.script.delay:
            time.sleep(self.script.delay)

    def _event(self, document: object, name: str | None = None) -> None:
        head = f"event: {name}\n".encode() if name else b""
        self._chunk(head + b"data: " + json.dumps(document).encode() + b"\n\n")

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _drop(self) -> None:
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    def _authorized(self) -> bool:
        key = self.script.key
        given = (
            self.headers.get("x-api-key")
            or self.headers.get("x-goog-api-key")
            or (self.headers.get("authorization") or "").removeprefix("Bearer ")
        )
        return given == key

    # --- the APIs ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._record(b"")
        if not self._authorized():
            self._json(401, {"error": "bad key"})
            return
        if "/models" in self.path:
            model = {"id": "claude-sonnet-4-5", "type": "model", "display_name": "Sonnet",
                     "created_at": "2025-01-01T00:00:00Z", "object": "model", "owned_by": "x",
                     "name": "models/gemini-2.5-flash"}  # fmt: skip
            self._json(200, {"data": [model], "has_more": False, "first_id": "claude-sonnet-4-5",
                             "last_id": "claude-sonnet-4-5", "object": "list",
                             "models": [model]})  # fmt: skip
            return
        self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = self._body()
        self._record(body)
        if not self._authorized():
            self._json(401, {"error": {"type": "authentication_error", "message": "bad key"}})
            return
        path = self.path.split("?")[0]
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        mode = self.script.mode
        if path.endswith("/count_tokens") or path.endswith(":countTokens"):
            self._json(200, {"input_tokens": 42, "totalTokens": 42})
            return
        if mode == "error":
            self._json(500, {"error": {"type": "api_error", "message": "scripted failure"}})
            return
        if mode == "stall":
            self._start_stream()
            self.script.release.wait(STALL_BOUND)
            self._end_stream()
            return
        if path == "/v1/messages":
            self._anthropic(request)
        elif path == "/v1/responses":
            self._responses(request)
        elif path == "/v1/chat/completions":
            self._chat(request)
        elif (found := re.match(r"^/v1(beta)?/models/([^:]+):(\w+)$", path)) is not None:
            self._gemini(found.group(2), found.group(3) == "streamGenerateContent")
        else:
            self._json(404, {"error": "no such path"})

    def _record(self, body: bytes) -> None:
        seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        with self.script.lock:
            self.script.seen.append(seen)

    def _texts(self) -> list[str]:
        return [f"part{i} " for i in range(self.script.pieces)]

    def _anthropic(self, request: dict[str, Any]) -> None:
        u, model = self.script.usage, request.get("model", "?")
        usage = {"input_tokens": u.input, "output_tokens": u.output,
                 "cache_creation_input_tokens": u.cache_write, "cache_read_input_tokens": u.cache_read}  # fmt: skip
        if not request.get("stream"):
            self._json(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
                             "content": [{"type": "text", "text": "".join(self._texts())}],
                             "stop_reason": "end_turn", "stop_sequence": None, "usage": usage})  # fmt: skip
            return
        self._start_stream()
        start = {**usage, "output_tokens": 1}
        self._event({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                     "role": "assistant", "model": model, "content": [], "stop_reason": None,
                     "stop_sequence": None, "usage": start}}, "message_start")  # fmt: skip
        self._event({"type": "content_block_start", "index": 0,
                     "content_block": {"type": "text", "text": ""}}, "content_block_start")  # fmt: skip
        for i, text in enumerate(self._texts()):
            if self.script.mode == "drop" and i == 1:
                self._drop()
                return
            self._event({"type": "content_block_delta", "index": 0,
                         "delta": {"type": "text_delta", "text": text}}, "content_block_delta")  # fmt: skip
        self._event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        self._event({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                     "usage": {"output_tokens": u.output}}, "message_delta")  # fmt: skip
        self._event({"type": "message_stop"}, "message_stop")
        self._end_stream()

    def _responses_usage(self) -> dict[str, Any]:
        u = self.script.usage
        return {"input_tokens": u.input + u.cache_read, "input_tokens_details": {"cached_tokens": u.cache_read},
                "output_tokens": u.output, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.input + u.cache_read + u.output}  # fmt: skip

    def _response(self, model: str, status: str, text: str, usage: Any) -> dict[str, Any]:
        return {"id": "resp_1", "object": "response", "created_at": 1, "status": status,
                "model": model, "error": None, "incomplete_details": None, "instructions": None,
                "metadata": {}, "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto",
                "tools": [], "top_p": 1.0,
                "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                            "content": [{"type": "output_text", "text": text, "annotations": []}]}]
                if text else [], "usage": usage}  # fmt: skip

    def _responses(self, request: dict[str, Any]) -> None:
        model = request.get("model", "?")
        text = "".join(self._texts())
        if not request.get("stream"):
            self._json(200, self._response(model, "completed", text, self._responses_usage()))
            return
        self._start_stream()
        self._event({"type": "response.created", "sequence_number": 0,
                     "response": self._response(model, "in_progress", "", None)}, "response.created")  # fmt: skip
        item = {
            "type": "message",
            "id": "msg_1",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self._event({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                     "item": item}, "response.output_item.added")  # fmt: skip
        part = {"type": "output_text", "text": "", "annotations": []}
        self._event({"type": "response.content_part.added", "sequence_number": 2, "item_id": "msg_1",
                     "output_index": 0, "content_index": 0, "part": part}, "response.content_part.added")  # fmt: skip
        for i, piece in enumerate(self._texts()):
            if self.script.mode == "drop" and i == 1:
                self._drop()
                return
            self._event({"type": "response.output_text.delta", "sequence_number": i + 3, "item_id": "msg_1",
                         "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []},
                        "response.output_text.delta")  # fmt: skip
        done = {"type": "output_text", "text": text, "annotations": []}
        self._event({"type": "response.output_text.done", "sequence_number": 90, "item_id": "msg_1",
                     "output_index": 0, "content_index": 0, "text": text, "logprobs": []},
                    "response.output_text.done")  # fmt: skip
        self._event({"type": "response.content_part.done", "sequence_number": 91, "item_id": "msg_1",
                     "output_index": 0, "content_index": 0, "part": done}, "response.content_part.done")  # fmt: skip
        whole = {**item, "status": "completed", "content": [done]}
        self._event({"type": "response.output_item.done", "sequence_number": 92, "output_index": 0,
                     "item": whole}, "response.output_item.done")  # fmt: skip
        self._event({"type": "response.completed", "sequence_number": 99,
                     "response": self._response(model, "completed", text, self._responses_usage())},
                    "response.completed")  # fmt: skip
        self._end_stream()

    def _chat(self, request: dict[str, Any]) -> None:
        u, model = self.script.usage, request.get("model", "?")
        usage = {"prompt_tokens": u.input + u.cache_read, "completion_tokens": u.output,
                 "total_tokens": u.input + u.cache_read + u.output,
                 "prompt_tokens_details": {"cached_tokens": u.cache_read}}  # fmt: skip
        if not request.get("stream"):
            self._json(200, {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
                             "choices": [{"index": 0, "message": {"role": "assistant",
                                          "content": "".join(self._texts())}, "finish_reason": "stop"}],
                             "usage": usage})  # fmt: skip
            return
        self._start_stream()

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip

        for i, piece in enumerate(self._texts()):
            if self.script.mode == "drop" and i == 1:
                self._drop()
                return
            self._event(chunk({"content": piece}, None))
        self._event(chunk({}, "stop"))
        if (request.get("stream_options") or {}).get("include_usage"):
            self._event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                         "model": model, "choices": [], "usage": usage})  # fmt: skip
        self._chunk(b"data: [DONE]\n\n")
        self._end_stream()

    def _gemini(self, model: str, stream: bool) -> None:
        u = self.script.usage
        usage = {"promptTokenCount": u.input + u.cache_read, "candidatesTokenCount": u.output,
                 "cachedContentTokenCount": u.cache_read, "totalTokenCount": u.input + u.cache_read + u.output}  # fmt: skip

        def answer(text: str, finish: str | None, meta: dict[str, Any]) -> dict[str, Any]:
            candidate: dict[str, Any] = {
                "content": {"role": "model", "parts": [{"text": text}]},
                "index": 0,
            }
            if finish:
                candidate["finishReason"] = finish
            return {"candidates": [candidate], "usageMetadata": meta, "modelVersion": model}

        if not stream:
            self._json(200, answer("".join(self._texts()), "STOP", usage))
            return
        self._start_stream()
        partial = {"promptTokenCount": u.input + u.cache_read, "cachedContentTokenCount": u.cache_read,
                   "totalTokenCount": u.input + u.cache_read}  # fmt: skip
        texts = self._texts()
        for i, piece in enumerate(texts):
            if self.script.mode == "drop" and i == 1:
                self._drop()
                return
            last = i == len(texts) - 1
            self._event(answer(piece, "STOP" if last else None, usage if last else partial))
        self._end_stream()
