"""Shared fixtures: a real data home (key files + SQLite), a manual clock, principals, a store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopwarden.clock import ManualClock
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


@pytest.fixture
async def store(home: Path, clock: ManualClock) -> AsyncIterator[Store]:
    keys = KeyStore(home)
    signer = keys.load_signer()
    store = await Store.open(
        home / "loopwarden.db", signer, keyring=keys.keyring(), clock=clock, checkpoint_every=16
    )
    try:
        yield store
    finally:
        await store.close()
