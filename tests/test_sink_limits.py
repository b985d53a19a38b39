"""A feed an agent cannot stall, signed with a secret only its owner reads (issue 44,
findings 5 and 6).

An agent's legal reports, each with 64,000 bytes of evidence, sealed while the SIEM is down:
the next batch used to be over a megabyte, a receiver with nginx's default body limit answered
413, and the sink sent that batch again forever. Now a batch is bounded in bytes, a 413 splits
it, and a receipt the receiver will not take even alone goes by reference (id, digest, size),
counted and logged: every receipt after it still arrives, in order.

A real `serve --http` with `--export-webhook`, an agent's real token calling it over HTTP, and a
real receiver on loopback that refuses bodies over its limit with 413, as nginx does.

The export secret signs what the SIEM trusts: a secret file others may read is refused at start,
as the signing key is, and the recipe in docs/operations.md makes one only its owner reads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import (
    LEAKS,
    cli,
    cli_open_loop,
    connect_http,
    dashboard_url,
    free_port,
    make_policy,
    mint_tokens,
    start_server,
    stop_server,
)
from test_export_sink import SECRET, wait_for

REPORTS = 14
EVIDENCE = [{"kind": "log", "summary": "x" * 2000} for _ in range(32)]  # 64,000 bytes


@dataclass
class Limited:
    """A webhook receiver refusing any body over `limit` bytes with 413 (nginx's
    `client_max_body_size`, 1 MB by default); `down` until started."""

    limit: int
    port: int = field(default_factory=free_port)
    accepted: list[list[dict[str, Any]]] = field(default_factory=list)
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    http: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/ingest"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                body = self.rfile.read(length)
                with receiver.lock:
                    if length > receiver.limit:
                        receiver.refused += 1
                        status = 413
                    else:
                        receiver.accepted.append(json.loads(body))
                        status = 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [event for batch in self.accepted for event in batch]


def _journal(home: Path) -> list[str]:
    done = cli("events", "--home", str(home))
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["id"] for line in done.stdout.splitlines()]


async def _report(url: str, token: str) -> None:
    async with connect_http(url, token) as agent:
        for n in range(REPORTS):
            granted = await agent.claim("feed")
            assert granted.granted, granted.reasons
            done = await agent.update(
                granted.turn_id,
                granted.fence,
                "progress",
                f"report {n}",
                f"report-{n}",
                tools_used=[{"name": "fs.read", "count": 1}],
                evidence=EVIDENCE,
            )
            assert done.accepted, done.reasons


def _metric(url: str, token: str, name: str) -> float:
    text = httpx2.get(
        f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return 0.0


@pytest.fixture
def served_with(tmp_path: Path) -> Iterator[Any]:
    servers = []

    def start(receiver: Limited) -> tuple[Any, dict[str, Any]]:
        home = tmp_path / "home"
        policy = make_policy(agents=["builder"], tools={"allow": ["fs.read"]})
        cli_open_loop(home, "feed", policy, tuple(f"t{i}" for i in range(REPORTS)))
        secret = tmp_path / "export.secret"
        secret.write_bytes(SECRET + b"\n")
        secret.chmod(0o600)
        args = ("--export-webhook", receiver.url, "--export-secret-file", str(secret))
        served = start_server(home, tmp_path / "logs", *args)
        servers.append(served)
        tokens = mint_tokens(home, [("builder", "agent"), ("alice", "operator")])
        return served, tokens

    yield start
    for served in servers:
        stop_server(served)


@pytest.mark.parametrize(
    ("limit", "by_reference"),
    [(1_000_000, 0), (300_000, 0), (60_000, REPORTS)],
    ids=["nginx-default-1MB", "300KB-splits-on-413", "60KB-reports-by-reference"],
)
def test_large_reports_sealed_while_the_siem_is_down_never_stall_the_feed(
    served_with, limit, by_reference
):
    receiver = Limited(limit)
    try:
        served, tokens = served_with(receiver)
        anyio.run(_report, served.url, tokens["builder"].token)  # while the receiver is down
        receiver.start()
        expected = _journal(served.home)
        assert len(expected) == 1 + 2 * REPORTS
        wait_for("every receipt", lambda: [e["id"] for e in receiver.events()] == expected)
        events = {e["id"]: e for e in receiver.events()}
        referenced = [e for e in events.values() if e.get("loopwardenreference")]
        assert len(referenced) == by_reference
        for event in referenced:  # id, digest and size: enough to fetch and check it
            data = event["data"]
            assert "envelope" not in data and data["envelope_size"] > limit
            assert data["kind"] == "turn.reported" and data["digest"].startswith("sha256:")
        whole = [e for e in events.values() if not e.get("loopwardenreference")]
        assert all("envelope" in e["data"] for e in whole)
        operator = tokens["alice"].token
        assert _metric(dashboard_url(served), operator, "loopwarden_export_by_reference_total") == (
            by_reference
        )
        if by_reference:
            assert "was sent by reference" in served.stderr()
    finally:
        receiver.stop()


def _documented_recipe() -> str:
    readme = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
    [line] = [x for x in readme.splitlines() if x.endswith("readable by you alone")]
    return line


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_secret_file_others_may_read_is_refused_and_the_documented_recipe_makes_a_private_one(
    tmp_path, mode
):
    home = tmp_path / "home"
    secret = tmp_path / "export.secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(mode)
    args = ("--export-webhook", "https://siem.example/x", "--export-secret-file", str(secret))
    done = cli("serve", "--http", f"127.0.0.1:{free_port()}", "--home", str(home), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert re.search(rf"readable by others \(mode {mode:o}\).*chmod 600", said), said
    assert SECRET.decode() not in done.stderr and "siem.example" not in done.stderr
    assert not LEAKS.search(done.stderr.replace(str(secret), "SECRET_FILE")), done.stderr

    # The recipe of docs/operations.md, run by a shell with the usual umask: a file for its owner alone.
    made = tmp_path / "made"
    made.mkdir()
    subprocess.run(
        ["sh", "-c", f"umask 022 && {_documented_recipe()}"], cwd=made, check=True, timeout=30
    )
    assert (os.stat(made / "export.secret").st_mode & 0o777) == 0o600
