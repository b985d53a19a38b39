"""Shared fixtures: a real data home (key files + SQLite), a manual clock, principals, a store.

Backends: a module marked `pytestmark = pytest.mark.backends` runs each of its tests that use
`store` (or `backend`, `store_url`) on SQLite and on PostgreSQL — a real server, started once
per session (`pgserver.py`; under pytest-xdist by the controller, for every worker), each test
in a schema of its own (fresh, or for the `store` fixture one emptied). Without one, the PostgreSQL cases skip
with one loud line; `LOOPWARDEN_TEST_PG=postgresql://…` points them at an existing server.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pgserver
import pytest

from loopwarden.clock import ManualClock
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
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
def issuer() -> Iterator[Any]:
    """A plain OAuth issuer on loopback (`tests/issuer.py`), stopped afterwards; a module that
    needs clients or outages defines its own."""
    from issuer import Issuer

    found = Issuer().start()
    try:
        yield found
    finally:
        found.stop()


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
    _PG_SHARED["config"] = config


# Under pytest-xdist one server serves every worker: the controller starts it (on a thread, while
# the workers start) and tells each worker the file where it says where the server is.
_PG_SHARED: dict[str, Any] = {}
SHARED_KEY = "loopwarden_pg_file"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist, in the controller, for each worker
    if "file" not in _PG_SHARED:
        _PG_SHARED["file"] = Path(tempfile.mkdtemp(prefix="lw-pg-where-")) / "server.json"
        _PG_SHARED["thread"] = pgserver.announce(_PG_SHARED["file"])
    node.workerinput[SHARED_KEY] = str(_PG_SHARED["file"])


def pytest_unconfigure(config: pytest.Config) -> None:
    shared = _PG_SHARED.get("file")
    if shared is not None:
        shutil.rmtree(shared.parent, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The controller repeats a worker's loud line: a worker's stderr is not shown."""
    shared = _PG_SHARED.get("file")
    if shared is not None and pgserver.found(shared, timeout=0) is None:
        terminalreporter.write_line(NO_SERVER.strip(), red=True, bold=True)


NO_SERVER = (
    "\n*** loopwarden: NO POSTGRESQL SERVER: the PostgreSQL cases are SKIPPED "
    f"(install the test extra, or set {pgserver.ENV}=postgresql://…) ***\n"
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("backends"):
        metafunc.parametrize("backend", BACKENDS, indirect=True)


def postgres_server() -> pgserver.PgServer | None:
    """The session's PostgreSQL server, started on first use (None if none can be had); in a
    pytest-xdist worker, the one the controller started."""
    if "server" not in _PG:
        config = _PG_SHARED.get("config")
        shared = getattr(config, "workerinput", {}).get(SHARED_KEY)
        _PG["server"] = server = pgserver.found(Path(shared)) if shared else pgserver.start()
        if server is None:
            sys.stderr.write(NO_SERVER)
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
        kinds=KINDS,
    )
    try:
        yield store
    finally:
        await store.close()
