"""The operator's direct access to a data home: open the store with the home's keys, act, close."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from loopwarden.errors import KeyFileError, NotFound
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.log.keys import Keyring, KeyStore
from loopwarden.kernel.log.rotations import Trust, directory_trust
from loopwarden.kernel.sql.location import Location
from loopwarden.kernel.store.homes import (
    DB_NAME,
    home_source,
    private_dir,
    resolve_home,
    store_source,
)
from loopwarden.kernel.store.reader import Reader
from loopwarden.kernel.store.store import Store, snapshot
from loopwarden.kinds import KINDS
from loopwarden.principals import Principal

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


def existing_store(home: str | Path | None, store: str | None) -> tuple[Path, Location]:
    """The home and the store of a command that acts on what exists: creates nothing.

    The home's SQLite file must exist (`existing_home`); a SQLite file named by --store must
    exist. For a PostgreSQL store the home must hold the keys (every replica's and the admin
    CLI's signing key and integrity secret live there); the store itself must exist too, which
    `Store.open(create=False)` and `snapshot` check. `NotFound` otherwise."""
    path = home_source(home)[0]
    location, source = store_source(store, path)
    if source == "home":
        return existing_home(home), location
    if location.file is not None and not location.file.is_file():
        raise NotFound(f"there is no loopwarden database at {location} (given by {source})")
    if location.file is None and not (path / "keys").is_dir():
        raise NotFound(
            f"there are no keys in {path}: a {location.backend.title} store is used with the home "
            "that holds its keys (--home, or $LOOPWARDEN_HOME)"
        )
    return path, location


@asynccontextmanager
async def open_store(
    home: str | Path | None,
    *,
    store: str | None = None,
    check: bool = True,
    create: bool = True,
) -> AsyncIterator[Store]:
    """The store (`--store`, else $LOOPWARDEN_STORE, else `home`'s file) with `home`'s keys,
    opened for writing (and closed after). With `create` false it must exist already
    (`existing_store`), and nothing is created."""
    if create:
        path = resolve_home(home)
        location = store_source(store, path)[0]
    else:
        path, location = existing_store(home, store)
    keys = KeyStore(path)
    opened = await Store.open(
        location,
        keys.load_signer(),
        keyring=keys.keyring(),
        key_dir=path,
        check=check,
        create=create,
        kinds=KINDS,
    )
    try:
        yield opened
    finally:
        await opened.close()


@contextmanager
def open_reader(home: str | Path | None, *, store: str | None = None) -> Iterator[Reader]:
    """A read-only snapshot of the store, for audits (works while servers run)."""
    path = home_source(home)[0]
    location, source = store_source(store, path)
    if source == "home":
        existing_home(home)
    with snapshot(location) as reader:
        yield reader


def keyring_of(home: str | Path | None) -> Keyring:
    """The keys `home`'s key directory vouches for (none if it has none; creates nothing)."""
    return trust_of(home).keyring


def trust_of(home: str | Path | None, anchor: str | None = None) -> Trust:
    """What `home`'s key directory vouches for, for a store anchoring the genesis statement
    `anchor` (`Reader.key_anchor`): its key history's chain (`rotations`)."""
    return directory_trust(KeyStore(home_source(home)[0]), anchor)


def integrity_of(home: str | Path | None) -> Integrity | None:
    """The home's integrity secret, for an audit to check MACs with; `None` if it has none
    (an audit of a copied database without its key directory). Creates nothing."""
    try:
        return Integrity(KeyStore(home_source(home)[0]).load_secret(create=False))
    except KeyFileError:
        return None
