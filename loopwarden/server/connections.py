"""Connection limits for the HTTP server: request-head and body read timeouts, and caps on the
connections one client address, and all of them together, may hold.

uvicorn has no request-head timeout: a client that sends part of a request head and then
nothing keeps its connection, descriptor and protocol object forever (`timeout_keep_alive` runs
only between requests, and any byte cancels it), so ~1,100 such connections used up a server's
descriptors (the usual soft limit is 1,024) and it accepted no one. Nor has it a cap per client
address (its `limit_concurrency` answers 503 to everyone alike). The alternatives do no better
at this: hypercorn's `read_timeout` restarts with every read, so a client sending one byte at a
time defeats it, and it has no per-address cap either. So this module keeps uvicorn and adds a
thin guard to its h11 protocol: h11 still parses every byte; the guard only arms timers on the
protocol object and counts connections.

- A connection must complete a request head within `header_seconds` of connecting (or of its
  previous response), and its body within `body_seconds` of the head; otherwise it is closed.
- One client address holds at most `per_address` connections, all together at most `total`
  (derived from the process's descriptor limit). A connection over a cap first evicts the
  oldest connection (of that address, or of any) that is still waiting for a request head or
  body; if every one is being served, the newcomer is answered 503 and closed. A client that
  sends its request promptly therefore always gets in, however many stalled ones are held.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("loopwarden.server")

RESERVED_DESCRIPTORS = 128  # for the store, logs and the listening socket
MAX_TOTAL = 100_000
BUSY = b"too many connections; retry shortly\n"
REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(BUSY), BUSY)
)


def connection_ceiling(per_address: int) -> int:
    """All connections together: the soft descriptor limit less a reserve (at least one
    address's worth)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_TOTAL
    return min(MAX_TOTAL, max(per_address, soft - RESERVED_DESCRIPTORS))


class ConnectionGuard:
    """The connections one server holds, oldest first, by client address."""

    def __init__(
        self, *, per_address: int, total: int, header_seconds: float, body_seconds: float
    ) -> None:
        self.per_address = per_address
        self.total = total
        self.timeouts = {"head": header_seconds, "body": body_seconds}
        self._all: dict[GuardedH11Protocol, None] = {}
        self._by_address: dict[str, dict[GuardedH11Protocol, None]] = {}
        self.counts = {"evicted": 0, "refused": 0, "timed_out": 0}

    def __len__(self) -> int:
        return len(self._all)

    def admit(self, conn: GuardedH11Protocol) -> bool:
        """Hold `conn`, evicting a waiting connection if a cap is reached; False if none could
        be evicted (every connection at the cap is being served)."""
        mine = self._by_address.get(conn.address, {})
        if len(mine) >= self.per_address and not self._evict(mine):
            return False
        if len(self._all) >= self.total and not self._evict(self._all):
            return False
        self._by_address.setdefault(conn.address, {})[conn] = None
        self._all[conn] = None
        return True

    def release(self, conn: GuardedH11Protocol) -> None:
        self._all.pop(conn, None)
        mine = self._by_address.get(conn.address)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._by_address[conn.address]

    def _evict(self, conns: dict[GuardedH11Protocol, None]) -> bool:
        for conn in conns:
            if conn.waiting is not None:
                self.counts["evicted"] += 1
                conn.drop()
                return True
        return False


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the guard's timers and caps (see the module docstring).
    Bind it to a guard with `guarded_protocol`."""

    guard: ClassVar[ConnectionGuard]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.address = self.client[0] if self.client else ""
        self.waiting: tuple[str, object] | None = None  # ("head" | "body", the cycle then)
        self._timer: asyncio.TimerHandle | None = None
        if not self.guard.admit(self):
            self.guard.counts["refused"] += 1
            transport.write(REFUSED)
            transport.close()
            return
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self.guard.release(self)
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def _watch(self) -> None:
        """(Re)arm the timer for what the connection now waits for: a request head, the rest
        of a body, or nothing while a request is being served."""
        if self.transport.is_closing():
            self._cancel()
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            want: tuple[str, object] | None = ("head", cycle)
        elif cycle.more_body:
            want = ("body", cycle)
        else:
            want = None
        now = self.waiting
        if want is not None and now is not None and want[0] == now[0] and want[1] is now[1]:
            return  # still waiting for the same thing: the deadline stands
        self._cancel()
        self.waiting = want
        if want is not None:
            self._timer = self.loop.call_later(self.guard.timeouts[want[0]], self._expired)

    def _expired(self) -> None:
        self._timer = None
        self.guard.counts["timed_out"] += 1
        self.drop()

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def drop(self) -> None:
        """Close the connection now (a timeout or an eviction); the request it was sending, if
        any, sees a disconnect."""
        self._cancel()
        self.waiting = None
        self.guard.release(self)
        if not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds each connection with, bound to `guard`."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})
