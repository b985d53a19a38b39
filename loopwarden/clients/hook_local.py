"""`loopwarden hook HOST --loop ID --agent NAME [--home H] [--store URL]`: the command hook
`hook install` writes, forwarding each event to its home's local hook server over a Unix
socket (`server/hook_socket.py`, which decides with the in-process hook's own code) and
starting that server on first use.

A decision costs an interpreter start, the standard library's `os` and the C socket module,
and one exchange on the socket: the store, the keys and the decision's imports stay loaded in
the server between tool calls. When nothing listens, the hook takes the home's start lock (so
that hooks firing together start one server), starts `loopwarden hook server` detached in a
session of its own (stdin from /dev/null, its output appended to the home's
`hooks/server.log`), waits for it to listen within `START_SECONDS`, and forwards.

Fails closed: a home that does not exist, a server that cannot be started or does not listen
in time, one that does not answer or answers anything but an answer — the event is answered
as the host's own hook answers a failure (a block before a tool runs), with a message naming
the log (relative to the home) and `loopwarden hook doctor`.
"""

from __future__ import annotations

import os
import sys

from loopwarden.clients import hook_wire as wire
from loopwarden.clients.hook_process import blocked, options_of

TYPE_CHECKING = False  # not `typing`'s: the hook imports nothing it does not run
if TYPE_CHECKING:
    from collections.abc import Sequence
    from subprocess import Popen

START_SECONDS = 10.0  # for the server to listen: a first import of everything, on a busy machine
MAX_LOG = 1024 * 1024  # bytes of `server.log` before it is moved to `server.log.1` at a start


def main(argv: Sequence[str]) -> int:
    options = options_of(argv)
    host = str(options["host"])
    raw = sys.stdin.buffer.read()
    try:
        return _forward(host, raw, options)
    except Exception as exc:  # no decision, whatever went wrong: fail closed
        return blocked(host, raw, f"the local hook failed ({type(exc).__name__}: {exc})")


def place_of(options: dict[str, object]) -> wire.Place:
    """The local server for the hook's `--home` and `--store` (else their variables)."""
    home = wire.home_path(str(options.get("home") or "") or None)
    store = str(options.get("store") or "") or os.environ.get(wire.STORE_ENV) or None
    return wire.Place(home, store)


def unavailable(place: wire.Place, host: str, why: str) -> str:
    """The message of a hook that has no server to ask: what happened and where to look."""
    return (
        f"loopwarden's local hook server is not available ({why}); the call is blocked. See "
        f"{place.log_in_home} in the loopwarden home ({place.home}) and run `loopwarden hook "
        f"doctor {host}`"
    )


def _forward(host: str, raw: bytes, options: dict[str, object]) -> int:
    place = place_of(options)
    if not os.path.isdir(place.home):
        return blocked(
            host,
            raw,
            f"there is no loopwarden home at {place.home}: check --home in the hook command "
            "(loopwarden hook install again) or $LOOPWARDEN_HOME",
        )
    fields = [host, str(options.get("loop", "")), str(options.get("agent", ""))]
    fields += [str(s) for s in options["server_name"]]  # type: ignore[attr-defined]
    payload = wire.request("hook", place, fields, raw)
    try:
        data = wire.exchange(place.socket, payload)
    except (FileNotFoundError, ConnectionRefusedError):
        why = start(place)
        if why is not None:
            return blocked(host, raw, unavailable(place, host, why))
        try:
            data = wire.exchange(place.socket, payload)
        except OSError as exc:
            return blocked(host, raw, unavailable(place, host, f"it does not answer: {exc}"))
    except OSError as exc:
        return blocked(host, raw, unavailable(place, host, f"it does not answer: {exc}"))
    try:
        code, stdout, stderr = wire.read_answer(data)
    except ValueError as exc:
        return blocked(host, raw, unavailable(place, host, str(exc)))
    if stdout:
        sys.stdout.write(stdout + "\n")
    sys.stderr.write(stderr)
    return code


def server_command(place: wire.Place) -> list[str]:
    """How a hook starts its home's server: this interpreter, this loopwarden."""
    command = [sys.executable, "-m", "loopwarden", "hook", "server", "--home", place.home]
    return command + (["--store", place.store] if place.store else [])


def start(
    place: wire.Place, command: list[str] | None = None, bound: float = START_SECONDS
) -> str | None:
    """Start `place`'s server unless one listens, and wait for it to listen: None once one
    does, else why not. Under the start lock: of hooks that find no server at once, one starts
    it and the others find it listening. A server that does not listen within `bound` seconds
    is left to come up (the next hook finds it) or to fail into its log."""
    import fcntl
    import time

    deadline = time.monotonic() + bound
    try:
        place.prepare()
        lock = os.open(place.lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        return f"cannot prepare {wire.DIR_NAME}/ in the home: {exc}"
    try:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return f"another hook is starting it and it did not listen within {bound:g} s"
                time.sleep(0.005)
        if wire.listening(place.socket):
            return None
        child = _spawn(place, command or server_command(place))
        while time.monotonic() < deadline:
            if wire.listening(place.socket):
                return None
            code = child.poll()
            if code is not None:
                return f"it exited as it started (exit code {code})"
            time.sleep(0.005)
        return f"it did not listen within {bound:g} s"
    except OSError as exc:
        return f"it cannot be started: {exc}"
    finally:
        os.close(lock)  # releases the lock


def _spawn(place: wire.Place, command: list[str]) -> Popen[bytes]:
    """`command` detached: a session of its own, nothing of the host's (no stdin, none of its
    pipes: a host waits for its hook's output to close), its output appended to the log."""
    import subprocess

    try:
        if os.path.getsize(place.log) > MAX_LOG:
            os.replace(place.log, place.log + ".1")
    except OSError:
        pass
    log = os.open(place.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=place.home,  # not the host's project: `-m` must not import a folder there
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log)


def ask(place: wire.Place, op: str) -> str | None:
    """`op` ("ping": the server's pid and version; "stop") to `place`'s server: its answer's
    text, or None when no server listens there. `OSError` / `ValueError` for one that does
    not answer as a server does."""
    try:
        data = wire.exchange(place.socket, wire.request(op, place, []))
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    code, stdout, _ = wire.read_answer(data)
    if code != 0:
        raise ValueError(f"the server refused {op!r}")
    return stdout
