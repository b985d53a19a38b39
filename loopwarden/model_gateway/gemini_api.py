"""The Gemini API (`/model/gemini/v1beta/models/<model>:generateContent` and
`:streamGenerateContent`, as server-sent events or a streamed JSON array; `countTokens` and
`models` pass through): usage from `usageMetadata` (thinking tokens are output, cached content
is read from the cache)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any

from loopwarden.model_gateway.providers import (
    BadRequest,
    Route,
    Shape,
    json_bytes,
    positive,
)
from loopwarden.model_gateway.usage import UsageReader, count

_CALL = re.compile(r"^/(v1beta|v1)/models/([A-Za-z0-9][A-Za-z0-9._@-]{0,127}):([A-Za-z]+)$")
_LIST = re.compile(r"^/(v1beta|v1)/models(/[A-Za-z0-9][A-Za-z0-9._@-]{0,127})?$")
_STATUS = {
    "authentication": (401, "UNAUTHENTICATED"),
    "permission": (403, "PERMISSION_DENIED"),
    "not_found": (404, "NOT_FOUND"),
    "invalid_request": (400, "INVALID_ARGUMENT"),
    "too_large": (413, "INVALID_ARGUMENT"),
    "rate_limit": (429, "RESOURCE_EXHAUSTED"),
    "quota": (403, "PERMISSION_DENIED"),
    "upstream": (502, "UNAVAILABLE"),
    "unavailable": (503, "UNAVAILABLE"),
}
_METADATA = re.compile(rb'"usageMetadata"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})')
_TAIL = 64 * 1024  # what a streamed JSON array reader keeps to find a figure split by a chunk


class GeminiUsage(UsageReader):
    """A stream comes as server-sent events (`alt=sse`, what the SDKs and the Gemini CLI ask
    for) or as one JSON array sent element by element: its first byte tells which."""

    def __init__(self, stream: bool) -> None:
        super().__init__(stream)
        self._array: bool | None = None if stream else False
        self._tail = b""

    def take(self, metadata: Any) -> None:
        if not isinstance(metadata, dict):
            return
        c = self.counts
        c.seen = True
        prompt = count(metadata.get("promptTokenCount")) + count(
            metadata.get("toolUsePromptTokenCount")
        )
        cached = min(count(metadata.get("cachedContentTokenCount")), prompt)
        c.cache_read_tokens = cached
        c.input_tokens = prompt - cached
        c.output_tokens = count(metadata.get("candidatesTokenCount")) + count(
            metadata.get("thoughtsTokenCount")
        )

    def feed(self, chunk: bytes) -> None:
        if self._array is None:
            start = chunk.lstrip()[:1]
            if not start:
                return
            self._array = start == b"["
        if not self._array:
            super().feed(chunk)
            return
        # a JSON array streamed element by element: the last usageMetadata seen is the latest
        text = self._tail + chunk
        finished = b'"finishReason"' in text  # a chunk boundary may split the name
        last = None
        for found in _METADATA.finditer(text):
            last = found
        if last is not None:
            with contextlib.suppress(ValueError):
                self.take(json.loads(last.group(1)))
            text = text[last.end() :]
        if finished:
            self.counts.complete = self.counts.seen
        self._tail = text[-_TAIL:]

    def on_event(self, event: dict[str, Any]) -> None:
        self.take(event.get("usageMetadata"))
        candidates = event.get("candidates")
        if isinstance(candidates, list) and any(
            isinstance(c, dict) and c.get("finishReason") for c in candidates
        ):
            self.counts.complete = self.counts.seen

    def on_answer(self, answer: dict[str, Any]) -> None:
        self.take(answer.get("usageMetadata"))


class Gemini:
    name = "gemini"
    default_upstream = "https://generativelanguage.googleapis.com"
    credential_headers = frozenset({"x-goog-api-key", "authorization"})

    def route(self, method: str, path: str) -> Route | None:
        call = _CALL.match(path)
        if call is not None and method == "POST":
            model, verb = call.group(2), call.group(3)
            if verb == "generateContent":
                return Route("generate", model=model, stream=False)
            if verb == "streamGenerateContent":
                return Route("generate", model=model, stream=True)
            if verb == "countTokens":
                return Route(None, model=model)
            return None
        if method == "GET" and _LIST.match(path):
            return Route(None)
        return None

    def credential(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
        value = headers.get("x-goog-api-key") or query.get("key")
        if value:
            return value
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        return token.strip() or None if scheme.lower() == "bearer" else None

    def upstream_auth(self, key: str) -> dict[str, str]:
        return {"x-goog-api-key": key}

    def shape(self, route: Route, raw: bytes, document: dict[str, Any]) -> Shape:
        if route.model is None:
            raise BadRequest("the path names no model")
        config = document.get("generationConfig")
        config = config if isinstance(config, dict) else {}
        return Shape(
            model=route.model,
            max_output=positive(config.get("maxOutputTokens")),
            answers=positive(config.get("candidateCount")) or 1,
            stream=bool(route.stream),
            held_context=bool(document.get("cachedContent")),
            body=raw,
        )

    def reader(self, route: Route, stream: bool) -> UsageReader:
        return GeminiUsage(stream)

    def error(self, status: int, kind: str, message: str) -> bytes:
        code, name = _STATUS.get(kind, (status, "UNKNOWN"))
        return json_bytes({"error": {"code": status or code, "message": message, "status": name}})
