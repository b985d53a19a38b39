"""The Anthropic Messages API (`/model/anthropic/v1/messages`, streaming or not; `count_tokens`
and `models` pass through): usage from `message_start` and `message_delta`, cache creation and
cache read tokens included."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loopwarden.model_gateway.providers import (
    MODELS,
    BadRequest,
    Route,
    Shape,
    bearer,
    json_bytes,
    positive,
)
from loopwarden.model_gateway.usage import UsageReader, count

_ERRORS = {
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "invalid_request": "invalid_request_error",
    "too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "quota": "permission_error",
    "upstream": "api_error",
    "unavailable": "overloaded_error",
}


class MessagesUsage(UsageReader):
    def _take(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        c = self.counts
        c.seen = True
        # message_start carries the input side; message_delta the output so far (and, lately,
        # the input side again): each figure is cumulative, the latest wins
        if "input_tokens" in usage:
            c.input_tokens = count(usage.get("input_tokens"))
        if "cache_creation_input_tokens" in usage:
            c.cache_write_tokens = count(usage.get("cache_creation_input_tokens"))
        if "cache_read_input_tokens" in usage:
            c.cache_read_tokens = count(usage.get("cache_read_input_tokens"))
        if "output_tokens" in usage:
            c.output_tokens = max(c.output_tokens, count(usage.get("output_tokens")))

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            if isinstance(message, dict):
                self._take(message.get("usage"))
        elif kind == "message_delta":
            self._take(event.get("usage"))
            self.counts.complete = True

    def on_answer(self, answer: dict[str, Any]) -> None:
        self._take(answer.get("usage"))


class Anthropic:
    name = "anthropic"
    default_upstream = "https://api.anthropic.com"
    credential_headers = frozenset({"x-api-key", "authorization"})

    def route(self, method: str, path: str) -> Route | None:
        if method == "POST" and path == "/v1/messages":
            return Route("messages")
        if method == "POST" and path == "/v1/messages/count_tokens":
            return Route(None)
        if method == "GET" and MODELS.fullmatch(path):
            return Route(None)
        return None

    def credential(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
        return headers.get("x-api-key") or bearer(headers)

    def upstream_auth(self, key: str) -> dict[str, str]:
        return {"x-api-key": key}

    def shape(self, route: Route, raw: bytes, document: dict[str, Any]) -> Shape:
        model = document.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model: a model name is required")
        return Shape(
            model=model,
            max_output=positive(document.get("max_tokens")),
            answers=1,
            stream=document.get("stream") is True,
            held_context=False,
            body=raw,
        )

    def reader(self, route: Route, stream: bool) -> UsageReader:
        return MessagesUsage(stream)

    def error(self, status: int, kind: str, message: str) -> bytes:
        return json_bytes(
            {"type": "error", "error": {"type": _ERRORS.get(kind, "api_error"), "message": message}}
        )
