"""Where a store lives: a SQLite file, or a PostgreSQL database, named by a store URL.

`sqlite:///PATH` (or a plain path) is a SQLite file — everything after the third slash is the
path, so an absolute one gives four (`sqlite:////var/lib/lw.db`), as in SQLAlchemy, and a
relative one is taken from the working directory; `postgresql://…` (or `postgres://…`) is a
PostgreSQL database, in libpq's URL form (`postgresql://USER:PASSWORD@HOST:PORT/DB?…`).
Anything else is refused by name, so a mistyped URL never becomes a file of that name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from loopwarden.errors import InvalidInput

Backend = Literal["sqlite", "postgresql"]
STORE_ENV = "LOOPWARDEN_STORE"
"""The environment variable naming the store for every command (a child process gets its store
this way too, so that a password in a URL never shows on a command line)."""
SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")


@dataclass(frozen=True)
class Location:
    """A parsed store URL: which backend, and its file path or connection URL."""

    backend: Backend
    target: str

    @property
    def path(self) -> Path:
        """The SQLite file (only for a SQLite location)."""
        assert self.backend == "sqlite", "a PostgreSQL store has no file"
        return Path(self.target)

    @property
    def url(self) -> str:
        """The store URL that names this location again (`--store`)."""
        return self.target if self.backend == "postgresql" else f"{SQLITE_PREFIX}{self.target}"

    def __str__(self) -> str:
        """For messages: the file path, or the URL without its password."""
        return self.target if self.backend == "sqlite" else redact(self.target)


def redact(url: str) -> str:
    """A PostgreSQL URL with its password (in the authority or a `password=` parameter) hidden."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    query = "&".join(
        "password=***" if item.lower().startswith("password=") else item
        for item in parts.query.split("&")
        if item
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def parse_location(value: str | Path | Location) -> Location:
    """A `Location` from a store URL or a path; `InvalidInput` for an unknown scheme."""
    if isinstance(value, Location):
        return value
    if isinstance(value, Path):
        return Location("sqlite", str(value))
    text = value.strip()
    if text.startswith(POSTGRES_PREFIXES):
        return Location("postgresql", text)
    if text.startswith(SQLITE_PREFIX):
        path = text[len(SQLITE_PREFIX) :]
        if not path:
            raise InvalidInput(f"a SQLite store URL is sqlite:///PATH; {text!r} names no file")
        return Location("sqlite", str(Path(path).expanduser().resolve()))
    if "://" in text or text.startswith("sqlite:"):
        scheme = text.split("://", 1)[0]
        raise InvalidInput(
            f"unknown store URL scheme {scheme!r}: use sqlite:///PATH or postgresql://…"
        )
    if not text:
        raise InvalidInput("the store URL is empty")
    return Location("sqlite", str(Path(text).expanduser().resolve()))
