"""Verified bearer tokens, remembered: a repeat request skips the row read and the MAC check,
never the revocation and expiry checks.

An entry is kept under the token's SHA-256 hash (the clear token is never kept) with the
principal it admits, its expiry, and the *tokens version* it was verified under: a digest-free
summary of the tokens table (`Reader.tokens_version`: how many rows, how many revoked, the last
revocation) that every mint and every revocation changes, whoever writes it — this server, the
CLI, another replica on the same database. An entry admits its holder only while

- the clock (the store's, so tests inject one) is before the token's `expires_at`, checked on
  every use;
- the tokens version read for *this* request is the one it was verified under. The version is
  read per request, after the request arrived (so a revocation committed before it is seen, at
  once), but concurrent requests share one read (`Coalesced`): a burst of hook events costs one
  small read, not one token read and one MAC check each;

otherwise the token is verified against its row again, as on a first use. So a revoked or
expired token is refused on the first request after the revocation commits (or after it
expires), as without the cache; what the cache saves is the work on every other request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

import anyio
from mcp.server.auth.provider import AccessToken

T = TypeVar("T")
MAX_ENTRIES = 4096  # at most this many verified tokens kept; past it the cache starts afresh


class _Round(Generic[T]):
    """One shared read: its waiters, and its result or error once it is done."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        if self.value is None:
            raise RuntimeError("the shared read did not finish")
        return self.value


class Coalesced(Generic[T]):
    """`read()` for concurrent callers: each gets the result of a read that *began after it
    called*; callers arriving while a read is under way form the next round together, and one
    read answers them all. An error of a read is raised to every caller of its round."""

    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self._read = read
        self._forming: _Round[T] | None = None  # the round newcomers join (its read not begun)
        self._lock = anyio.Lock()  # held by the read under way
        self.reads = 0  # reads made so far (what coalescing saved, for tests and the bench)

    async def __call__(self) -> T:
        joined = self._forming
        if joined is not None:
            await joined.done.wait()
            return joined.result()
        current: _Round[T] = _Round()
        self._forming = current
        with anyio.CancelScope(shield=True):  # the others of this round wait for this read
            async with self._lock:  # after the read under way, whose waiters came earlier
                self._forming = None  # from here on, newcomers form the next round
                try:
                    self.reads += 1
                    current.value = await self._read()
                except Exception as exc:
                    current.error = exc
                finally:
                    current.done.set()
        return current.result()


@dataclass(frozen=True)
class Entry:
    access: AccessToken
    expires_at: datetime | None
    version: object

    def admits(self, now: datetime, version: object) -> bool:
        return version == self.version and (self.expires_at is None or now < self.expires_at)


class VerifiedTokens:
    """Verified tokens of one store, by token hash (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self.hits = 0

    def get(self, hashed: str, now: datetime, version: object) -> AccessToken | None:
        """The principal `hashed` admits, if it was verified under `version` and is unexpired
        at `now`; None means: verify it against its row."""
        entry = self._entries.get(hashed)
        if entry is None:
            return None
        if not entry.admits(now, version):
            del self._entries[hashed]
            return None
        self.hits += 1
        return entry.access

    def put(self, hashed: str, entry: Entry) -> None:
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[hashed] = entry

    def clear(self) -> None:
        self._entries.clear()
