"""The per-server runtime the lifespan builds: the open store, the kernel, who is calling."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ValidationError

from loopwarden.clock import Clock, system_clock
from loopwarden.errors import LoopwardenError, StoreError, describe_validation
from loopwarden.ledger.keys import KeyStore
from loopwarden.ledger.store import Store
from loopwarden.principals import Principal
from loopwarden.server.auth import principal_from_token
from loopwarden.server.settings import Settings
from loopwarden.tools.kernel import Kernel

log = logging.getLogger("loopwarden.server")

R = TypeVar("R", bound=BaseModel)
Q = TypeVar("Q", bound=BaseModel)


@dataclass
class Runtime:
    settings: Settings
    clock: Clock = system_clock
    kernel: Kernel | None = field(default=None)

    def principal(self) -> Principal:
        if self.settings.auth:
            return principal_from_token()
        assert self.settings.principal is not None
        return self.settings.principal

    def require_kernel(self) -> Kernel:
        if self.kernel is None:
            raise ToolError("store_error: the server is starting or stopping; retry")
        return self.kernel

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Runtime]:
        """Open the store and keys for the server's lifetime; close them on shutdown."""
        keys = KeyStore(self.settings.home)
        signer = keys.load_signer()
        store = await Store.open(
            self.settings.db_path,
            signer,
            clock=self.clock,
            checkpoint_every=self.settings.checkpoint_every,
            synchronous=self.settings.synchronous,  # type: ignore[arg-type]
        )
        self.kernel = Kernel(store, keys.keyring())
        try:
            yield self
        finally:
            self.kernel = None
            await store.close()


async def invoke(
    runtime: Runtime,
    operation: Callable[[Kernel, Principal, Q], Awaitable[R]],
    request_type: type[Q],
    **arguments: Any,
) -> R:
    """Adapt one tool call: parse → principal → kernel operation → result.

    `LoopwardenError`s and invalid arguments become `ToolError` with `code: message`; a store
    failure is logged in full and reported briefly. Anything else propagates, and the SDK
    reduces it to a generic message (the traceback stays in the server log).
    """
    try:
        request = request_type.model_validate(arguments)
    except ValidationError as exc:
        raise ToolError(describe_validation(exc)) from None
    kernel = runtime.require_kernel()
    try:
        who = runtime.principal()
        return await operation(kernel, who, request)
    except StoreError as exc:
        log.error("store failure in %s: %s", operation.__name__, exc)
        raise ToolError(
            f"{exc.code}: the store could not complete the request; nothing was changed"
        ) from None
    except LoopwardenError as exc:
        raise ToolError(f"{exc.code}: {exc.message}") from None
