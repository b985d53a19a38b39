"""Serve settings: where data lives, who the server speaks for, which binds and hosts it accepts."""

from __future__ import annotations

import asyncio
import socket

import pytest

from loopwarden.errors import InvalidInput
from loopwarden.server.settings import Settings, parse_bind, url_host
from loopwarden.server.transports import listen, transport_security


def test_ipv6_hosts_are_bracketed_in_urls_and_bind_strings_parse():
    assert parse_bind("[::1]:8765") == ("::1", 8765)
    assert url_host("::1") == "[::1]" and url_host("127.0.0.1") == "127.0.0.1"


@pytest.mark.parametrize("bind", ["8765", "host:", "127.0.0.1:0", "127.0.0.1:70000", ""])
def test_malformed_binds_are_refused(bind):
    with pytest.raises(InvalidInput):
        parse_bind(bind)


def test_loopback_security_accepts_only_loopback_hosts_and_origins(tmp_path):
    security = transport_security("127.0.0.1")
    assert security.enable_dns_rebinding_protection
    assert set(security.allowed_hosts) == {"127.0.0.1:*", "localhost:*", "[::1]:*"}


def test_allowed_hosts_extend_a_remote_bind_and_keep_protection_on():
    security = transport_security("0.0.0.0", ("lw.internal", "10.0.0.5"))
    assert security.enable_dns_rebinding_protection
    assert {"lw.internal:*", "10.0.0.5:*", "0.0.0.0:*"} <= set(security.allowed_hosts)
    assert "http://lw.internal:*" in security.allowed_origins


def test_allowed_host_needs_http_and_a_sane_name(tmp_path):
    with pytest.raises(InvalidInput, match="only applies to --http"):
        Settings.create(home=tmp_path, agent="a", allowed_hosts=("lw.internal",))
    with pytest.raises(InvalidInput, match="--allowed-host"):
        Settings.create(
            home=tmp_path, http="0.0.0.0:8765", allow_remote=True, allowed_hosts=("bad host/x",)
        )


def test_home_defaults_to_the_environment_and_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPWARDEN_HOME", str(tmp_path / "envhome"))
    settings = Settings.create(agent="builder")
    assert settings.home == (tmp_path / "envhome").resolve()
    assert settings.home.stat().st_mode & 0o077 == 0
    assert settings.principal is not None and settings.principal.id == "builder"


def test_identity_comes_from_the_launch_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPWARDEN_AGENT", "from-env")
    monkeypatch.setenv("LOOPWARDEN_ROLE", "operator")
    settings = Settings.create(home=tmp_path)
    assert settings.principal is not None
    assert (settings.principal.id, settings.principal.role) == ("from-env", "operator")
    with pytest.raises(InvalidInput, match="role"):
        Settings.create(home=tmp_path, agent="x", role="root")  # type: ignore[arg-type]


def test_connections_to_the_servers_socket_send_without_waiting_for_acks():
    # The socket `serve --http` binds itself (to say "address in use" before "serving on") must
    # give its connections TCP_NODELAY as uvicorn's own does; without it each response waited
    # ~40 ms for a delayed ACK and a governed turn over HTTP took ~96 ms instead of ~7 ms.
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    nodelay: list[int] = []

    async def main() -> None:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            served = writer.get_extra_info("socket")
            nodelay.append(served.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=sock)
        async with server:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            for _ in range(50):
                if nodelay:
                    break
                await asyncio.sleep(0.02)
            writer.close()

    asyncio.run(main())
    assert nodelay and nodelay[0] != 0
