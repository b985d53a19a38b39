"""Where a store lives, named by a store URL: the registered backend its scheme names
(`backends.py`), and its file path or connection URL.

`sqlite:///PATH` (or a plain path) is a SQLite file — everything after the third slash is the
path, so an absolute one gives four (`sqlite:////var/lib/lw.db`), as in SQLAlchemy, and a
relative one is taken from the working directory; `postgresql://…` (or `postgres://…`) is a
PostgreSQL database, in libpq's URL form (`postgresql://USER:PASSWORD@HOST:PORT/DB?…`).
Anything else is refused by name, so a mistyped URL never becomes a file of that name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from loopwarden.errors import InvalidInput
from loopwarden.kernel.sql.backends import BACKENDS, DEFAULT, BackendSpec

STORE_ENV = "LOOPWARDEN_STORE"
"""The environment variable naming the store for every command (a child process gets its store
this way too, so that a password in a URL never shows on a command line)."""


@dataclass(frozen=True)
class Location:
    """A parsed store URL: which backend, and its file path (a file backend) or its URL."""

    backend: BackendSpec
    target: str

    @property
    def file(self) -> Path | None:
        """The store's file, for a backend whose stores are files; None for a server's."""
        return Path(self.target) if self.backend.files else None

    @property
    def url(self) -> str:
        """The store URL that names this location again (`--store`)."""
        return f"{self.backend.schemes[0]}{self.target}" if self.backend.files else self.target

    @property
    def has_password(self) -> bool:
        """Whether the URL carries a password (which `str()` hides)."""
        return not self.backend.files and redact(self.target) != self.target

    def __str__(self) -> str:
        """For messages: the file path, or the URL without its password."""
        return self.target if self.backend.files else redact(self.target)


def redact(url: str) -> str:
    """A server URL with its password (in the authority or a `password=` parameter) hidden."""
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


def _file(backend: BackendSpec, path: str) -> Location:
    return Location(backend, str(Path(path).expanduser().resolve()))


def parse_location(value: str | Path | Location) -> Location:
    """A `Location` from a store URL or a path; `InvalidInput` for an unknown scheme."""
    if isinstance(value, Location):
        return value
    if isinstance(value, Path):
        return Location(DEFAULT, str(value))
    text = value.strip()
    for backend in BACKENDS:
        scheme = next((s for s in backend.schemes if text.startswith(s)), None)
        if scheme is None:
            continue
        if not backend.files:
            return Location(backend, text)
        if not text[len(scheme) :]:
            raise InvalidInput(
                f"a {backend.title} store URL is {backend.example}; {text!r} names no file"
            )
        return _file(backend, text[len(scheme) :])
    named = text.split(":", 1)[0]
    if "://" in text or any(named == s.split(":", 1)[0] for b in BACKENDS for s in b.schemes):
        scheme = text.split("://", 1)[0]
        raise InvalidInput(
            f"unknown store URL scheme {scheme!r}: use " + " or ".join(b.example for b in BACKENDS)
        )
    if not text:
        raise InvalidInput("the store URL is empty")
    return _file(DEFAULT, text)
