"""The operator's direct access to a data home: open the store with the home's keys, act, close."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from loopwarden.errors import KeyFileError
from loopwarden.ledger.integrity import Integrity
from loopwarden.ledger.keys import Keyring, KeyStore
from loopwarden.ledger.reader import Reader
from loopwarden.ledger.store import Store, snapshot
from loopwarden.principals import Principal
from loopwarden.server.settings import DB_NAME, resolve_home

DEFAULT_OPERATOR = "operator"


def operator(name: str | None = None) -> Principal:
    """The CLI's principal: `--as NAME`, else `LOOPWARDEN_OPERATOR`, else `operator`."""
    return Principal(
        id=name or os.environ.get("LOOPWARDEN_OPERATOR") or DEFAULT_OPERATOR, role="operator"
    )


@asynccontextmanager
async def open_store(home: str | Path | None, *, check: bool = True) -> AsyncIterator[Store]:
    """The store and keys of `home`, opened for writing (and closed after)."""
    path = resolve_home(home)
    keys = KeyStore(path)
    store = await Store.open(
        path / DB_NAME, keys.load_signer(), keyring=keys.keyring(), check=check
    )
    try:
        yield store
    finally:
        await store.close()


@contextmanager
def open_reader(home: str | Path | None) -> Iterator[Reader]:
    """A read-only snapshot of `home`'s database, for audits (works while servers run)."""
    with snapshot(resolve_home(home) / DB_NAME) as reader:
        yield reader


def keyring_of(home: str | Path | None) -> Keyring:
    return KeyStore(resolve_home(home)).keyring()


def integrity_of(home: str | Path | None) -> Integrity | None:
    """The home's integrity secret, for an audit to check MACs with; `None` if it has none
    (an audit of a copied database without its key directory)."""
    try:
        return Integrity(KeyStore(resolve_home(home)).load_secret(create=False))
    except KeyFileError:
        return None
