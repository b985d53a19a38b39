"""Where a home's local hook server lives and what its socket carries: the part the hook
process (`hook_local.py`) and the server (`server/hook_socket.py`) share.

The hook process runs once per tool call a model makes, so this module imports nothing beyond
what the interpreter has loaded anyway (`os`, `stat`) and the C socket module; `hashlib` only
for a store URL or a home whose socket path would not fit in `sun_path`.

Place, per home (and per store, when one is named): a directory `hooks/` in the home, 0700,
that holds the server's socket (`server-VERSION.sock`, 0600), its start lock and its log
(`server.log`). The version is in the socket's name: hooks of a new loopwarden start a server
of their own while one of the old idles out. A socket path longer than `sun_path` allows (a
deep home) goes into a private runtime directory instead (`$XDG_RUNTIME_DIR`, else
`/tmp/loopwarden-UID`, 0700 and the user's own), named by a digest of the home and store.

Wire, one exchange per connection: the client sends `REQUEST`, a 4-byte big-endian length,
that many bytes of NUL-separated fields (op, home, store, then the op's own: host, loop,
agent, server names), then the event's bytes up to its half-close. The server answers
`ANSWER`, the exit code (one byte), the lengths of stdout and stderr (4 bytes each) and both.
Anything else is no answer, which the hook takes as a failure (it blocks).
"""

from __future__ import annotations

import _socket
import os
import stat

from loopwarden import __version__

DIR_NAME = "hooks"
LOG_NAME = "server.log"
MAX_SOCKET_PATH = 100  # bytes: `sun_path` holds 108 on Linux, 104 on macOS, with its NUL
MAX_HEADER = 64 * 1024
MAX_ANSWER = 4 * 1024 * 1024
REQUEST = b"LWH1"
ANSWER = b"LWA1"
TIMEOUT = 20.0  # seconds per connect, send or receive: under the 30 s hosts give a hook
IDLE_ENV = "LOOPWARDEN_HOOK_IDLE"
IDLE_SECONDS = 600.0
HOME_ENV = "LOOPWARDEN_HOME"
STORE_ENV = "LOOPWARDEN_STORE"


def home_path(given: str | None) -> str:
    """The data home as `homes.home_source` resolves it (`--home`, else $LOOPWARDEN_HOME, else
    the platform's user data directory), absolute, without importing `pathlib`."""
    chosen = given or os.environ.get(HOME_ENV)
    if not chosen:
        import platformdirs  # only here: an installed hook names its home

        chosen = platformdirs.user_data_dir("loopwarden")
    return os.path.realpath(os.path.expanduser(chosen))


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


class Place:
    """A home's local hook server: its directory, socket, lock and log (see the module
    docstring). Computing it touches nothing on disk; `prepare` makes the directories."""

    __slots__ = ("directory", "home", "lock", "log", "runtime", "socket", "store")

    def __init__(self, home: str, store: str | None) -> None:
        self.home, self.store = home, store or None
        self.directory = os.path.join(home, DIR_NAME)
        name = f"server-{__version__}"
        if self.store is not None:
            name += "-" + _digest(self.store)[:12]
        self.lock = os.path.join(self.directory, name + ".lock")
        self.log = os.path.join(self.directory, LOG_NAME)
        self.socket = os.path.join(self.directory, name + ".sock")
        self.runtime: str | None = None
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            self.runtime = runtime_dir()
            key = _digest(f"{home}\0{self.store or ''}\0{__version__}")[:32]
            self.socket = os.path.join(self.runtime, key + ".sock")

    @property
    def log_in_home(self) -> str:
        """The log's path relative to the home, as messages name it."""
        return f"{DIR_NAME}/{LOG_NAME}"

    def prepare(self) -> None:
        """Make the server's directories (never the home: a hook for a missing home is
        refused), 0700 and the user's own; `PermissionError` if one is another user's."""
        private(self.directory)
        if self.runtime is not None:
            private(self.runtime)


def runtime_dir() -> str:
    """A short private directory for sockets whose path under the home would be too long."""
    base = os.environ.get("XDG_RUNTIME_DIR") or ""
    if not (base and os.path.isdir(base)):
        base = "/tmp"
    return os.path.join(base, f"loopwarden-{os.getuid()}")


def private(path: str) -> None:
    """`path` as a directory only this user can enter (created 0700 if missing; its parent
    must exist); `PermissionError` if it is a link, not a directory, or another user's."""
    try:  # noqa: SIM105 - `contextlib` is one more import for every tool call
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory of this user's own")
    if found.st_mode & 0o077:
        os.chmod(path, 0o700)


def _fields(data: bytes) -> list[str]:
    return data.decode("utf-8", "surrogateescape").split("\0")


def request(op: str, place: Place, fields: list[str], event: bytes = b"") -> bytes:
    """One request's bytes (the module docstring's wire); `ValueError` for a field with a NUL."""
    words = [op, place.home, place.store or "", *fields]
    if any("\0" in word for word in words):
        raise ValueError("a field with a NUL character")
    header = "\0".join(words).encode("utf-8", "surrogateescape")
    if len(header) > MAX_HEADER:
        raise ValueError(f"the request's fields are longer than {MAX_HEADER} bytes")
    return REQUEST + len(header).to_bytes(4, "big") + header + event


def read_request(data: bytes) -> tuple[list[str], bytes]:
    """(the fields: op, home, store, …; the event's bytes) of one request; `ValueError` if the
    bytes are not one."""
    if data[:4] != REQUEST or len(data) < 8:
        raise ValueError("not a loopwarden hook request")
    size = int.from_bytes(data[4:8], "big")
    if size > MAX_HEADER or len(data) < 8 + size:
        raise ValueError("a request whose fields do not fit")
    fields = _fields(data[8 : 8 + size])
    if len(fields) < 3:
        raise ValueError("a request without its op, home and store")
    return fields, data[8 + size :]


def answer(exit_code: int, stdout: str, stderr: str) -> bytes:
    """One answer's bytes: what the hook process prints and exits with."""
    out, err = stdout.encode(), stderr.encode()
    head = ANSWER + bytes([exit_code & 0xFF]) + len(out).to_bytes(4, "big")
    return head + len(err).to_bytes(4, "big") + out + err


def read_answer(data: bytes) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one answer; `ValueError` if the bytes are not one whole."""
    if data[:4] != ANSWER or len(data) < 13:
        raise ValueError("not a loopwarden hook answer")
    out_size, err_size = int.from_bytes(data[5:9], "big"), int.from_bytes(data[9:13], "big")
    if len(data) != 13 + out_size + err_size:
        raise ValueError("a cut or overlong answer")
    out, err = data[13 : 13 + out_size], data[13 + out_size :]
    return data[4], out.decode(), err.decode()


def exchange(path: str, payload: bytes, timeout: float = TIMEOUT) -> bytes:
    """Send `payload` to the server at `path`, half-close, and read its whole answer.
    `FileNotFoundError` / `ConnectionRefusedError` when nothing listens there; any other
    `OSError` for a server that does not answer in time or answers too much."""
    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        connection.settimeout(timeout)
        connection.connect(path)
        connection.sendall(payload)
        connection.shutdown(_socket.SHUT_WR)
        chunks, size = [], 0
        while chunk := connection.recv(65536):
            size += len(chunk)
            if size > MAX_ANSWER:
                raise OSError(f"the answer is longer than {MAX_ANSWER} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        connection.close()


def listening(path: str, timeout: float = 2.0) -> bool:
    """Whether a server accepts connections at `path` (a probe it answers with nothing)."""
    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        connection.settimeout(timeout)
        connection.connect(path)
        return True
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    finally:
        connection.close()
