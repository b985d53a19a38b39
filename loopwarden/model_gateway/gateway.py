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
from collections.abc import Callable
from urllib.parse import parse_qsl, urlencode

import anyio
import httpx2
from starlette.types import Receive, Scope, Send

from loopwarden.errors import LoopwardenError, NotFound
from loopwarden.kernel.state.events import ModelSpend
from loopwarden.kernel.store.store import Store
from loopwarden.model_gateway.calls import Call, charge_for, reservation
from loopwarden.model_gateway.credentials import Bearer, GatewayTokens, KeyMissing, read_key
from loopwarden.model_gateway.exchange import (
    NEVER_FORWARDED,
    NEVER_RETURNED,
    UNAUTHENTICATED,
    Failed,
    Gone,
    decoded,
    headers_of,
    read_body,
    reply,
)
from loopwarden.model_gateway.gateway_config import GatewaySettings
from loopwarden.model_gateway.model_kinds import Outcome
from loopwarden.model_gateway.model_ops import (
    AdmitRequest,
    SettleRequest,
    model_admit,
    model_check,
    model_settle,
)
from loopwarden.model_gateway.provider_registry import registry
from loopwarden.model_gateway.providers import BadRequest, Provider, Route
from loopwarden.model_gateway.reservations import Reservations, loop_scope, pool_scope
from loopwarden.model_gateway.usage import Counts, UsageReader

log = logging.getLogger("loopwarden.model_gateway")
PREFIX = "/model/"
MAX_MODEL = 128  # characters of a model's name (a receipt's `model`)


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
            await reply(send, 404, body, {})
            return
        try:
            await self._serve(provider, "/" + rest, scope, receive, send)
        except Failed as failed:
            headers = {"retry-after": str(failed.retry_after)} if failed.retry_after else {}
            body = provider.error(failed.status, failed.kind, "loopwarden: " + failed.message)
            await reply(send, failed.status, body, headers)
        except Gone:
            return
        except Exception as exc:  # fail closed, never a traceback to the host
            log.error("model gateway call to %s failed unexpectedly", name, exc_info=exc)
            message = "loopwarden: the model gateway failed on this call (the server log says why)"
            await reply(send, 500, provider.error(500, "upstream", message), {})

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
        headers = headers_of(scope)
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
                    401, "authentication", UNAUTHENTICATED.get(why, UNAUTHENTICATED["unknown"])
                )
            bearer, version = found, ""
        raw = await read_body(scope, receive)
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
        try:
            call = self._call(bearer, provider, route, raw, headers.get("content-encoding", ""))
        except Failed:
            if version and (await self._tokens_verify(credential)) != bearer:
                raise Failed(401, "authentication", UNAUTHENTICATED["unknown"]) from None
            raise
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
        text = decoded(raw, encoding.strip().lower())
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
        if len(shape.model) > MAX_MODEL or not shape.model.isprintable():
            raise Failed(400, "invalid_request", f"model: a name of 1-{MAX_MODEL} characters")
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
                model=call.shape.model,
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
                        message = UNAUTHENTICATED.get(why, UNAUTHENTICATED["unknown"])
                        raise Failed(401, "authentication", message)
                if not admission.admitted:  # decided again where its refusal is sealed
                    admission = await model_admit(store, who, request)
            except NotFound:
                if version and (await self._tokens_verify(credential)) != call.bearer:
                    raise Failed(401, "authentication", UNAUTHENTICATED["unknown"]) from None
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
            model=call.shape.model,
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
