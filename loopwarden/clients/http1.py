"""One HTTP/1.1 POST and its answer over a plain socket: what the hook forwarder needs to reach
a `serve --http`, at the cost of the standard library's C socket module alone.

The forwarder runs once per tool call a model makes, so it avoids `http.client` (it imports
`email`'s parser, ~25 ms here), `socket` (it builds enums of every constant, ~4 ms), `re` and
`urllib.parse` (another ~10 ms where the interpreter has not loaded them already). An `https`
URL takes `ssl` and `socket`, which TLS needs anyway. Everything here fails by raising
`OSError` (a refused connection, a timeout, an answer that is not HTTP/1.x or that overruns
`MAX_ANSWER`) or `ValueError` (a URL or header value it will not send): a caller that gets
either has no answer.
"""

from __future__ import annotations

import _socket  # `socket` is its enum-decorated wrapper: the C module is all a client needs

TIMEOUT = 25.0  # seconds per connect, send or receive; under the 30 s the installer gives a hook
MAX_ANSWER = 4 * 1024 * 1024  # bytes of one answer, head and body: a decision is a few hundred
_KEEP = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~/")


class Url:
    """An `http://` or `https://` URL's parts, as `urllib.parse.urlsplit` reads them: the scheme
    and host in lower case, the port (the scheme's default when none is given), the path;
    userinfo, query and fragment are dropped. `ValueError` for anything else."""

    def __init__(self, text: str) -> None:
        scheme, sep, rest = text.partition("://")
        self.scheme = scheme.lower()
        if not sep or self.scheme not in ("http", "https"):
            raise ValueError("not an http(s) URL")
        ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
        netloc, tail = rest[: min(ends, default=len(rest))], rest[min(ends, default=len(rest)) :]
        self.path = tail.partition("#")[0].partition("?")[0]
        where = netloc.rpartition("@")[2]
        if where.startswith("["):
            host, bracket, after = where[1:].partition("]")
            if not bracket or (after and not after.startswith(":")):
                raise ValueError("a bracketed host that does not close")
            port = after[1:]
        else:
            host, _, port = where.partition(":")
        if not host:
            raise ValueError("no host")
        self.host = host.lower()
        default = 443 if self.scheme == "https" else 80
        if port and not (port.isascii() and port.isdigit() and 0 <= int(port) <= 65535):
            raise ValueError("a port that is not a number from 0 to 65535")
        self.port = int(port) if port else default
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = name if self.port == default else f"{name}:{self.port}"


def quote(text: str) -> str:
    """`text` percent-encoded as `urllib.parse.quote(text)` does (UTF-8, `/` kept)."""
    return "".join(chr(b) if b in _KEEP else f"%{b:02X}" for b in text.encode())


def _header_value(value: str) -> str:
    if not value.isascii() or not value.isprintable():
        raise ValueError("a header value with a control or non-ASCII character")
    return value


def post(
    url: Url, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """POST `body` to `path` on `url`'s server with `headers`; the answer's status, its headers
    (names in lower case) and its body (de-chunked). One connection, closed after."""
    if any(c <= " " or c == "\x7f" for c in path):
        raise ValueError("a path with a space or a control character")
    host = url.authority if url.authority.isascii() else url.authority.encode("idna").decode()
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    lines += [f"{name}: {_header_value(value)}" for name, value in headers.items()]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    connection = _connect(url)
    try:
        connection.sendall("\r\n".join(lines).encode("latin-1") + body)
        return _Answer(connection).read()
    finally:
        connection.close()


def _connect(url: Url) -> _socket.socket:
    if url.scheme == "https":
        import socket
        import ssl

        raw = socket.create_connection((url.host, url.port), timeout=TIMEOUT)
        return ssl.create_default_context().wrap_socket(raw, server_hostname=url.host)
    failure: OSError | None = None
    # A str host is encoded by the `idna` codec (~5 ms to import); an ASCII name needs none.
    name = url.host.encode() if url.host.isascii() else url.host
    for family, kind, proto, _, address in _socket.getaddrinfo(
        name, url.port, 0, _socket.SOCK_STREAM
    ):
        connection = _socket.socket(family, kind, proto)
        try:
            connection.settimeout(TIMEOUT)
            connection.connect(address)
            return connection
        except OSError as exc:
            connection.close()
            failure = exc
    raise failure or OSError(f"no address for {url.host}")


class _Answer:
    """An HTTP/1.x answer read off a connection: the head, then the body as its head says
    (`Transfer-Encoding: chunked`, `Content-Length`, or up to the connection's close)."""

    def __init__(self, connection: _socket.socket) -> None:
        self.connection = connection
        self.buffer = b""
        self.taken = 0

    def _more(self) -> bool:
        data = self.connection.recv(65536)
        self.taken += len(data)
        if self.taken > MAX_ANSWER:
            raise OSError(f"the answer is longer than {MAX_ANSWER} bytes")
        self.buffer += data
        return bool(data)

    def _line(self) -> bytes:
        while b"\n" not in self.buffer:
            if not self._more():
                raise OSError("the connection closed in the middle of the answer")
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.rstrip(b"\r")

    def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._more():
                raise OSError("the connection closed before the whole body arrived")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def _head(self) -> tuple[int, dict[str, str]]:
        version, _, rest = self._line().decode("latin-1").partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not (code.isascii() and code.isdigit()):
            raise OSError("the server's answer is not HTTP/1.x")
        headers: dict[str, str] = {}
        while line := self._line():
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise OSError("a malformed header line in the answer")
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        return int(code), headers

    def _chunks(self) -> bytes:
        body = b""
        while size := _number(self._line().partition(b";")[0].strip(), 16):
            body += self._exactly(size)
            self._line()
        while self._line():  # trailers
            pass
        return body

    def read(self) -> tuple[int, dict[str, str], bytes]:
        status, headers = self._head()
        while 100 <= status < 200:  # an interim answer (we send no Expect): the real one follows
            status, headers = self._head()
        if status in (204, 304):
            return status, headers, b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, self._chunks()
        if "content-length" in headers:
            length = headers["content-length"].split(",")[0].strip().encode()
            return status, headers, self._exactly(_number(length, 10))
        while self._more():
            pass
        return status, headers, self.buffer


def _number(digits: bytes, base: int) -> int:
    """A size the answer gives (a chunk's, in hex, or its Content-Length); `OSError` if it is
    not a plain number (no sign, space or underscore)."""
    try:
        if digits.isalnum():
            return int(digits, base)
    except ValueError:
        pass
    raise OSError("a size in the answer is not a number")
