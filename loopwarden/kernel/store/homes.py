"""Where a ledger lives: the data directory (its keys and, by default, its SQLite store) and the
store a command opens. Resolved once, from flags and environment, below every edge (the server,
the admin CLI and the hook process resolve them alike).

Data directory, for every command: `--home DIR`, else `LOOPWARDEN_HOME`, else the platform's
user data directory. It holds `keys/` (signing keys, the integrity secret) and, by default, the
store `loopwarden.db`, and is created 0700.

Store, for every command that opens one: `--store URL`, else `LOOPWARDEN_STORE`, else the
home's SQLite file (`storage/location.py`: `sqlite:///PATH` or `postgresql://…`). The keys
always come from the home, whichever store is used.
"""

from __future__ import annotations

import os
from pathlib import Path

from loopwarden.errors import InvalidInput
from loopwarden.kernel.sql.backends import Synchronous
from loopwarden.kernel.sql.location import STORE_ENV, Location, parse_location

DB_NAME = "loopwarden.db"
HOME_ENV = "LOOPWARDEN_HOME"
SYNCHRONOUS_ENV = "LOOPWARDEN_SYNCHRONOUS"
SYNCHRONOUS_MODES: dict[str, Synchronous] = {"full": "full", "normal": "normal"}


def home_source(home: str | Path | None = None) -> tuple[Path, str]:
    """Which data directory a command uses, and why: (`home`, "--home"), else
    (`LOOPWARDEN_HOME`, "LOOPWARDEN_HOME"), else (the platform user data dir, "default").
    `~` is expanded and the path made absolute. Touches nothing on disk."""
    if home:
        chosen, source = str(home), "--home"
    elif os.environ.get(HOME_ENV):
        chosen, source = os.environ[HOME_ENV], HOME_ENV
    else:
        import platformdirs  # only here: a hook process is given its home

        chosen, source = platformdirs.user_data_dir("loopwarden"), "default"
    return Path(chosen).expanduser().resolve(), source


def store_source(store: str | None, home: Path) -> tuple[Location, str]:
    """Which store a command opens, and why: (`store`, "--store"), else (`LOOPWARDEN_STORE`,
    "LOOPWARDEN_STORE"), else (the SQLite file in `home`, "home"). `InvalidInput` for a URL of
    an unknown kind. Touches nothing."""
    if store:
        return parse_location(store), "--store"
    if os.environ.get(STORE_ENV):
        return parse_location(os.environ[STORE_ENV]), STORE_ENV
    return parse_location(home / DB_NAME), "home"


def private_dir(path: Path) -> None:
    """Make an existing data directory 0700 again if its mode was loosened."""
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)


def resolve_home(home: str | Path | None = None) -> Path:
    """The data directory (`home_source`), created 0700 if missing: for commands that write."""
    path = home_source(home)[0]
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    private_dir(path)
    return path


def synchronous_mode() -> Synchronous:
    """SQLite's durability for this process: `LOOPWARDEN_SYNCHRONOUS` (full, the default, or
    normal); anything else is a usage error."""
    synchronous = SYNCHRONOUS_MODES.get(os.environ.get(SYNCHRONOUS_ENV, "full").lower())
    if synchronous is None:
        raise InvalidInput("LOOPWARDEN_SYNCHRONOUS must be full or normal")
    return synchronous
