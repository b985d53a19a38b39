"""The OpenAI Responses API and Chat Completions (`/model/openai/v1/responses`,
`/v1/chat/completions`, streaming or not; `models` passes through): usage from
`response.completed` (or `response.incomplete`/`response.failed`) and from a Chat Completions
answer's `usage`, which the gateway asks for on a stream whose client did not
(`stream_options.include_usage`; the only change it ever makes to a request body)."""

from __future__ import annotations

import json
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
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "permission": ("invalid_request_error", "model_not_allowed"),
    "not_found": ("invalid_request_error", "not_found"),
    "invalid_request": ("invalid_request_error", "invalid_request"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit": ("requests", "rate_limit_exceeded"),
    "quota": ("insufficient_quota", "insufficient_quota"),
    "upstream": ("server_error", "upstream_error"),
    "unavailable": ("server_error", "unavailable"),
}


def _details(usage: dict[str, Any], key: str) -> dict[str, Any]:
    details = usage.get(key)
    return details if isinstance(details, dict) else {}


class OpenAIUsage(UsageReader):
    def take(self, usage: Any) -> None:
        """Responses (`input_tokens`, `output_tokens`) or Chat Completions (`prompt_tokens`,
        `completion_tokens`) usage; cached input is read from the cache, the rest uncached."""
        if not isinstance(usage, dict):
            return
        c = self.counts
        if "input_tokens" in usage or "output_tokens" in usage:
            prompt = count(usage.get("input_tokens"))
            cached = count(_details(usage, "input_tokens_details").get("cached_tokens"))
            out = count(usage.get("output_tokens"))
        elif "prompt_tokens" in usage or "completion_tokens" in usage:
            prompt = count(usage.get("prompt_tokens"))
            cached = count(_details(usage, "prompt_tokens_details").get("cached_tokens"))
            out = count(usage.get("completion_tokens"))
        else:
            return
        c.seen = True
        c.cache_read_tokens = min(cached, prompt)
        c.input_tokens = prompt - c.cache_read_tokens
        c.output_tokens = out

    def on_event(self, event: dict[str, Any]) -> None:
        response = event.get("response")
        if isinstance(response, dict) and response.get("usage") is not None:
            self.take(response.get("usage"))  # response.completed / .incomplete / .failed
            self.counts.complete = self.counts.seen
        elif event.get("usage") is not None:
            self.take(event.get("usage"))  # a Chat Completions chunk (the last, when asked)
            self.counts.complete = self.counts.seen

    def on_answer(self, answer: dict[str, Any]) -> None:
        self.take(answer.get("usage"))


class OpenAI:
    name = "openai"
    default_upstream = "https://api.openai.com"
    credential_headers = frozenset({"authorization"})

    def route(self, method: str, path: str) -> Route | None:
        if method == "POST" and path == "/v1/responses":
            return Route("responses")
        if method == "POST" and path == "/v1/chat/completions":
            return Route("chat")
        if method == "GET" and MODELS.fullmatch(path):
            return Route(None)
        return None

    def credential(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
        return bearer(headers)

    def upstream_auth(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    def shape(self, route: Route, raw: bytes, document: dict[str, Any]) -> Shape:
        model = document.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model: a model name is required")
        stream = document.get("stream") is True
        body = raw
        if route.api == "chat":
            limit = positive(document.get("max_completion_tokens")) or positive(
                document.get("max_tokens")
            )
            answers = positive(document.get("n")) or 1
            held = False
            options = document.get("stream_options")
            if stream and not (isinstance(options, dict) and options.get("include_usage")):
                asked = dict(options) if isinstance(options, dict) else {}
                asked["include_usage"] = True
                body = json.dumps({**document, "stream_options": asked}).encode()
        else:
            limit = positive(document.get("max_output_tokens"))
            answers = 1
            held = bool(document.get("previous_response_id") or document.get("conversation"))
        return Shape(model, limit, answers, stream, held, body)

    def reader(self, route: Route, stream: bool) -> UsageReader:
        return OpenAIUsage(stream)

    def error(self, status: int, kind: str, message: str) -> bytes:
        kind_type, code = _ERRORS.get(kind, ("server_error", "error"))
        return json_bytes(
            {"error": {"message": message, "type": kind_type, "param": None, "code": code}}
        )
