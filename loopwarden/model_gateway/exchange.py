"""The gateway's HTTP side: which request headers may go upstream and which answer headers
back, a request's body read within bounds (and inflated to be read), and the answers the gateway
gives itself in the provider's error shape (`Failed`)."""

from __future__ import annotations

import zlib

from starlette.types import Receive, Scope, Send

from loopwarden.model_gateway.providers import MAX_REQUEST

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
     "te", "trailer", "trailers", "transfer-encoding", "upgrade"}
)  # fmt: skip
NEVER_FORWARDED = HOP_BY_HOP | {
    "host", "content-length", "authorization", "x-api-key", "x-goog-api-key", "cookie",
    "accept-encoding", "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
}  # fmt: skip
"""Request headers the upstream never sees: hop-by-hop ones, every credential (the real key is
set instead), and what would redirect or unpack the answer."""
NEVER_RETURNED = HOP_BY_HOP | {"content-length", "set-cookie"}


class Failed(Exception):
    """A call answered by the gateway itself (status, error kind, message)."""

    def __init__(self, status: int, kind: str, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.retry_after = status, kind, message, retry_after


UNAUTHENTICATED = {
    "missing": "no loopwarden gateway token: put one where the provider key goes (loopwarden "
    "model token --agent NAME --loop ID mints one)",
    "unbound": "this is not a loopwarden gateway token (loopwarden model token --agent NAME "
    "--loop ID mints one; other loopwarden tokens are not taken here)",
    "unknown": "the loopwarden gateway token is not valid (unknown)",
    "revoked": "the loopwarden gateway token was revoked",
    "expired": "the loopwarden gateway token has expired",
    "forged": "the loopwarden gateway token is not valid",
}


class Gone(Exception):
    pass


def headers_of(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def decoded(raw: bytes, encoding: str) -> bytes:
    """A request body as its JSON text: gzip and deflate are undone (bounded), anything else
    but no encoding is refused (the gateway must read what it charges)."""
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "deflate"):
        raise Failed(415, "invalid_request", f"the gateway cannot read a body encoded {encoding!r}")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        text = inflater.decompress(raw, MAX_REQUEST)
    except zlib.error:
        raise Failed(400, "invalid_request", f"the body is not valid {encoding}") from None
    if inflater.unconsumed_tail:
        raise Failed(413, "too_large", f"the request is larger than {MAX_REQUEST} bytes")
    return text


async def read_body(scope: Scope, receive: Receive) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > MAX_REQUEST:
            raise Failed(413, "too_large", f"the request is larger than {MAX_REQUEST} bytes")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Gone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_REQUEST:
            raise Failed(413, "too_large", f"the request is larger than {MAX_REQUEST} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def reply(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    fields = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    fields += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": fields})
    await send({"type": "http.response.body", "body": body})
