"""Shared fixtures: a real data home (key files + SQLite), a manual clock, principals, a store.

Backends: a module marked `pytestmark = pytest.mark.backends` runs each of its tests that use
`store` (or `backend`, `store_url`) on SQLite and on PostgreSQL — a real server, started once
per session (`pgserver.py`), each test in a fresh schema. Without one, the PostgreSQL cases skip
with one loud line; `LOOPWARDEN_TEST_PG=postgresql://…` points them at an existing server.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pgserver
import pytest

from loopwarden.clock import ManualClock
from loopwarden.ledger.integrity import Integrity
from loopwarden.ledger.keys import KeyStore
from loopwarden.ledger.store import Store
from loopwarden.principals import Principal

OPERATOR = Principal(id="alice", role="operator")
BUILDER = Principal(id="builder", role="agent")
REVIEWER = Principal(id="reviewer", role="agent")
STRANGER = Principal(id="mallory", role="agent")

BASIC_POLICY = {
    "agents": ["builder", "reviewer"],
    "tools": {
        "allow": ["fs.read", "fs.write", "tests.run", "git.diff"],
        "deny": ["git.push"],
        "approval": ["deploy.*"],
    },
    "budgets": {"max_turns": 20, "max_cost_usd": 5.0},
    "claims": {"lease_seconds": 900, "max_active": 4, "max_active_per_agent": 1, "max_attempts": 3},
    "stop": {"on_violation": "stop_loop", "repeated_failure_limit": 3},
    "todos": {"agents_may_add": True, "max_todos": 100},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


BACKENDS = ("sqlite", "postgresql")
_PG: dict[str, pgserver.PgServer | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "backends: run the module's store tests on SQLite and on PostgreSQL"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("backends"):
        metafunc.parametrize("backend", BACKENDS, indirect=True)


def postgres_server() -> pgserver.PgServer | None:
    """The session's PostgreSQL server, started on first use (None if none can be had)."""
    if "server" not in _PG:
        _PG["server"] = server = pgserver.start()
        if server is None:
            sys.stderr.write(
                "\n*** loopwarden: NO POSTGRESQL SERVER: the PostgreSQL cases are SKIPPED "
                f"(install the test extra, or set {pgserver.ENV}=postgresql://…) ***\n"
            )
    if _PG["server"] is None and os.environ.get("CI"):
        raise RuntimeError("CI must run the PostgreSQL tests, and no PostgreSQL server started")
    return _PG["server"]


def pytest_sessionfinish(session: pytest.Session) -> None:
    server = _PG.get("server")
    if server is not None and server.origin.startswith("$"):
        server.drop_schemas()  # an existing server keeps nothing of ours


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The store's backend: "sqlite" unless the module is marked `backends`."""
    return getattr(request, "param", "sqlite")


@pytest.fixture
def pg_url() -> str:
    """A fresh, empty PostgreSQL schema's store URL (skips if there is no server)."""
    server = postgres_server()
    if server is None:
        pytest.skip("no PostgreSQL server (see the line above)")
    return server.fresh_url()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    if report.when == "call":
        item.stash[PASSED] = report.passed
    return report


PASSED = pytest.StashKey[bool]()


@pytest.fixture
def store_url(backend: str, home: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """Where the test's store lives: the home's SQLite file, or a PostgreSQL schema — for the
    `store` fixture an emptied one (`PgServer.store_url`: a new store's tables cost ~80 ms),
    given back once the test has passed; else a fresh one."""
    if backend == "sqlite":
        yield str(home / "loopwarden.db")
        return
    if "store" not in request.fixturenames:
        yield request.getfixturevalue("pg_url")
        return
    server = postgres_server()
    if server is None:
        pytest.skip("no PostgreSQL server (see the line above)")
    url = server.store_url(Integrity(KeyStore(home).load_secret()))
    yield url
    if request.node.stash.get(PASSED, False):
        server.give_back(url)


@pytest.fixture
async def store(home: Path, clock: ManualClock, store_url: str) -> AsyncIterator[Store]:
    keys = KeyStore(home)
    signer = keys.load_signer()
    store = await Store.open(
        store_url,
        signer,
        keyring=keys.keyring(),
        key_dir=home,
        clock=clock,
        checkpoint_every=16,
    )
    try:
        yield store
    finally:
        await store.close()
