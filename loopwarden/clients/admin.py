"""The operator's direct access to a data home: open the store with the home's keys, act, close."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from loopwarden.errors import KeyFileError, NotFound
from loopwarden.ledger.integrity import Integrity
from loopwarden.ledger.keys import Keyring, KeyStore
from loopwarden.ledger.reader import Reader
from loopwarden.ledger.store import Store, snapshot
from loopwarden.principals import Principal
from loopwarden.server.settings import DB_NAME, home_source, private_dir, resolve_home

DEFAULT_OPERATOR = "operator"


def operator(name: str | None = None) -> Principal:
    """The CLI's principal: `--as NAME`, else `LOOPWARDEN_OPERATOR`, else `operator`."""
    return Principal(
        id=name or os.environ.get("LOOPWARDEN_OPERATOR") or DEFAULT_OPERATOR, role="operator"
    )


SOURCES = {
    "--home": "given by --home",
    "LOOPWARDEN_HOME": "given by $LOOPWARDEN_HOME",
    "default": "the platform default",
}


def existing_home(home: str | Path | None) -> Path:
    """The data directory of a command that only reads: it must already hold a database.

    Raises `NotFound`, having created nothing (no directory, database or key), if it does not:
    a mistyped `--home` is an error, not a new empty store.
    """
    path, source = home_source(home)
    if not (path / DB_NAME).is_file():
        raise NotFound(
            f"there is no loopwarden database in {path} ({SOURCES[source]}); "
            "check --home or LOOPWARDEN_HOME ('loopwarden home' shows which home is used)"
        )
    private_dir(path)
    return path


@asynccontextmanager
async def open_store(
    home: str | Path | None, *, check: bool = True, create: bool = True
) -> AsyncIterator[Store]:
    """The store and keys of `home`, opened for writing (and closed after). With `create`
    false the home must already hold a database (`existing_home`)."""
    path = resolve_home(home) if create else existing_home(home)
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
    with snapshot(existing_home(home) / DB_NAME) as reader:
        yield reader


def keyring_of(home: str | Path | None) -> Keyring:
    """The public keys in `home`'s key directory (none if it has none; creates nothing)."""
    return KeyStore(home_source(home)[0]).keyring()


def integrity_of(home: str | Path | None) -> Integrity | None:
    """The home's integrity secret, for an audit to check MACs with; `None` if it has none
    (an audit of a copied database without its key directory). Creates nothing."""
    try:
        return Integrity(KeyStore(home_source(home)[0]).load_secret(create=False))
    except KeyFileError:
        return None
