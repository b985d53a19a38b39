"""One call through the model gateway: who calls, decided, forwarded, streamed back, charged.

`ModelGateway.serve` answers `/model/<provider>/<path>` as a plain ASGI application:

1. the provider and the path's route (`providers.py`): a model call, or a free call passed
   through (listing models, counting tokens); anything else is a 404 in the provider's shape;
2. the gateway token where the provider key goes (`credentials.py`), bound to one agent and
   one loop; the body, at most `MAX_REQUEST` bytes; the provider's key, held by loopwarden;
3. a model call is decided (`model_admit`) against a reservation of what it may spend at most
   (`reservation`); a refusal is answered in the provider's error shape (403 for what only an
   operator can change, 429 with `retry-after` when only calls in flight are in the way);
4. the request goes to the operator's upstream for that provider, its body byte for byte (but
   a Chat Completions stream, which is asked for its usage), every credential header replaced
   by the real key; the answer comes back chunk by chunk as it arrives, headers minus
   hop-by-hop ones, its usage read on the way (`usage.py`);
5. when the call ends, however it ends, what it spent is sealed and charged (`model_settle`),
   and its reservation is given back.

Nothing the request or the answer says is stored, logged or traced: the receipt has the body's
digest, the model, the usage, the price and the cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

import anyio
import httpx2
from starlette.types import Receive, Scope, Send

from loopwarden.errors import LoopwardenError, NotFound
from loopwarden.kernel.state.events import ModelSpend
from loopwarden.kernel.store.store import Store
from loopwarden.model_gateway.credentials import Bearer, GatewayTokens, KeyMissing, read_key
from loopwarden.model_gateway.gateway_config import GatewaySettings
from loopwarden.model_gateway.model_kinds import ModelPrice, Outcome, Source
from loopwarden.model_gateway.model_ops import (
    AdmitRequest,
    SettleRequest,
    model_admit,
    model_check,
    model_settle,
)
from loopwarden.model_gateway.prices import Price
from loopwarden.model_gateway.providers import (
    MAX_REQUEST,
    BadRequest,
    Provider,
    Route,
    Shape,
    registry,
)
from loopwarden.model_gateway.reservations import Reservations, loop_scope, pool_scope
from loopwarden.model_gateway.usage import Counts, UsageReader
from loopwarden.policy.budgets import MICRO

log = logging.getLogger("loopwarden.model_gateway")
PREFIX = "/model/"
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
BYTES_PER_TOKEN = 4
"""Output tokens an answer cut before its final usage is charged per this many bytes streamed
beyond what it had reported (an estimate; never less than the provider reported)."""


@dataclass
class Call:
    """One model call in flight: who, what, and what it holds."""

    bearer: Bearer
    provider: Provider
    route: Route
    shape: Shape
    price: Price | None
    reserve: ModelSpend
    call_id: str
    started: float
    digest: str


class Failed(Exception):
    """A call answered by the gateway itself (status, error kind, message)."""

    def __init__(self, status: int, kind: str, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.retry_after = status, kind, message, retry_after


def reservation(shape: Shape, price: Price | None) -> ModelSpend:
    """The most a call may spend: one call, its prompt's bound on every input-side budget, its
    output limit (the model's maximum if the request sets none) times the answers it asks for,
    and the worst cost of those (the prompt at the dearest input rate)."""
    bound = shape.prompt_bound()
    most = (shape.max_output or (price.max_output if price else 0)) * shape.answers
    if price is not None and shape.max_output is not None:
        most = min(shape.max_output, price.max_output) * shape.answers
    cost = price.worst_micros(bound, most) if price is not None else 0
    return ModelSpend(
        model_calls=1, input_tokens=bound, output_tokens=most, cache_write_tokens=bound,
        cache_read_tokens=bound, cost_usd=cost / MICRO,
    )  # fmt: skip


def charge_for(
    call: Call, counts: Counts, status: int, outcome: Outcome, streamed: int
) -> tuple[ModelSpend, Source, ModelPrice]:
    """What an ended call is charged, where that comes from, and at what rates (see
    `model_kinds.Source`)."""
    price = call.price
    assert price is not None
    rates = price.rates(counts.prompt_tokens if counts.seen else call.reserve.input_tokens)
    priced = ModelPrice(
        key=price.key, input=rates.input / MICRO, output=rates.output / MICRO,
        cache_write=rates.cache_write / MICRO, cache_read=rates.cache_read / MICRO,
    )  # fmt: skip
    answered = 1 if status else 0
    if counts.seen:
        out = counts.output_tokens
        if not counts.complete and status < 400:  # cut before its final figures
            out = max(out, -(-streamed // BYTES_PER_TOKEN))
        spend = ModelSpend(
            model_calls=answered, input_tokens=counts.input_tokens, output_tokens=out,
            cache_write_tokens=counts.cache_write_tokens, cache_read_tokens=counts.cache_read_tokens,
        )  # fmt: skip
        source: Source = "provider"
    elif status and status < 400:  # an answer that never said what it used: its worst case
        spend = ModelSpend(
            model_calls=1, input_tokens=call.reserve.input_tokens,
            output_tokens=call.reserve.output_tokens,
        )  # fmt: skip
        source = "reserved"
    else:
        spend, source = ModelSpend(model_calls=answered), "none"
    cost = priced.cost_micros(spend)
    return spend.model_copy(update={"cost_usd": cost / MICRO}), source, priced


class ModelGateway:
    """The model gateway of one server (see the module docstring). `store` returns the open
    store, or None while the server starts or stops."""

    def __init__(
        self,
        store: Callable[[], Store | None],
        settings: GatewaySettings,
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._store = store
        self.settings = settings
        self.providers = registry()
        self.reservations = Reservations()
        self._admitting: asyncio.Lock | None = None
        self._transport = transport
        self._client: httpx2.AsyncClient | None = None
        self._tokens: GatewayTokens | None = None

    def upstream(self, provider: Provider) -> str:
        return self.settings.upstreams.get(provider.name, provider.default_upstream).rstrip("/")

    def client(self) -> httpx2.AsyncClient:
        if self._client is None:
            timeout = httpx2.Timeout(
                connect=self.settings.connect_timeout, read=self.settings.idle_timeout,
                write=self.settings.idle_timeout, pool=self.settings.connect_timeout,
            )  # fmt: skip
            limits = httpx2.Limits(max_connections=512, max_keepalive_connections=64)
            self._client = httpx2.AsyncClient(
                timeout=timeout, limits=limits, trust_env=False, transport=self._transport
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # --- the request --------------------------------------------------------------------------

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one `/model/<provider>/<path>` request (the ASGI scope's path)."""
        name, _, rest = scope["path"][len(PREFIX) :].partition("/")
        provider = self.providers.get(name)
        if provider is None:
            body = json.dumps({"error": f"no model provider {name!r}"}).encode()
            await _reply(send, 404, body, {})
            return
        try:
            await self._serve(provider, "/" + rest, scope, receive, send)
        except Failed as failed:
            headers = {"retry-after": str(failed.retry_after)} if failed.retry_after else {}
            body = provider.error(failed.status, failed.kind, "loopwarden: " + failed.message)
            await _reply(send, failed.status, body, headers)
        except _Gone:
            return
        except Exception as exc:  # fail closed, never a traceback to the host
            log.error("model gateway call to %s failed unexpectedly", name, exc_info=exc)
            message = "loopwarden: the model gateway failed on this call (the server log says why)"
            await _reply(send, 500, provider.error(500, "upstream", message), {})

    async def _serve(
        self, provider: Provider, path: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        method = scope["method"]
        route = provider.route(method, path)
        if route is None:
            raise Failed(
                404, "not_found", f"the gateway does not serve {method} {path} for {provider.name}"
            )
        store = self._store()
        if store is None:
            raise Failed(503, "unavailable", "the server is starting or stopping; retry")
        headers = _headers(scope)
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        credential = provider.credential(headers, dict(query))
        if self._tokens is None or self._tokens.store is not store:
            self._tokens = GatewayTokens(store)
        remembered = self._tokens.remembered(credential) if route.api is not None else None
        if remembered is not None:  # confirmed by the tokens version the admission reads
            bearer, version = remembered
        else:
            found, why = await self._tokens.verify(credential)
            if found is None:
                raise Failed(
                    401, "authentication", _UNAUTHENTICATED.get(why, _UNAUTHENTICATED["unknown"])
                )
            bearer, version = found, ""
        raw = await _read_body(scope, receive)
        try:
            key = read_key(self.settings.home, provider.name)
        except KeyMissing as exc:
            log.error("model gateway: %s", exc)
            raise Failed(500, "upstream", str(exc)) from None
        query = [(k, v) for k, v in query if k != "key"]  # a credential, never forwarded
        if route.api is None:  # free: authenticated, forwarded, not charged
            await self._forward(
                method, provider, path, query, headers, raw, key, None, send, receive
            )
            return
        call = self._call(bearer, provider, route, raw, headers.get("content-encoding", ""))
        if call.shape.body is not raw:  # rewritten (a stream asked for its usage): plain JSON
            headers.pop("content-encoding", None)
        await self._admit(store, call, credential, version)
        try:
            await self._forward(
                method, provider, path, query, headers, call.shape.body, key, call, send, receive
            )
        finally:
            self.reservations.release(call.call_id)

    def _call(
        self, bearer: Bearer, provider: Provider, route: Route, raw: bytes, encoding: str
    ) -> Call:
        text = _decoded(raw, encoding.strip().lower())
        try:
            document = json.loads(text) if text else None
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise Failed(400, "invalid_request", "the request body is not a JSON object")
        try:
            shape = provider.shape(route, raw, document)
            if text is not raw:  # the prompt is bounded by what it says, not its compressed size
                shape = dataclasses.replace(shape, decoded_size=len(text))
        except BadRequest as exc:
            raise Failed(400, "invalid_request", str(exc)) from None
        price = self.settings.prices.price(shape.model)
        return Call(
            bearer=bearer, provider=provider, route=route, shape=shape, price=price,
            reserve=reservation(shape, price), call_id=secrets.token_hex(8),
            started=time.monotonic(), digest="sha256:" + hashlib.sha256(raw).hexdigest(),
        )  # fmt: skip

    async def _admit(self, store: Store, call: Call, credential: str | None, version: str) -> None:
        """Decide the call; hold its reservation, or raise the refusal's answer. `version`: the
        tokens version the caller's remembered token was verified under ("" if it was verified
        for this request): one the admission's snapshot does not share is verified again."""
        if self._admitting is None:
            self._admitting = asyncio.Lock()
        who, loop_id = call.bearer.principal, call.bearer.loop_id
        async with self._admitting:
            held = self.reservations
            request = AdmitRequest(
                provider=call.provider.name,
                api=call.route.api,
                model=call.shape.model[:128],
                stream=call.shape.stream,
                request_digest=call.digest,
                loop_id=loop_id,
                priced=call.price is not None,
                reserve=call.reserve,
                in_flight=ModelSpend.of(held.held(loop_scope(loop_id))),
                pools_in_flight={
                    scope[len("pool:") :]: ModelSpend.of(held.held(scope))
                    for scope in held.scopes()
                    if scope.startswith("pool:")
                },
            )
            try:  # a snapshot first: an admission seals nothing and need not wait to write
                admission = await model_check(store, who, request)
                if version and admission.tokens != version:
                    assert self._tokens is not None
                    found, why = await self._tokens.verify(credential)
                    if found is None or found != call.bearer:
                        message = _UNAUTHENTICATED.get(why, _UNAUTHENTICATED["unknown"])
                        raise Failed(401, "authentication", message)
                if not admission.admitted:  # decided again where its refusal is sealed
                    admission = await model_admit(store, who, request)
            except NotFound:
                if version and (await self._tokens_verify(credential)) != call.bearer:
                    raise Failed(401, "authentication", _UNAUTHENTICATED["unknown"]) from None
                with contextlib.suppress(LoopwardenError):  # an outsider's refusal, recorded
                    await model_admit(store, who, request)
                raise Failed(
                    403,
                    "permission",
                    f"loop {loop_id} does not exist or does not admit agent {who.id}: an "
                    "operator checks the loop's policy (agents) and the gateway token's loop",
                ) from None
            except LoopwardenError as exc:
                raise Failed(
                    503, "unavailable", f"the call could not be decided ({exc.code}); retry"
                ) from None
            if admission.admitted:
                scopes = [loop_scope(loop_id), *(pool_scope(p) for p in admission.pools)]
                held.hold(call.call_id, scopes, call.reserve.charge())
                return
        receipt = f" (receipt {admission.receipt_id})" if admission.receipt_id else ""
        if admission.retry:
            raise Failed(429, "rate_limit", admission.message + receipt, retry_after=2)
        raise Failed(403, "quota", admission.message + receipt)

    async def _tokens_verify(self, credential: str | None) -> Bearer | None:
        assert self._tokens is not None
        return (await self._tokens.verify(credential))[0]

    # --- upstream -----------------------------------------------------------------------------

    async def _forward(
        self,
        method: str,
        provider: Provider,
        path: str,
        query: list[tuple[str, str]],
        headers: dict[str, str],
        body: bytes,
        key: str,
        call: Call | None,
        send: Send,
        receive: Receive,
    ) -> None:
        """Send the request upstream and its answer back as it arrives; settle `call` (if a
        model call) however it ends."""
        url = self.upstream(provider) + path + ("?" + urlencode(query) if query else "")
        outgoing = {k: v for k, v in headers.items() if k not in NEVER_FORWARDED}
        outgoing.update(provider.upstream_auth(key))
        outgoing["accept-encoding"] = "identity"  # the gateway reads the answer's usage
        reader = provider.reader(call.route, call.shape.stream) if call is not None else None
        status, streamed = 0, 0
        outcome: Outcome = "unreachable"
        client = self.client()
        try:
            request = client.build_request(
                method, url, headers=outgoing, content=body if method == "POST" else None
            )
            try:
                response = await client.send(request, stream=True)
            except httpx2.TimeoutException:
                outcome = "timeout"
                raise Failed(
                    504, "upstream", f"the {provider.name} upstream did not answer in time"
                ) from None
            except httpx2.HTTPError:
                raise Failed(
                    502, "upstream", f"the {provider.name} upstream cannot be reached"
                ) from None
            status, outcome = response.status_code, "ok"
            try:
                returned = [
                    (k.lower().encode("latin-1"), v.encode("latin-1"))
                    for k, v in response.headers.multi_items()
                    if k.lower() not in NEVER_RETURNED
                ]
                await send({"type": "http.response.start", "status": status, "headers": returned})
                outcome, streamed = await self._stream(response, reader, send, receive)
                if outcome == "ok" and status >= 400:
                    outcome = "upstream_error"
            finally:
                await response.aclose()
        finally:
            if call is not None:
                counts = reader.finish() if reader is not None else Counts()
                with anyio.CancelScope(shield=True):
                    await self._settle(call, counts, status, outcome, streamed)

    async def _stream(
        self, response: httpx2.Response, reader: UsageReader | None, send: Send, receive: Receive
    ) -> tuple[Outcome, int]:
        """Pass the answer's bytes on as they come; (how it ended, bytes passed). A client that
        goes away mid-answer ends the call (its upstream request is closed)."""
        streamed = 0
        outcome: Outcome = "ok"
        finished = False
        gone = False

        async def watch(scope: anyio.CancelScope) -> None:
            nonlocal gone
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not finished:
                        gone = True
                        scope.cancel()
                    return

        async with anyio.create_task_group() as group:
            group.start_soon(watch, group.cancel_scope)
            try:
                async for chunk in response.aiter_raw():
                    if reader is not None:
                        reader.feed(chunk)
                    streamed += len(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                finished = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except httpx2.TimeoutException:  # the answer stays unfinished: the client sees it cut
                outcome, finished = "timeout", True
            except httpx2.HTTPError:
                outcome, finished = "upstream_cut", True
            except OSError:
                outcome = "client_gone"
            group.cancel_scope.cancel()
        if gone:
            outcome = "client_gone"
        return outcome, streamed

    async def _settle(
        self, call: Call, counts: Counts, status: int, outcome: Outcome, streamed: int
    ) -> None:
        store = self._store()
        if store is None or call.price is None:
            log.error("model gateway: a call ended while the store was closed; it is not charged")
            return
        spend, source, price = charge_for(call, counts, status, outcome, streamed)
        request = SettleRequest(
            loop_id=call.bearer.loop_id,
            provider=call.provider.name,
            api=call.route.api,
            model=call.shape.model[:128],
            stream=call.shape.stream,
            request_digest=call.digest,
            status=status,
            outcome=outcome,
            usage=spend,
            source=source,
            price=price,
            duration_ms=round((time.monotonic() - call.started) * 1000, 3),
        )
        try:
            await model_settle(store, call.bearer.principal, request)
        except Exception as exc:  # the answer is gone already: an operator must know
            log.error("model gateway: a call's charge could not be sealed", exc_info=exc)
            return
        tokens = {
            "input": spend.input_tokens, "output": spend.output_tokens,
            "cache_write": spend.cache_write_tokens, "cache_read": spend.cache_read_tokens,
        }  # fmt: skip
        store.observer.spent(call.provider.name, outcome, tokens, spend.cost_usd)


_UNAUTHENTICATED = {
    "missing": "no loopwarden gateway token: put one where the provider key goes (loopwarden "
    "model token --agent NAME --loop ID mints one)",
    "unbound": "this is not a loopwarden gateway token (loopwarden model token --agent NAME "
    "--loop ID mints one; other loopwarden tokens are not taken here)",
    "unknown": "the loopwarden gateway token is not valid (unknown)",
    "revoked": "the loopwarden gateway token was revoked",
    "expired": "the loopwarden gateway token has expired",
    "forged": "the loopwarden gateway token is not valid",
}


class _Gone(Exception):
    pass


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _decoded(raw: bytes, encoding: str) -> bytes:
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


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > MAX_REQUEST:
            raise Failed(413, "too_large", f"the request is larger than {MAX_REQUEST} bytes")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_REQUEST:
            raise Failed(413, "too_large", f"the request is larger than {MAX_REQUEST} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _reply(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    fields = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    fields += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": fields})
    await send({"type": "http.response.body", "body": body})


async def _end(send: Send) -> None:
    """End an answer whose upstream failed mid-way (the client sees a short answer)."""
    with contextlib.suppress(OSError):
        await send({"type": "http.response.body", "body": b"", "more_body": False})
