"""The forwarder's HTTP client (`loopwarden/clients/http1.py`): the URL and query it builds are
the ones `urllib.parse` builds, and the answers it reads off a real socket are read as
`http.client` reads them, or refused with an `OSError` (which the forwarder answers by
blocking the tool). The forwarder running against a real server, and what it imports, are in
`test_hooks_live.py`."""

from __future__ import annotations

import socket
import threading
from urllib.parse import quote, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopwarden.clients import http1


@given(st.text())
def test_quote_is_urllibs(text):
    assert http1.quote(text) == quote(text)


URLS = [
    "http://127.0.0.1:8765",
    "http://127.0.0.1:8765/",
    "HTTP://LocalHost:8765/base/",
    "https://hooks.example.com",
    "https://hooks.example.com:443/x?y=1#z",
    "http://user:secret@host:80/p",
    "http://[::1]:8765/",
    "http://[::1]",
    "http://host:0",
    "http://host/a/b",
    "http://host?q",
    "http://host#f",
]


@pytest.mark.parametrize("text", URLS)
def test_a_url_is_read_as_urlsplit_reads_it(text):
    url, split = http1.Url(text), urlsplit(text)
    default = 443 if split.scheme == "https" else 80
    assert (url.scheme, url.host, url.port, url.path) == (
        split.scheme,
        split.hostname,
        default if split.port is None else split.port,
        split.path,
    )
    assert "secret" not in url.authority, "userinfo never reaches a message"


@pytest.mark.parametrize(
    "text",
    ["ftp://host", "host:8765", "http://", "http://:80", "http://host:http", "http://host:99999",
     "http://[::1", "http://[::1]x", "http://host:-1", "http://host: 80"],
)  # fmt: skip
def test_anything_else_is_not_a_url(text):
    with pytest.raises(ValueError):
        http1.Url(text)


def answered(wire: bytes) -> tuple[int, dict[str, str], bytes]:
    """What `http1` reads from a real socket the server side writes `wire` into, then closes."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(wire)
        theirs.close()
        return http1._Answer(ours).read()


ANSWER = b"Loopwarden-Hook-Answer: decision\r\n"


@pytest.mark.parametrize(
    ("wire", "status", "body"),
    [
        (b"HTTP/1.1 200 OK\r\n" + ANSWER + b"Content-Length: 5\r\n\r\nhello", 200, b"hello"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello, and more", 200, b"hello"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\nTrailer: t\r\n\r\n", 200, b"hello"),
        (b"HTTP/1.0 500 Internal Server Error\r\nServer: x\r\n\r\nInternal Server Error", 500,
         b"Internal Server Error"),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\n" b"Content-Length: 2\n\nno", 404,
         b"no"),
        (b"HTTP/1.1 204 No Content\r\n" + ANSWER + b"\r\n", 204, b""),
    ],
)  # fmt: skip
def test_an_answer_is_read_as_http_client_reads_it(wire, status, body):
    got_status, headers, got_body = answered(wire)
    assert (got_status, got_body) == (status, body)
    assert all(name == name.lower() for name in headers)


@pytest.mark.parametrize(
    "wire",
    [
        b"",  # the server closed without a word
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3",  # the head never ends
    ],
)
def test_an_answer_that_is_not_one_is_refused(wire):
    with pytest.raises(OSError):
        answered(wire)


def test_an_answer_longer_than_the_limit_is_refused():
    ours, theirs = socket.socketpair()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (http1.MAX_ANSWER + 1)

    def flood() -> None:  # the server keeps writing until the client hangs up
        try:
            theirs.sendall(head + b"x" * (http1.MAX_ANSWER + 1))
        except OSError:
            pass
        finally:
            theirs.close()

    writer = threading.Thread(target=flood)
    writer.start()
    with ours, pytest.raises(OSError, match="longer than"):
        http1._Answer(ours).read()
    writer.join(timeout=10)


def test_a_header_value_that_could_split_the_message_is_never_sent():
    url = http1.Url("http://127.0.0.1:9")
    for token in ("lw_x\r\nX-Injected: 1", "lw_\x00", "lw_é"):
        with pytest.raises(ValueError):
            http1.post(url, "/hooks/codex?loop=L", b"{}", {"Authorization": f"Bearer {token}"})
    with pytest.raises(ValueError):
        http1.post(url, "/hooks/codex?loop=a b", b"{}", {})
