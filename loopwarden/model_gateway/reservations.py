"""What calls in flight hold: each admitted call's reservation, per loop and per pool, until it
ends and is charged what it used.

Kept by the server process (a call's reservation lives exactly as long as its request), and
read and changed only inside the write transactions that admit and settle calls, so that an
admission sees every reservation made before it. Several server processes sharing one store
each hold their own: across N processes, the calls in flight of the others are not seen, and
the bound on a budget's overshoot is N times one process's (docs/model-gateway.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from loopwarden.policy.budgets import Totals


def loop_scope(loop_id: str) -> str:
    return "loop:" + loop_id


def pool_scope(name: str) -> str:
    return "pool:" + name


class Reservations:
    """The reservations of calls in flight, by call id (each held on several scopes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, tuple[tuple[str, ...], Totals]] = {}
        self._held: dict[str, Totals] = {}

    def held(self, scope: str) -> Totals:
        """What calls in flight hold on `scope` (a loop's or a pool's)."""
        with self._lock:
            return self._held.get(scope, Totals())

    def hold(self, call_id: str, scopes: Iterable[str], reserve: Totals) -> None:
        """Hold `reserve` for `call_id` on every scope (replacing what it held: a transaction
        run again holds once)."""
        with self._lock:
            self._drop(call_id)
            names = tuple(scopes)
            self._calls[call_id] = (names, reserve)
            for scope in names:
                self._held[scope] = self._held.get(scope, Totals()).plus(reserve)

    def release(self, call_id: str) -> None:
        """Give back what `call_id` held (nothing if it holds nothing)."""
        with self._lock:
            self._drop(call_id)

    def _drop(self, call_id: str) -> None:
        found = self._calls.pop(call_id, None)
        if found is None:
            return
        scopes, reserve = found
        for scope in scopes:
            left = self._held.get(scope, Totals()).minus(reserve)
            if left == Totals():
                self._held.pop(scope, None)
            else:
                self._held[scope] = left

    def scopes(self) -> list[str]:
        """Every scope calls in flight hold something on."""
        with self._lock:
            return list(self._held)

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)
