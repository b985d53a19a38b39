"""`loopwarden hook server --home H [--store URL] [--idle SECONDS]`: a home's local hook
server, on a Unix socket in the home (`clients/hook_wire.py` says where and what it carries).

The default hook (`clients/hook_local.py`) starts it on first use and forwards every event to
it, so that a tool call costs an interpreter start and one exchange instead of the imports,
the keys and the store's opening too. It decides as the in-process hook does, with the same
code (`hook_command.open_store`, `handle_now`): the same answers, the same receipts.

One event at a time, on one thread, with the store opened once (re-opened if its file is
replaced). Before each event it checks, as the in-process hook does, that the home's store
still exists (`admin.existing_store`); it exits when it has served nothing for `idle` seconds
(`--idle`, else $LOOPWARDEN_HOOK_IDLE, else 600), when its home's store or its socket is gone,
on a `stop` request (`loopwarden hook stop`) and on SIGTERM, removing its socket. A peer of
another user is refused where the kernel says who it is (`SO_PEERCRED`); the socket is 0600
in a directory only the user can enter anyway. It logs to stderr (the hook that starts it
appends that to `hooks/server.log`): starts, stops and faults, never an event's content.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from loopwarden import __version__, hosts
from loopwarden.clients import hook_wire as wire
from loopwarden.clients.hook_command import open_store, store_failure
from loopwarden.hosts.handle import failure, handle_now
from loopwarden.hosts.host import MAX_EVENT, Reply
from loopwarden.kernel.store.homes import store_source
from loopwarden.kernel.store.store import Store

log = logging.getLogger("loopwarden.hookserver")
READ_SECONDS = 10.0  # for one request to arrive whole: a hook writes it at once
POLL_SECONDS = 1.0  # how often an idle server looks whether it should exit


def idle_default() -> float:
    """$LOOPWARDEN_HOOK_IDLE seconds if set (a positive number), else 600."""
    text = os.environ.get(wire.IDLE_ENV, "")
    try:
        value = float(text) if text else wire.IDLE_SECONDS
    except ValueError:
        value = wire.IDLE_SECONDS
    return value if value > 0 else wire.IDLE_SECONDS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopwarden hook server",
        description="Serve a home's hook events on its local socket (the hooks start it; "
        "see docs/hooks.md).",
    )
    p.add_argument("--home", default=None, help="the data home (else LOOPWARDEN_HOME)")
    p.add_argument("--store", default=None, metavar="URL", help="the store (else the home's)")
    p.add_argument(
        "--idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"exit after this long without an event (else ${wire.IDLE_ENV}, else 600)",
    )
    return p


class HookServer:
    """One home's local hook server. `clock` (monotonic seconds) decides when it has been idle
    `idle` seconds; it looks every `poll` seconds of real time."""

    def __init__(
        self,
        place: wire.Place,
        *,
        idle: float,
        clock: Callable[[], float] = time.monotonic,
        poll: float = POLL_SECONDS,
    ) -> None:
        self.place, self.idle, self.clock, self.poll = place, idle, clock, poll
        self.stopping = False
        self.why = ""
        self.store: Store | None = None
        self.store_id: tuple[int, int] | None = None
        location = store_source(place.store, Path(place.home))[0]
        self.file = location.file  # the SQLite file, or None for a server database
        self.socket_id: tuple[int, int] | None = None

    # --- the socket ---------------------------------------------------------------------------

    def listen(self) -> socket.socket | None:
        """The listening socket, or None if another server answers there already."""
        self.place.prepare()
        path = self.place.socket
        if os.path.lexists(path):
            if wire.listening(path):
                return None
            os.unlink(path)  # a server that died left it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mask = os.umask(0o177)  # the socket is made 0600, never wider for a moment
        try:
            listener.bind(path)
        finally:
            os.umask(mask)
        listener.listen(64)
        found = os.stat(path)
        self.socket_id = (found.st_dev, found.st_ino)
        return listener

    def _ours(self) -> bool:
        try:
            found = os.stat(self.place.socket)
        except OSError:
            return False
        return (found.st_dev, found.st_ino) == self.socket_id

    def gone(self) -> str:
        """Why this server should no longer run (its home, store or socket is gone), or ''."""
        if not os.path.isdir(self.place.home):
            return "its home is gone"
        if self.file is not None and not self.file.exists():
            return "its home's store is gone"
        if not self._ours():
            return "its socket was removed or taken over"
        return ""

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until idle, gone or stopped. 0, having removed its socket; 0 too if another
        server listens there already (this one is not needed)."""
        listener = self.listen()
        if listener is None:
            log.info("another server listens on %s already; exiting", self.place.socket)
            return 0
        log.info(
            "loopwarden %s hook server %d listening on %s (exits after %g s idle)",
            __version__, os.getpid(), self.place.socket, self.idle,
        )  # fmt: skip
        self._open()
        try:
            self.why = self.serve(listener)
        finally:
            if self._ours():
                os.unlink(self.place.socket)
            self.stopping = True
            self.drain(listener)
            listener.close()
            self._close()
            log.info("hook server %d stopped: %s", os.getpid(), self.why)
        return 0

    def serve(self, listener: socket.socket) -> str:
        """Answer connections one at a time until this server should stop; why it stopped.
        Whether its home or store is gone is looked at only while nothing waits: a hook that
        connected is answered first (by then with the in-process hook's refusal)."""
        last = self.clock()
        while not self.stopping:
            left = self.idle - (self.clock() - last)
            if left <= 0:
                return f"idle for {self.idle:g} s"
            listener.settimeout(max(0.001, min(left, self.poll)))
            try:
                connection, _ = listener.accept()
            except (TimeoutError, InterruptedError):
                why = self.gone()
                if why:
                    return why
                continue
            last = self.clock()  # idle from the last event's arrival: read while its hook waits
            self.answer(connection)
        return "asked to stop"

    def drain(self, listener: socket.socket) -> None:
        """Answer the hooks that connected before the socket was removed: none is cut off by
        the server's exit (one that comes after finds no socket, and starts a new server)."""
        listener.setblocking(False)
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.setblocking(True)
            self.answer(connection)

    def answer(self, connection: socket.socket) -> None:
        with connection:
            try:
                self.connection(connection)
            except Exception as exc:  # one connection's fault is not the server's end
                log.error("a hook connection failed", exc_info=exc)

    def connection(self, connection: socket.socket) -> None:
        connection.settimeout(READ_SECONDS)
        if not _same_user(connection):
            log.warning("refused a connection from another user")
            return
        data = _read(connection, 8 + wire.MAX_HEADER + MAX_EVENT)
        if not data:
            return  # a probe: is anyone listening?
        fields, event = wire.read_request(data)
        op, home, store = fields[:3]
        if (home, store or None) != (self.place.home, self.place.store):
            log.warning("refused a request for another home or store")
            return  # no answer: the hook blocks
        if op == "hook" and len(fields) >= 6 and fields[3] in hosts.NAMES:
            reply = self.decide(fields[3], event, fields[4], fields[5], fields[6:])
            connection.sendall(wire.answer(reply.exit_code, reply.stdout, reply.stderr))
        elif op == "ping":
            connection.sendall(wire.answer(0, f"{os.getpid()} {__version__}", ""))
        elif op == "stop":
            self.stopping = True
            connection.sendall(wire.answer(0, str(os.getpid()), ""))
        else:
            log.warning("refused a request it does not know")

    # --- deciding -----------------------------------------------------------------------------

    def decide(self, host: str, raw: bytes, loop: str, agent: str, servers: list[str]) -> Reply:
        """The in-process hook's answer (`hook_command`), on the store kept open."""
        store = self._current()
        if isinstance(store, str):
            return failure(host, raw, store)
        servers = servers or ["loopwarden"]
        return handle_now(store, host, raw, loop_id=loop, agent=agent, servers=servers)

    def _current(self) -> Store | str:
        """The open store, re-opened if its file was replaced; else why there is none (the
        in-process hook's message, from `admin.existing_store` on every event)."""
        from loopwarden.clients import admin

        try:
            admin.existing_store(self.place.home, self.place.store)
        except Exception as exc:
            self._close()
            return store_failure(exc)
        if self.store is not None and self.file is not None and self._file_id() != self.store_id:
            self._close()
        if self.store is None:
            failed = self._open()
            if failed:
                return failed
        assert self.store is not None
        return self.store

    def _file_id(self) -> tuple[int, int] | None:
        try:
            assert self.file is not None
            found = os.stat(self.file)
        except (OSError, AssertionError):
            return None
        return (found.st_dev, found.st_ino)

    def _open(self) -> str:
        """Open the store; '' once open, else why not (logged: the next event tries again)."""
        try:
            self.store = open_store(self.place.home, self.place.store)
        except Exception as exc:
            why = store_failure(exc)
            log.warning("the store does not open: %s", why)
            return why
        self.store_id = self._file_id() if self.file is not None else None
        return ""

    def _close(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            try:
                store.close_now()
            except Exception as exc:
                log.warning("closing the store failed", exc_info=exc)


def _same_user(connection: socket.socket) -> bool:
    """Whether the peer runs as this user, where the kernel says (Linux's `SO_PEERCRED`);
    elsewhere the socket's 0700 directory is the rule."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return True
    size = struct.calcsize("3i")
    _pid, uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, option, size))
    return bool(uid == os.getuid())


def _read(connection: socket.socket, limit: int) -> bytes:
    """Everything the peer sends up to its half-close; `OSError` past `limit` bytes."""
    chunks, size = [], 0
    while chunk := connection.recv(1024 * 1024):
        size += len(chunk)
        if size > limit:
            raise OSError(f"a request longer than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    place = wire.Place(
        wire.home_path(args.home), args.store or os.environ.get(wire.STORE_ENV) or None
    )
    if not os.path.isdir(place.home):
        log.error("there is no loopwarden home at %s", place.home)
        return 1
    idle = args.idle if args.idle is not None and args.idle > 0 else idle_default()
    server = HookServer(place, idle=idle)

    def stop(_signum: int, _frame: object) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return server.run()
