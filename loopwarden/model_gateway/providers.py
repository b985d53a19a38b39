"""The providers the gateway speaks for, one module each behind this small registry.

A provider says which of its API's paths the gateway serves (`route`), where a host puts its
credential (`credential`, which the gateway takes for a loopwarden gateway token and never
forwards), how the real key goes upstream (`upstream_auth`), what a call's request names (the
model, its output limit, whether it streams: `shape`), how usage is read out of its answers
(`reader`) and how it answers an error (`error`), so a host shows loopwarden's refusal as it
shows its provider's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from loopwarden.model_gateway.usage import UsageReader

MODELS = re.compile(r"/v1/models(/[A-Za-z0-9][A-Za-z0-9._:@-]{0,127})?")
"""The model listing paths (a model's id: no `/`, no `..` that would walk elsewhere)."""
MAX_REQUEST = 32 * 1024 * 1024
"""The largest request body the gateway forwards (a larger one is refused, 413)."""
PROMPT_SLACK = 1024
"""Tokens a provider may add to a request's prompt beyond its bytes (a tool-use system prompt)."""
HELD_CONTEXT = 400_000
"""The prompt bound of a request that refers to context the provider holds (a previous
response, a conversation, cached content): its body does not bound it."""


@dataclass(frozen=True)
class Route:
    """A path of a provider's API the gateway serves. `api`: the call's API when it is a
    model call (admitted, charged and sealed), None for a free one passed through for any
    valid token (listing models, counting tokens). `model`/`stream`: what the path says."""

    api: str | None
    model: str | None = None
    stream: bool | None = None


@dataclass(frozen=True)
class Shape:
    """What a model call's request says: its model, its output limit (None: the model's
    maximum), how many answers it asks for, whether it streams, whether it refers to context
    the provider holds, and the body to send (the client's bytes, but where the gateway must
    ask for usage on a stream)."""

    model: str
    max_output: int | None
    answers: int
    stream: bool
    held_context: bool
    body: bytes
    decoded_size: int | None = None  # a compressed body's size once inflated

    def prompt_bound(self) -> int:
        """The most prompt tokens this request can be (see `HELD_CONTEXT`, `PROMPT_SLACK`)."""
        size = self.decoded_size if self.decoded_size is not None else len(self.body)
        if self.held_context:
            return HELD_CONTEXT + size
        return size + PROMPT_SLACK


class BadRequest(ValueError):
    """A model call's request the gateway cannot read (not JSON, no model, …)."""


class Provider(Protocol):
    name: str
    default_upstream: str
    """The provider's public API base URL (an operator may configure another)."""
    credential_headers: frozenset[str]
    """Request headers that carry a credential: read for the gateway token, never forwarded."""

    def route(self, method: str, path: str) -> Route | None:
        """The route `path` (after `/model/<provider>`) is, or None (404)."""
        ...

    def credential(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
        """The credential the host presented where it puts its provider key."""
        ...

    def upstream_auth(self, key: str) -> dict[str, str]:
        """The headers that carry the real key upstream."""
        ...

    def shape(self, route: Route, raw: bytes, document: dict[str, Any]) -> Shape:
        """What a model call's request says; `BadRequest` if it names no model."""
        ...

    def reader(self, route: Route, stream: bool) -> UsageReader:
        """A reader of the usage in this call's answer."""
        ...

    def error(self, status: int, kind: str, message: str) -> bytes:
        """An error answer's body in the provider's own shape. `kind` is one of
        `authentication`, `permission`, `not_found`, `invalid_request`, `too_large`,
        `rate_limit`, `quota`, `upstream`, `unavailable`."""
        ...


def bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def json_bytes(document: object) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def positive(value: Any) -> int | None:
    """An output limit if `value` is a positive int, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
