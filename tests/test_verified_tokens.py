"""The server's verified-token cache (`auth/verified.py`) on a real store, both backends:
a repeat request is answered without the token's row, but a revocation or an expiry (by the
store's clock) refuses the very next request, as without the cache; concurrent requests share
one tokens-version read.

test_http.py checks the same over a real `serve --http` (revoked at once, by the CLI)."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest

from loopwarden.auth.bearer import StoreTokenVerifier
from loopwarden.auth.tokens import issue_token, revoke_token
from loopwarden.auth.verified import Coalesced
from loopwarden.principals import Principal

pytestmark = [pytest.mark.anyio, pytest.mark.backends]


class CountingReads:
    """The store's `read`, counted: how many reads a verification made."""

    def __init__(self, store):
        self.store = store
        self.reads = 0
        self._read = store.read

    async def read(self, fn, **given):
        self.reads += 1
        return await self._read(fn, **given)


async def mint(store, agent="builder", lifetime=None):
    return await store.write(lambda tx: issue_token(tx, Principal(id=agent), lifetime))


async def test_a_repeat_request_skips_the_token_row_but_is_still_checked(store, monkeypatch):
    issued = await mint(store)
    verifier = StoreTokenVerifier(lambda: store)
    counted = CountingReads(store)
    monkeypatch.setattr(store, "read", counted.read)
    first = await verifier.verify_token(issued.token)
    assert first is not None and first.client_id == "builder"
    assert counted.reads == 2  # the tokens version, then the token's row
    again = await verifier.verify_token(issued.token)
    assert again == first
    assert counted.reads == 3  # the tokens version only: the row and its MAC were skipped
    assert verifier._verified.hits == 1


async def test_a_revocation_refuses_the_next_request_of_a_cached_token(store):
    doomed, kept = await mint(store, "doomed"), await mint(store, "kept")
    verifier = StoreTokenVerifier(lambda: store)
    for issued in (doomed, kept):
        assert await verifier.verify_token(issued.token) is not None
    await store.write(lambda tx: revoke_token(tx, doomed.token_id))
    assert await verifier.verify_token(doomed.token) is None
    assert (await verifier.verify_token(kept.token)).client_id == "kept"


async def test_a_cached_token_is_refused_once_it_expires_by_the_stores_clock(store, clock):
    issued = await mint(store, lifetime=timedelta(minutes=5))
    verifier = StoreTokenVerifier(lambda: store)
    assert await verifier.verify_token(issued.token) is not None
    clock.advance(299)
    assert await verifier.verify_token(issued.token) is not None
    clock.advance(2)
    assert await verifier.verify_token(issued.token) is None


async def test_a_closed_store_or_a_failing_version_read_refuses_every_token(store, monkeypatch):
    issued = await mint(store)
    current = {"store": store}
    verifier = StoreTokenVerifier(lambda: current["store"])
    assert await verifier.verify_token(issued.token) is not None

    async def failing(fn, **given):
        raise OSError("disk gone")

    monkeypatch.setattr(store, "read", failing)
    assert await verifier.verify_token(issued.token) is None  # fails closed, cache or not
    current["store"] = None
    assert await verifier.verify_token(issued.token) is None


async def test_concurrent_callers_share_one_read_that_began_after_they_called():
    gate = anyio.Event()
    began = []

    async def read():
        began.append(len(began))
        await gate.wait()
        return len(began)

    shared = Coalesced(read)
    results: list[int] = []

    async def call():
        results.append(await shared())

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)  # starts read 1
        await anyio.wait_all_tasks_blocked()
        for _ in range(5):  # arrive while read 1 is under way: they form round 2 together
            tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        gate.set()
    assert shared.reads == 2
    assert sorted(results) == [1, 2, 2, 2, 2, 2]  # nobody got the read that began before it


async def test_an_error_of_a_shared_read_reaches_every_caller_of_its_round():
    async def read():
        await anyio.sleep(0)
        raise LookupError("no store")

    shared = Coalesced(read)
    errors: list[BaseException] = []

    async def call():
        try:
            await shared()
        except LookupError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(call)
    assert len(errors) == 3
