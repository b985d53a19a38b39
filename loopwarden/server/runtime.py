"""The per-server runtime the lifespan builds: the open store, and who is calling."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from loopwarden.auth.bearer import StoreTokenVerifier, principal_from_token
from loopwarden.clock import Clock, format_time, system_clock
from loopwarden.errors import StoreMissing, StoreUnavailable
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.log.rotations import follow
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
from loopwarden.observe import NOBODY, Observer
from loopwarden.principals import Principal
from loopwarden.server.chores import every
from loopwarden.server.settings import Settings, makes_no_store

if TYPE_CHECKING:
    from loopwarden.auth.oauth import JwtVerifier

log = logging.getLogger("loopwarden.server")

KEY_POLL_SECONDS = 1.0
"""How often a server reads its home's key history (a rotation's grace must be longer)."""


@dataclass
class Runtime:
    settings: Settings
    clock: Clock = system_clock
    store: Store | None = field(default=None)
    jwts: JwtVerifier | None = None  # OAuth: the access-token verifier (`oauth.py`)
    observer: Observer = NOBODY  # spans and metrics of every call (`observe/`)
    tokens: StoreTokenVerifier = field(init=False)  # every route's static-token verifier
    missing: str | None = field(default=None, init=False)  # why there is no store, if none
    gateway: Any = None  # the MCP gateway (`mcp_gateway/proxy.Gateway`) when `--gateway` is on
    _keys_seen: tuple[int, ...] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.tokens = StoreTokenVerifier(lambda: self.store)

    def principal(self) -> Principal:
        """Over HTTP the verified bearer token's principal; otherwise the launch configuration's."""
        if self.settings.auth:
            return principal_from_token()
        assert self.settings.principal is not None
        return self.settings.principal

    def require_store(self) -> Store:
        if self.store is None:
            if self.missing is not None:
                raise StoreMissing(self.missing)
            raise StoreUnavailable("the server is starting or stopping; retry")
        return self.store

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Runtime]:
        """Open the store and keys for the server's lifetime; close them on shutdown.

        A server speaking for an agent over stdio does not make a SQLite store that is not
        there (`settings.makes_no_store`): a mistyped `--home` or `LOOPWARDEN_HOME` would give
        the agent an empty store that answers every loop `not_found`. It runs without one, logs
        why, and answers every call with that message (`require_store`); `loopwarden loop open`
        makes a store. An operator's server, or one over HTTP, makes it (and logs that)."""
        where = self.settings.location
        absent = where.file is not None and not where.file.exists()
        if makes_no_store(self.settings):
            self.missing = (
                f"there is no loopwarden store at {where.file} (is --home or LOOPWARDEN_HOME "
                "mistyped?): open a loop there first (`loopwarden loop open --home "
                f"{self.settings.home} …`), or start the server with the home that holds your "
                "loops; then restart it"
            )
            log.error("%s", self.missing)
            try:
                yield self
            finally:
                self.observer.shutdown()
            return
        if absent:
            log.warning("there was no store at %s: a new, empty one is made", where.file)
        keys = KeyStore(self.settings.home)
        self.store = store = await self._opened(keys)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(
                    every, KEY_POLL_SECONDS, lambda: self.follow_keys(keys), "key watch"
                )
                try:
                    yield self
                finally:
                    group.cancel_scope.cancel()
        finally:
            self.store = None
            await store.close()
            self.observer.shutdown()  # what is still queued for export, within its timeout

    async def _opened(self, keys: KeyStore) -> Store:
        """The store opened with the home's keys, watched by this server's observer."""
        store = await Store.open(
            self.settings.location,
            keys.load_signer(),
            keyring=keys.keyring(),
            key_dir=self.settings.home,
            clock=self.clock,
            checkpoint_every=self.settings.checkpoint_every,
            synchronous=self.settings.synchronous,
            kinds=KINDS,
        )
        store.observer = self.observer
        self.observer.gauge(
            "writer_queue_depth",
            "Write calls waiting for the store's writer thread (not yet in a commit).",
            store.queue_depth,
        )
        self.observer.gauge(
            "pending_receipts",
            "Receipts sealed into their loops' chains and waiting for their Merkle leaves, as "
            "this replica's integrator last counted them (always 0 on SQLite).",
            store.pending_backlog,
        )
        return store

    async def follow_keys(self, keys: KeyStore) -> None:
        """One look at the key history (`rotations.follow`): sign with the home's new key once
        a rotation hands over to it, and never past the time the history retires the old one."""
        store = self.store
        if store is None:
            return
        seen = _stamp(keys)
        if seen == self._keys_seen and keys.active_id() == store.signer.key_id:
            return  # nothing in the key directory moved: the last look still holds
        tenure = await anyio.to_thread.run_sync(follow, keys, store.signer)
        self._keys_seen = seen
        if (tenure.signer.key_id, tenure.until) != (store.signer.key_id, store.signs_until):
            if tenure.signer.key_id != store.signer.key_id:
                log.warning("signing with the rotated-in key %s", tenure.signer.key_id)
            elif tenure.until is not None:
                log.warning(
                    "signing key %s is retired: it signs nothing after %s",
                    tenure.signer.key_id,
                    format_time(tenure.until),
                )
            store.sign_with(tenure)


def _stamp(keys: KeyStore) -> tuple[int, ...] | None:
    """When the key directory and its history last changed, and the history's size: a look at
    the key history is needed only when this moves (or a switch is still pending)."""
    try:
        directory, history = keys.dir.stat(), keys.history.stat()
    except FileNotFoundError:
        return None
    return (directory.st_mtime_ns, history.st_mtime_ns, history.st_size, history.st_ino)
